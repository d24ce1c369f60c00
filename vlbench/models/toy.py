"""Toy CLIP pretraining: a tiny open_clip model trained on CPU on the synthetic world's caption corpus.

The demo suite needs a model without network access, so the pipeline trains one: `train_toy_clip` reads
the corpus's `train.parquet` (images + `captions`), decodes every image once into a uint8 tensor,
tokenizes every caption once, and trains an open_clip architecture from `vlbench/models/configs/` with
open_clip's own `ClipLoss`, AdamW and a warmup + cosine schedule. Everything is deterministic from the
seed (model init, batch order, caption choice), and the same on every x86-64 CPU with AVX2 when the process
runs with vlbench.portable's settings (every stage does).

The checkpoint is a plain `state_dict`, so the toy model loads like any local checkpoint:

    register_local_configs()
    model, _, preprocess = open_clip.create_model_and_transforms("vlbench-toy", pretrained=path)

Images are normalised exactly as the model's own eval preprocessing does (resize + center crop to the
model's image size, RGB, `/255`, the model's mean/std), so features computed later by the embed stage
see the same inputs as training did.
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vlbench import portable
from vlbench.datasets.canonical import DatasetError, iter_batches, split_path
from vlbench.io import atomic_path, sha256_file
from vlbench.models import CONFIG_DIR, register_local_configs

LOG_NAME = "train_log.csv"


def train_toy_clip(
    corpus_dir: str | os.PathLike,
    arch: str,
    out_path: str | os.PathLike,
    *,
    steps: int = 1200,
    batch_size: int = 128,
    lr: float = 3e-3,
    weight_decay: float = 0.1,
    warmup_steps: int = 100,
    seed: int = 0,
    grad_clip_norm: float | None = 1.0,
    max_pairs: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train `arch` (an open_clip model name, e.g. "vlbench-toy") on `corpus_dir`'s train split.

    Writes the state_dict to `out_path` (atomically) and `train_log.csv` (step, loss, lr) beside it;
    returns summary statistics. `max_pairs` uses only the first N images of the split (for tests).

    The pieces, in order: :func:`build_toy_model`, :func:`_load_corpus`, :class:`_Batches`,
    :func:`make_optimizer`, :func:`_train_loop` (one :func:`train_step` per step), then
    :func:`_write_checkpoint`, :func:`_write_train_log` and :func:`_summary`. Model init, corpus loading and
    training run in that order under one seeded, deterministic RNG scope, which is what makes the
    checkpoint bit-identical for a seed (on every x86-64 CPU with AVX2 under vlbench.portable, as stages run).
    """
    if steps < 1 or batch_size < 2:
        raise ValueError(f"steps must be >= 1 and batch_size >= 2 (got steps={steps}, batch_size={batch_size})")
    t_start = time.perf_counter()
    out_path = Path(out_path)
    _check_arch(arch)

    with _deterministic(seed), torch.random.fork_rng(devices=[]):
        model = build_toy_model(arch, seed)
        pp = dict(model.visual.preprocess_cfg)
        images, tokens, owner = _load_corpus(corpus_dir, arch, pp, max_pairs)
        if images.shape[0] < batch_size:
            raise DatasetError(
                f"{corpus_dir}: train split has {images.shape[0]} captioned images, fewer than batch_size={batch_size}"
            )
        t_data = time.perf_counter() - t_start
        batches = _Batches(images, tokens, owner, pp, batch_size, seed)
        optimizer = make_optimizer(model, lr, weight_decay)
        t_train = time.perf_counter()
        log = _train_loop(model, optimizer, batches, _lr_schedule(lr, warmup_steps, steps), steps, grad_clip_norm,
                          _progress(steps, arch, progress))
        train_seconds = time.perf_counter() - t_train
        threads = torch.get_num_threads()

    model.eval()
    _write_checkpoint(model, out_path)
    log_path = _write_train_log(log, out_path.with_name(LOG_NAME))
    settings = dict(steps=steps, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                    warmup_steps=warmup_steps, seed=seed)
    timings = dict(data=t_data, train=train_seconds, total=time.perf_counter() - t_start, threads=threads)
    return _summary(model, arch, out_path, log_path, log, images.shape[0], tokens.shape[0], settings, timings)


def _check_arch(arch: str) -> None:
    import open_clip

    register_local_configs()
    if arch not in open_clip.list_models():
        raise ValueError(f"unknown open_clip architecture {arch!r}; vlbench's own are {local_archs()}")


def build_toy_model(arch: str, seed: int):
    """A freshly initialised open_clip `arch` on CPU, from `torch.manual_seed(seed)`.

    It reseeds torch's global generator: call it inside a `torch.random.fork_rng` scope (as
    `train_toy_clip` does) to leave the caller's RNG state alone.
    """
    import open_clip

    _check_arch(arch)
    torch.manual_seed(seed)
    return open_clip.create_model(arch, pretrained=None, device="cpu")


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """AdamW (betas 0.9/0.98, eps 1e-6) with weight decay on matrices only, not on biases, norms or logit_scale."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.ndim < 2 or "bn" in name or "ln" in name or "bias" in name or "logit_scale" in name:
            no_decay.append(p)
        else:
            decay.append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:  # the fused CPU kernel is ~5x faster than the loop (the token embedding is most of the weights)
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.98), eps=1e-6, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.98), eps=1e-6)


def _train_loop(model, optimizer, batches: _Batches, schedule, steps: int, grad_clip_norm: float | None,
                bar=None) -> list[tuple[int, float, float]]:
    """`steps` optimisation steps (1-based) with open_clip's `ClipLoss`; returns the log of (step, loss, lr)."""
    from open_clip.loss import ClipLoss

    loss_fn = ClipLoss()
    log: list[tuple[int, float, float]] = []
    model.train()
    for step in range(1, steps + 1):
        x, text = batches.next()
        cur_lr = schedule(step)
        loss = train_step(model, optimizer, loss_fn, x, text, cur_lr, grad_clip_norm, step)
        log.append((step, loss, cur_lr))
        if bar is not None:
            bar.update(1)
            if step % 10 == 0 or step == steps:
                bar.set_postfix(loss=f"{loss:.3f}", lr=f"{cur_lr:.2e}")
    if bar is not None:
        bar.close()
    return log


def train_step(model, optimizer, loss_fn, x: torch.Tensor, text: torch.Tensor, lr: float,
                grad_clip_norm: float | None, step: int) -> float:
    """One AdamW step at learning rate `lr` on the batch (x, text); returns the loss before the step.

    Gradients are clipped to `grad_clip_norm` (if set) and `logit_scale` is clamped to [0, log 100] after.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    image_features, text_features, logit_scale = model(x, text)[:3]
    loss = loss_fn(image_features, text_features, logit_scale)
    if not torch.isfinite(loss):
        raise FloatingPointError(f"toy training diverged at step {step} (loss {loss.item()}); lower lr")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip_norm)
    optimizer.step()
    with torch.no_grad():
        model.logit_scale.clamp_(0, math.log(100))
    return float(loss.item())


def _write_checkpoint(model: torch.nn.Module, out_path: Path) -> None:
    """The state_dict (no optimizer state), written atomically. The checkpoint is kept in git and every committed
    result names its sha256 (`weights_sha256`), so its format stays the one the committed results were made with:
    dropping the state_dict's `_metadata` would save 6 KB of 34.8 MB and change every result's fingerprint
    (docs/benchmarks.md, "The toy checkpoint")."""
    with atomic_path(out_path) as tmp, open(tmp, "wb") as f:
        torch.save(model.state_dict(), f)  # a file object: given a path, torch names the archive after the file


def _write_train_log(log: list[tuple[int, float, float]], log_path: Path) -> Path:
    """`step,loss,lr` rows (loss to 6 decimals, lr to 8 significant digits), written atomically."""
    with atomic_path(log_path) as tmp:
        with open(tmp, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["step", "loss", "lr"])
            writer.writerows((s, f"{l:.6f}", f"{r:.8g}") for s, l, r in log)
    return log_path


def _summary(model, arch: str, out_path: Path, log_path: Path, log: list[tuple[int, float, float]], n_img: int,
             n_captions: int, settings: dict[str, Any], timings: dict[str, float]) -> dict[str, Any]:
    """What `train_toy_clip` returns: the files, the corpus size, the settings, losses and timings."""
    steps, batch_size = settings["steps"], settings["batch_size"]
    tail = [l for _, l, _ in log[-max(1, steps // 20):]]
    return {
        "arch": arch,
        "checkpoint": str(out_path),
        "train_log": str(log_path),
        "weights_sha256": sha256_file(out_path),
        "parameters": sum(p.numel() for p in model.parameters()),
        "images": int(n_img),
        "captions": int(n_captions),
        "steps": steps,
        "batch_size": batch_size,
        "epochs": steps * batch_size / n_img,
        "lr": settings["lr"],
        "weight_decay": settings["weight_decay"],
        "warmup_steps": settings["warmup_steps"],
        "seed": settings["seed"],
        "initial_loss": log[0][1],
        "final_loss": float(np.mean(tail)),
        "logit_scale": float(model.logit_scale.exp().item()),
        "data_seconds": round(timings["data"], 2),
        "train_seconds": round(timings["train"], 2),
        "seconds": round(timings["total"], 2),
        "steps_per_s": round(steps / timings["train"], 3),
        "threads": timings["threads"],
    }


def local_archs() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


class _Owners:
    """Captions of image i are rows offsets[i] .. offsets[i] + counts[i] - 1 of the token matrix."""

    def __init__(self, counts: list[int]):
        self.counts = torch.tensor(counts, dtype=torch.long)
        self.offsets = torch.cumsum(self.counts, 0) - self.counts


def _load_corpus(corpus_dir, arch: str, pp: dict, max_pairs: int | None):
    """Decode every captioned image once (uint8 N x 3 x H x W) and tokenize every caption once."""
    import open_clip
    import pyarrow.parquet as pq
    from open_clip.transform import PreprocessCfg, image_transform_v2

    from vlbench.datasets.images import decode_rgb

    path = split_path(corpus_dir, "train")
    names = pq.ParquetFile(path).schema_arrow.names
    if "captions" not in names:
        raise DatasetError(
            f"{path}: no 'captions' column (columns: {', '.join(names)}); toy CLIP training needs an "
            "image-caption corpus such as the synthetic world's 'corpus' dataset"
        )
    # the model's own eval preprocessing up to (not including) ToTensor/Normalize: resize, crop, RGB
    full = image_transform_v2(PreprocessCfg(**pp), is_train=False).transforms
    pil_steps = []
    for t in full:
        if type(t).__name__ in ("MaybeToTensor", "ToTensor", "Normalize"):
            break
        pil_steps.append(t)

    arrays: list[np.ndarray] = []
    captions: list[str] = []
    counts: list[int] = []
    for batch in iter_batches(path, columns=["image", "captions"]):
        for img_bytes, caps in zip(batch.column("image").to_pylist(), batch.column("captions").to_pylist()):
            caps = [c for c in (caps or []) if c and c.strip()]
            if not caps or img_bytes is None:
                continue
            im = decode_rgb(img_bytes)  # the embed stage's decoding, so training sees images as embedding does
            for t in pil_steps:
                im = t(im)
            arrays.append(np.asarray(im, dtype=np.uint8))
            captions.extend(caps)
            counts.append(len(caps))
            if max_pairs and len(counts) >= max_pairs:
                break
        if max_pairs and len(counts) >= max_pairs:
            break
    if not counts:
        raise DatasetError(f"{path}: no image has a non-empty caption")
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise DatasetError(f"{path}: images do not share one size after preprocessing: {sorted(shapes)[:3]}")
    images = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()

    tokenizer = open_clip.get_tokenizer(arch)
    unique = sorted(set(captions))
    unique_tokens = tokenizer(unique)
    where = {c: i for i, c in enumerate(unique)}
    tokens = unique_tokens[torch.tensor([where[c] for c in captions], dtype=torch.long)]
    return images, tokens, _Owners(counts)


class _BatchSampler:
    """Batches from shuffled passes over the corpus; a pass's last incomplete batch is dropped."""

    def __init__(self, n_img: int, batch_size: int, gen: torch.Generator):
        self.n, self.bs, self.gen = n_img, batch_size, gen
        self.order = torch.empty(0, dtype=torch.long)

    def next(self) -> torch.Tensor:
        if self.order.numel() < self.bs:
            self.order = torch.randperm(self.n, generator=self.gen)
        batch, self.order = self.order[: self.bs], self.order[self.bs:]
        return batch


class _Batches:
    """Training batches (x, text): images from `_BatchSampler` passes, normalised like the model's eval
    preprocessing (`/255`, mean/std), and one caption per image drawn uniformly from its captions.

    One generator seeded with `seed` drives both the pass order and the caption choice."""

    def __init__(self, images: torch.Tensor, tokens: torch.Tensor, owner: _Owners, pp: dict, batch_size: int,
                 seed: int):
        self.images, self.tokens, self.owner, self.batch_size = images, tokens, owner, batch_size
        self.mean = torch.tensor(pp["mean"], dtype=torch.float32).view(1, 3, 1, 1) * 255.0
        self.std = torch.tensor(pp["std"], dtype=torch.float32).view(1, 3, 1, 1) * 255.0
        self.gen = torch.Generator().manual_seed(seed)
        self.sampler = _BatchSampler(images.shape[0], batch_size, self.gen)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.sampler.next()
        pick = self.owner.offsets[idx] + (torch.rand(self.batch_size, generator=self.gen)
                                          * self.owner.counts[idx]).long()
        x = (self.images[idx].float() - self.mean) / self.std
        return x, self.tokens[pick]


def _lr_schedule(base_lr: float, warmup: int, total: int):
    warmup = max(0, min(warmup, total - 1))

    def lr_at(step: int) -> float:  # step is 1-based
        if step <= warmup:
            return base_lr * step / warmup
        progress = (step - warmup) / (total - warmup + 1)
        return 0.5 * base_lr * (1.0 + math.cos(math.pi * progress))

    return lr_at


@contextlib.contextmanager
def _deterministic(seed: int):
    """Seeded, deterministic kernels and a fixed thread count (vlbench.portable.THREADS: a parallel reduction splits
    by thread) for the duration of training; the caller's settings are restored.

    Deterministic mode also fills every new tensor with NaN before a kernel writes it (`fill_uninitialized_memory`, a
    guard against kernels that read memory they did not write); training reads none (the weights are the same bytes
    without it), so it is off here: the fills cost about 5% of a step's CPU (docs/benchmarks.md, "First run")."""
    previous = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    threads = torch.get_num_threads()
    py_state, np_state = random.getstate(), np.random.get_state()
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    if portable.enabled():
        torch.set_num_threads(portable.THREADS)
    random.seed(seed)
    np.random.seed(seed)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(previous, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill
        random.setstate(py_state)
        np.random.set_state(np_state)


def _progress(total: int, arch: str, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=f"train {arch}", unit="step", dynamic_ncols=True)
