"""ELEVATER linear probing on cached image features (Li et al., NeurIPS 2022 D&B; docs/protocols.md "Adapt: ELEVATER
linear probing"), following the toolkit's code (Elevater_Toolkit_IC @ 00d0af7: `evaluation/full_model_finetune.py`,
`evaluation/feature.py`, `commands/linear_probe.py`, `config/default.py`, `resources/model/*.yaml`) and the few-shot
sampler of vision-datasets 0.2.17 (`DatasetManifest.sample_few_shot_subset`), the version the toolkit pins.

Per dataset, head (Random-2P, Language-2P, Language-1P), shot count (5, 20, 50, full) and sampling seed (0, 1, 2):
1. sample the few-shot training set (per class, the dataset's manifest order shuffled by `random.Random(seed)`);
   a 1-shot request samples 2 and then trains the final head on the train part only, as the toolkit does;
2. carve validation: per class the first ceil(20%) of the few-shot set (greedy cover for multi-label);
3. search: 6 learning rates 1e-6 .. 1e-1; for each, weight decay over `logspace(-6, 6, 97)`: the 7 decades
   10^-6, 10^-4, ..., 10^6, then the neighbours of the running best at 8, 4, 2, 1 grid steps; every run is
   10 epochs of SGD (momentum 0.9, no Nesterov, batch 64, constant rate) scored by its best validation metric
   over the epochs; best weight decay per learning rate, then the best learning rate (strict improvements);
4. final: 50 epochs with the chosen pair on train + validation; the test metric of the last epoch (default)
   or, as the toolkit reports, its best epoch on test (`report: best_on_test`, which selects on test).
The head is `logit_scale * Linear(BatchNorm1d(x, affine=False))` on the projected image embedding, FP32; Language-1P's
on the image tower's features before its projection, which it merges into its initial weight (`language_1p_init`).
Every (head, learning rate, weight decay) of a search round trains as one batched computation (`LinearHeads`).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa

from vlbench.analyses.adapt.protocol import (
    AdaptError,
    LinearHeads,
    ProtocolResult,
    map_runs,
    mean_std,
    pytorch_linear_init,
    score_heads,
    softmax_np,
)
from vlbench.analyses.adapt.protocol import device as pick_device
from vlbench.analyses.zeroshot import label_matrix
from vlbench.analyses.zeroshot_classifier import knowledge_variant, template_weights
from vlbench.params import defaults
from vlbench.features import (
    PRE_PROJECTION,
    PROJECTION,
    Projection,
    pre_projection_path,
    projection_path,
    read_features,
    read_projection,
)
from vlbench.knowledge.variants import VARIANTS as KNOWLEDGE_VARIANTS
from vlbench.stats import SAMPLE_METRICS, bootstrap_sample_metric, seeds_interval

HEADS = ("random_2p", "language_2p", "language_1p")
PRE_PROJECTION_HEADS = ("language_1p",)  # trained on the pre-projection features (embed.pre_projection), as its own search
REPORTS = ("last", "best_on_test")
# the toolkit's LOGIT_SCALE_INIT (Classifier.__init__ in full_model_finetune.py); the head's factor is exp of it, fixed
# (TRAINABLE_LOGIT_SCALE false): none -> exp(0) = 1, clip -> 1/0.07, ln_cls -> log(C), pretrained -> the model's scale
LOGIT_SCALES = ("none", "clip", "ln_cls", "pretrained")
SHUFFLE_SEED = 0  # the toolkit's create_dataloader seeds every training loader's generator with 0
BN_EPS, BN_MOMENTUM = 1e-5, 0.1  # torch.nn.BatchNorm1d defaults
CACHE_BYTES = 256 << 20  # a search keeps its normalised batches when they take at most this much
LANGUAGE_1P_NOTE = ("on the pre-projection image features (embed.pre_projection), batch norm over them, weight = "
                    "projection x class text embeddings (the toolkit's MERGE_ENCODER_AND_HEAD_PROJ), its own search")
PE_NOTE = ("the paper's App. D.2, Eq. 1: score * exp(log10(M / M0 + 1)), M the head's trainable parameters, M0 the "
           "normalisation constant (the paper's 1e8)")
LANGUAGE_HEADS = ("language_2p", "language_1p")  # initialised from class text embeddings
KNOWLEDGE_HEADS = ("language_2p",)  # App. H adapts the paper's default head ("two-projection ... as the default", Sec. 5.1)
KNOWLEDGE_SUFFIX = "_knowledge"  # <head>_knowledge: the head whose initialisation won on validation (paper App. H)
WD_REFINEMENTS = ("index", "left")  # the toolkit's WD_SEARCH_LEFT false (since 517fb02, 2022-09-23) | true (first release)


# --------------------------------------------------------------------------------------------------
# settings


_DEFAULTS = defaults("adapt.elevater")  # conf/settings/adapt.yaml


@dataclass(frozen=True)
class Settings:
    """The `adapt.elevater` params, checked; each default is conf/settings/adapt.yaml's."""

    train_split: str = _DEFAULTS["train_split"]
    test_split: str = _DEFAULTS["test_split"]
    shots: tuple = tuple(_DEFAULTS["shots"])
    seeds: tuple = tuple(_DEFAULTS["seeds"])
    heads: tuple = tuple(_DEFAULTS["heads"])
    val_fraction: float = _DEFAULTS["val_fraction"]
    batch_size: int = _DEFAULTS["batch_size"]
    search_epochs: int = _DEFAULTS["search_epochs"]
    final_epochs: int = _DEFAULTS["final_epochs"]
    lr_log_range: tuple = (_DEFAULTS["lr_grid"]["log_lower"], _DEFAULTS["lr_grid"]["log_upper"])
    lr_num: int = _DEFAULTS["lr_grid"]["num"]
    wd_log_range: tuple = (_DEFAULTS["wd_grid"]["log_lower"], _DEFAULTS["wd_grid"]["log_upper"])
    momentum: float = _DEFAULTS["momentum"]
    nesterov: bool = _DEFAULTS["nesterov"]
    logit_scale: str = _DEFAULTS["logit_scale"]
    report: str = _DEFAULTS["report"]
    search_subset: Mapping[str, int] = field(default_factory=lambda: dict(_DEFAULTS["search_subset"]))
    wd_refinement: str = _DEFAULTS["wd_refinement"]
    knowledge: tuple = tuple(_DEFAULTS["knowledge"])
    pe_m0: float = float(_DEFAULTS["parameter_efficiency"]["m0"])

    @classmethod
    def from_cfg(cls, cfg: Mapping[str, Any]) -> Settings:
        cfg = dict(cfg or {})
        pe = dict(cfg.pop("parameter_efficiency", None) or {})
        lr, wd = dict(cfg.pop("lr_grid", None) or {}), dict(cfg.pop("wd_grid", None) or {})
        nested = {"lr_grid": (lr, {"log_lower", "log_upper", "num"}), "wd_grid": (wd, {"log_lower", "log_upper"}),
                  "parameter_efficiency": (pe, {"m0"})}
        unknown = sorted(set(cfg) - set(cls.__dataclass_fields__))
        unknown += [f"{name}.{k}" for name, (given, known) in nested.items() for k in sorted(set(given) - known)]
        if unknown:
            raise AdaptError(f"params.yaml: unknown key(s) adapt.elevater.{', adapt.elevater.'.join(unknown)}")
        lr, wd = {**_DEFAULTS["lr_grid"], **lr}, {**_DEFAULTS["wd_grid"], **wd}
        extra = {"lr_log_range": (lr["log_lower"], lr["log_upper"]), "lr_num": lr["num"],
                 "wd_log_range": (wd["log_lower"], wd["log_upper"]),
                 "pe_m0": float(pe.get("m0", _DEFAULTS["parameter_efficiency"]["m0"]))}
        tuples = {k: tuple(cfg[k] or ()) for k in ("shots", "seeds", "heads", "knowledge") if k in cfg}
        settings = cls(**{**cfg, **tuples, **extra})
        settings.check()
        return settings

    def check(self) -> None:
        bad = [h for h in self.heads if h not in HEADS]
        if bad or len(set(self.heads)) < len(self.heads):
            raise AdaptError(f"params.yaml: adapt.elevater.heads {list(self.heads)}: each must be one of {list(HEADS)}, "
                             f"once (language_1p needs the pre-projection image features of embed.pre_projection: true)")
        unknown = [v for v in self.knowledge if v not in KNOWLEDGE_VARIANTS]
        if unknown:
            raise AdaptError(f"params.yaml: adapt.elevater.knowledge {unknown}: unknown knowledge variant(s); known: "
                             f"{', '.join(KNOWLEDGE_VARIANTS)}")
        for s in self.shots:
            if not (s == "full" or (isinstance(s, int) and s >= 1)):
                raise AdaptError(f"params.yaml: adapt.elevater.shots entry {s!r} is neither a positive int nor 'full'")
        checks = {"report": (self.report in REPORTS, f"one of {list(REPORTS)}"),
                  "logit_scale": (self.logit_scale in LOGIT_SCALES, f"one of {list(LOGIT_SCALES)}"),
                  "wd_refinement": (self.wd_refinement in WD_REFINEMENTS, f"one of {list(WD_REFINEMENTS)}"),
                  "pe_m0": (self.pe_m0 > 0, "> 0 (parameter_efficiency.m0)"),
                  "val_fraction": (0 < self.val_fraction < 1, "in (0, 1)"),
                  "batch_size": (self.batch_size >= 2, ">= 2"),
                  "search_epochs": (self.search_epochs >= 1, ">= 1"),
                  "final_epochs": (self.final_epochs >= 1, ">= 1"),
                  "seeds": (len(self.seeds) >= 1, "non-empty"), "heads": (len(self.heads) >= 1, "non-empty")}
        for key, (ok, want) in checks.items():
            if not ok:
                raise AdaptError(f"params.yaml: adapt.elevater.{key} {getattr(self, key)!r} must be {want}")

    def learning_rates(self) -> list[float]:
        return np.logspace(*self.lr_log_range, num=self.lr_num).tolist()

    def weight_decays(self) -> list[float]:
        return np.logspace(*self.wd_log_range, num=97).tolist()


# --------------------------------------------------------------------------------------------------
# sampling and validation


def toolkit_shots(shots) -> tuple[int | None, bool]:
    """(images per class to sample or None for the whole pool, merge validation into the final run).
    A 1-shot request samples 2 per class and trains the final head without the validation image
    (`commands/linear_probe.py` sets NUM_SAMPLES_PER_CLASS 2 and MERGE_TRAIN_VAL_FINAL_RUN False)."""
    if shots == "full":
        return None, True
    return (2, False) if int(shots) == 1 else (int(shots), True)


def few_shot_subset(label_lists: Sequence[Sequence[int]], num_classes: int, n: int, seed: int) -> np.ndarray:
    """Pool positions of vision-datasets 0.2.17's `sample_few_shot_subset(n, seed)`, in the order it keeps them.

    The manifest's images are shuffled with `random.Random(seed)`; walking them, an image without labels is
    kept while fewer than n such were kept; an image whose labels all have n images already is skipped; else it
    is kept when its least-counted label has at most n/2 images or its most-counted at most 1.5 n; the walk
    stops once every class has n. Single-label: the first n of each class in the shuffled order."""
    order = list(range(len(label_lists)))
    random.Random(seed).shuffle(order)
    counts, kept, negatives = [0] * num_classes, [], 0
    for i in order:
        labels = label_lists[i]
        if len(labels) == 0:
            if negatives < n:
                negatives += 1
                kept.append(i)
            continue
        have = [counts[c] for c in labels]
        if min(have) >= n:
            continue
        if min(have) <= n / 2 or max(have) <= 1.5 * n:
            kept.append(i)
            for c in labels:
                counts[c] += 1
        if min(counts) >= n:
            break
    return np.asarray(kept, dtype=np.int64)


def validation_split(labels: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train positions, validation positions), both sorted, of a (few-shot) training set.

    Single-label (labels [n]): per class, its first ceil(fraction * n_c) images in the set's order (the toolkit's
    `get_dataloader`, not random), capped at n_c - 1 so that the class keeps one training image (a class with a
    single image stays in train). Multi-label (labels [n, C] 0/1): the toolkit's greedy cover; see
    `multilabel_validation`."""
    labels = np.asarray(labels)
    if labels.ndim == 2:
        val = multilabel_validation(labels, fraction)
    else:
        parts = []
        for c in np.unique(labels):
            where = np.flatnonzero(labels == c)
            parts.append(where[:min(math.ceil(where.size * fraction), where.size - 1)])
        val = np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
    return np.setdiff1d(np.arange(labels.shape[0]), val), val


def multilabel_validation(targets: np.ndarray, fraction: float) -> np.ndarray:
    """The toolkit's greedy validation cover: each class wants ceil(fraction * positives) validation images
    (here capped at positives - 1, so a class keeps a training positive where its own picks decide); while a
    class still wants some, take the first remaining image that has the lowest such class and count its labels
    against every class's want."""
    targets = np.asarray(targets, dtype=np.int64).copy()
    positives = targets.sum(axis=0)
    want = np.minimum(np.ceil(positives * fraction), np.maximum(positives - 1, 0))
    picked = []
    while (want > 0).any():
        cls = int(np.flatnonzero(want > 0)[0])
        sample = int(np.flatnonzero(targets[:, cls] > 0)[0])
        picked.append(sample)
        want -= targets[sample]
        targets[sample] = 0
    return np.sort(np.asarray(picked, dtype=np.int64))


def epoch_orders(n: int, epochs: int, seed: int = SHUFFLE_SEED) -> list[np.ndarray]:
    """The sample order of each epoch of the toolkit's training loader: a `DataLoader(shuffle=True)` whose generator
    is seeded with `seed` when the loader is made (once per run), as the installed torch draws it."""
    import torch

    loader = torch.utils.data.DataLoader(range(n), batch_size=n, shuffle=True, collate_fn=np.asarray,
                                         generator=torch.Generator().manual_seed(seed))
    orders = []
    for _ in range(epochs):
        (order,) = list(loader)  # one batch of n; exhausting the loader draws what a whole epoch draws
        orders.append(order)
    return orders


# --------------------------------------------------------------------------------------------------
# training K heads with the toolkit's batch norm


@dataclass
class Problem:
    """Features and labels of one training run: fit on (x_fit, y_fit), score every epoch on (x_eval, y_eval)."""

    x_fit: np.ndarray
    y_fit: np.ndarray  # [n] class indices, or [n, C] 0/1 for multi-label
    x_eval: np.ndarray
    y_eval: np.ndarray
    metric: str
    multi_label: bool


class ChannelBatchNorm:
    """`torch.nn.BatchNorm1d(d, affine=False)`: batch statistics (biased variance) while training, which also update
    running statistics (momentum 0.1, unbiased variance); running statistics when evaluating. The features are
    frozen and every head sees the same batches, so one instance serves all heads."""

    def __init__(self, dim: int, on):
        import torch

        self.mean = torch.zeros(dim, device=on)
        self.var = torch.ones(dim, device=on)

    def train(self, x):
        import torch

        mean = x.mean(dim=0)
        centred = x - mean
        var = (centred * centred).mean(dim=0)  # biased; torch's x.var(dim=0) took 0.9 ms on 64 x 512 here, this 0.05
        unbiased = var * (x.shape[0] / (x.shape[0] - 1))
        self.mean.mul_(1 - BN_MOMENTUM).add_(BN_MOMENTUM * mean)
        self.var.mul_(1 - BN_MOMENTUM).add_(BN_MOMENTUM * unbiased)
        return centred / torch.sqrt(var + BN_EPS)

    def eval(self, x):
        import torch

        return (x - self.mean) / torch.sqrt(self.var + BN_EPS)


class BatchPlan:
    """The normalised training batches of every epoch and the normalised evaluation features after each epoch, for one
    `Problem`: the same for every run on it (each run's loader generator is seeded alike and the batch statistics
    depend on the data only), so a search computes them once when they fit in `CACHE_BYTES`, else per run."""

    def __init__(self, problem: Problem, epochs: int, batch_size: int, on):
        import torch

        self.epochs, self.batch_size, self.on = epochs, batch_size, on
        self.x_fit = torch.as_tensor(problem.x_fit, dtype=torch.float32, device=on)
        self.y_fit = torch.as_tensor(problem.y_fit, dtype=torch.float32 if problem.multi_label else torch.long,
                                     device=on)
        self.x_eval = torch.as_tensor(problem.x_eval, dtype=torch.float32, device=on)
        size = 4 * epochs * (self.x_fit.numel() + self.x_eval.numel())
        self._cached = list(self._generate()) if size <= CACHE_BYTES else None

    def _generate(self):
        bn = ChannelBatchNorm(self.x_fit.shape[1], self.on)
        for order in epoch_orders(self.x_fit.shape[0], self.epochs):
            order = self._as_index(order)
            batches = [order[i:i + self.batch_size] for i in range(0, order.numel(), self.batch_size)]
            steps = [(bn.train(self.x_fit[b]), self.y_fit[b]) for b in batches if b.numel() > 1]
            yield steps, bn.eval(self.x_eval)

    def _as_index(self, order):
        import torch

        return torch.as_tensor(order, device=self.on)

    def __iter__(self):
        return iter(self._cached) if self._cached is not None else self._generate()


def train_epochs(problem: Problem, heads: LinearHeads, epochs: int, batch_size: int,
                 plan: BatchPlan | None = None, predicted: np.ndarray | None = None) -> np.ndarray:
    """Train `heads` for `epochs` epochs as the toolkit's `train_task` does and return the metric of every head after
    every epoch, [K, epochs], on softmax probabilities (a diverged head scores 0). A last batch of one image is
    skipped, as the toolkit skips it. Heads that diverged to NaN are dropped from `heads` after the epoch in which
    they did (`LinearHeads.keep`): they score 0 in every later epoch, as they would have if trained on.
    `predicted` [K, epochs, n_eval] (single-label), where given, receives every head's argmax on the evaluation split
    after every epoch (ties to the lower class index, as the metric); a diverged head's entries are left as they
    were."""
    import torch

    plan = plan or BatchPlan(problem, epochs, batch_size, heads.device)
    scores = np.zeros((heads.num_heads, epochs))
    alive = np.arange(heads.num_heads)
    for epoch, (steps, x_eval) in enumerate(plan):
        for xb, yb in steps:
            heads.sgd_step(xb, yb)
        with torch.no_grad():
            probs = softmax_np(heads.logits(x_eval).cpu().numpy(), axis=2)
        scores[alive, epoch] = score_heads(probs, problem.y_eval, problem.metric, "elevater")
        if predicted is not None:
            predicted[alive, epoch] = probs.argmax(axis=2)
        nan = heads.diverged()
        if nan.any():
            heads.keep(~nan)
            alive = alive[~nan]
        if not alive.size:
            break
    return scores


# --------------------------------------------------------------------------------------------------
# the toolkit's search


@dataclass
class SearchOutcome:
    """Per line (head, learning-rate index): the chosen weight-decay index and its score; every evaluation made."""

    peaks: dict[Hashable, tuple[int, float]]
    trace: list[dict[str, Any]]  # one entry per (line, candidate index): its round, the index trained, its score
    toolkit_runs: int  # runs the toolkit would train (it retrains a neighbour clamped onto an evaluated index)
    runs: int  # runs trained here


def weight_decay_search(evaluate: Callable[[list[tuple[Hashable, int]]], Sequence[float]], lines: Sequence[Hashable],
                        n_grid: int = 97, coarse: int = 7, refinement: str = "index") -> SearchOutcome:
    """`hyperparameter_sweep` of the toolkit for several lines at once, one `evaluate` call per round.

    Round 0 evaluates the coarse indices (0, 16, ..., 96) of every line; rounds at spans 8, 4, 2, 1 evaluate
    max(peak - span, 0) and min(peak + span, n - 1) of each line unless equal to its peak. A line's peak starts at
    (-1, 0.0) and moves only on a strictly higher score, in evaluation order (so an all-zero line ends at index
    -1, the largest weight decay, as in the toolkit). Scores are deterministic here, so an index evaluated
    before is looked up, not retrained. `refinement="left"` is the toolkit's first release (`WD_SEARCH_LEFT`): both
    neighbours of a round are trained with the left one's weight decay, the score credited to each candidate."""
    step = (n_grid - 1) // (coarse - 1)
    peaks = {line: (-1, 0.0) for line in lines}
    cache: dict[tuple[Hashable, int], float] = {}
    trace: list[dict[str, Any]] = []
    rounds = [{line: [(i, i) for i in range(0, n_grid, step)] for line in lines}]
    span, toolkit_runs = step // 2, 0
    while True:
        wanted = rounds[-1]  # per line: (candidate index, index trained)
        todo = list(dict.fromkeys((line, t) for line in lines for _, t in wanted[line] if (line, t) not in cache))
        for (line, t), score in zip(todo, evaluate(todo) if todo else []):
            cache[line, t] = float(score)
        for line in lines:
            toolkit_runs += len(wanted[line])
            for i, t in wanted[line]:
                trace.append({"line": line, "index": i, "trained": t, "score": cache[line, t], "round": len(rounds) - 1})
                if cache[line, t] > peaks[line][1]:
                    peaks[line] = (i, cache[line, t])
        if span == 0:
            return SearchOutcome(peaks, _unique_candidates(trace), toolkit_runs, len(cache))
        rounds.append({line: _neighbours(peaks[line][0], span, n_grid, refinement) for line in lines})
        span //= 2


def _neighbours(peak: int, span: int, n: int, refinement: str = "index") -> list[tuple[int, int]]:
    left, right = max(peak - span, 0), min(peak + span, n - 1)
    return [(i, left if refinement == "left" else i) for i in (left, right) if i != peak]


def _unique_candidates(trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trace without repeats of a (line, candidate) pair (a candidate met again was looked up)."""
    seen, out = set(), []
    for t in trace:
        if (t["line"], t["index"]) not in seen:
            seen.add((t["line"], t["index"]))
            out.append(t)
    return out


def select_learning_rate(scores: Sequence[float]) -> int | None:
    """`hyperparameter_sweep_lr`: the first learning rate whose best score strictly beats every earlier one, starting
    from 0; None when every score is 0 (the toolkit then trains with learning rate 0 and weight decay 0)."""
    best, chosen = 0.0, None
    for i, s in enumerate(scores):
        if best < s:
            best, chosen = s, i
    return chosen


# --------------------------------------------------------------------------------------------------
# one (shots, seed) setting


@dataclass
class HeadInit:
    """Initial weight [d, C] and bias [C] of each head, and the fixed logit-scale factor in front of them all."""

    weights: dict[str, tuple[np.ndarray, np.ndarray]]
    logit_scale: float = 1.0

    def stack(self, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        return np.stack([self.weights[n][0] for n in names]), np.stack([self.weights[n][1] for n in names])


def make_heads(init: HeadInit, names: Sequence[str], lrs, wds, s: Settings, multi_label: bool, on) -> LinearHeads:
    w, b = init.stack(names)
    return LinearHeads(w, b, lrs, wds, momentum=s.momentum, nesterov=s.nesterov,
                       loss="sigmoid" if multi_label else "softmax", logit_scale=init.logit_scale, on=on)


def search(problem: Problem, init: HeadInit, s: Settings, on) -> tuple[dict[str, dict[str, Any]], SearchOutcome]:
    """Every head's (learning rate, weight decay) as the toolkit chooses them; one batched run per round."""
    lrs, wds = s.learning_rates(), s.weight_decays()
    plan = BatchPlan(problem, s.search_epochs, s.batch_size, on)

    def evaluate(requests):
        names = [head for (head, _), _ in requests]
        heads = make_heads(init, names, [lrs[li] for (_, li), _ in requests], [wds[i] for _, i in requests], s,
                           problem.multi_label, on)
        return train_epochs(problem, heads, s.search_epochs, s.batch_size, plan).max(axis=1)

    outcome = weight_decay_search(evaluate, [(h, li) for h in s.heads for li in range(len(lrs))],
                                  refinement=s.wd_refinement)
    chosen = {}
    for head in s.heads:
        per_lr = [outcome.peaks[head, li] for li in range(len(lrs))]
        li = select_learning_rate([score for _, score in per_lr])
        chosen[head] = {"lr": lrs[li] if li is not None else 0.0,
                        "wd": wds[per_lr[li][0]] if li is not None else 0.0,
                        "val_score": per_lr[li][1] if li is not None else 0.0,
                        "best_wd_per_lr": {f"{lrs[i]:.0e}": wds[p] for i, (p, _) in enumerate(per_lr)}}
    return chosen, outcome


@dataclass
class Pool:
    """The dataset's training pool and test split as arrays."""

    x: np.ndarray
    labels: list[list[int]]  # per sample, its label indices (one for single-label data)
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    metric: str
    multi_label: bool
    test_ids: list[str] = field(default_factory=list)

    def targets(self, rows: np.ndarray) -> np.ndarray:
        if self.multi_label:
            out = np.zeros((rows.size, self.num_classes), dtype=np.float32)
            for r, i in enumerate(rows):
                out[r, self.labels[i]] = 1.0
            return out
        return np.asarray([self.labels[i][0] for i in rows], dtype=np.int64)


RUN_ONLY = ("trace", "search_seconds", "predicted")  # kept out of the result JSON: tables, or a run fact (the time)


def run_setting(pool: Pool, init: HeadInit, s: Settings, shots, seed: int, dataset: str, on) -> dict[str, Any]:
    """Sample, search and train the final heads for one (shots, seed); every number of the run."""
    per_class, merge = toolkit_shots(shots)
    n_search = s.search_subset.get(dataset) if shots == "full" else None
    rows = _sample(pool, per_class or n_search, seed)
    train_pos, val_pos = validation_split(pool.targets(rows), s.val_fraction)
    if val_pos.size == 0:
        raise AdaptError(f"dataset {dataset!r}: no validation images can be carved from {rows.size} training "
                         f"images ({shots} shots, seed {seed}); every class has a single image")
    fit, val = rows[train_pos], rows[val_pos]
    problem = Problem(pool.x[fit], pool.targets(fit), pool.x[val], pool.targets(val), pool.metric, pool.multi_label)
    started = time.perf_counter()
    chosen, outcome = search(problem, init, s, on)
    searched = time.perf_counter() - started
    final_rows = _final_rows(pool, rows, fit, merge, n_search)
    final = final_run(pool, final_rows, init, chosen, s, on)
    predicted = {h: f.pop("predicted") for h, f in final.items() if "predicted" in f}
    return {"shots": shots, "seed": seed, "sampled": int(rows.size), "train": int(fit.size), "val": int(val.size),
            "final_train": int(final_rows.size), "search_subset": n_search, "chosen": chosen, "final": final,
            "predicted": predicted,
            "search_runs": outcome.runs, "toolkit_search_runs": outcome.toolkit_runs,
            "search_seconds": searched, "trace": outcome.trace}


def run_group(groups: list[tuple[Pool, Settings]], init: HeadInit, dataset: str, on, g: int, shots,
              seed: int) -> dict[str, Any]:
    """`run_setting` for the heads of `groups[g]` (a task of `map_runs`: the groups travel to each worker once)."""
    pool, s = groups[g]
    return run_setting(pool, init, s, shots, seed, dataset, on)


def run_cost(group: tuple[Pool, Settings], shots) -> float:
    """A run's relative cost: feature width x heads x training rows (every class's shots, or the whole pool)."""
    pool, s = group
    rows = len(pool.labels) if shots == "full" else min(len(pool.labels), int(shots) * pool.num_classes)
    return float(pool.x.shape[1] * len(s.heads) * rows)


def _sample(pool: Pool, per_class: int | None, seed: int) -> np.ndarray:
    if per_class is None:
        return np.arange(len(pool.labels))
    return few_shot_subset(pool.labels, pool.num_classes, per_class, seed)


def _final_rows(pool: Pool, rows, fit, merge: bool, n_search: int | None) -> np.ndarray:
    """Train + validation (or train alone for 1-shot); the whole pool after a subset search (PatchCamelyon)."""
    if n_search:
        return np.arange(len(pool.labels))
    return rows if merge else fit


def final_run(pool: Pool, rows: np.ndarray, init: HeadInit, chosen: dict, s: Settings, on) -> dict[str, dict]:
    """Train each head with its chosen pair for `final_epochs` on `rows`, scoring the test split every epoch."""
    problem = Problem(pool.x[rows], pool.targets(rows), pool.x_test, pool.y_test, pool.metric, pool.multi_label)
    names = list(s.heads)
    heads = make_heads(init, names, [chosen[h]["lr"] for h in names], [chosen[h]["wd"] for h in names], s,
                       pool.multi_label, on)
    predicted = None if pool.multi_label else np.full((len(names), s.final_epochs, pool.x_test.shape[0]), -1)
    scores = train_epochs(problem, heads, s.final_epochs, s.batch_size, predicted=predicted)
    final = {h: {"last": float(scores[k, -1]), "best_on_test": float(scores[k].max()),
                 "best_epoch": int(scores[k].argmax()) + 1} for k, h in enumerate(names)}
    if predicted is not None:  # the test predictions behind the reported number (RUN_ONLY: not in the result JSON)
        for k, h in enumerate(names):
            final[h]["predicted"] = predicted[k, -1 if s.report == "last" else final[h]["best_epoch"] - 1]
    return final


# --------------------------------------------------------------------------------------------------
# the protocol


def load_pool(inputs, s: Settings) -> Pool:
    """The training pool (`train_split`, in its row order: the manifest order the sampler shuffles) and the test split."""
    meta = inputs.meta
    for split in (s.train_split, s.test_split):
        if not inputs.has_split(split):
            raise AdaptError(f"dataset {meta.name!r} has no split {split!r} (adapt.elevater.train_split/test_split); "
                             f"its splits: {sorted(meta.splits)}")
    train, test = inputs.images(s.train_split), inputs.images(s.test_split)
    column = train.table.column(meta.label_column).to_pylist()
    labels = [list(v) for v in column] if meta.multi_label else [[int(v)] for v in column]
    return Pool(train.embeddings.astype(np.float32), labels, test.embeddings.astype(np.float32),
                label_matrix(test.table, meta), len(meta.classes), meta.metric, meta.multi_label,
                test.table.column("sample_id").to_pylist())


def load_pre_projection(inputs, s: Settings, pool: Pool) -> tuple[Pool, Projection]:
    """`pool` with its images as pre-projection features (the embed step's `embed.pre_projection`), and the image
    tower's projection: what Language-1P trains on. The files must come from the same embedding run as the projected
    ones (same model, preprocessing and data version, same rows)."""
    name, images = inputs.meta.name, inputs.features_dir / "images"
    paths = {split: pre_projection_path(images, split) for split in (s.train_split, s.test_split)}
    missing = [str(p) for p in [*paths.values(), projection_path(images)] if not p.is_file()]
    if missing:
        raise AdaptError(f"dataset {name!r}: adapt.elevater.heads has language_1p, which trains on pre-projection image "
                         f"features, but {missing[0]} does not exist; set embed.pre_projection: true and re-run "
                         f"embed_images@{name} (or leave language_1p out of adapt.elevater.heads)")
    expect = inputs.image_identity()
    train, test = (read_features(paths[split], {**expect, "representation": PRE_PROJECTION})
                   for split in (s.train_split, s.test_split))
    projection = read_projection(projection_path(images), {**expect, "representation": PROJECTION})
    made = {k: v for k, v in train.fingerprint.items() if k not in ("representation", "projection", "projection_dims")}
    if (train.embeddings.shape[0], test.embeddings.shape[0]) != (pool.x.shape[0], pool.x_test.shape[0]) \
            or (inputs.fingerprint and made != inputs.fingerprint) \
            or projection.weight.shape != (pool.x.shape[1], train.embeddings.shape[1]):
        raise AdaptError(f"dataset {name!r}: the pre-projection features in {paths[s.train_split].parent} do not belong "
                         f"to the projected image features beside them (rows, fingerprint or dimensions differ); "
                         f"re-run embed_images@{name}")
    return replace(pool, x=train.embeddings.astype(np.float32), x_test=test.embeddings.astype(np.float32)), projection


def head_init(inputs, pool: Pool, s: Settings, seed: int, projection: Projection | None = None,
              knowledge: Mapping[str, np.ndarray] | None = None) -> HeadInit:
    """Random-2P: PyTorch's default Linear init (seeded with the run seed, the toolkit's fix_seed); Language-2P:
    the class embeddings of the `prompts` text set (template prompts, each normalised, averaged, renormalised:
    the zero-shot classifier) as weights, zero bias; Language-1P: the Language-2P head merged with the image tower's
    projection (`language_1p_init`). Per knowledge variant v of `knowledge` ({v: class weights [C, d]}), each
    head h of KNOWLEDGE_HEADS also gets `h@v`: the same head initialised from the variant's class embeddings."""
    dim, out = pool.x.shape[1], {}
    if "random_2p" in s.heads:
        out["random_2p"] = pytorch_linear_init(dim, pool.num_classes, seed)
    classifiers = {"": text_classifier(inputs, pool)} if set(LANGUAGE_HEADS) & set(s.heads) else {}
    classifiers.update({f"@{v}": w for v, w in (knowledge or {}).items()})
    for suffix, w in classifiers.items():
        two_p = (w.T.astype(np.float32), np.zeros(pool.num_classes, np.float32))
        for head in (h for h in LANGUAGE_HEADS if h in s.heads and (not suffix or h in KNOWLEDGE_HEADS)):
            if head == "language_1p" and projection is None:
                raise AdaptError(f"dataset {inputs.meta.name!r}: language_1p needs the image tower's projection "
                                 "(load_pre_projection)")
            out[head + suffix] = two_p if head == "language_2p" else language_1p_init(*two_p, projection)
    return HeadInit(out, logit_scale_factor(s.logit_scale, pool.num_classes, inputs, s.train_split))


def knowledge_classifiers(inputs, pool: Pool, s: Settings) -> dict[str, np.ndarray]:
    """{variant: class weights [C, d]} of the `knowledge` variants embedded for the dataset (stage embed_knowledge;
    the dataset must be in suite.knowledge), in the order of `s.knowledge`; none when no head of KNOWLEDGE_HEADS runs."""
    if not set(KNOWLEDGE_HEADS) & set(s.heads) or not hasattr(inputs, "knowledge_sets"):
        return {}
    present = set(inputs.knowledge_sets())
    out = {v: knowledge_variant(inputs.knowledge(v), pool.num_classes)[0] for v in s.knowledge if v in present}
    for v, w in out.items():
        if w.shape[1] != pool.x.shape[1]:
            raise AdaptError(f"dataset {inputs.meta.name!r}: knowledge set {v!r} has dim {w.shape[1]}, images "
                             f"{pool.x.shape[1]}")
    return out


def select_knowledge(run: dict[str, Any], heads: Sequence[str], variants: Sequence[str]) -> dict[str, Any]:
    """The paper's knowledge-augmented adaptation (App. H, Tables 16-17): per head of KNOWLEDGE_HEADS, the
    initialisation (knowledge-free or one variant) whose search reached the highest validation score is tested, as
    `<head>_knowledge`; knowledge is used only when it is strictly better on validation (ties keep the first)."""
    run = {**run, "chosen": dict(run["chosen"]), "final": dict(run["final"]), "knowledge_choice": {}}
    for head in (h for h in heads if h in KNOWLEDGE_HEADS):
        candidates = [head] + [f"{head}@{v}" for v in variants]
        best = max(candidates, key=lambda c: (run["chosen"][c]["val_score"], -candidates.index(c)))
        run["chosen"][head + KNOWLEDGE_SUFFIX] = {**run["chosen"][best], "initialisation": best}
        run["final"][head + KNOWLEDGE_SUFFIX] = run["final"][best]
        if best in run.get("predicted", {}):
            run["predicted"] = {**run["predicted"], head + KNOWLEDGE_SUFFIX: run["predicted"][best]}
        run["knowledge_choice"][head] = best.partition("@")[2] or None
    return run


def logit_scale_factor(name: str, num_classes: int, inputs=None, split: str | None = None) -> float:
    """The factor exp(LOGIT_SCALE_INIT) in front of the heads; `pretrained` reads the model's learned scale that the
    embed step records with the image features (`logit_scale` in their fingerprint)."""
    if name == "none":
        return 1.0
    if name == "clip":
        return 1.0 / 0.07
    if name == "ln_cls":
        return math.log(num_classes)  # exp(log(log C)); below 1 for 2 classes, as in the toolkit
    scale = inputs.images(split).fingerprint.get("logit_scale") if inputs is not None else None
    if scale is None:
        raise AdaptError("adapt.elevater.logit_scale 'pretrained' needs the model's logit scale, which the image features"
                         f" of {inputs.meta.name if inputs is not None else '?'!r} do not record: re-run embed_images "
                         "with this version (models without a logit scale cannot use it)")
    return float(scale)


def text_classifier(inputs, pool: Pool) -> np.ndarray:
    """[C, d]: the `prompts` set's template prompts, each normalised, averaged per class, renormalised."""
    texts = inputs.texts("prompts")
    w = template_weights(texts.table, texts.embeddings, pool.num_classes)
    if w.shape[1] != pool.x.shape[1]:
        raise AdaptError(f"dataset {inputs.meta.name!r}: text embeddings have dim {w.shape[1]}, images {pool.x.shape[1]}")
    return w


def language_1p_init(weight: np.ndarray, bias: np.ndarray, projection: Projection) -> tuple[np.ndarray, np.ndarray]:
    """The toolkit's `MERGE_ENCODER_AND_HEAD_PROJ` (`full_model_finetune.Classifier.__init__`): the head's weight
    (initialised from the text encoder first) times the encoder's projection, `head_proj @ encoder_proj.T`, as the
    weight of a head on the pre-projection features, the head's bias kept. Here weight [d, C] and bias [C] in this
    module's layout; projected = pre @ P.T + b with P [d, d_pre]: weight_1p = P.T @ weight, bias_1p = bias + b @ weight
    (b is zero for a ViT's `proj`, the toolkit's case; a ModifiedResNet's c_proj has one, merged with it)."""
    w1 = projection.weight.T.astype(np.float64) @ weight.astype(np.float64)
    b1 = bias.astype(np.float64) + projection.bias.astype(np.float64) @ weight.astype(np.float64)
    return w1.astype(np.float32), b1.astype(np.float32)


def evaluate(inputs, cfg: Mapping[str, Any], seed: int) -> ProtocolResult:
    s = Settings.from_cfg(cfg)
    pool = load_pool(inputs, s)
    pre, projection = load_pre_projection(inputs, s, pool) if set(PRE_PROJECTION_HEADS) & set(s.heads) else (None, None)
    knowledge = knowledge_classifiers(inputs, pool, s)
    init, on = head_init(inputs, pool, s, seed, projection, knowledge), pick_device()
    reported = s.heads + tuple(h + KNOWLEDGE_SUFFIX for h in s.heads if h in KNOWLEDGE_HEADS and knowledge)
    trained = replace(s, heads=tuple(init.weights))
    groups = head_groups(trained, pool, pre)
    started = time.perf_counter()
    work = s.batch_size * max(p.x.shape[1] for p, _ in groups) * pool.num_classes * len(s.heads) * s.lr_num * 7
    settings = [(shots, sd) for shots in s.shots for sd in (s.seeds if shots != "full" else s.seeds[:1])]
    tasks = [(g, shots, sd) for shots, sd in settings for g in range(len(groups))]
    parts = map_runs(run_group, (groups, init, inputs.meta.name, on), tasks, on, work,
                     costs=[run_cost(groups[g], shots) for g, shots, _ in tasks])
    runs = [merge_runs(parts[i:i + len(groups)]) for i in range(0, len(parts), len(groups))]
    seconds = time.perf_counter() - started
    if knowledge:
        runs = [select_knowledge(r, s.heads, list(knowledge)) for r in runs]
    dims = {h: p.x.shape[1] for p, gs in groups for h in gs.heads}
    dims.update({h + KNOWLEDGE_SUFFIX: dims[h] for h in s.heads if h in KNOWLEDGE_HEADS})
    summary = summarize(runs, replace(s, heads=tuple(init.weights) + reported[len(s.heads):]), dims, pool.num_classes)
    details = {"settings": {**settings_details(s, seed), "logit_factor": init.logit_scale,
                            "knowledge_variants": list(knowledge)},
               "summary": summary,
               "device": str(on), "runs": [{k: v for k, v in r.items() if k not in RUN_ONLY} for r in runs]}
    metrics = {f"elevater/{h}/{shots}/{s.report}": summary[h][shots]["mean"] for h in reported for shots in summary[h]}
    spreads = {f"elevater/{h}/{shots}/{s.report}": head_interval(runs, h, shots, s.report, pool, seed)
               for h in reported for shots in s.shots}
    timings = {"seconds": seconds, "runs": [{"shots": r["shots"], "seed": r["seed"], "search_seconds": r["search_seconds"]}
                                            for r in runs]}
    tables = {"elevater_search": search_table(runs, s), "elevater_predictions": predictions_table(runs, pool)}
    return ProtocolResult(metrics, details, tables,
                          {"pool": len(pool.labels), "test": int(pool.x_test.shape[0])}, timings,
                          {key: interval.to_json() for key, interval in spreads.items() if interval is not None})


def head_groups(s: Settings, pool: Pool, pre: Pool | None) -> list[tuple[Pool, Settings]]:
    """The heads on projected embeddings and those on pre-projection features, each with its pool: every group is a
    search of its own (its own features, batch norm and batches), on the same sampled rows."""
    on_pre = [h for h in s.heads if h.partition("@")[0] in PRE_PROJECTION_HEADS]
    groups = [(pool, [h for h in s.heads if h not in on_pre]), (pre, on_pre)]
    return [(p, replace(s, heads=tuple(names))) for p, names in groups if names]


def merge_runs(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One (shots, seed) run from the runs of the head groups (the same sampled, train and validation rows)."""
    merged = dict(parts[0])
    for part in parts[1:]:
        merged.update(chosen={**merged["chosen"], **part["chosen"]}, final={**merged["final"], **part["final"]},
                      trace=merged["trace"] + part["trace"], predicted={**merged["predicted"], **part["predicted"]})
        for key in ("search_runs", "toolkit_search_runs", "search_seconds"):
            merged[key] += part[key]
    return merged


def summarize(runs: list[dict], s: Settings, dims: Mapping[str, int], num_classes: int) -> dict[str, Any]:
    """Per head and shots: mean and std over seeds of the reported test score, the seeds' values, and the
    parameter-efficiency numbers; `dims`: the feature dimension each head is trained on."""
    out: dict[str, Any] = {"trainable_params": {h: dims[h] * num_classes + num_classes for h in s.heads}}
    for head in s.heads:
        trainable = out["trainable_params"][head]
        for shots in s.shots:
            values = [r["final"][head][s.report] for r in runs if r["shots"] == shots]
            mean, std = mean_std(values)
            out.setdefault(head, {})[str(shots)] = {"mean": mean, "std": std, "per_seed": values,
                                                    "seeds": [r["seed"] for r in runs if r["shots"] == shots],
                                                    **parameter_efficiency(mean, trainable, s)}
    return out


def parameter_efficiency(score: float, trainable: int, s: Settings) -> dict[str, float]:
    """ELEVATER's performance-efficiency metric (App. D.2, Eq. 1): PE = score * exp(log10(M / M0 + 1)), M the head's
    trainable parameters, M0 the normalisation constant (`parameter_efficiency.m0`, the paper's 1e8)."""
    return {"pe": score * math.exp(math.log10(trainable / s.pe_m0 + 1))}


def settings_details(s: Settings, seed: int) -> dict[str, Any]:
    return {"shots": list(s.shots), "seeds": list(s.seeds), "heads": list(s.heads), "report": s.report,
            "report_note": "best_on_test selects the epoch on the test split, as the toolkit reports"
            if s.report == "best_on_test" else "test metric after the last epoch of the final run",
            "learning_rates": s.learning_rates(), "weight_decay_grid": {"log_range": list(s.wd_log_range), "num": 97,
                                                                        "coarse": 7, "spans": [8, 4, 2, 1]},
            "val_fraction": s.val_fraction, "batch_size": s.batch_size, "search_epochs": s.search_epochs,
            "final_epochs": s.final_epochs, "momentum": s.momentum, "nesterov": s.nesterov,
            "logit_scale": s.logit_scale, "init_seed": seed, "shuffle_seed": SHUFFLE_SEED,
            "search_subset": dict(s.search_subset), "precision": "fp32",
            "parameter_efficiency": {"m0": s.pe_m0, "note": PE_NOTE}, "wd_refinement": s.wd_refinement,
            "language_1p": LANGUAGE_1P_NOTE if "language_1p" in s.heads else "not run (adapt.elevater.heads)"}


def head_interval(runs: list[dict], head: str, shots, report: str, pool: Pool, seed: int):
    """The 95% interval of a head's reported number at `shots`: over the sampling seeds (a t-interval on the logit scale,
    `stats.seeds_interval`) where it ran several, else a bootstrap over the test samples of its one final head (single-label accuracy or mean-per-class,
    from its test predictions); None for other metrics."""
    chosen = [r for r in runs if r["shots"] == shots]
    if len(chosen) > 1:
        return seeds_interval([r["final"][head][report] for r in chosen])
    predicted = chosen[0].get("predicted", {}).get(head) if chosen else None
    if predicted is None or pool.metric not in SAMPLE_METRICS:
        return None
    return bootstrap_sample_metric(pool.metric, predicted == pool.y_test, pool.y_test, seed=seed)


def predictions_table(runs: list[dict], pool: Pool) -> pa.Table:
    """One row per (head, shots, seed, test sample): the class the final head predicts (argmax at the reported epoch;
    -1 where it diverged), beside the label: reports/adapt/<dataset>.elevater_predictions.parquet, for bootstrap
    intervals and paired tests. Empty for multi-label data."""
    n = len(pool.test_ids)
    heads, shots, seeds, predicted = [], [], [], []
    for r in runs:
        for head, values in r.get("predicted", {}).items():
            heads += [head] * n
            shots += [str(r["shots"])] * n
            seeds += [r["seed"]] * n
            predicted.append(np.asarray(values, dtype=np.int64))
    repeats = len(predicted)
    return pa.table({"head": pa.array(heads, pa.string()), "shots": pa.array(shots, pa.string()),
                     "seed": pa.array(seeds, pa.int64()),
                     "sample_id": pa.array(list(pool.test_ids) * repeats if repeats else [], pa.string()),
                     "label": pa.array(np.tile(pool.y_test, repeats) if repeats and not pool.multi_label else [],
                                       pa.int64()),
                     "predicted": pa.array(np.concatenate(predicted) if predicted else [], pa.int64())})


def search_table(runs: list[dict], s: Settings) -> pa.Table:
    """One row per search candidate: head, shots, seed, learning rate, the candidate's weight-decay grid index, the
    weight decay trained (with wd_refinement left, the round's left neighbour's), round, validation score (best over
    the run's epochs)."""
    lrs, wds = s.learning_rates(), s.weight_decays()
    rows = [{"head": t["line"][0], "shots": str(r["shots"]), "seed": r["seed"], "lr": lrs[t["line"][1]],
             "wd_index": t["index"], "wd": wds[t["trained"]], "round": t["round"], "val_score": t["score"]}
            for r in runs for t in r["trace"]]
    schema = pa.schema([("head", pa.string()), ("shots", pa.string()), ("seed", pa.int64()), ("lr", pa.float64()),
                        ("wd_index", pa.int64()), ("wd", pa.float64()), ("round", pa.int64()),
                        ("val_score", pa.float64())])
    return pa.Table.from_pylist(rows, schema=schema)
