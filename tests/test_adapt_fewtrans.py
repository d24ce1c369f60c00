"""FewTrans episodes (vlbench/analyses/adapt/fewtrans.py): the sampler's bounds and draws, the methods, the
hyper-parameter ensemble and the confidence intervals, on small synthetic features."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from vlbench.analyses.adapt import fewtrans as ft
from vlbench.analyses.adapt.protocol import AdaptError
from vlbench.analyses.zeroshot_classifier import l2_normalize
from vlbench.datasets.canonical import ClassInfo, DatasetMeta
from vlbench.features import Features

# ------------------------------------------------------------------------------------------------ helpers

def pools_of(sizes) -> list[np.ndarray]:
    """Disjoint pools of consecutive rows with the given sizes."""
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    return [np.arange(bounds[c], bounds[c + 1]) for c in range(len(sizes))]


def sample(sizes, novel=0, episodes=300, seed=0, **cfg):
    s = ft.settings({"episodes": episodes, **cfg})
    base, nov = ft.class_split(len(sizes), novel)
    return ft.sample_episodes(pools_of(sizes), base, nov, s, seed), base, nov, s


class FakeInputs:
    """What an analysis receives, over in-memory features: clustered image features and class prompts near
    their class means (so zero-shot, prototypes and the linear head all beat chance)."""

    def __init__(self, num_classes=8, per_class=30, dim=16, seed=0, multi_label=False):
        rng = np.random.default_rng(seed)
        self.means = rng.normal(size=(num_classes, dim)) * 2
        classes = [ClassInfo(index=i, name=f"class {i}") for i in range(num_classes)]
        task, metric = ("multi-label", "map_11point") if multi_label else ("single-label", "accuracy")
        self.meta = DatasetMeta(name="fake", task=task, metric=metric, classes=classes,
                                splits={"train": num_classes * per_class, "test": num_classes * per_class})
        self.rng, self.per_class, self.dim = rng, per_class, dim

    def has_split(self, split):
        return split in self.meta.splits

    def images(self, split):
        c = len(self.meta.classes)
        labels = np.repeat(np.arange(c), self.per_class)
        x = self.means[labels] + np.random.default_rng(hash(split) % 1000).normal(size=(len(labels), self.dim))
        table = pa.table({"sample_id": [f"{split}-{i:04d}" for i in range(len(labels))], "label": labels})
        return Features(table, x.astype(np.float32), {}, [])

    def texts(self, text_set):
        c = len(self.meta.classes)
        index = np.repeat(np.arange(c), 2)
        emb = self.means[index] + 0.3 * np.random.default_rng(7).normal(size=(len(index), self.dim))
        table = pa.table({"class_index": index, "source": ["template"] * len(index), "text": ["t"] * len(index)})
        return Features(table, emb.astype(np.float32), {}, [])


# ------------------------------------------------------------------------------------------------ the sampler

SIZES = [5, 8, 60, 12, 30, 3, 100, 40, 9, 20, 14, 25, 7, 50, 11, 16, 2, 33, 18, 22]


def test_sampler_bounds_and_query_rule():
    pairs, base, novel, _ = sample(SIZES, novel=4, episodes=400)
    pools = pools_of(SIZES)
    eligible = {int(c) for c in base if SIZES[c] >= 2}
    for b, n in pairs:
        assert 2 <= b.ways <= min(15, len(eligible)) and len(set(b.classes.tolist())) == b.ways
        assert set(b.classes.tolist()) <= eligible
        shots = np.array(b.shots)
        assert shots.min() >= 1 and shots.max() <= 10 and shots.sum() <= 150
        q = min(10, min(SIZES[c] // 2 for c in b.classes))
        assert [len(x) for x in b.query] == [q] * b.ways  # balanced query set
        for c, sup, qry in zip(b.classes, b.support, b.query):
            assert len(set(sup) | set(qry)) == len(sup) + len(qry)  # without replacement, disjoint
            assert set(sup) | set(qry) <= set(pools[c].tolist())
            assert len(sup) <= SIZES[c] - q
        assert 2 <= n.ways <= min(15, len(novel)) and set(n.classes.tolist()) <= set(novel.tolist())
        assert n.shots == [0] * n.ways
        assert [len(x) for x in n.query] == [min(15, SIZES[c]) for c in n.classes]


def test_ways_are_uniform_and_every_class_takes_part():
    pairs, _, _, _ = sample([40] * 20, episodes=3000)
    ways = np.array([b.ways for b, _ in pairs])
    counts = np.bincount(ways, minlength=16)[2:]
    assert counts.size == 14 and counts.min() > 0.7 * 3000 / 14 and counts.max() < 1.3 * 3000 / 14
    chosen = np.bincount(np.concatenate([b.classes for b, _ in pairs]), minlength=20)
    assert chosen.min() > 0.8 * chosen.mean()  # classes are drawn uniformly


def test_ways_capped_by_the_number_of_classes_and_the_support_cap_binds():
    pairs, _, _, _ = sample([200] * 5, episodes=300)
    assert max(b.ways for b, _ in pairs) == 5 and min(b.ways for b, _ in pairs) == 2
    big, _, _, _ = sample([200] * 40, episodes=500)
    totals = [sum(b.shots) for b, _ in big]
    assert max(totals) <= 150 and max(max(b.shots) for b, _ in big) == 10
    assert any(b.ways == 15 and sum(b.shots) > 100 for b, _ in big)


def test_seeds_are_reproducible():
    a, _, _, _ = sample(SIZES, novel=4, episodes=50, seed=3)
    b, _, _, _ = sample(SIZES, novel=4, episodes=50, seed=3)
    c, _, _, _ = sample(SIZES, novel=4, episodes=50, seed=4)
    flat = lambda pairs: [np.concatenate(e.support + e.query).tolist() for p in pairs for e in p]
    assert flat(a) == flat(b) and flat(a) != flat(c)


def test_support_set_size_formula():
    s = ft.settings({})
    remaining = np.array([3, 40, 12])
    rng, ref = np.random.RandomState(5), np.random.RandomState(5)
    beta = ref.uniform()
    expected = min(sum(math.floor(beta * min(10, r) + 1) for r in remaining), 150)
    assert ft.support_set_size(rng, remaining, s) == expected
    assert ft.support_set_size(np.random.RandomState(0), np.full(15, 500), {**s, "max_support": 150}) <= 150


def test_shots_follow_pool_sizes_with_one_per_class_and_the_cap():
    s = ft.settings({})
    sizes, remaining = np.array([10, 1000, 40]), np.array([5, 990, 30])
    rng, ref = np.random.RandomState(9), np.random.RandomState(9)
    shots = ft.shots_per_class(rng, sizes, remaining, 30, s)
    w = sizes * np.exp(ref.uniform(-math.log(2), math.log(2), size=3))
    desired = np.floor(w / w.sum() * 27).astype(int) + 1
    assert shots.tolist() == np.minimum(np.minimum(desired, 10), remaining).tolist()
    assert shots[1] == 10  # the big class hits FewTrans' cap of 10


def test_class_split_is_fewtrans_random_split():
    base, novel = ft.class_split(47, 10)
    assert len(base) == 37 and novel.tolist() == sorted(novel.tolist())
    assert sorted(base.tolist() + novel.tolist()) == list(range(47))
    assert base.tolist() == np.random.RandomState(22).choice(47, 37, replace=False).tolist()


# FewTrans' App. B.1, read off the paper's text independently of fewtrans_splits.json
PAPER_SPLITS = {"dtd": (37, 10), "cifar-100": (80, 20), "oxford-flower-102": (82, 20), "ucf101": (81, 20),
                "eurosat": (6, 4), "quickdraw": (276, 69), "fungi": (1115, 279), "plant-disease": (30, 8),
                "fgvc-aircraft": (80, 20)}


def test_imagenet_sketch_takes_its_novel_classes_from_the_wordnet_roots():
    """App. B.1 (1): the classes below carnivore and device are novel (712/288), not a random draw."""
    assert (ft.split_table()["imagenet-sketch"]["base"], ft.split_table()["imagenet-sketch"]["novel"]) == (712, 288)
    with pytest.raises(AdaptError, match=r"'imagenet-sketch': its novel classes are those below .*novel_roots"):
        ft.num_novel_classes("imagenet-sketch", 1000, ft.settings({}))
    ft.check_root_count("imagenet-sketch", 288, 1000)
    with pytest.raises(AdaptError, match="give 713 base and 287 novel classes, fewtrans_splits.json"):
        ft.check_root_count("imagenet-sketch", 287, 1000)
    ft.check_root_count("not-in-the-table", 3, 10)


@pytest.mark.parametrize("name", sorted(PAPER_SPLITS))
def test_paper_datasets_take_the_papers_counts(name):
    base, novel = PAPER_SPLITS[name]
    s = ft.settings({})
    assert ft.num_novel_classes(name, base + novel, s) == novel
    assert ft.num_novel_classes(name, base + novel, ft.settings({"novel_fraction": 0.2})) == novel  # the table wins


def test_eurosat_and_dtd_classes_by_the_codes_rule():
    """The code's rule, recomputed here: base = RandomState(22).choice(C, C_base) over the class list, novel = the
    rest ascending; with the paper's counts, not round(20%) (EuroSAT would be 8/2, DTD 38/9)."""
    for name, classes in (("eurosat", 10), ("dtd", 47)):
        b, n = PAPER_SPLITS[name]
        want = np.random.RandomState(22).permutation(classes)  # choice without replacement = a permutation's head
        inputs_meta = DatasetMeta(name=name, task="single-label", metric="accuracy",
                                  classes=[ClassInfo(index=i, name=f"c{i}") for i in range(classes)], splits={})
        base, novel, _ = ft.episode_classes(inputs_meta, ft.settings({}))
        assert base.tolist() == want[:b].tolist()
        assert novel.tolist() == sorted(want[b:].tolist()) and len(novel) == n
    assert ft.split_table()["eurosat_clip"] == {**ft.split_table()["eurosat"]}


def test_split_counts_errors_and_explicit_fraction():
    s = ft.settings({})
    with pytest.raises(AdaptError, match=r"'d' has no base/novel count .*novel_fraction"):
        ft.num_novel_classes("d", 12, s)
    with pytest.raises(AdaptError, match=r"'dtd' has 40 classes but fewtrans_splits.json splits 37 \+ 10"):
        ft.num_novel_classes("dtd", 40, s)
    frac = ft.settings({"novel_fraction": 0.2})
    assert ft.num_novel_classes("d", 12, frac) == 2 and ft.num_novel_classes("d", 4, frac) == 2
    assert ft.num_novel_classes("d", 100, ft.settings({"novel_classes": {"d": 7}})) == 7
    assert ft.num_novel_classes("dtd", 47, ft.settings({"novel_classes": {"dtd": 0}})) == 0
    assert ft.num_novel_classes("d", 12, ft.settings({"novel_fraction": 0})) == 0
    with pytest.raises(AdaptError, match="3 classes cannot give"):
        ft.num_novel_classes("d", 3, frac)


def test_settings_refuse_unknown_keys_and_bad_values():
    with pytest.raises(AdaptError, match="unknown key"):
        ft.settings({"episode": 5})
    with pytest.raises(AdaptError, match="linear.combine"):
        ft.settings({"linear": {"combine": "mean"}})
    with pytest.raises(AdaptError, match="batch_size"):
        ft.settings({"linear": {"batch_size": 64}})


# ------------------------------------------------------------------------------------------------ methods

def test_zeroshot_is_restricted_to_the_episode_classes():
    x = np.array([[1.0, 0.0], [0.0, 1.0]])
    weights = np.array([[1.0, 0.1], [0.0, 1.0], [0.99, 0.0]])  # class 0 would win globally for sample 0
    ep = ft.Episode("base", np.array([2, 1]), [np.zeros(0, int)] * 2, [np.array([0]), np.array([1])])
    assert ft.zeroshot_accuracy(ep, x, l2_normalize(weights)) == 1.0


def test_prototype_is_cosine_to_the_mean_of_normalised_support():
    # unnormalised, the support mean of class 0 sits nearer the query; normalised first, class 1 wins
    x = np.array([[10.0, 0.0], [0.0, 1.0], [0.0, 1.0], [0.7, 1.0], [1.0, 0.5]])
    ep = ft.Episode("base", np.array([0, 1]), [np.array([0, 1]), np.array([2])], [np.array([3]), np.array([4])])
    protos = l2_normalize(np.array([l2_normalize(x[0]) + l2_normalize(x[1]), l2_normalize(x[2])]))
    expected = np.mean((l2_normalize(x[[3, 4]]) @ protos.T).argmax(1) == [0, 1])
    assert ft.prototype_accuracy(ep, x) == expected == 0.5


def test_ensemble_grid_is_the_papers_5_by_3():
    """App. B.2 for one learning rate: 5 rates (x5 apart around the centre) x epochs E'/3, 2E'/3, E', E' = E* + 10."""
    lin = ft.settings({})["linear"]
    lrs, epochs = ft.ensemble_members({**lin, "lr": 0.1, "epochs": 30})
    assert lrs == pytest.approx([0.004, 0.02, 0.1, 0.5, 2.5])
    assert epochs == [13, 26, 40]  # App. A on Table 3: "13, 26, 40 are used as epoch candidates" (E* = 30)
    assert ft.epoch_axis(20, 10) == [10, 20, 30] and ft.epoch_axis(1, 0) == [1]
    lr, ep, scored = ft.member_plan({**lin, "epochs": 20})
    assert len(scored) == 15 and ep.tolist() == [30] * 5 + [20] * 5 + [10] * 5
    assert lr.tolist() == pytest.approx([0.004, 0.02, 0.1, 0.5, 2.5] * 3)
    assert [e for _, e in scored] == ep.tolist()


def test_snapshots_train_e_prime_epochs():
    lin = ft.settings({})["linear"]
    assert ft.snapshot_epochs(70) == [24, 48, 70]  # (epoch + 1) % (70 // 3 + 1) == 0, and the last
    _, ep, scored = ft.member_plan({**lin, "epoch_mode": "snapshots", "epochs": 60})
    assert ep.tolist() == [70] * 5 and len(scored) == 15 and scored[:3] == [(0, 24), (0, 48), (0, 70)]


def test_ensemble_sums_the_members_logits_on_constructed_heads():
    """Train the 15 members on a constructed episode, then check the ensemble is the arg-max of their summed logits
    and that it scores what that sum scores."""
    rng = np.random.default_rng(3)
    means = rng.normal(size=(4, 8)) * 2
    y = np.repeat(np.arange(4), 12)
    x = (means[y] + rng.normal(size=(48, 8))).astype(np.float32)
    ep = _episode_on(x, y, rng, shots=2, query=6)
    lin = {**ft.settings({})["linear"], "epochs": 5}
    logits = ft.train_linear_heads([ep], x, lin, "cpu")  # (1, 15, Q, K)
    assert logits.shape[:2] == (1, 15)
    labels = ep.rows("query")[1]
    by_sum = (logits[0].sum(axis=0).argmax(axis=-1) == labels).mean()
    assert ft.linear_accuracies([ep], x, lin, "cpu")[0] == pytest.approx(by_sum)
    members = ft.linear_accuracies([ep], x, lin, "cpu", members=True)[0]
    assert members.shape == (15,) and not np.allclose(members, members[0])  # the grid's members differ


def test_lr_search_space_and_centre_grid():
    assert ft.lr_search_space(0.01, 1.0) == pytest.approx([0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0])
    grid = ft.centre_grid(FakeInputs(), {"episodes": 6, "novel_fraction": 0}, 0, [0.01, 0.1], [2, 5], "cpu")
    assert sorted(grid) == ["lr=0.01,epochs=2", "lr=0.01,epochs=5", "lr=0.1,epochs=2", "lr=0.1,epochs=5"]
    assert all(0 <= v <= 1 for v in grid.values())


def test_combine_sum_versus_vote():
    # three members, one query, three classes: member 0 is very sure of class 2, members 1 and 2 mildly of class 0
    logits = np.array([[[[0.0, 0.0, 9.0]], [[1.0, 0.0, 0.5]], [[1.0, 0.9, 0.0]]]])
    assert ft.combine(logits, "sum").tolist() == [[2]]
    assert ft.combine(logits, "vote").tolist() == [[0]]
    tie = np.array([[[[0.0, 1.0]], [[1.0, 0.0]]]])
    assert ft.combine(tie, "vote").tolist() == [[0]]  # a tied vote goes to the lower class


def _episode_on(x, y, rng, shots=3, query=4):
    classes = np.unique(y)
    sup, qry = [], []
    for c in classes:
        rows = rng.permutation(np.flatnonzero(y == c))
        sup.append(rows[:shots])
        qry.append(rows[shots:shots + query])
    return ft.Episode("base", classes, sup, qry)


def test_linear_head_matches_torch_adam_reference():
    """One member, one episode: our batched head equals nn.Linear (weight ones, bias zero) + torch.optim.Adam with
    the per-step cosine rate on L2-normalised features."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 6)).astype(np.float32)
    y = np.repeat(np.arange(4), 10)
    ep = _episode_on(x, y, rng)
    lin = ft.settings({})["linear"]
    ours = ft.train_linear_heads([ep], x, lin, "cpu", plan=ft.grid_plan([0.05], [7]))[0, 0]

    srows, slab = ep.rows("support")
    xs, xq = torch.tensor(l2_normalize(x[srows])), torch.tensor(l2_normalize(x[ep.rows("query")[0]]))
    head = torch.nn.Linear(6, 4)
    head.weight.data.fill_(1)
    head.bias.data.fill_(0)
    opt = torch.optim.Adam(head.parameters(), lr=0.05)
    for step in range(7):
        for group in opt.param_groups:
            group["lr"] = 0.5 * 0.05 * (1 + math.cos(math.pi * step / 7))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(head(xs), torch.tensor(slab)).backward()
        opt.step()
    assert np.allclose(ours[:len(xq)], head(xq).detach().numpy(), atol=1e-5)


def test_ones_init_learns_like_zero_init():
    """All-ones weights give every class the same logit, so the head trains exactly as from zero (softmax is
    shift-invariant): predictions after training separate the classes."""
    rng = np.random.default_rng(1)
    means = rng.normal(size=(3, 8)) * 3
    y = np.repeat(np.arange(3), 20)
    x = (means[y] + rng.normal(size=(60, 8))).astype(np.float32)
    eps = [_episode_on(x, y, np.random.default_rng(k)) for k in range(5)]
    lin = {**ft.settings({})["linear"], "epochs": 10, "lr": 0.05}
    acc = ft.linear_accuracies(eps, x, lin, "cpu")
    assert acc.shape == (5,) and acc.mean() > 0.9


def test_episodes_of_different_sizes_batch_like_one_at_a_time():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(90, 5)).astype(np.float32)
    y = np.repeat(np.arange(6), 15)
    small = _episode_on(x[:30], y[:30], rng, shots=2, query=3)
    big = _episode_on(x, y, rng, shots=5, query=4)
    lin = {**ft.settings({})["linear"], "epochs": 5}
    together = ft.train_linear_heads([small, big], x, lin, "cpu")
    alone = ft.train_linear_heads([small], x, lin, "cpu")
    assert np.allclose(together[0, :, :6, :2], alone[0, :, :6, :2], atol=1e-5)
    assert np.isneginf(together[0, :, :, 2:]).all()  # the small episode's padded classes never win


# ------------------------------------------------------------------------------------------------ summary and protocol

def test_confidence_interval_is_196_std_over_sqrt_episodes():
    values = np.array([0.5, 0.7, 0.9, 0.6, 0.8])
    metrics, details = ft.summarise({("base", "linear"): values})
    assert metrics == {"fewtrans/base/linear": pytest.approx(0.7)}
    assert details["base/linear"]["ci95"] == pytest.approx(1.96 * values.std(ddof=1) / math.sqrt(5))
    avg = ft.aggregate({"a": {"fewtrans/base/linear": 0.6}, "b": {"fewtrans/base/linear": 0.8, "x": 1.0}})
    assert avg == {"fewtrans/average/base/linear": pytest.approx(0.7)}


def test_evaluate_end_to_end_writes_episodes_table():
    inputs = FakeInputs()
    cfg = {"episodes": 12, "splits": ["test"], "linear": {"epochs": 5}, "novel_fraction": 0.2}
    result = ft.evaluate(inputs, cfg, seed=0, device="cpu")
    assert set(result.metrics) == {"fewtrans/base/zeroshot", "fewtrans/base/prototype", "fewtrans/base/linear",
                                   "fewtrans/novel/zeroshot"}
    assert all(v > 0.6 for v in result.metrics.values())  # chance is at most 1/2
    table = result.tables["episodes"]
    assert table.num_rows == 24 and table.column("split").to_pylist() == ["base", "novel"] * 12
    assert table.column_names[:5] == ["episode", "split", "ways", "shots", "query"]
    novel = table.filter(pc.equal(table.column("split"), "novel"))
    assert novel.column("prototype").null_count == 12 and novel.column("linear").null_count == 12
    base = table.filter(pc.equal(table.column("split"), "base")).to_pylist()
    for row in base:
        assert len(row["shots"]) == row["ways"] == len(row["query"]) == len(row["classes"])
        assert len(row["support_ids"]) == sum(row["shots"]) and len(row["query_ids"]) == sum(row["query"])
    means = np.mean([r["linear"] for r in base])
    assert result.metrics["fewtrans/base/linear"] == pytest.approx(means)
    assert result.details["summary"]["base/linear"]["episodes"] == 12
    half = 1.96 * np.std([r["linear"] for r in base], ddof=1) / np.sqrt(12)
    assert result.intervals["fewtrans/base/linear"] == {"low": pytest.approx(means - half),
                                                        "high": pytest.approx(means + half), "level": 0.95,
                                                        "method": "episodes"}
    assert set(result.intervals) == set(result.metrics)
    assert result.details["base_classes"] and len(result.details["novel_classes"]) == 2
    again = ft.evaluate(inputs, cfg, seed=0, device="cpu")
    assert again.tables["episodes"].equals(table)


def test_evaluate_errors_name_the_dataset_and_key():
    with pytest.raises(AdaptError, match="no split 'val'"):
        ft.evaluate(FakeInputs(), {"splits": ["val"]}, 0)
    with pytest.raises(AdaptError, match="single-label"):
        ft.evaluate(FakeInputs(multi_label=True), {}, 0)


def test_demo_counts_fit_the_demo_datasets():
    """fewtrans_splits.json's demo rows (our documented choice) add up to each demo dataset's classes."""
    from vlbench.datasets import synthetic

    table = ft.split_table()
    for name in ("shapes", "colors", "count", "position", "shape_color"):
        classes = synthetic.catalogue_row(name, {"task": name, "splits": {"test": 1}})["classes"]
        assert table[name]["base"] + table[name]["novel"] == classes
        assert table[name]["novel"] == max(round(0.2 * classes), 2)
