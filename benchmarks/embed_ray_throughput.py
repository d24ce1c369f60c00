"""Embed throughput of the two engines on the same split: local (vlbench.embed.embed_images, DataLoader workers) vs
Ray (vlbench.embed_ray.embed_images: row-group decode tasks, model actors), in one run, on one machine.

    python benchmarks/embed_ray_throughput.py --arch vlbench-toy --image-size 32 --n 4096
    python benchmarks/embed_ray_throughput.py --arch ViT-B-32-quickgelu --image-size 256 --n 2048 --device cuda

The Ray engine joins $VLBENCH_RAY_ADDRESS if set, else starts a local Ray with `--ray-cpus` CPUs (default: all).
Every call of the Ray engine starts its model actors afresh (the stage makes one call per split): `ray_first` is the
first call after Ray started (workers import torch), `ray` the median of the later ones, `ray_steady` the same
rate with the actors' start-up taken out (images / (time - the time to the first output batch)). Models have random
weights. Prints one JSON line: the median images/s of each path, every run, and the ratios to the local engine.
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
from vlbench.models.loading import LoadedModel, autocast_dtype, effective_precision, pick_device  # noqa: E402


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


def run(arch: str, image_size: int, n: int, batch_size: int, workers: int | None, device: str | None,
        repeats: int, ray_cpus: int | None) -> dict:
    import ray

    dev = pick_device(device)
    workers = default_workers(dev) if workers is None else workers
    loaded = toy_loaded(arch, dev)
    if not os.environ.get(embed_ray.ADDRESS_VARIABLE):
        ray.init(num_cpus=ray_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    embed_ray.connect()
    runs: dict[str, list[float]] = {"local": [], "ray": [], "ray_steady": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = write_split(make_images(n, image_size), Path(tmp))

        def local() -> np.ndarray:
            return embed_images(loaded, path, "bench", "test", batch_size=batch_size, num_workers=workers,
                                progress=False)[0]

        def on_ray() -> tuple[np.ndarray, float]:
            first: list[float] = []
            original = embed_ray._gather

            def gather(rows, batch):  # the time of the first output batch: the actors have started
                first.append(first[0] if first else time.perf_counter())
                original(rows, batch)

            embed_ray._gather = gather
            try:
                start = time.perf_counter()
                emb = embed_ray.embed_images(loaded, path, "bench", "test", batch_size=batch_size, progress=False)[0]
                end = time.perf_counter()
            finally:
                embed_ray._gather = original
            return emb, end - start, end - first[0]

        start = time.perf_counter()
        a = local()
        local_first = n / (time.perf_counter() - start)
        b, seconds, _ = on_ray()
        ray_first = n / seconds
        for r in range(repeats):
            for name in (["local", "ray"] if r % 2 == 0 else ["ray", "local"]):
                if name == "local":
                    start = time.perf_counter()
                    local()
                    runs["local"].append(n / (time.perf_counter() - start))
                else:
                    _, seconds, steady = on_ray()
                    runs["ray"].append(n / seconds)
                    runs["ray_steady"].append(n / steady)
    rates = {k: round(statistics.median(v), 1) for k, v in runs.items()}
    return {
        "arch": arch, "image_size": image_size, "n": n, "batch_size": batch_size, "local_workers": workers,
        "device": str(dev), "ray_cpus": ray.cluster_resources().get("CPU"), "ray_gpus": ray.cluster_resources().get("GPU", 0),
        "ray_actors": embed_ray.actor_count(dev),
        "repeats": repeats, "images_per_s": rates, "local_first": round(local_first, 1), "ray_first": round(ray_first, 1),
        "runs": {k: [round(x, 1) for x in v] for k, v in runs.items()},
        "ray_vs_local": round(rates["ray"] / rates["local"], 3),
        "ray_steady_vs_local": round(rates["ray_steady"] / rates["local"], 3),
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
