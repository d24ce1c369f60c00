"""The CLIP-paper linear probe (Radford et al. 2021, Appendix A.3) on precomputed image features.

Protocol (docs/protocols.md, "Linear probe"):

1. Optionally L2-normalise every feature vector (``normalize=True``, the default here; the paper and the
   CLIP README feed the raw encoder outputs, see the docs).
2. Multinomial logistic regression with scikit-learn's L-BFGS solver, ``max_iter=1000``, L2 penalty.
3. The inverse regularisation strength ``C`` is chosen on a validation split. The search space is the
   97 values ``C = 10**(k/8)``, ``k = -48..48`` (10^-6 .. 10^6, 8 per decade, 96 steps). Like the paper's
   "parametric binary search" it does not fit them all: it fits the 7 coarse values 10^-6, 10^-4, ..., 10^6,
   then halves the step around the best value so far (2 decades -> 1 -> 1/2 -> 1/4 -> 1/8), fitting the
   two neighbours at the new step each time: at most 7 + 4*2 = 15 fits. The best value is the one with the
   highest validation metric; ties go to the smallest C (the strongest regularisation).
   Passing ``c_grid`` instead fits every value of that grid (an exhaustive sweep).
   The search itself is :func:`coarse_to_fine_search`, a plain function of a scoring callable and an ordered
   grid, so other analyses (ELEVATER's learning-rate / weight-decay sweeps) reuse it with their own score.
4. The chosen C is refit on train + validation, and the refit model gives the test scores.

If no validation split is given, a stratified one (``val_fraction`` of each class, at least one sample of
each class left in train) is carved from train, deterministically from ``seed``; step 4 then refits on the
whole of train.

Everything is deterministic: L-BFGS is a deterministic solver and the split uses ``numpy.random.default_rng``.
Multi-label tasks are not implemented yet (raises ``NotImplementedError``).
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence, TypeVar

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from threadpoolctl import threadpool_limits

from vlbench import metrics
from vlbench.datasets.canonical import DatasetError
from vlbench.errors import VlbenchError
from vlbench.features import embedding_array
from vlbench.results import Result
from vlbench.stats import metric_interval

log = logging.getLogger(__name__)

__all__ = [
    "LinearProbe",
    "LinearProbeFit",
    "LinearProbeError",
    "SearchResult",
    "coarse_to_fine_search",
    "default_c_grid",
    "COARSE_EXPONENTS",
    "STEPS_PER_DECADE",
    "stratified_split",
    "fit_linear_probe",
    "evaluate_linear_probe",
]

STEPS_PER_DECADE = 8
MIN_EXPONENT, MAX_EXPONENT = -6, 6
# exponents in units of 1/STEPS_PER_DECADE decade: 10^-6, 10^-4, ..., 10^6
COARSE_EXPONENTS: tuple[int, ...] = tuple(range(MIN_EXPONENT * STEPS_PER_DECADE, MAX_EXPONENT * STEPS_PER_DECADE + 1,
                                                2 * STEPS_PER_DECADE))
MAX_ITER = 1000
SMALL_PROBLEM = 50_000_000  # samples x dims x classes below which one BLAS thread is faster


class LinearProbeError(VlbenchError):
    """Bad inputs to the linear probe (shapes, label values, too few samples or classes)."""


def _c_of(k: int) -> float:
    return float(10.0 ** (k / STEPS_PER_DECADE))


def default_c_grid() -> np.ndarray:
    """The 97 values ``10**(k/8)``, k = -48..48, that the default coarse-to-fine search draws from."""
    return np.array([_c_of(k) for k in range(MIN_EXPONENT * STEPS_PER_DECADE, MAX_EXPONENT * STEPS_PER_DECADE + 1)])


@dataclass
class LinearProbe:
    """A fitted probe: the scikit-learn classifier plus what is needed to score new features."""

    classifier: LogisticRegression
    C: float
    normalize: bool
    num_classes: int
    converged: bool

    def decision_function(self, x) -> np.ndarray:
        """Logits of shape (n, num_classes), column j for class index j.

        Classes absent from the training data get ``-inf``. For a two-class probe the logits are
        ``(0, z)`` with z scikit-learn's binary decision value, so ``softmax`` gives its probabilities and
        ``logit_1 - logit_0 = z``.
        """
        x = _prepare_features(x, "x", self.normalize, dim=self.classifier.n_features_in_)
        return self._logits(x)

    def _logits(self, x: np.ndarray) -> np.ndarray:
        """decision_function on features already cast (and normalised) by _prepare_features."""
        z = self.classifier.decision_function(x)
        classes = self.classifier.classes_
        out = np.full((x.shape[0], self.num_classes), -np.inf)
        if z.ndim == 1:  # binary
            out[:, classes[0]] = 0.0
            out[:, classes[1]] = z
        else:
            out[:, classes] = z
        return out


class LinearProbeFit(NamedTuple):
    """What :func:`fit_linear_probe` returns; unpacks as ``model, chosen_C, val_scores_per_C``."""

    model: LinearProbe
    chosen_C: float
    val_scores_per_C: dict[float, float]


# --------------------------------------------------------------------------------------------------
# input handling


def _prepare_features(x, name: str, normalize: bool, dim: int | None = None) -> np.ndarray:
    a = np.asarray(x)
    if a.ndim != 2:
        raise LinearProbeError(f"{name} must be a 2-D (n, d) feature array, got shape {a.shape}")
    if not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise LinearProbeError(f"{name} must be numeric, got dtype {a.dtype}")
    if a.shape[0] == 0:
        raise LinearProbeError(f"{name} has no samples")
    if dim is not None and a.shape[1] != dim:
        raise LinearProbeError(f"{name} has feature dimension {a.shape[1]}, expected {dim}")
    a = a.astype(np.float64)  # a copy: the caller's array is never modified
    if not np.isfinite(a).all():
        raise LinearProbeError(f"{name} contains NaN or infinite values")
    if normalize:
        norms = np.linalg.norm(a, axis=1, keepdims=True)
        a /= np.maximum(norms, np.finfo(np.float64).tiny)
    return a


def _prepare_labels(y, n: int, name: str) -> np.ndarray:
    a = np.asarray(y)
    if a.ndim == 2:
        raise NotImplementedError(
            f"{name} has shape {a.shape}: multi-label linear probes are not implemented yet; "
            "the CLIP linear probe here takes single-label integer class indices of shape (n,)"
        )
    if a.ndim != 1:
        raise LinearProbeError(f"{name} must be a 1-D array of class indices, got shape {a.shape}")
    if a.shape[0] != n:
        raise LinearProbeError(f"{name} has {a.shape[0]} labels but the features have {n} rows")
    if np.issubdtype(a.dtype, np.floating):
        if not (np.isfinite(a).all() and (a == np.round(a)).all()):
            raise LinearProbeError(f"{name} must hold integer class indices")
    elif not np.issubdtype(a.dtype, np.integer):
        raise LinearProbeError(f"{name} must hold integer class indices, got dtype {a.dtype}")
    a = a.astype(np.int64)
    if a.size and a.min() < 0:
        raise LinearProbeError(f"{name} contains negative class indices, e.g. {a[a < 0][:5].tolist()}")
    return a


def stratified_split(labels, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic stratified split of sample indices into (train_idx, val_idx), both sorted.

    Each class c with n_c samples puts ``min(round(val_fraction * n_c), n_c - 1)`` randomly chosen samples
    in validation (so a class with one sample stays in train). Classes are visited in increasing index
    order with one ``numpy.random.default_rng(seed)``.
    """
    y = np.asarray(labels)
    if not 0.0 < val_fraction < 1.0:
        raise LinearProbeError(f"val_fraction must be in (0, 1), got {val_fraction!r}")
    rng = np.random.default_rng(seed)
    val_parts = []
    for c in np.unique(y):
        idx = np.nonzero(y == c)[0]
        n_val = min(int(np.floor(val_fraction * idx.size + 0.5)), idx.size - 1)
        if n_val > 0:
            val_parts.append(rng.permutation(idx)[:n_val])
    val_idx = np.sort(np.concatenate(val_parts)) if val_parts else np.zeros(0, dtype=np.int64)
    train_mask = np.ones(y.shape[0], dtype=bool)
    train_mask[val_idx] = False
    return np.nonzero(train_mask)[0], val_idx


# --------------------------------------------------------------------------------------------------
# hyper-parameter search

T = TypeVar("T")


class SearchResult(NamedTuple):
    """What :func:`coarse_to_fine_search` returns; unpacks as ``best, trace``."""

    best: Any  # the chosen grid candidate
    trace: list[tuple[Any, float]]  # (candidate, score) of every evaluation, in the order they were made


def coarse_to_fine_search(score: Callable[[T], float], grid: Sequence[T], coarse_step: int) -> SearchResult:
    """Maximise ``score`` over the ordered candidates ``grid`` without evaluating all of them.

    1. Coarse pass: evaluate ``grid[0], grid[coarse_step], grid[2 * coarse_step], ...`` and the last
       candidate (if the stride does not land on it), in that order.
    2. Refinement: ``step = coarse_step``; while ``step > 1``: ``step //= 2``, take the best position
       ``i`` so far and evaluate ``grid[i - step]`` then ``grid[i + step]``, skipping positions outside
       the grid or already evaluated. With a power-of-two ``coarse_step`` the last round is at step 1, so
       the result is a local maximum at the grid's full resolution.

    ``coarse_step=1`` is an exhaustive sweep: every candidate once, in grid order, no refinement.

    "Best" is the highest score; ties go to the candidate **earliest in the grid** (for the linear
    probe's increasing C grid: the smallest C, the strongest regularisation). Each position is scored
    at most once. Scores should be ordinary numbers: a NaN compares unequal to everything, so it makes
    the choice depend on the evaluation order.

    The grid is one-dimensional and ``score`` closes over anything else; a 2-D search (ELEVATER's learning
    rate x weight decay) runs this once per axis, e.g. the learning rate at a fixed weight decay, then the
    weight decay at the chosen learning rate.

    Args:
        score: the objective, called as ``score(grid[i])``; larger is better.
        grid: the candidates in a meaningful order (e.g. increasing C on a log scale); must be non-empty.
        coarse_step: the stride of the coarse pass in grid positions (>= 1).

    Returns:
        ``SearchResult(best, trace)``: the best candidate and the ``(candidate, score)`` of every
        evaluation in the order made (coarse pass first, then each refinement round).
    """
    if len(grid) == 0:
        raise ValueError("coarse_to_fine_search needs a non-empty grid")
    if coarse_step < 1:
        raise ValueError(f"coarse_step must be >= 1, got {coarse_step!r}")
    n = len(grid)
    scores: dict[int, float] = {}  # grid position -> score, in evaluation order

    def evaluate(i: int) -> None:
        if 0 <= i < n and i not in scores:
            scores[i] = float(score(grid[i]))

    def best_position() -> int:  # highest score; among equal scores the earliest in the grid
        return min(scores, key=lambda i: (-scores[i], i))

    for i in range(0, n, coarse_step):
        evaluate(i)
    evaluate(n - 1)
    step = coarse_step
    while step > 1:
        step //= 2
        i_best = best_position()
        evaluate(i_best - step)
        evaluate(i_best + step)
    return SearchResult(grid[best_position()], [(grid[i], s) for i, s in scores.items()])


# --------------------------------------------------------------------------------------------------
# fitting


def _blas_threads(x: np.ndarray, num_classes: int) -> int | None:
    """One BLAS thread for small problems: on the demo's 2000 x 128 x 12 probes, OpenBLAS with 2 threads made
    L-BFGS 8.6x slower than with one (thread hand-off costs more than the tiny products). None: BLAS's default."""
    return 1 if x.shape[0] * x.shape[1] * num_classes < SMALL_PROBLEM else None


def _fit(x: np.ndarray, y: np.ndarray, C: float, num_classes: int, normalize: bool, seed: int) -> LinearProbe:
    clf = LogisticRegression(C=C, solver="lbfgs", max_iter=MAX_ITER, random_state=seed)
    with warnings.catch_warnings(), threadpool_limits(_blas_threads(x, num_classes), user_api="blas"):
        warnings.simplefilter("ignore", ConvergenceWarning)  # reported through `converged` instead
        clf.fit(x, y)
    converged = bool(np.all(np.asarray(clf.n_iter_) < MAX_ITER))
    return LinearProbe(classifier=clf, C=C, normalize=normalize, num_classes=num_classes, converged=converged)


def fit_linear_probe(
    train_x,
    train_y,
    val_x=None,
    val_y=None,
    *,
    c_grid: Sequence[float] | None = None,
    seed: int = 0,
    normalize: bool = True,
    metric: str = "accuracy",
    num_classes: int | None = None,
    val_fraction: float = 0.2,
    refit: bool = True,
) -> LinearProbeFit:
    """Choose C on validation data, then fit the final probe (see the module docstring).

    Args:
        train_x, train_y: (n, d) features and (n,) integer labels.
        val_x, val_y: the validation split; both None to carve a stratified ``val_fraction`` of train.
        c_grid: None for the coarse-to-fine search over :func:`default_c_grid`; a sequence of positive
            values for an exhaustive sweep over exactly those.
        seed: seeds the carved split (and scikit-learn's ``random_state``, unused by L-BFGS).
        normalize: L2-normalise each feature vector before fitting and scoring.
        metric: the :func:`vlbench.metrics.compute` name used to compare C values on validation
            (the dataset's metric).
        num_classes: width of the score matrix; default ``max label + 1`` over train and val.
        refit: refit the chosen C on train + val (True, the protocol), or return the probe trained on
            the train part only.

    Returns:
        ``LinearProbeFit(model, chosen_C, val_scores_per_C)``; ``val_scores_per_C`` maps every C that was
        fitted to its validation metric, in increasing C.
    """
    if metric not in metrics.METRIC_NAMES:
        raise ValueError(f"unknown metric {metric!r}; known metrics: {', '.join(metrics.METRIC_NAMES)}")
    x_fit, y_fit, x_va, y_va, num_classes = _prepare_splits(
        train_x, train_y, val_x, val_y, normalize=normalize, num_classes=num_classes,
        val_fraction=val_fraction, seed=seed,
    )
    not_converged: list[float] = []

    def score(C: float) -> float:  # validation metric of a probe fitted on the train part
        probe = _fit(x_fit, y_fit, C, num_classes, normalize, seed)
        if not probe.converged:
            not_converged.append(C)
        return float(metrics.compute(metric, probe._logits(x_va), y_va))

    chosen, trace = coarse_to_fine_search(score, *_c_search_space(c_grid))
    if not_converged:
        log.warning("linear probe: L-BFGS hit max_iter=%d for C in %s", MAX_ITER, sorted(not_converged))
    if refit:
        x_fit, y_fit = np.concatenate([x_fit, x_va]), np.concatenate([y_fit, y_va])
    model = _fit(x_fit, y_fit, chosen, num_classes, normalize, seed)
    if not model.converged:
        log.warning("linear probe: final fit with C=%g hit max_iter=%d", chosen, MAX_ITER)
    return LinearProbeFit(model, chosen, dict(sorted(trace)))


def _c_search_space(c_grid: Sequence[float] | None) -> tuple[list[float], int]:
    """(grid, coarse_step) for :func:`coarse_to_fine_search`: the default 97-value grid searched from every
    2 decades down, or the sorted distinct values of ``c_grid`` swept exhaustively."""
    if c_grid is None:
        return [float(C) for C in default_c_grid()], 2 * STEPS_PER_DECADE
    grid = np.asarray(list(c_grid), dtype=np.float64)
    if grid.ndim != 1 or grid.size == 0 or not np.all(np.isfinite(grid)) or np.any(grid <= 0):
        raise LinearProbeError(f"c_grid must be a non-empty sequence of positive finite numbers, got {c_grid!r}")
    return [float(C) for C in np.unique(grid)], 1


def _prepare_splits(train_x, train_y, val_x, val_y, *, normalize: bool, num_classes: int | None,
                    val_fraction: float, seed: int):
    """Validated float64 features and int64 labels: ``(x_fit, y_fit, x_val, y_val, num_classes)``.

    Without ``val_x``/``val_y`` the validation part is a stratified split carved from train."""
    x_tr = _prepare_features(train_x, "train_x", normalize)
    y_tr = _prepare_labels(train_y, x_tr.shape[0], "train_y")
    if (val_x is None) != (val_y is None):
        raise LinearProbeError("give both val_x and val_y, or neither (to carve a validation split from train)")
    if val_x is None:
        tr_idx, va_idx = stratified_split(y_tr, val_fraction, seed)
        if va_idx.size == 0:
            raise LinearProbeError(
                f"cannot carve a validation split from {y_tr.size} training samples "
                f"(val_fraction={val_fraction}); pass val_x/val_y"
            )
        x_fit, y_fit, x_va, y_va = x_tr[tr_idx], y_tr[tr_idx], x_tr[va_idx], y_tr[va_idx]
    else:
        x_va = _prepare_features(val_x, "val_x", normalize, dim=x_tr.shape[1])
        y_va = _prepare_labels(val_y, x_va.shape[0], "val_y")
        x_fit, y_fit = x_tr, y_tr
    if np.unique(y_fit).size < 2:
        raise LinearProbeError(f"the training data has {np.unique(y_fit).size} class(es); a probe needs at least 2")

    max_label = int(max(y_tr.max(), y_va.max()))
    if num_classes is None:
        num_classes = max_label + 1
    elif max_label >= num_classes:
        raise LinearProbeError(f"labels go up to {max_label} but num_classes={num_classes}")
    return x_fit, y_fit, x_va, y_va, num_classes


def evaluate_linear_probe(model: LinearProbe, test_x) -> np.ndarray:
    """Test scores: (n, num_classes) logits for :func:`vlbench.metrics.compute`."""
    return model.decision_function(test_x)


def predictions_table(test_table, label_column: str, scores: np.ndarray):
    """Per test sample: `sample_id`, its label, the predicted class (argmax, ties to the lower index) and the logits
    (-inf for classes the probe never saw): reports/linear_probe/<dataset>.predictions.parquet, for paired tests."""
    import pyarrow as pa

    return pa.table({"sample_id": test_table.column("sample_id"), label_column: test_table.column(label_column),
                     "predicted": pa.array(scores.argmax(axis=1), pa.int64()), "logits": embedding_array(scores)})


def run(inputs, cfg, seed: int):
    """The linear_probe analysis: fit on `train_split`, choose C on `val_split` (carved from train when the
    dataset has none), score `test_split` with the dataset's metric."""
    meta = inputs.meta
    if meta.multi_label:
        raise DatasetError(f"dataset {meta.name!r} is multi-label; the linear probe takes single-label datasets")
    train, test = inputs.images(cfg["train_split"]), inputs.images(cfg["test_split"])
    val = inputs.images(cfg["val_split"]) if inputs.has_split(cfg["val_split"]) else None
    labels = {name: f.table.column(meta.label_column).to_numpy() for name, f in (("train", train), ("test", test), ("val", val)) if f}
    fit = fit_linear_probe(train.embeddings, labels["train"], val.embeddings if val else None, labels.get("val"),
                           seed=seed, metric=meta.metric, num_classes=len(meta.classes))
    scores = evaluate_linear_probe(fit.model, test.embeddings)
    return Result(
        metrics={meta.metric: float(metrics.compute(meta.metric, scores, labels["test"]))},
        intervals={meta.metric: metric_interval(meta.metric, scores, labels["test"], seed=seed).to_json()},
        tables={"predictions": predictions_table(test.table, meta.label_column, scores)},
        counts={"train": train.table.num_rows, "val": val.table.num_rows if val else 0,
                "test": test.table.num_rows, "classes": len(meta.classes)},
        params={**cfg, "val_split": cfg["val_split"] if val else "carved from train", "chosen_C": fit.chosen_C},
    )
