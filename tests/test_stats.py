"""vlbench.stats against independent computations: scipy's bootstrap (percentile method) on the same data within
Monte-Carlo tolerance, scipy's binomial test for McNemar, hand-computed small cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps
from sklearn.metrics import roc_auc_score

from vlbench import stats

B = 4000


def scipy_interval(data, statistic, paired=False, vectorized=False, resamples=B):
    res = sps.bootstrap(data, statistic, n_resamples=resamples, method="percentile", paired=paired,
                        vectorized=vectorized, random_state=np.random.default_rng(123))
    return res.confidence_interval.low, res.confidence_interval.high


def test_accuracy_interval_matches_scipy_bootstrap():
    rng = np.random.default_rng(1)
    correct = rng.random(600) < 0.7
    ours = stats.bootstrap_sample_metric("accuracy", correct, resamples=B, seed=5)
    low, high = scipy_interval((correct.astype(float),), np.mean, vectorized=True)
    assert ours.low == pytest.approx(low, abs=0.006) and ours.high == pytest.approx(high, abs=0.006)
    assert ours.low < correct.mean() < ours.high
    # the textbook normal approximation for a proportion agrees roughly too (independent of any bootstrap)
    se = math.sqrt(correct.mean() * (1 - correct.mean()) / correct.size)
    assert ours.high - ours.low == pytest.approx(2 * 1.96 * se, rel=0.1)


def test_mean_per_class_interval_matches_scipy_bootstrap():
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 5, 400)
    correct = rng.random(400) < np.array([0.9, 0.8, 0.6, 0.5, 0.3])[labels]

    def mpc(y, c):
        return np.mean([c[y == k].mean() for k in np.unique(y)])

    ours = stats.bootstrap_sample_metric("mean_per_class", correct, labels, resamples=B, seed=0)
    low, high = scipy_interval((labels, correct.astype(float)), mpc, paired=True, resamples=2000)
    assert ours.low == pytest.approx(low, abs=0.008) and ours.high == pytest.approx(high, abs=0.008)


def test_roc_auc_interval_resamples_indices_like_scipy():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 300)
    decision = y + rng.normal(0, 1.2, 300)
    scores = np.stack([np.zeros(300), decision], axis=1)
    ours = stats.metric_interval("roc_auc", scores, y, resamples=1000, seed=1)
    low, high = scipy_interval((y, decision), lambda a, d: roc_auc_score(a, d), paired=True, resamples=1000)
    assert ours.low == pytest.approx(low, abs=0.012) and ours.high == pytest.approx(high, abs=0.012)
    assert ours.to_json() == {"low": ours.low, "high": ours.high, "level": 0.95, "method": "bootstrap",
                              "resamples": 1000, "seed": 1}


def test_paired_difference_matches_scipy_paired_bootstrap_and_is_narrower_than_unpaired():
    rng = np.random.default_rng(4)
    a = rng.random(800) < 0.6
    b = a.copy()
    flip = rng.random(800) < 0.15  # b differs from a on 15% of samples, mostly for the better
    b[flip] = rng.random(flip.sum()) < 0.75
    diff = stats.paired_difference("accuracy", a, b, resamples=B, seed=9)
    assert diff.delta == pytest.approx(b.mean() - a.mean())
    low, high = scipy_interval((a.astype(float), b.astype(float)), lambda x, y: np.mean(y) - np.mean(x),
                               paired=True, resamples=2000)
    assert diff.low == pytest.approx(low, abs=0.005) and diff.high == pytest.approx(high, abs=0.005)
    assert diff.p_mcnemar == pytest.approx(sps.binomtest(int(np.sum(a & ~b)), int(np.sum(a != b)), 0.5).pvalue)
    assert diff.paired and diff.n == 800
    ia = stats.bootstrap_sample_metric("accuracy", a).to_json()
    ib = stats.bootstrap_sample_metric("accuracy", b).to_json()
    unpaired = stats.unpaired_difference(a.mean(), ia, b.mean(), ib)
    assert unpaired.high - unpaired.low > 1.5 * (diff.high - diff.low)  # pairing removes the shared variance


def test_paired_mean_per_class_difference():
    rng = np.random.default_rng(6)
    labels = rng.integers(0, 3, 300)
    a = rng.random(300) < 0.5
    b = a | (rng.random(300) < 0.2)
    diff = stats.paired_difference("mean_per_class", a, b, labels, resamples=2000, seed=0)

    def mpc(c):
        return np.mean([c[labels == k].mean() for k in range(3)])

    assert diff.delta == pytest.approx(mpc(b) - mpc(a))
    low, high = scipy_interval((labels, a.astype(float), b.astype(float)),
                               lambda y, x, z: np.mean([z[y == k].mean() - x[y == k].mean() for k in np.unique(y)]),
                               paired=True, resamples=2000)
    assert diff.low == pytest.approx(low, abs=0.008) and diff.high == pytest.approx(high, abs=0.008)
    assert diff.p_mcnemar is None and diff.p_bootstrap < 0.01


@pytest.mark.parametrize("only_a,only_b", [(0, 0), (0, 5), (3, 3), (7, 19), (120, 95), (1, 2000)])
def test_mcnemar_exact_is_the_binomial_test_of_discordant_pairs(only_a, only_b):
    a = np.r_[np.ones(only_a), np.zeros(only_b), np.ones(10)].astype(bool)
    b = np.r_[np.zeros(only_a), np.ones(only_b), np.ones(10)].astype(bool)
    expected = 1.0 if only_a + only_b == 0 else sps.binomtest(only_a, only_a + only_b, 0.5).pvalue
    assert stats.mcnemar_exact(a, b) == pytest.approx(expected, rel=1e-9, abs=1e-300)


def test_hand_computed_cases():
    assert stats.mcnemar_exact([0, 0, 0, 0, 0, 1], [1, 1, 1, 1, 1, 1]) == pytest.approx(2 / 32)  # 0 of 5 discordant
    perfect = stats.bootstrap_sample_metric("accuracy", np.ones(50, bool))
    assert (perfect.low, perfect.high) == (1.0, 1.0)
    same = stats.paired_difference("accuracy", [1, 0, 1, 1], [1, 0, 1, 1])
    assert (same.delta, same.low, same.high, same.p_bootstrap, same.p_mcnemar) == (0.0, 0.0, 0.0, 1.0, 1.0)
    seeds = stats.seeds_interval([0.5, 0.6, 0.7])  # t_{0.975, 2} = 4.302652729911275, s = 0.1, logit scale
    half = 4.302652729911275 * 0.1 / math.sqrt(3) / (0.6 * 0.4)
    centre = math.log(0.6 / 0.4)
    assert (seeds.low, seeds.high, seeds.method) == (pytest.approx(1 / (1 + math.exp(half - centre))),
                                                     pytest.approx(1 / (1 + math.exp(-centre - half))),
                                                     "seeds_logit_t")
    assert stats.seeds_interval([0.5]) is None
    episodes = stats.episodes_interval([0.4, 0.6] * 300)
    half = 1.96 * np.std([0.4, 0.6] * 300, ddof=1) / math.sqrt(600)
    assert (episodes.low, episodes.high) == (pytest.approx(0.5 - half), pytest.approx(0.5 + half))
    assert stats.bootstrap_p(np.array([0.1, 0.2, 0.3])) == pytest.approx(2 / 4)


def test_seeded_and_deterministic():
    correct = np.random.default_rng(0).random(1000) < 0.5
    one = stats.bootstrap_sample_metric("accuracy", correct, seed=3)
    assert one == stats.bootstrap_sample_metric("accuracy", correct, seed=3)
    assert one != stats.bootstrap_sample_metric("accuracy", correct, seed=4)


def test_bad_inputs_raise_one_line_errors():
    with pytest.raises(stats.StatsError, match="same samples: 3 against 2"):
        stats.paired_difference("accuracy", [1, 0, 1], [1, 0])
    with pytest.raises(stats.StatsError, match="no per-sample bootstrap for metric 'map_11point'"):
        stats.bootstrap_sample_metric("map_11point", [1, 0])
    with pytest.raises(stats.StatsError, match="resamples must be a positive integer"):
        stats.bootstrap_sample_metric("accuracy", [1, 0], resamples=0)


@pytest.mark.parametrize("convention", ["default", "elevater"])
def test_whole_set_metrics_on_multiplicities_equal_the_metric_on_repeated_rows(convention):
    from vlbench import metrics

    rng = np.random.default_rng(8)
    scores = np.round(rng.normal(size=(60, 4)), 1)  # rounded: tied scores
    targets = (rng.random((60, 4)) < 0.2).astype(int)
    binary = rng.integers(0, 2, 60)
    weights = stats.resample_counts(np.random.default_rng(1), 60, 25)
    assert (weights.sum(axis=1) == 60).all()
    maps = stats.WHOLE_SET_METRICS["map_11point"](scores, targets, weights, convention)
    aucs = stats.WHOLE_SET_METRICS["roc_auc"](scores[:, :2], binary, weights, convention)
    for r, w in enumerate(weights):
        rows = np.repeat(np.arange(60), w)
        assert maps[r] == pytest.approx(metrics.map_11point(scores[rows], targets[rows], convention), abs=1e-12)
        assert aucs[r] == pytest.approx(metrics.roc_auc(scores[rows, :2], binary[rows], convention), abs=1e-12)


def test_map_interval_matches_scipy_bootstrap_of_the_metric():
    from vlbench import metrics

    rng = np.random.default_rng(9)
    targets = (rng.random((200, 3)) < 0.3).astype(int)
    scores = targets + rng.normal(0, 0.8, (200, 3))
    ours = stats.metric_interval("map_11point", scores, targets, resamples=1000, seed=2)
    index = np.arange(200)

    def statistic(i):
        try:
            return metrics.map_11point(scores[i], targets[i])
        except metrics.MetricError:
            return np.nan

    low, high = scipy_interval((index,), statistic, resamples=1000)
    assert ours.low == pytest.approx(low, abs=0.015) and ours.high == pytest.approx(high, abs=0.015)


def test_result_files_carry_intervals_of_numeric_metrics_only(tmp_path, monkeypatch):
    import json

    from vlbench.results import Result, write_result

    monkeypatch.chdir(tmp_path)
    interval = stats.bootstrap_sample_metric("accuracy", np.ones(10, bool)).to_json()
    path = write_result("zeroshot", "d", Result({"accuracy": 1.0, "knowledge_best_variant": "x"}, {}, {},
                                                intervals={"accuracy": interval}), {})
    doc = json.loads(path.read_text())
    assert list(doc)[:4] == ["analysis", "dataset", "metrics", "intervals"]
    assert doc["intervals"] == {"accuracy": interval}
    without = json.loads(write_result("zeroshot", "e", Result({"accuracy": 1.0}, {}, {}), {}).read_text())
    assert "intervals" not in without  # results without intervals keep their bytes
    with pytest.raises(ValueError, match="zeroshot/d: intervals of knowledge_best_variant, which are not numeric"):
        write_result("zeroshot", "d", Result({"knowledge_best_variant": "x"}, {}, {},
                                             intervals={"knowledge_best_variant": interval}), {})


# ------------------------------------------------------------------------------------------- seeds: inside [0, 1]


@pytest.mark.parametrize("values", [[0.5, 0.6, 0.7], [0.05, 0.72, 0.6], [0.9, 0.99, 0.995, 0.97, 0.999],
                                    [0.2, 0.25], [0.0, 0.0, 0.01]])
def test_seeds_interval_is_scipys_t_interval_on_the_logit_scale(values):
    """Against scipy: `t.interval` around logit(mean) with the delta method's scale, mapped back by `expit`."""
    from scipy.special import expit, logit

    m = np.mean(values)
    scale = sps.sem(values) / (m * (1 - m))
    low, high = expit(sps.t.interval(0.95, len(values) - 1, loc=logit(m), scale=scale))
    got = stats.seeds_interval(values)
    assert (got.low, got.high) == (pytest.approx(low, rel=1e-9, abs=1e-15), pytest.approx(high, rel=1e-9))
    assert 0.0 <= got.low <= m <= got.high <= 1.0
    assert got.to_json() == {"low": got.low, "high": got.high, "level": 0.95, "method": "seeds_logit_t"}


def test_seeds_interval_stays_in_bounds_where_the_plain_t_interval_left_them():
    """Issue 30: adapt shapes elevater/language_1p/5/last had the plain t-interval [-0.3945, 1.0799] over its seeds."""
    wide = [0.05, 0.72, 0.29]
    mean, half = np.mean(wide), sps.t.ppf(0.975, 2) * sps.sem(wide)
    assert mean - half < 0  # what the plain t-interval gave
    got = stats.seeds_interval(wide)
    assert 0.0 < got.low < mean < got.high < 1.0
    assert stats.seeds_interval([1.0, 1.0, 1.0]).to_json() == {"low": 1.0, "high": 1.0, "level": 0.95,
                                                                "method": "seeds_logit_t"}
    assert (stats.seeds_interval([0.0, 0.0]).low, stats.seeds_interval([0.0, 0.0]).high) == (0.0, 0.0)
    near_zero = stats.seeds_interval([0.0, 0.001])
    assert 0.0 <= near_zero.low < 0.0005 < near_zero.high <= 1.0
    near_one = stats.seeds_interval([1.0, 1.0, 0.999])
    assert 0.0 <= near_one.low < near_one.high <= 1.0
    with pytest.raises(stats.StatsError, match=r"\[0, 1\]"):
        stats.seeds_interval([0.5, 1.5])
