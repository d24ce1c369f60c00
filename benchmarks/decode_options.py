"""embed.decode options (vlbench/decoding.py) against the default `pil`: speed, pixels, and accuracy on the demo.

1. speed: one process decodes and preprocesses the same JPEG photos (scikit-learn's two sample photos, 640x427, and
   the same scaled up to 1280x854 and 2560x1708, JPEG quality 90) for ViT-B/16's transform (Resize 224 bicubic +
   CenterCrop) with each decoder, in rotating order; images/s and the ratio to `pil` in the same run.
2. pixels: mean and max absolute difference of each decoder's model input from `pil`'s, in grey levels (0..255).
3. demo: the demo's `shapes` test split (1,000 images) scaled up x4 and x8 and re-encoded as JPEG, embedded by the
   trained toy model (needs `dvc repro` first: data/models/toy/checkpoint.pt, features/toy/shapes/text) with each
   decoder; zero-shot accuracy with the shapes prompt ensemble and each decoder's accuracy difference from `pil`.

    python benchmarks/decode_options.py [--repeats 3] [--skip-demo]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time
from pathlib import Path

import numpy as np
import open_clip
import pyarrow.parquet as pq
import torch
from PIL import Image
from sklearn.datasets import load_sample_images

from vlbench.datasets.canonical import split_schema, write_split
from vlbench.decoding import DECODERS, decoder
from vlbench.embed import embed_images
from vlbench.models.loading import load_model

CPU = torch.device("cpu")
SCALES = (1, 2, 4)


def photos(scale: int) -> list[bytes]:
    out = []
    for pixels in load_sample_images().images:
        img = Image.fromarray(pixels)
        img = img.resize((img.width * scale, img.height * scale), Image.BICUBIC) if scale > 1 else img
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def model_inputs(name: str, preprocess, images: list[bytes]) -> torch.Tensor:
    dec = decoder(name, preprocess, CPU, "ViT-B-16")
    items = [dec.worker(data) for data in images]
    return dec.finish(torch.stack(items) if dec.stack else items)


def speed_and_pixels(repeats: int) -> dict:
    _, _, preprocess = open_clip.create_model_and_transforms("ViT-B-16", pretrained=None)
    mean = torch.tensor(preprocess.transforms[-1].mean).view(1, -1, 1, 1)
    std = torch.tensor(preprocess.transforms[-1].std).view(1, -1, 1, 1)
    out = {}
    for scale in SCALES:
        images = photos(scale) * 8
        runs: dict[str, list[float]] = {name: [] for name in DECODERS}
        for r in range(repeats):
            for name in list(DECODERS)[r % 3:] + list(DECODERS)[:r % 3]:
                start = time.perf_counter()
                model_inputs(name, preprocess, images)
                runs[name].append(len(images) / (time.perf_counter() - start))
        grey = {name: (model_inputs(name, preprocess, images[:2]) * std + mean) * 255 for name in DECODERS}
        size = Image.open(io.BytesIO(images[0])).size
        out[f"{size[0]}x{size[1]}"] = {
            name: {"images_per_s": round(statistics.median(runs[name]), 1),
                   "ratio_to_pil": round(statistics.median(runs[name]) / statistics.median(runs["pil"]), 2),
                   "mean_abs_grey": round(float((grey[name] - grey["pil"]).abs().mean()), 3),
                   "max_abs_grey": round(float((grey[name] - grey["pil"]).abs().max()), 1)}
            for name in DECODERS}
    return out


def upscaled_split(src: Path, dst: Path, scale: int) -> Path:
    table = pq.read_table(src, columns=["sample_id", "label", "image"])

    def rows():
        for sample_id, label, data in zip(*(table.column(c).to_pylist() for c in ("sample_id", "label", "image"))):
            img = Image.open(io.BytesIO(data)).convert("RGB")
            buf = io.BytesIO()
            img.resize((img.width * scale, img.height * scale), Image.BICUBIC).save(buf, format="JPEG", quality=90)
            yield {"sample_id": sample_id, "label": label, "image": buf.getvalue()}

    write_split(dst, rows(), split_schema(False))
    return dst


def class_weights(path: Path, classes: int) -> np.ndarray:
    t = pq.read_table(path)
    emb = np.stack(t.column("embedding").to_numpy(zero_copy_only=False)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    index = np.asarray(t.column("class_index").to_pylist())
    w = np.stack([emb[index == c].mean(0) for c in range(classes)])
    return w / np.linalg.norm(w, axis=1, keepdims=True)


def demo_accuracy(root: Path, work: Path) -> dict:
    loaded = load_model({"slug": "toy", "arch": "vlbench-toy", "pretrained": str(root / "data/models/toy/checkpoint.pt"),
                         "precision": "fp32"}, device="cpu")
    test = root / "data/prepared/shapes/splits/test.parquet"
    labels = np.asarray(pq.read_table(test, columns=["label"]).column("label").to_pylist())
    weights = class_weights(root / "features/toy/shapes/text/prompts.parquet", int(labels.max()) + 1)
    out = {}
    for scale in (4, 8):
        path = upscaled_split(test, work / f"shapes_x{scale}.parquet", scale)
        emb = {name: embed_images(loaded, path, "shapes", f"x{scale}", num_workers=1, progress=False, decode=name)[0]
               for name in DECODERS}
        acc = {name: float(((e / np.linalg.norm(e, axis=1, keepdims=True)) @ weights.T).argmax(1).__eq__(labels).mean())
               for name, e in emb.items()}
        cos = {name: float(np.mean(np.sum(_l2n(e) * _l2n(emb["pil"]), axis=1))) for name, e in emb.items()}
        out[f"{32 * scale}px_jpeg"] = {name: {"accuracy": round(acc[name], 4), "minus_pil": round(acc[name] - acc["pil"], 4),
                                              "mean_cosine_to_pil": round(cos[name], 5)} for name in DECODERS}
    return out


def _l2n(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--skip-demo", action="store_true")
    p.add_argument("--root", type=Path, default=Path("."), help="the checkout whose demo outputs to use")
    p.add_argument("--work", type=Path, default=Path("/tmp/vlbench-decode-bench"))
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    result = {"threads": 1, "speed_and_pixels": speed_and_pixels(args.repeats)}
    if not args.skip_demo:
        result["demo"] = demo_accuracy(args.root, args.work)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
