"""The plan's model rate (images per second of the image tower): measured in a child process with a time and memory
cap, cached per (architecture, precision, device, batch) for the next plan, or estimated from the architecture's FLOPs
when measuring would cost more than the cap; `Rate.source` says which (docs/benchmarks.md, "The plan's estimate").

Measuring a large model at the stage's batch on a CPU took `vlbench plan` 628 s and 7.2 GB (ViT-L/14) and 38 min and
13.7 GB (ViT-H/14). So first the architecture is built on PyTorch's meta device (shapes only: no memory, about a second)
and one image is run through it to count its FLOPs and its largest intermediate tensor; a short matrix product measures
the device's FLOP rate. When the measurement would take longer than the time cap or more memory than the memory cap (on
a GPU: its free memory), the rate is the device's matrix-product rate / the FLOPs per image: an upper bound (a model
runs its layers below a large matrix product's rate). Otherwise a child process (`python -m vlbench.models.rates`)
builds the model at random initialisation and times it; it is killed at the time cap, and its memory beyond its imports
is limited to the memory cap (RLIMIT_DATA, on a CPU); a child that does not finish gives the FLOPs estimate too, saying
why.

A measured rate is kept in `$VLBENCH_CACHE/plan-rates.json` (default `~/.cache/vlbench/`: a fact of the machine, not
of the project), keyed by architecture, precision, device (the CPU's name and core count, or the GPU's name) and batch;
the next plan with the same key reads it and starts no child. Delete the file to measure again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from vlbench.adapters import torch as torch_private
from vlbench.io import WriteError, user_cache_dir, write_json
from vlbench.models.timing import build_image_model, describe_device, sync

BATCH = 256  # the embed stage's default --batch-size
BATCHES = 3  # timed full batches at most, after one untimed small one
BUDGET_S = 10.0  # no further timed batch starts after this
STEP_BUDGET_S = 10.0  # timed training steps stop after this (at least one)
STEP_REPEATS = 3
CAP_S = 60.0  # the child is killed after this (its imports, the model's build, the batches)
CAP_BYTES = 4 << 30  # memory the child may take beyond its imports
ACTIVATION_FACTOR = 4  # tensors alive at once at the forward's peak, in units of its largest one
CACHE_FILE = "plan-rates.json"
MEASURED, CACHED, FLOPS = "measured", "cached", "estimated from FLOPs"


@dataclass(frozen=True)
class Architecture:
    """What the meta-device pass tells about a model: FLOPs and memory per image, and its preprocessing."""

    flops: float  # per image, forward of the image tower
    parameter_bytes: int  # the whole model's parameters in fp32 (the stage builds both towers)
    activation_bytes: int  # per image, at the forward's peak (ACTIVATION_FACTOR x its largest tensor)
    forward_bytes: int  # per image, every tensor the forward makes (what a training step may keep for backward)
    preprocess: Any


@dataclass(frozen=True)
class Rate:
    value: float  # images per second of the forward (`model_rate`), seconds per training step (`step_seconds`)
    source: str  # MEASURED, CACHED or FLOPS
    how: str


def architecture(model_cfg: Mapping[str, Any]) -> Architecture:
    """Build the model on the meta device and run one image through its image tower, counting FLOPs and the largest
    tensor (torch.utils.flop_counter): no weights, no memory, no arithmetic."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    meta = torch.device("meta")
    with meta:
        model, preprocess, _ = build_image_model(model_cfg, meta)
    height, width = _size(model)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter, torch_private.output_bytes() as largest:
        model.encode_image(torch.empty(1, 3, height, width, device=meta))
    return Architecture(float(counter.get_total_flops()), 4 * sum(p.numel() for p in model.parameters()),
                        ACTIVATION_FACTOR * largest.largest, largest.total, preprocess)


def _size(model) -> tuple[int, int]:
    size = model.visual.image_size
    return (size, size) if isinstance(size, int) else tuple(size)


def matmul_flops(device, precision: str) -> float:
    """FLOP/s of square matrix products on `device` in the stage's autocast dtype (fp32 on a CPU), over about 0.3 s."""
    import torch

    from vlbench.models.loading import autocast_dtype

    n = 4096 if device.type == "cuda" else 1024
    dtype = autocast_dtype(precision, device) or torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    sync(device)
    start, done = time.perf_counter(), 0
    while done < 3 or time.perf_counter() - start < 0.3:
        a @ b
        done += 1
    sync(device)
    return 2 * n ** 3 * done / (time.perf_counter() - start)


def device_key(device) -> str:
    """The device as the cache knows it: the GPU's name, or the CPU's name and its cores."""
    if device.type == "cuda":
        return describe_device(device)
    return f"cpu ({_cpu_name()}, {os.cpu_count()} cores)"


def _cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown CPU")


def cache_path() -> Path:
    return user_cache_dir() / CACHE_FILE


def cache_key(model_cfg: Mapping[str, Any], device, batch: int, kind: str = "forward") -> str:
    """"<arch> | <precision> | <device> | batch <n>", with " | step" for a training step's rate."""
    from vlbench.models.loading import effective_precision

    return f"{model_cfg['arch']} | {effective_precision(model_cfg['precision'], device)} | {device_key(device)} | " \
           f"batch {batch}" + ("" if kind == "forward" else f" | {kind}")


def read_cache() -> dict[str, Any]:
    """The cached rates; an unreadable file counts as empty (it is rewritten at the next measurement)."""
    try:
        doc = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def model_rate(model_cfg: Mapping[str, Any], arch: Architecture, device, batch: int = BATCH,
               cap_s: float = CAP_S, cap_bytes: int = CAP_BYTES) -> Rate:
    """The image tower's images per second at `batch`: cached, measured in a capped child, or estimated from FLOPs."""
    matmul = None if _cached(model_cfg, device, batch, "forward") else matmul_flops(device, model_cfg["precision"])
    return _rate(model_cfg, device, batch, "forward", cap_s, cap_bytes, matmul and {
        "value": matmul / arch.flops, "seconds": arch.flops * (8 + batch) / matmul,
        "bytes": arch.parameter_bytes + batch * arch.activation_bytes,
        "how": f"model {matmul / arch.flops:.3g} img/s estimated from its {arch.flops / 1e9:.3g} GFLOP per image at "
               f"this device's matrix-product rate of {matmul / 1e9:.3g} GFLOP/s (an upper bound on its speed)"})


def step_seconds(model_cfg: Mapping[str, Any], arch: Architecture, device, batch: int, cap_s: float = CAP_S,
                 cap_bytes: int = CAP_BYTES) -> Rate:
    """Seconds per training step of the image tower at `batch` (forward + backward, 3x the forward's FLOPs; Adam):
    cached, measured in a capped child (two steps), or estimated from FLOPs (weights, gradients and Adam's two
    moments, and every tensor of the forward kept for backward, count against the memory cap)."""
    matmul = None if _cached(model_cfg, device, batch, "step") else matmul_flops(device, model_cfg["precision"])
    step = 3 * arch.flops * batch
    return _rate(model_cfg, device, batch, "step", cap_s, cap_bytes, matmul and {
        "value": step / matmul, "seconds": 2 * step / matmul,
        "bytes": 4 * arch.parameter_bytes + batch * arch.forward_bytes,
        "how": f"{step / matmul:.3g} s/step at batch {batch} estimated from 3 x {arch.flops / 1e9:.3g} GFLOP per image "
               f"at this device's matrix-product rate of {matmul / 1e9:.3g} GFLOP/s (a lower bound)"})


def _cached(model_cfg: Mapping[str, Any], device, batch: int, kind: str) -> dict[str, Any] | None:
    entry = read_cache().get(cache_key(model_cfg, device, batch, kind))
    return entry if isinstance(entry, dict) and isinstance(entry.get("value"), (int, float)) else None


def _rate(model_cfg: Mapping[str, Any], device, batch: int, kind: str, cap_s: float, cap_bytes: int,
          bound: dict[str, Any] | None) -> Rate:
    """The cached value, else the measured one when `bound` (the FLOPs estimate and what measuring would cost) fits
    the caps and the child finishes, else the FLOPs estimate with the reason."""
    unit = "img/s" if kind == "forward" else f"s/step at batch {batch}"
    cached = _cached(model_cfg, device, batch, kind)
    if cached:
        return Rate(float(cached["value"]), CACHED, f"{'model ' if kind == 'forward' else ''}{cached['value']:.3g} "
                                                    f"{unit} measured on {cached.get('measured', '?')} (cached in "
                                                    f"{cache_path()})")
    cap_bytes = memory_cap(device, cap_bytes)
    if bound["seconds"] > cap_s or bound["bytes"] > cap_bytes:
        return Rate(bound["value"], FLOPS, f"{bound['how']}; measuring would take ~{bound['seconds']:.3g} s and "
                                           f"~{_gib(bound['bytes'])}, over the warm-up's cap of {cap_s:g} s and "
                                           f"{_gib(cap_bytes)}")
    try:
        value = measure_in_child(model_cfg, device, batch, kind, cap_s, cap_bytes)
    except WarmupFailed as err:
        return Rate(bound["value"], FLOPS, f"{bound['how']}; {err}")
    how = f"model {value:.3g} img/s measured on random input in batches of {batch}" if kind == "forward" else \
        f"{value:.3g} s/step at batch {batch} measured (Adam, forward + backward on random input)"
    try:
        write_json(cache_path(), {**read_cache(), cache_key(model_cfg, device, batch, kind): {
            "value": value, "measured": time.strftime("%Y-%m-%d")}})
    except (OSError, WriteError) as err:  # a cache that cannot be written costs the next plan a measurement only
        how += f" (not cached: {err})"
    return Rate(value, MEASURED, how)


def memory_cap(device, cap_bytes: int) -> int:
    """`cap_bytes` of host memory on a CPU; on a GPU, where the model's tensors live, its free memory (the child's
    host memory is then not limited: it holds the model's build only, and CUDA's start-up maps large regions)."""
    import torch

    return cap_bytes if device.type != "cuda" else torch.cuda.mem_get_info(device)[0]


ALLOCATION_FAILED = ("allocate memory", "MemoryError", "could not create a primitive")


def _gib(n: float) -> str:
    return f"{n / 2 ** 30:.3g} GiB"


class WarmupFailed(Exception):
    """The child did not give a rate; the message says why (the plan then estimates from FLOPs)."""


def measure_in_child(model_cfg: Mapping[str, Any], device, batch: int, kind: str, cap_s: float,
                     cap_bytes: int) -> float:
    """`measure` (kind forward) or `measure_step` (kind step) in a child process,
    killed after `cap_s`, its memory beyond its imports limited to `cap_bytes`."""
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    args = json.dumps({"model": dict(model_cfg), "device": str(device), "batch": batch, "kind": kind,
                       "cap_bytes": cap_bytes})
    try:
        proc = subprocess.run([sys.executable, "-m", "vlbench.models.rates", args], capture_output=True, text=True,
                              timeout=cap_s, env=env)
    except subprocess.TimeoutExpired:
        raise WarmupFailed(f"the warm-up did not finish within its cap of {cap_s:g} s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        # an allocation refused under RLIMIT_DATA surfaces as Python's MemoryError, an allocator's message, or oneDNN's
        # "could not create a primitive" (its scratchpad allocation failed)
        memory = cap_bytes is not None and any(sign in last for sign in ALLOCATION_FAILED)
        raise WarmupFailed(f"the warm-up ran out of its memory cap of {_gib(cap_bytes)} ({last})" if memory
                           else f"the warm-up failed ({last})")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["value"])


def measure(model, precision: str, device, batch: int = BATCH, batches: int = BATCHES,
            budget_s: float = BUDGET_S) -> float:
    """Images per second of the image tower on random input at its resolution, with the stage's autocast and batch
    size: after one untimed small batch (allocations, kernel set-up), `batches` full batches, or fewer once
    `budget_s` has passed (at least one). Per-call overheads matter: on a loaded CPU a call of 8 images took as long
    as one of 256 (docs/benchmarks.md), so a smaller batch than the stage's would mis-measure it."""
    import torch

    from vlbench.models.loading import autocast_dtype

    height, width = _size(model)
    x = torch.randn(batch, 3, height, width, device=device)
    dtype = autocast_dtype(precision, device)
    done = 0
    with torch.inference_mode(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        model.encode_image(x[:8])
        sync(device)
        start = time.perf_counter()
        while done < batch * batches and (done == 0 or time.perf_counter() - start < budget_s):
            model.encode_image(x)
            done += batch
        sync(device)
    return done / (time.perf_counter() - start)


def measure_step(model, precision: str, device, batch: int, budget_s: float = STEP_BUDGET_S) -> float:
    """Seconds per optimiser step of the image tower (Adam, forward + backward of `batch` random images at the model's
    resolution, the stage's autocast), after one untimed step; up to STEP_REPEATS steps within `budget_s`."""
    import torch

    from vlbench.models.loading import autocast_dtype

    height, width = _size(model)
    x = torch.randn(batch, 3, height, width, device=device)
    optimizer = torch.optim.Adam(model.visual.parameters(), lr=1e-6)
    dtype = autocast_dtype(precision, device)

    def step() -> None:
        optimizer.zero_grad()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = model.encode_image(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()

    step()
    sync(device)
    start, done = time.perf_counter(), 0
    while done < STEP_REPEATS and (done == 0 or time.perf_counter() - start < budget_s):
        step()
        done += 1
    sync(device)
    return (time.perf_counter() - start) / done


def _data_bytes() -> int:
    """This process's data segment now (VmData): what RLIMIT_DATA counts."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmData:"))
    return int(line.split()[1]) * 1024


def main() -> None:
    """The child: build the model (imports first, then the memory cap), time it, print {"value"}."""
    import resource

    import open_clip  # noqa: F401  (imported before the cap: only the model's build and passes count against it)
    import torch

    args = json.loads(sys.argv[1])
    time_it = measure if args["kind"] == "forward" else measure_step
    device = torch.device(args["device"])
    if device.type == "cpu":
        limit = _data_bytes() + int(args["cap_bytes"])
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    model, _, precision = build_image_model(args["model"], device)
    print(json.dumps({"value": time_it(model, precision, device, int(args["batch"]))}))


if __name__ == "__main__":
    main()
