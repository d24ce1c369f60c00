"""DataComp's main metrics (vlbench/metrics.py), each against an independent computation: scikit-learn or a loop
written here; their bootstrap intervals; the DataComp average against a hand-built row."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import f1_score, jaccard_score

from vlbench import metrics, stats


def _data(seed: int, n: int = 300, c: int = 12, groups: int = 4):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, c - 2, n)  # two classes never occur in the labels (iWildCam has such classes)
    scores = rng.normal(size=(n, c))
    scores[np.arange(n), labels] += rng.normal(1.0, 1.0, n)  # better than chance
    return scores, labels, rng.choice(np.array(["Africa", "Asia", "Europe", "Americas"][:groups]), n)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_f1_macro_is_sklearns_over_the_classes_present(seed):
    scores, labels, _ = _data(seed)
    pred = scores.argmax(axis=1)
    expected = f1_score(labels, pred, average="macro", labels=np.unique(labels), zero_division=0)
    assert metrics.f1_macro(scores, labels) == pytest.approx(expected, abs=1e-12)
    assert metrics.compute("f1_macro", scores, labels) == pytest.approx(expected, abs=1e-12)


def _worst_by_loop(scores, labels, groups, k):
    worst = 1.0
    for g in set(groups.tolist()):
        hits = []
        for i in np.nonzero(groups == g)[0]:
            ranked = sorted(range(scores.shape[1]), key=lambda j: (-scores[i, j], j))
            hits.append(labels[i] in ranked[:k])
        worst = min(worst, sum(hits) / len(hits))
    return worst


@pytest.mark.parametrize("k,name", [(1, "worst_group_accuracy"), (5, "worst_group_top5")])
def test_worst_group_accuracy_against_a_loop(k, name):
    scores, labels, groups = _data(3)
    expected = _worst_by_loop(scores, labels, groups, k)
    assert metrics.compute(name, scores, labels, groups=groups) == pytest.approx(expected, abs=1e-12)
    assert metrics.worst_group_accuracy(scores, labels, groups, k=k) == pytest.approx(expected, abs=1e-12)


def test_worst_group_ignores_groups_without_samples_and_needs_groups():
    scores = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    labels = np.array([0, 1, 0])
    assert metrics.worst_group_accuracy(scores, labels, np.array([7, 7, 9])) == 0.0
    assert metrics.worst_group_accuracy(scores, labels, np.array([7, 7, 7])) == pytest.approx(2 / 3)
    with pytest.raises(metrics.MetricError, match="group"):
        metrics.compute("worst_group_accuracy", scores, labels)


def test_winogavil_jaccard_against_sklearn():
    rng = np.random.default_rng(4)
    cases, expected = [], []
    for n in [5, 6, 10, 12] * 6:
        truth = np.zeros(n, int)
        truth[rng.choice(n, rng.integers(2, 5), replace=False)] = 1
        sc = rng.normal(size=n)
        cases.append((sc, truth))
        if n >= 10:
            m = truth.sum()
            picked = np.isin(np.arange(n), np.argsort(sc)[-m:])  # DataComp's wino_eval.py selection
            expected.append(jaccard_score(truth, picked))
    assert metrics.winogavil_jaccard(cases) == pytest.approx(np.mean(expected), abs=1e-12)


def test_mean_recall_at_1():
    assert metrics.mean_recall_at_1(0.8, 0.6) == pytest.approx(0.7)


TASKS = ["Caltech-101", "CIFAR-10", "CIFAR-100", "CLEVR Counts", "CLEVR Distance", "Country211",
         "Describable Textures", "EuroSAT", "FGVC Aircraft", "Food-101", "GTSRB", "ImageNet 1k", "ImageNet Sketch",
         "ImageNet v2", "ImageNet-A", "ImageNet-O", "ImageNet-R", "KITTI Vehicle Distance", "MNIST", "ObjectNet",
         "Oxford Flowers-102", "Oxford-IIIT Pet", "Pascal VOC 2007", "PatchCamelyon", "Rendered SST2", "RESISC45",
         "Stanford Cars", "STL-10", "SUN397", "SVHN", "Flickr", "MSCOCO", "WinoGAViL", "iWildCam", "Camelyon17",
         "FMoW", "Dollar Street", "GeoDE"]


def test_datacomp_average_against_a_hand_built_row():
    row = {task: (i + 1) / 100 for i, task in enumerate(TASKS)}  # 0.01 .. 0.38
    out = metrics.datacomp_average(row)
    assert out["Average"] == pytest.approx(sum(range(1, 39)) / 38 / 100)  # 0.195
    assert out["ImageNet"] == pytest.approx(0.12)
    assert out["ImageNet dist. shifts"] == pytest.approx((13 + 14 + 15 + 16 + 17 + 20) / 6 / 100)
    assert out["Retrieval"] == pytest.approx((31 + 32 + 33) / 3 / 100)
    vtab = [1, 3, 4, 5, 7, 8, 18, 21, 22, 24, 26, 29, 30]
    assert out["VTAB"] == pytest.approx(sum(vtab) / 13 / 100)
    with pytest.raises(metrics.MetricError, match="FairFace"):
        metrics.datacomp_average({**row, "FairFace": 0.5})
    with pytest.raises(metrics.MetricError, match="GeoDE"):
        metrics.datacomp_average({**{k: v for k, v in row.items() if k != "GeoDE"}, "UTKFace": 0.5})


def test_group_and_f1_intervals_contain_the_metric_and_are_reproducible():
    scores, labels, groups = _data(5, n=400)
    for name in ("worst_group_accuracy", "worst_group_top5"):
        value = metrics.compute(name, scores, labels, groups=groups)
        a = stats.metric_interval(name, scores, labels, groups=groups, resamples=500, seed=1)
        assert a.low <= value <= a.high and a.high - a.low < 0.3
        assert a == stats.metric_interval(name, scores, labels, groups=groups, resamples=500, seed=1)
    value = metrics.f1_macro(scores, labels)
    f1 = stats.metric_interval("f1_macro", scores, labels, resamples=200, seed=1)
    assert f1.low <= value <= f1.high


def test_group_bootstrap_against_index_resampling():
    """The cell draw of `group_replicates` has the distribution of drawing sample indices: the two means and
    spreads agree within Monte-Carlo error."""
    scores, labels, groups = _data(6, n=200)
    correct = scores.argmax(axis=1) == labels
    reps = stats.group_replicates(correct, groups, 4000, np.random.default_rng(0))
    rng = np.random.default_rng(1)
    direct = []
    for _ in range(4000):
        idx = rng.integers(0, 200, 200)
        direct.append(min(correct[idx][groups[idx] == g].mean() for g in np.unique(groups[idx])))
    assert reps.mean() == pytest.approx(np.mean(direct), abs=0.01)
    assert reps.std() == pytest.approx(np.std(direct), rel=0.1)
