"""GPU check (issues 35 and 43): the GPU path measured in one command that sizes itself to the time it is given.

On the device machine, from the repo root, with the wheels of benchmarks/gpu_check_wheels.txt in .whl/ (open_clip and
what it needs that the machine lacks; the machine has no internet, models have random weights):

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && PYTHONPATH=$PWD:/tmp/site python3 benchmarks/gpu_check.py --budget-s 420 --out $OUT

With the CUDA tests after it (about a minute more; the wheels include pytest), their summary in $OUT/cuda_tests.txt:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && PYTHONPATH=$PWD:/tmp/site python3 benchmarks/gpu_check.py --budget-s 420 --out $OUT; PYTHONPATH=$PWD:/tmp/site timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_embed_options.py > $OUT/cuda_tests.txt 2>&1; tail -5 $OUT/cuda_tests.txt

Issue 43's sections only (about 7 minutes; docs/benchmarks.md "Issue 43"): `--budget-s 380 --sections
model_only,features,decode_agreement,embed_stage,model_variants`.

CPU mode with tiny sizes (the test suite runs it: tests/test_gpu_check.py):

    python benchmarks/gpu_check.py --tiny --device cpu --budget-s 60 --out /tmp/gpu_check

Writes OUT/gpu_check.json and OUT/gpu_check.md (a markdown table: device, driver, torch, date, every measurement with
its target), rewritten after every measurement, so a run cut short still leaves what it measured. Sections, in order:

  model_only   ViT-B/16 and ViT-L/14 at 224 px under bf16 autocast (as the embed stage on CUDA) on batches made on
               the device beforehand, embeddings back to the host: images/s, GFLOP/image (torch.utils.flop_counter),
               the fraction of the device's dense bf16 peak (target 0.35)
  features     the embed stage's features on the device (bf16) vs on the CPU (fp32), same weights, a few images:
               max abs difference and min cosine against the tolerance tests/test_cuda.py asserts (0.99 for bf16)
  decode_agreement  each decoder's embeddings of a few photo-like JPEGs on the device vs pil's on the device
               (mean and min cosine, tolerance 0.99; docs/protocols.md "Image decoding")
  embed_stage  vlbench.embed.embed_images on a canonical Parquet store of generated photo-like JPEGs (500x375 and
               1280x854, quality 90) with each decoder (pil, pil_draft, torchvision, dali where installed) with the
               stage's default overlap and the other way round (pil_overlap, <device decoder>_no_overlap), for every
               model at both sizes; for the first also the torchvision ImageFolder + DataLoader baseline on the same
               files and each decoder with no model: images/s and the ratio to model_only (target 0.9)
  model_variants  the first model's model_only with one lever changed: bf16_weights (the embed stage's option,
               vlbench.embed.bf16_image_weights), batch_x2, then torch.compile with and without bf16 weights if time
               is left; each with max abs difference and min cosine to the default's embeddings
  elevater     the batched ELEVATER linear-probe search (vlbench.analyses.adapt.elevater.search) on the device vs the
               toolkit's one-configuration-at-a-time loop on the same device (benchmarks/adapt_search_speed.py;
               `toolkit_configs` of them run, time scaled to all)
  finetune     ViT-B/16 fine-tuning steps (vlbench.finetune.training.train, bf16 autocast, AdamW) with LoRA, BitFit and
               full fine-tuning of the image tower (vlbench.finetune.selections), a linear head on the image features

Each timed run is sized from a short probe to about `run_s` seconds; a section whose estimate no longer fits in what
is left of the budget is skipped and the table says so. Errors in one measurement are recorded and the rest goes on.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch.utils.data import DataLoader
from torchvision.datasets import ImageFolder

from adapt_search_speed import batched as elevater_batched
from adapt_search_speed import make as elevater_data
from adapt_search_speed import split as elevater_split
from adapt_search_speed import toolkit_run
from embed_throughput import write_both
from vlbench.embed import bf16_image_weights, default_workers, embed_images
from vlbench.finetune.training import Loop, Runtime, constant, train
from vlbench.finetune.selections import prepare
from vlbench.io import atomic_path, write_json
from vlbench.models import register_local_configs
from vlbench.models.loading import LoadedModel

DECODERS = ("pil", "pil_draft", "torchvision", "dali")  # each with the stage's default overlap (on: device decoders)
OVERLAP_DECODERS = ("pil",)  # also run with overlap on (the default is off for it)
DEVICE_DECODERS = ("torchvision", "dali")  # also run with overlap off (the default is on for them)
STAGE_RUNS = (*DECODERS, *(f"{d}_overlap" for d in OVERLAP_DECODERS), *(f"{d}_no_overlap" for d in DEVICE_DECODERS),
              "imagefolder_baseline", *(f"{d}_no_model" for d in DECODERS))
# no_model and imagefolder_baseline: the first model's stage only (decoding's own rate: every model here takes 224 px
# bicubic inputs, so it is the same for all)
SECTIONS = ("model_only", "features", "decode_agreement", "embed_stage", "model_variants", "elevater", "finetune")
FINETUNE_METHODS = {"lora": "lora", "bitfit": "bitfit", "full": "visual"}  # name in the table -> methods.SELECTIONS
TARGETS = {"peak_fraction": 0.35, "stage_vs_model": 0.9, "min_cosine_bf16": 0.99, "decode_min_cosine": 0.99}
# dense (no sparsity) bf16 tensor-core peaks, FLOP/s, from NVIDIA's data sheets; the first name contained wins
BF16_PEAKS = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12), ("GH200", 989e12),
              ("A100", 312e12), ("L40S", 362e12), ("L4", 121e12), ("A10", 125e12))
STORE_BYTES = 2 * 1024**3  # at most this many bytes of JPEGs in one store (written twice: Parquet and ImageFolder)
# levers of the model-only rate (issue 35), measured on the first model: variant -> (batch multiple, bf16 weights, torch.compile)
# bf16_weights: the embed stage's option (vlbench.embed.bf16_image_weights: bf16 weights under bf16 autocast)
MODEL_VARIANTS = {"batch_x2": (2, False, False), "batch_x4": (4, False, False), "bf16_weights": (1, True, False),
                  "compile": (1, False, True), "bf16_weights_compile": (1, True, True)}
FEATURE_TOLERANCE = {"amp_bf16": 0.99, "amp_fp16": 0.999, "fp32": 0.9999}  # min cosine, tests/test_cuda.py


@dataclass(frozen=True)
class Profile:
    """The sizes of one run: `full` for a GPU, `tiny` for the CPU mode of the test suite."""

    archs: tuple[str, ...] = ("ViT-B-16", "ViT-L-14")
    batch: dict = field(default_factory=lambda: {"ViT-B-16": 256, "ViT-L-14": 128})
    image_sizes: tuple[tuple[int, int], ...] = ((500, 375), (1280, 854))
    unique_images: int = 48  # distinct JPEGs per size, repeated to fill a store
    run_s: float = 5.0  # target seconds of one timed run
    max_rounds: int = 4  # a store holds at most this many rounds of `round_rows` per worker
    round_rows: int = 256  # a row group of vlbench's writer (canonical.ROWS_PER_GROUP); tiny: a part of one
    features_images: int = 8
    finetune_arch: str = "ViT-B-16"
    finetune_batch: int = 64
    search: tuple[int, int, int] = (2000, 512, 10)  # ELEVATER search data: n, dim, classes
    toolkit_configs: int = 6
    workers: int | None = None  # None: the embed stage's default
    variants: tuple[str, ...] = ("bf16_weights", "batch_x2", "compile", "bf16_weights_compile")
    precision: str = "amp_bf16"
    stage_sizes: int = 2  # image sizes of the embed stage for every model but the first


FULL = Profile()
TINY = Profile(archs=("vlbench-toy",), batch={"vlbench-toy": 16}, image_sizes=((64, 48), (160, 107)), unique_images=4,
               run_s=0.3, max_rounds=1, round_rows=32, features_images=2, finetune_arch="vlbench-toy", finetune_batch=8,
               search=(200, 32, 4), toolkit_configs=2, workers=0, variants=("batch_x2", "bf16_weights"))
LATE_VARIANTS = ("compile", "bf16_weights_compile")  # compiling takes a minute: after every model's stage


class Check:
    """Results, the budget, and the files rewritten after every measurement."""

    def __init__(self, out: Path, budget_s: float, device: torch.device, profile: Profile, mode: str,
                 sections: tuple[str, ...] = SECTIONS):
        self.out, self.budget_s, self.device, self.profile, self.sections = out, budget_s, device, profile, sections
        self.start = time.perf_counter()
        self.results: dict = {"env": {**environment(device, budget_s, mode, profile), "sections": list(sections)},
                              "targets": TARGETS, "model_only": {}, "model_variants": {}, "features": {},
                              "decode_agreement": {}, "embed_stage": {}, "elevater": {}, "finetune": {},
                              "skipped": [], "errors": []}

    def left(self) -> float:
        return self.budget_s - (time.perf_counter() - self.start)

    def fits(self, what: str, estimate_s: float) -> bool:
        """True if `estimate_s` fits in what is left; else the skip is recorded with its reason."""
        if estimate_s <= self.left():
            return True
        self.results["skipped"].append({"what": what, "reason": f"needs ~{estimate_s:.0f} s, {self.left():.0f} s left"})
        self.write()
        return False

    def guarded(self, what: str, fn, *args):
        """fn(*args); an exception is recorded (one line and the traceback's tail) and None returned."""
        try:
            return fn(*args)
        except Exception as err:  # noqa: BLE001 - one failed measurement must not lose the others
            self.results["errors"].append({"what": what, "error": f"{type(err).__name__}: {err}",
                                           "traceback": traceback.format_exc()[-2000:]})
            print(f"gpu_check: {what} failed: {err}", file=sys.stderr)
            return None
        finally:
            self.write()

    def write(self) -> None:
        self.results["elapsed_s"] = round(time.perf_counter() - self.start, 1)
        write_json(self.out / "gpu_check.json", self.results)
        with atomic_path(self.out / "gpu_check.md") as tmp:
            tmp.write_text(markdown(self.results))


# ------------------------------------------------------------------------------------------------ environment


def environment(device: torch.device, budget_s: float, mode: str, profile: Profile) -> dict:
    import open_clip
    import torchvision

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return {"device": str(device), "device_name": name, "driver": driver_version(device),
            "torch": torch.__version__, "torchvision": torchvision.__version__, "cuda": torch.version.cuda,
            "open_clip": open_clip.__version__, "python": platform.python_version(),
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cpu_cores": len(os.sched_getaffinity(0)),
            "device_memory_gib": round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
            if device.type == "cuda" else None, "budget_s": budget_s, "mode": mode,
            "bf16_peak_tflops": (peak_flops(name) or 0) / 1e12 or None, "precision": profile.precision}


def driver_version(device: torch.device) -> str:
    if device.type != "cuda":
        return "-"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def peak_flops(device_name: str) -> float | None:
    return next((peak for key, peak in BF16_PEAKS if key in device_name), None)


# ----------------------------------------------------------------------------------------------------- models


def perturbed(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """`model` with its LayerNorm weights scaled by exp(N(0, 0.3)) and every LayerNorm, linear and attention input
    bias moved by N(0, 0.1), in place: at initialisation they are ones and zeros, which can hide what bf16 weights or
    a decoder change with real weights (issue 43)."""
    g = torch.Generator().manual_seed(seed)

    def moved(p: torch.Tensor, scale: bool) -> torch.Tensor:
        noise = torch.randn(p.shape, generator=g).to(p.device)
        return p.mul_(torch.exp(0.3 * noise)) if scale else p.add_(0.1 * noise)

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm) and module.weight is not None:
                moved(module.weight, True)
            for name in ("bias", "in_proj_bias"):
                if isinstance(module, (torch.nn.LayerNorm, torch.nn.Linear, torch.nn.MultiheadAttention)) \
                        and isinstance(getattr(module, name, None), torch.Tensor):
                    moved(getattr(module, name), False)
    return model


def build(arch: str, device: torch.device, precision: str) -> LoadedModel:
    """`arch` with random weights (no download), `perturbed`, on `device`, autocast as the embed stage sets it there."""
    import open_clip

    register_local_configs()
    torch.manual_seed(0)
    model, _, preprocess = open_clip.create_model_and_transforms(arch, pretrained=None, device=device)
    perturbed(model).eval()
    dtype = {"amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}.get(precision) if device.type == "cuda" else None
    return LoadedModel(model, preprocess, None, {"model": arch}, device, dtype)


def image_size(loaded: LoadedModel) -> int:
    size = loaded.model.visual.image_size
    return size[0] if isinstance(size, (tuple, list)) else int(size)


def gflop_per_image(loaded: LoadedModel) -> float:
    """The image tower's FLOPs for one image (a multiply-add counts 2): `vit_gflop` for an open_clip ViT, else
    `counted_gflop`."""
    visual = loaded.model.visual
    if hasattr(visual, "conv1") and hasattr(getattr(visual, "transformer", None), "resblocks"):
        return vit_gflop(visual, image_size(loaded))
    return counted_gflop(loaded)


def vit_gflop(visual: torch.nn.Module, size: int) -> float:
    """A ViT's matrix products for one image: patch embedding, per block the q/k/v and output projections, the
    attention scores and their weighted sum, the MLP; then the projection (35.1 for ViT-B/16 at 224 px, 162.0 for
    ViT-L/14). Norms, softmax and activations are left out (under 1%)."""
    width, patch = visual.conv1.out_channels, visual.conv1.kernel_size[0]
    grid = size // patch
    tokens = grid * grid + (1 if getattr(visual, "class_embedding", None) is not None else 0)
    blocks = visual.transformer.resblocks
    hidden = blocks[0].mlp.c_fc.out_features
    per_block = tokens * 4 * width * width + 2 * tokens * tokens * width + 2 * tokens * width * hidden
    proj = visual.proj.numel() if getattr(visual, "proj", None) is not None else 0
    macs = grid * grid * 3 * patch * patch * width + len(blocks) * per_block + proj
    return 2 * macs / 1e9


def counted_gflop(loaded: LoadedModel) -> float:
    """By torch.utils.flop_counter, with autograd on: under inference mode nn.MultiheadAttention takes its fused fast
    path, which the counter does not see (and it misses the CPU's scaled_dot_product_attention: ViT-B/16 counts 33.7
    GFLOP of `vit_gflop`'s 35.1)."""
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.zeros(1, 3, image_size(loaded), image_size(loaded), device=loaded.device)
    with FlopCounterMode(display=False) as counter, torch.enable_grad():
        loaded.model.encode_image(x)
    return counter.get_total_flops() / 1e9


def encode_to_host(loaded: LoadedModel, x: torch.Tensor) -> np.ndarray:
    with torch.inference_mode(), loaded.autocast():
        return loaded.model.encode_image(x).float().cpu().numpy()


def reference_batch(loaded: LoadedModel, batch: int) -> torch.Tensor:
    size = image_size(loaded)
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0)).to(loaded.device)


def images_per_s(encode, x: torch.Tensor, run_s: float) -> tuple[float, int]:
    """(images/s, batches) of `encode(x)` (which brings its result to the host) for about `run_s` seconds, after two
    untimed calls (kernels, autocast caches, compilation)."""
    if x.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(x.device)
    for _ in range(2):
        encode(x)
    done, start = 0, time.perf_counter()
    while done < 3 or time.perf_counter() - start < run_s:
        encode(x)
        done += 1
    return done * len(x) / (time.perf_counter() - start), done


def rate_row(check: Check, loaded: LoadedModel, rate: float, batch: int, batches: int) -> dict:
    """The row of a timed model run: rate, FLOPs, share of the peak, and the device memory it peaked at."""
    cuda = loaded.device.type == "cuda"
    memory = round(torch.cuda.max_memory_allocated(loaded.device) / 2**30, 2) if cuda else None
    gflop = gflop_per_image(loaded)
    peak = peak_flops(check.results["env"]["device_name"]) if cuda else None
    return {"images_per_s": round(rate, 1), "batch": batch, "batches": batches, "gflop_per_image": round(gflop, 2),
            "peak_memory_gib": memory,
            "achieved_tflops": round(rate * gflop / 1e3, 1),
            "peak_fraction": round(rate * gflop * 1e9 / peak, 3) if peak else None,
            "images_per_s_at_target": round(TARGETS["peak_fraction"] * peak / (gflop * 1e9)) if peak else None}


def model_only(check: Check, loaded: LoadedModel, batch: int) -> dict:
    """Images/s of the image tower on batches made on the device beforehand, for about `run_s` seconds."""
    rate, batches = images_per_s(partial(encode_to_host, loaded), reference_batch(loaded, batch), check.profile.run_s)
    return rate_row(check, loaded, rate, batch, batches)


def model_variant(check: Check, loaded: LoadedModel, arch: str, variant: str) -> dict:
    """model_only with one lever changed (`MODEL_VARIANTS`), and how far its embeddings of the reference batch are from
    the default's (max abs difference, min cosine): a variant that changes bits would be an option recorded in the
    fingerprint, off by default."""
    batch = check.profile.batch[arch]
    x = reference_batch(loaded, batch)
    reference = torch.from_numpy(encode_to_host(loaded, x))
    scale, cast, compiled = MODEL_VARIANTS[variant]
    run = bf16_image_weights(loaded) if cast else loaded  # the embed stage's option, its code path
    visual = torch.compile(run.model.visual) if compiled else run.model.visual

    def encode(images: torch.Tensor) -> np.ndarray:
        with torch.inference_mode(), run.autocast():
            return visual(images).float().cpu().numpy()

    xs = x.repeat(scale, 1, 1, 1)
    rate, batches = images_per_s(encode, xs, check.profile.run_s)
    got = torch.from_numpy(encode(xs)[:batch])
    cos = torch.nn.functional.cosine_similarity(got, reference, dim=1)
    return {**rate_row(check, loaded, rate, batch * scale, batches), "variant": variant,
            "max_abs_diff": float((got - reference).abs().max()), "min_cosine": float(cos.min())}


# ------------------------------------------------------------------------------------------------ photo-like JPEGs


def photo_like(width: int, height: int, seed: int) -> bytes:
    """A JPEG (quality 90) that compresses like a photo: smooth colour gradients, soft blobs, a few hard-edged shapes
    and sensor-like noise (1280x854: about 235 kB, 500x375: about 44 kB)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    xx, yy = xx / width, yy / height
    corners = rng.uniform(0, 255, (4, 3)).astype(np.float32)
    img = ((1 - xx)[..., None] * ((1 - yy)[..., None] * corners[0] + yy[..., None] * corners[1])
           + xx[..., None] * ((1 - yy)[..., None] * corners[2] + yy[..., None] * corners[3]))
    for _ in range(4):
        cx, cy, r = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.05, 0.3)
        blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r))
        img += blob[..., None] * rng.uniform(-80, 80, 3).astype(np.float32)
    pil = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(pil)
    for _ in range(6):
        x0, y0 = rng.uniform(0, width), rng.uniform(0, height)
        box = [x0, y0, x0 + rng.uniform(0.05, 0.4) * width, y0 + rng.uniform(0.05, 0.4) * height]
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=colour)
    pixels = np.asarray(pil, dtype=np.float32) + rng.normal(0, 6, (height, width, 3)).astype(np.float32)
    buf = io.BytesIO()
    Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def photos(profile: Profile) -> dict[tuple[int, int], list[bytes]]:
    """`unique_images` JPEGs of each size, generated in parallel processes (numpy and Pillow only)."""
    jobs = [(w, h, seed) for w, h in profile.image_sizes for seed in range(profile.unique_images)]
    if len(jobs) <= 16:
        made = [photo_like(*job) for job in jobs]
    else:
        with multiprocessing.get_context("fork").Pool(min(16, len(os.sched_getaffinity(0)))) as pool:
            made = pool.starmap(photo_like, jobs)
    return {size: [data for (w, h, _), data in zip(jobs, made) if (w, h) == size] for size in profile.image_sizes}


STORES: dict[tuple[Path, int, int], tuple[Path, Path]] = {}  # (folder, first JPEG's id, n) -> written once


def store(tmp: Path, unique: list[bytes], n: int) -> tuple[Path, Path]:
    """`n` images (the unique JPEGs repeated) as a canonical Parquet split and an ImageFolder tree under `tmp`."""
    key = (tmp, id(unique[0]), n)
    if key not in STORES:
        STORES[key] = write_both([unique[i % len(unique)] for i in range(n)], tmp / f"store{len(STORES)}")
    return STORES[key]


# --------------------------------------------------------------------------------------------------- embed stage


def no_model(batch: torch.Tensor) -> torch.Tensor:
    """In place of the model: the stage's decoding, copy and finishing transform alone."""
    return batch.new_zeros(len(batch), 1)


def stage_rate(loaded: LoadedModel, parquet: Path, n: int, batch: int, workers: int, decode: str,
               overlap: bool = False, encode=None) -> float:
    start = time.perf_counter()
    embed_images(loaded, parquet, "bench", "test", batch_size=batch, num_workers=workers, progress=False, decode=decode,
                 overlap=overlap, encode=encode)
    return n / (time.perf_counter() - start)


def baseline_rate(loaded: LoadedModel, folder: Path, n: int, batch: int, workers: int) -> float:
    """torchvision ImageFolder + DataLoader with the model's own transform in the workers, then the model."""
    start = time.perf_counter()
    loader = DataLoader(ImageFolder(str(folder), transform=loaded.preprocess), batch_size=batch, num_workers=workers,
                        pin_memory=loaded.device.type == "cuda")
    for x, _ in loader:
        encode_to_host(loaded, x.to(loaded.device, non_blocking=True))
    return n / (time.perf_counter() - start)


def embed_stage(check: Check, loaded: LoadedModel, arch: str, unique: dict, tmp: Path, reserve_s: float = 0,
                first: bool = False) -> None:
    """Every decoder (with the stage's default overlap, and the other way round where it matters) on one store per
    image size, sized from a probe run with `pil`; each run only if it leaves `reserve_s` for the sections after it.
    `first`: also the ImageFolder baseline and each decoder without the model (decoding's own rate), and every size
    (other models: `stage_sizes` of them)."""
    p, batch = check.profile, check.profile.batch[arch]
    workers = default_workers(loaded.device) if p.workers is None else p.workers
    model_rate = check.results["model_only"].get(arch, {}).get("images_per_s")
    out = check.results["embed_stage"].setdefault(arch, {"batch": batch, "workers": workers})
    group = p.round_rows * max(1, workers)  # whole rounds of row groups, so that no worker is left alone at the end
    for (w, h), jpegs in list(unique.items())[:None if first else p.stage_sizes]:
        key = f"{w}x{h}"
        if not check.fits(f"embed_stage {arch} {key}", 4 * (p.run_s + 3) + reserve_s):
            continue
        parquet, _ = store(tmp, jpegs, group)
        probe = stage_rate(loaded, parquet, group, batch, workers, "pil")  # also the warm-up (pinned-memory pool)
        fit_bytes = max(1, STORE_BYTES // (group * int(np.mean([len(j) for j in jpegs]))))  # disk, and time to write
        rounds = int(min(p.max_rounds, fit_bytes, max(1, round(probe * p.run_s / group))))
        n = rounds * group
        parquet, folder = store(tmp, jpegs, n)
        row = out.setdefault(key, {"n": n, "probe_pil_images_per_s": round(probe, 1)})
        runs = {d: (lambda d=d: stage_rate(loaded, parquet, n, batch, workers, d)) for d in DECODERS}
        runs.update({f"{d}_overlap": (lambda d=d: stage_rate(loaded, parquet, n, batch, workers, d, True))
                     for d in OVERLAP_DECODERS})
        runs.update({f"{d}_no_overlap": (lambda d=d: stage_rate(loaded, parquet, n, batch, workers, d, False))
                     for d in DEVICE_DECODERS})
        if first:
            runs["imagefolder_baseline"] = lambda: baseline_rate(loaded, folder, n, batch, workers)
            runs.update({f"{d}_no_model": (lambda d=d: stage_rate(loaded, parquet, n, batch, workers, d, encode=no_model))
                         for d in DECODERS})
        for name, run in runs.items():
            what = f"embed_stage {arch} {key} {name}"
            decode = name.split("_")[0]
            if not available(check, what, decode) or not check.fits(what, n / max(probe, 1) + 3 + reserve_s):
                continue
            rate = check.guarded(what, run)
            if rate is not None:
                row[name] = {"images_per_s": round(rate, 1),
                             "vs_model": round(rate / model_rate, 3) if model_rate else None}
                check.write()


def available(check: Check, what: str, decode: str) -> bool:
    """False, with the skip recorded, where a decoder's optional library is not installed (DALI)."""
    if decode != "dali":
        return True
    try:
        import nvidia.dali  # noqa: F401 - optional: pip install 'vlbench[dali]'
        return True
    except ImportError:
        check.results["skipped"].append({"what": what, "reason": "nvidia.dali is not installed (pip install "
                                                                 "'vlbench[dali]')"})
        return False


def decode_agreement(check: Check, loaded: LoadedModel, jpegs: list[bytes], tmp: Path) -> dict:
    """Each decoder's embeddings of a few photo-like JPEGs on the device vs `pil`'s on the same device: mean and
    min cosine (nvJPEG's IDCT and the device's resampling are what the CPU's agreement table does not see)."""
    n = check.profile.features_images * 4
    parquet, _ = store(tmp, jpegs, n)
    emb = {}
    for name in DECODERS:
        if available(check, f"decode_agreement {name}", name):
            e = embed_images(loaded, parquet, "bench", "test", batch_size=max(1, n // 4), num_workers=0,
                             progress=False, decode=name)[0]
            emb[name] = e / np.linalg.norm(e, axis=1, keepdims=True)
    return {name: {"images": n, "mean_cosine": float((e * emb["pil"]).sum(1).mean()),
                   "min_cosine": float((e * emb["pil"]).sum(1).min())} for name, e in emb.items()}


# ----------------------------------------------------------------------------------------------------- features


def features(check: Check, loaded: LoadedModel, arch: str, jpegs: list[bytes], tmp: Path) -> dict:
    """The stage's features of a few images on `loaded`'s device vs on the CPU in fp32 with the same weights."""
    n = check.profile.features_images
    parquet, _ = store(tmp, jpegs, n)
    batch = max(1, n // 2)
    device_emb, _ = embed_images(loaded, parquet, "bench", "test", batch_size=batch, num_workers=0, progress=False)
    cpu_model = build(arch, torch.device("cpu"), "fp32")
    cpu_model.model.load_state_dict({k: v.cpu() for k, v in loaded.model.state_dict().items()})
    cpu_emb, _ = embed_images(cpu_model, parquet, "bench", "test", batch_size=batch, num_workers=0, progress=False)
    cos = (device_emb * cpu_emb).sum(1) / (np.linalg.norm(device_emb, axis=1) * np.linalg.norm(cpu_emb, axis=1))
    precision = check.profile.precision if loaded.device.type == "cuda" else "fp32"
    tolerance = FEATURE_TOLERANCE[precision]
    return {"arch": arch, "images": n, "precision": precision, "max_abs_diff": float(np.abs(device_emb - cpu_emb).max()),
            "min_cosine": float(cos.min()), "tolerance_min_cosine": tolerance, "ok": bool(cos.min() > tolerance)}


# ----------------------------------------------------------------------------------------------------- ELEVATER


def elevater(check: Check) -> dict:
    """The batched search on the device vs the toolkit's loop on the device (a few configurations, time scaled)."""
    x, y, xv, yv = elevater_split(*elevater_data(*check.profile.search))
    elevater_batched(x[:200], y[:200], xv[:50], yv[:50], check.device)  # warm-up: first kernels
    start = time.perf_counter()
    best, configs, (w0, b0) = elevater_batched(x, y, xv, yv, check.device)
    ours = time.perf_counter() - start
    todo = configs[:check.profile.toolkit_configs]
    start = time.perf_counter()
    diffs = [abs(toolkit_run(x, y, xv, yv, w0, b0, lr, wd, device=check.device) - score) for lr, wd, score in todo]
    toolkit_s = (time.perf_counter() - start) * len(configs) / len(todo)
    n, dim, classes = check.profile.search
    return {"n_train": int(y.size), "n_val": int(yv.size), "dim": dim, "classes": classes,
            "configurations": len(configs), "batched_s": round(ours, 3), "toolkit_s": round(toolkit_s, 2),
            "toolkit_configs_run": len(todo), "toolkit_over_batched": round(toolkit_s / ours, 1),
            "val_accuracy": best, "toolkit_max_score_diff": max(diffs)}


# ----------------------------------------------------------------------------------------------------- finetune


def finetune_rate(check: Check, method: str) -> dict:
    """Steps/s of vlbench.finetune.training.train on random images with `method`'s trainable parameters."""
    p, dev = check.profile, check.device
    loaded = build(p.finetune_arch, dev, "fp32")
    model, trainable = prepare(loaded.model, FINETUNE_METHODS[method], generator=torch.Generator().manual_seed(0))
    size, classes = image_size(loaded), 10
    with torch.no_grad():
        dim = model.encode_image(torch.zeros(1, 3, size, size, device=dev)).shape[1]
    head = torch.randn(dim, classes, generator=torch.Generator().manual_seed(1)).to(dev)
    x = torch.randn(p.finetune_batch, 3, size, size, generator=torch.Generator().manual_seed(2)).to(dev)
    y = torch.arange(p.finetune_batch, device=dev) % classes
    options = {"precision": p.precision}
    optimizer = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-5)

    def loss(m, xb, yb):
        return torch.nn.functional.cross_entropy(m.encode_image(xb).float() @ head, yb)

    def steps(k: int) -> float:
        start = time.perf_counter()
        train(model, optimizer, Loop(f"gpu_check_{method}", k, lambda step: (x, y), loss, constant(1e-5), 0),
              options, Runtime(progress=False), dev)
        return (time.perf_counter() - start) / k

    per_step = steps(2)  # warm-up, and the probe that sizes the timed run
    k = int(min(100, max(3, p.run_s / 2 / per_step)))
    per_step = steps(k)
    return {"arch": p.finetune_arch, "selection": FINETUNE_METHODS[method], "trainable_params": trainable,
            "batch": p.finetune_batch, "steps": k, "steps_per_s": round(1 / per_step, 2),
            "images_per_s": round(p.finetune_batch / per_step, 1),
            "precision": options["precision"] if dev.type == "cuda" else "fp32"}


# ------------------------------------------------------------------------------------------------------ report


def markdown(r: dict) -> str:
    env = r["env"]
    lines = ["# GPU check", "",
             f"Device **{env['device_name']}** ({env['device']}), driver {env['driver']}, torch {env['torch']}, "
             f"torchvision {env['torchvision']}, CUDA {env['cuda']}, open_clip {env['open_clip']}, "
             f"Python {env['python']}, {env['cpu_cores']} CPU cores, {env['date']}, mode {env['mode']}, "
             f"budget {env['budget_s']} s, elapsed {r.get('elapsed_s')} s. Random weights; {env['precision']} "
             f"autocast on CUDA, fp32 on the CPU.", "",
             "| section | measurement | value | target | note |", "| --- | --- | --- | --- | --- |"]
    for arch, m in r["model_only"].items():
        lines.append(f"| model_only | {arch} images/s (batch {m['batch']}) | {m['images_per_s']} | "
                     f"{fmt(m.get('images_per_s_at_target'))} | {m['gflop_per_image']} GFLOP/image, "
                     f"{m['achieved_tflops']} TFLOP/s, peak memory {fmt(m.get('peak_memory_gib'))} GiB |")
        lines.append(f"| model_only | {arch} fraction of dense bf16 peak | {fmt(m['peak_fraction'])} | "
                     f">= {TARGETS['peak_fraction']} | peak {fmt(env['bf16_peak_tflops'])} TFLOP/s |")
    for arch, variants in r["model_variants"].items():
        for name, m in variants.items():
            lines.append(f"| model_variant | {arch} {name} images/s (batch {m['batch']}) | {m['images_per_s']} | "
                         f"{fmt(m.get('images_per_s_at_target'))} | {fmt(m['peak_fraction'])} of peak; vs default: "
                         f"max abs diff {m['max_abs_diff']:.3g}, min cosine {m['min_cosine']:.6f} |")
    f = r["features"]
    if f:
        lines.append(f"| features | {f['arch']} device ({f['precision']}) vs CPU fp32, {f['images']} images: min cosine "
                     f"| {f['min_cosine']:.6f} | > {f['tolerance_min_cosine']} | max abs diff {f['max_abs_diff']:.3g}; "
                     f"{'ok' if f['ok'] else 'OUT OF TOLERANCE'} |")
    for name, m in r.get("decode_agreement", {}).items():
        if name != "pil":
            lines.append(f"| decode_agreement | {name} vs pil on the device, {m['images']} photo-like JPEGs: "
                         f"min cosine | "
                         f"{m['min_cosine']:.6f} | >= {TARGETS['decode_min_cosine']} | mean {m['mean_cosine']:.6f} |")
    for arch, per_arch in r["embed_stage"].items():
        for key, row in per_arch.items():
            if not isinstance(row, dict):
                continue
            for name in STAGE_RUNS:
                if name in row:
                    measured = name not in ("imagefolder_baseline",) and not name.endswith("_no_model")
                    target = f">= {TARGETS['stage_vs_model']} x model" if measured else "-"
                    lines.append(f"| embed_stage | {arch} {key} {name} images/s | {row[name]['images_per_s']} | "
                                 f"{target} | {fmt(row[name]['vs_model'])} x model, n {row['n']}, batch "
                                 f"{per_arch['batch']}, {per_arch['workers']} workers |")
    e = r["elevater"]
    if e:
        lines.append(f"| elevater | batched search, {e['configurations']} configurations, s | {e['batched_s']} | "
                     f"< toolkit | n {e['n_train']}, dim {e['dim']}, {e['classes']} classes, val acc "
                     f"{e['val_accuracy']:.3f} |")
        lines.append(f"| elevater | toolkit loop (scaled from {e['toolkit_configs_run']}), s | {e['toolkit_s']} | - | "
                     f"{e['toolkit_over_batched']} x batched; max score diff {e['toolkit_max_score_diff']:.3g} |")
    for method, m in r["finetune"].items():
        lines.append(f"| finetune | {m['arch']} {method} ({m['selection']}) steps/s | {m['steps_per_s']} | - | "
                     f"batch {m['batch']}, {m['images_per_s']} images/s, {m['trainable_params']:,} trainable, "
                     f"{m['precision']} |")
    for s in r["skipped"]:
        lines.append(f"| skipped | {s['what']} | - | - | {s['reason']} |")
    for err in r["errors"]:
        lines.append(f"| error | {err['what']} | - | - | {err['error'][:200].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def fmt(value) -> str:
    return "-" if value is None else str(value)


# -------------------------------------------------------------------------------------------------------- main


def run(out: Path, budget_s: float, device: torch.device, profile: Profile, mode: str,
        sections: tuple[str, ...] = SECTIONS) -> dict:
    started = time.perf_counter()
    unique = photos(profile)  # before CUDA starts in this process: the pool forks
    check = Check(out, budget_s, device, profile, mode, sections)
    check.start = started
    check.write()
    models = {}
    for arch in profile.archs:  # cheapest first: the rate every other ratio needs
        if check.fits(f"model_only {arch}", profile.run_s + 20):
            models[arch] = check.guarded(f"build {arch}", build, arch, device, profile.precision)
            if models[arch] is not None and "model_only" in sections:
                res = check.guarded(f"model_only {arch}", model_only, check, models[arch], profile.batch[arch])
                if res:
                    check.results["model_only"][arch] = res
    first = profile.archs[0]
    first_jpegs = unique[profile.image_sizes[0]]
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        tmp = Path(tmp)
        if models.get(first) is not None and "features" in sections and check.fits("features", 30):
            check.results["features"] = check.guarded("features", features, check, models[first], first,
                                                      first_jpegs, tmp) or {}
        if models.get(first) is not None and "decode_agreement" in sections and check.fits("decode_agreement", 30):
            check.results["decode_agreement"] = check.guarded("decode_agreement", decode_agreement, check,
                                                              models[first], first_jpegs, tmp) or {}
        later = (("elevater" in sections) * 30 + ("model_variants" in sections) * 2 * (profile.run_s + 15)
                 + ("finetune" in sections) * len(FINETUNE_METHODS) * (3 * profile.run_s + 15))
        if models.get(first) is not None and "embed_stage" in sections:
            reserve = later + 30 * (len(profile.archs) - 1) if device.type == "cuda" else 0
            check.guarded(f"embed_stage {first}", embed_stage, check, models[first], first, unique, tmp, reserve, True)
        if "model_variants" in sections:
            for variant in [v for v in profile.variants if v not in LATE_VARIANTS]:
                measure_variant(check, models, first, variant)
        if "elevater" in sections and check.fits("elevater", 30):
            check.results["elevater"] = check.guarded("elevater", elevater, check) or {}
        for method in FINETUNE_METHODS if "finetune" in sections else ():
            if check.fits(f"finetune {method}", 3 * profile.run_s + 15):
                res = check.guarded(f"finetune {method}", finetune_rate, check, method)
                if res:
                    check.results["finetune"][method] = res
                torch.cuda.empty_cache() if device.type == "cuda" else None
        for arch in profile.archs[1:] if "embed_stage" in sections else ():
            if models.get(arch) is not None:
                check.guarded(f"embed_stage {arch}", embed_stage, check, models[arch], arch, unique, tmp)
        if "model_variants" in sections:
            for variant in [v for v in profile.variants if v in LATE_VARIANTS]:
                measure_variant(check, models, first, variant)
    check.write()
    return check.results


def measure_variant(check: Check, models: dict, arch: str, variant: str) -> None:
    estimate = check.profile.run_s + (120 if variant in LATE_VARIANTS else 15)
    if models.get(arch) is not None and check.fits(f"model_variant {arch} {variant}", estimate):
        row = check.guarded(f"model_variant {arch} {variant}", model_variant, check, models[arch], arch, variant)
        if row:
            check.results["model_variants"].setdefault(arch, {})[variant] = row
            check.write()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget-s", type=float, default=420, help="seconds the whole check may take (default 420)")
    p.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json and gpu_check.md")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None, help="default: cuda where available")
    p.add_argument("--tiny", "--cpu-mode", action="store_true", help="tiny sizes (toy model, a few images): tests")
    p.add_argument("--sections", default=",".join(SECTIONS),
                   help=f"comma-separated, of {','.join(SECTIONS)} (default: all; model_only's builds always run)")
    args = p.parse_args(argv)
    sections = tuple(s for s in args.sections.split(",") if s)
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        p.error(f"--sections: unknown {unknown}; known: {list(SECTIONS)}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    results = run(args.out, args.budget_s, device, TINY if args.tiny else FULL, "tiny" if args.tiny else "full",
                  sections)
    print(json.dumps({k: results[k] for k in ("model_only", "features", "decode_agreement", "elevater", "finetune",
                                              "skipped")}, default=str))
    print(f"gpu_check: wrote {args.out / 'gpu_check.json'} and {args.out / 'gpu_check.md'} "
          f"({len(results['errors'])} errors, {len(results['skipped'])} skipped) in {results['elapsed_s']} s")


if __name__ == "__main__":
    main()
