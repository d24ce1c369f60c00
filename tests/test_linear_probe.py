import warnings

import numpy as np
import pytest

from vlbench import metrics
from vlbench.analyses import linear_probe as lp
from vlbench.analyses.linear_probe import (
    LinearProbeError,
    default_c_grid,
    evaluate_linear_probe,
    fit_linear_probe,
    stratified_split,
)


def clusters(n, num_classes=5, dim=16, noise=1.5, seed=0, means_seed=123):
    """Gaussian clusters around fixed class means (same means for every split)."""
    means = np.random.default_rng(means_seed).normal(size=(num_classes, dim)) * 1.5
    rng = np.random.default_rng(seed)
    y = rng.integers(0, num_classes, size=n)
    x = (means[y] + rng.normal(scale=noise, size=(n, dim))).astype(np.float32)
    return x, y


@pytest.fixture(scope="module")
def data():
    return clusters(300, seed=1), clusters(100, seed=2), clusters(400, seed=3)


def test_default_grid_is_8_per_decade_from_1e_minus6_to_1e6():
    grid = default_c_grid()
    assert grid.size == 97
    assert grid[0] == pytest.approx(1e-6) and grid[-1] == pytest.approx(1e6)
    assert np.allclose(np.diff(np.log10(grid)), 1 / 8)
    assert [round(np.log10(lp._c_of(k)), 9) for k in lp.COARSE_EXPONENTS] == [-6, -4, -2, 0, 2, 4, 6]


def test_probe_beats_chance_and_chooses_c_from_grid(data):
    (xtr, ytr), (xva, yva), (xte, yte) = data
    model, chosen_C, val_scores = fit_linear_probe(xtr, ytr, xva, yva)
    scores = evaluate_linear_probe(model, xte)
    assert scores.shape == (400, 5)
    acc = metrics.compute("accuracy", scores, yte)
    assert acc > 0.8  # chance is 0.2
    grid = default_c_grid()
    assert np.isclose(grid, chosen_C, rtol=1e-12).any()
    assert chosen_C in val_scores and model.C == chosen_C
    # coarse-to-fine: the 7 coarse values plus at most 2 per halving (4 halvings)
    assert 7 < len(val_scores) <= 15
    for C in val_scores:
        assert np.isclose(grid, C, rtol=1e-12).any()
    for C in (1e-6, 1e-4, 1e-2, 1.0, 1e2, 1e4, 1e6):
        assert any(np.isclose(C, c) for c in val_scores)
    # the chosen C has the best validation score, and is the smallest C among equal bests
    best = max(val_scores.values())
    assert val_scores[chosen_C] == best
    assert chosen_C == min(C for C, s in val_scores.items() if s == best)
    # strongest regularisation collapses to (near) chance on validation
    assert val_scores[min(val_scores)] < best
    assert list(val_scores) == sorted(val_scores)


def test_coarse_to_fine_matches_exhaustive_search_on_a_unimodal_curve(data):
    (xtr, ytr), (xva, yva), _ = data
    # exhaustive sweep over the neighbourhood of the coarse-to-fine choice finds nothing better
    _, chosen, scores = fit_linear_probe(xtr, ytr, xva, yva, metric="mean_per_class")
    k = round(np.log10(chosen) * 8)
    neighbourhood = [10 ** (j / 8) for j in range(max(k - 4, -48), min(k + 4, 48) + 1)]
    _, chosen_ex, scores_ex = fit_linear_probe(xtr, ytr, xva, yva, metric="mean_per_class", c_grid=neighbourhood)
    assert scores[chosen] == pytest.approx(max(scores_ex.values()))


def test_explicit_grid_is_swept_exhaustively(data):
    (xtr, ytr), (xva, yva), _ = data
    grid = [1e-3, 0.1, 10.0, 0.1]
    _, chosen, scores = fit_linear_probe(xtr, ytr, xva, yva, c_grid=grid)
    assert list(scores) == [1e-3, 0.1, 10.0]
    assert chosen in scores


def test_deterministic(data):
    (xtr, ytr), (xva, yva), (xte, yte) = data
    a = fit_linear_probe(xtr, ytr, xva, yva, seed=0)
    b = fit_linear_probe(xtr, ytr, xva, yva, seed=0)
    assert a.chosen_C == b.chosen_C and a.val_scores_per_C == b.val_scores_per_C
    np.testing.assert_array_equal(evaluate_linear_probe(a.model, xte), evaluate_linear_probe(b.model, xte))


def test_carved_validation_split_is_stratified_and_deterministic(data):
    (xtr, ytr), _, (xte, yte) = data
    tr, va = stratified_split(ytr, 0.2, seed=0)
    tr2, va2 = stratified_split(ytr, 0.2, seed=0)
    np.testing.assert_array_equal(va, va2)
    np.testing.assert_array_equal(tr, tr2)
    assert np.intersect1d(tr, va).size == 0 and tr.size + va.size == ytr.size
    for c in range(5):
        n_c = int((ytr == c).sum())
        assert int((ytr[va] == c).sum()) == min(int(np.floor(0.2 * n_c + 0.5)), n_c - 1)
    assert not np.array_equal(stratified_split(ytr, 0.2, seed=1)[1], va)
    # a class with a single sample stays in train
    tr, va = stratified_split(np.array([0, 0, 0, 0, 0, 1]), 0.4, seed=0)
    assert 5 in tr and va.size == 2  # round(0.4 * 5) of class 0, none of class 1

    fit_a = fit_linear_probe(xtr, ytr, seed=7)
    fit_b = fit_linear_probe(xtr, ytr, seed=7)
    assert fit_a.chosen_C == fit_b.chosen_C and fit_a.val_scores_per_C == fit_b.val_scores_per_C
    assert metrics.accuracy(evaluate_linear_probe(fit_a.model, xte), yte) > 0.8
    # the final model is refit on the whole of train
    whole = lp._fit(lp._prepare_features(xtr, "x", True), ytr, fit_a.chosen_C, 5, True, 7)
    np.testing.assert_allclose(fit_a.model.classifier.coef_, whole.classifier.coef_)


def test_refit_uses_train_plus_val(data):
    (xtr, ytr), (xva, yva), _ = data
    full = fit_linear_probe(xtr, ytr, xva, yva, c_grid=[1.0])
    manual = lp._fit(
        lp._prepare_features(np.concatenate([xtr, xva]), "x", True), np.concatenate([ytr, yva]), 1.0, 5, True, 0
    )
    np.testing.assert_allclose(full.model.classifier.coef_, manual.classifier.coef_)
    only_train = fit_linear_probe(xtr, ytr, xva, yva, c_grid=[1.0], refit=False)
    assert not np.allclose(only_train.model.classifier.coef_, manual.classifier.coef_)


def test_normalize_parameter(data):
    (xtr, ytr), (xva, yva), (xte, _) = data
    m1 = fit_linear_probe(xtr, ytr, xva, yva, c_grid=[1.0]).model
    # with normalisation, scaling a test vector does not change its logits
    np.testing.assert_allclose(m1.decision_function(xte[:5] * 10), m1.decision_function(xte[:5]), rtol=1e-6)
    m2 = fit_linear_probe(xtr, ytr, xva, yva, c_grid=[1.0], normalize=False).model
    assert not m2.normalize
    assert not np.allclose(m2.decision_function(xte[:5] * 10), m2.decision_function(xte[:5]))


def test_binary_scores_work_with_roc_auc():
    (xtr, ytr), (xva, yva), (xte, yte) = [clusters(n, num_classes=2, seed=s) for n, s in ((200, 1), (80, 2), (300, 3))]
    model, chosen, scores = fit_linear_probe(xtr, ytr, xva, yva, metric="roc_auc")
    out = evaluate_linear_probe(model, xte)
    assert out.shape == (300, 2)
    np.testing.assert_array_equal(out[:, 0], 0.0)
    assert metrics.roc_auc(out, yte) > 0.9
    assert metrics.accuracy(out, yte) == pytest.approx(np.mean(model.classifier.predict(
        lp._prepare_features(xte, "x", True)) == yte))


def test_classes_missing_from_training_get_minus_inf():
    x, y = clusters(200, num_classes=3, seed=4)
    model, _, _ = fit_linear_probe(x, y, c_grid=[1.0], num_classes=5)
    out = evaluate_linear_probe(model, x[:10])
    assert out.shape == (10, 5)
    assert np.isneginf(out[:, 3:]).all() and np.isfinite(out[:, :3]).all()


def test_no_warnings_leak(data):
    (xtr, ytr), (xva, yva), _ = data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit_linear_probe(xtr, ytr, xva, yva)


@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(train_x=np.zeros(10)), LinearProbeError, "2-D"),
        (dict(train_y=np.zeros(7, int)), LinearProbeError, "7 labels but the features have 300 rows"),
        (dict(train_y=-np.ones(300, int)), LinearProbeError, "negative"),
        (dict(train_y=np.full(300, 0.5)), LinearProbeError, "integer"),
        (dict(train_y=np.zeros(300, int)), LinearProbeError, "at least 2"),
        (dict(val_x=np.zeros((100, 8))), LinearProbeError, "dimension 8, expected 16"),
        (dict(val_y=None), LinearProbeError, "both val_x and val_y"),
        (dict(train_x=np.full((300, 16), np.nan)), LinearProbeError, "NaN"),
        (dict(c_grid=[1.0, -1.0]), LinearProbeError, "positive"),
        (dict(c_grid=[]), LinearProbeError, "non-empty"),
        (dict(metric="top5"), ValueError, "known metrics"),
        (dict(num_classes=3), LinearProbeError, "num_classes=3"),
        (dict(train_y=np.zeros((300, 5), int)), NotImplementedError, "multi-label"),
    ],
)
def test_bad_inputs(data, kwargs, exc, match):
    (xtr, ytr), (xva, yva), _ = data
    args = dict(train_x=xtr, train_y=ytr, val_x=xva, val_y=yva, c_grid=[1.0])
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        fit_linear_probe(**args)


def test_cannot_carve_validation_from_tiny_train():
    with pytest.raises(LinearProbeError, match="cannot carve"):
        fit_linear_probe(np.eye(2, 4), np.array([0, 1]))


def test_evaluate_rejects_wrong_dimension(data):
    (xtr, ytr), (xva, yva), _ = data
    model = fit_linear_probe(xtr, ytr, xva, yva, c_grid=[1.0]).model
    with pytest.raises(LinearProbeError, match="dimension 3, expected 16"):
        evaluate_linear_probe(model, np.zeros((2, 3)))


# --------------------------------------------------------------------------------------------------
# the search on its own


def counting(f):
    calls = []

    def score(v):
        calls.append(v)
        return f(v)

    return score, calls


def test_search_finds_the_argmax_of_a_unimodal_function_and_traces_coarse_then_fine():
    grid = list(range(-48, 49))  # like the C exponents k: 97 positions, coarse every 16
    score, calls = counting(lambda v: -((v - 13) ** 2))
    best, trace = lp.coarse_to_fine_search(score, grid, 16)
    assert best == 13
    assert [v for v, _ in trace] == calls == [
        -48, -32, -16, 0, 16, 32, 48,  # coarse pass, in grid order
        8, 24,  # step 8 around 16
        12, 20,  # step 4 around 16
        10, 14,  # step 2 around 12 (12 and 14 tie at distance 1: the earlier in the grid stays best)
        11, 13,  # step 1 around 12
    ]
    assert all(s == -((v - 13) ** 2) for v, s in trace)
    # every target the grid allows is found, with at most 7 + 4 * 2 evaluations, none repeated
    for target in grid:
        score, calls = counting(lambda v, t=target: -abs(v - t))
        result = lp.coarse_to_fine_search(score, grid, 16)
        assert result.best == target and dict(result.trace)[target] == 0
        assert len(calls) == len(set(calls)) <= 15


def test_search_ties_go_to_the_earliest_grid_position():
    grid = [0.5, 1.0, 2.0, 4.0, 8.0]
    best, trace = lp.coarse_to_fine_search(lambda v: 1.0, grid, 2)
    assert best == 0.5
    assert [v for v, _ in trace] == [0.5, 2.0, 8.0, 1.0]  # coarse, then step 1 around position 0
    # a plateau of equal maxima: its first member wins
    best, _ = lp.coarse_to_fine_search(lambda v: min(v, 4.0), grid, 1)
    assert best == 4.0


def test_search_coarse_step_one_is_an_exhaustive_sweep_and_the_last_candidate_is_always_tried():
    grid = ["a", "b", "c", "d"]
    score, calls = counting(lambda v: {"a": 0.1, "b": 0.3, "c": 0.2, "d": 0.0}[v])
    assert lp.coarse_to_fine_search(score, grid, 1) == ("b", [("a", 0.1), ("b", 0.3), ("c", 0.2), ("d", 0.0)])
    assert calls == grid
    score, calls = counting(lambda v: -abs(v - 9))
    assert lp.coarse_to_fine_search(score, list(range(10)), 4).best == 9
    assert calls[:4] == [0, 4, 8, 9]  # the stride misses the last position: it is added to the coarse pass
    with pytest.raises(ValueError, match="non-empty"):
        lp.coarse_to_fine_search(score, [], 4)
    with pytest.raises(ValueError, match="coarse_step"):
        lp.coarse_to_fine_search(score, grid, 0)


def test_fit_linear_probe_is_the_search_over_the_default_grid(data):
    (xtr, ytr), (xva, yva), _ = data
    fit = fit_linear_probe(xtr, ytr, xva, yva)
    replay = lp.coarse_to_fine_search(lambda C: fit.val_scores_per_C[C], list(default_c_grid()), 16)
    assert replay.best == fit.chosen_C
    assert dict(sorted(replay.trace)) == fit.val_scores_per_C


def test_run_writes_test_predictions_and_a_bootstrap_interval(data):
    from types import SimpleNamespace

    import pyarrow as pa

    from vlbench import stats
    from vlbench.datasets.canonical import ClassInfo, DatasetMeta
    from vlbench.features import Features

    splits = dict(zip(("train", "val", "test"), data))

    def images(split):
        x, y = splits[split]
        return Features(pa.table({"sample_id": [f"{split}{i}" for i in range(len(y))], "label": y}), x, {}, [])

    meta = DatasetMeta(name="d", task="single-label", metric="accuracy", classes=[ClassInfo(i, f"c{i}") for i in range(5)])
    inputs = SimpleNamespace(meta=meta, images=images, has_split=lambda split: split in splits)
    result = lp.run(inputs, {"train_split": "train", "val_split": "val", "test_split": "test"}, seed=0)
    preds = result.tables["predictions"]
    x_te, y_te = splits["test"]
    assert preds.column("sample_id").to_pylist() == [f"test{i}" for i in range(len(y_te))]
    assert preds.column("label").to_pylist() == y_te.tolist()
    correct = np.asarray(preds.column("predicted").to_pylist()) == y_te
    assert result.metrics["accuracy"] == pytest.approx(correct.mean())
    assert result.intervals["accuracy"] == stats.bootstrap_sample_metric("accuracy", correct, seed=0).to_json()
    assert result.intervals["accuracy"]["low"] < correct.mean() < result.intervals["accuracy"]["high"]
