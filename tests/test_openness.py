"""The extensibility analysis around the metrics (vlbench.analyses.extensibility): variants, groups, dataset-level unions,
geometry, the adversarial vocabulary scan, the vocabulary text sets (vlbench.knowledge.vocabulary), the report's
charts and the two stages on real feature files."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import yaml

from vlbench.analyses import expansion as ex
from vlbench.analyses import extensibility as op
from vlbench.datasets.canonical import ClassInfo, DatasetError, DatasetMeta
from vlbench.errors import VlbenchError
from vlbench.features import Features
from vlbench.knowledge import vocabulary as vocab
from vlbench.texts import text_table, write_text_sets

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wn():
    from vlbench.wordnet import WordNetMissing, load_wordnet

    try:
        return load_wordnet(download=False)
    except WordNetMissing as err:
        pytest.skip(f"no WordNet on this machine: {err}")


def _meta(classes, name="d"):
    return DatasetMeta(name=name, task="single-label", metric="accuracy", classes=classes, splits={"test": 1})


@dataclass
class FakeInputs:
    """What the analysis uses of `vlbench.analyses.base.Inputs`: meta, the text-set folder, feature readers."""

    meta: DatasetMeta
    texts_dir: Path
    image_features: Features
    text_features: dict
    features_dir: Path = Path("nowhere")
    identity: dict | None = None

    def has_split(self, split):
        return split == "test"

    def images(self, split):
        return self.image_features

    def texts(self, name):
        return self.text_features[name]


def _features(table, emb):
    return Features(table, np.asarray(emb, dtype=np.float32), {}, [])


def world(tmp_path, name="d", n_groups=3, per_group=2, per_class=4, dim=16, seed=0, vocabulary=None, names=None):
    """n_groups groups of per_group classes, each class on its own axis; images near their class axis, plus noise;
    `single` texts on the axes, `ensemble` texts two per class (axis +/- a small shared direction)."""
    rng = np.random.default_rng(seed)
    C = n_groups * per_group
    names = names or [f"c{i}" for i in range(C)]
    classes = [ClassInfo(i, names[i], group=f"g{i // per_group}") for i in range(C)]
    meta = _meta(classes, name)
    labels = np.repeat(np.arange(C), per_class)
    axes = np.eye(C, dim)
    images = axes[labels] + 0.45 * rng.normal(size=(labels.size, dim))
    single = text_table("class_index", list(range(C)), ["template"] * C, [f"a photo of a {n}." for n in names])
    ens_rows = [c for c in range(C) for _ in range(2)]
    ensemble = text_table("class_index", ens_rows, ["template"] * len(ens_rows), [f"t{k}" for k in range(len(ens_rows))])
    shift = np.eye(dim)[dim - 1] * 0.3
    ens_emb = np.stack([axes[c] + (shift if k % 2 else -shift) for k, c in enumerate(ens_rows)])
    sets = {"prompts_single": single, "prompts_ensemble": ensemble}
    emb = {"prompts_single": _features(single, axes), "prompts_ensemble": _features(ensemble, ens_emb)}
    if vocabulary is not None:
        words = list(vocabulary)
        table = text_table("key", words, ["vocabulary"] * len(words), [f"a photo of a {w}." for w in words])
        sets["vocabulary"] = table
        emb["vocabulary"] = _features(table, np.stack([vocabulary[w] for w in words]))
    texts_dir = tmp_path / "texts" / name
    write_text_sets(texts_dir, name, sets)
    image_table = pa.table({"sample_id": [f"{name}{i}" for i in range(labels.size)], "label": labels})
    return FakeInputs(meta, texts_dir, _features(image_table, images), emb)


# ---------------------------------------------------------------- settings, groups, variants


def test_settings_defaults_and_errors():
    s = op.parse_settings({})
    assert (s.protocol, s.orders, s.variants, s.duplicates, s.top) == ("paper", 100, ("single", "ensemble", "repe"), "first", 20)
    # the paper's App. A.3 keeps a shared name's first occurrence; its CIFAR-10 top-3 has a hypernym (Sec. 3.3.1)
    assert s.exclude_related is False
    for cfg, message in [({"protocol": "code"}, "extensibility.protocol must be one of"),
                         ({"orders": 0}, "extensibility.orders must be a positive integer"),
                         ({"variants": ["single", "single"]}, "distinct"),
                         ({"average_s": "groups"}, "extensibility.average_s"),
                         ({"nope": 1}, "unknown extensibility key")]:
        with pytest.raises(VlbenchError, match=message):
            op.parse_settings(cfg)


def test_dataset_groups_from_the_group_field_or_one_per_class():
    meta = _meta([ClassInfo(0, "a", group="x"), ClassInfo(1, "b", group="y"), ClassInfo(2, "c", group="x")])
    assert op.dataset_groups(meta, "auto") == (["x", "y"], [[0, 2], [1]], "group")
    assert op.dataset_groups(meta, "class") == (["a", "b", "c"], [[0], [1], [2]], "class")
    bare = _meta([ClassInfo(0, "a"), ClassInfo(1, "b", group="y")])
    assert op.dataset_groups(bare, "auto")[2] == "class"
    with pytest.raises(VlbenchError, match="class 0 \\('a'\\) has none"):
        op.dataset_groups(bare, "group")


def test_a_missing_variant_says_which_texts_key_to_add(tmp_path):
    inputs = world(tmp_path)
    with pytest.raises(VlbenchError, match="needs text set 'prompts_knowledge'.*prompt_sets"):
        op.variant_weights(inputs, "knowledge")


# ---------------------------------------------------------------- one dataset, end to end on fake inputs


def test_run_dataset_metrics_equal_the_core_functions(tmp_path):
    inputs = world(tmp_path, n_groups=4, per_group=3)
    result = op.run_dataset(inputs, {"orders": 10}, seed=3)
    groups = [[3 * g, 3 * g + 1, 3 * g + 2] for g in range(4)]
    labels = inputs.image_features.table.column("label").to_numpy()
    x = op.l2_normalize(inputs.image_features.embeddings)
    for variant in ("single", "ensemble"):
        w = op.prompt_weights(inputs.texts(f"prompts_{variant}"), 12, "t")
        orders = ex.paper_orders(4, 10, 3)  # (G-1)! = 6 <= 10: all orders of every target
        r = ex.expansion(x @ w.T, labels, groups, orders)
        assert result.metrics[f"acc_c_{variant}"] == pytest.approx(r.acc_c.mean)
        assert result.metrics[f"acc_e_{variant}"] == pytest.approx(r.acc_e.mean)
        assert result.metrics[f"acc_s_{variant}"] == pytest.approx(r.acc_s.mean)
        d = result.details["variants"][variant]
        assert d["acc_e_expected"] == pytest.approx(d["acc_e"], abs=1e-12)  # every order enumerated
        assert d["acc_s_expected"] == pytest.approx(d["acc_s"], abs=1e-12)
        assert len(d["steps"]["acc_e"]) == 4 and len(d["steps"]["acc_s"]) == 3
        for g, row in enumerate(d["groups"]):
            assert row["group"] == f"g{g}" and row["classes"] == 3 and row["images"] == 12
            assert row["drop_s"] == pytest.approx(row["acc_c"] - row["acc_s"])
            assert row["drop_full"] == pytest.approx(row["acc_c"] - row["acc_full"])
    assert result.counts == {"samples": 48, "classes": 12, "groups": 4}
    assert result.params["grouped_by"] == "group" and result.params["orders"] == 10
    assert "adversarial" not in result.details and result.tables["vocabulary"].num_rows == 0


def test_authors_protocol_in_the_analysis(tmp_path):
    inputs = world(tmp_path, n_groups=3)
    result = op.run_dataset(inputs, {"protocol": "authors", "trials": 2, "variants": ["single"]}, seed=0)
    labels = inputs.image_features.table.column("label").to_numpy()
    w = op.prompt_weights(inputs.texts("prompts_single"), 6, "t")
    r = ex.authors_protocol(op.l2_normalize(inputs.image_features.embeddings) @ w.T, labels,
                            [[0, 1], [2, 3], [4, 5]], trials=2)
    assert result.metrics == pytest.approx({"acc_c_single": r.acc_c, "acc_e_single": r.acc_e, "acc_s_single": r.acc_s})
    assert result.details["variants"]["single"]["acc_e_expected"] is None
    assert result.params["authors_seed"] == 42 and result.params["trials"] == 2 and result.params["average_s"] == "classes"


def test_one_group_is_refused(tmp_path):
    inputs = world(tmp_path, n_groups=1)
    with pytest.raises(VlbenchError, match="at least two groups"):
        op.run_dataset(inputs, {}, 0)


# ---------------------------------------------------------------- REPE: run where the repe stage wrote weights

IDENTITY = {"model": "m", "arch": "a", "pretrained": "openai"}


def write_repe(features_dir: Path, dataset: str, w: np.ndarray) -> None:
    """The repe stage's REPE class weights file (one row per class, fingerprinted for the model and dataset)."""
    from vlbench.features import embedding_array, features_schema, write_table
    from vlbench.knowledge.repe import weights_path

    table = pa.table({"class_index": np.arange(w.shape[0]), "fallback": np.arange(w.shape[0]) == 0})
    path = weights_path(features_dir)
    path.parent.mkdir(parents=True)
    stamp = {**IDENTITY, "dataset": dataset, "text_set": "repe", "corpus": "coco-2017-val", "corpus_split": "val",
             "corpus_captions": "captions", "prompts_set": "prompts_ensemble",
             "retrieval": {"modality": "image", "top_k": 1000, "keep": 100, "shift_lambda": 0.25}}
    write_table(path, [table.append_column("embedding", embedding_array(w))],
                features_schema(table.schema, w.shape[1], stamp))


def with_repe(inputs, tmp_path, seed=7):
    """Give fake inputs a features folder holding REPE class weights: the single-prompt axes tilted by seeded
    noise. Returns the (C, d) normalised weights."""
    w = inputs.texts("prompts_single").embeddings
    w = w + 0.3 * np.random.default_rng(seed).normal(size=w.shape)
    inputs.features_dir, inputs.identity = tmp_path / "features" / inputs.meta.name, IDENTITY
    write_repe(inputs.features_dir, inputs.meta.name, w)
    return op.l2_normalize(w)


def test_repe_is_a_default_variant_where_the_dataset_has_class_weights(tmp_path):
    inputs = world(tmp_path, n_groups=4, per_group=3)
    w = with_repe(inputs, tmp_path)
    result = op.run_dataset(inputs, {"orders": 10}, seed=3)
    labels = inputs.image_features.table.column("label").to_numpy()
    r = ex.expansion(op.l2_normalize(inputs.image_features.embeddings) @ w.T, labels,
                     [[3 * g, 3 * g + 1, 3 * g + 2] for g in range(4)], ex.paper_orders(4, 10, 3))
    assert result.metrics["acc_c_repe"] == pytest.approx(r.acc_c.mean)
    assert result.metrics["acc_e_repe"] == pytest.approx(r.acc_e.mean)
    assert result.metrics["acc_s_repe"] == pytest.approx(r.acc_s.mean)
    assert result.metrics["acc_e_repe"] != pytest.approx(result.metrics["acc_e_single"])  # its own weights
    assert list(result.details["variants"]) == ["single", "ensemble", "repe"]
    assert result.details["skipped_variants"] == {}
    assert result.details["variants"]["repe"]["geometry"]["alignment_texts"] is None  # one weight per class
    # which corpus the repe numbers came from, and that it is not the paper's CC12M (App. A.5)
    source = result.details["repe"]["d"]
    assert (source["corpus"], source["corpus_split"], source["paper_corpus"], source["prompts"]) == (
        "coco-2017-val", "val", False, "prompts_ensemble")
    assert source["retrieval_model"] == IDENTITY and source["fallback_classes"] == 1
    assert source["retrieval"]["shift_lambda"] == 0.25
    from vlbench.report import extensibility as rep

    assert rep.repe_notes({"d": {"details": result.details}}) == [
        "repe for d: captions of coco-2017-val, searched with m (not the paper's CC12M)"]
    assert "repe" not in op.run_dataset(inputs, {"orders": 10, "variants": ["single"]}, seed=3).details


def test_repe_without_class_weights_is_skipped_with_the_reason(tmp_path):
    inputs = world(tmp_path, n_groups=3)
    result = op.run_dataset(inputs, {}, seed=0)
    assert set(result.metrics) == {f"acc_{m}_{v}" for m in "ces" for v in ("single", "ensemble")}
    why = result.details["skipped_variants"]["repe"]
    assert why.startswith("not run: dataset 'd' has no REPE class weights (nowhere/retrieval/class_weights.parquet)")
    assert "add the dataset(s) to suite.repe" in why and "drop 'repe' from extensibility.variants" in why
    assert result.params["variants"] == ["single", "ensemble", "repe"] and "repe" not in result.details["variants"]
    with pytest.raises(VlbenchError, match="dataset 'd': no extensibility variant can run \\(not run: dataset 'd' has"):
        op.run_dataset(inputs, {"variants": ["repe"]}, seed=0)
    worded = world(tmp_path, "w", n_groups=3, vocabulary={"blob": np.eye(16)[15]})
    with pytest.raises(VlbenchError, match="adversarial.variant 'repe' cannot run: not run: dataset 'w' has no REPE"):
        op.run_dataset(worded, {"adversarial": {"variant": "repe"}}, seed=0)


def test_repe_in_a_union_needs_every_member(tmp_path):
    a = world(tmp_path, "a", n_groups=1, per_group=2, names=["x", "y"], seed=1)
    b = world(tmp_path, "b", n_groups=1, per_group=2, names=["z", "u"], seed=2)
    wa = with_repe(a, tmp_path)
    partial = op.run_union([("a", a), ("b", b)], {"variants": ["single", "repe"]}, 0)
    assert set(partial.metrics) == {"acc_c_single", "acc_e_single", "acc_s_single"}
    assert partial.details["skipped_variants"]["repe"].startswith("not run: dataset 'b' has no REPE class weights")
    wb = with_repe(b, tmp_path, seed=8)
    full = op.run_union([("a", a), ("b", b)], {"variants": ["single", "repe"]}, 0)
    assert sorted(full.details["repe"]) == ["a", "b"] and full.details["repe"]["b"]["corpus"] == "coco-2017-val"
    x = np.concatenate([op.l2_normalize(i.image_features.embeddings) for i in (a, b)])
    y = np.concatenate([i.image_features.table.column("label").to_numpy() + k for k, i in ((0, a), (2, b))])
    r = ex.expansion(x @ np.concatenate([wa, wb]).T, y, [[0, 1], [2, 3]], ex.paper_orders(2, 100, 0))
    assert (full.metrics["acc_c_repe"], full.metrics["acc_e_repe"], full.metrics["acc_s_repe"]) == pytest.approx(
        (r.acc_c.mean, r.acc_e.mean, r.acc_s.mean))
    assert full.details["skipped_variants"] == {}


# ---------------------------------------------------------------- geometry


def test_uniformity_and_pair_cosines_on_known_vectors():
    e = np.eye(3, dtype=np.float32)  # orthogonal unit vectors: |x - y|^2 = 2 for every pair
    got = op.pair_statistics(e)
    assert got["pairs"] == 3 and got["cos_mean"] == 0.0 and got["uniformity"] == pytest.approx(-4.0)
    x = np.array([[1, 0], [1, 0], [0, 1]], dtype=np.float32)  # pairs: distance^2 0, 2, 2
    assert op.pair_statistics(x)["uniformity"] == pytest.approx(math.log((1 + 2 * math.exp(-4)) / 3))
    assert op.pair_statistics(x[:1])["uniformity"] is None


def test_geometry_margins_alignment_and_group_cosines():
    images = op.l2_normalize(np.array([[1, 0.2, 0], [0, 1, 0.5], [0, 0, 1], [1, 1, 0]]))
    weights = np.eye(3, dtype=np.float32)
    v = op.Vocabulary(names=["a", "b", "c"], group_names=["x", "y"], groups=[[0, 1], [2]], overlap=False,
                      images=images, labels=np.array([0, 1, 2, 1]), weights={"w": weights})
    scores = images @ weights.T
    g = op.geometry(scores, v, weights, op.parse_settings({}), 0)
    true = scores[np.arange(4), v.labels]
    wrong = np.array([scores[i, [c for c in range(3) if c != v.labels[i]]].max() for i in range(4)])
    assert g["margin"]["mean"] == pytest.approx(np.mean(true - wrong))
    assert g["margin"]["negative_fraction"] == 0.0  # image 3 is a tie: margin 0
    assert g["alignment"] == pytest.approx(np.mean(np.sum((images - weights[v.labels]) ** 2, axis=1)))
    # in-group margins exist for classes 0 and 1 only (group y has one class)
    assert g["margin_in_group"]["mean"] == pytest.approx(np.mean([true[0] - scores[0, 1], true[1] - scores[1, 0],
                                                                  true[3] - scores[3, 0]]))
    assert g["cosine"]["text_text"]["mean"] == 0.0 and g["uniformity_texts"] == pytest.approx(-4.0)
    others = scores[np.arange(3)[None, :] != v.labels[:, None]]
    assert g["cosine"]["image_other_classes"] == pytest.approx({"mean": others.mean(), "std": others.std()}, abs=1e-6)


def test_same_class_alignment_of_images_and_prompts(tmp_path):
    rng = np.random.default_rng(4)
    x = op.l2_normalize(rng.normal(size=(9, 5)))
    labels = np.array([0, 0, 0, 1, 1, 2, 3, 3, 3])
    dots, pairs = op.same_class_sums(x, labels, 4)
    brute = [[x[i] @ x[j] for i in range(9) for j in range(i + 1, 9) if labels[i] == labels[j] == c] for c in range(4)]
    assert dots == pytest.approx([sum(b) for b in brute], abs=1e-6) and pairs.tolist() == [3, 1, 0, 3]
    squared = [np.sum((x[i] - x[j]) ** 2) for i in range(9) for j in range(i + 1, 9) if labels[i] == labels[j]]
    assert op._alignment((dots, pairs)) == pytest.approx(np.mean(squared))
    assert op._alignment((dots[2:3], pairs[2:3])) is None
    result = op.run_dataset(world(tmp_path), {"orders": 3}, 0)
    single, ensemble = (result.details["variants"][v]["geometry"] for v in ("single", "ensemble"))
    assert single["alignment_texts"] is None  # one prompt per class
    # the two ensemble prompts of a class are axis +/- 0.3 e: cos = (1 - 0.09) / 1.09
    assert ensemble["alignment_texts"] == pytest.approx(2 - 2 * 0.91 / 1.09, abs=1e-6)
    assert single["alignment_images"] == ensemble["alignment_images"] > 0


def test_margins_in_chunks_equal_one_block(monkeypatch):
    rng = np.random.default_rng(1)
    scores, labels = rng.normal(size=(50, 7)), rng.integers(0, 7, 50)
    same = np.kron(np.eye(2, dtype=bool), np.ones((4, 4), dtype=bool))[:7, :7]
    whole = op.image_class_margins(scores, labels, same)
    monkeypatch.setattr(op, "_CHUNK", 20)  # 2 images per chunk
    parts = op.image_class_margins(scores, labels, same)
    for key in ("true", "margin", "margin_group"):
        assert np.array_equal(whole[key], parts[key])
    assert parts["other_mean"] == pytest.approx(whole["other_mean"]) and parts["other_std"] == pytest.approx(whole["other_std"])


# ---------------------------------------------------------------- adversarial vocabulary


def brute_harm(images, labels, weights, candidate):
    """Images right without the candidate and wrong with it appended as the last column (ties to the lower index)."""
    base = np.argmax(images @ weights.T, axis=1) == labels
    full = np.argmax(images @ np.vstack([weights, candidate]).T, axis=1) == labels
    return int((base & ~full).sum())


def test_scan_matches_appending_each_word_and_ties_keep_the_class():
    rng = np.random.default_rng(0)
    images = op.l2_normalize(rng.normal(size=(60, 8)))
    weights = op.l2_normalize(rng.normal(size=(5, 8)))
    labels = np.argmax(images @ weights.T, axis=1)
    labels[:10] = (labels[:10] + 1) % 5  # some images wrong already
    cands = op.l2_normalize(rng.normal(size=(30, 8)))
    cands[0] = weights[labels[20]]  # a tie with the true class of image 20 (and more): not a harm
    harmed, correct = op.scan_vocabulary(images, labels, weights, cands)
    assert harmed.tolist() == [brute_harm(images, labels, weights, c) for c in cands]
    assert correct.sum() == 50
    three = cands[[3, 7, 11]]
    base = np.argmax(images @ weights.T, axis=1) == labels
    full = np.argmax(images @ np.vstack([weights, three]).T, axis=1) == labels
    assert op.combined_harm(images, labels, weights, three) == int((base & ~full).sum())


def test_adversarial_ranking_flags_related_words(tmp_path, monkeypatch):
    dim = 16
    axis = np.eye(6, dim)
    cands = {"near0": axis[0] + 0.2 * axis[1], "far": -axis[0], "synonym0": axis[0] * 1.0 + 0.01,
             "near2": axis[2] + 0.3 * axis[3], "mid": 0.5 * axis[4] + 0.5 * axis[5]}
    inputs = world(tmp_path, vocabulary=cands)
    monkeypatch.setattr(op, "related_words",
                        lambda meta, words, wn=None: [("synonym", "c0") if w == "synonym0" else None for w in words])
    default = op.run_dataset(inputs, {"orders": 4, "adversarial": {"top": 5}}, 0)
    # default (the paper: its CIFAR-10 top-3 has "equidae"): related words are ranked with the others
    assert [r["word"] for r in default.details["adversarial"]["top"]] == \
        [r["word"] for r in default.tables["vocabulary"].to_pylist()]
    assert default.details["adversarial"]["exclude_related"] is False
    result = op.run_dataset(inputs, {"orders": 4, "adversarial": {"top": 2, "exclude_related": True}}, 0)
    adv = result.details["adversarial"]
    table = result.tables["vocabulary"].to_pylist()
    by_word = {r["word"]: r for r in table}
    assert [r["word"] for r in table] == sorted(cands, key=lambda w: (-by_word[w]["harmed"], w))
    ranked = [r for r in table if r["relation"] is None]
    assert [r["word"] for r in adv["top"]] == [r["word"] for r in ranked[:2]]
    assert adv["related"] == [{"word": "synonym0", "drop": by_word["synonym0"]["drop"],
                               "harmed": by_word["synonym0"]["harmed"], "relation": "synonym", "class": "c0"}]
    assert adv["related_counts"] == {"synonym": 1} and adv["candidates"] == 5
    assert result.metrics["adversarial_drop_top1"] == ranked[0]["drop"]
    labels = inputs.image_features.table.column("label").to_numpy()
    x = op.l2_normalize(inputs.image_features.embeddings)
    w = op.prompt_weights(inputs.texts("prompts_single"), 6, "t")
    top3 = op.l2_normalize(np.stack([cands[r["word"]] for r in ranked[:3]]))
    assert adv["drop_top3"] == op.combined_harm(x, labels, w, top3) / labels.size
    assert result.counts["candidates"] == 5


# ---------------------------------------------------------------- several datasets as groups


def test_union_classes_remove_and_merge():
    names = [["cat", "Dog", "maple_tree"], ["dog", "lion", "maple tree"], ["lion", "ox"]]
    u = op.union_classes(names, "remove")
    assert u.names == ["cat", "ox"] and u.groups == [[0], [], [1]]
    assert u.shared == ["dog", "lion", "maple tree"]
    assert [m.tolist() for m in u.label_map] == [[0, -1, -1], [-1, -1, -1], [-1, 1]]
    m = op.union_classes(names, "merge")
    assert m.names == ["cat", "Dog", "maple_tree", "lion", "ox"]
    # a merged class's text weight is the last member's that lists it (the authors' class2superclass)
    assert m.classes == [(0, 0), (1, 0), (1, 2), (2, 0), (2, 1)]
    assert m.groups == [[0, 1, 2], [1, 3, 2], [3, 4]]


def test_union_classes_first_keeps_the_first_occurrence():
    names = [["cat", "Dog", "maple_tree"], ["dog", "lion", "maple tree"], ["lion", "ox"]]
    f = op.union_classes(names, "first")
    assert f.names == ["cat", "Dog", "maple_tree", "lion", "ox"]
    # text weight of a shared name: the first member's that lists it; the later member keeps it in its vocabulary only
    # as the earlier member's class (one class in the union), and its images keep that class as their label
    assert f.classes == [(0, 0), (0, 1), (0, 2), (1, 1), (2, 1)]
    assert f.groups == [[0, 1, 2], [1, 3, 2], [3, 4]]
    assert [m.tolist() for m in f.label_map] == [[0, 1, 2], [1, 3, 2], [3, 4]]


def test_run_union_first_keeps_images_and_the_first_text(tmp_path):
    """A constructed case: "shared" is a's class 1 and b's class 0. With `first` every image stays (20), "shared" has
    a's text, b's "shared" images are b's (they enter with b), and the numbers are the core functions' on that
    problem; `remove` drops b's and a's "shared" images (the former default), `merge` tests them with a."""
    a = world(tmp_path, "a", n_groups=1, per_group=3, names=["x", "shared", "y"], seed=1)
    b = world(tmp_path, "b", n_groups=1, per_group=2, names=["shared", "z"], seed=2)
    c = world(tmp_path, "c", n_groups=1, per_group=2, names=["u", "v"], seed=3)
    members = [("a", a), ("b", b), ("c", c)]
    first = op.run_union(members, {"variants": ["single"]}, 0)
    assert first.params["duplicates"] == "first"
    assert first.counts == {"samples": 28, "classes": 6, "groups": 3, "shared_names": 1, "removed_classes": 1}
    x = np.concatenate([op.l2_normalize(i.image_features.embeddings) for _, i in members])
    w = {m: op.prompt_weights(i.texts("prompts_single"), len(i.meta.classes), m) for m, i in members}
    weights = np.stack([w["a"][0], w["a"][1], w["a"][2], w["b"][1], w["c"][0], w["c"][1]])  # "shared": a's text
    ya, yb, yc = (i.image_features.table.column("label").to_numpy() for _, i in members)
    labels = np.concatenate([np.array([0, 1, 2])[ya], np.array([1, 3])[yb], np.array([4, 5])[yc]])
    image_group = np.repeat([0, 1, 2], [ya.size, yb.size, yc.size])
    groups = [[0, 1, 2], [1, 3], [4, 5]]
    r = ex.expansion(x @ weights.T, labels, groups, ex.paper_orders(3, 100, 0), overlap=True, image_group=image_group)
    assert first.metrics == pytest.approx({"acc_c_single": r.acc_c.mean, "acc_e_single": r.acc_e.mean,
                                           "acc_s_single": r.acc_s.mean})
    assert [g["images"] for g in first.details["variants"]["single"]["groups"]] == [ya.size, yb.size, yc.size]
    # b's "shared" images enter with b, not with a: a alone is scored on a's images only
    assert r.acc_c.per_group[0] == pytest.approx(ex.group_accuracy(x[:ya.size] @ weights[:3].T, labels[:ya.size],
                                                                   [[0, 1, 2]]).mean)
    # by brute force: b first, then a; step 1 tests b's images among b's classes (shared with a's text, and z)
    scores = x @ weights.T
    def acc(images, classes):
        sel = np.flatnonzero(np.isin(image_group, images))
        pred = np.asarray(classes)[scores[np.ix_(sel, classes)].argmax(axis=1)]
        return float((pred == labels[sel]).mean())
    e = ex.extensibility(scores, labels, groups, np.array([[1, 0, 2]]), overlap=True, image_group=image_group)
    assert e.per_order[0].tolist() == pytest.approx([acc([1], [1, 3]), acc([1, 0], [0, 1, 2, 3]),
                                                     acc([1, 0, 2], [0, 1, 2, 3, 4, 5])])
    removed = op.run_union(members, {"variants": ["single"], "duplicates": "remove"}, 0)
    assert removed.counts["samples"] == 20 and removed.counts["classes"] == 5
    with pytest.raises(ex.ExtensibilityError, match="does not list its class"):
        ex.expansion(scores, labels, [[0, 2], [1, 3], [4, 5]], ex.paper_orders(3, 2, 0), image_group=image_group)


def test_run_union_removes_shared_names_and_merges_them_like_the_authors(tmp_path):
    a = world(tmp_path, "a", n_groups=1, per_group=3, names=["x", "shared", "y"], seed=1)
    b = world(tmp_path, "b", n_groups=1, per_group=2, names=["shared", "z"], seed=2)
    c = world(tmp_path, "c", n_groups=1, per_group=2, names=["u", "v"], seed=3)
    members = [("a", a), ("b", b), ("c", c)]
    removed = op.run_union(members, {"variants": ["single"], "duplicates": "remove"}, 0)
    assert removed.counts == {"samples": 20, "classes": 5, "groups": 3, "shared_names": 1, "removed_classes": 2}
    assert removed.details["groups"] == ["a", "b", "c"] and removed.details["variants"]["single"]["orders_per_target"] == 2
    merged = op.run_union(members, {"variants": ["single"], "duplicates": "merge", "protocol": "authors"}, 0)
    assert merged.counts["samples"] == 28 and merged.counts["classes"] == 6
    # the same numbers from the core function on the merged problem
    x = np.concatenate([op.l2_normalize(i.image_features.embeddings) for _, i in members])
    w = {m: op.prompt_weights(i.texts("prompts_single"), len(i.meta.classes), m) for m, i in members}
    weights = np.stack([w["a"][0], w["b"][0], w["a"][2], w["b"][1], w["c"][0], w["c"][1]])  # "shared": b's text
    la = np.array([0, 1, 2])[a.image_features.table.column("label").to_numpy()]
    lb = np.array([1, 3])[b.image_features.table.column("label").to_numpy()]
    lc = np.array([4, 5])[c.image_features.table.column("label").to_numpy()]
    r = ex.authors_protocol(x @ weights.T, np.concatenate([la, lb, lc]), [[0, 1, 2], [1, 3], [4, 5]], 3, overlap=True)
    assert merged.metrics == pytest.approx({"acc_c_single": r.acc_c, "acc_e_single": r.acc_e, "acc_s_single": r.acc_s})


def test_set_members_are_checked():
    params = {"suite": {"datasets": {"a": "x", "b": "x"},
                        "extensibility_sets": {"ab": ["a", "b"], "one": ["a"], "a": ["a", "b"], "bad": ["a", "q"]}}}
    assert op.set_members(params, "ab") == ["a", "b"]
    for name, message in [("one", "at least two distinct"), ("a", "has the name of a dataset"),
                          ("bad", "unknown dataset 'q'"), ("zz", "no suite.extensibility_sets.zz")]:
        with pytest.raises(VlbenchError, match=message):
            op.set_members(params, name)


# ---------------------------------------------------------------- vocabulary text sets


def test_prompt_sets_from_lists_the_entry_elevater_and_open_clip():
    meta = _meta([ClassInfo(0, "apple"), ClassInfo(1, "maple tree")])
    sets = vocab.vocabulary_text_sets(meta, {"templates": ["a {c}.", "the {c}."], "prompt_sets": {
        "single": ["a photo of a {c}."], "own": "templates", "cifar": "elevater:cifar-100",
        "imagenet": "openclip:simple_imagenet"}})
    assert sorted(sets) == ["prompts_cifar", "prompts_imagenet", "prompts_own", "prompts_single"]
    assert sets["prompts_single"].column("text").to_pylist() == ["a photo of a apple.", "a photo of a maple tree."]
    assert sets["prompts_own"].num_rows == 4
    cifar = sets["prompts_cifar"].column("text").to_pylist()
    assert len(cifar) == 36 and cifar[:2] == ["a photo of a apple.", "a blurry photo of a apple."]
    imagenet = sets["prompts_imagenet"].column("text").to_pylist()
    assert imagenet[:7] == ["itap of a apple.", "a bad photo of the apple.", "a origami apple.",
                            "a photo of the large apple.", "a apple in a video game.", "art of the apple.",
                            "a photo of the small apple."]  # CLIP's notebook subset, as the authors' code has it
    assert sets["prompts_single"].column("class_index").to_pylist() == [0, 1]
    for spec, message in [({"x": "elevater:nope"}, "no templates for 'nope'"), ({"x": "openclip:nope"}, "unknown"),
                          ({"x": 3}, "must be a list of templates"), ({"x": ["no placeholder"]}, "placeholder"),
                          ({"x y": ["{c}"]}, "not allowed"), ([], "must map set names")]:
        with pytest.raises(VlbenchError, match=message):
            vocab.vocabulary_text_sets(meta, {"prompt_sets": spec})


def test_vocabulary_from_a_list_and_its_errors():
    meta = _meta([ClassInfo(0, "a")])
    t = vocab.vocabulary_text_sets(meta, {"vocabulary": {"source": "list", "words": ["equidae", "pony", "pony"],
                                                         "templates": ["a {c}.", "the {c}."]}})["vocabulary"]
    assert t.column("key").to_pylist() == ["equidae", "equidae", "pony", "pony"]
    assert t.column("text").to_pylist() == ["a equidae.", "the equidae.", "a pony.", "the pony."]
    assert set(t.column("source").to_pylist()) == {"vocabulary"}
    for spec, message in [({"source": "web"}, "source one of"), ({"source": "list", "words": []}, "non-empty list"),
                          ({"source": "list", "words": ["a"], "x": 1}, "unknown texts.vocabulary key"),
                          ({"source": "wordnet", "lexnames": ["verb.body"]}, "noun lexicographer")]:
        with pytest.raises(DatasetError, match=message):
            vocab.vocabulary_set("d", spec, wn=object())


class FakeWordNet:
    """data.noun as WordNet writes it: licence lines start with spaces; offset, lex file number, type, word count in
    hex, words with their lex ids, then pointers."""

    LINES = ("  1 This software and database is being provided\n",
             "00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 | that which is perceived\n",
             "13873502 25 n 02 circle 0 round 0 010 @ 13878306 n 0000 | ellipse in which the two axes are equal\n",
             "13874251 25 n 01 semicircle 0 002 @ 13867641 n 0000 | a plane figure with the shape of half a circle\n",
             "02374451 05 n 0b horse 0 Equus_caballus 0 a 0 b 0 c 0 d 0 e 0 f 0 g 0 h 0 i_j 0 011 @ x | solid-hoofed\n")

    def open(self, name):
        import io

        assert name == "data.noun"
        return io.StringIO("".join(self.LINES))


def test_wordnet_nouns_parse_data_noun():
    assert vocab.wordnet_nouns(FakeWordNet(), ["noun.shape"]) == ["circle", "round", "semicircle"]
    words = vocab.wordnet_nouns(FakeWordNet())
    assert "Equus caballus" in words and "i j" in words and len(words) == 15  # 0b = 11 words of the horse line


def test_relations_on_wordnet(wn):
    from vlbench.datasets import synthetic

    shapes = _meta([ClassInfo(i, s.name, wnid=s.wnid, aliases=list(synthetic.ALIASES.get(s.name, ())))
                    for i, s in enumerate(synthetic.SHAPES)], "shapes")
    got = dict(zip(["circle", "rhombus", "oval", "polygon", "equilateral triangle", "trigon", "figure", "Cupid's bow"],
                   vocab.related_words(shapes, ["circle", "rhombus", "oval", "polygon", "equilateral triangle", "trigon",
                                                "figure", "Cupid's bow"], wn)))
    assert got["circle"] == ("class_name", "circle") and got["rhombus"] == ("class_name", "diamond")
    assert got["oval"] == ("class_name", "ellipse")  # an alias of the demo's classes.json
    assert got["trigon"] == ("synonym", "triangle") and got["equilateral triangle"] == ("hyponym", "triangle")
    assert got["polygon"][0] == "hypernym" and got["figure"][0] == "hypernym"
    assert got["Cupid's bow"] is None
    horse = _meta([ClassInfo(0, "horse", wnid="n02374451")], "h")
    rel = vocab.related_words(horse, ["Equidae", "family Equidae", "equine", "stallion", "zebra", "Equus caballus"], wn)
    assert rel == [("hypernym", "horse"), ("hypernym", "horse"), ("hypernym", "horse"), ("hyponym", "horse"), None,
                   ("synonym", "horse")]


# ---------------------------------------------------------------- report charts


def test_report_rows_and_svgs(tmp_path):
    details = {"variants": {"single": {
        "steps": {"acc_e": [1.0, 0.8, 0.7], "acc_e_expected": [1.0, 0.81, 0.7], "acc_s": [0.9, 0.75],
                  "acc_s_expected": None},
        "groups": [{"group": "a", "drop_s": 0.1, "drop_full": 0.2}, {"group": "b", "drop_s": 0.3, "drop_full": 0.4}]}}}
    from vlbench.report import extensibility as rep

    rows = rep.step_rows({"d": {"details": details}})
    assert [(r["curve"], r["kind"], r["groups"], r["value"]) for r in rows if r["curve"].endswith("(Acc-S)")] == [
        ("single: conditional (Acc-S)", "sampled", 2, 0.9), ("single: conditional (Acc-S)", "sampled", 3, 0.75)]
    assert len(rows) == 8
    drops = rep.drop_rows({"d": {"details": details}})
    assert [(r["group"], r["order"], r["kind"]) for r in drops][:2] == [("b", 0, "to Acc-S"),
                                                                        ("b", 0, "to the whole vocabulary")]
    paths = rep.write_extensibility_plots({"d": {"details": details}}, tmp_path)
    assert [p.name for p in paths] == ["extensibility_steps.svg", "extensibility_drops.svg"]
    assert all(p.read_text().startswith("<svg") for p in paths)
    assert rep.write_extensibility_plots({"d": {"details": {}}}, tmp_path / "none") == []
    assert "not run for" not in paths[0].read_text()
    # a skipped variant is named in both charts, with the datasets that skipped it
    results = {"d": {"details": details}, "e": {"details": {**details, "skipped_variants": {"repe": "not run: ..."}}}}
    assert rep.skipped_notes(results) == [
        "repe not run for e: reports/extensibility/<dataset>.json, details.skipped_variants, says why"]
    paths = rep.write_extensibility_plots(results, tmp_path / "skipped")
    assert all("repe not run for e" in p.read_text() for p in paths)
    assert rep.steps_spec(rep.step_rows(results), rep.skipped_notes(results))["title"]["subtitle"][0].startswith("repe")


# ---------------------------------------------------------------- the two stages, on real feature files


def _write_dataset(root: Path, name: str, class_names, groups, per_class, rng, identity, dim=12):
    from tests.conftest import png
    from vlbench.datasets.canonical import write_dataset
    from vlbench.features import embedding_array, features_schema, write_table

    classes = [ClassInfo(i, n, group=g) for i, (n, g) in enumerate(zip(class_names, groups))]
    meta = DatasetMeta(name=name, task="single-label", metric="accuracy", classes=classes)
    rows = [{"sample_id": f"{name}{k}", "label": k % len(classes), "image": png((k * 20 % 255, 0, 0), size=4)}
            for k in range(per_class * len(classes))]
    meta = write_dataset(root / "data/prepared" / name, meta, {"test": iter(rows)})
    axes = rng.normal(size=(len(classes), dim))
    labels = np.array([r["label"] for r in rows])
    feats = root / "features/m" / name
    (feats / "images").mkdir(parents=True)
    table = pa.table({"sample_id": [r["sample_id"] for r in rows], "label": labels})
    emb = axes[labels] + 0.6 * rng.normal(size=(labels.size, dim))
    fp = {**identity, "dataset": name, "dataset_version": meta.version, "decode": "pil"}  # embed.decode
    write_table(feats / "images/test.parquet", [table.append_column("embedding", embedding_array(emb))],
                features_schema(table.schema, dim, fp))
    prompts = text_table("class_index", list(range(len(classes))), ["template"] * len(classes), list(class_names))
    versions = write_text_sets(root / "data/texts" / name, name, {"prompts_single": prompts})
    (feats / "text").mkdir()
    stamp = {**identity, "dataset": name, "text_set": "prompts_single", "text_version": versions["prompts_single"]}
    write_table(feats / "text/prompts_single.parquet", [prompts.append_column("embedding", embedding_array(axes))],
                features_schema(prompts.schema, dim, stamp))


def test_the_stages_on_feature_files(tmp_path):
    rng = np.random.default_rng(0)
    identity = IDENTITY
    _write_dataset(tmp_path, "p", ["red x", "blue x", "red y", "blue y"], ["x", "x", "y", "y"], 3, rng, identity)
    _write_dataset(tmp_path, "q", ["red", "blue", "x"], [None, None, None], 3, rng, identity)
    write_repe(tmp_path / "features/m/p", "p", rng.normal(size=(4, 12)))  # p is in suite.repe, q is not
    params = {"seed": 0, "model": {"slug": "m", "arch": "a", "pretrained": "openai"}, "embed": {"decode": "pil"},
              "suite": {"datasets": {"p": "x", "q": "x"}, "extensibility_sets": {"pq": ["p", "q"]}},
              "extensibility": {"variants": ["single", "repe"], "orders": 5}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for cmd in (["stages.analysis", "--analysis", "extensibility", "--dataset", "p"],
                ["stages.extensibility_sets", "--name", "pq"]):
        proc = subprocess.run([sys.executable, "-m", *cmd], cwd=tmp_path, capture_output=True, text=True, env=env,
                              check=False)
        assert proc.returncode == 0, proc.stderr
    p = json.loads((tmp_path / "reports/extensibility/p.json").read_text())
    assert set(p["metrics"]) == {f"acc_{m}_{v}" for m in "ces" for v in ("single", "repe")}
    assert p["counts"]["samples"] == 12 and p["details"]["groups"] == ["x", "y"] and p["details"]["skipped_variants"] == {}
    assert (tmp_path / "reports/extensibility/p.vocabulary.parquet").is_file()
    pq_ = json.loads((tmp_path / "reports/extensibility/pq.json").read_text())
    assert pq_["counts"] == {"samples": 21, "classes": 7, "groups": 2, "shared_names": 0, "removed_classes": 0,
                             "skipped_corrupt": 0}
    assert pq_["params"]["members"] == ["p", "q"] and pq_["fingerprint"]["model"] == "m"
    assert set(pq_["metrics"]) == {"acc_c_single", "acc_e_single", "acc_s_single"}  # q has no REPE weights
    assert pq_["details"]["skipped_variants"]["repe"].startswith("not run: dataset 'q' has no REPE class weights "
                                                                 "(features/m/q/retrieval/class_weights.parquet)")
    # a set that names an unknown dataset is one clear line
    params["suite"]["extensibility_sets"]["bad"] = ["p", "nope"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    proc = subprocess.run([sys.executable, "-m", "stages.extensibility_sets", "--name", "bad"], cwd=tmp_path,
                          capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 2 and proc.stderr.startswith("error: suite None: extensibility_sets.bad lists dataset "
                                                           "'nope', which is not among the suite's datasets ['p', 'q']")
    assert len(proc.stderr.strip().splitlines()) == 1
