"""How close `vlbench plan`'s time estimate comes to the embed stage's measured time (docs/benchmarks.md).

One run writes `n` random-noise JPEGs of `image-size` px as a prepared dataset (data/prepared/bench in a temporary
folder), asks `vlbench.plan.estimate` for its rate (the warm-up: model forward on random input, decode cost of a
sample), then runs the embed stage's `embed_images` on the same split with the same random-init model and the
stage's defaults (batch 256, its default workers) `--repeats` times. Prints one JSON line.

    python benchmarks/plan_estimate.py --arch vlbench-toy --image-size 32 --n 4096
    python benchmarks/plan_estimate.py --arch ViT-B-32-quickgelu --image-size 256 --n 256
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
from vlbench.models.loading import LoadedModel, autocast_dtype, pick_device  # noqa: E402
from vlbench.models.timing import build_image_model  # noqa: E402
from vlbench.plan import estimate  # noqa: E402


def run(arch: str, image_size: int, n: int, precision: str, device: str | None, repeats: int) -> dict:
    dev = pick_device(device)
    cfg = {"slug": "bench", "arch": arch, "pretrained": "random", "precision": precision}
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)  # prepared datasets are found relative to the project root, as in `vlbench plan`
        meta = DatasetMeta(name="bench", task="single-label", metric="accuracy",
                           classes=[ClassInfo(0, "a"), ClassInfo(1, "b")])
        rows = ({"sample_id": f"{i:06d}", "label": i % 2, "image": data}
                for i, data in enumerate(make_images(n, image_size)))
        write_dataset(Path("data/prepared/bench"), meta, {"test": rows})
        start = time.perf_counter()
        est = estimate(cfg, n, ["bench"], str(dev), warmup=True)
        warmup_s = time.perf_counter() - start
        model, preprocess, _ = build_image_model(cfg, dev)
        loaded = LoadedModel(model, preprocess, None, {}, dev, autocast_dtype(precision, dev))
        split = split_path(Path("data/prepared/bench"), "test")
        rates = []
        for _ in range(repeats):
            start = time.perf_counter()
            embed_images(loaded, split, "bench", "test", progress=False)
            _sync(dev)
            rates.append(n / (time.perf_counter() - start))
    return {"arch": arch, "image_size": image_size, "n": n, "device": est["device"], "workers": default_workers(dev),
            "threads": torch.get_num_threads(), "warmup_s": round(warmup_s, 1),
            "estimated_images_per_s": round(est["images_per_second"], 1), "how": est["reason"],
            "stage_images_per_s": [round(r, 1) for r in rates],
            "estimate_vs_stage": [round(est["images_per_second"] / r, 2) for r in rates]}


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
    args = p.parse_args()
    print(json.dumps(run(args.arch, args.image_size, args.n, args.precision, args.device, args.repeats)))


if __name__ == "__main__":
    main()
