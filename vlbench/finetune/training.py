"""What every fine-tuning method shares: the job it gets, the outcome it returns, and one resumable training loop.

`train(...)` runs optimisation steps 1..N. Everything random in a step is a function of (seed, step) only (the
method's `batch(step)` draws with a generator seeded from them, and torch's global generator is reseeded from them
before the step), so a run resumed from its state file after step k takes the same steps k+1..N as an uninterrupted
run: the final weights are bit-identical (on one machine and thread count). The state file (`Runtime.state_dir`)
holds the model's state, the optimizer's and the log, written atomically every `Runtime.checkpoint_every` steps.

Runtime knobs (device, progress bar, state folder, micro-batch) are never params: they change speed, not numbers, with
one exception said where it applies: a micro-batch smaller than the batch (set, or halved after a CUDA out-of-memory
error) accumulates gradients over chunks, and a loss that couples the samples of a batch (batch norm statistics,
contrastive softmax) then sees each chunk alone; the run facts record the micro-batch used.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from vlbench.finetune import FinetuneError
from vlbench.io import atomic_path

PRECISIONS = {"fp32": None, "amp_bf16": torch.bfloat16}  # finetune.precision -> autocast dtype (CUDA only)


@dataclass
class Runtime:
    """How a run executes (stage flags, never params)."""

    device: str | None = None
    progress: bool = True
    state_dir: Path | None = None  # resumable state of each training run; None: no checkpoints
    checkpoint_every: int = 50
    stop_after: int | None = None  # raise Interrupted after this many steps of a run (tests; time-limited jobs)
    micro_batch: int | None = None  # forward/backward chunk (None: the whole batch); halves on CUDA OOM
    engine: str | None = None  # where work units run: local | ray (vlbench.finetune.units; None: $VLBENCH_ENGINE)
    gpus: float | None = None  # GPU share of each unit's Ray task (None: $VLBENCH_GPUS_PER_UNIT, else 1 / 0)
    units_dir: Path | None = None  # the unit cache (None: results kept in memory only)


@dataclass
class Job:
    """One fine-tuning run: the dataset's prepared data and text sets, the base model, the method's settings."""

    dataset: str
    prepared: Path  # data/prepared/<dataset>
    texts: Path  # data/texts/<dataset>
    model_cfg: Mapping[str, Any]  # params' model (the base)
    settings: Mapping[str, Any]  # params' finetune.<method>
    options: Mapping[str, Any]  # params' finetune (precision, grad_checkpointing, ...)
    seed: int
    params: Mapping[str, Any] = field(default_factory=dict)  # the whole params (protocol sections a method reuses)
    runtime: Runtime = field(default_factory=Runtime)


@dataclass
class Outcome:
    """What a method returns: the fine-tuned model's state_dict (the whole open_clip model, loadable as a checkpoint of
    the base architecture; None for a method that leaves no single model), the names of the parameters it trained, the hyper-parameters that made it (its
    fingerprint), and its result (metrics, details, tables) and charts (name -> Vega-Lite spec)."""

    state_dict: dict[str, torch.Tensor] | None  # None: no single model (episodic methods)
    trainable: list[str]
    hyper: dict[str, Any]
    metrics: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pa.Table] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    chart: dict[str, Any] = field(default_factory=dict)
    intervals: dict[str, dict[str, Any]] = field(default_factory=dict)  # metric -> vlbench.stats.Interval.to_json()


class Interrupted(Exception):
    """A run stopped after `Runtime.stop_after` steps; its state file lets the next call resume it."""


class Diverged(FinetuneError):
    """A run's loss turned non-finite at `step` (of `steps`); no optimizer step was taken on it. A method with a
    hyper-parameter search scores such a search run as failed; elsewhere it is the user's error (one line)."""

    def __init__(self, run: str, step: int, steps: int, loss: float):
        self.run, self.step, self.steps, self.loss = run, step, steps, loss
        super().__init__(f"{run}: loss {loss} is not finite at step {step} of {steps}; lower the learning rate")


# --------------------------------------------------------------------------------------------------
# seeds, devices, precision


def step_seed(seed: int, name: str, step: int) -> int:
    """The seed of everything random in step `step` of run `name`: a function of these alone."""
    return int(np.random.SeedSequence([int(seed), zlib.crc32(name.encode()), int(step)]).generate_state(1)[0])


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


@contextlib.contextmanager
def deterministic(seed: int):
    """Deterministic kernels and seeded global generators for a run; the caller's settings are restored after. cuBLAS
    needs CUBLAS_WORKSPACE_CONFIG for deterministic results; it is set here unless the environment sets it (it takes
    effect when set before the process's first cuBLAS call, as in the stage)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    previous, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    state = random.getstate(), np.random.get_state()
    torch.use_deterministic_algorithms(True, warn_only=True)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    try:
        with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
            torch.manual_seed(seed)
            yield
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=warn)
        random.setstate(state[0])
        np.random.set_state(state[1])


def pick_device(requested: str | None) -> torch.device:
    return torch.device(requested or ("cuda" if torch.cuda.is_available() else "cpu"))


def autocast(options: Mapping[str, Any], device: torch.device):
    """bf16 autocast on CUDA when finetune.precision is amp_bf16 (FP32 by default, ELEVATER's); FP32 on the CPU."""
    precision = options.get("precision", "fp32")
    if precision not in PRECISIONS:
        raise FinetuneError(f"params.yaml: finetune.precision {precision!r} is not one of {list(PRECISIONS)}")
    dtype = PRECISIONS[precision] if device.type == "cuda" else None
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def prepare_model(model: torch.nn.Module, options: Mapping[str, Any]) -> torch.nn.Module:
    """Gradient checkpointing (finetune.grad_checkpointing: open_clip's set_grad_checkpointing; ViT-L on one GPU)."""
    if options.get("grad_checkpointing"):
        model.set_grad_checkpointing(True)
    return model


def freeze(model: torch.nn.Module, trainable: Callable[[str], bool]) -> list[str]:
    """requires_grad on the parameters `trainable(name)` accepts, off elsewhere; returns the trained names."""
    names = []
    for name, p in model.named_parameters():
        p.requires_grad_(bool(trainable(name)))
        if p.requires_grad:
            names.append(name)
    if not names:
        raise FinetuneError("no parameter of the model is trainable under this method's selection")
    return names


def count_parameters(model: torch.nn.Module, names: Sequence[str]) -> int:
    chosen = set(names)
    return int(sum(p.numel() for n, p in model.named_parameters() if n in chosen))


# --------------------------------------------------------------------------------------------------
# the training loop


@dataclass
class Loop:
    """One training run. `batch(step)` returns a tuple of tensors sharing dim 0; `loss(model, *chunk)` the mean loss
    of a chunk; `lr(step)` the learning rate of the step (1-based); `after_step(model, step)` runs after each optimizer
    step (clamping a logit scale, scoring validation at an epoch's end) and may return numbers for the step's log
    entry (kept in the state file, so a resumed run's log is whole)."""

    name: str
    steps: int
    batch: Callable[[int], tuple]
    loss: Callable[..., torch.Tensor]
    lr: Callable[[int], float]
    seed: int
    after_step: Callable[[torch.nn.Module, int], Mapping[str, Any] | None] | None = None
    grad_clip_norm: float | None = None


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loop: Loop, options: Mapping[str, Any],
          runtime: Runtime, device: torch.device) -> list[dict[str, float]]:
    """Run `loop` (resuming from its state file if there is one); returns the log: step, loss, lr per step."""
    state_path = runtime.state_dir / f"{loop.name}.pt" if runtime.state_dir else None
    start, log = resume(model, optimizer, state_path)
    bar = progress_bar(loop, start, runtime)
    micro = runtime.micro_batch
    model.train()
    for step in range(start + 1, loop.steps + 1):
        if runtime.stop_after is not None and step - start > runtime.stop_after:
            bar.close()
            raise Interrupted(f"{loop.name}: stopped after step {step - 1}")
        lr = loop.lr(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        torch.manual_seed(step_seed(loop.seed, loop.name, step))
        try:
            value, micro = optimise(model, optimizer, loop, loop.batch(step), micro, options, device)
        except NonFinite as err:
            bar.close()
            raise Diverged(loop.name, step, loop.steps, err.loss) from None
        extra = loop.after_step(model, step) if loop.after_step is not None else None
        log.append({"step": step, "loss": value, "lr": lr, "micro_batch": micro or 0, **(extra or {})})
        bar.update(1)
        bar.set_postfix(loss=f"{value:.4f}", lr=f"{lr:.2e}")
        if state_path and (step % runtime.checkpoint_every == 0 or step == loop.steps):
            save_state(state_path, model, optimizer, step, log)
    bar.close()
    return log


def optimise(model, optimizer, loop: Loop, batch: tuple, micro: int | None, options, device) -> tuple[float, int | None]:
    """One optimizer step on `batch`, in chunks of `micro` rows; on CUDA out of memory the chunk halves and the step
    starts again. Returns (loss, the chunk size used)."""
    size = int(batch[0].shape[0])
    while True:
        try:
            return _accumulate(model, optimizer, loop, batch, micro or size, options, device), micro
        except torch.cuda.OutOfMemoryError:
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            micro = (micro or size) // 2
            if micro < 1:
                raise FinetuneError(f"{loop.name}: out of GPU memory with a micro-batch of 1") from None
            print(f"{loop.name}: CUDA out of memory; micro-batch halved to {micro}")


def _accumulate(model, optimizer, loop: Loop, batch: tuple, micro: int, options, device) -> float:
    optimizer.zero_grad(set_to_none=True)
    size, total = int(batch[0].shape[0]), 0.0
    for lo in range(0, size, micro):
        chunk = tuple(t[lo:lo + micro].to(device, non_blocking=True) for t in batch)
        with autocast(options, device):
            loss = loop.loss(model, *chunk) * (chunk[0].shape[0] / size)
        if not torch.isfinite(loss):
            raise NonFinite(float(loss.item()))
        loss.backward()
        total += float(loss.item())
    if loop.grad_clip_norm:
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], loop.grad_clip_norm)
    optimizer.step()
    return total


class NonFinite(Exception):
    """A chunk's loss is not finite (raised before its backward pass; `train` names the run and step)."""

    def __init__(self, loss: float):
        super().__init__(loss)
        self.loss = loss


def resume(model, optimizer, state_path: Path | None) -> tuple[int, list[dict[str, float]]]:
    if state_path is None or not state_path.is_file():
        return 0, []
    state = torch.load(state_path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"]), list(state["log"])


def save_state(path: Path, model, optimizer, step: int, log: list) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "log": log}, f)


def progress_bar(loop: Loop, start: int, runtime: Runtime):
    from tqdm.auto import tqdm

    return tqdm(total=loop.steps, initial=start, desc=loop.name, unit="step", disable=not runtime.progress,
                dynamic_ncols=True)


def cosine_with_warmup(base_lr: float, warmup: int, total: int) -> Callable[[int], float]:
    """open_clip's `cosine_lr` (training/scheduler.py): linear warmup over `warmup` steps, then half a cosine to 0."""
    def lr(step: int) -> float:
        s = step - 1  # open_clip counts steps from 0
        if s < warmup:
            return base_lr * (s + 1) / warmup
        e, es = s - warmup, max(total - warmup, 1)
        return 0.5 * (1 + math.cos(math.pi * e / es)) * base_lr

    return lr


def constant(base_lr: float) -> Callable[[int], float]:
    return lambda step: base_lr


def state_on_cpu(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
