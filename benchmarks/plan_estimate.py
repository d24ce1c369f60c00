"""How close `vlbench plan`'s time estimate comes to the embed stage's measured time (docs/benchmarks.md).

One run writes `n` random-noise JPEGs of `image-size` px as a prepared dataset (data/prepared/bench in a temporary
folder), asks `vlbench.plan.estimate` for its rate (the warm-up: model forward on random input in a child process
under `--cap-s`, never a rate cached by an earlier plan; decode cost of a sample) and for the FLOPs bound it falls back
on over the cap (the device's matrix-product rate / the architecture's FLOPs per image), then runs the embed stage's `embed_images` on the same split with the same random-init model and the
stage's defaults (batch 256, its default workers) `--repeats` times. Prints one JSON line.

    python benchmarks/plan_estimate.py --arch vlbench-toy --image-size 32 --n 4096
    python benchmarks/plan_estimate.py --arch ViT-B-32-quickgelu --image-size 256 --n 256 --cap-s 600
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embed_throughput import make_images  # noqa: E402

from vlbench.datasets.canonical import ClassInfo, DatasetMeta, split_path, write_dataset  # noqa: E402
from vlbench.embed import default_workers, embed_images  # noqa: E402
from vlbench.models import rates  # noqa: E402
from vlbench.models.loading import LoadedModel, autocast_dtype, pick_device  # noqa: E402
from vlbench.models.timing import build_image_model  # noqa: E402
from vlbench.plan import estimate  # noqa: E402


def run(arch: str, image_size: int, n: int, precision: str, device: str | None, repeats: int, cap_s: float) -> dict:
    dev = pick_device(device)
    cfg = {"slug": "bench", "arch": arch, "pretrained": "random", "precision": precision}
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # prepared datasets are found relative to the project root, as in `vlbench plan`
        os.environ["VLBENCH_CACHE"] = tmp  # a fresh measurement, not the rate an earlier plan cached
        meta = DatasetMeta(name="bench", task="single-label", metric="accuracy",
                           classes=[ClassInfo(0, "a"), ClassInfo(1, "b")])
        rows = ({"sample_id": f"{i:06d}", "label": i % 2, "image": data}
                for i, data in enumerate(make_images(n, image_size)))
        write_dataset(Path("data/prepared/bench"), meta, {"test": rows})
        start = time.perf_counter()
        est = estimate(cfg, n, ["bench"], str(dev), warmup=True, cap_s=cap_s)
        warmup_s = time.perf_counter() - start
        flops_bound = rates.matmul_flops(dev, precision) / rates.architecture(cfg).flops
        model, preprocess, _ = build_image_model(cfg, dev)
        loaded = LoadedModel(model, preprocess, None, {}, dev, autocast_dtype(precision, dev))
        split = split_path(Path("data/prepared/bench"), "test")
        stage = []
        for _ in range(repeats):
            start = time.perf_counter()
            embed_images(loaded, split, "bench", "test", progress=False)
            _sync(dev)
            stage.append(n / (time.perf_counter() - start))
    return {"arch": arch, "image_size": image_size, "n": n, "device": est["device"], "workers": default_workers(dev),
            "threads": torch.get_num_threads(), "warmup_s": round(warmup_s, 1),
            "estimated_images_per_s": round(est["images_per_second"], 1), "rate": est["rate"], "how": est["reason"],
            "flops_bound_images_per_s": round(flops_bound, 1), "stage_images_per_s": [round(r, 1) for r in stage],
            "estimate_vs_stage": [round(est["images_per_second"] / r, 2) for r in stage],
            "flops_bound_vs_stage": [round(flops_bound / r, 2) for r in stage]}


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="vlbench-toy")
    p.add_argument("--image-size", type=int, default=32, help="side of the stored JPEGs")
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--precision", default="amp_bf16", help="as in conf/model/*.yaml (CPU runs fp32 whatever)")
    p.add_argument("--device", default=None)
    p.add_argument("--repeats", type=int, default=2, help="stage runs, each reported (the first pays one-off costs)")
    p.add_argument("--cap-s", type=float, default=rates.CAP_S,
                   help="the warm-up's time cap (plan's default; larger to measure a model the plan would estimate)")
    args = p.parse_args()
    print(json.dumps(run(args.arch, args.image_size, args.n, args.precision, args.device, args.repeats, args.cap_s)))


if __name__ == "__main__":
    main()
