"""Embed throughput: the embed stage's data path vs the model alone vs a plain torchvision baseline.

One run, same images, same model, same batch size and workers:
  stage     vlbench.embed.embed_images: Parquet row groups -> DataLoader workers (decode + preprocess) -> model
            (workers run the whole transform on the CPU, stop at uint8 on an accelerator: vlbench.embed.worker_preprocess)
  stage_uint8 / stage_whole   with --compare-worker-split: the stage with the other choice than the device's default
  model     the model alone on tensors decoded and preprocessed beforehand (upper bound)
  baseline  torchvision ImageFolder over the same files on disk + DataLoader -> model

    python benchmarks/embed_throughput.py --arch ViT-B-32-quickgelu --image-size 224 --n 512
    python benchmarks/embed_throughput.py --arch vlbench-toy --image-size 32 --n 4096 --compare-worker-split

Models have random weights (throughput does not depend on them). Each path runs `--repeats` times in rotating
order; prints a JSON line with the median images/s, every run, and the ratios of the medians.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

from vlbench.datasets.canonical import ClassInfo, DatasetMeta, split_path, write_dataset
from vlbench.embed import default_workers, embed_images
from vlbench.models import register_local_configs
from vlbench.models.loading import LoadedModel, effective_precision, pick_device


def make_images(n: int, size: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        pixels = (rng.random((size, size, 3)) * 64 + rng.integers(0, 192, 3)).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def write_both(images: list[bytes], root: Path) -> tuple[Path, Path]:
    """The same bytes as a canonical Parquet split and as an ImageFolder tree (two classes)."""
    folder = root / "imagefolder"
    for i, data in enumerate(images):
        path = folder / f"c{i % 2}" / f"{i:06d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    meta = DatasetMeta(name="bench", task="single-label", metric="accuracy", classes=[ClassInfo(0, "a"), ClassInfo(1, "b")])
    rows = ({"sample_id": f"{i:06d}", "label": i % 2, "image": data} for i, data in enumerate(images))
    write_dataset(root / "prepared", meta, {"test": rows})
    return split_path(root / "prepared", "test"), folder


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def run(arch: str, image_size: int, n: int, batch_size: int, workers: int | None, device: str | None,
        repeats: int = 3, compare_worker_split: bool = False) -> dict:
    import open_clip

    register_local_configs()
    dev = pick_device(device)
    workers = default_workers(dev) if workers is None else workers
    model, _, preprocess = open_clip.create_model_and_transforms(arch, device=dev)
    model.eval()
    precision = effective_precision("amp_bf16", dev)
    loaded = LoadedModel(model, preprocess, open_clip.get_tokenizer(arch), {}, dev,
                         torch.bfloat16 if precision == "amp_bf16" else None)

    def encode(x: torch.Tensor) -> np.ndarray:  # every path brings its embeddings back to the host, as the stage must
        with torch.inference_mode(), loaded.autocast():
            return model.encode_image(x.to(dev, non_blocking=True)).float().cpu().numpy()

    with tempfile.TemporaryDirectory() as tmp:
        parquet, folder = write_both(make_images(n, image_size), Path(tmp))
        decoded = [preprocess(Image.open(io.BytesIO(b)).convert("RGB")) for b in make_images(min(n, 4 * batch_size), image_size)]
        batches = [torch.stack(decoded[i:i + batch_size]) for i in range(0, len(decoded), batch_size)]
        encode(batches[0])  # warm-up

        def model_only():
            done = 0
            while done < n:
                for batch in batches:
                    encode(batch)
                    done += len(batch)

        def stage():
            embed_images(loaded, parquet, "bench", "test", batch_size=batch_size, num_workers=workers, progress=False)

        def baseline():
            loader = DataLoader(ImageFolder(str(folder), transform=preprocess), batch_size=batch_size,
                                num_workers=workers, pin_memory=dev.type == "cuda")
            for x, _ in loader:
                encode(x)

        paths = {"model": model_only, "stage": stage, "baseline": baseline}
        if compare_worker_split:  # the stage with the other choice: uint8 in the workers on the CPU, whole transform elsewhere
            whole_by_default = dev.type == "cpu"
            alternative = "stage_uint8" if whole_by_default else "stage_whole"
            paths[alternative] = lambda: embed_images(loaded, parquet, "bench", "test", batch_size=batch_size,
                                                      num_workers=workers, progress=False,
                                                      normalise_in_workers=not whole_by_default)
        runs: dict[str, list[float]] = {k: [] for k in paths}
        for r in range(repeats):  # rotate the order so one-off costs (pinned-memory pools, caches) hit each path once
            order = list(paths)[r % len(paths):] + list(paths)[:r % len(paths)]
            for name in order:
                runs[name].append(n / timed(paths[name]))
    rates = {k: round(statistics.median(v), 1) for k, v in runs.items()}
    extra = {f"stage_vs_{k}": round(rates["stage"] / rates[k], 3) for k in rates if k.startswith("stage_")}
    return {
        "arch": arch, "image_size": image_size, "n": n, "batch_size": batch_size, "workers": workers,
        "device": str(dev), "threads": torch.get_num_threads(), "repeats": repeats, "images_per_s": rates,
        "runs": {k: [round(x, 1) for x in v] for k, v in runs.items()},
        "stage_vs_baseline": round(rates["stage"] / rates["baseline"], 3),
        "stage_vs_model": round(rates["stage"] / rates["model"], 3), **extra,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="ViT-B-32-quickgelu")
    p.add_argument("--image-size", type=int, default=224, help="side of the stored JPEGs")
    p.add_argument("--n", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=None, help="default: what the embed stage uses")
    p.add_argument("--device", default=None)
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each path; the median is reported")
    p.add_argument("--compare-worker-split", action="store_true",
                   help="also time the stage with the workers' other preprocessing split (uint8 vs whole transform)")
    args = p.parse_args()
    print(json.dumps(run(args.arch, args.image_size, args.n, args.batch_size, args.workers, args.device, args.repeats,
                         args.compare_worker_split)))


if __name__ == "__main__":
    main()
