"""`vlbench compare` pairs every declared per-sample table (issue 33): each statistic on constructed runs against an
independent computation (a resampling loop written here, scipy's tests), the correction over many rows, and the
leaderboard's ranks, published rows and verdicts. Runs are folders read through fsspec as a revision's
DVCFileSystem is (tests/test_compare.py reads real git and DVC revisions)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats as sps

from vlbench import metrics, stats
from vlbench.compare_runs import CompareError, Experiment, compare

B = 4000  # resamples of the loops written here


def experiment(root: Path, name: str, tables: dict, results: dict, model: str = "toy") -> Experiment:
    """A run: {(analysis, dataset, table): pyarrow table} written as reports/<analysis>/<dataset>.<table>.parquet,
    {(analysis, dataset): metrics or a result JSON} as its results."""
    import fsspec

    for (analysis, dataset, table), data in tables.items():
        path = root / name / "reports" / analysis / f"{dataset}.{table}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(data, path)
    docs = {k: v if "metrics" in v else {"metrics": v} for k, v in results.items()}
    for doc in docs.values():
        doc.setdefault("fingerprint", {"model": model})
    (root / name).mkdir(parents=True, exist_ok=True)
    return Experiment(name, name * 4, docs, fsspec.filesystem("dir", path=str(root / name)))


def row(data: dict, analysis: str, metric: str) -> dict:
    return next(r for r in data["rows"] if (r["analysis"], r["metric"]) == (analysis, metric))


def loop_interval(difference, n: int, seed: int = 1, resamples: int = B) -> tuple[float, float]:
    """Percentile interval of difference(indices) over `resamples` draws of n units with replacement."""
    rng = np.random.default_rng(seed)
    values = [difference(rng.integers(0, n, n)) for _ in range(resamples)]
    return tuple(np.quantile(values, [0.025, 0.975]))


def close(diff: dict, expected: tuple[float, float], share: float = 0.12) -> None:
    """Both ends within `share` of the interval's width (Monte-Carlo error of two bootstraps)."""
    width = expected[1] - expected[0]
    assert diff["low"] == pytest.approx(expected[0], abs=share * width + 1e-9), (diff, expected)
    assert diff["high"] == pytest.approx(expected[1], abs=share * width + 1e-9), (diff, expected)


# ------------------------------------------------------------------------------------------- one statistic each


def test_specificity_map_per_cell_is_a_paired_bootstrap_over_images(tmp_path):
    rng = np.random.default_rng(0)
    n = 120
    ap = {"a": rng.random((2, n)) * 0.6, "b": rng.random((2, n)) * 0.6 + 0.1}
    runs = []
    for name in "ab":
        table = pa.table({"sample_id": [f"s{i}" for i in range(n)] * 2, "positive": ["captions"] * (2 * n),
                          "negative": ["random"] * n + ["altered"] * n, "ap": ap[name].ravel()})
        runs.append(experiment(tmp_path, name, {("specificity", "d", "ap"): table},
                               {("specificity", "d"): {"captions_vs_random": ap[name][0].mean(),
                                                       "captions_vs_altered": ap[name][1].mean()}}))
    data = compare(runs)
    for cell, metric in enumerate(("captions_vs_random", "captions_vs_altered")):
        (diff,) = row(data, "specificity", metric)["differences"]
        assert (diff["paired"], diff["unit"], diff["n"], diff["test"]) == (True, "image", n, "bootstrap")
        a, b = ap["a"][cell], ap["b"][cell]
        assert diff["delta"] == pytest.approx(b.mean() - a.mean())
        close(diff, loop_interval(lambda i: b[i].mean() - a[i].mean(), n))
        # the test's p: the bootstrap standard error's normal p
        se = np.std([b[i].mean() - a[i].mean() for i in np.random.default_rng(2).integers(0, n, (B, n))], ddof=1)
        assert sps.norm.isf(diff["p"] / 2) == pytest.approx(abs(b.mean() - a.mean()) / se, rel=0.06)


def test_retrieval_recall_pairs_image_queries_and_clusters_caption_queries_by_image(tmp_path):
    rng = np.random.default_rng(1)
    n = 150
    captions = rng.integers(1, 6, n)  # each image has 1-5 captions
    owner = np.repeat(np.arange(n), captions)
    easy = {"a": rng.random(n) < 0.5, "b": rng.random(n) < 0.7}  # captions of one image move together
    runs, i2t, t2i = [], {}, {}
    for name in "ab":
        i2t[name] = np.where(rng.random(n) < 0.6, 1, 7)
        t2i[name] = np.where(easy[name][owner], 1, 9)
        tables = {("retrieval", "c", "i2t_ranks"): pa.table({"sample_id": [f"s{i}" for i in range(n)],
                                                            "rank": i2t[name]}),
                  ("retrieval", "c", "t2i_ranks"): pa.table({"caption_row": np.arange(owner.size),
                                                            "sample_id": [f"s{i}" for i in owner],
                                                            "rank": t2i[name]})}
        runs.append(experiment(tmp_path, name, tables, {("retrieval", "c"): {
            "i2t_r1": float(np.mean(i2t[name] <= 1)), "i2t_r5": float(np.mean(i2t[name] <= 5)),
            "t2i_r1": float(np.mean(t2i[name] <= 1))}}))
    data = compare(runs)
    (i2t_r1,) = row(data, "retrieval", "i2t_r1")["differences"]
    a, b = i2t["a"] <= 1, i2t["b"] <= 1
    assert (i2t_r1["unit"], i2t_r1["n"], i2t_r1["test"]) == ("image", n, "mcnemar")
    assert i2t_r1["p"] == pytest.approx(sps.binomtest(int(np.sum(a & ~b)), int(np.sum(a != b))).pvalue)
    close(i2t_r1, loop_interval(lambda i: b[i].mean() - a[i].mean(), n))
    (t2i_r1,) = row(data, "retrieval", "t2i_r1")["differences"]
    hits = {k: np.bincount(owner, weights=t2i[k] <= 1) for k in "ab"}
    assert (t2i_r1["unit"], t2i_r1["n"], t2i_r1["test"]) == ("image", n, "bootstrap")
    assert t2i_r1["delta"] == pytest.approx(np.mean(t2i["b"] <= 1) - np.mean(t2i["a"] <= 1))
    clustered = loop_interval(lambda i: (hits["b"][i].sum() - hits["a"][i].sum()) / captions[i].sum(), n)
    close(t2i_r1, clustered)
    hit_a, hit_b = t2i["a"] <= 1, t2i["b"] <= 1  # resampling captions alone understates the spread
    naive = loop_interval(lambda i: hit_b[i].mean() - hit_a[i].mean(), owner.size)
    assert t2i_r1["high"] - t2i_r1["low"] > 1.2 * (naive[1] - naive[0])


def test_winogavil_jaccard_pairs_the_counted_instances(tmp_path):
    """WinoGAViL's per-instance table (zeroshot.evaluate_winogavil): the 10- and 12-candidate instances (`counts_in`)
    are the units, each with its Jaccard; the 5- and 6-candidate ones are not in the metric and not resampled."""
    rng = np.random.default_rng(7)
    n = 120
    sizes = rng.choice([5, 6, 10, 12], n)
    counted = sizes >= 10
    runs, jaccard = [], {}
    for name, shift in (("a", 0.0), ("b", 0.15)):
        jaccard[name] = np.clip(rng.random(n) * 0.7 + shift, 0, 1)
        table = pa.table({"sample_id": [f"{i:05d}" for i in range(n)], "candidates": sizes,
                          "counts_in": np.where(counted, "winogavil_jaccard", ""), "jaccard": jaccard[name]})
        runs.append(experiment(tmp_path, name, {("zeroshot", "wds-winogavil", "predictions"): table},
                               {("zeroshot", "wds-winogavil"): {
                                   "winogavil_jaccard": float(jaccard[name][counted].mean())}}))
    (diff,) = row(compare(runs), "zeroshot", "winogavil_jaccard")["differences"]
    a, b = jaccard["a"][counted], jaccard["b"][counted]
    assert (diff["unit"], diff["n"], diff["paired"]) == ("instance", int(counted.sum()), True)
    assert diff["delta"] == pytest.approx(b.mean() - a.mean())
    close(diff, loop_interval(lambda i: b[i].mean() - a[i].mean(), a.size))


def predictions(n: int, classes: int, accuracy: float, rng) -> np.ndarray:
    labels = np.arange(n) % classes
    return labels, np.where(rng.random(n) < accuracy, labels, (labels + 1) % classes)


def test_mean_per_class_and_worst_group_accuracy_pair_images(tmp_path):
    rng = np.random.default_rng(2)
    n, classes = 300, 5
    labels = np.arange(n) % classes
    groups = np.array(["north", "south", "east"])[np.arange(n) % 3]
    runs, right = [], {}
    for name, acc in (("a", 0.55), ("b", 0.7)):
        _, predicted = predictions(n, classes, acc, rng)
        right[name] = predicted == labels
        per_group = [right[name][groups == g].mean() for g in np.unique(groups)]
        per_class = [right[name][labels == c].mean() for c in range(classes)]
        table = pa.table({"sample_id": [f"s{i}" for i in range(n)], "label": labels, "predicted": predicted,
                          "group": groups})
        runs.append(experiment(tmp_path, name, {("zeroshot", "g", "predictions"): table},
                               {("zeroshot", "g"): {"mean_per_class": float(np.mean(per_class)),
                                                    "worst_group_accuracy": float(min(per_group))}}))
    data = compare(runs)
    a, b = right["a"], right["b"]

    def mpc(c, i):
        present = np.unique(labels[i])
        return np.mean([c[i][labels[i] == k].mean() for k in present])

    def worst(c, i):
        return min(c[i][groups[i] == g].mean() for g in np.unique(groups[i]))

    (diff,) = row(data, "zeroshot", "mean_per_class")["differences"]
    assert (diff["paired"], diff["test"], diff["p_mcnemar"]) == (True, "bootstrap", None)
    close(diff, loop_interval(lambda i: mpc(b, i) - mpc(a, i), n, resamples=1500), share=0.15)
    (diff,) = row(data, "zeroshot", "worst_group_accuracy")["differences"]
    assert (diff["paired"], diff["unit"]) == (True, "image")
    close(diff, loop_interval(lambda i: worst(b, i) - worst(a, i), n, resamples=1500), share=0.15)


def test_multilabel_map_pairs_the_logits_with_the_same_resampled_images(tmp_path):
    """Run b scored with `zeroshot.scoring: elevater` (the row-wise softmax of its logits, ELEVATER's 11-point AP): each
    run's number is recomputed its own way on the same resampled images."""
    rng = np.random.default_rng(3)
    n, classes = 80, 4
    labels = [sorted(set(rng.integers(0, classes, 2).tolist())) for _ in range(n)]
    targets = metrics.multilabel_indicator(labels, classes)
    runs, scores, ways = [], {}, {}
    for name, signal in (("a", 0.5), ("b", 1.5)):
        scores[name] = (targets * signal + rng.normal(size=(n, classes))).astype(np.float32)
        ways[name] = ((scores["a"], "default") if name == "a" else
                      (np.exp(scores["b"]) / np.exp(scores["b"]).sum(1, keepdims=True), "elevater"))
        table = pa.table({"sample_id": [f"s{i}" for i in range(n)], "labels": labels,
                          "predicted": scores[name].argmax(1), "logits": list(scores[name])})
        runs.append(experiment(tmp_path, name, {("zeroshot", "voc", "predictions"): table},
                               {("zeroshot", "voc"): {"map_11point": metrics.map_11point(*ways[name][:1], targets,
                                                                                          ways[name][1])}}))
    (diff,) = row(compare(runs), "zeroshot", "map_11point")["differences"]
    assert (diff["paired"], diff["test"], diff["n"]) == (True, "bootstrap", n)

    def d(i):
        t = targets[i]
        return (metrics.map_11point(ways["b"][0][i], t, "elevater")
                - metrics.map_11point(ways["a"][0][i], t, "default"))

    close(diff, loop_interval(d, n, resamples=1000), share=0.15)


@pytest.mark.parametrize("analysis", ["adapt", "finetune"])  # FewTrans's episodes, and its fine-tuning methods'
def test_fewtrans_episodes_take_a_paired_t_interval(tmp_path, analysis):
    rng = np.random.default_rng(4)
    episodes = 30
    acc = {"a": rng.random(episodes) * 0.3 + 0.5}
    acc["b"] = acc["a"] + rng.normal(0.03, 0.05, episodes)
    runs = []
    for name in "ab":
        table = pa.table({"episode": np.arange(episodes), "split": ["novel"] * episodes, "linear": acc[name],
                          "zeroshot": [None] * episodes})
        runs.append(experiment(tmp_path, name, {(analysis, "f", "episodes"): table},
                               {(analysis, "f"): {"fewtrans/novel/linear": float(acc[name].mean())}}))
    (diff,) = row(compare(runs), analysis, "fewtrans/novel/linear")["differences"]
    expected = sps.ttest_rel(acc["b"], acc["a"])
    low, high = expected.confidence_interval(0.95)
    assert (diff["paired"], diff["unit"], diff["n"], diff["test"]) == (True, "episode", episodes, "t")
    assert (diff["p"], diff["low"], diff["high"]) == pytest.approx((expected.pvalue, low, high), rel=1e-9)
    assert diff["p_bootstrap"] is None and diff["p_mcnemar"] is None


def test_elevater_seeds_take_a_paired_t_interval_and_full_shots_pair_images(tmp_path):
    rng = np.random.default_rng(5)
    n, classes, seeds = 60, 3, [0, 1, 2, 3]
    labels = np.arange(n) % classes
    runs, right = [], {}
    for name, acc in (("a", 0.5), ("b", 0.65)):
        rows, metrics_ = [], {}
        for shots, use in (("5", seeds), ("full", seeds[:1])):
            for seed in use:
                _, predicted = predictions(n, classes, acc + 0.05 * seed, rng)
                right[name, shots, seed] = predicted == labels
                rows.append(pa.table({"head": ["linear"] * n, "shots": [shots] * n, "seed": [seed] * n,
                                      "sample_id": [f"s{i}" for i in range(n)], "label": labels,
                                      "predicted": predicted}))
            metrics_[f"elevater/linear/{shots}/last"] = float(np.mean([right[name, shots, s].mean() for s in use]))
        runs.append(experiment(tmp_path, name, {("adapt", "e", "elevater_predictions"): pa.concat_tables(rows)},
                               {("adapt", "e"): metrics_}))
    data = compare(runs)
    (five,) = row(data, "adapt", "elevater/linear/5/last")["differences"]
    per_seed = {k: np.array([right[k, "5", s].mean() for s in seeds]) for k in "ab"}
    expected = sps.ttest_rel(per_seed["b"], per_seed["a"])
    assert (five["unit"], five["n"], five["test"]) == ("seed", 4, "t")
    assert (five["p"], five["low"], five["high"]) == pytest.approx(
        (expected.pvalue, *expected.confidence_interval(0.95)), rel=1e-9)
    (full,) = row(data, "adapt", "elevater/linear/full/last")["differences"]
    a, b = right["a", "full", 0], right["b", "full", 0]
    assert (full["unit"], full["n"], full["test"]) == ("image", n, "mcnemar")
    assert full["p"] == pytest.approx(sps.binomtest(int(np.sum(a & ~b)), int(np.sum(a != b))).pvalue)


def test_vtab_median_of_runs_resamples_the_shared_test_set(tmp_path):
    rng = np.random.default_rng(6)
    n, classes, runs_ = 120, 4, 3
    labels = np.arange(n) % classes
    runs, right = [], {}
    for name, acc in (("a", 0.6), ("b", 0.7)):
        predicted = np.stack([predictions(n, classes, acc + 0.03 * r, rng)[1] for r in range(runs_)])
        right[name] = predicted == labels
        table = pa.table({"run": np.repeat(np.arange(runs_), n), "sample_id": [f"s{i}" for i in range(n)] * runs_,
                          "label": np.tile(labels, runs_), "predicted": predicted.ravel()})
        runs.append(experiment(tmp_path, name, {("adapt", "v", "vtab_predictions"): table},
                               {("adapt", "v"): {"vtab/median": float(np.median(right[name].mean(axis=1)))}}))
    (diff,) = row(compare(runs), "adapt", "vtab/median")["differences"]
    assert (diff["paired"], diff["n"], diff["test"]) == (True, n, "bootstrap")
    close(diff, loop_interval(lambda i: np.median(right["b"][:, i].mean(1)) - np.median(right["a"][:, i].mean(1)),
                              n, resamples=2000), share=0.15)


def test_runs_on_different_episodes_are_refused_by_name(tmp_path):
    runs = []
    for name, first in (("a", 0), ("b", 5)):
        table = pa.table({"episode": np.arange(first, first + 10), "split": ["novel"] * 10,
                          "linear": np.linspace(0.4, 0.6, 10)})
        runs.append(experiment(tmp_path, name, {("adapt", "f", "episodes"): table},
                               {("adapt", "f"): {"fewtrans/novel/linear": 0.5}}))
    with pytest.raises(CompareError, match=r"reports/adapt/f\.episodes\.parquet: a and b scored different episodes "
                                           r"\(split/episode differ"):
        compare(runs)


def test_a_table_that_does_not_give_the_reported_number_is_not_paired(tmp_path):
    rng = np.random.default_rng(7)
    runs = []
    for name in "ab":
        _, predicted = predictions(50, 2, 0.6, rng)
        table = pa.table({"sample_id": [f"s{i}" for i in range(50)], "label": np.arange(50) % 2,
                          "predicted": predicted})
        runs.append(experiment(tmp_path, name, {("zeroshot", "d", "predictions"): table},
                               {("zeroshot", "d"): {"accuracy": 0.99}}))
    (diff,) = row(compare(runs), "zeroshot", "accuracy")["differences"]
    assert diff["paired"] is False and diff["p"] is None
    assert "reports/zeroshot/d.predictions.parquet does not reproduce 'accuracy' ([0.99, 0.99] in the result " \
           "files; the table gives accuracy: [" in diff["unpaired_reason"]


# ---------------------------------------------------------------------------------------------- the correction


def holm_loop(p):
    m, order = len(p), np.argsort(p)
    out, running = np.empty(m), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


@pytest.mark.parametrize("method", ["holm", "bh", "none"])
def test_adjusted_p_values_match_independent_computations(method):
    p = np.random.default_rng(8).random(40) ** 3
    p[[3, 17]] = np.nan  # not tests
    ok = np.isfinite(p)
    adjusted = stats.adjust_p(p, method)
    expected = {"holm": lambda q: holm_loop(q), "bh": lambda q: sps.false_discovery_control(q, method="bh"),
                "none": lambda q: q}[method](p[ok])
    assert np.isnan(adjusted[~ok]).all() and adjusted[ok] == pytest.approx(expected, rel=1e-12)


def test_the_winner_is_called_after_the_correction_over_the_rows(tmp_path):
    """Ten datasets with a modest gain each: each raw McNemar p is below 0.05, Holm over ten tests is not."""
    rng = np.random.default_rng(9)
    n = 300
    base = rng.random((10, n)) < 0.6
    gain = base | (rng.random((10, n)) < 0.05)  # b right where a is, and a few more
    runs = []
    for name, right in (("a", base), ("b", gain)):
        tables = {("zeroshot", f"d{k}", "predictions"): pa.table({
            "sample_id": [f"s{i}" for i in range(n)], "label": np.zeros(n, np.int64),
            "predicted": np.where(right[k], 0, 1)}) for k in range(10)}
        runs.append(experiment(tmp_path, name, tables,
                               {("zeroshot", f"d{k}"): {"accuracy": float(right[k].mean())} for k in range(10)}))
    raw = np.array([stats.mcnemar_exact(base[k], gain[k]) for k in range(10)])
    assert (raw < 0.05).sum() >= 5
    for method, expected in (("holm", holm_loop(raw)), ("bh", sps.false_discovery_control(raw)), ("none", raw)):
        data = compare(runs, correction=method)
        diffs = [r["differences"][0] for r in data["rows"]]
        assert [d["p"] for d in diffs] == pytest.approx(raw.tolist())
        assert [d["p_adjusted"] for d in diffs] == pytest.approx(expected.tolist())
        assert [r["winner"] for r in data["rows"]] == ["b" if q < 0.05 else None for q in expected]
        assert data["correction"] == {"method": method, "alpha": 0.05, "tests": 10, "unpaired": False,
                                      "identical_left_out": 0}
    assert sum(q < 0.05 for q in holm_loop(raw)) < sum(q < 0.05 for q in raw)
    with pytest.raises(CompareError, match="--correction 'bonferroni': one of holm, bh, none"):
        compare(runs, correction="bonferroni")


def ten_rows_runs(tmp_path, copy: bool = False) -> tuple[list[Experiment], np.ndarray, np.ndarray]:
    """Ten datasets with a modest gain of b over a each (b right wherever a is, and a few more); with `copy` a third run
    whose per-sample results are a's exactly. (the runs, a's correctness, b's)."""
    rng = np.random.default_rng(9)
    n = 300
    base = rng.random((10, n)) < 0.6
    gain = base | (rng.random((10, n)) < 0.05)
    runs = []
    for name, right in (("a", base), ("b", gain), *((("a_copy", base),) if copy else ())):
        tables = {("zeroshot", f"d{k}", "predictions"): pa.table({
            "sample_id": [f"s{i}" for i in range(n)], "label": np.zeros(n, np.int64),
            "predicted": np.where(right[k], 0, 1)}) for k in range(10)}
        runs.append(experiment(tmp_path, name, tables,
                               {("zeroshot", f"d{k}"): {"accuracy": float(right[k].mean())} for k in range(10)}))
    return runs, base, gain


def test_comparisons_of_identical_results_are_left_out_of_the_family_and_said_so(tmp_path):
    """Issue 44.6: a run whose per-sample results equal another's (no discordant sample, p = 1) cannot reject; it is
    not counted in Holm's family: the 20 tests left are adjusted as the 20 alone, the 10 identical ones are marked, the
    JSON counts them and the text says so."""
    from vlbench.compare_runs import format_table

    runs, base, gain = ten_rows_runs(tmp_path, copy=True)
    data = compare(runs)
    raw = np.array([stats.mcnemar_exact(base[k], gain[k]) for k in range(10)])
    assert data["correction"]["tests"] == 20 and data["correction"]["identical_left_out"] == 10
    for k, r in enumerate(data["rows"]):
        by = {(d["a"], d["b"]): d for d in r["differences"]}
        same = by[("a", "a_copy")]
        assert same["identical"] and same["p"] == 1.0 and same["p_adjusted"] == 1.0
        assert not by[("a", "b")]["identical"] and by[("a", "b")]["p"] == pytest.approx(raw[k])
        assert by[("b", "a_copy")]["p"] == pytest.approx(raw[k])  # b against a's copy: the same test as against a
    family = [d for r in data["rows"] for d in r["differences"] if not d["identical"]]
    assert [d["p_adjusted"] for d in family] == pytest.approx(holm_loop(np.array([d["p"] for d in family])).tolist())
    text = format_table(data)
    assert "a_copy-a +0.0000 p=1 identical, not in the family (mcnemar)" in text
    assert text.splitlines()[-1] == ("p adjusted: Holm over 20 tests; 10 comparison(s) of identical per-sample results "
                                     "left out of the family (no discordant unit: p = 1, they cannot reject)")


def test_the_leaderboard_says_where_it_and_the_pairwise_table_differ(tmp_path):
    """Issue 44.6: a column's rank intervals (95%, this column alone) can put b above a while Holm over the ten rows
    calls no winner; the leaderboard's column says so, and says nothing where the two agree."""
    from vlbench.leaderboard import agreement, format_leaderboard, separated_first

    runs, _, _ = ten_rows_runs(tmp_path)
    data = compare(runs, leaderboard=True)
    winners = {f"{r['analysis']}/{r['dataset']}/{r['metric']}": r["winner"] for r in data["rows"]}
    columns = data["leaderboard"]["columns"]
    differ = [c for c in columns if c["first"] != c["winner"]]
    assert differ and any(c["winner"] == "b" for c in columns)  # both stories occur on these rows
    for c in columns:
        assert c["winner"] == winners[c["id"]]
        cells = {r["experiment"]: r["cells"][c["id"]] for r in data["leaderboard"]["rows"]}
        expected_first = "b" if cells["b"]["rank_high"] < cells["a"]["rank_low"] else None
        assert c["first"] == expected_first == separated_first(cells)
        assert ("note" in c) == (c["first"] != c["winner"])
    note = differ[0]["note"]
    assert note == ("b's rank interval lies above every other's (95% percentiles of this column's ranks, not "
                    "adjusted), but not all its pairwise differences survive the correction (holm over 10 tests): "
                    "no winner")
    assert f"note: {differ[0]['id']}: {note}" in format_leaderboard(data["leaderboard"])
    assert agreement("b", "b", {}) is None and agreement(None, None, {}) is None


# ------------------------------------------------------------------------------------------------- leaderboard


def leaderboard_runs(tmp_path, accuracies: dict[str, float], models: dict[str, str] | None = None,
                     n: int = 2000) -> tuple[list[Experiment], dict[str, np.ndarray]]:
    """Runs on zero-shot imagenet-1k (the dataset open_clip's table has; each run's errors independent) and a demo
    dataset; (the runs, their imagenet-1k correctness)."""
    rng = np.random.default_rng(10)
    labels = np.arange(n) % 10
    runs, rights = [], {}
    for name, acc in accuracies.items():
        base = rng.permutation(n) / n
        right = rights[name] = base < acc  # exactly round(acc * n) right
        predicted = np.where(right, labels, (labels + 1) % 10)
        shapes = np.where(base < acc - 0.05, labels, (labels + 1) % 10)
        interval = stats.bootstrap_sample_metric("accuracy", right).to_json()
        tables = {("zeroshot", "imagenet-1k", "predictions"): pa.table({
            "sample_id": [f"s{i}" for i in range(n)], "label": labels, "predicted": predicted}),
            ("zeroshot", "shapes", "predictions"): pa.table({
                "sample_id": [f"s{i}" for i in range(n)], "label": labels, "predicted": shapes})}
        results = {("zeroshot", "imagenet-1k"): {"metrics": {"accuracy": float(right.mean())},
                                                 "intervals": {"accuracy": interval}},
                   ("zeroshot", "shapes"): {"metrics": {"accuracy": float((shapes == labels).mean())}}}
        runs.append(experiment(tmp_path, name, tables, results, model=(models or {}).get(name, "toy")))
    return runs, rights


def test_leaderboard_ranks_with_bootstrap_rank_intervals_and_ties(tmp_path):
    runs, right = leaderboard_runs(tmp_path, {"low": 0.40, "mid": 0.60, "mid2": 0.605, "top": 0.80})
    data = compare(runs)  # more than two experiments: a leaderboard
    board = data["leaderboard"]
    assert [c["id"] for c in board["columns"]] == ["zeroshot/imagenet-1k/accuracy", "zeroshot/shapes/accuracy"]
    cells = {r["experiment"]: r["cells"]["zeroshot/imagenet-1k/accuracy"] for r in board["rows"]}
    # the rank intervals against a loop: resample the images jointly for every run, rank each replicate
    names = list(right)
    reps = np.array([[right[k][i].mean() for k in names] for i in np.random.default_rng(11).integers(0, 2000,
                                                                                                   (1000, 2000))])
    ranks = 1 + (reps[:, None, :] > reps[:, :, None]).sum(axis=2)
    expected = {k: tuple(np.quantile(ranks[:, j], [0.025, 0.975], method="inverted_cdf")) for j, k in enumerate(names)}
    assert {k: (c["rank_low"], c["rank_high"]) for k, c in cells.items()} == expected == {
        "low": (4, 4), "mid": (2, 3), "mid2": (2, 3), "top": (1, 1)}
    assert {k: c["rank"] for k, c in cells.items()} == {"top": 1, "mid2": 2, "mid": 2, "low": 4}  # a tie
    assert {cells["mid2"]["rank_by_value"], cells["mid"]["rank_by_value"]} == {2, 3}
    assert cells["top"]["low"] < cells["top"]["value"] < cells["top"]["high"]
    assert data["rows"][0]["winner"] == "top" and {p["paper"] for p in board["published"]} == {"open_clip"}


def test_leaderboard_places_published_rows_and_marks_verdicts(tmp_path):
    """open_clip's ViT-B-32 openai row (imagenet-1k 0.6332): a run of vitb32 at that accuracy is reproduced, one
    at 0.60 is off; the other published models of the column stand beside them."""
    from vlbench.reference import load_tables

    runs, _ = leaderboard_runs(tmp_path, {"mine": 0.6332, "theirs": 0.60, "toy": 0.3},
                            models={"mine": "vitb32", "theirs": "vitb32"})
    board = compare(runs)["leaderboard"]
    cells = {r["experiment"]: r["cells"]["zeroshot/imagenet-1k/accuracy"] for r in board["rows"]}
    assert cells["mine"]["verdict"] == "reproduced" and cells["theirs"]["verdict"] == "off"
    assert cells["mine"]["published"] == 0.6332 and "verdict" not in cells["toy"]
    assert "verdict" not in next(r for r in board["rows"] if r["experiment"] == "mine")["cells"][
        "zeroshot/shapes/accuracy"]
    expected = {(r.model_name, r.value) for t in load_tables() for r in t.rows
                if (r.analysis, r.dataset, r.metric) == ("zeroshot", "imagenet-1k", "accuracy")}
    found = {(p["model_name"], p["values"]["zeroshot/imagenet-1k/accuracy"]["value"]) for p in board["published"]}
    assert found == expected and len(found) >= 10
    assert {r["model"] for r in board["rows"]} == {"vitb32", "toy"}


def test_two_experiments_get_a_leaderboard_only_when_asked(tmp_path):
    runs, _ = leaderboard_runs(tmp_path, {"a": 0.5, "b": 0.6})
    assert "leaderboard" not in compare(runs)
    board = compare(runs, leaderboard=True)["leaderboard"]
    assert [r["experiment"] for r in board["rows"]] == ["a", "b"]


def test_a_number_only_one_run_has_is_listed_without_differences(tmp_path):
    """A dataset one experiment ran and the other did not (vlbench's own-data flow): its row, no difference, no
    winner (it ended in StopIteration)."""
    table = pa.table({"sample_id": ["s0", "s1"], "label": [0, 1], "predicted": [0, 0]})
    runs = [experiment(tmp_path, "a", {("zeroshot", "mine", "predictions"): table},
                       {("zeroshot", "mine"): {"accuracy": 0.5}}),
            experiment(tmp_path, "b", {}, {("zeroshot", "other"): {"accuracy": 0.4}})]
    found = row(compare(runs), "zeroshot", "accuracy")
    assert (found["dataset"], list(found["values"]), found["differences"], found["winner"]) == ("mine", ["a"], [], None)


def test_the_rank_shown_is_one_plus_the_intervals_entirely_above_as_the_readme_says():
    """Issue 44.5: the README said experiments whose rank intervals overlap share a rank, which no rule can keep
    together with separated experiments ranking apart (B overlaps D, D overlaps E, B lies above E). The rule, stated
    in docs/comparing.md and docs/protocols.md: 1 + the intervals entirely above; separated experiments never share a rank."""
    from vlbench.leaderboard import shown_ranks

    intervals = {"A": (1, 1), "B": (2, 3), "C": (2, 4), "D": (3, 4), "E": (4, 5)}
    assert shown_ranks(intervals) == {"A": 1, "B": 2, "C": 2, "D": 2, "E": 3}
    rng = np.random.default_rng(12)
    for _ in range(200):
        lows = rng.integers(1, 8, 6)
        found = {k: (int(lo), int(lo + rng.integers(0, 4))) for k, lo in zip("abcdef", lows)}
        shown = shown_ranks(found)
        for x, (_, x_high) in found.items():
            assert shown[x] == 1 + sum(high < found[x][0] for _, high in found.values())
            for y, (y_low, _) in found.items():
                if x_high < y_low:  # x separated above y
                    assert shown[x] < shown[y]
    page = (Path(__file__).resolve().parents[1] / "docs/comparing.md").read_text()  # the README's comparing page
    assert "experiments whose rank intervals overlap share a rank" not in page
    assert "the rank shown is 1 + the number of experiments whose rank interval lies entirely above this\none's" in page
