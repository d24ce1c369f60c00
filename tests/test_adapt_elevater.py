"""ELEVATER linear probing (vlbench.analyses.adapt.elevater) and the adapt analysis shell: the sampler, the 20% rule,
the batch order, batched heads against torch's own SGD, the toolkit's search, the heads' initialisation, the protocol
end to end on synthetic features, and the report pieces."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
import yaml

from vlbench import stats
from vlbench.analyses import adapt
from vlbench.analyses.adapt import protocol, elevater
from vlbench.analyses.adapt.protocol import AdaptError, LinearHeads
from vlbench.datasets.canonical import ClassInfo, DatasetMeta
from vlbench.features import Features
from vlbench.report import adapt as report_adapt

ROOT = Path(__file__).resolve().parent.parent

PROJECTED_HEADS = ("random_2p", "language_2p")  # the heads that need projected embeddings only


# --------------------------------------------------------------------------------------------------
# sampling and validation


def test_single_label_sampler_takes_the_first_n_of_each_class_in_the_seeded_shuffle():
    labels = [[i % 4] for i in range(40)]
    kept = elevater.few_shot_subset(labels, 4, n=3, seed=7)
    order = list(range(40))
    random.Random(7).shuffle(order)
    expected = [i for c in range(4) for i in [j for j in order if labels[j][0] == c][:3]]
    assert sorted(kept.tolist()) == sorted(expected)
    assert kept.tolist() == [i for i in order if i in set(expected)]  # kept in the shuffled order
    assert np.bincount([labels[i][0] for i in kept], minlength=4).tolist() == [3, 3, 3, 3]
    assert kept.tolist() == elevater.few_shot_subset(labels, 4, 3, 7).tolist()  # seeded
    assert kept.tolist() != elevater.few_shot_subset(labels, 4, 3, 8).tolist()


def test_sampler_keeps_negatives_up_to_n_and_a_small_class_whole():
    labels = [[0]] * 10 + [[1]] * 2 + [[]] * 5
    kept = elevater.few_shot_subset(labels, 2, n=4, seed=0)
    got = [tuple(labels[i]) for i in kept]
    assert got.count((0,)) == 4 and got.count((1,)) == 2 and got.count(()) == 4


def test_multilabel_sampler_follows_the_min_max_rule_and_covers_every_class():
    # n = 2: an image whose labels are all at 2 is skipped; one with a label at <= 1 (n/2) is kept
    labels = [[0, 1], [0, 1], [0, 1], [0, 2], [2], [1]]
    order = list(range(6))
    random.Random(3).shuffle(order)
    kept = elevater.few_shot_subset(labels, 3, n=2, seed=3)
    counts, expected = [0, 0, 0], []
    for i in order:  # the rule restated: keep while some label is below n/2 or all are below 1.5 n
        have = [counts[c] for c in labels[i]]
        if min(have) < 2 and (min(have) <= 1 or max(have) <= 3):
            expected.append(i)
            for c in labels[i]:
                counts[c] += 1
        if min(counts) >= 2:
            break
    assert kept.tolist() == expected
    assert all(any(c in labels[i] for i in kept) for c in range(3))


def test_toolkit_shots_turns_one_shot_into_two_without_merging():
    assert elevater.toolkit_shots(1) == (2, False)
    assert elevater.toolkit_shots(5) == (5, True)
    assert elevater.toolkit_shots("full") == (None, True)


@pytest.mark.parametrize("per_class, n_val", [(2, 1), (5, 1), (20, 4), (50, 10), (7, 2), (1, 0)])
def test_validation_is_the_first_ceil_20_percent_of_each_class_with_one_image_left_each_side(per_class, n_val):
    labels = np.array([0, 1, 2] * per_class)
    train, val = elevater.validation_split(labels, 0.2)
    for c in range(3):
        where = np.flatnonzero(labels == c)
        assert val[np.isin(val, where)].tolist() == where[:n_val].tolist()
        assert np.isin(where, train).sum() == per_class - n_val >= 1
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(labels.size))


def test_multilabel_validation_is_the_toolkit_greedy_cover():
    targets = np.array([[1, 0, 0], [1, 1, 0], [0, 1, 0], [1, 0, 1], [0, 0, 1], [1, 1, 1]])
    # positives 4, 3, 3 -> want ceil(0.8)=1, ceil(0.6)=1, 1: class 0 takes sample 0; class 1 sample 1; class 2 sample 3
    assert elevater.multilabel_validation(targets, 0.2).tolist() == [0, 1, 3]
    lone = np.array([[1, 0], [1, 0], [0, 1]])  # class 1 has one positive: it stays in train
    train, val = elevater.validation_split(lone, 0.2)
    assert val.tolist() == [0] and train.tolist() == [1, 2]


def test_epoch_orders_are_the_toolkit_loaders_batches():
    loader = torch.utils.data.DataLoader(list(range(11)), batch_size=4, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    expected = [torch.cat(list(loader)).tolist() for _ in range(4)]
    assert [o.tolist() for o in elevater.epoch_orders(11, 4)] == expected


# --------------------------------------------------------------------------------------------------
# batched heads against torch


def torch_sgd_reference(x, y, w0, b0, lr, wd, steps, loss, nesterov=False, scale=1.0):
    layer = torch.nn.Linear(w0.shape[0], w0.shape[1])
    layer.weight.data = torch.tensor(w0.T.copy())
    layer.bias.data = torch.tensor(b0.copy())
    opt = torch.optim.SGD(layer.parameters(), lr=lr, momentum=0.9, weight_decay=wd, nesterov=nesterov)
    crit = torch.nn.CrossEntropyLoss() if loss == "softmax" else torch.nn.BCEWithLogitsLoss()
    for xb, yb in steps(x, y):
        opt.zero_grad()
        crit(scale * layer(xb), yb).backward()
        opt.step()
    return layer.weight.detach().numpy().T, layer.bias.detach().numpy()


@pytest.mark.parametrize("loss, nesterov", [("softmax", False), ("softmax", True), ("sigmoid", False)])
def test_batched_heads_equal_torch_sgd_one_head_at_a_time(loss, nesterov):
    rng = np.random.default_rng(0)
    x = torch.tensor(rng.normal(size=(40, 6)), dtype=torch.float32)
    y = torch.tensor(rng.integers(0, 3, 40)) if loss == "softmax" else torch.tensor(
        (rng.random((40, 3)) < 0.4).astype(np.float32))
    configs = [(0.1, 1e-4), (0.01, 1.0), (0.3, 0.0)]
    w0 = rng.normal(size=(3, 6, 3)).astype(np.float32)
    b0 = rng.normal(size=(3, 3)).astype(np.float32)
    steps = lambda x, y: [(x[i:i + 8], y[i:i + 8]) for i in range(0, 40, 8)] * 3
    heads = LinearHeads(w0, b0, [c[0] for c in configs], [c[1] for c in configs], nesterov=nesterov, loss=loss,
                        logit_scale=2.0, on=torch.device("cpu"))
    for xb, yb in steps(x, y):
        heads.sgd_step(xb, yb)
    for k, (lr, wd) in enumerate(configs):
        w, b = torch_sgd_reference(x, y, w0[k], b0[k], lr, wd, steps, loss, nesterov, scale=2.0)
        np.testing.assert_allclose(heads.weight[k].numpy(), w, atol=2e-5)
        np.testing.assert_allclose(heads.bias[k].numpy(), b, atol=2e-5)


def test_channel_batch_norm_is_torch_batchnorm_without_affine():
    rng = np.random.default_rng(1)
    bn_ref = torch.nn.BatchNorm1d(5, affine=False)
    ours = elevater.ChannelBatchNorm(5, torch.device("cpu"))
    for _ in range(3):
        xb = torch.tensor(rng.normal(2.0, 3.0, size=(7, 5)), dtype=torch.float32)
        bn_ref.train()
        np.testing.assert_allclose(ours.train(xb).numpy(), bn_ref(xb).detach().numpy(), atol=1e-5)
    xe = torch.tensor(rng.normal(size=(4, 5)), dtype=torch.float32)
    bn_ref.eval()
    np.testing.assert_allclose(ours.eval(xe).numpy(), bn_ref(xe).detach().numpy(), atol=1e-5)


def toolkit_style_run(x, y, xv, yv, w0, b0, lr, wd, epochs, batch):
    """The toolkit's train_task for one configuration: BatchNorm1d(affine=False) + Linear, SGD, a loader seeded 0."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(x.shape[1], affine=False), torch.nn.Linear(*w0.shape))
    model[1].weight.data, model[1].bias.data = torch.tensor(w0.T.copy()), torch.tensor(b0.copy())
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=wd, nesterov=False)
    data = torch.utils.data.TensorDataset(torch.tensor(x), torch.tensor(y))
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    scores = []
    for _ in range(epochs):
        model.train()
        for xb, yb in loader:
            if xb.shape[0] == 1:
                continue
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            probs = model(torch.tensor(xv)).softmax(-1).numpy()
        scores.append(float((probs.argmax(1) == yv).mean()) if np.isfinite(probs).all() else 0.0)
    return scores


def test_train_epochs_reproduces_the_toolkit_loop_config_by_config():
    rng = np.random.default_rng(2)
    centers = rng.normal(size=(3, 10)) * 1.5
    y, yv = rng.integers(0, 3, 41), rng.integers(0, 3, 30)  # 41 % 8 == 1: the one-image batch is skipped
    x = (centers[y] + rng.normal(size=(41, 10))).astype(np.float32)
    xv = (centers[yv] + rng.normal(size=(30, 10))).astype(np.float32)
    w0, b0 = protocol.pytorch_linear_init(10, 3, seed=0)
    configs = [(0.1, 1e-6), (0.01, 1e-2), (1e-3, 1.0)]
    heads = LinearHeads(np.stack([w0] * 3), np.stack([b0] * 3), [c[0] for c in configs], [c[1] for c in configs],
                        on=torch.device("cpu"))
    problem = elevater.Problem(x, y, xv, yv, "accuracy", False)
    ours = elevater.train_epochs(problem, heads, epochs=4, batch_size=8)
    for k, (lr, wd) in enumerate(configs):
        np.testing.assert_allclose(ours[k], toolkit_style_run(x, y, xv, yv, w0, b0, lr, wd, 4, 8), atol=1e-9)


def test_train_epochs_drops_diverged_heads_and_scores_them_zero_as_the_loop_would():
    rng = np.random.default_rng(2)
    centers = rng.normal(size=(3, 10)) * 1.5
    y, yv = rng.integers(0, 3, 48), rng.integers(0, 3, 30)
    x = (centers[y] + rng.normal(size=(48, 10))).astype(np.float32)
    xv = (centers[yv] + rng.normal(size=(30, 10))).astype(np.float32)
    w0, b0 = protocol.pytorch_linear_init(10, 3, seed=0)
    configs = [(0.1, 1e4), (0.01, 1e-2), (1e-2, 1e6), (0.1, 1e-6)]  # lr * wd >> 2: the first and third blow up
    heads = LinearHeads(np.stack([w0] * 4), np.stack([b0] * 4), [c[0] for c in configs], [c[1] for c in configs],
                        on=torch.device("cpu"))
    ours = elevater.train_epochs(elevater.Problem(x, y, xv, yv, "accuracy", False), heads, epochs=6, batch_size=8)
    assert heads.num_heads == 2 and np.allclose(heads.lr_col.numpy()[::3], [0.01, 0.1])
    assert (ours[[0, 2], 2:] == 0).all() and (ours[[1, 3]] > 0.5).all()
    for k, (lr, wd) in enumerate(configs):
        np.testing.assert_allclose(ours[k], toolkit_style_run(x, y, xv, yv, w0, b0, lr, wd, 6, 8), atol=1e-9)


def test_score_heads_gives_a_diverged_head_zero_and_matches_metrics():
    from vlbench import metrics

    rng = np.random.default_rng(3)
    scores = rng.random((3, 20, 4)).astype(np.float32)
    scores[1, 5, 2] = np.nan
    labels = rng.integers(0, 4, 20)
    for name in ("accuracy", "mean_per_class"):
        got = protocol.score_heads(scores, labels, name)
        assert got[1] == 0.0
        assert got[0] == pytest.approx(metrics.compute(name, scores[0], labels))
        assert got[2] == pytest.approx(metrics.compute(name, scores[2], labels))


# --------------------------------------------------------------------------------------------------
# the search


def test_weight_decay_search_visits_the_toolkit_indices_and_finds_a_known_peak():
    calls = []

    def evaluate(requests):
        calls.append(list(requests))
        return [1.0 / (1.0 + abs(i - (37 if line == "a" else 90))) for line, i in requests]

    out = elevater.weight_decay_search(evaluate, ["a", "b"])
    assert len(calls) == 5  # one batched computation per round: coarse, spans 8, 4, 2, 1
    assert [i for line, i in calls[0] if line == "a"] == [0, 16, 32, 48, 64, 80, 96]
    assert [i for line, i in calls[1] if line == "a"] == [24, 40]  # around the coarse peak 32
    assert out.peaks["a"] == (37, 1.0) and out.peaks["b"] == (90, 1.0)


def test_weight_decay_search_keeps_the_first_of_equal_scores_and_ends_at_minus_one_when_all_zero():
    out = elevater.weight_decay_search(lambda reqs: [0.5] * len(reqs), ["x"])
    assert out.peaks["x"] == (0, 0.5)
    zero = elevater.weight_decay_search(lambda reqs: [0.0] * len(reqs), ["x"])
    assert zero.peaks["x"] == (-1, 0.0)
    # the toolkit clamps at the border and retrains an index it has seen; here it is looked up
    assert zero.toolkit_runs > len(zero.trace)


def toolkit_first_release_sweep(score):
    """hyperparameter_sweep of Elevater_Toolkit_IC before 517fb02 (WD_SEARCH_LEFT): every candidate of a refinement
    round is trained with the round's *left* weight decay; its score is credited to the candidate."""
    peak, best = -1, 0.0
    for idx in range(0, 97, 16):
        if score(idx) > best:
            peak, best = idx, score(idx)
    span = 8
    while span > 0:
        left, right = max(peak - span, 0), min(peak + span, 96)
        for idx in [i for i in (left, right) if i != peak]:
            s = score(left)
            if s > best:
                peak, best = idx, s
        span //= 2
    return peak, best


@pytest.mark.parametrize("seed", range(6))
def test_first_release_refinement_trains_the_left_weight_decay_for_both_neighbours(seed):
    rng = np.random.default_rng(seed)
    curve = {line: rng.random(97) for line in ("a", "b")}
    trained = []

    def evaluate(requests):
        trained.extend(requests)
        return [curve[line][i] for line, i in requests]

    out = elevater.weight_decay_search(evaluate, ["a", "b"], refinement="left")
    for line in ("a", "b"):
        assert out.peaks[line] == toolkit_first_release_sweep(lambda i: curve[line][i])
    assert out.runs == len(trained) == len(set(trained))  # a weight decay trained once is looked up after
    for t in out.trace:  # a right neighbour carries the score of the weight decay actually trained, its left one
        assert t["score"] == curve[t["line"]][t["trained"]] and t["trained"] <= t["index"]
    index = elevater.weight_decay_search(lambda reqs: [curve[line][i] for line, i in reqs], ["a", "b"])
    assert all(t["trained"] == t["index"] for t in index.trace)


def test_first_release_refinement_changes_the_choice_when_the_peak_lies_right():
    curve = 1.0 / (1.0 + np.abs(np.arange(97) - 38.0))  # coarse peak 32, true peak 38 on its right
    out_index = elevater.weight_decay_search(lambda reqs: [curve[i] for _, i in reqs], ["x"])
    out_left = elevater.weight_decay_search(lambda reqs: [curve[i] for _, i in reqs], ["x"], refinement="left")
    assert out_index.peaks["x"][0] == 38
    assert out_left.peaks["x"][0] == 32  # every right neighbour was trained with a weight decay left of the peak


def test_learning_rate_selection_takes_strict_improvements_only():
    assert elevater.select_learning_rate([0.5, 0.7, 0.7, 0.6]) == 1
    assert elevater.select_learning_rate([0.0, 0.0]) is None


def test_search_chooses_the_known_best_pair_on_data():
    """Well-separated blobs with no noise: every learning rate's best weight decay is small and the search must not
    pick a weight decay that erases the weights (>= 1e2 with lr 0.1 diverges or collapses)."""
    rng = np.random.default_rng(4)
    centers = rng.normal(size=(3, 8)) * 3
    y = np.repeat(np.arange(3), 10)
    x = (centers[y] + 0.3 * rng.normal(size=(30, 8))).astype(np.float32)
    train, val = elevater.validation_split(y, 0.2)
    problem = elevater.Problem(x[train], y[train], x[val], y[val], "accuracy", False)
    init = elevater.HeadInit({"random_2p": protocol.pytorch_linear_init(8, 3, 0)})
    s = elevater.Settings(heads=("random_2p",))
    chosen, outcome = elevater.search(problem, init, s, torch.device("cpu"))
    assert chosen["random_2p"]["val_score"] == 1.0
    assert chosen["random_2p"]["lr"] == 1e-6  # the first learning rate already reaches 1.0: strict rule keeps it
    assert len({t["line"] for t in outcome.trace}) == 6


# --------------------------------------------------------------------------------------------------
# heads' initialisation


def test_random_2p_is_pytorch_default_linear_init_and_language_2p_the_text_classifier():
    torch.manual_seed(5)
    layer = torch.nn.Linear(8, 3)
    w, b = protocol.pytorch_linear_init(8, 3, 5)
    np.testing.assert_array_equal(w, layer.weight.detach().numpy().T)
    np.testing.assert_array_equal(b, layer.bias.detach().numpy())
    assert np.abs(w).max() <= 1 / math.sqrt(8)
    inputs = FakeInputs(*blobs(seed=0))
    projected = elevater.Settings(heads=PROJECTED_HEADS)
    pool = elevater.load_pool(inputs, projected)
    init = elevater.head_init(inputs, pool, projected, seed=5)
    wl, bl = init.weights["language_2p"]
    np.testing.assert_allclose(np.linalg.norm(wl, axis=0), 1.0, atol=1e-6)
    np.testing.assert_allclose(wl.T, inputs.text_means / np.linalg.norm(inputs.text_means, axis=1, keepdims=True),
                               atol=1e-6)
    assert (bl == 0).all()


# --------------------------------------------------------------------------------------------------
# the protocol end to end


def blobs(seed: int, classes: int = 3, dim: int = 8, per_class: int = 60, test: int = 90):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, dim)) * 2.0
    y = np.tile(np.arange(classes), per_class)
    yt = rng.integers(0, classes, test)
    return (centers[y] + rng.normal(size=(y.size, dim))).astype(np.float32), y, \
        (centers[yt] + rng.normal(size=(test, dim))).astype(np.float32), yt, centers


class FakeInputs:
    """What the analysis stage hands an analysis, for in-memory features."""

    def __init__(self, x, y, xt, yt, centers):
        classes = [ClassInfo(i, f"class {i}") for i in range(len(centers))]
        self.meta = DatasetMeta("blobs", "single-label", "accuracy", classes, splits={"train": len(y), "test": len(yt)})
        self.data = {"train": (x, y), "test": (xt, yt)}
        rng = np.random.default_rng(9)
        text = np.repeat(centers, 2, axis=0) + 0.1 * rng.normal(size=(2 * len(centers), centers.shape[1]))
        self.text = Features(pa.table({"class_index": np.repeat(np.arange(len(centers)), 2),
                                       "source": ["template"] * (2 * len(centers))}), text.astype(np.float32), {}, [])
        normed = text / np.linalg.norm(text, axis=1, keepdims=True)
        self.text_means = normed.reshape(len(centers), 2, -1).mean(axis=1)

    def has_split(self, split):
        return split in self.data

    def images(self, split):
        x, y = self.data[split]
        return Features(pa.table({"sample_id": [str(i) for i in range(len(y))], "label": y}), x, {}, [])

    def texts(self, name):
        assert name == "prompts"
        return self.text


FAST = {"shots": [1, 5, "full"], "seeds": [0, 1], "search_epochs": 3, "final_epochs": 4, "heads": list(PROJECTED_HEADS)}


def test_protocol_end_to_end_reports_every_setting():
    inputs = FakeInputs(*blobs(seed=1))
    result = elevater.evaluate(inputs, {**FAST, "parameter_efficiency": {"m0": 10_000}}, seed=0)
    keys = {f"elevater/{h}/{s}/last" for h in PROJECTED_HEADS for s in ("1", "5", "full")}
    assert keys <= set(result.metrics)
    assert result.metrics["elevater/language_2p/full/last"] > 0.9  # separable blobs
    runs = result.details["runs"]
    assert [(r["shots"], r["seed"]) for r in runs] == [(1, 0), (1, 1), (5, 0), (5, 1), ("full", 0)]
    one = runs[0]
    assert one["sampled"] == 6 and one["val"] == 3 and one["final_train"] == one["train"] == 3  # 1 -> 2, no merge
    five = runs[2]
    assert (five["sampled"], five["train"], five["val"], five["final_train"]) == (15, 12, 3, 15)
    assert runs[-1]["final_train"] == 180
    summary = result.details["summary"]["random_2p"]["5"]
    assert summary["mean"] == pytest.approx(np.mean(summary["per_seed"]))
    assert summary["std"] == pytest.approx(np.std(summary["per_seed"], ddof=1))
    # the seeds' 95% interval of the mean on the logit scale: t_{0.975, 1} = 12.706204736174698 for two seeds, the
    # delta method's se of logit(mean); none for one seed ("full")
    m = summary["mean"]
    half = 12.706204736174698 * summary["std"] / math.sqrt(2) / (m * (1 - m))
    expit = lambda z: 1 / (1 + math.exp(-z))  # noqa: E731
    interval = result.intervals["elevater/random_2p/5/last"]
    assert interval == {"low": pytest.approx(expit(math.log(m / (1 - m)) - half)),
                        "high": pytest.approx(expit(math.log(m / (1 - m)) + half)),
                        "level": 0.95, "method": "seeds_logit_t"}
    assert 0 <= interval["low"] <= m <= interval["high"] <= 1
    # one seed ("full"): a bootstrap over the test samples of the final head's predictions, which the table keeps
    preds = result.tables["elevater_predictions"]
    assert preds.num_rows == 90 * len(runs) * len(PROJECTED_HEADS)  # 90 test samples
    rows = [r for r in preds.to_pylist() if (r["head"], r["shots"], r["seed"]) == ("random_2p", "full", 0)]
    correct = np.array([r["predicted"] == r["label"] for r in rows])
    assert [r["sample_id"] for r in rows] == inputs.images("test").table.column("sample_id").to_pylist()
    assert result.metrics["elevater/random_2p/full/last"] == pytest.approx(correct.mean())
    assert result.intervals["elevater/random_2p/full/last"] == stats.bootstrap_sample_metric("accuracy", correct).to_json()
    five = [r for r in preds.to_pylist() if (r["head"], r["shots"]) == ("random_2p", "5")]
    assert np.mean([r["predicted"] == r["label"] for r in five]) == pytest.approx(summary["mean"])
    m, m0 = 8 * 3 + 3, 10_000  # App. D.2: PE = score * exp(log10(#trainable / M0 + 1))
    assert summary["pe"] == pytest.approx(summary["mean"] * math.exp(math.log10(m / m0 + 1.0)))
    assert not any(key.endswith("/pe") for key in result.metrics)  # in the details only: dvc exp show stays narrow
    table = result.tables["elevater_search"]
    assert table.num_rows == sum(r["search_runs"] for r in runs)
    assert set(table.column("head").to_pylist()) == set(PROJECTED_HEADS)


def test_runs_in_worker_processes_are_the_runs_in_this_process_bit_for_bit():
    """On the CPU, ELEVATER's (shots, seed, head group) runs go to a process per core (protocol.map_runs), largest
    first; each run's numbers are those of the same run in this process, to the last bit, and in task order."""
    inputs = FakeInputs(*blobs(seed=1))
    s = elevater.Settings.from_cfg(FAST)
    pool = elevater.load_pool(inputs, s)
    init, on = elevater.head_init(inputs, pool, s, 0), torch.device("cpu")
    groups = elevater.head_groups(replace(s, heads=tuple(init.weights)), pool, None)
    tasks = [(0, shots, seed) for shots in (1, 5, "full") for seed in (0, 1)]
    costs = [elevater.run_cost(groups[0], shots) for _, shots, _ in tasks]
    shared = (groups, init, "blobs", on)
    here = protocol.map_runs(elevater.run_group, shared, tasks, on, 0, workers=1)
    spread = protocol.map_runs(elevater.run_group, shared, tasks, on, 0, costs=costs, workers=2)
    assert [(r["shots"], r["seed"]) for r in spread] == [(t[1], t[2]) for t in tasks]
    for a, b in zip(here, spread):
        assert (a["chosen"], a["final"], a["trace"]) == (b["chosen"], b["final"], b["trace"])
        assert all(np.array_equal(a["predicted"][h], b["predicted"][h]) for h in a["predicted"])


def test_best_on_test_is_labelled_and_never_below_last():
    inputs = FakeInputs(*blobs(seed=2))
    cfg = {**FAST, "shots": [5], "seeds": [0], "heads": ["random_2p"]}
    last = elevater.evaluate(inputs, cfg, seed=0)
    best = elevater.evaluate(inputs, {**cfg, "report": "best_on_test"}, seed=0)
    assert best.metrics["elevater/random_2p/5/best_on_test"] >= last.metrics["elevater/random_2p/5/last"]
    assert "selects the epoch on the test split" in best.details["settings"]["report_note"]


@pytest.mark.parametrize("cfg, message", [
    ({"heads": ["language_3p"]}, "language_3p']: each must be one of"),
    ({"shots": [0]}, "adapt.elevater.shots"),
    ({"report": "best"}, "adapt.elevater.report"),
    ({"learning_rate": 0.1}, "unknown key(s) adapt.elevater.learning_rate"),
    ({"wd_grid": {"num": 49}}, "adapt.elevater.wd_grid.num"),
])
def test_bad_settings_are_one_clear_error(cfg, message):
    with pytest.raises(AdaptError, match=message.replace("(", r"\(").replace(")", r"\)")):
        elevater.Settings.from_cfg(cfg)


def test_adapt_run_merges_protocols_and_writes_every_declared_table():
    inputs = FakeInputs(*blobs(seed=3))
    result = adapt.run(inputs, {"protocols": ["elevater"], "elevater": {**FAST, "shots": [5], "seeds": [0]}}, seed=0)
    assert set(result.tables) == {t for names in adapt.PROTOCOL_TABLES.values() for t in names}
    assert result.tables["episodes"].num_rows == 0 and result.tables["episodes"].column_names == ["fewtrans_not_run"]
    assert set(result.details) == {"elevater"} and result.counts["elevater/pool"] == 180
    assert all(k.startswith("elevater/") for k in result.metrics)
    with pytest.raises(AdaptError, match="adapt.protocols"):
        adapt.run(inputs, {"protocols": ["elevator"]}, seed=0)


def test_dvc_declares_every_adapt_table():
    outs = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["adapt"]["do"]["outs"]
    names = {o if isinstance(o, str) else next(iter(o)) for o in outs}
    tables = {t for ts in adapt.PROTOCOL_TABLES.values() for t in ts}
    assert names == {"reports/adapt/${item}.json"} | {f"reports/adapt/${{item}}.{t}.parquet" for t in tables}


# --------------------------------------------------------------------------------------------------
# report


def test_report_means_over_datasets_and_the_shots_plot(tmp_path):
    metrics = {"zeroshot": {"a": {"accuracy": 0.5}, "b": {"accuracy": 0.25}},
               "adapt": {"a": {"elevater/random_2p/5/last": 0.6, "elevater/random_2p/full/last": 0.9, "vtab/x": 1.0},
                         "b": {"elevater/random_2p/5/last": 0.4, "elevater/random_2p/full/last": 0.7}}}
    out = report_adapt.with_means(metrics)
    assert out["adapt"]["mean"] == pytest.approx({"elevater/random_2p/5/last": 0.5, "elevater/random_2p/full/last": 0.8})
    rows = report_adapt.shot_rows(out)
    assert {"dataset": "a", "head": "zero-shot", "shots": "0", "value": 0.5} in rows
    assert {"dataset": "mean", "head": "zero-shot", "shots": "0", "value": 0.375} in rows
    assert len([r for r in rows if r["dataset"] == "mean"]) == 3
    path = report_adapt.write_shots_plot(out, tmp_path)
    assert path.name == "adapt_shots.svg" and path.read_text().lstrip().startswith("<svg")
    assert report_adapt.write_shots_plot({"adapt": {"a": {"vtab/x": 1.0}}}, tmp_path / "none") is None


class MultiLabelInputs(FakeInputs):
    """Two-label images of three classes (VOC-like), scored with 11-point mAP."""

    def __init__(self, seed: int = 5):
        x, y, xt, yt, centers = blobs(seed)
        super().__init__(x, y, xt, yt, centers)
        rng = np.random.default_rng(seed)
        self.lists = {split: [sorted({int(a), int(rng.integers(0, 3))}) for a in labels]
                      for split, (_, labels) in self.data.items()}
        for split, (feats, _) in self.data.items():  # add the second class's centre to the features
            second = np.array([lst[-1] for lst in self.lists[split]])
            self.data[split] = (feats + centers[second].astype(np.float32), self.data[split][1])
        classes = self.meta.classes
        self.meta = DatasetMeta("voc-like", "multi-label", "map_11point", classes, splits=self.meta.splits)

    def images(self, split):
        x, _ = self.data[split]
        return Features(pa.table({"sample_id": [str(i) for i in range(len(x))],
                                  "labels": pa.array(self.lists[split], pa.list_(pa.int64()))}), x, {}, [])


def test_multilabel_protocol_uses_bce_and_the_greedy_cover():
    inputs = MultiLabelInputs()
    result = elevater.evaluate(inputs, {**FAST, "shots": [5, "full"], "seeds": [0]}, seed=0)
    assert 0.5 < result.metrics["elevater/language_2p/full/last"] <= 1.0  # 11-point mAP on softmax probabilities
    five = result.details["runs"][0]
    assert five["val"] >= 1 and five["train"] >= 3


# --------------------------------------------------------------------------------------------------
# knowledge-augmented adaptation (paper App. H)


class KnowledgeInputs(FakeInputs):
    """FakeInputs with two embedded knowledge sets: `good` (texts at the class centres) and `noise` (random texts)."""

    def __init__(self, *args):
        super().__init__(*args)
        centers = args[-1]
        rng = np.random.default_rng(11)
        self.sets = {"wiktionary": centers + 0.05 * rng.normal(size=centers.shape),
                     "gpt3": rng.normal(size=centers.shape)}

    def knowledge_sets(self):
        return sorted(self.sets)

    def knowledge(self, name):
        emb = self.sets[name].astype(np.float32)
        table = pa.table({"class_index": np.arange(len(emb)), "source": ["wiktionary"] * len(emb)})
        return Features(table, emb, {"text_set": name, "knowledge": {"weights": "normalized_mean"}}, [])


def test_knowledge_augmented_heads_take_the_initialisation_best_on_validation():
    inputs = KnowledgeInputs(*blobs(seed=3, dim=8))
    cfg = {**FAST, "heads": ["random_2p", "language_2p"], "knowledge": ["wiktionary", "gpt3", "cupl"]}
    result = elevater.evaluate(inputs, cfg, seed=0)
    assert result.details["settings"]["knowledge_variants"] == ["wiktionary", "gpt3"]  # cupl: not embedded, skipped
    for run in result.details["runs"]:
        candidates = ["language_2p", "language_2p@wiktionary", "language_2p@gpt3"]
        scores = [run["chosen"][c]["val_score"] for c in candidates]
        best = candidates[scores.index(max(scores))]  # the first of the highest: knowledge only when strictly better
        assert run["chosen"]["language_2p_knowledge"]["initialisation"] == best
        assert run["final"]["language_2p_knowledge"] == run["final"][best]
        assert run["knowledge_choice"]["language_2p"] == (best.partition("@")[2] or None)
        assert "random_2p_knowledge" not in run["final"]  # a random head has no language to replace
    summary = result.details["summary"]
    for shots in ("1", "5", "full"):
        per_seed = [r["final"]["language_2p_knowledge"]["last"] for r in result.details["runs"] if str(r["shots"]) == shots]
        assert result.metrics[f"elevater/language_2p_knowledge/{shots}/last"] == pytest.approx(np.mean(per_seed))
        assert summary["language_2p@gpt3"][shots]["per_seed"] == [
            r["final"]["language_2p@gpt3"]["last"] for r in result.details["runs"] if str(r["shots"]) == shots]
    w_good = inputs.sets["wiktionary"] / np.linalg.norm(inputs.sets["wiktionary"], axis=1, keepdims=True)
    pool = elevater.load_pool(inputs, elevater.Settings())
    init = elevater.head_init(inputs, pool, elevater.Settings(heads=("language_2p",)), 0, None,
                              elevater.knowledge_classifiers(inputs, pool, elevater.Settings(heads=("language_2p",))))
    np.testing.assert_allclose(init.weights["language_2p@wiktionary"][0].T, w_good, atol=1e-6)
    assert set(result.tables["elevater_search"].column("head").to_pylist()) == {
        "random_2p", "language_2p", "language_2p@wiktionary", "language_2p@gpt3"}


def test_knowledge_free_when_the_dataset_has_no_knowledge_or_none_is_asked():
    plain = elevater.evaluate(FakeInputs(*blobs(seed=3)), {**FAST, "heads": ["language_2p"]}, seed=0)
    assert not any("knowledge" in k for k in plain.metrics)
    off = elevater.evaluate(KnowledgeInputs(*blobs(seed=3)), {**FAST, "heads": ["language_2p"], "knowledge": []}, seed=0)
    assert off.metrics == plain.metrics


def test_unknown_knowledge_variant_is_one_clear_error():
    with pytest.raises(AdaptError, match=r"adapt.elevater.knowledge \['wikipedia'\].*known: wordnet_path"):
        elevater.Settings.from_cfg({"knowledge": ["wikipedia"]})
