"""VTAB-1k linear evaluation (vlbench/analyses/adapt/vtab.py): the schedule, the batches, the zero-initialised head
against a torch reference, train800/val200 selection, the median of three runs and the group means."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from vlbench.analyses.adapt import vtab
from vlbench.analyses.adapt.protocol import AdaptError
from vlbench.datasets.canonical import ClassInfo, DatasetMeta
from vlbench.features import Features

SMALL = {"train_examples": 80, "val_examples": 20, "steps": [30, 60], "batch_size": 32, "learning_rates": [0.1, 0.01]}


class FakeInputs:
    """Gaussian clusters split into train / val / test, in memory."""

    def __init__(self, name="fake", sizes=None, num_classes=4, dim=8, seed=0, noise=1.0, preprocess="squash"):
        rng = np.random.default_rng(seed)
        self.means = rng.normal(size=(num_classes, dim)) * 2
        self.sizes = sizes or {"train": 120, "val": 40, "test": 200}
        classes = [ClassInfo(index=i, name=f"c{i}") for i in range(num_classes)]
        self.meta = DatasetMeta(name=name, task="single-label", metric="accuracy", classes=classes,
                                splits=dict(self.sizes), preprocess=preprocess)
        self.noise, self.seed = noise, seed

    def has_split(self, split):
        return split in self.meta.splits

    def images(self, split):
        rng = np.random.default_rng([self.seed, len(split)])
        y = rng.integers(0, len(self.meta.classes), self.sizes[split])
        x = self.means[y] + self.noise * rng.normal(size=(len(y), self.means.shape[1]))
        return Features(pa.table({"sample_id": [f"{split}{i}" for i in range(len(y))], "label": y}),
                        x.astype(np.float32), {}, [])


# ------------------------------------------------------------------------------------------------ schedule and batches

def test_decay_points_are_the_codes():
    assert vtab.decay_boundaries(2500, [0.3, 0.6, 0.9]) == [750, 1500, 2250]  # README: --decay_steps 750,1500,2250
    assert vtab.decay_boundaries(10000, [0.3, 0.6, 0.9]) == [3000, 6000, 9000]
    assert vtab.decay_boundaries(1000, [0.3, 0.6, 0.9]) == [300, 600, 900]  # run_all_tasks.sh


def test_learning_rate_drops_after_each_boundary_like_piecewise_constant():
    s = vtab.settings({})
    lr = vtab.learning_rates(0.1, 2500, s)
    assert lr.shape == (2500,)
    # piecewise_constant: values[0] while step <= 750, values[1] for 750 < step <= 1500, ...
    assert lr[0] == lr[750] == pytest.approx(0.1)
    assert lr[751] == lr[1500] == pytest.approx(0.01)
    assert lr[1501] == lr[2250] == pytest.approx(0.001)
    assert lr[2251] == lr[2499] == pytest.approx(0.0001)
    warm = vtab.learning_rates(0.1, 100, {**s, "warmup_steps": 10})
    assert warm[0] == 0 and warm[5] == pytest.approx(0.05) and warm[10] == pytest.approx(0.1)


def test_batches_are_consecutive_slices_of_epoch_permutations():
    blocks = list(vtab.batch_stream(np.random.default_rng(0), 10, 4, 9, block=4))
    assert [b.shape for b in blocks] == [(4, 4), (4, 4), (1, 4)]
    stream = np.concatenate([b.reshape(-1) for b in blocks])  # 36 indices: 3 full epochs and 6 of the fourth
    for e in range(3):
        assert sorted(stream[10 * e:10 * e + 10]) == list(range(10))
    assert len(set(stream[30:].tolist())) == 6
    again = np.concatenate([b.reshape(-1) for b in vtab.batch_stream(np.random.default_rng(0), 10, 4, 9, block=4)])
    assert (again == stream).all()
    other = np.concatenate([b.reshape(-1) for b in vtab.batch_stream(np.random.default_rng(0), 10, 4, 9, block=2)])
    assert (other == stream).all()  # the block size is a runtime detail


# ------------------------------------------------------------------------------------------------ heads

def _data(n=60, d=5, c=3, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, c, n)
    return (rng.normal(size=(c, d))[y] * 2 + rng.normal(size=(n, d))).astype(np.float32), y


def test_head_starts_at_zero_and_a_zero_rate_leaves_it_there():
    x, y = _data()
    s = {**vtab.settings({}), "batch_size": 16}
    lrs, ends = vtab.rate_table([[(0.1, 5)]], s)
    w, b = vtab.train_heads(x, y, 3, np.zeros_like(lrs), ends, [np.random.default_rng(0)], [60], s, "cpu")
    assert w.shape == (1, 1, 5, 3) and not w.any() and not b.any()
    # one step from zero: grad = X_b^T (1/C - onehot) / B, so w = -lr * grad
    lrs, ends = vtab.rate_table([[(0.1, 1)]], s)
    w, b = vtab.train_heads(x, y, 3, lrs, ends, [np.random.default_rng(1)], [60], s, "cpu")
    idx = next(vtab.batch_stream(np.random.default_rng(1), 60, 16, 1))[0]
    g = (np.full((16, 3), 1 / 3) - np.eye(3)[y[idx]]) / 16
    assert np.allclose(w[0, 0].numpy(), -0.1 * x[idx].T @ g, atol=1e-6)
    assert np.allclose(b[0, 0].numpy(), -0.1 * g.sum(0), atol=1e-6)


def test_heads_match_torch_sgd_momentum_reference():
    """Two streams x two settings against nn.Linear (zeros) + torch.optim.SGD(momentum=0.9) with the same batches
    and the piecewise-constant rate, one head at a time."""
    x, y = _data(n=50)
    s = {**vtab.settings({}), "batch_size": 16}
    plan = [(0.1, 40), (0.05, 20)]
    lrs, ends = vtab.rate_table([plan, plan], s)
    w, b = vtab.train_heads(x, y, 3, lrs, ends, [np.random.default_rng(k) for k in (0, 1)], [50, 30], s, "cpu")
    for r, rows in ((0, 50), (1, 30)):
        batches = np.concatenate(list(vtab.batch_stream(np.random.default_rng(r), rows, 16, 40)))
        for a, (lr0, steps) in enumerate(plan):
            head = torch.nn.Linear(5, 3)
            torch.nn.init.zeros_(head.weight)
            torch.nn.init.zeros_(head.bias)
            opt = torch.optim.SGD(head.parameters(), lr=lr0, momentum=0.9)
            rates = vtab.learning_rates(lr0, steps, s)
            for t in range(steps):
                opt.param_groups[0]["lr"] = float(rates[t])
                opt.zero_grad()
                idx = batches[t]
                torch.nn.functional.cross_entropy(head(torch.tensor(x[idx])), torch.tensor(y[idx])).backward()
                opt.step()
            assert np.allclose(w[r, a].numpy(), head.weight.detach().numpy().T, atol=1e-5)
            assert np.allclose(b[r, a].numpy(), head.bias.detach().numpy(), atol=1e-5)


def test_one_loop_and_two_loops_give_the_same_final_heads():
    """The GPU path (every setting also trained on the 1,000, one loop) and the CPU path (the chosen setting only)
    draw the same batches: the chosen final heads agree."""
    inputs = FakeInputs()
    s = vtab.settings({**SMALL, "groups": {"fake": "natural"}})
    data = vtab.load_splits(inputs, s)
    plan = vtab.sweep_plan(s)
    lrs, ends = vtab.rate_table([plan] * 6, s)
    both = data["train800val200"]
    rngs = vtab.run_rngs(0, 3, "sweep") + vtab.run_rngs(0, 3, "final")
    w, _ = vtab.train_heads(both.x, both.y, 4, lrs, ends, rngs, [80] * 3 + [100] * 3, s, "cpu")
    chosen = [2, 0, 3]
    lrs1, ends1 = vtab.rate_table([[plan[k]] for k in chosen], s)
    w1, _ = vtab.train_heads(both.x, both.y, 4, lrs1, ends1, vtab.run_rngs(0, 3, "final"), [100] * 3, s, "cpu")
    for r, k in enumerate(chosen):
        assert np.allclose(w[3 + r, k].numpy(), w1[r, 0].numpy(), atol=1e-5)
    _, sweep, _, _ = vtab.train_runs(data, 4, s, 0, "cpu")
    assert np.allclose(sweep[0].numpy(), w[:3].numpy(), atol=1e-5)


def test_train_heads_refuses_settings_out_of_order():
    x, y = _data()
    s = {**vtab.settings({}), "batch_size": 16}
    lrs, ends = vtab.rate_table([[(0.1, 5), (0.1, 9)]], s)
    with pytest.raises(ValueError, match="decreasing steps"):
        vtab.train_heads(x, y, 3, lrs, ends, [np.random.default_rng(0)], [60], s, "cpu")


# ------------------------------------------------------------------------------------------------ the protocol

def test_splits_are_index_ranges_train800_val200():
    inputs = FakeInputs()
    s = vtab.settings(SMALL)
    data = vtab.load_splits(inputs, s)
    train, val = inputs.images("train"), inputs.images("val")
    assert (data["train800"].x == train.embeddings[:80]).all() and (data["select"].x == val.embeddings[:20]).all()
    assert (data["train800val200"].x == np.concatenate([train.embeddings[:80], val.embeddings[:20]])).all()
    assert data["sweep"] is data["train800"]
    paper = vtab.load_splits(inputs, {**s, "selection": "paper"})
    assert (paper["select"].x == val.embeddings).all() and len(paper["select"].y) == 40  # the whole validation split
    assert (paper["sweep"].x == data["train800val200"].x).all() and len(paper["sweep"].y) == 100  # train on the 1,000
    with pytest.raises(AdaptError, match="full_val is now paper"):
        vtab.settings({"selection": "full_val"})


def test_paper_selection_sweeps_on_the_1000_and_selects_on_the_whole_validation_split(monkeypatch):
    """App. I: train on the 1,000, select on the regular validation set; the final run retrains on the 1,000."""
    seen = []
    real = vtab.predictions
    monkeypatch.setattr(vtab, "predictions", lambda w, b, x: seen.append(len(x)) or real(w, b, x))
    inputs = FakeInputs(name="blobs", noise=2.5)
    cfg = {**SMALL, "groups": {"blobs": "structured"}}
    paper = vtab.evaluate(inputs, {**cfg, "selection": "paper"}, seed=0, device="cpu")
    assert seen == [40, 200]  # selection on all 40 validation rows, then the test split
    assert paper.counts == {"train800": 80, "sweep_train": 100, "selection": 40, "final_train": 100, "test": 200}
    s = vtab.settings({**cfg, "selection": "paper"})
    data = vtab.load_splits(inputs, s)
    sweep = vtab.train_runs(data, 4, s, 0, "cpu")[1]
    s800 = vtab.settings(cfg)
    sweep800 = vtab.train_runs(vtab.load_splits(inputs, s800), 4, s800, 0, "cpu")[1]
    assert not np.allclose(sweep[0].numpy(), sweep800[0].numpy())  # the 200 validation rows are trained on
    lrs, ends = vtab.rate_table([vtab.sweep_plan(s)] * 3, s)
    want = vtab.train_heads(data["train800val200"].x, data["train800val200"].y, 4, lrs, ends,
                            vtab.run_rngs(0, 3, "sweep"), [100] * 3, s, "cpu")
    assert np.allclose(sweep[0].numpy(), want[0].numpy())


def test_sweep_plan_order_and_ties_go_to_the_earlier_setting():
    plan = vtab.sweep_plan(vtab.settings({}))
    assert plan == [(0.1, 10000), (0.01, 10000), (0.1, 2500), (0.01, 2500)]
    assert vtab.choose(np.array([[0.5, 0.7, 0.7, 0.1], [0.9, 0.9, 0.9, 0.9]])) == [1, 0]


def test_evaluate_reports_the_median_of_three_runs():
    inputs = FakeInputs(name="blobs", noise=2.5)
    result = vtab.evaluate(inputs, {**SMALL, "groups": {"blobs": "structured"}}, seed=0, device="cpu")
    runs = result.details["runs"]
    assert len(runs) == 3 and result.details["group"] == "structured"
    tests = [r["test_accuracy"] for r in runs]
    assert result.metrics == {"vtab/median": pytest.approx(float(np.median(tests)))}
    assert result.metrics["vtab/median"] > 0.5  # chance is 0.25
    for r in runs:
        best = max(r["selection_accuracy"].values())
        key = f"lr={r['chosen']['learning_rate']},steps={r['chosen']['steps']}"
        assert r["selection_accuracy"][key] == best
    assert result.details["schedule"] == {"30": [9, 18, 27], "60": [18, 36, 54]}
    assert result.counts == {"train800": 80, "sweep_train": 80, "selection": 20, "final_train": 100, "test": 200}
    again = vtab.evaluate(inputs, {**SMALL, "groups": {"blobs": "structured"}}, seed=0, device="cpu")
    assert again.details["runs"] == runs
    s = vtab.settings({**SMALL, "groups": {"blobs": "structured"}})
    data = vtab.load_splits(inputs, s)
    w0 = vtab.train_runs(data, 4, s, 0, "cpu")[1][0].numpy()
    w1 = vtab.train_runs(data, 4, s, 1, "cpu")[1][0].numpy()
    assert not np.allclose(w0[0], w0[1]) and not np.allclose(w0, w1)  # each run and seed its own batch order


def test_median_of_the_three_runs_chosen_heads(monkeypatch):
    scores = iter([np.array([[0.5, 0.6, 0.9, 0.8], [0.9, 0.1, 0.1, 0.1], [0.0, 0.0, 0.0, 0.3]])])  # selection

    def final_predictions(data, *args):  # runs right on the first 20%, 90%, 40% of the test samples
        y = data["test"].y
        cut = [int(a * len(y)) for a in (0.2, 0.9, 0.4)]
        return np.stack([np.r_[y[:k], (y[k:] + 1) % 4] for k in cut])

    monkeypatch.setattr(vtab, "accuracies", lambda *args: next(scores))
    monkeypatch.setattr(vtab, "final_test_predictions", final_predictions)
    result = vtab.evaluate(FakeInputs(), {**SMALL, "groups": {"fake": "natural"}}, seed=0, device="cpu")
    assert result.metrics == {"vtab/median": 0.4}
    plan = vtab.sweep_plan(vtab.settings(SMALL))
    assert [r["chosen"] for r in result.details["runs"]] == [
        {"learning_rate": plan[k][0], "steps": plan[k][1]} for k in (2, 0, 3)]


def test_test_predictions_of_every_run_and_the_median_interval():
    """Per-sample predictions of each run's final head (for paired comparisons) and a bootstrap interval of the
    median over runs, checked against scipy's paired percentile bootstrap of the same statistic."""
    from scipy import stats as sps

    inputs = FakeInputs(name="blobs", noise=2.5)
    result = vtab.evaluate(inputs, {**SMALL, "groups": {"blobs": "structured"}}, seed=0, device="cpu")
    table = result.tables["vtab_predictions"]
    test = inputs.images("test").table
    assert table.num_rows == 3 * test.num_rows
    assert table["sample_id"].to_pylist() == test["sample_id"].to_pylist() * 3
    correct = (table["predicted"].to_numpy() == table["label"].to_numpy()).reshape(3, -1)
    assert sorted(correct.mean(axis=1)) == pytest.approx(sorted(r["test_accuracy"] for r in result.details["runs"]))
    interval = result.intervals["vtab/median"]
    assert interval["method"] == "bootstrap" and interval["low"] < result.metrics["vtab/median"] < interval["high"]
    ref = sps.bootstrap(tuple(correct.astype(float)), lambda *runs, axis: np.median([r.mean(axis=axis) for r in runs], axis=0),
                        paired=True, method="percentile", n_resamples=4000, random_state=1, vectorized=True).confidence_interval
    assert interval["low"] == pytest.approx(ref.low, abs=0.02) and interval["high"] == pytest.approx(ref.high, abs=0.02)


def test_errors_name_the_dataset_split_and_key():
    with pytest.raises(AdaptError, match="no VTAB group.*adapt.vtab.groups"):
        vtab.evaluate(FakeInputs(name="mystery"), SMALL, 0)
    with pytest.raises(AdaptError, match="train_examples is 800 but the split has 120"):
        vtab.evaluate(FakeInputs(), {"groups": {"fake": "natural"}}, 0)
    with pytest.raises(AdaptError, match="no split 'val'"):
        vtab.evaluate(FakeInputs(sizes={"train": 100, "test": 50}), {**SMALL, "groups": {"fake": "natural"}}, 0)
    with pytest.raises(AdaptError, match="unknown key"):
        vtab.settings({"step": [1]})
    with pytest.raises(AdaptError, match="groups"):
        vtab.settings({"groups": {"x": "natural-ish"}})
    with pytest.raises(AdaptError, match=r"'fake' is prepared with preprocess 'default'.*preprocess: squash.*"
                                         r"conf/dataset/fake.yaml"):
        vtab.evaluate(FakeInputs(preprocess="default"), {**SMALL, "groups": {"fake": "natural"}}, 0)
    accepted = vtab.evaluate(FakeInputs(preprocess="default"), {**SMALL, "groups": {"fake": "natural"},
                                                                "preprocess": "default", "runs": 1}, 0, "cpu")
    assert accepted.metrics["vtab/median"] > 0.5


def test_groups_from_data_and_params_and_their_means():
    assert vtab.task_group("svhn", {}) == "natural" and vtab.task_group("eurosat", {}) == "specialized"
    assert vtab.task_group("dsprites_location", {}) == "structured"
    assert vtab.task_group("svhn", {"svhn": "structured"}) == "structured"  # params first
    groups = {"a": "natural", "b": "natural", "c": "structured"}
    means = vtab.group_means({"a": 0.5, "b": 0.7, "c": 0.9}, groups)
    assert means == pytest.approx({"vtab/natural": 0.6, "vtab/structured": 0.9, "vtab/mean": 0.7})
    import json

    table = json.loads(vtab.GROUPS_FILE.read_text())["groups"]
    assert len(table) == 19 and sorted(set(table.values())) == list(vtab.GROUPS)
    assert [sum(v == g for v in table.values()) for g in vtab.GROUPS] == [7, 4, 8]


def test_report_adds_group_means_from_each_results_group():
    """reports/metrics.json's adapt.mean gets vtab/<group> (mean of the group's task medians) and vtab/mean (over tasks)."""
    from vlbench.report.adapt import with_vtab_groups

    metrics = {"adapt": {"a": {"vtab/median": 0.2}, "b": {"vtab/median": 0.4}, "c": {"vtab/median": 0.9},
                         "mean": {"elevater/x": 0.5}}}
    results = {"a": {"details": {"vtab": {"group": "natural"}}}, "b": {"details": {"vtab": {"group": "natural"}}},
               "c": {"details": {"vtab": {"group": "structured"}}}}
    means = with_vtab_groups(metrics, results)["adapt"]["mean"]
    assert means["vtab/natural"] == pytest.approx(0.3)
    assert means["vtab/structured"] == pytest.approx(0.9)
    assert means["vtab/mean"] == pytest.approx(0.5)
    assert means["elevater/x"] == 0.5 and "vtab/specialized" not in means
