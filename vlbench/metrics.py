"""Evaluation metrics as plain numpy functions (see docs/protocols.md, "Metrics").

Conventions shared by every function here:

- ``scores`` is an ``(n, C)`` float array: one row per sample, one column per class, higher means more
  likely (logits, cosine similarities or probabilities; the metrics only use the order of the scores,
  except ``roc_auc`` which uses a difference of two columns, see there). NaN is refused; +-inf is allowed.
- single-label ``labels`` is an ``(n,)`` integer array with values in ``[0, C)``;
- multi-label ``targets`` is an ``(n, C)`` 0/1 (or bool) indicator array. The prepared-dataset format
  stores multi-label samples as lists of class indices; :func:`multilabel_indicator` converts those.

Ties in scores never depend on the order of the samples: top-k breaks ties between classes towards the
lower class index (like ``np.argmax``), and the ranking metrics (AP, 11-point AP, ROC-AUC) treat tied
samples as one threshold step (they are either all above or all below any threshold).

Every shape or value problem raises :class:`MetricError` (a ``ValueError``) with a message that says what
was expected and what came.

Two conventions (``CONVENTIONS``) differ for the ranking metrics only: ``"default"`` (the VOC2007 devkit's 11-point
AP; ROC-AUC on the difference of the two columns) and ``"elevater"``, which reproduces ELEVATER's toolkit
(``vision_evaluation`` 0.2.9): its 11-point AP counts precision 1 at recall 0, and its ROC-AUC ranks by column 1
alone. Accuracy and mean-per-class are the same under both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from statistics import NormalDist

import numpy as np

from vlbench.errors import VlbenchError

__all__ = [
    "CONVENTIONS",
    "METRIC_NAMES",
    "MetricError",
    "accuracy",
    "ap_11point_per_class",
    "average_precision_per_class",
    "compute",
    "datacomp_average",
    "f1_macro",
    "fairness_metrics",
    "fairness_outcomes",
    "fairness_table",
    "map_11point",
    "mean_average_precision",
    "mean_confidence_interval",
    "mean_per_class_accuracy",
    "mean_recall_at_1",
    "multilabel_indicator",
    "roc_auc",
    "winogavil_jaccard",
    "winogavil_case",
    "worst_group_accuracy",
    "worst_group_top5",
]


class MetricError(VlbenchError):
    """Inputs to a metric have the wrong shape, type or values."""


# --------------------------------------------------------------------------------------------------
# validation helpers


def _as_scores(scores, name: str = "scores") -> np.ndarray:
    s = np.asarray(scores)
    if s.ndim != 2:
        raise MetricError(f"{name} must be a 2-D (n, C) array, got shape {s.shape}")
    if s.shape[1] == 0:
        raise MetricError(f"{name} has no class columns (shape {s.shape})")
    if not (np.issubdtype(s.dtype, np.floating) or np.issubdtype(s.dtype, np.integer)
            or s.dtype == np.bool_):
        raise MetricError(f"{name} must be numeric, got dtype {s.dtype}")
    s = s.astype(np.float64, copy=False)
    if np.isnan(s).any():
        raise MetricError(f"{name} contains NaN ({int(np.isnan(s).sum())} entries)")
    return s


def _as_int_labels(labels, n: int, num_classes: int, name: str = "labels") -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1:
        raise MetricError(
            f"{name} must be a 1-D array of class indices, got shape {y.shape}"
            + (" (a 2-D array looks like multi-label targets; use map_11point)" if y.ndim == 2 else "")
        )
    if y.shape[0] != n:
        raise MetricError(f"{name} has {y.shape[0]} entries but scores have {n} rows")
    if np.issubdtype(y.dtype, np.floating):
        if not np.all(np.isfinite(y)) or not np.all(y == np.round(y)):
            raise MetricError(f"{name} must hold integer class indices, got non-integral floats")
        y = y.astype(np.int64)
    elif not (np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_):
        raise MetricError(f"{name} must hold integer class indices, got dtype {y.dtype}")
    y = y.astype(np.int64, copy=False)
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        bad = y[(y < 0) | (y >= num_classes)]
        raise MetricError(
            f"{name} out of range: scores have {num_classes} classes (valid labels 0..{num_classes - 1}), "
            f"got e.g. {bad[:5].tolist()}"
        )
    return y


def _as_targets(targets, shape: tuple[int, int], name: str = "targets") -> np.ndarray:
    t = np.asarray(targets)
    if t.ndim != 2:
        raise MetricError(f"{name} must be a 2-D (n, C) 0/1 indicator array, got shape {t.shape}")
    if t.shape != shape:
        raise MetricError(f"{name} has shape {t.shape} but scores have shape {shape}")
    if not np.isin(t, (0, 1)).all():
        raise MetricError(f"{name} must contain only 0 and 1 (or bool)")
    return t.astype(bool)


CONVENTIONS = ("default", "elevater")


def _check_convention(convention: str) -> None:
    if convention not in CONVENTIONS:
        raise MetricError(f"unknown metric convention {convention!r}; known: {', '.join(CONVENTIONS)}")


def _check_nonempty(n: int, what: str) -> None:
    if n == 0:
        raise MetricError(f"{what} of zero samples is undefined")


def multilabel_indicator(label_lists: Iterable[Sequence[int]], num_classes: int) -> np.ndarray:
    """Turn per-sample lists of class indices (the prepared ``labels`` column) into an (n, C) 0/1 array."""
    rows = list(label_lists)
    out = np.zeros((len(rows), num_classes), dtype=np.int8)
    for i, row in enumerate(rows):
        idx = np.asarray(list(row), dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= num_classes):
            raise MetricError(f"sample {i}: class indices {idx.tolist()} out of range 0..{num_classes - 1}")
        out[i, idx] = 1
    return out


# --------------------------------------------------------------------------------------------------
# single-label metrics


def accuracy(scores, labels, k: int = 1) -> float:
    """Top-k accuracy in [0, 1]: the fraction of samples whose true class is among the k highest scores.

    Ties between classes are broken towards the lower class index (the order of a stable descending sort,
    and what ``np.argmax`` does for k=1): the true class y is in the top k iff
    ``#{j: s_j > s_y} + #{j < y: s_j == s_y} < k``. ``k >= C`` gives 1.0.
    """
    s = _as_scores(scores)
    n, c = s.shape
    y = _as_int_labels(labels, n, c)
    _check_nonempty(n, "accuracy")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise MetricError(f"k must be a positive integer, got {k!r}")
    return float(np.mean(topk_correct(s, y, k)))


def topk_correct(scores: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """(n,) bool: whether each sample's true class is among its k highest scores (ties as in :func:`accuracy`)."""
    c = scores.shape[1]
    true_score = scores[np.arange(scores.shape[0]), labels][:, None]
    higher = (scores > true_score).sum(axis=1)
    tied_before = ((scores == true_score) & (np.arange(c)[None, :] < labels[:, None])).sum(axis=1)
    return higher + tied_before < k


def mean_per_class_accuracy(scores, labels) -> float:
    """Mean over classes of the per-class top-1 recall (a.k.a. balanced accuracy).

    Only classes that occur in ``labels`` are averaged (a class with no test sample has no recall);
    this equals ``sklearn.metrics.balanced_accuracy_score(labels, scores.argmax(1))`` and ELEVATER's
    "mean-per-class". Prediction is ``argmax`` with ties to the lower class index.
    """
    s = _as_scores(scores)
    n, c = s.shape
    y = _as_int_labels(labels, n, c)
    _check_nonempty(n, "mean-per-class accuracy")
    pred = s.argmax(axis=1)
    support = np.bincount(y, minlength=c)
    correct = np.bincount(y[pred == y], minlength=c)
    present = support > 0
    return float(np.mean(correct[present] / support[present]))


# --------------------------------------------------------------------------------------------------
# ranking metrics (multi-label / binary)


def _pr_steps(score: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative (TP, FP) counts at every distinct score threshold, highest threshold first.

    Samples with equal scores form one step, so the result does not depend on sample order.
    """
    order = np.argsort(-score, kind="stable")
    s = score[order]
    p = positive[order]
    tp = np.cumsum(p, dtype=np.int64)
    fp = np.cumsum(~p, dtype=np.int64)
    # last index of every group of equal scores
    ends = np.r_[np.nonzero(s[1:] != s[:-1])[0], s.size - 1]
    return tp[ends], fp[ends]


def ap_11point_per_class(scores, targets, convention: str = "default") -> np.ndarray:
    """PASCAL VOC2007 11-point interpolated average precision of every class, shape (C,).

    For class c, rank the samples by ``scores[:, c]``; precision and recall are taken at every distinct
    score threshold. ``AP = mean over r in {0, 0.1, ..., 1.0} of max{precision at recall >= r}`` (0 when no
    threshold reaches recall r), as in the VOC2007 devkit (``VOCevalcls.m``). Two details:

    - the comparison ``recall >= r`` is done exactly in integers (``10*TP >= k*P`` for r = k/10): a float
      comparison with ``0.1*k`` (MATLAB's ``0:0.1:1`` or ``np.linspace``) misses e.g. recall 3/10 at
      r = 0.30000000000000004;
    - tied scores are one threshold (the devkit walks samples one by one, so its result among ties depends on
      the sort order; with no ties the two agree).

    A class with no positive sample has no AP: its entry is NaN.

    ``convention="elevater"``: ELEVATER's evaluator (``vision_evaluation.MeanAveragePrecisionNPointsEvaluator``)
    builds the curve with ``sklearn.metrics.precision_recall_curve``, which appends a (recall 0, precision 1)
    point, so its r = 0 term is always 1: it exceeds the devkit's AP by ``(1 - max precision) / 11`` when the
    top-ranked sample is a negative. Everything else agrees (its float thresholds ``np.linspace(1, 0, 11)``
    compare like the exact integers here). The default follows the devkit.
    """
    _check_convention(convention)
    s = _as_scores(scores)
    t = _as_targets(targets, s.shape)
    n, c = s.shape
    _check_nonempty(n, "average precision")
    out = np.full(c, np.nan)
    ks = np.arange(11)
    for j in range(c):
        pos = t[:, j]
        n_pos = int(pos.sum())
        if n_pos == 0:
            continue
        tp, fp = _pr_steps(s[:, j], pos)
        precision = tp / (tp + fp)
        # reached[k, i]: threshold i has recall >= k/10
        reached = 10 * tp[None, :] >= ks[:, None] * n_pos
        interp = np.where(reached, precision[None, :], 0.0).max(axis=1)
        if convention == "elevater":
            interp[0] = 1.0  # scikit-learn's (recall 0, precision 1) point
        out[j] = interp.mean()
    return out


def map_11point(scores, targets, convention: str = "default") -> float:
    """Mean over classes of :func:`ap_11point_per_class` (VOC2007 classification mAP).

    Classes without any positive sample in ``targets`` are left out of the mean (their AP is undefined), as
    ELEVATER's evaluator also does (``vision_evaluation`` drops all-zero target columns before averaging).
    Raises if no class has a positive. Use :func:`ap_11point_per_class` for per-class values.
    """
    ap = ap_11point_per_class(scores, targets, convention)
    if np.isnan(ap).all():
        raise MetricError("map_11point: no class has a positive sample in targets")
    return float(np.nanmean(ap))


def average_precision_per_class(scores, targets) -> np.ndarray:
    """Non-interpolated average precision of every class, shape (C,); NaN for classes without positives.

    ``AP = sum over thresholds of (R_i - R_{i-1}) * P_i`` with tied scores as one threshold: the same
    definition as ``sklearn.metrics.average_precision_score``.
    """
    s = _as_scores(scores)
    t = _as_targets(targets, s.shape)
    n, c = s.shape
    _check_nonempty(n, "average precision")
    out = np.full(c, np.nan)
    for j in range(c):
        pos = t[:, j]
        n_pos = int(pos.sum())
        if n_pos == 0:
            continue
        tp, fp = _pr_steps(s[:, j], pos)
        precision = tp / (tp + fp)
        recall_gain = np.diff(np.r_[0, tp]) / n_pos
        out[j] = float(np.sum(recall_gain * precision))
    return out


def mean_average_precision(scores, targets) -> float:
    """Mean over classes with at least one positive of :func:`average_precision_per_class`."""
    ap = average_precision_per_class(scores, targets)
    if np.isnan(ap).all():
        raise MetricError("mean_average_precision: no class has a positive sample in targets")
    return float(np.nanmean(ap))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks of x in ascending order, ties getting the mean of the ranks they span."""
    order = np.argsort(x, kind="stable")
    xs = x[order]
    starts = np.r_[0, np.nonzero(xs[1:] != xs[:-1])[0] + 1]
    ends = np.r_[starts[1:], xs.size]  # exclusive
    group_rank = (starts + ends + 1) / 2.0  # mean of start+1 .. end
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.repeat(group_rank, ends - starts)
    return ranks


def binary_decision(scores, convention: str) -> np.ndarray:
    """The (n,) value ROC-AUC ranks by: a 1-D input as it is; of (n, 2) scores, column 1 minus column 0, or under
    the "elevater" convention column 1 alone."""
    _check_convention(convention)
    arr = np.asarray(scores)
    if arr.ndim == 1:
        return _as_scores(arr[:, None])[:, 0]
    s2 = _as_scores(arr)
    if s2.shape[1] != 2:
        raise MetricError(f"roc_auc is for binary tasks: scores must have 2 columns, got shape {s2.shape}")
    if convention == "elevater":
        return s2[:, 1]
    with np.errstate(invalid="ignore"):
        decision = s2[:, 1] - s2[:, 0]
    if np.isnan(decision).any():
        raise MetricError("roc_auc: a row has the same infinite score in both columns")
    return decision


def roc_auc(scores, labels, convention: str = "default") -> float:
    """Area under the ROC curve of a binary task.

    ``scores`` is (n, 2) (or (n,) already holding the score of class 1); the decision value is
    ``scores[:, 1] - scores[:, 0]``. For logits this is the log-odds of class 1, a monotone function of the
    softmax probability of class 1, so in exact arithmetic the AUC equals that of ``softmax(scores)[:, 1]``
    while also being right for raw scores, where ``scores[:, 1]`` alone would ignore class 0's score.
    ``convention="elevater"`` ranks by ``scores[:, 1]`` alone, as ELEVATER's ``roc_auc`` does (it passes the
    softmax probability of class 1 to ``sklearn.metrics.roc_auc_score``): meant for probabilities, whose
    float32 rounding can tie samples that the logit difference tells apart.

    Computed as the Mann-Whitney U statistic with average ranks for ties:
    ``AUC = (sum of positive ranks - P(P+1)/2) / (P*N)``, i.e. P(s_pos > s_neg) + 0.5 P(s_pos == s_neg).
    ``labels`` must hold 0/1 and contain both classes.
    """
    decision = binary_decision(scores, convention)
    n = decision.shape[0]
    y = _as_int_labels(labels, n, 2)
    n_pos = int(y.sum())
    n_neg = n - n_pos
    if n_pos == 0 or n_neg == 0:
        raise MetricError(f"roc_auc needs both classes in labels, got {n_pos} positives and {n_neg} negatives")
    ranks = _average_ranks(decision)
    u = ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


# --------------------------------------------------------------------------------------------------
# DataComp's main metrics (mlfoundations/datacomp: tasklist.yml `main_metric`, eval_utils/*.py; docs/protocols.md
# "DataComp's 38 tasks")


def f1_macro(scores, labels) -> float:
    """iWildCam's `F1-macro_all` (WILDS' `F1(average="macro")`): the unweighted mean over the classes that occur in
    `labels` of each class's F1 of the argmax prediction (ties to the lower index), as
    ``sklearn.metrics.f1_score(labels, pred, average="macro", labels=np.unique(labels))``. A class never predicted
    has precision 0/0, counted 0 (scikit-learn's default), so its F1 is 0; predictions of classes absent from the
    labels count against the present classes' precision only through their own false positives, which they are not."""
    s = _as_scores(scores)
    n, c = s.shape
    y = _as_int_labels(labels, n, c)
    _check_nonempty(n, "macro F1")
    pred = s.argmax(axis=1)
    return float(np.mean(f1_per_class(y, pred, c)[np.bincount(y, minlength=c) > 0]))


def f1_per_class(y: np.ndarray, pred: np.ndarray, c: int, weights: np.ndarray | None = None) -> np.ndarray:
    """(C,) F1 of each class (0 where it has no true positive), from (weighted) labels and predictions."""
    tp = np.bincount(y[pred == y], weights=None if weights is None else weights[pred == y], minlength=c)
    support = np.bincount(y, weights=weights, minlength=c)
    predicted = np.bincount(pred, weights=weights, minlength=c)
    denominator = support + predicted
    return np.divide(2.0 * tp, denominator, out=np.zeros(c), where=denominator > 0)


def _as_groups(groups, n: int) -> np.ndarray:
    g = np.asarray(groups)
    if g.shape != (n,):
        raise MetricError(f"groups must be a 1-D array of one group per sample ({n}), got shape {g.shape}"
                          + (" (a group metric needs the dataset's `group` column)" if groups is None else ""))
    return g


def group_values(values, groups) -> dict:
    """{group: mean of `values` over its samples}, for every group that has a sample (sorted by group)."""
    v = np.asarray(values, dtype=np.float64)
    g = _as_groups(groups, v.shape[0])
    return {key: float(v[g == key].mean()) for key in np.unique(g).tolist()}


def worst_group_accuracy(scores, labels, groups, k: int = 1) -> float:
    """The lowest top-k accuracy over the groups that have a test sample: FMoW's `acc_worst_region` and GeoDE's
    `acc_wg` (k=1, groups = region), Dollar Street's `acc_top5_wg` (k=5, groups = income bucket). WILDS' groupers
    count every group value, and its worst-group metric takes the minimum over the groups with a sample."""
    s = _as_scores(scores)
    n, c = s.shape
    y = _as_int_labels(labels, n, c)
    _check_nonempty(n, "worst-group accuracy")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise MetricError(f"k must be a positive integer, got {k!r}")
    return min(group_values(topk_correct(s, y, k), groups).values())


def worst_group_top5(scores, labels, groups) -> float:
    """Dollar Street's main metric: :func:`worst_group_accuracy` with k=5."""
    return worst_group_accuracy(scores, labels, groups, k=5)


def winogavil_jaccard(cases, min_candidates: int = 10) -> float:
    """WinoGAViL's `jaccard_score_10-12` (DataComp eval_utils/wino_eval.py): for each case, a (candidates,) array of
    the cue's scores against its candidate images and a (candidates,) 0/1 array marking the true associations; the
    model picks the m highest-scored candidates, m the number of true associations (a stable sort: of tied scores the
    later candidate is picked, as `np.argsort(...)[-m:]` does on distinct values), and the case scores the Jaccard
    index |picked & true| / |picked | true| (`winogavil_case`). The mean over the cases with at least
    `min_candidates` candidates (the 10- and 12-candidate cases)."""
    scores = []
    for i, (case_scores, truth) in enumerate(cases):
        picked, score = winogavil_case(case_scores, truth, f"WinoGAViL case {i}")
        if picked.size >= min_candidates:
            scores.append(score)
    if not scores:
        raise MetricError(f"WinoGAViL: no case with at least {min_candidates} candidates")
    return float(np.mean(scores))


def winogavil_case(case_scores, truth, what: str = "WinoGAViL case") -> tuple[np.ndarray, float]:
    """(the candidates picked, 0/1, and the Jaccard index) of one WinoGAViL case (`winogavil_jaccard`)."""
    sc, t = np.asarray(case_scores, dtype=np.float64), np.asarray(truth).astype(bool)
    if sc.ndim != 1 or sc.shape != t.shape or not t.any():
        raise MetricError(f"{what}: need 1-D scores and 0/1 associations of one length with at least one "
                          f"association, got shapes {sc.shape} and {t.shape}")
    picked = np.zeros(sc.size, bool)
    picked[np.argsort(sc, kind="stable")[-int(t.sum()):]] = True
    return picked, float((picked & t).sum() / (picked | t).sum())


def mean_recall_at_1(i2t_r1: float, t2i_r1: float) -> float:
    """Flickr's and MSCOCO's `mean_recall@1` (DataComp eval_utils/retr_eval.py): the mean of text retrieval
    Recall@1 (image to text) and image retrieval Recall@1 (text to image)."""
    return 0.5 * (float(i2t_r1) + float(t2i_r1))


# DataComp's FairFaceEvaluator (eval_utils/fairness_eval.py), for FairFace and UTKFace alike
FAIRNESS_OBJECTIVES = ("race", "gender", "age", "toxic")  # FF_PRED_LABELS: the objectives predicted per face
FAIRNESS_METADATA = ("age", "gender", "race", "race_binary")  # its metadata fields: the shards' .npy elements
FAIRNESS_WHITE = 1  # the race class 'white' (fairness_tables.py RACES); `race != 1` is the non-white prediction
TOXIC_NONHUMAN, TOXIC_CRIME = 14, 18  # toxic classes 14..17 are non-human, 18 and above crime-related


def fairness_outcomes(predicted, metadata) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{DataComp's metric name: (per-sample 0/1 outcome, per-sample group as WILDS names it)} of FairFace's and
    UTKFace's evaluation, from `predicted` {objective: (n,) class index within the objective (the argmax over its own
    classes)} and `metadata` {field: (n,) int} (FAIRNESS_METADATA):

    - `acc_race` (Table 3): the binary prediction non-white (predicted race != white) right about `race_binary`;
      `acc_gender`, `acc_age` (Table 4): the predicted class right; each grouped by `race_binary:<0|1>`
      (0 white, 1 non-white);
    - `acc_gender_x` (Table 5): gender right, grouped by `race:<r>_gender:<g>`;
    - `toxicity_crime`, `toxicity_nonhuman` (Table 6): the face's toxic prediction is crime-related (class >= 18), or
      non-human (14..17), grouped by `race:<r>`.
    Each is reported as `fairness_table`'s `<name>_avg` and `<name>_<group>`."""
    missing = [k for k in FAIRNESS_OBJECTIVES if k not in predicted] + [k for k in FAIRNESS_METADATA
                                                                         if k not in metadata]
    if missing:
        raise MetricError(f"the fairness metrics need predictions of {list(FAIRNESS_OBJECTIVES)} and metadata "
                          f"{list(FAIRNESS_METADATA)}; missing {missing}")
    p = {k: np.asarray(predicted[k], dtype=np.int64) for k in FAIRNESS_OBJECTIVES}
    m = {k: np.asarray(metadata[k], dtype=np.int64) for k in FAIRNESS_METADATA}
    if len({v.shape for v in (*p.values(), *m.values())}) != 1 or p["race"].ndim != 1:
        raise MetricError("the fairness metrics need one prediction and one metadata value per sample for each")
    binary = np.array([f"race_binary:{v}" for v in m["race_binary"]])
    race_gender = np.array([f"race:{r}_gender:{g}" for r, g in zip(m["race"], m["gender"])])
    race = np.array([f"race:{r}" for r in m["race"]])
    return {"acc_race": ((p["race"] != FAIRNESS_WHITE) == m["race_binary"], binary),
            "acc_gender": (p["gender"] == m["gender"], binary),
            "acc_age": (p["age"] == m["age"], binary),
            "acc_gender_x": (p["gender"] == m["gender"], race_gender),
            "toxicity_crime": (p["toxic"] >= TOXIC_CRIME, race),
            "toxicity_nonhuman": ((p["toxic"] >= TOXIC_NONHUMAN) & (p["toxic"] < TOXIC_CRIME), race)}


def fairness_table(name: str, outcome, groups) -> dict[str, float]:
    """`<name>_avg` (the mean outcome), `<name>_<group>` for every group with a sample and, for an accuracy
    (`acc_*`), `<name>_wg`, the lowest group's (WILDS' standard_group_eval, as DataComp reports them)."""
    per_group = group_values(np.asarray(outcome, dtype=np.float64), groups)
    out = {f"{name}_avg": float(np.mean(outcome)), **{f"{name}_{g}": v for g, v in per_group.items()}}
    if name.startswith("acc_"):
        out[f"{name}_wg"] = min(per_group.values())
    return out


def fairness_metrics(predicted, metadata) -> dict[str, float]:
    """Every number of DataComp's FairFace / UTKFace evaluation (`fairness_outcomes`, `fairness_table`)."""
    return {k: v for name, (outcome, groups) in fairness_outcomes(predicted, metadata).items()
            for k, v in fairness_table(name, outcome, groups).items()}


# DataComp's aggregate_scores.py: its task groups by the display names of tasklist.yml
DATACOMP_GROUPS = {
    "ImageNet dist. shifts": ("ImageNet Sketch", "ImageNet v2", "ImageNet-A", "ImageNet-O", "ImageNet-R", "ObjectNet"),
    "VTAB": ("Caltech-101", "CIFAR-100", "CLEVR Counts", "CLEVR Distance", "Describable Textures", "EuroSAT",
             "KITTI Vehicle Distance", "Oxford Flowers-102", "Oxford-IIIT Pet", "PatchCamelyon", "RESISC45", "SVHN",
             "SUN397"),
    "Retrieval": ("Flickr", "MSCOCO", "WinoGAViL"),
}
# the 38 tasks of DataComp's tasklist.yml with a main metric, by its display names (FairFace, UTKFace have none)
DATACOMP_TASKS = (
    "Caltech-101", "CIFAR-10", "CIFAR-100", "CLEVR Counts", "CLEVR Distance", "Country211", "Describable Textures",
    "EuroSAT", "FGVC Aircraft", "Food-101", "GTSRB", "ImageNet 1k", "ImageNet Sketch", "ImageNet v2", "ImageNet-A",
    "ImageNet-O", "ImageNet-R", "KITTI Vehicle Distance", "MNIST", "ObjectNet", "Oxford Flowers-102",
    "Oxford-IIIT Pet", "Pascal VOC 2007", "PatchCamelyon", "Rendered SST2", "RESISC45", "Stanford Cars", "STL-10",
    "SUN397", "SVHN", "Flickr", "MSCOCO", "WinoGAViL", "iWildCam", "Camelyon17", "FMoW", "Dollar Street", "GeoDE")


def datacomp_average(main_metrics) -> dict[str, float]:
    """DataComp's aggregate (aggregate_scores.py) of {task display name: main metric} over exactly its 38 tasks:
    `ImageNet` (ImageNet 1k), the unweighted mean of each of `DATACOMP_GROUPS`, and `Average`, the unweighted mean of
    all 38 main metrics (FairFace and UTKFace have none and are not among them)."""
    results = {str(k): float(v) for k, v in dict(main_metrics).items()}
    missing, extra = sorted(set(DATACOMP_TASKS) - set(results)), sorted(set(results) - set(DATACOMP_TASKS))
    if missing or extra:
        raise MetricError(f"the DataComp average needs exactly its {len(DATACOMP_TASKS)} tasks (names as in DataComp's "
                          f"tasklist.yml); missing {missing}, not among them {extra}")
    bad = sorted(k for k, v in results.items() if not np.isfinite(v))
    if bad:
        raise MetricError(f"the DataComp average: task(s) {bad} have no finite main metric")
    out = {"ImageNet": results["ImageNet 1k"]}
    out.update({group: float(np.mean([results[t] for t in tasks])) for group, tasks in DATACOMP_GROUPS.items()})
    out["Average"] = float(np.mean(list(results.values())))
    return out


# --------------------------------------------------------------------------------------------------
# dispatcher


_METRICS: dict[str, Callable[..., float]] = {
    "accuracy": accuracy,
    "mean_per_class": mean_per_class_accuracy,
    "map_11point": map_11point,
    "roc_auc": roc_auc,
    "f1_macro": f1_macro,
    "worst_group_accuracy": worst_group_accuracy,
    "worst_group_top5": worst_group_top5,
}
GROUP_METRICS = ("worst_group_accuracy", "worst_group_top5")  # computed over the dataset's per-sample `group`
METRIC_NAMES: tuple[str, ...] = tuple(_METRICS)
# dataset metrics computed from cases, not from (n, C) scores and labels: WinoGAViL's Jaccard, each instance's candidate
# images scored against its own cue only (`winogavil_jaccard`; the zero-shot analysis' evaluate_winogavil)
CASE_METRICS = ("winogavil_jaccard",)


_CONVENTION_DEPENDENT = ("map_11point", "roc_auc")


def compute(metric_name: str, scores, labels, convention: str = "default", groups=None) -> float:
    """Compute the named dataset metric (the ``metric`` field of a prepared dataset's classes.json).

    ``accuracy`` (top-1) and ``mean_per_class`` take integer labels, ``map_11point`` takes (n, C) 0/1 targets,
    ``roc_auc`` takes (n, 2) scores and 0/1 labels; ``f1_macro`` integer labels; the `GROUP_METRICS` integer labels
    and `groups`, one group per sample (the dataset's `group` column). An unknown name raises ``ValueError``
    listing the names.
    ``convention`` (one of ``CONVENTIONS``) reaches the ranking metrics; the others do not depend on it.
    """
    if metric_name in CASE_METRICS:
        raise ValueError(f"metric {metric_name!r} is computed from cases (each instance's candidates against its own "
                         f"cue), by the zero-shot analysis only; it has no (scores, labels) form")
    try:
        fn = _METRICS[metric_name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown metric {metric_name!r}; known metrics: {', '.join(METRIC_NAMES)}") from None
    _check_convention(convention)
    if metric_name in _CONVENTION_DEPENDENT:
        return fn(scores, labels, convention)
    if metric_name in GROUP_METRICS:
        return fn(scores, labels, groups)
    return fn(scores, labels)


# --------------------------------------------------------------------------------------------------
# confidence intervals


def mean_confidence_interval(values, confidence: float = 0.95, ddof: int = 1) -> tuple[float, float]:
    """Mean and half-width of a normal-approximation confidence interval: ``z * std / sqrt(n)``.

    This is the few-shot convention (FewTrans and the code it builds on report
    ``1.96 * std(accs) / sqrt(n_episodes)`` over 600 episodes). ``z`` is exactly 1.96 for
    ``confidence=0.95`` (the literal the papers use, not 1.959964...) and the standard normal quantile
    ``Phi^-1((1 + confidence) / 2)`` otherwise.

    ``std`` is the sample standard deviation, ``ddof=1``: FewTrans' code (CloserLookAgainFewShot) uses
    ``torch.std``, whose default is the unbiased (n-1) estimator, and it is the textbook standard error.
    Some numpy-based few-shot code uses ``np.std`` (ddof=0); pass ``ddof=0`` to match it (at n=600 the two
    differ by a factor sqrt(600/599), i.e. 0.08%). Needs at least ``ddof + 1`` values.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1:
        raise MetricError(f"values must be 1-D, got shape {v.shape}")
    if not np.all(np.isfinite(v)):
        raise MetricError("values must be finite")
    if not 0.0 < confidence < 1.0:
        raise MetricError(f"confidence must be in (0, 1), got {confidence!r}")
    if ddof < 0:
        raise MetricError(f"ddof must be >= 0, got {ddof}")
    n = v.size
    if n < ddof + 1 or n == 0:
        raise MetricError(f"a confidence interval needs at least {max(ddof + 1, 1)} values, got {n}")
    z = 1.96 if confidence == 0.95 else NormalDist().inv_cdf((1.0 + confidence) / 2.0)
    half = z * float(np.std(v, ddof=ddof)) / math.sqrt(n)
    return float(v.mean()), float(half)
