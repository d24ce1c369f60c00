import math

import numpy as np
import pytest
from sklearn.metrics import (
    average_precision_score,
    balanced_accuracy_score,
    roc_auc_score,
)

from vlbench import metrics as M

# ---------------------------------------------------------------- accuracy


def test_accuracy_topk_hand_computed_with_ties():
    scores = np.array(
        [
            [0.1, 0.5, 0.4],  # label 2: rank 2
            [0.3, 0.3, 0.4],  # label 1: 2 first, then tie 0/1 -> class 0 before class 1, so rank 3
            [0.9, 0.05, 0.05],  # label 0: rank 1
            [0.2, 0.2, 0.6],  # label 1: rank 3 (tie with class 0 goes to 0)
        ]
    )
    labels = np.array([2, 1, 0, 1])
    assert M.accuracy(scores, labels) == 0.25
    assert M.accuracy(scores, labels, k=2) == 0.5
    assert M.accuracy(scores, labels, k=3) == 1.0
    assert M.accuracy(scores, labels, k=10) == 1.0


def test_accuracy_matches_stable_argsort_on_random_ties():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 4, size=(300, 7)).astype(np.float32)  # many ties
    labels = rng.integers(0, 7, size=300)
    order = np.argsort(-scores, axis=1, kind="stable")
    for k in (1, 2, 5):
        expected = np.mean([labels[i] in order[i, :k] for i in range(300)])
        assert M.accuracy(scores, labels, k=k) == pytest.approx(expected)
    assert M.accuracy(scores, labels) == pytest.approx(np.mean(scores.argmax(1) == labels))


def test_mean_per_class_hand_computed():
    # class 0: 2 samples, 1 right; class 1: 3 samples, 3 right; class 2: 1 sample, 0 right; class 3 absent
    scores = np.eye(4)[[0, 1, 1, 1, 1, 0]]
    labels = np.array([0, 0, 1, 1, 1, 2])
    assert M.mean_per_class_accuracy(scores, labels) == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert M.accuracy(scores, labels) == pytest.approx(4 / 6)


@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")
def test_mean_per_class_matches_sklearn_balanced_accuracy():
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(500, 10))
    labels = rng.integers(0, 8, size=500)  # classes 8, 9 never occur
    labels[:50] = scores[:50].argmax(1).clip(max=7)
    expected = balanced_accuracy_score(labels, scores.argmax(1))
    assert M.mean_per_class_accuracy(scores, labels) == pytest.approx(expected)


# ---------------------------------------------------------------- 11-point mAP


def test_ap_11point_four_samples_by_hand():
    # scores 0.9 0.8 0.7 0.6, targets 1 0 1 0, P = 2
    #   threshold 0.9: TP1 FP0 -> precision 1,   recall 0.5
    #   threshold 0.8: TP1 FP1 -> precision 1/2, recall 0.5
    #   threshold 0.7: TP2 FP1 -> precision 2/3, recall 1
    #   threshold 0.6: TP2 FP2 -> precision 1/2, recall 1
    # r = 0, .1, .2, .3, .4, .5 (6 points): max precision at recall >= r = 1
    # r = .6, .7, .8, .9, 1  (5 points): max(2/3, 1/2) = 2/3
    # AP = (6 * 1 + 5 * 2/3) / 11 = 28/33
    s = np.array([0.9, 0.8, 0.7, 0.6])
    t = np.array([1, 0, 1, 0])
    # second column: perfect ranking -> AP 1; third column: no positives -> NaN, left out of the mean
    scores = np.stack([s, s, s], axis=1)
    targets = np.stack([t, np.array([1, 1, 0, 0]), np.zeros(4, int)], axis=1)
    ap = M.ap_11point_per_class(scores, targets)
    assert ap[0] == pytest.approx(28 / 33)
    assert ap[1] == pytest.approx(1.0)
    assert math.isnan(ap[2])
    assert M.map_11point(scores, targets) == pytest.approx((28 / 33 + 1.0) / 2)
    assert M.compute("map_11point", scores, targets) == pytest.approx((28 / 33 + 1.0) / 2)
    # non-interpolated AP of column 0: 0.5 * 1 + 0.5 * 2/3 = 5/6
    assert M.average_precision_per_class(scores, targets)[0] == pytest.approx(5 / 6)


def test_ap_11point_recall_threshold_compared_exactly():
    # 10 positives: 3 on top, then 10 negatives, then 7 positives.
    # recall 0.3 is reached with precision 1, so r = 0, .1, .2, .3 give 1 (4 points);
    # r >= .4 only reach precision max(4/14, ..., 10/20) = 1/2 (7 points): AP = (4 + 3.5) / 11 = 15/22.
    # A float comparison recall >= 0.1 * 3 (= 0.30000000000000004) would give 7/11 instead.
    t = np.array([1] * 3 + [0] * 10 + [1] * 7)
    s = -np.arange(t.size, dtype=float)
    ap = M.ap_11point_per_class(s[:, None], t[:, None])
    assert ap[0] == pytest.approx(15 / 22)


def test_ap_11point_top_ranked_negative_has_no_precision_one_point():
    # scores 0.9 0.8, targets 0 1: threshold 0.9 has P 0 R 0, threshold 0.8 has P 1/2 R 1.
    # Every r, r = 0 included, gets 1/2 (VOC devkit). ELEVATER's scikit-learn based evaluator adds a
    # (recall 0, precision 1) point and would give (1 + 10 * 0.5) / 11 here.
    assert M.map_11point(np.array([[0.9], [0.8]]), np.array([[0], [1]])) == pytest.approx(0.5)


def test_ap_ties_are_one_threshold_and_order_free():
    # scores 1 1 0, targets 1 0 1: at threshold 1, TP1 FP1 (P 1/2, R 1/2); at 0, TP2 FP1 (P 2/3, R 1)
    # every r gets max precision 2/3 -> AP = 2/3, whatever the order of the tied samples
    s = np.array([[1.0], [1.0], [0.0]])
    t = np.array([[1], [0], [1]])
    assert M.map_11point(s, t) == pytest.approx(2 / 3)
    assert M.map_11point(s[[1, 0, 2]], t[[1, 0, 2]]) == pytest.approx(2 / 3)


def _ap11_bruteforce(score, target):
    """11-point AP from scikit-learn's precision-recall curve (tie-grouped thresholds).

    scikit-learn appends a sentinel point (recall 0, precision 1) that belongs to no threshold; the VOC
    devkit has no such point, so it is dropped here. (ELEVATER keeps it, so its r = 0 term is always 1.)
    """
    from sklearn.metrics import precision_recall_curve

    precision, recall, _ = precision_recall_curve(target, score)
    precision, recall = precision[:-1], recall[:-1]
    return np.mean([precision[recall >= r - 1e-12].max() if (recall >= r - 1e-12).any() else 0.0
                    for r in np.arange(11) / 10])


def test_ap_agrees_with_sklearn_on_random_data():
    rng = np.random.default_rng(2)
    scores = np.round(rng.normal(size=(200, 6)), 1)  # rounding makes ties
    targets = (rng.random((200, 6)) < 0.3).astype(int)
    ap = M.average_precision_per_class(scores, targets)
    ap11 = M.ap_11point_per_class(scores, targets)
    for j in range(6):
        assert ap[j] == pytest.approx(average_precision_score(targets[:, j], scores[:, j]))
        assert ap11[j] == pytest.approx(_ap11_bruteforce(scores[:, j], targets[:, j]))
    # the 11-point AP is close to (and for a perfect ranking equal to) the non-interpolated one
    assert np.all(np.abs(ap11 - ap) < 0.1)
    assert M.mean_average_precision(scores, targets) == pytest.approx(ap.mean())


def test_multilabel_indicator():
    out = M.multilabel_indicator([[0, 2], [], [1]], 3)
    assert out.tolist() == [[1, 0, 1], [0, 0, 0], [0, 1, 0]]
    with pytest.raises(M.MetricError, match="out of range"):
        M.multilabel_indicator([[3]], 3)


# ---------------------------------------------------------------- ROC-AUC


def test_roc_auc_hand_computed():
    # the scikit-learn doc example: AUC 0.75
    y = np.array([0, 0, 1, 1])
    d = np.array([0.1, 0.4, 0.35, 0.8])
    assert M.roc_auc(d, y) == pytest.approx(0.75)
    # 2-column scores use column 1 minus column 0
    assert M.roc_auc(np.stack([np.zeros(4), d], 1), y) == pytest.approx(0.75)
    assert M.roc_auc(np.stack([-d, np.full(4, 5.0)], 1), y) == pytest.approx(0.75)
    # ties: positives (1, 2) vs negatives (1, 0): pairs 0.5 + 1 + 1 + 1 = 3.5 of 4
    assert M.roc_auc(np.array([1.0, 2.0, 1.0, 0.0]), np.array([1, 1, 0, 0])) == pytest.approx(0.875)
    assert M.roc_auc(np.ones(4), np.array([1, 0, 1, 0])) == pytest.approx(0.5)


def test_roc_auc_matches_sklearn_on_random_data_with_ties():
    rng = np.random.default_rng(3)
    logits = rng.integers(-5, 6, size=(1000, 2)).astype(float)  # integers: exact differences, many ties
    y = (rng.random(1000) < 0.3 + 0.4 * (logits[:, 1] > logits[:, 0])).astype(int)
    expected = roc_auc_score(y, logits[:, 1] - logits[:, 0])
    assert M.roc_auc(logits, y) == pytest.approx(expected, abs=1e-12)
    # same as ELEVATER's softmax-probability-of-class-1 (monotone in the logit difference)
    prob1 = 1.0 / (1.0 + np.exp(logits[:, 0] - logits[:, 1]))  # = softmax(logits)[:, 1]
    assert np.allclose(prob1, np.exp(logits[:, 1]) / np.exp(logits).sum(1))
    assert M.compute("roc_auc", logits, y) == pytest.approx(roc_auc_score(y, prob1), abs=1e-12)


def test_roc_auc_errors():
    with pytest.raises(M.MetricError, match="2 columns"):
        M.roc_auc(np.zeros((4, 3)), np.array([0, 1, 0, 1]))
    with pytest.raises(M.MetricError, match="both classes"):
        M.roc_auc(np.zeros((4, 2)), np.array([1, 1, 1, 1]))
    with pytest.raises(M.MetricError, match="out of range"):
        M.roc_auc(np.zeros((4, 2)), np.array([0, 1, 2, 1]))


# ---------------------------------------------------------------- dispatcher and errors


def test_compute_dispatches_and_rejects_unknown_names():
    scores = np.eye(3)
    labels = np.array([0, 1, 1])
    assert M.compute("accuracy", scores, labels) == pytest.approx(2 / 3)
    assert M.compute("mean_per_class", scores, labels) == pytest.approx((1 + 0.5) / 2)
    with pytest.raises(ValueError, match="accuracy, mean_per_class, map_11point, roc_auc"):
        M.compute("top5", scores, labels)
    assert set(M.METRIC_NAMES) == {"accuracy", "mean_per_class", "map_11point", "roc_auc", "f1_macro",
                                   "worst_group_accuracy", "worst_group_top5"}


def test_metric_names_match_dataset_contract():
    from vlbench.datasets.canonical import METRICS

    assert set(M.METRIC_NAMES) | set(M.CASE_METRICS) == set(METRICS)
    with pytest.raises(ValueError, match="zero-shot analysis only"):
        M.compute("winogavil_jaccard", np.eye(3), np.array([0, 1, 2]))


@pytest.mark.parametrize(
    "scores, labels, match",
    [
        (np.zeros((3, 2)), np.array([0, 1]), "2 entries but scores have 3 rows"),
        (np.zeros((3, 2)), np.array([0, 1, 2]), "out of range"),
        (np.zeros((3, 2)), np.array([0, -1, 1]), "out of range"),
        (np.zeros(3), np.array([0, 1, 1]), "2-D"),
        (np.zeros((3, 2)), np.array([0.5, 1, 1]), "integer"),
        (np.zeros((3, 2)), np.array(["a", "b", "c"]), "integer"),
        (np.array([[0.0, np.nan]] * 3), np.array([0, 1, 1]), "NaN"),
        (np.zeros((3, 2)), np.zeros((3, 2), int), "multi-label"),
        (np.zeros((0, 2)), np.zeros(0, int), "zero samples"),
    ],
)
def test_accuracy_input_errors(scores, labels, match):
    with pytest.raises(M.MetricError, match=match):
        M.accuracy(scores, labels)


def test_accuracy_bad_k():
    with pytest.raises(M.MetricError, match="k must be"):
        M.accuracy(np.zeros((2, 2)), np.array([0, 1]), k=0)


def test_map_input_errors():
    with pytest.raises(M.MetricError, match=r"shape \(3, 2\) but scores have shape \(3, 3\)"):
        M.map_11point(np.zeros((3, 3)), np.zeros((3, 2)))
    with pytest.raises(M.MetricError, match="only 0 and 1"):
        M.map_11point(np.zeros((2, 2)), np.array([[0, 2], [1, 0]]))
    with pytest.raises(M.MetricError, match="2-D"):
        M.map_11point(np.zeros((3, 2)), np.array([0, 1, 1]))
    with pytest.raises(M.MetricError, match="no class has a positive"):
        M.map_11point(np.zeros((3, 2)), np.zeros((3, 2)))


# ---------------------------------------------------------------- confidence intervals


def test_mean_confidence_interval_by_hand():
    # mean 2.5; sample std (ddof=1) sqrt(5/3); half-width 1.96 * sqrt(5/3) / sqrt(4)
    mean, half = M.mean_confidence_interval([1, 2, 3, 4])
    assert mean == 2.5
    assert half == pytest.approx(1.96 * math.sqrt(5 / 3) / 2)
    # ddof=0: population std sqrt(5/4)
    assert M.mean_confidence_interval([1, 2, 3, 4], ddof=0)[1] == pytest.approx(1.96 * math.sqrt(1.25) / 2)
    # other levels use the normal quantile
    assert M.mean_confidence_interval([1, 2, 3, 4], confidence=0.99)[1] == pytest.approx(
        2.5758293035489 * math.sqrt(5 / 3) / 2
    )


def test_mean_confidence_interval_errors():
    with pytest.raises(M.MetricError, match="at least 2"):
        M.mean_confidence_interval([0.5])
    with pytest.raises(M.MetricError, match="confidence"):
        M.mean_confidence_interval([0.5, 0.6], confidence=95)
    with pytest.raises(M.MetricError, match="1-D"):
        M.mean_confidence_interval(np.zeros((2, 2)))


# ---------------------------------------------------------------- the ELEVATER convention


def _ap11_elevater_reference(score, target):
    """ELEVATER's toolkit (vision_evaluation 0.2.9): scikit-learn's precision-recall curve with its (recall 0,
    precision 1) end point kept, max precision at recall >= r for r in linspace(1, 0, 11)."""
    from sklearn.metrics import precision_recall_curve

    precision, recall, _ = precision_recall_curve(target, score)
    return np.mean([precision[recall >= r].max() for r in np.linspace(1, 0, 11)])


def test_ap_11point_elevater_convention_agrees_with_the_toolkits_definition_on_random_data():
    rng = np.random.default_rng(5)
    scores = np.round(rng.normal(size=(150, 5)), 1)  # ties
    targets = (rng.random((150, 5)) < 0.3).astype(int)
    targets[:, 4] = 0  # no positive: left out of the mean, as vision_evaluation drops all-zero target columns
    ap = M.ap_11point_per_class(scores, targets, convention="elevater")
    for j in range(4):
        assert ap[j] == pytest.approx(_ap11_elevater_reference(scores[:, j], targets[:, j]), abs=1e-12)
    assert math.isnan(ap[4])
    assert M.map_11point(scores, targets, convention="elevater") == pytest.approx(ap[:4].mean())
    assert M.compute("map_11point", scores, targets, convention="elevater") == pytest.approx(ap[:4].mean())


def test_ap_11point_conventions_differ_only_in_the_recall_zero_term():
    # scores 0.9 0.8 0.7 0.6, targets 0 1 0 1: precisions 0, 1/2 (R 1/2), 1/3, 1/2 (R 1); devkit: every r -> 1/2
    s = np.array([[0.9], [0.8], [0.7], [0.6]])
    t = np.array([[0], [1], [0], [1]])
    assert M.map_11point(s, t) == pytest.approx(0.5)
    assert M.map_11point(s, t, convention="elevater") == pytest.approx((1 + 10 * 0.5) / 11)
    # when the top-ranked sample is a positive the two agree
    assert M.map_11point(s[1:], t[1:]) == M.map_11point(s[1:], t[1:], convention="elevater")


def test_roc_auc_elevater_convention_ranks_by_column_one_alone():
    # rows (p0, p1), labels 1 0 1 0: column 1 alone ties the first two (that pair counts 1/2), the difference
    # p1 - p0 puts the positive first; pairs (row 2, row 1) lost, (row 0 or 2, row 3) won either way
    probs = np.array([[0.0, 1.0], [1e-9, 1.0], [0.4, 0.6], [0.7, 0.3]])
    y = np.array([1, 0, 1, 0])
    assert M.roc_auc(probs, y, convention="elevater") == pytest.approx(roc_auc_score(y, probs[:, 1]))
    assert M.roc_auc(probs, y, convention="elevater") == pytest.approx(2.5 / 4)
    assert M.roc_auc(probs, y) == pytest.approx(roc_auc_score(y, probs[:, 1] - probs[:, 0]))
    assert M.roc_auc(probs, y) == pytest.approx(3 / 4)
    assert M.compute("roc_auc", probs, y, convention="elevater") == pytest.approx(2.5 / 4)


def test_unknown_convention_is_refused_by_every_metric():
    with pytest.raises(M.MetricError, match="unknown metric convention 'voc'; known: default, elevater"):
        M.compute("accuracy", np.eye(2), np.array([0, 1]), convention="voc")
    with pytest.raises(M.MetricError, match="unknown metric convention"):
        M.map_11point(np.eye(2), np.eye(2), convention="sklearn")
    with pytest.raises(M.MetricError, match="unknown metric convention"):
        M.roc_auc(np.eye(2), np.array([0, 1]), convention="x")
