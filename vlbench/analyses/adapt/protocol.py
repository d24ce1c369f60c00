"""Shared pieces of the `adapt` analysis: what every protocol returns, and linear heads trained together.

Each protocol module (`elevater`, `vtab`, `fewtrans`) has `evaluate(inputs, cfg: Mapping, seed: int) ->
ProtocolResult`; `vlbench.analyses.adapt.run` calls the protocols that `cfg["protocols"]` names and merges
their results into one `vlbench.results.Result`.

`LinearHeads` trains K linear classifiers on the same batches in one computation (weights [K, d, C], one
einsum per step), each with its own learning rate, weight decay and initialisation: a hyper-parameter sweep
becomes one batched run instead of K runs. It is plain SGD as `torch.optim.SGD` does it (weight decay added
to the gradient, momentum buffer started at the first gradient, dampening 0, optional Nesterov), with the
gradient of the loss written out (no autograd), in float32 on the GPU when there is one. torch is imported
inside the functions that need it: importing this module does not import torch.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from vlbench import metrics
from vlbench.errors import VlbenchError

# batch x d x (K x C) below which training uses one CPU thread: on this 2-core machine, shared with other jobs, one
# thread was 5x faster on 64 x 128 x 336 (0.28 vs 1.4 ms) and 4x faster on 64 x 512 x 4200 (27 vs 109 ms a step)
SMALL_STEP = 1_000_000_000
# exp below about -87 underflows float32, and torch's exp takes 10x as long there (244 vs 21 us on 64 x 420): the
# softmax clamps its shifted logits at this floor (a probability of 1.6e-38 instead of 0 or a denormal)
EXP_FLOOR = -87.0
LOSSES = ("softmax", "sigmoid")  # cross-entropy over classes (single-label) | binary cross-entropy per class (multi-label)


class AdaptError(VlbenchError):
    """Bad inputs or settings for the adapt analysis (names the dataset, protocol, key or split)."""


@dataclass
class ProtocolResult:
    """One protocol's outcome on one dataset.

    metrics: headline numbers, every key prefixed by the protocol ("elevater/full/last", "vtab/median",
        "fewtrans/base/prototype"); they go to reports/metrics.json.
    details: every setting's numbers, seeds and chosen hyper-parameters (JSON-able); stored under
        details[<protocol>] of reports/adapt/<dataset>.json.
    tables: per-row tables (e.g. "episodes"), written as reports/adapt/<dataset>.<name>.parquet.
    counts: sample counts worth reporting (optional), merged into the Result's counts with the protocol prefix.
    run: timings and other facts of this run (never in details: results are byte-identical on a rerun); they go to
        runs/adapt/<dataset>.json under the protocol's name.
    intervals: 95% intervals of metrics (over seeds or episodes), keyed like `metrics`; the result's `intervals`.
    """

    metrics: dict[str, float]
    details: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, pa.Table] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    intervals: dict[str, dict[str, Any]] = field(default_factory=dict)  # metric key -> vlbench.stats.Interval.to_json()


# --------------------------------------------------------------------------------------------------
# devices and seeds


def device(prefer: str | None = None):
    """The torch device heads train on: `prefer` if given, else CUDA when available, else the CPU (a runtime
    choice, never a param: results agree to float32 rounding)."""
    import torch

    if prefer:
        return torch.device(prefer)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@contextmanager
def cpu_threads(on, work: int) -> Iterator[None]:
    """One torch thread on the CPU while the per-step `work` (multiply-adds) is below `SMALL_STEP` (thread hand-off
    costs more than the products at these sizes)."""
    import torch

    if on.type != "cpu" or work >= SMALL_STEP:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def map_runs(fn: Callable[..., Any], shared: tuple, tasks: Sequence[tuple], on, work: int,
             costs: Sequence[float] | None = None, workers: int | None = None) -> list[Any]:
    """[fn(*shared, *task) for task in tasks], in task order, under `cpu_threads(on, work)`.

    Where that is one torch thread (the CPU, steps below `SMALL_STEP`) and there are several cores, the tasks run in a
    process per core (spawned: `shared` is sent to each once), each with one torch thread as here: the same
    operations in the same order, so the numbers are the same bit for bit whatever the number of cores. They start
    in the order of their `costs`, largest first, so that no core is left with a long task at the end. A run of
    ELEVATER's small searches then uses every core instead of one (docs/benchmarks.md, "First run"). `workers`:
    at most this many processes (default: one per core this process may use)."""
    workers = min(len(tasks), workers or len(os.sched_getaffinity(0)))
    if on.type != "cpu" or work >= SMALL_STEP or workers < 2:
        with cpu_threads(on, work):
            return [fn(*shared, *task) for task in tasks]
    order = np.argsort(-np.asarray(costs, dtype=float), kind="stable") if costs is not None else np.arange(len(tasks))
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker,
                             initargs=(shared,)) as executor:
        done = list(executor.map(partial(_run_task, fn), [tasks[i] for i in order]))
    results: list[Any] = [None] * len(tasks)
    for i, result in zip(order, done):
        results[i] = result
    return results


_SHARED: tuple = ()  # in a map_runs worker: the arguments every task shares


def _start_worker(shared: tuple) -> None:
    import torch

    global _SHARED
    torch.set_num_threads(1)
    _SHARED = shared


def _run_task(fn: Callable[..., Any], task: tuple) -> Any:
    return fn(*_SHARED, *task)


def pytorch_linear_init(dim: int, num_classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(weight [d, C], bias [C]) exactly as `torch.manual_seed(seed); torch.nn.Linear(dim, num_classes)` makes
    them (Kaiming-uniform weight with a = sqrt(5), i.e. U(-1/sqrt(d), 1/sqrt(d)), then the bias from the same
    bound), without touching torch's global random state."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        layer = torch.nn.Linear(dim, num_classes)
    return layer.weight.detach().numpy().T.copy(), layer.bias.detach().numpy().copy()


# --------------------------------------------------------------------------------------------------
# K linear heads trained together


class LinearHeads:
    """K linear heads `logit_scale * (x @ W_k + b_k)` trained by SGD on shared batches.

    weight [K, d, C], bias [K, C], lr [K], weight_decay [K] (coupled L2 on weight and bias, as torch's SGD
    with one parameter group). `loss`: "softmax" (mean cross-entropy; labels are class indices) or "sigmoid"
    (mean binary cross-entropy over batch x classes, `BCEWithLogitsLoss`; labels are 0/1 [n, C]).
    The weights are held as one [d, K * C] matrix, so a step is two matrix products for all heads together.
    """

    def __init__(self, weight, bias, lr, weight_decay, *, momentum: float = 0.9, nesterov: bool = False,
                 loss: str = "softmax", logit_scale: float = 1.0, on=None):
        import torch

        if loss not in LOSSES:
            raise AdaptError(f"unknown loss {loss!r}; known: {', '.join(LOSSES)}")
        self.device = on or device()
        weight, bias = np.asarray(weight, dtype=np.float32), np.asarray(bias, dtype=np.float32)
        if weight.ndim != 3 or bias.shape != (weight.shape[0], weight.shape[2]):
            raise AdaptError(f"heads need weight [K, d, C] and bias [K, C], got {weight.shape} and {bias.shape}")
        self.k, self.d, self.c = weight.shape
        on = self.device  # torch.tensor copies: the caller's initial weights stay intact
        self.w = torch.tensor(weight.transpose(1, 0, 2).reshape(self.d, self.k * self.c), device=on)  # [d, K*C]
        self.b = torch.tensor(bias.reshape(-1), device=on)  # [K*C]
        self.lr_col = torch.tensor(np.repeat(np.asarray(lr, dtype=np.float32).reshape(self.k), self.c), device=on)
        self.wd_col = torch.tensor(np.repeat(np.asarray(weight_decay, dtype=np.float32).reshape(self.k), self.c),
                                   device=on)
        self.momentum, self.nesterov, self.loss, self.scale = float(momentum), bool(nesterov), loss, float(logit_scale)
        self._buf_w = self._buf_b = None

    @property
    def num_heads(self) -> int:
        return self.k

    @property
    def weight(self):
        """[K, d, C] (a view)."""
        return self.w.view(self.d, self.k, self.c).permute(1, 0, 2)

    @property
    def bias(self):
        """[K, C] (a view)."""
        return self.b.view(self.k, self.c)

    def _flat_logits(self, x):
        import torch

        z = torch.addmm(self.b, x, self.w)  # [n, K*C]
        return z.mul_(self.scale) if self.scale != 1.0 else z

    def logits(self, x):
        """[K, n, C] logits of features x [n, d] (a torch tensor on this device)."""
        return self._flat_logits(x).view(x.shape[0], self.k, self.c).permute(1, 0, 2)

    def _loss_grad(self, z, y):
        """d(loss summed over the batch)/d(logits) [B, K, C] of logits z [B, K, C] (overwritten) for labels y ([B]
        class indices or [B, C] 0/1); the caller divides by the batch (softmax) or batch x classes (sigmoid)."""
        import torch

        if self.loss == "softmax":  # written out: torch.softmax over a last dim of ~10 took 2 ms here, this 0.35 ms
            g = z.sub_(z.amax(dim=2, keepdim=True)).clamp_(min=EXP_FLOOR).exp_()
            g /= g.sum(dim=2, keepdim=True)
            g[torch.arange(z.shape[0], device=z.device), :, y] -= 1.0
            return g
        return torch.sigmoid_(z).sub_(y[:, None, :])

    def sgd_step(self, x, y) -> None:
        """One SGD step on the batch x [B, d] (shared by every head) with labels y: torch.optim.SGD's update, with the
        gradient's product accumulated straight into the momentum buffer (buf = momentum * buf + x^T g / B)."""
        import torch

        n = x.shape[0]
        g = self._loss_grad(self._flat_logits(x).view(n, self.k, self.c), y).view(n, self.k * self.c)
        mean = self.scale / (n if self.loss == "softmax" else n * self.c)
        if self.momentum and not self.nesterov:
            if self._buf_w is None:  # torch's first step: buf = grad
                self._buf_w, self._buf_b = torch.zeros_like(self.w), torch.zeros_like(self.b)
            self._buf_w.addmm_(x.T, g, beta=self.momentum, alpha=mean).addcmul_(self.wd_col, self.w)
            self._buf_b.mul_(self.momentum).add_(g.sum(dim=0), alpha=mean).addcmul_(self.wd_col, self.b)
            self.w.addcmul_(self.lr_col, self._buf_w, value=-1.0)
            self.b.addcmul_(self.lr_col, self._buf_b, value=-1.0)
            return
        grad_w = (x.T @ g).mul_(mean).addcmul_(self.wd_col, self.w)
        grad_b = g.sum(dim=0).mul_(mean).addcmul_(self.wd_col, self.b)
        if self.momentum:  # Nesterov: grad + momentum * buf
            if self._buf_w is None:
                self._buf_w, self._buf_b = grad_w.clone(), grad_b.clone()
            else:
                self._buf_w.mul_(self.momentum).add_(grad_w)
                self._buf_b.mul_(self.momentum).add_(grad_b)
            grad_w, grad_b = grad_w.add_(self._buf_w, alpha=self.momentum), grad_b.add_(self._buf_b, alpha=self.momentum)
        self.w.addcmul_(self.lr_col, grad_w, value=-1.0)
        self.b.addcmul_(self.lr_col, grad_b, value=-1.0)

    def diverged(self):
        """[K] bool: heads with a NaN weight or bias. NaN is absorbing: every later logit of such a head is NaN (its
        softmax rows too), so it can only score 0 from here on (`score_heads`)."""
        import torch

        w = torch.isnan(self.w).view(self.d, self.k, self.c).any(dim=2).any(dim=0)
        return (w | torch.isnan(self.b).view(self.k, self.c).any(dim=1)).cpu().numpy()

    def keep(self, mask) -> None:
        """Drop the heads where `mask` [K] is False (their weights, buffers, rates): fewer products per step."""
        import torch

        idx = torch.as_tensor(np.flatnonzero(mask), device=self.w.device)
        cols = (idx[:, None] * self.c + torch.arange(self.c, device=self.w.device)).reshape(-1)
        self.w, self.b = self.w[:, cols].contiguous(), self.b[cols].contiguous()
        self.lr_col, self.wd_col = self.lr_col[cols], self.wd_col[cols]
        if self._buf_w is not None:
            self._buf_w, self._buf_b = self._buf_w[:, cols].contiguous(), self._buf_b[cols].contiguous()
        self.k = int(idx.numel())


# --------------------------------------------------------------------------------------------------
# scoring K heads at once


def softmax_np(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax in float32 with the maximum subtracted first (what torch does)."""
    x = np.asarray(logits, dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # a diverged head's rows become NaN; score_heads gives it 0
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)


def score_heads(scores: np.ndarray, labels: np.ndarray, metric: str, convention: str = "default") -> np.ndarray:
    """The dataset metric of each head: scores [K, n, C] (higher = more likely), labels [n] or [n, C] -> [K].

    A head whose scores are not all finite (it diverged) scores 0. `accuracy` and `mean_per_class` are
    computed for all heads at once (ties to the lower class index, as `vlbench.metrics`); other metrics go
    through `vlbench.metrics.compute` head by head."""
    scores = np.asarray(scores)
    finite = np.isfinite(scores).all(axis=(1, 2))
    out = np.zeros(scores.shape[0])
    if metric in ("accuracy", "mean_per_class"):
        hit = np.where(finite[:, None], scores.argmax(axis=2) == labels[None], False)
        if metric == "accuracy":
            out = hit.mean(axis=1)
        else:
            present = np.unique(labels)
            per_class = np.stack([hit[:, labels == c].mean(axis=1) for c in present], axis=1)
            out = per_class.mean(axis=1)
        return np.where(finite, out, 0.0)
    for k in np.flatnonzero(finite):
        out[k] = metrics.compute(metric, scores[k], labels, convention)
    return out


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """(mean, sample standard deviation, ddof=1; 0 for a single value)."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0
