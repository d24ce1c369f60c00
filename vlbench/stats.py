"""Uncertainty of the headline numbers: bootstrap intervals over test samples, paired tests between two systems,
intervals over seeds and episodes (docs/protocols.md, "Intervals and paired tests").

Every function is a plain numpy function of explicit arguments, seeded with a `numpy.random.Generator`.

Percentile bootstrap (Efron & Tibshirani 1993, ch. 13): draw `resamples` samples of size n with replacement from the
n test samples, recompute the metric on each, and take the (1 - level) / 2 and (1 + level) / 2 quantiles (numpy's
linear interpolation, as `scipy.stats.bootstrap(method="percentile")`). Accuracy and mean-per-class accuracy depend on
a resample only through how many times it drew each cell (class x correct, and for two systems class x correct_a x
correct_b): those counts are Multinomial(n, cell frequencies), drawn directly (`_class_cells`), which is the same
distribution as drawing indices and costs O(resamples x cells) instead of O(resamples x n). Metrics that need the
whole set (mAP, ROC-AUC) resample indices and recompute, a chunk of resamples at a time as sample multiplicities.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from vlbench import metrics
from vlbench.errors import VlbenchError
from vlbench.metrics import binary_decision, f1_per_class, mean_confidence_interval

LEVEL = 0.95
RESAMPLES = 2000  # per interval; the Monte-Carlo error of a 95% endpoint is then about 0.1 point at n = 1000
SAMPLE_METRICS = ("accuracy", "mean_per_class")  # computed from per-sample correctness alone
SEEDS_METHOD = "seeds_logit_t"  # seeds_interval: a t-interval over seeds on the logit scale, inside [0, 1]


class StatsError(VlbenchError):
    """Inputs to an interval or test that cannot give one (sizes differ, too few values, unknown metric)."""


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    level: float
    method: str  # "bootstrap" | SEEDS_METHOD | "episodes"
    resamples: int | None = None
    seed: int | None = None

    def to_json(self) -> dict:
        """The `intervals` entry of a result file (vlbench.results)."""
        out = {"low": self.low, "high": self.high, "level": self.level, "method": self.method}
        if self.method == "bootstrap":
            out.update(resamples=self.resamples, seed=self.seed)
        return out


@dataclass(frozen=True)
class Difference:
    delta: float  # metric of b minus metric of a
    low: float
    high: float
    p_bootstrap: float
    p_mcnemar: float | None
    n: int
    paired: bool
    identical: bool = False  # both systems' per-unit results are the same: no discordant unit, the test cannot reject


def _quantiles(values: np.ndarray, level: float) -> tuple[float, float]:
    if not 0.0 < level < 1.0:
        raise StatsError(f"level must be in (0, 1), got {level!r}")
    low, high = np.quantile(values, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return float(low), float(high)


def _check_resamples(resamples: int) -> None:
    if isinstance(resamples, bool) or not isinstance(resamples, (int, np.integer)) or resamples < 1:
        raise StatsError(f"resamples must be a positive integer, got {resamples!r}")


def _class_cells(labels: np.ndarray, codes: np.ndarray, num_codes: int, resamples: int,
                 rng: np.random.Generator) -> np.ndarray:
    """(resamples, classes, num_codes): how often each resample of the n samples drew a sample of each class with each
    code (correctness, or the pair of two systems' correctness). Drawn in two exact steps: the class totals,
    Multinomial(n, class frequencies), then each class's total split over the codes, Multinomial(total, the class's
    code frequencies); a sequence of conditional draws has the joint distribution of the (class, code) cells."""
    n, k = labels.size, int(labels.max()) + 1
    totals = rng.multinomial(n, np.bincount(labels, minlength=k) / n, size=resamples)
    within = np.bincount(labels * num_codes + codes, minlength=k * num_codes).reshape(k, num_codes)
    freq = within / np.maximum(within.sum(axis=1, keepdims=True), 1)
    if num_codes == 2:
        right = rng.binomial(totals, freq[:, 1])
        return np.stack([totals - right, right], axis=2)
    return rng.multinomial(totals, freq)


def _correct(correct, name: str = "correct") -> np.ndarray:
    c = np.asarray(correct)
    if c.ndim != 1 or c.size == 0:
        raise StatsError(f"{name} must be a non-empty 1-D array of per-sample correctness, got shape {c.shape}")
    return c.astype(bool)


def _labels(labels, n: int) -> np.ndarray:
    y = np.asarray(labels)
    if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer) or (y.size and y.min() < 0):
        raise StatsError(f"labels must be {n} non-negative class indices, got shape {y.shape} dtype {y.dtype}")
    return y.astype(np.int64)


def _per_class_mean(correct_counts: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Mean over the classes a resample drew (rows) of correct / total; classes drawn zero times are left out, as
    `vlbench.metrics.mean_per_class_accuracy` leaves out classes without test samples."""
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = correct_counts / totals
    present = totals > 0
    return np.where(present, recall, 0.0).sum(axis=1) / present.sum(axis=1)


def sample_metric_replicates(metric: str, correct, labels=None, resamples: int = RESAMPLES,
                             rng: np.random.Generator | None = None) -> np.ndarray:
    """(resamples,) bootstrap replicates of `accuracy` or `mean_per_class` from per-sample correctness (and labels)."""
    c = _correct(correct)
    _check_resamples(resamples)
    rng = rng or np.random.default_rng(0)
    if metric == "accuracy":
        return rng.binomial(c.size, c.mean(), size=resamples) / c.size
    if metric == "mean_per_class":
        y = _labels(labels, c.size)
        counts = _class_cells(y, c.astype(np.int64), 2, resamples, rng)
        return _per_class_mean(counts[:, :, 1], counts.sum(axis=2))
    raise StatsError(f"no per-sample bootstrap for metric {metric!r}; known: {', '.join(SAMPLE_METRICS)}")


def bootstrap_sample_metric(metric: str, correct, labels=None, *, resamples: int = RESAMPLES, seed: int = 0,
                            level: float = LEVEL) -> Interval:
    """Percentile bootstrap interval of accuracy or mean-per-class accuracy from per-sample correctness."""
    reps = sample_metric_replicates(metric, correct, labels, resamples, np.random.default_rng(seed))
    return Interval(*_quantiles(reps, level), level, "bootstrap", int(resamples), int(seed))


def resample_counts(rng: np.random.Generator, n: int, resamples: int) -> np.ndarray:
    """(resamples, n) int32: how many times each resample (n draws with replacement) drew each sample."""
    idx = rng.integers(0, n, (resamples, n)) + (np.arange(resamples) * n)[:, None]
    return np.bincount(idx.ravel(), minlength=resamples * n).reshape(resamples, n).astype(np.int32)


def _weighted_map_11point(scores: np.ndarray, targets: np.ndarray, weights: np.ndarray, convention: str) -> np.ndarray:
    """(R,) 11-point mAP of each resample given as sample multiplicities `weights` (R, n): `vlbench.metrics.map_11point`
    on the resampled rows (tied scores one threshold; classes without a drawn positive left out; NaN if none has
    one)."""
    ks = np.arange(11)
    ap = np.full((weights.shape[0], scores.shape[1]), np.nan)
    for j in range(scores.shape[1]):
        order = np.argsort(-scores[:, j], kind="stable")
        s, pos = scores[order, j], targets[order, j].astype(bool)
        ends = np.r_[np.nonzero(s[1:] != s[:-1])[0], s.size - 1]
        w = weights[:, order]
        tp = np.cumsum(w * pos, axis=1)[:, ends]
        fp = np.cumsum(w * ~pos, axis=1)[:, ends]
        n_pos = tp[:, -1:]
        precision = np.divide(tp, tp + fp, out=np.zeros(tp.shape), where=(tp + fp) > 0)
        # recall only grows along the thresholds: those reaching k/10 are a suffix, from the first that does
        best_after = np.c_[np.maximum.accumulate(precision[:, ::-1], axis=1)[:, ::-1], np.zeros(len(tp))]
        first = np.stack([(10 * tp < k * n_pos).sum(axis=1) for k in ks], axis=1)  # (R, 11); len(ends): none
        interp = np.take_along_axis(best_after, first, axis=1)
        if convention == "elevater":
            interp[:, 0] = 1.0
        ap[:, j] = np.where(n_pos[:, 0] > 0, interp.mean(axis=1), np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN row: no class has a drawn positive
        return np.nanmean(ap, axis=1)


def _weighted_roc_auc(decision: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(R,) ROC-AUC (Mann-Whitney with ties counting one half, `vlbench.metrics.roc_auc`) of each resample given as
    multiplicities `weights` (R, n); NaN where a resample drew one class only."""
    order = np.argsort(decision, kind="stable")
    d, y = decision[order], labels[order].astype(bool)
    group = np.r_[0, np.cumsum(d[1:] != d[:-1])]
    w = weights[:, order]
    r, g = w.shape[0], int(group[-1]) + 1
    offsets = (np.arange(r) * g)[:, None]
    pos = np.bincount((offsets + group[None, :]).ravel(), (w * y).ravel(), r * g).reshape(r, g)
    neg = np.bincount((offsets + group[None, :]).ravel(), (w * ~y).ravel(), r * g).reshape(r, g)
    below = np.cumsum(neg, axis=1) - neg
    with np.errstate(invalid="ignore", divide="ignore"):
        return (pos * (below + 0.5 * neg)).sum(axis=1) / (pos.sum(axis=1) * neg.sum(axis=1))


def group_accuracy_replicates(correct, groups, resamples: int = RESAMPLES,
                              rng: np.random.Generator | None = None) -> tuple[list, np.ndarray]:
    """(the groups, sorted; (resamples, groups) bootstrap replicates of each group's accuracy) from per-sample
    correctness and groups: the n samples resampled as (group x correct) cells (`_class_cells`), NaN where a resample
    drew none of a group."""
    c = _correct(correct)
    _check_resamples(resamples)
    names, codes = np.unique(np.asarray(groups), return_inverse=True)
    if codes.shape != c.shape:
        raise StatsError(f"groups must give one group per sample ({c.size}), got {codes.size}")
    counts = _class_cells(codes.astype(np.int64), c.astype(np.int64), 2, resamples, rng or np.random.default_rng(0))
    with np.errstate(invalid="ignore", divide="ignore"):
        return names.tolist(), np.where(counts.sum(axis=2) > 0, counts[:, :, 1] / counts.sum(axis=2), np.nan)


def group_replicates(correct, groups, resamples: int = RESAMPLES, rng: np.random.Generator | None = None) -> np.ndarray:
    """(resamples,) bootstrap replicates of the worst group's accuracy from per-sample correctness and groups: the
    minimum over the groups a resample drew (`group_accuracy_replicates`)."""
    return np.nanmin(group_accuracy_replicates(correct, groups, resamples, rng)[1], axis=1)


def group_table_intervals(outcome, groups, worst: bool = True, *, resamples: int = RESAMPLES, seed: int = 0,
                          level: float = LEVEL) -> dict[str, Interval]:
    """Bootstrap intervals of `vlbench.metrics.fairness_table`'s numbers, keyed as its keys less the name: `avg`
    (the mean outcome, `bootstrap_sample_metric`), each group's mean and, with `worst`, `wg` (their minimum), from one
    set of resamples of the n samples (`group_accuracy_replicates`; a group's interval over the resamples that drew
    it)."""
    names, reps = group_accuracy_replicates(outcome, groups, resamples, np.random.default_rng(seed))
    out = {"avg": bootstrap_sample_metric("accuracy", outcome, resamples=resamples, seed=seed, level=level)}
    for g, column in zip(names, reps.T):
        out[g] = Interval(*_quantiles(column[np.isfinite(column)], level), level, "bootstrap", int(resamples), int(seed))
    if worst:
        out["wg"] = Interval(*_quantiles(np.nanmin(reps, axis=1), level), level, "bootstrap", int(resamples), int(seed))
    return out


def _weighted_f1_macro(scores: np.ndarray, labels: np.ndarray, weights: np.ndarray, convention: str) -> np.ndarray:
    """(R,) `vlbench.metrics.f1_macro` of each resample given as sample multiplicities `weights` (R, n)."""
    y, pred, c = labels.astype(np.int64), scores.argmax(axis=1), scores.shape[1]
    out = np.empty(weights.shape[0])
    for r, w in enumerate(weights.astype(np.float64)):
        present = np.bincount(y, weights=w, minlength=c) > 0
        out[r] = f1_per_class(y, pred, c, w)[present].mean()
    return out


def metric_interval(metric: str, scores, labels, convention: str = "default", *, resamples: int = RESAMPLES,
                    seed: int = 0, level: float = LEVEL, chunk: int = 100, groups=None) -> Interval:
    """The bootstrap interval of a dataset metric (`vlbench.metrics.compute`'s names) on (n, C) scores.

    accuracy / mean_per_class: from the argmax's correctness (`sample_metric_replicates`); map_11point / roc_auc:
    indices resampled, `chunk` resamples at a time as multiplicities, and the metric recomputed on each; a resample
    that leaves the metric undefined (ROC-AUC with one class drawn) is dropped. Group metrics (worst-group top-k
    accuracy) need `groups`, one per sample, and resample the (group x correct) cells (`group_replicates`)."""
    scores = np.asarray(scores)
    if metric in GROUP_TOPK:
        metrics.compute(metric, scores, labels, convention, groups)  # the metric's own checks
        y = np.asarray(labels)
        correct = metrics.topk_correct(scores.astype(np.float64), y, GROUP_TOPK[metric])
        reps = group_replicates(correct, groups, resamples, np.random.default_rng(seed))
        return Interval(*_quantiles(reps, level), level, "bootstrap", int(resamples), int(seed))
    if metric in SAMPLE_METRICS:
        y = np.asarray(labels)
        return bootstrap_sample_metric(metric, scores.argmax(axis=1) == y, y, resamples=resamples, seed=seed,
                                       level=level)
    if metric not in WHOLE_SET_METRICS:
        known = ", ".join(SAMPLE_METRICS + tuple(WHOLE_SET_METRICS) + tuple(GROUP_TOPK))
        raise StatsError(f"no bootstrap for metric {metric!r}; known: {known}")
    _check_resamples(resamples)
    metrics.compute(metric, scores, labels, convention)  # the metric's own checks of shapes and values
    rng, reps = np.random.default_rng(seed), []
    for start in range(0, resamples, chunk):
        weights = resample_counts(rng, scores.shape[0], min(chunk, resamples - start))
        reps.append(WHOLE_SET_METRICS[metric](scores, np.asarray(labels), weights, convention))
    reps = np.concatenate(reps)
    return Interval(*_quantiles(reps[np.isfinite(reps)], level), level, "bootstrap", int(resamples), int(seed))


def _roc_auc_replicates(scores, labels, weights, convention):
    return _weighted_roc_auc(binary_decision(scores, convention), labels, weights)


WHOLE_SET_METRICS = {"map_11point": _weighted_map_11point, "roc_auc": _roc_auc_replicates,
                     "f1_macro": _weighted_f1_macro}
GROUP_TOPK = {"worst_group_accuracy": 1, "worst_group_top5": 5}  # metric: k of its top-k correctness


# --------------------------------------------------------------------------------------------------------- paired


def mcnemar_exact(correct_a, correct_b) -> float:
    """Two-sided exact McNemar test: the binomial test of the discordant pairs (a right and b wrong: k of m) against
    p = 1/2, i.e. min(1, 2 P(X <= min(k, m - k))) for X ~ Binomial(m, 1/2); 1 when there is no discordant pair."""
    a, b = _correct(correct_a, "correct_a"), _correct(correct_b, "correct_b")
    if a.size != b.size:
        raise StatsError(f"McNemar needs paired samples: {a.size} against {b.size}")
    only_a, only_b = int(np.sum(a & ~b)), int(np.sum(~a & b))
    m, k = only_a + only_b, min(only_a, only_b)
    if m == 0:
        return 1.0
    from scipy.special import gammaln

    i = np.arange(k + 1)
    log_pmf = gammaln(m + 1.0) - gammaln(i + 1.0) - gammaln(m - i + 1.0) - m * math.log(2.0)
    top = log_pmf.max()
    return float(min(1.0, 2.0 * math.exp(top) * np.exp(log_pmf - top).sum()))


def mcnemar_counts(only_a, only_b) -> np.ndarray:
    """`mcnemar_exact` from the discordant counts (arrays of any shape, vectorised): min(1, 2 P(X <= min(k, m - k))),
    X ~ Binomial(m, 1/2); 1 where m = 0."""
    from scipy.special import bdtr  # the binomial CDF (scipy.stats costs seconds to import)

    only_a, only_b = np.asarray(only_a), np.asarray(only_b)
    m = only_a + only_b
    return np.where(m == 0, 1.0, np.minimum(1.0, 2.0 * bdtr(np.minimum(only_a, only_b), m, 0.5)))


def bootstrap_p(deltas: np.ndarray) -> float:
    """Two-sided p-value of "no difference" from bootstrap replicates of a difference: twice the smaller tail mass at
    zero, each tail counted with the observed resample added, (#{d <= 0} + 1) / (B + 1), capped at 1; p < 1 - level
    exactly when 0 lies outside the percentile interval (up to interpolation)."""
    b = deltas.size
    tail = min(np.sum(deltas <= 0) + 1, np.sum(deltas >= 0) + 1) / (b + 1)
    return float(min(1.0, 2.0 * tail))


def paired_sample_replicates(metric: str, correct_a, correct_b, labels=None, resamples: int = RESAMPLES,
                             rng: np.random.Generator | None = None) -> np.ndarray:
    """(resamples,) replicates of metric(b) - metric(a) over the same resampled samples (accuracy, mean_per_class)."""
    a, b = _correct(correct_a, "correct_a"), _correct(correct_b, "correct_b")
    if a.size != b.size:
        raise StatsError(f"a paired bootstrap needs the same samples: {a.size} against {b.size}")
    _check_resamples(resamples)
    rng = rng or np.random.default_rng(0)
    y = _labels(labels, a.size) if metric == "mean_per_class" else np.zeros(a.size, np.int64)
    if metric not in SAMPLE_METRICS:
        raise StatsError(f"no per-sample paired bootstrap for metric {metric!r}; known: {', '.join(SAMPLE_METRICS)}")
    counts = _class_cells(y, a * 2 + b.astype(np.int64), 4, resamples, rng).reshape(resamples, -1, 2, 2)  # class, a, b
    totals = counts.sum(axis=(2, 3))
    right_a, right_b = counts[:, :, 1, :].sum(axis=2), counts[:, :, :, 1].sum(axis=2)
    if metric == "accuracy":
        return (right_b.sum(axis=1) - right_a.sum(axis=1)) / a.size
    return _per_class_mean(right_b, totals) - _per_class_mean(right_a, totals)


def _sample_metric(metric: str, correct: np.ndarray, labels: np.ndarray | None) -> float:
    if metric == "accuracy":
        return float(correct.mean())
    present = np.unique(labels)
    return float(np.mean([correct[labels == c].mean() for c in present]))


def paired_difference(metric: str, correct_a, correct_b, labels=None, *, resamples: int = RESAMPLES, seed: int = 0,
                      level: float = LEVEL) -> Difference:
    """Paired bootstrap of metric(b) - metric(a) on the same samples (percentile interval, `bootstrap_p`), and for
    accuracy the exact McNemar test."""
    a, b = _correct(correct_a, "correct_a"), _correct(correct_b, "correct_b")
    y = None if labels is None else np.asarray(labels)
    reps = paired_sample_replicates(metric, a, b, y, resamples, np.random.default_rng(seed))
    delta = _sample_metric(metric, b, y) - _sample_metric(metric, a, y)
    low, high = _quantiles(reps, level)
    p_mcnemar = mcnemar_exact(a, b) if metric == "accuracy" else None
    return Difference(delta, low, high, bootstrap_p(reps), p_mcnemar, int(a.size), True)


def unpaired_difference(a: float, interval_a: dict | None, b: float, interval_b: dict | None,
                        level: float = LEVEL) -> Difference:
    """b - a when the samples cannot be paired (no per-sample results, or seeds/episodes): a normal approximation from
    the two intervals, each half-width taken as z * standard error; interval and p are None-free only when both
    intervals exist."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf((1.0 + level) / 2.0)
    if not interval_a or not interval_b:
        return Difference(b - a, float("nan"), float("nan"), float("nan"), None, 0, False)
    se = math.hypot(*((i["high"] - i["low"]) / (2.0 * NormalDist().inv_cdf((1.0 + i["level"]) / 2.0))
                      for i in (interval_a, interval_b)))
    delta = b - a
    if se == 0:
        return Difference(delta, delta, delta, 1.0 if delta == 0 else 0.0, None, 0, False)
    p = 2.0 * (1.0 - NormalDist().cdf(abs(delta) / se))
    return Difference(delta, delta - z * se, delta + z * se, p, None, 0, False)


# ------------------------------------------------------------------------------------------- seeds and episodes


def median_of_runs_interval(correct, *, resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL,
                            chunk: int = 100) -> Interval:
    """Percentile bootstrap interval of the median over runs of their accuracies, from (runs, n) per-sample
    correctness on one test set (VTAB reports the median of 3 runs): each resample draws the test samples once for
    all runs, as the runs share the test set."""
    c = np.atleast_2d(np.asarray(correct)).astype(np.float64)
    if c.ndim != 2 or c.shape[1] == 0:
        raise StatsError(f"correct must be (runs, n) with n > 0, got shape {c.shape}")
    _check_resamples(resamples)
    rng, reps = np.random.default_rng(seed), []
    for start in range(0, resamples, chunk):
        weights = resample_counts(rng, c.shape[1], min(chunk, resamples - start))
        reps.append(np.median(weights @ c.T / c.shape[1], axis=1))
    return Interval(*_quantiles(np.concatenate(reps), level), level, "bootstrap", int(resamples), int(seed))


def cluster_ratio_interval(numerators, denominators, *, resamples: int = RESAMPLES, seed: int = 0,
                           level: float = LEVEL, chunk: int = 100) -> Interval:
    """Percentile bootstrap interval of sum(numerators) / sum(denominators) when whole clusters are resampled: n
    clusters drawn with replacement, each bringing its numerator and denominator (a test image with its captions'
    hits and count for text-to-image recall; with denominators 1 the plain bootstrap of a mean over samples). Clusters
    are what the test set samples; resampling their members alone would ignore that captions of one image move
    together."""
    num, den = (np.asarray(x, dtype=np.float64) for x in (numerators, denominators))
    if num.ndim != 1 or num.shape != den.shape or num.size == 0 or np.any(den <= 0):
        raise StatsError(f"numerators and denominators must be two non-empty 1-D arrays of one size, denominators > 0; "
                         f"got shapes {num.shape} and {den.shape}")
    _check_resamples(resamples)
    rng, reps = np.random.default_rng(seed), []
    for start in range(0, resamples, chunk):
        weights = resample_counts(rng, num.size, min(chunk, resamples - start))
        reps.append((weights @ num) / (weights @ den))
    return Interval(*_quantiles(np.concatenate(reps), level), level, "bootstrap", int(resamples), int(seed))


def seeds_interval(values, level: float = LEVEL) -> Interval | None:
    """Logit-transformed Student-t interval of the mean m over seeds of a metric in [0, 1] (accuracy, mean-per-class,
    mAP, ROC-AUC): logit(m) +- t_{(1+level)/2, n-1} * se / (m (1 - m)), se = s / sqrt(n) (s with ddof=1; the delta
    method's standard error of logit(m)), mapped back with the logistic function. It always lies in [0, 1] and holds
    m; the plain t-interval m +- t se reached [-0.39, 1.08] for an accuracy with a wide spread over 3 seeds (issue
    30). Seeds all at 0 or all at 1 give [m, m]. None for fewer than two seeds or a non-finite value."""
    from scipy.stats import t

    v = np.asarray(values, dtype=np.float64)
    if v.size < 2 or not np.all(np.isfinite(v)):
        return None
    if np.any((v < 0) | (v > 1)):
        raise StatsError(f"seeds_interval needs values in [0, 1]; got {v.tolist()}")
    m, se = float(v.mean()), float(v.std(ddof=1) / math.sqrt(v.size))
    if se == 0.0 or m in (0.0, 1.0):
        return Interval(m, m, level, SEEDS_METHOD)
    half = float(t.ppf((1.0 + level) / 2.0, v.size - 1)) * se / (m * (1.0 - m))
    centre = math.log(m / (1.0 - m))
    return Interval(_expit(centre - half), _expit(centre + half), level, SEEDS_METHOD)


def _expit(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def episodes_interval(values) -> Interval:
    """The few-shot convention: mean +- 1.96 * std / sqrt(episodes) (vlbench.metrics.mean_confidence_interval)."""
    mean, half = mean_confidence_interval(values, LEVEL)
    return Interval(mean - half, mean + half, LEVEL, "episodes")


# --------------------------------------------------------------------------------- many systems on the same units
#
# `vlbench compare` resamples the units of a table once for all the systems it compares (the same resampled units for
# every system: the replicates are joint), so that each pairwise difference is a paired bootstrap and each
# replicate can be ranked (rank intervals). An estimator holds the per-unit numbers of E systems on n units and gives
# `point()` (E,) and `replicates(resamples, rng)` (R, E). Units that carry the same numbers for every system (and the
# same class, group, weight) are one code: a resample depends only on how many times it drew each code, a
# Multinomial(n, code frequencies) draw, which costs O(resamples x codes) instead of O(resamples x n).


def _codes(columns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unique rows of the (n, m) array `columns` in lexicographic order, their counts, each unit's code). Columns
    are factorised one by one and combined into one integer per unit while their cardinalities allow (0/1 columns
    of ten systems: 1,024 values), which is much faster than a row-wise unique."""
    key, radix = np.zeros(columns.shape[0], np.int64), 1
    for j in range(columns.shape[1]):
        values, inverse = np.unique(columns[:, j], return_inverse=True)
        if radix * values.size >= 2 ** 62:
            rows, inverse, counts = np.unique(columns, axis=0, return_inverse=True, return_counts=True)
            return rows, counts, inverse.ravel()
        key, radix = key * values.size + inverse.ravel(), radix * values.size
    _, first, codes, counts = np.unique(key, return_index=True, return_inverse=True, return_counts=True)
    return columns[first], counts, codes.ravel()


def _draws(counts: np.ndarray, codes: np.ndarray, resamples: int, rng: np.random.Generator, chunk: int = 200):
    """Chunks (r, K) of code multiplicities of `resamples` resamples of the n units (each drawn with replacement):
    Multinomial(n, counts / n) draws where the codes are few (O(r K)), else n unit indices per resample counted by
    code (O(r n)), whichever is cheaper; both have the same distribution."""
    n, k = int(counts.sum()), counts.size
    for start in range(0, resamples, chunk):
        r = min(chunk, resamples - start)
        if 4 * k <= n:
            yield rng.multinomial(n, counts / n, size=r).astype(np.float64)
        else:
            drawn = codes[rng.integers(0, n, (r, n))] + (np.arange(r) * k)[:, None]
            yield np.bincount(drawn.ravel(), minlength=r * k).reshape(r, k).astype(np.float64)


def _replicates(estimator, rows: np.ndarray, counts: np.ndarray, codes: np.ndarray, resamples: int,
                rng: np.random.Generator) -> np.ndarray:
    return np.concatenate([estimator._of(w, rows) for w in _draws(counts, codes, resamples, rng)])


class Ratio:
    """sum(num) / sum(den) over units for each system: accuracy or recall@k (num: 0/1 per unit, den 1), a mean of
    per-unit numbers (AP per image, accuracy per episode), or a clustered ratio (t2i recall: num = an image's
    captions' hits, den = its captions; resampling images resamples each with all its captions). `num` (E, n),
    `den` (n,). `binary`: the per-unit 0/1 outcomes (E, n) where McNemar's exact test applies (den all 1)."""

    def __init__(self, num, den=None):
        self.num = np.atleast_2d(np.asarray(num, dtype=np.float64))
        self.den = np.ones(self.num.shape[1]) if den is None else np.asarray(den, dtype=np.float64)
        if self.num.shape[1] == 0 or self.den.shape != (self.num.shape[1],) or np.any(self.den <= 0):
            raise StatsError(f"a ratio needs n > 0 units with den > 0; got num {self.num.shape}, den {self.den.shape}")
        values = np.unique(self.num)
        self.binary = self.num.astype(bool) if (np.all(self.den == 1) and np.isin(values, (0.0, 1.0)).all()) else None
        self.units = self.num.shape[1]

    def _of(self, weights: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return (weights @ rows[:, :-1]) / (weights @ rows[:, -1])[:, None]

    def point(self) -> np.ndarray:
        return self.num.sum(axis=1) / self.den.sum()

    def same(self, a: int, b: int) -> bool:
        """Whether systems a and b have the same result on every unit (`identical_pairs`)."""
        return bool(np.array_equal(self.num[a], self.num[b]))

    def replicates(self, resamples: int, rng: np.random.Generator) -> np.ndarray:
        rows, counts, codes = _codes(np.c_[self.num.T, self.den])
        return _replicates(self, rows, counts, codes, resamples, rng)


class PerClass:
    """The mean (mean-per-class accuracy, a mean over categories) or the minimum (worst-group accuracy) over the classes
    or groups present of each system's accuracy within them, from per-unit correctness (E, n) and one class or group
    per unit; a resample leaves out the classes it did not draw (as the metrics leave out classes without samples)."""

    def __init__(self, correct, classes, reduce: str = "mean"):
        self.correct = np.atleast_2d(np.asarray(correct)).astype(bool)
        _, self.classes = np.unique(np.asarray(classes), return_inverse=True)
        self.classes = self.classes.ravel()
        if self.classes.shape != (self.correct.shape[1],) or self.correct.shape[1] == 0:
            raise StatsError(f"one class per unit needed: {self.classes.shape} for {self.correct.shape[1]} units")
        if reduce not in ("mean", "min"):
            raise StatsError(f"reduce must be mean or min, got {reduce!r}")
        self.reduce, self.binary, self.units = reduce, None, self.correct.shape[1]

    def _of(self, weights: np.ndarray, rows: np.ndarray) -> np.ndarray:
        # the codes are sorted by class (np.unique's row order), so each class's codes are one contiguous run
        from scipy.sparse import csr_matrix

        starts = np.flatnonzero(np.r_[True, rows[1:, 0] != rows[:-1, 0]])
        totals = np.add.reduceat(weights, starts, axis=1)  # (R, classes present)
        k, systems = starts.size, self.correct.shape[0]
        klass = np.cumsum(np.r_[True, rows[1:, 0] != rows[:-1, 0]]) - 1  # each code's class, 0..k-1
        code, system = np.nonzero(rows[:, 1:])
        right = np.asarray((csr_matrix((np.ones(code.size), (klass[code] * systems + system, code)),
                                       shape=(k * systems, rows.shape[0])) @ weights.T).T)
        with np.errstate(invalid="ignore", divide="ignore"):
            recall = right.reshape(-1, k, systems) / totals[:, :, None]
        present = (totals > 0)[:, :, None]
        if self.reduce == "mean":
            return np.where(present, recall, 0.0).sum(axis=1) / present.sum(axis=1)
        return np.where(present, recall, np.inf).min(axis=1)

    def _rows(self):
        return _codes(np.c_[self.classes, self.correct.T.astype(np.int64)])

    def same(self, a: int, b: int) -> bool:
        return bool(np.array_equal(self.correct[a], self.correct[b]))

    def point(self) -> np.ndarray:
        rows, counts, _ = self._rows()
        return self._of(counts[None, :].astype(np.float64), rows)[0]

    def replicates(self, resamples: int, rng: np.random.Generator) -> np.ndarray:
        rows, counts, codes = self._rows()
        return _replicates(self, rows, counts, codes, resamples, rng)


class MedianOfRuns:
    """The median over runs of each run's accuracy (VTAB-1k), from correctness (E, runs, n) on one test set: each
    resample draws the test samples once for every run and system."""

    def __init__(self, correct):
        self.correct = np.asarray(correct).astype(bool)
        if self.correct.ndim != 3 or self.correct.shape[2] == 0:
            raise StatsError(f"correctness must be (systems, runs, n), got shape {self.correct.shape}")
        self.binary, self.units = None, self.correct.shape[2]

    def _of(self, weights: np.ndarray, rows: np.ndarray) -> np.ndarray:
        e, runs, n = self.correct.shape
        acc = (weights @ rows) / n  # (R, e * runs)
        return np.median(acc.reshape(weights.shape[0], e, runs), axis=2)

    def point(self) -> np.ndarray:
        return np.median(self.correct.mean(axis=2), axis=1)

    def same(self, a: int, b: int) -> bool:
        return bool(np.array_equal(self.correct[a], self.correct[b]))

    def replicates(self, resamples: int, rng: np.random.Generator) -> np.ndarray:
        e, runs, n = self.correct.shape
        rows, counts, codes = _codes(self.correct.reshape(e * runs, n).T.astype(np.int64))
        return _replicates(self, rows.astype(np.float64), counts, codes, resamples, rng)


class WholeSet:
    """A metric of the whole test set (11-point mAP, ROC-AUC, macro F1) from each system's (n, C) scores: indices
    resampled, `chunk` resamples at a time as multiplicities, the same multiplicities for every system, the metric
    recomputed on each (`WHOLE_SET_METRICS`)."""

    def __init__(self, metric: str, scores, labels, convention="default", chunk: int = 100):
        if metric not in WHOLE_SET_METRICS:
            raise StatsError(f"no whole-set bootstrap for {metric!r}; known: {', '.join(WHOLE_SET_METRICS)}")
        self.metric, self.scores, self.labels = metric, [np.asarray(s) for s in scores], np.asarray(labels)
        # one convention for all systems, or one each (systems that scored their numbers differently)
        self.conventions = [convention] * len(self.scores) if isinstance(convention, str) else list(convention)
        self.chunk, self.binary, self.units = chunk, None, self.scores[0].shape[0]

    def point(self) -> np.ndarray:
        from vlbench import metrics

        return np.array([metrics.compute(self.metric, s, self.labels, c) for s, c in zip(self.scores, self.conventions)])

    def same(self, a: int, b: int) -> bool:
        return self.conventions[a] == self.conventions[b] and bool(np.array_equal(self.scores[a], self.scores[b]))

    def replicates(self, resamples: int, rng: np.random.Generator) -> np.ndarray:
        out = []
        for start in range(0, resamples, self.chunk):
            weights = resample_counts(rng, self.units, min(self.chunk, resamples - start))
            out.append(np.stack([WHOLE_SET_METRICS[self.metric](s, self.labels, weights, c)
                                 for s, c in zip(self.scores, self.conventions)], axis=1))
        return np.concatenate(out)


class UnitMeans(Ratio):
    """The mean over units (episodes, seeds) of one number per unit and system (E, u), whose differences take the
    paired t-interval (`paired_t`); its replicates (for ranks) resample the units."""

    t_test = True

    def __init__(self, values):
        super().__init__(values)
        self.binary = None  # units are episodes or seeds, not 0/1 outcomes


Ratio.t_test = False
PerClass.t_test = MedianOfRuns.t_test = WholeSet.t_test = False


def bootstrap_se_p(delta: float, deltas: np.ndarray) -> float:
    """Two-sided p of "no difference" from the bootstrap standard error of the difference: 2 Phi(-|delta| / sd*),
    sd* the standard deviation of the replicates (Efron & Tibshirani 1993, ch. 16); unlike `bootstrap_p` it is not
    floored at 2 / (B + 1), so it survives a correction over many rows. 1 for no spread and no difference."""
    from statistics import NormalDist

    sd = float(np.std(deltas, ddof=1)) if deltas.size > 1 else 0.0
    if sd == 0.0:
        return 1.0 if delta == 0.0 else 0.0
    return float(2.0 * NormalDist().cdf(-abs(delta) / sd))


def paired_t(values_a, values_b, level: float = LEVEL) -> tuple[float, float, float, float]:
    """(mean difference, low, high, two-sided p) of b - a over paired units: Student's t on the per-unit differences
    d_i (mean +- t_{(1+level)/2, u-1} sd(d) / sqrt(u), sd with ddof 1), as scipy.stats.ttest_rel; identical
    differences give [d, d] and p 1 (all zero) or 0."""
    from scipy.special import stdtr, stdtrit  # Student's t CDF and its inverse

    d = np.asarray(values_b, dtype=np.float64) - np.asarray(values_a, dtype=np.float64)
    if d.ndim != 1 or d.size < 2:
        raise StatsError(f"a paired t-interval needs at least 2 paired units, got {d.size}")
    mean, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size))
    if se == 0.0:
        return mean, mean, mean, 1.0 if mean == 0.0 else 0.0
    half = float(stdtrit(d.size - 1, (1.0 + level) / 2.0)) * se
    return mean, mean - half, mean + half, float(2.0 * stdtr(d.size - 1, -abs(mean) / se))


def pairwise_differences(estimator, resamples: int = RESAMPLES, seed: int = 0, level: float = LEVEL
                         ) -> tuple[np.ndarray, dict[tuple[int, int], Difference], np.ndarray]:
    """(point estimates (E,), {(a, b): Difference of b - a} for every pair a < b, the joint replicates (R, E)):
    a paired bootstrap on the joint replicates (percentile interval, `bootstrap_p`; McNemar's exact test where the
    units' outcomes are 0/1), or for `UnitMeans` the paired t-interval over units; `identical` where the two systems'
    per-unit results are the same (`same`: no discordant unit, so no test can reject)."""
    _check_resamples(resamples)
    point = estimator.point()
    reps = estimator.replicates(resamples, np.random.default_rng(seed))
    mcnemar = None
    if estimator.binary is not None:  # every pair's discordant counts at once: only_a[a, b] = #{a right, b wrong}
        c = estimator.binary.astype(np.float64)
        only_a = np.rint(c @ (1.0 - c).T).astype(np.int64)
        mcnemar = mcnemar_counts(only_a, only_a.T)
    out = {}
    for a in range(len(point)):
        for b in range(a + 1, len(point)):
            delta = float(point[b] - point[a])
            if estimator.t_test:
                _, low, high, p = paired_t(estimator.num[a], estimator.num[b], level)
            else:
                low, high = _quantiles(reps[:, b] - reps[:, a], level)
                p = bootstrap_p(reps[:, b] - reps[:, a])
            p_mcnemar = None if mcnemar is None else float(mcnemar[a, b])
            out[a, b] = Difference(delta, low, high, p, p_mcnemar, int(estimator.units), True, estimator.same(a, b))
    return point, out, reps


def rank_intervals(replicates: np.ndarray, level: float = LEVEL) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) (E,) percentiles of each system's rank over joint replicates (R, E): in each replicate rank 1 is
    the highest, a tie takes the best rank of the tied (1 + how many are strictly higher)."""
    ranks = 1 + (replicates[:, None, :] > replicates[:, :, None]).sum(axis=2)  # (R, E): j above i
    low, high = np.quantile(ranks, [(1.0 - level) / 2.0, (1.0 + level) / 2.0], axis=0, method="inverted_cdf")
    return low.astype(int), high.astype(int)


# ------------------------------------------------------------------------------------------ many tests at once


CORRECTIONS = ("holm", "bh", "none")


def adjust_p(p, method: str = "holm") -> np.ndarray:
    """p-values adjusted for the m tests they are: Holm's step-down (family-wise error; Holm 1979) or Benjamini-
    Hochberg's step-up (false discovery rate; Benjamini & Hochberg 1995), as statsmodels' multipletests
    ("holm", "fdr_bh"); "none" leaves them. NaN entries are not tests: they stay NaN and do not count in m."""
    p = np.asarray(p, dtype=np.float64)
    if method not in CORRECTIONS:
        raise StatsError(f"unknown correction {method!r}; known: {', '.join(CORRECTIONS)}")
    out = p.copy()
    ok = np.flatnonzero(np.isfinite(p))
    m = ok.size
    if method == "none" or m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    sorted_p = p[order]
    if method == "holm":
        adjusted = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * sorted_p))
    else:
        adjusted = np.minimum.accumulate((m / np.arange(1, m + 1) * sorted_p)[::-1])[::-1]
        adjusted = np.minimum(1.0, adjusted)
    out[order] = adjusted
    return out
