"""The granularity analysis (issue 13): hierarchy index, propagated scores, AP against scikit-learn, levels, the
two-level variant, name counts and their correlation, coarse-class text sets, and a whole run on features."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import average_precision_score

from vlbench.analyses import granularity as g
from vlbench.datasets import synthetic
from vlbench.datasets.canonical import ClassInfo, DatasetError, DatasetMeta
from vlbench.features import Features
from vlbench.knowledge.coarse_texts import (
    coarse_text_sets,
    group_prompts,
    hierarchy_prompts,
)
from vlbench.knowledge.hierarchy import Graph, build_from_graph
from vlbench.results import Result, write_result
from vlbench.texts import build_text_sets, text_table, write_text_sets

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "tiered_imagenet"

# A miniature tree: r -> m1 -> {l1, l2}; r -> m2 -> l3 -> l4 (l3 is a leaf above the leaf l4, like the demo's
# rectangle above square). Leaves in leaf order l1, l2, l3, l4; coarse classes r, m1, m2.
R, M1, M2, L1, L2, L3, L4 = ("n00000001", "n00000010", "n00000020", "n00000100", "n00000200", "n00000300",
                             "n00000400")
MINI = Graph(parents={R: (), M1: (R,), M2: (R,), L1: (M1,), L2: (M1,), L3: (M2,), L4: (L3,)},
             lemmas={R: ("thing",), M1: ("animal",), M2: ("plant",), L1: ("dog",), L2: ("cat",), L3: ("tree",),
                     L4: ("oak",)})
LEAVES = [L1, L2, L3, L4]


@pytest.fixture
def mini():
    return build_from_graph(LEAVES, MINI)


@pytest.fixture(scope="module")
def wn(tmp_path_factory):
    from vlbench.wordnet import WordNetMissing, load_wordnet

    try:
        return load_wordnet(download=False, cache_dir=tmp_path_factory.mktemp("wordnet"))
    except WordNetMissing as err:
        pytest.skip(f"no WordNet on this machine: {err}")


# ---------------------------------------------------------------------------------------------------------
# Index, positives, propagation


def test_index_lists_children_leaf_descendants_and_levels(mini):
    index = g.index_hierarchy(mini)
    assert index.nodes == (L1, L2, L3, L4, R, M1, M2)
    assert index.names == ("thing", "animal", "plant")
    assert index.levels.tolist() == [2, 2, 2, 3, 0, 1, 1]
    # node indices: leaves 0..3, then r=4, m1=5, m2=6
    assert [c.tolist() for c in index.children] == [[5, 6], [0, 1], [2]]
    assert [b.tolist() for b in index.below] == [[0, 1, 2, 3], [0, 1], [2, 3]]
    assert index.membership[2].tolist() == [False, False, True, True]  # l3 covers itself and l4


def test_an_image_is_a_positive_of_its_leaf_and_every_ancestor(mini):
    index = g.index_hierarchy(mini)
    image_leaves = np.array([[0, 0, 0, 1], [1, 0, 0, 0], [0, 1, 1, 0]], dtype=bool)  # l4; l1; l2 and l3
    pos = g.positives(image_leaves, index)
    #                       l1 l2 l3 l4  r  m1 m2
    assert pos.astype(int).tolist() == [[0, 0, 1, 1, 1, 0, 1], [1, 0, 0, 0, 1, 1, 0], [0, 1, 1, 0, 1, 1, 1]]


def test_group_max_equals_brute_force_across_row_chunks(monkeypatch):
    monkeypatch.setattr(g, "ROW_CHUNK", 7)
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(30, 12)).astype(np.float32)
    groups = [np.array([3]), np.array([0, 11, 5]), np.arange(12), np.array([7, 2])]
    expected = np.stack([scores[:, grp].max(axis=1) for grp in groups], axis=1)
    np.testing.assert_array_equal(g.group_max(scores, groups), expected)
    with pytest.raises(ValueError, match="empty group"):
        g.group_max(scores, [np.array([1]), np.array([], dtype=int)])


def test_direct_child_and_leaf_scores_are_cosines_and_their_maxima(mini):
    index = g.index_hierarchy(mini)
    eye = np.eye(7, dtype=np.float32)
    leaf_w, coarse_w = eye[:4], eye[4:]  # l1..l4, then r, m1, m2 on their own axes
    image = np.array([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.05]], dtype=np.float32)
    cos = image / np.linalg.norm(image)
    scores = g.hierarchy_scores(image * 3, leaf_w, coarse_w, index)  # scale does not matter: cosines
    np.testing.assert_allclose(scores["leaves"], cos[:, :4], rtol=1e-6)
    np.testing.assert_allclose(scores["direct"], cos[:, 4:], rtol=1e-6)
    # child: r = max(m1, m2) direct = .6; m1 = max(l1, l2) = .2; m2 = max(l3) = .3 (its child l3, not l4)
    np.testing.assert_allclose(scores["child"], cos[:, [5, 1, 2]], rtol=1e-6)
    # leaf: r = max of all leaves = .4; m1 = .2; m2 = max(l3, l4) = .4
    np.testing.assert_allclose(scores["leaf"], cos[:, [3, 1, 3]], rtol=1e-6)


# ---------------------------------------------------------------------------------------------------------
# Average precision, levels


def _random_case(mini, n=60, seed=1):
    rng = np.random.default_rng(seed)
    index = g.index_hierarchy(mini)
    image_leaves = np.zeros((n, 4), dtype=bool)
    image_leaves[np.arange(n), rng.integers(0, 4, n)] = True
    scores = {"leaves": rng.normal(size=(n, 4)), **{s: rng.normal(size=(n, 3)) for s in g.SCORINGS}}
    return index, image_leaves, scores


def test_ap_matches_scikit_learn_per_class(mini, monkeypatch):
    monkeypatch.setattr(g, "CLASS_CHUNK", 2)  # blocks of classes give the same numbers
    index, image_leaves, scores = _random_case(mini)
    res = g.evaluate_hierarchy(scores, image_leaves, index)
    targets = g.positives(image_leaves, index)
    for j in range(4):
        assert res.leaf_ap[j] == pytest.approx(average_precision_score(targets[:, j], scores["leaves"][:, j]))
    for s in g.SCORINGS:
        for j in (1, 2):  # m1, m2
            assert res.coarse_ap[s][j] == pytest.approx(average_precision_score(targets[:, 4 + j], scores[s][:, j]))
    assert res.coarse_ap["direct"][0] == 1.0  # r: every image is a positive
    assert res.coarse_ok.tolist() == [False, True, True] and res.leaf_ok.all()


def test_map_gaps_and_helped_counts_leave_the_all_positive_root_out(mini):
    index, image_leaves, scores = _random_case(mini)
    res = g.evaluate_hierarchy(scores, image_leaves, index)
    m = g.hierarchy_metrics(res)
    ap = res.coarse_ap
    assert m["leaf_map"] == pytest.approx(res.leaf_ap.mean())
    assert m["coarse_map_direct"] == pytest.approx(ap["direct"][1:].mean())
    assert m["coarse_map_leaf"] == pytest.approx(ap["leaf"][1:].mean())
    assert sorted(m) == ["coarse_map_child", "coarse_map_direct", "coarse_map_leaf", "leaf_map"]
    summary = g.propagation_summary(res)
    assert summary["gap_child"] == pytest.approx(m["coarse_map_child"] - m["coarse_map_direct"])
    assert summary["helped_leaf"] == int((ap["leaf"][1:] > ap["direct"][1:]).sum())
    assert summary["helped_leaf"] + summary["hurt_leaf"] + summary["equal_leaf"] == 2
    chance = g.chance_levels(res, 4)
    assert chance["coarse_map"] == pytest.approx(g.positives(image_leaves, index)[:, 5:].mean())


def test_per_level_rows(mini):
    index, image_leaves, scores = _random_case(mini)
    res = g.evaluate_hierarchy(scores, image_leaves, index)
    rows = {r["level"]: r for r in g.per_level(res, index)}
    assert sorted(rows) == [1, 2, 3]  # level 0 holds only the all-positive root
    assert rows[1]["coarse_classes"] == 2 and rows[1]["leaves"] == 0 and rows[1]["leaf_map"] is None
    assert rows[1]["direct"] == pytest.approx(res.coarse_ap["direct"][1:].mean())
    assert rows[1]["helped_leaf"] == int((res.coarse_ap["leaf"][1:] > res.coarse_ap["direct"][1:]).sum())
    assert rows[2]["coarse_classes"] == 0 and rows[2]["leaves"] == 3 and rows[2]["direct"] is None
    assert rows[3]["leaf_map"] == pytest.approx(res.leaf_ap[3])


def test_perfect_leaf_scores_make_leaf_propagation_perfect(mini):
    index = g.index_hierarchy(mini)
    labels = np.arange(40) % 4
    image_leaves = np.eye(4, dtype=bool)[labels]
    rng = np.random.default_rng(3)
    scores = {"leaves": image_leaves + 0.1 * rng.random((40, 4)), "direct": rng.random((40, 3)),
              "child": rng.random((40, 3))}
    scores["leaf"] = g.group_max(scores["leaves"], index.below)
    res = g.evaluate_hierarchy(scores, image_leaves, index)
    m = g.hierarchy_metrics(res)
    assert m["coarse_map_leaf"] == 1.0 and m["coarse_map_direct"] < 1.0
    # l3's own prompt must also rank the oaks (l4) first, its positives too: only the other leaves are perfect
    assert res.leaf_ap[[0, 1, 3]].tolist() == [1.0, 1.0, 1.0] and res.leaf_ap[2] < 1.0


# ---------------------------------------------------------------------------------------------------------
# Two-level variant


def test_two_level_top1s():
    # fine classes 0,1 (group 0) and 2,3 (group 1) on the axes; groups' own prompts point elsewhere
    fine_w = np.eye(4, 5, dtype=np.float32)
    group_w = np.array([[0, 0, 0, 0, 1], [1, 0, 0, 0, 0]], dtype=np.float32)  # group 0 -> axis 4, group 1 -> axis 0
    images = np.array([[1, .2, 0, 0, 0], [0, 1, .9, 0, 0], [0, 0, 1, 0, .5], [0, 0, 0, 1, 0]], dtype=np.float32)
    labels = np.array([0, 2, 2, 3])  # image 1 is a fine error (predicts 1) and a group error (group 0 vs 1)
    out = g.evaluate_two_level(images, labels, fine_w, np.array([0, 0, 1, 1]), group_w)
    assert out["twolevel_fine_top1"] == 0.75
    assert out["twolevel_coarse_from_fine_top1"] == 0.75
    # direct: image 0 -> group 1 (axis 0) wrong; 1 -> tie (0, 0) -> group 0 wrong; 2 -> group 0 wrong; 3 -> tie wrong
    assert out["twolevel_coarse_direct_top1"] == 0.0
    # mean of children: group 0 = (1,1,0,0)/sqrt2, group 1 = (0,0,1,1)/sqrt2 -> 0, 0 (1 vs .9: wrong), 1, 1
    assert out["twolevel_coarse_mean_children_top1"] == 0.75


# ---------------------------------------------------------------------------------------------------------
# Name counts and correlation


def test_mentions_are_whole_words_singular_or_plural_and_multiword():
    captions = ["Two red Circles and a gray polygon", "a plane figure", "plane figures, a ray", "the boxes", "a body"]
    counts = g.mention_counts(captions, ["circle", "ray", "plane figure", "figure", "box", "body",
                                         "vessel (container)"])
    assert counts.tolist() == [1, 1, 2, 2, 1, 1, 0]  # "gray" is not "ray"; "figure" inside "plane figure" counts
    assert g.plural("body") == "bodies" and g.plural("day") == "days" and g.plural("glass") == "glasses"
    assert g.name_forms("table (n04379964)") == {("table",), ("tables",)}


def test_frequency_gap_and_pearson():
    gaps = g.frequency_gaps(np.array([0, 9]), np.array([99, 9, 0]), [np.array([0, 1]), np.array([2])])
    np.testing.assert_allclose(gaps, [np.log10(55), np.log10(1) - 1])
    x, y = np.array([1.0, 2, 3, 5]), np.array([2.0, 1, 4, 4])
    r, p = g.pearson(x, y)
    assert r == pytest.approx(np.corrcoef(x, y)[0, 1]) and 0 < p < 1
    assert g.pearson(x, np.ones(4)) == (None, None) and g.pearson(x[:2], y[:2]) == (None, None)


# ---------------------------------------------------------------------------------------------------------
# Coarse-class text sets


def _meta(classes, task="single-label", metric="accuracy", name="d"):
    return DatasetMeta(name=name, task=task, metric=metric, classes=classes)


def test_group_prompts_one_row_per_group_and_template():
    meta = _meta([ClassInfo(0, "red circle", group="circle"), ClassInfo(1, "blue circle", group="circle"),
                  ClassInfo(2, "otter", group="aquatic_mammals")])
    table = group_prompts(meta, ["a {c}.", "a photo of a {c}."])
    assert table.column("key").to_pylist() == ["circle", "circle", "aquatic_mammals", "aquatic_mammals"]
    assert table.column("text").to_pylist()[2:] == ["a aquatic mammals.", "a photo of a aquatic mammals."]
    with pytest.raises(DatasetError, match=r"classes 1 \(x\) have none"):
        group_prompts(_meta([ClassInfo(0, "a", group="g"), ClassInfo(1, "x")]), ["{c}"])


def test_coarse_text_set_options_are_checked():
    meta = _meta([ClassInfo(0, "a", group="g")])
    assert coarse_text_sets(meta, {"templates": ["{c}"]}) == {}
    with pytest.raises(DatasetError, match="texts.hierarchy must be one of tree, dag"):
        coarse_text_sets(meta, {"hierarchy": True})
    with pytest.raises(DatasetError, match="texts.groups must be true or false"):
        coarse_text_sets(meta, {"groups": "yes"})
    with pytest.raises(DatasetError, match="texts.templates must be a non-empty list"):
        coarse_text_sets(meta, {"groups": True, "templates": ["no placeholder"]})
    with pytest.raises(DatasetError, match="needs classes with a WordNet id"):
        hierarchy_prompts(meta, ["{c}"], "tree")


def test_hierarchy_prompts_of_the_demo_shapes_on_wordnet(wn):
    meta = _meta([ClassInfo(i, s.name, wnid=s.wnid) for i, s in enumerate(synthetic.SHAPES)])
    table = hierarchy_prompts(meta, ["a {c}.", "a drawing of a {c}."], "tree", wn)
    keys = table.column("key").to_pylist()
    assert len(keys) == 24 and len(set(keys)) == 12  # 12 coarse classes x 2 templates
    assert keys[:2] == ["n00001740", "n00001740"] and table.column("text").to_pylist()[:2] == ["a entity.",
                                                                                               "a drawing of a entity."]
    assert "a polygon." in table.column("text").to_pylist()
    dag = hierarchy_prompts(meta, ["{c}"], "dag", wn)
    assert {"regular polygon", "isogon"} <= set(dag.column("text").to_pylist())


def test_the_demo_entries_coarse_sets(tmp_path, wn):
    spec = {"source": "synthetic", "task": "shape_color", "splits": {"test": 2}}
    meta = synthetic.build("sc", spec, tmp_path / "sc")
    cfg = {"templates": ["a {c}."], "groups": True}
    assert sorted(build_text_sets(meta, tmp_path / "sc", cfg)) == ["prompts"]  # coarse sets come from the stage
    sets = coarse_text_sets(meta, cfg)
    assert sorted(sets) == ["groups"] and sets["groups"].num_rows == 12
    spec = {"source": "synthetic", "task": "hierarchy", "splits": {"test": 2}}
    meta = synthetic.build("h", spec, tmp_path / "h")
    sets = coarse_text_sets(meta, {"templates": ["a {c}."], "hierarchy": "tree"}, wn)
    assert sets["hierarchy"].num_rows == 12  # the 12 shapes are the leaves; their hypernym classes are not
    assert set(write_text_sets(tmp_path / "texts", "h", sets)) == {"hierarchy"}


# ---------------------------------------------------------------------------------------------------------
# A whole run on features (real WordNet; a synthetic "model" whose embeddings are known)


@dataclass
class FakeInputs:
    """What `run` uses of `vlbench.analyses.base.Inputs`: the meta, the text-set folder and feature readers."""

    meta: DatasetMeta
    texts_dir: Path
    image_features: Features
    text_features: dict

    def images(self, split):
        assert split == "test"
        return self.image_features

    def texts(self, name):
        return self.text_features[name]


def _features(table: pa.Table, emb: np.ndarray) -> Features:
    return Features(table, emb.astype(np.float32), {}, [])


def _shape_world(tmp_path, wn, mode="tree"):
    """The demo's 12 shapes; a text 'model' that puts each leaf on its own axis and every coarse class on a random
    direction; images on their leaf's axis plus noise."""
    meta = _meta([ClassInfo(i, s.name, wnid=s.wnid) for i, s in enumerate(synthetic.SHAPES)], name="shapes")
    rng = np.random.default_rng(0)
    dim = 40
    prompts = text_table("class_index", list(range(12)), ["template"] * 12, [f"a {c.name}." for c in meta.classes])
    coarse = hierarchy_prompts(meta, ["a {c}."], mode, wn)
    corpus = text_table("sample_id", ["0", "1", "2", "3"], ["caption"] * 4,
                        ["a red circle", "two hexagons", "a polygon and a circle", "three stars"])
    texts_dir = tmp_path / "texts" / "shapes"
    write_text_sets(texts_dir, "shapes", {"prompts": prompts, "hierarchy": coarse})
    write_text_sets(tmp_path / "texts" / "corpus", "corpus", {"captions": corpus})
    labels = np.arange(120) % 12
    images = np.eye(12, dim)[labels] + 0.05 * rng.normal(size=(120, dim))
    image_table = pa.table({"sample_id": [f"s{i}" for i in range(120)], "label": labels})
    text_features = {"prompts": _features(prompts, np.eye(12, dim)),
                     "hierarchy": _features(coarse, rng.normal(size=(coarse.num_rows, dim)))}
    return FakeInputs(meta, texts_dir, _features(image_table, images), text_features)


def test_run_on_the_shape_hierarchy(tmp_path, wn, monkeypatch):
    from vlbench import wordnet

    monkeypatch.setattr(wordnet, "load_wordnet", lambda *a, **k: wn)
    inputs = _shape_world(tmp_path, wn)
    result = g.run(inputs, {"split": "test", "mode": "tree", "corpus": "corpus"}, 0)
    m = result.metrics
    assert m["coarse_map_leaf"] == pytest.approx(1.0)
    assert m["coarse_map_direct"] < 0.9 and result.details["propagation"]["gap_leaf"] > 0
    table = result.tables["classes"]
    ap = dict(zip(table.column("name").to_pylist(), table.column("ap_direct").to_pylist()))
    # ellipse and rectangle are leaves above leaves (circle, square): their own prompts must rank those too
    assert all(ap[s.name] == 1.0 for s in synthetic.SHAPES if s.name not in ("ellipse", "rectangle"))
    assert ap["ellipse"] < 1.0 and ap["rectangle"] < 1.0 and m["leaf_map"] < 1.0
    counts = result.counts
    # 12 coarse classes: entity, abstraction, attribute, shape have every image; the other 8 are evaluated
    assert (counts["coarse_classes"], counts["coarse_all_positive"], counts["coarse_evaluated"]) == (12, 4, 8)
    assert counts["corpus_captions"] == 4 and counts["samples"] == 120
    assert table.num_rows == 24 and table.column("name").to_pylist()[5] == "diamond"  # leaves keep class names
    row = dict(zip(table.column("name").to_pylist(), table.column("name_count").to_pylist()))
    assert (row["circle"], row["polygon"], row["hexagon"], row["star"]) == (2, 1, 1, 1)
    assert result.details["frequency"]["classes"] == 8
    assert [r["level"] for r in result.details["levels"]] == list(range(4, 11))
    # each leaf holds 1/12 of the images; ellipse and rectangle hold circles and squares too: 14/12 in all
    assert result.details["chance"]["leaf_map"] == pytest.approx(14 / 12 / 12)


def test_run_refuses_a_hierarchy_set_of_the_other_mode(tmp_path, wn, monkeypatch):
    from vlbench import wordnet

    monkeypatch.setattr(wordnet, "load_wordnet", lambda *a, **k: wn)
    inputs = _shape_world(tmp_path, wn, mode="dag")
    with pytest.raises(g.GranularityError, match=r"hierarchy.parquet: .*extra \['n13866515', 'n13867133'\].*"
                                                 r"texts.hierarchy mode"):
        g.run(inputs, {"split": "test", "mode": "tree", "corpus": None}, 0)


def test_run_on_the_dag(tmp_path, wn, monkeypatch):
    from vlbench import wordnet

    monkeypatch.setattr(wordnet, "load_wordnet", lambda *a, **k: wn)
    inputs = _shape_world(tmp_path, wn, mode="dag")
    result = g.run(inputs, {"split": "test", "mode": "dag", "corpus": None}, 0)
    assert result.counts["coarse_classes"] == 14 and result.counts["coarse_evaluated"] == 10
    assert result.metrics["coarse_map_leaf"] == pytest.approx(1.0)  # squares lie below both of their parents
    assert result.details["frequency"] == {"corpus": None} and "freq_gap_r" not in result.metrics


def test_params_are_checked():
    from vlbench.params import ParamsError

    with pytest.raises(ParamsError, match="granularity.mode 'graph' is not one of"):
        g.check_cfg({"mode": "graph"})
    with pytest.raises(ParamsError, match="granularity.corpus must be a dataset name or null"):
        g.check_cfg({"corpus": 3})
    assert g.check_cfg({}) == {"split": "test", "mode": "tree", "corpus": None}


def test_run_without_coarse_text_sets_says_what_to_set(tmp_path):
    meta = _meta([ClassInfo(0, "a")])
    write_text_sets(tmp_path / "t", "d", {"prompts": text_table("class_index", [0], ["template"], ["a"])})
    with pytest.raises(g.GranularityError, match="set texts.hierarchy .* or texts.groups: true"):
        g.run(FakeInputs(meta, tmp_path / "t", None, {}), {"split": "test"}, 0)


def test_image_without_a_leaf_label_is_named(mini):
    meta = _meta([ClassInfo(0, "dog", wnid=L1), ClassInfo(1, "animal", wnid=M1, group="hypernym")],
                 task="multi-label", metric="map_11point")
    table = pa.table({"sample_id": ["a", "b"], "labels": [[0, 1], [1]]})
    with pytest.raises(g.GranularityError, match="1 image\\(s\\) have no leaf class .* sample 'b'"):
        g.image_leaves(table, meta, np.array([0]))
    ok = pa.table({"sample_id": ["a"], "labels": [[1, 0]]})
    assert g.image_leaves(ok, meta, np.array([0])).tolist() == [[True]]


def test_two_level_run_and_result_file(tmp_path, monkeypatch):
    classes = [ClassInfo(i, f"{c} {s}", group=s) for i, (s, c) in enumerate([(s, c) for s in ("circle", "star")
                                                                                for c in ("red", "blue")])]
    meta = _meta(classes, name="sc")
    prompts = text_table("class_index", [0, 1, 2, 3], ["template"] * 4, [c.name for c in classes])
    groups = group_prompts(meta, ["a {c}."])
    write_text_sets(tmp_path / "texts" / "sc", "sc", {"prompts": prompts, "groups": groups})
    labels = np.array([0, 1, 2, 3, 3])
    images = np.eye(4, 6)[labels] + np.array([0, 0, 0, 0, 0, 0.1])
    inputs = FakeInputs(meta, tmp_path / "texts" / "sc", _features(pa.table({"sample_id": list("abcde"),
                                                                              "label": labels}), images),
                        {"prompts": _features(prompts, np.eye(4, 6)),
                         "groups": _features(groups, np.array([[1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0.]]))})
    result = g.run(inputs, {"split": "test", "mode": "tree", "corpus": "corpus"}, 0)
    assert result.metrics == {"twolevel_fine_top1": 1.0, "twolevel_coarse_direct_top1": 1.0,
                              "twolevel_coarse_from_fine_top1": 1.0, "twolevel_coarse_mean_children_top1": 1.0}
    assert result.details == {"twolevel_chance": {"fine_top1": 0.25, "coarse_top1": 0.5}}
    assert result.counts["groups"] == 2 and result.tables["classes"].num_rows == 0
    monkeypatch.chdir(tmp_path)
    path = write_result("granularity", "sc", result, {"model": "m"})
    doc = json.loads(path.read_text())
    assert doc["details"]["twolevel_chance"]["coarse_top1"] == 0.5
    assert pq.read_table(tmp_path / "reports/granularity/sc.classes.parquet").column_names == list(g.CLASS_COLUMNS)


def test_results_without_details_keep_their_format(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    doc = json.loads(write_result("zeroshot", "d", Result({"accuracy": 1.0}, {}, {}), {}).read_text())
    assert "details" not in doc


def test_tiered_imagenet_groups_from_the_split_csvs():
    """tieredImageNet's two levels as a class list with groups (the reference CSVs, when on this machine)."""
    if not (REFERENCE / "train.csv").is_file():
        pytest.skip(f"no tieredImageNet split CSVs at {REFERENCE}")
    rows = [line.split(",") for split in ("train", "val", "test")
            for line in (REFERENCE / f"{split}.csv").read_text().split()]
    classes = [ClassInfo(i, wnid, wnid=wnid, group=category) for i, (wnid, category) in enumerate(rows)]
    table = group_prompts(_meta(classes), ["a photo of a {c}."])
    assert len(classes) == 608 and len(set(table.column("key").to_pylist())) == 34


# ---------------------------------------------------------------------------------------------------------
# The per-level plot


def test_levels_plot_rows_and_svg(tmp_path):
    from vlbench.report.plots import level_rows, write_granularity_levels

    levels = [{"level": 4, "coarse_classes": 2, "direct": 0.5, "child": 0.9, "leaf": 0.8, "leaves": 0, "leaf_map": None},
              {"level": 6, "coarse_classes": 0, "direct": None, "child": None, "leaf": None, "leaves": 3,
               "leaf_map": 0.7}]
    results = {"shapes": {"details": {"levels": levels}}, "shape_color": {"details": {"twolevel_chance": {}}}}
    rows = level_rows(results)
    assert [(r["level"], r["series"], r["value"]) for r in rows] == [
        (4, "coarse: direct", 0.5), (4, "coarse: child-propagated", 0.9), (4, "coarse: leaf-propagated", 0.8),
        (6, "leaves (own prompts)", 0.7)]
    path = write_granularity_levels(results, tmp_path)
    first = path.read_bytes()
    assert path.name == "granularity_levels.svg" and b"shapes" in first and b"<svg" in first
    assert write_granularity_levels(results, tmp_path).read_bytes() == first  # same numbers, same bytes
    assert write_granularity_levels({"shape_color": results["shape_color"]}, tmp_path / "none") is None


def test_imagenet_and_tiered_entries_use_clips_templates_for_leaves_and_coarse_classes(tmp_path, wn):
    """Xu et al. (Sec. 3): "we adopt the prompt templates used in [18]" ([18] = CLIP): CLIP's 80 ImageNet templates
    for the leaves (`prompts`) and for the coarse classes (`hierarchy`, `groups`), not one prompt."""
    import yaml

    from vlbench.texts import entry_templates

    root = Path(__file__).resolve().parents[1] / "conf" / "dataset"
    clip = entry_templates("x", {"templates": "openclip:openai_imagenet"})
    assert len(clip) == 80 and clip[0] == "a bad photo of a {c}." and "a photo of a {c}." in clip
    meta = _meta([ClassInfo(0, "tabby cat", wnid="n02123045", group="feline"),
                  ClassInfo(1, "tiger", wnid="n02129604", group="feline"),
                  ClassInfo(2, "goldfish", wnid="n01443537", group="fish")])
    for entry in ("imagenet-1k", "tiered-imagenet"):
        texts = yaml.safe_load((root / f"{entry}.yaml").read_text())["texts"]
        assert entry_templates(entry, texts) == clip
        leaves = build_text_sets(meta, tmp_path, texts)["prompts"]
        assert leaves.num_rows == 3 * 80 and leaves.column("text").to_pylist()[:2] == [
            "a bad photo of a tabby cat.", "a photo of many tabby cat."]
        coarse = coarse_text_sets(meta, texts, wn)
        for table in coarse.values():
            keys = table.column("key").to_pylist()
            assert len(keys) == 80 * len(set(keys))  # every coarse class under all 80 templates
    assert sorted(coarse_text_sets(meta, {"templates": "openclip:openai_imagenet", "hierarchy": "tree", "groups": True},
                                   wn)) == ["groups", "hierarchy"]
    # the openness variants of imagenet-1k keep the single prompt and CLIP's 7
    texts = yaml.safe_load((root / "imagenet-1k.yaml").read_text())["texts"]
    from vlbench.knowledge.vocabulary import prompt_sets

    sets = prompt_sets(meta, texts)
    assert sets["prompts_single"].column("text").to_pylist() == ["a photo of a tabby cat.", "a photo of a tiger.",
                                                                  "a photo of a goldfish."]
    assert sets["prompts_ensemble"].num_rows == 3 * 7
    with pytest.raises(DatasetError, match="unknown open_clip template table"):
        entry_templates("x", {"templates": "openclip:nope"})
