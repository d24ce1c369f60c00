"""Embed throughput of the two engines on the same split: local (vlbench.embed.embed_images, DataLoader workers) vs
Ray (vlbench.embed_ray.embed_images: row-group decode tasks, model actors), in one run, on one machine.

    python benchmarks/embed_ray_throughput.py --arch vlbench-toy --image-size 32 --n 4096
    python benchmarks/embed_ray_throughput.py --arch ViT-B-32-quickgelu --image-size 256 --n 2048 --device cuda

The Ray engine joins $VLBENCH_RAY_ADDRESS if set, else starts a local Ray with `--ray-cpus` CPUs (default: all).
Every call of the Ray engine starts its model actors afresh (the stage makes one call per split), so each engine also
embeds the first quarter of the split: from the two median times, `marginal_images_per_s` (the rate once running) and
`startup_s` (the fixed cost per call). A first call of each engine is a warm-up, not timed. Models have random
weights. Prints one JSON line: images/s of each engine on the whole split, every time, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embed_throughput import make_images  # noqa: E402

from vlbench import embed_ray  # noqa: E402
from vlbench.datasets.canonical import ClassInfo, DatasetMeta, split_path, write_dataset  # noqa: E402
from vlbench.embed import default_workers, embed_images  # noqa: E402
from vlbench.models import register_local_configs  # noqa: E402
from vlbench.models.loading import LoadedModel, autocast_dtype, pick_device  # noqa: E402


def write_split(images: list[bytes], root: Path) -> Path:
    meta = DatasetMeta(name="bench", task="single-label", metric="accuracy", classes=[ClassInfo(0, "a"), ClassInfo(1, "b")])
    rows = ({"sample_id": f"{i:06d}", "label": i % 2, "image": data} for i, data in enumerate(images))
    write_dataset(root / "prepared", meta, {"test": rows})
    return split_path(root / "prepared", "test")


def toy_loaded(arch: str, device: torch.device) -> LoadedModel:
    import open_clip

    register_local_configs()
    model, _, preprocess = open_clip.create_model_and_transforms(arch, device=device)
    model.eval()
    return LoadedModel(model, preprocess, open_clip.get_tokenizer(arch), {}, device,
                       autocast_dtype("amp_bf16", device))


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(arch: str, image_size: int, n: int, batch_size: int, workers: int | None, device: str | None,
        repeats: int, ray_cpus: int | None) -> dict:
    import ray

    dev = pick_device(device)
    workers = default_workers(dev) if workers is None else workers
    loaded = toy_loaded(arch, dev)
    if not os.environ.get(embed_ray.ADDRESS_VARIABLE):
        ray.init(num_cpus=ray_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    embed_ray.connect()
    small = n // 4
    seconds: dict[str, list[float]] = {"local": [], "ray": [], "local_small": [], "ray_small": []}
    with tempfile.TemporaryDirectory() as tmp:
        images = make_images(n, image_size)
        paths = {"": write_split(images, Path(tmp) / "all"), "_small": write_split(images[:small], Path(tmp) / "small")}
        engines = {"local": lambda path: embed_images(loaded, path, "bench", "test", batch_size=batch_size,
                                                      num_workers=workers, progress=False)[0],
                   "ray": lambda path: embed_ray.embed_images(loaded, path, "bench", "test", batch_size=batch_size,
                                                              progress=False)[0]}
        a, b = engines["local"](paths[""]), engines["ray"](paths[""])  # warm-up (Ray's workers import torch here)
        for r in range(repeats):  # alternate the order, so that load drifting on a shared machine hits both
            for name in (["local", "ray"] if r % 2 == 0 else ["ray", "local"]):
                for size in ("", "_small"):
                    seconds[name + size].append(timed(lambda: engines[name](paths[size])))
    med = {k: statistics.median(v) for k, v in seconds.items()}
    rates = {name: round(n / med[name], 1) for name in engines}
    # time(n) = start-up + n / rate: the split of n and the split of n/4 give both (per call; the stage calls per split)
    marginal = {name: round((n - small) / max(med[name] - med[name + "_small"], 1e-9), 1) for name in engines}
    startup = {name: round(med[name] - n / marginal[name], 2) for name in engines}
    return {
        "arch": arch, "image_size": image_size, "n": n, "batch_size": batch_size, "local_workers": workers,
        "device": str(dev), "ray_cpus": ray.cluster_resources().get("CPU"), "ray_gpus": ray.cluster_resources().get("GPU", 0),
        "ray_actors": embed_ray.actor_count(dev), "repeats": repeats, "images_per_s": rates,
        "marginal_images_per_s": marginal, "startup_s": startup,
        "seconds": {k: [round(x, 2) for x in v] for k, v in seconds.items()},
        "ray_vs_local": round(rates["ray"] / rates["local"], 3),
        "ray_vs_local_marginal": round(marginal["ray"] / marginal["local"], 3),
        "max_abs_diff": float(np.abs(a - b).max()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="vlbench-toy")
    p.add_argument("--image-size", type=int, default=32, help="side of the stored JPEGs")
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=None, help="local engine's DataLoader workers (default: the stage's)")
    p.add_argument("--device", default=None)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--ray-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)")
    args = p.parse_args()
    print(json.dumps(run(args.arch, args.image_size, args.n, args.batch_size, args.workers, args.device,
                         args.repeats, args.ray_cpus)))


if __name__ == "__main__":
    main()
