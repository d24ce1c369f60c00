"""FewTrans' hierarchical (WordNet DAG) class sampling (vlbench/analyses/adapt/fewtrans_dag.py and its use in
fewtrans.py): the collapsed sampling graph, node eligibility, the per-episode draws, the splits and the errors."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pyarrow.compute as pc
import pytest

from tests.test_adapt_fewtrans import FakeInputs, pools_of
from vlbench.analyses.adapt import fewtrans as ft
from vlbench.analyses.adapt import fewtrans_dag as dag
from vlbench.analyses.adapt.protocol import AdaptError
from vlbench.datasets.canonical import ClassInfo

# A hand-built hypernym table. T -> R (T has one child: collapsed); R -> A, B; A -> C (C has two classes), class 2,
# class 4; B -> class 3, class 4 (two parents), D (D has one class: collapsed).
PARENTS = {
    "n00000000": [], "n00000001": ["n00000000"], "n00000002": ["n00000001"], "n00000003": ["n00000001"],
    "n00000004": ["n00000002"], "n00000006": ["n00000003"],
    "n00000010": ["n00000004"], "n00000011": ["n00000004"], "n00000012": ["n00000002"],
    "n00000013": ["n00000003"], "n00000014": ["n00000003", "n00000002"], "n00000015": ["n00000006"],
}
WNIDS = ["n00000010", "n00000011", "n00000012", "n00000013", "n00000014", "n00000015"]
NODES = {"n00000001": (0, 1, 2, 3, 4, 5), "n00000002": (0, 1, 2, 4), "n00000003": (3, 4, 5), "n00000004": (0, 1)}


def nodes_of(parents=PARENTS, wnids=WNIDS, classes=None, root=None):
    classes = range(len(wnids)) if classes is None else classes
    return {n.wnid: n.classes for n in dag.internal_nodes(dag.sampling_graph(parents, wnids, classes, root), wnids)}


def test_sampling_graph_collapses_single_child_nodes_and_spans_leaves():
    assert nodes_of() == NODES  # T and D collapsed; class 4 below both A and B


def test_node_with_the_same_child_twice_stays_as_in_meta_dataset():
    # P -> N -> M and P -> M: collapsing N gives P the children [M, M], so P stays and duplicates M's classes.
    parents = {"n00000001": [], "n00000002": ["n00000001"], "n00000003": ["n00000002", "n00000001"],
               "n00000010": ["n00000003"], "n00000011": ["n00000003"]}
    assert nodes_of(parents, ["n00000010", "n00000011"]) == {"n00000001": (0, 1), "n00000003": (0, 1)}


def test_class_above_another_class_stays_a_class():
    # class 1 is class 0's hypernym: its concept spans both, and class 1 is still drawn as a class.
    parents = {"n00000001": [], "n00000010": ["n00000011"], "n00000011": ["n00000001"], "n00000012": ["n00000001"]}
    assert nodes_of(parents, ["n00000010", "n00000011", "n00000012"]) == {"n00000001": (0, 1, 2), "n00000011": (0, 1)}


def test_split_graph_and_root_restriction():
    assert nodes_of(classes=[0, 1, 3]) == {"n00000001": (0, 1, 3), "n00000004": (0, 1)}  # A collapses into C
    # with root B only B and below are kept above the classes (Meta-Dataset's valid/test graphs)
    assert nodes_of(classes=[3, 4, 5], root="n00000003") == {"n00000003": (3, 4, 5)}


def test_eligibility_bounds_and_allowed_classes():
    nodes = dag.internal_nodes(dag.sampling_graph(PARENTS, WNIDS, range(6)), WNIDS)
    pick = lambda allowed, lo, hi: {n.wnid: n.classes for n in dag.eligible_nodes(nodes, allowed, lo, hi)}
    assert pick(set(range(6)), 2, 392) == NODES
    assert pick(set(range(6)), 3, 4) == {"n00000002": (0, 1, 2, 4), "n00000003": (3, 4, 5)}
    assert pick({0, 2, 3, 4}, 2, 392) == {"n00000001": (0, 2, 3, 4), "n00000002": (0, 2, 4), "n00000003": (3, 4)}


def dag_sample(sizes=(12, 30, 8, 20, 6, 16), episodes=400, seed=0, max_ways=15, novel=None, roots=None, **cfg):
    s = ft.settings({"episodes": episodes, "max_ways": max_ways, "max_support": max(150, max_ways), **cfg})
    base = np.arange(len(sizes)) if novel is None else np.setdiff1d(np.arange(len(sizes)), novel)
    novel = np.zeros(0, np.int64) if novel is None else np.asarray(novel)
    by_root = [novel] if roots else None
    graph = dag.build(PARENTS, WNIDS, base, novel, roots, by_root)
    return ft.sample_episodes(pools_of(list(sizes)), base, novel, s, seed, graph), s


def test_every_episode_takes_all_classes_of_one_node_uniformly():
    pairs, _ = dag_sample(episodes=2000)
    counts = Counter()
    for b, n in pairs:
        assert n is None and b.node in NODES
        assert tuple(b.classes.tolist()) == NODES[b.node]  # all of the node's classes, by wnid
        assert b.ways == len(NODES[b.node]) and min(b.shots) >= 1 and sum(b.shots) <= 150
        counts[b.node] += 1
    assert set(counts) == set(NODES) and all(abs(c / 2000 - 0.25) < 0.04 for c in counts.values())


def test_node_wider_than_max_ways_is_subsampled():
    pairs, _ = dag_sample(max_ways=3, max_shots=10, episodes=600)
    seen = Counter()
    for b, _ in pairs:
        full = NODES[b.node]
        assert b.ways == min(3, len(full)) and set(b.classes.tolist()) <= set(full)
        assert len(set(b.classes.tolist())) == b.ways
        if len(full) > 3:
            seen[tuple(sorted(b.classes.tolist()))] += 1
    assert len(seen) > 3  # different subsets of the wide nodes


def test_draw_order_matches_fewtrans():
    """Node index, subsample, query, support-set size, shots, images: one RandomState, FewTrans' order."""
    sizes = [12, 30, 8, 20, 6, 16]
    pairs, s = dag_sample(sizes, episodes=3, seed=5, max_ways=3)
    pools, nodes = pools_of(sizes), list(NODES.items())
    rng = np.random.RandomState(5)
    for b, _ in pairs:
        wnid, classes = nodes[rng.choice(list(range(len(nodes))))]
        classes = np.array(classes)
        if len(classes) > 3:
            classes = rng.choice(classes, size=[3], replace=False)
        n = np.array([sizes[c] for c in classes])
        q = ft.query_per_class(n, s["max_query"])
        shots = ft.shots_per_class(rng, n, n - q, ft.support_set_size(rng, n - q, s), s)
        images = [rng.choice(pools[c], k + q, replace=False) for c, k in zip(classes, shots)]
        assert b.node == wnid and b.classes.tolist() == classes.tolist() and b.shots == shots.tolist()
        assert all(np.array_equal(np.concatenate([x, y]), z) for x, y, z in zip(b.support, b.query, images))


def test_seeds_reproducible_and_differ():
    key = lambda pairs: [(b.node, b.classes.tolist(), [x.tolist() for x in b.support]) for b, _ in pairs]
    assert key(dag_sample(seed=3)[0]) == key(dag_sample(seed=3)[0])
    assert key(dag_sample(seed=3)[0]) != key(dag_sample(seed=4)[0])


def test_novel_episodes_from_the_novel_graph_under_the_root():
    pairs, _ = dag_sample(novel=[3, 4, 5], roots=["n00000003"])
    for b, n in pairs:
        assert b.node in {"n00000002", "n00000004"} and set(b.classes.tolist()) <= {0, 1, 2}  # R collapses into A
        assert n.node == "n00000003" and n.classes.tolist() == [3, 4, 5] and n.shots == [0, 0, 0]


def test_base_classes_below_min_examples_leave_their_nodes():
    pairs, _ = dag_sample(sizes=(12, 1, 8, 20, 6, 16))  # class 1 has one image: C spans one class, not eligible
    nodes = {b.node for b, _ in pairs}
    assert nodes == {"n00000001", "n00000002", "n00000003"}
    assert all(1 not in b.classes.tolist() for b, _ in pairs)


def test_root_split_and_its_errors():
    assert [r.tolist() for r in dag.root_split(PARENTS, WNIDS, ["n00000004", "n00000003"], "d")] == [[0, 1], [3, 4, 5]]
    with pytest.raises(AdaptError, match=r"'d'.*share classes \['n00000014'\]"):
        dag.root_split(PARENTS, WNIDS, ["n00000002", "n00000003"], "d")
    with pytest.raises(AdaptError, match=r"'d'.*novel_roots \['n00000006'\] are not internal nodes"):
        dag.root_split(PARENTS, WNIDS, ["n00000006"], "d")  # D collapsed away


def test_settings_refuse_bad_hierarchy_params():
    with pytest.raises(AdaptError, match=r"adapt.fewtrans.hierarchy .*'x': 'tree'"):
        ft.settings({"hierarchy": {"x": "tree"}})
    with pytest.raises(AdaptError, match=r"adapt.fewtrans.novel_roots \['x'\] needs adapt.fewtrans.hierarchy"):
        ft.settings({"novel_roots": {"x": ["n00000003"]}})
    with pytest.raises(AdaptError, match=r"novel_roots \['x'\] and novel_classes"):
        ft.settings({"hierarchy": {"x": "dag"}, "novel_roots": {"x": ["n1"]}, "novel_classes": {"x": 2}})
    with pytest.raises(AdaptError, match="max_spanning_leaves must be at least min_ways"):
        ft.settings({"max_spanning_leaves": 1})


def test_dataset_without_wnids_is_refused_naming_dataset_and_key():
    with pytest.raises(AdaptError, match=r"dataset 'fake': adapt.fewtrans.hierarchy needs WordNet classes"):
        ft.evaluate(FakeInputs(), {"episodes": 5, "hierarchy": {"fake": "dag"}, "novel_fraction": 0.2}, seed=0)


def wordnet_inputs(monkeypatch=None):
    inputs = FakeInputs(num_classes=6, per_class=12)
    inputs.meta.classes[:] = [ClassInfo(index=i, name=f"c{i}", wnid=w) for i, w in enumerate(WNIDS)]
    if monkeypatch is not None:
        monkeypatch.setattr(dag, "wordnet_parents", lambda wnids, name: PARENTS)
    return inputs


def test_evaluate_stores_the_node_and_the_non_hierarchical_path_stores_null(monkeypatch):
    cfg = {"episodes": 40, "methods": ["zeroshot", "prototype"], "hierarchy": {"fake": "dag"},
           "novel_roots": {"fake": ["n00000003"]}}
    res = ft.evaluate(wordnet_inputs(monkeypatch), cfg, seed=0)
    table = res.tables["episodes"]
    base = table.filter(pc.equal(table["split"], "base"))
    novel = table.filter(pc.equal(table["split"], "novel"))
    assert set(base["node"].to_pylist()) == {"n00000002", "n00000004"} and set(novel["node"].to_pylist()) == {"n00000003"}
    assert res.details["novel_classes"] == [3, 4, 5] and res.details["base_classes"] == [0, 1, 2]
    assert res.details["hierarchy"]["internal_nodes"] == {"base": 2, "novel": 1}
    plain = ft.evaluate(FakeInputs(), {"episodes": 5, "methods": ["prototype"], "novel_fraction": 0.2}, seed=0).tables["episodes"]
    assert plain["node"].null_count == plain.num_rows and "hierarchy" not in ft.evaluate(
        FakeInputs(), {"episodes": 5, "methods": ["prototype"], "novel_fraction": 0.2}, seed=0).details


# ------------------------------------------------------------------------------------------------ real WordNet

DEMO = {"circle": "n13873502", "ellipse": "n13878306", "square": "n13878634", "rectangle": "n13883346",
        "triangle": "n13879320", "rhombus": "n13882961", "trapezoid": "n13881512", "hexagon": "n13882276",
        "star": "n13881644", "crescent": "n13896217", "heart": "n13865904", "semicircle": "n13874251"}
POLYGON, SHAPE = "n13866144", "n00027807"


@pytest.fixture(scope="module")
def demo_parents(tmp_path_factory):
    from vlbench.wordnet import WordNetMissing, load_wordnet

    try:
        load_wordnet(download=False, cache_dir=tmp_path_factory.mktemp("wordnet"))
    except WordNetMissing as err:
        pytest.skip(f"no offline WordNet: {err}")
    return dag.wordnet_parents(list(DEMO.values()), "hierarchy")


def test_demo_hierarchy_wnids_give_wordnet_nodes(demo_parents):
    wnids, names = list(DEMO.values()), list(DEMO)
    nodes = {n.wnid: {names[c] for c in n.classes} for n in
             dag.internal_nodes(dag.sampling_graph(demo_parents, wnids, range(12)), wnids)}
    assert nodes[POLYGON] == {"square", "rectangle", "triangle", "rhombus", "trapezoid", "hexagon"}
    assert nodes["n13878306"] == {"ellipse", "circle"} and nodes["n13883346"] == {"rectangle", "square"}
    assert nodes[SHAPE] == set(names) and len(nodes) == 7
    assert "n00001740" not in nodes  # entity, abstraction, attribute: one child each, collapsed


def test_demo_wnids_end_to_end_with_polygon_as_novel_root(demo_parents, monkeypatch):
    inputs = FakeInputs(num_classes=12, per_class=10)
    inputs.meta.classes[:] = [ClassInfo(index=i, name=n, wnid=w) for i, (n, w) in enumerate(DEMO.items())]
    monkeypatch.setattr(dag, "wordnet_parents", lambda wnids, name: demo_parents)
    cfg = {"episodes": 60, "methods": ["zeroshot"], "hierarchy": {"fake": "dag"}, "novel_roots": {"fake": [POLYGON]}}
    res = ft.evaluate(inputs, cfg, seed=1)
    assert res.details["novel_classes"] == [2, 3, 4, 5, 6, 7]
    novel = res.tables["episodes"].filter(pc.equal(res.tables["episodes"]["split"], "novel"))
    assert POLYGON in novel["node"].to_pylist() and SHAPE not in novel["node"].to_pylist()  # rooted at polygon


def test_non_hierarchical_draws_unchanged():
    """The plain sampler's draws, hashed: the digest the sampler gave before the hierarchical path was added."""
    import hashlib

    sizes = [5, 8, 60, 12, 30, 3, 100, 40, 9, 20, 14, 25, 7, 50, 11, 16, 2, 33, 18, 22]
    h = hashlib.sha256()
    for novel in (0, 4):
        base, nov = ft.class_split(len(sizes), novel)
        for pair in ft.sample_episodes(pools_of(sizes), base, nov, ft.settings({"episodes": 300}), 3):
            for ep in (e for e in pair if e is not None):
                assert ep.node is None
                h.update(ep.split.encode())
                h.update(ep.classes.tobytes())
                for x in ep.support + ep.query:
                    h.update(np.asarray(x, np.int64).tobytes())
    assert h.hexdigest() == "db0ee6cd0a570e91da08bafe7a63d962e9743b827ff36ac8b870daad0a8e0bd7"


def test_no_eligible_node_is_an_error_naming_the_dataset(monkeypatch):
    cfg = {"episodes": 5, "methods": ["prototype"], "hierarchy": {"fake": "dag"}, "novel_fraction": 0,
           "max_spanning_leaves": 5, "min_ways": 5, "max_ways": 5}  # R spans 6, A 4, B 3, C 2
    with pytest.raises(AdaptError, match=r"dataset 'fake': no WordNet node spans 5..5"):
        ft.evaluate(wordnet_inputs(monkeypatch), cfg, seed=0)
