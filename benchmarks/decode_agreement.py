"""How close each `embed.decode` option and `embed.bf16_weights` come to the default (`pil`, fp32 weights), measured
through the embed stage (`vlbench.embed.embed_images`) on the CPU with an open_clip ViT whose weights are random and
then perturbed (benchmarks/gpu_check.py's `perturbed`: LayerNorm weights scaled by exp(N(0, 0.3)), every LayerNorm,
linear and attention bias moved by N(0, 0.1); at initialisation they are ones and zeros, which can hide a difference
real weights would show).

Images (`realistic_set`): the demo's shapes (vlbench.datasets.synthetic's renderer, 64 px) scaled up x4 and x8
(bicubic) and re-encoded as JPEG; scikit-learn's two sample photos (`load_sample_images`, 640x427) at x1, x2 and x3;
generated photo-like JPEGs (benchmarks/gpu_check.py's `photo_like`) at 500x375 and 1280x854; all JPEG quality 90.

1. agreement: per decoder, the mean and minimum cosine of each image's embedding to `pil`'s, per image group and
   overall, and zero-shot agreement: the share of images whose top class among the shapes' names (the same
   perturbed model's text tower, "a photo of a {c}.") is `pil`'s. The cosine between different images' `pil`
   embeddings is given for scale (a model whose embeddings all point one way would make every decoder look close).
2. bf16_weights: the same images' `pil` inputs through the image tower with fp32 weights under bf16 autocast (the
   embed stage on a GPU) vs bf16 weights under bf16 autocast (`vlbench.embed.bf16_image_weights`), both on the CPU:
   max abs difference and min cosine; and each against fp32 without autocast; for the perturbed and the initial ViT.

    python benchmarks/decode_agreement.py [--arch ViT-B-32] [--out /tmp/decode_agreement.json]

Prints one JSON line (and writes it to --out).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import open_clip
import torch
from PIL import Image
from sklearn.datasets import load_sample_images

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_check import perturbed, photo_like  # noqa: E402
from vlbench.datasets.canonical import split_schema, write_split  # noqa: E402
from vlbench.datasets.synthetic import render, shape_names, single_object  # noqa: E402
from vlbench.decoding import DECODERS  # noqa: E402
from vlbench.embed import bf16_image_weights, embed_images  # noqa: E402
from vlbench.models.loading import LoadedModel  # noqa: E402

CPU = torch.device("cpu")
TOLERANCE = {"min_cosine": 0.99, "zero_shot_agreement": 0.95}  # docs/protocols.md "Image decoding"


def jpeg(image: Image.Image, scale: float = 1) -> bytes:
    if scale != 1:
        image = image.resize((round(image.width * scale), round(image.height * scale)), Image.BICUBIC)
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def realistic_set(shapes: int = 16, photos: int = 8) -> dict[str, list[bytes]]:
    """{group: JPEGs}: the demo's shapes x4 and x8, scikit-learn's photos x1-x3, photo-like JPEGs at two sizes."""
    rng = np.random.default_rng(0)
    demo = [Image.open(io.BytesIO(render(rng, single_object(rng), 64))) for _ in range(shapes)]
    samples = [Image.fromarray(pixels) for pixels in load_sample_images().images]
    groups = {f"shapes {64 * s}px": [jpeg(img, s) for img in demo] for s in (4, 8)}
    groups.update({f"sklearn {640 * s}x{427 * s}": [jpeg(img, s) for img in samples] for s in (1, 2, 3)})
    groups.update({f"photo-like {w}x{h}": [photo_like(w, h, seed) for seed in range(photos)]
                   for w, h in ((500, 375), (1280, 854))})
    return groups


def build(arch: str, perturb: bool) -> tuple[LoadedModel, np.ndarray]:
    """(the model on the CPU in fp32, zero-shot class weights of the shapes' names from its text tower)."""
    torch.manual_seed(0)
    model, _, preprocess = open_clip.create_model_and_transforms(arch, pretrained=None)
    model = perturbed(model) if perturb else model
    model.eval()
    tokenizer = open_clip.get_tokenizer(arch)
    with torch.inference_mode():
        text = model.encode_text(tokenizer([f"a photo of a {c}." for c in shape_names()])).numpy()
    return LoadedModel(model, preprocess, tokenizer, {"model": arch}, CPU, None), unit(text)


def margin(scores: np.ndarray) -> np.ndarray:
    """Per row, the top score minus the second: how far an image is from changing its zero-shot class."""
    top2 = np.sort(scores, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def store(images: list[bytes], path: Path) -> Path:
    write_split(path, iter({"sample_id": f"i{k:04d}", "label": 0, "image": data} for k, data in enumerate(images)),
                split_schema(False))
    return path


def agreement(loaded: LoadedModel, classes: np.ndarray, groups: dict[str, list[bytes]], work: Path) -> dict:
    images = [data for group in groups.values() for data in group]
    names = np.repeat(list(groups), [len(g) for g in groups.values()])
    path = store(images, work / "agreement.parquet")
    emb = {name: unit(embed_images(loaded, path, "agreement", "test", batch_size=16, num_workers=0, progress=False,
                                   decode=name)[0]) for name in DECODERS}
    top = {name: (e @ classes.T).argmax(1) for name, e in emb.items()}
    pil = emb["pil"]
    between = pil @ pil.T
    out = {"images": len(images), "groups": {g: len(v) for g, v in groups.items()},
           "pil_cosine_between_images": {"mean": round(float(between[~np.eye(len(pil), dtype=bool)].mean()), 4),
                                         "min": round(float(between.min()), 4)},
           "pil_top_classes": {"distinct": int(len(np.unique(top["pil"]))), "of": len(classes),
                               "largest_share": round(float(np.bincount(top["pil"]).max() / len(pil)), 3)},
           "pil_top2_margin": {"median": round(float(np.median(margin(pil @ classes.T))), 5),
                               "min": round(float(margin(pil @ classes.T).min()), 5)},
           "decoders": {}}
    for name in DECODERS:
        cos = (emb[name] * pil).sum(1)
        row = {"mean_cosine": round(float(cos.mean()), 6), "min_cosine": round(float(cos.min()), 6),
               "zero_shot_agreement": round(float((top[name] == top["pil"]).mean()), 4),
               "by_group": {g: {"mean_cosine": round(float(cos[names == g].mean()), 6),
                                "min_cosine": round(float(cos[names == g].min()), 6)} for g in groups}}
        row["within_tolerance"] = bool(row["min_cosine"] >= TOLERANCE["min_cosine"]
                                       and row["zero_shot_agreement"] >= TOLERANCE["zero_shot_agreement"])
        out["decoders"][name] = row
    return out


def compare(a: torch.Tensor, b: torch.Tensor) -> dict:
    cos = torch.nn.functional.cosine_similarity(a, b, dim=1)
    return {"max_abs_diff": round(float((a - b).abs().max()), 5), "min_cosine": round(float(cos.min()), 6)}


def bf16_weights(loaded: LoadedModel, images: list[bytes]) -> dict:
    """fp32 weights under bf16 autocast vs bf16 weights under bf16 autocast (the option), and each vs plain fp32."""
    from vlbench.datasets.images import decode_rgb

    x = torch.stack([loaded.preprocess(decode_rgb(data)) for data in images])
    amp = replace(loaded, autocast_dtype=torch.bfloat16)

    def run(m: LoadedModel) -> torch.Tensor:
        with torch.inference_mode(), m.autocast():
            return m.model.encode_image(x).float()

    fp32, autocast_fp32_weights, autocast_bf16_weights = run(loaded), run(amp), run(bf16_image_weights(loaded))
    return {"images": len(images), "bf16_weights_vs_fp32_weights_under_autocast": compare(autocast_bf16_weights,
                                                                                          autocast_fp32_weights),
            "fp32_weights_under_autocast_vs_fp32": compare(autocast_fp32_weights, fp32),
            "bf16_weights_vs_fp32": compare(autocast_bf16_weights, fp32)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="ViT-B-32", help="an open_clip architecture (random weights, then perturbed)")
    p.add_argument("--shapes", type=int, default=16, help="demo images per scale")
    p.add_argument("--photos", type=int, default=8, help="photo-like JPEGs per size")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    groups = realistic_set(args.shapes, args.photos)
    loaded, classes = build(args.arch, perturb=True)
    with tempfile.TemporaryDirectory(prefix="decode_agreement_") as work:
        result = {"arch": args.arch, "torch": torch.__version__, "tolerance": TOLERANCE,
                  "agreement": agreement(loaded, classes, groups, Path(work))}
    sample = [data for group in groups.values() for data in group[:4]]
    result["bf16_weights"] = {"perturbed": bf16_weights(loaded, sample),
                              "initial": bf16_weights(build(args.arch, perturb=False)[0], sample)}
    line = json.dumps(result)
    print(line)
    if args.out:
        args.out.write_text(line + "\n")
    return result


if __name__ == "__main__":
    main()
