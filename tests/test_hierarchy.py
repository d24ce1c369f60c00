"""The WordNet hierarchy builder (issue 13): the tie rule and levels on a hand-built graph, the demo's shapes on
real WordNet, ImageNet-1k's 820 coarse classes (with the BREEDS class list when it is on this machine), the
ImageNet class list through the download layer, and the `vlbench hierarchy` command."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.http_server import serve
from vlbench.cli import main
from vlbench.datasets import synthetic
from vlbench.datasets.leaves import dataset_leaves
from vlbench.datasets.imagenet import imagenet_wnids
from vlbench.datasets.wnids import HierarchyError, leaf_wnids, parse_class_info
from vlbench.knowledge.hierarchy import Graph, build_from_graph, build_hierarchy, longest_paths, unique_names
from vlbench.wordnet import (
    WordNetMissing,
    load_wordnet,
    synset_from_wnid,
    wnid_of,
)

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO.parent / "shared" / "reference" / "breeds" / "modified" / "dataset_class_info.json"

# A miniature hierarchy. x has two longest paths of length 4: r-b-p1-x and r-a-p2-x. Its parent of smaller
# offset is p1 (50 < 60), but read from the root the offsets of r-a-p2-x (1, 10, 60) are smaller than those
# of r-b-p1-x (1, 20, 50): the rule picks r-a-p2-x. y has a short path r-q-y and a longer one r-b-p1-y.
R, Q, A, B, P1, P2, X, Y = ("n00000001", "n00000005", "n00000010", "n00000020", "n00000050", "n00000060",
                            "n00000100", "n00000200")
MINI = Graph(
    parents={R: (), Q: (R,), A: (R,), B: (R,), P1: (B,), P2: (A,), X: (P1, P2), Y: (Q, P1)},
    lemmas={R: ("entity",), Q: ("small",), A: ("animal", "beast"), B: ("thing",), P1: ("thing", "object"),
            P2: ("dog",), X: ("dog",), Y: ("cat",)},
)


# ---------------------------------------------------------------------------------------------------------
# Hand-built graph


def test_tie_rule_takes_smallest_offsets_from_the_root():
    tree = build_from_graph([X, Y], MINI)
    assert tree.ancestors(X) == [R, A, P2]  # not via p1, the parent with the smaller offset
    assert tree.ancestors(Y) == [R, B, P1]  # the longest path, not the one through q (offset 5)
    assert tree.tied == (X,)
    assert tree.nodes[X].parents == (P2,) and tree.nodes[P1].parents == (B,) and tree.nodes[R].parents == ()


def test_tree_levels_counts_and_leaves():
    tree = build_from_graph([X, Y], MINI)
    assert {w: n.level for w, n in tree.nodes.items()} == {R: 0, A: 1, B: 1, P1: 2, P2: 2, X: 3, Y: 3}
    assert [n.wnid for n in tree.coarse_classes] == [R, A, B, P1, P2]  # by level, then offset; q is off every path
    assert tree.depth == 3
    assert tree.per_level() == {0: 1, 1: 2, 2: 2, 3: 0}
    assert tree.per_level(leaves=True) == {0: 0, 1: 0, 2: 0, 3: 2}
    assert tree.nodes[R].leaves == (X, Y) and tree.nodes[B].leaves == (Y,) and tree.nodes[P2].leaves == (X,)
    assert tree.children(R) == [A, B] and tree.children(P1) == [Y]


def test_dag_keeps_every_path_and_longest_path_levels():
    dag = build_from_graph([X, Y], MINI, mode="dag")
    assert [n.wnid for n in dag.coarse_classes] == [R, Q, A, B, P1, P2]
    assert dag.nodes[Q].level == 1 and dag.nodes[Y].level == 3  # level = longest path, also in a DAG
    assert dag.nodes[X].parents == (P1, P2) and dag.nodes[Y].parents == (Q, P1)
    assert dag.nodes[P1].leaves == (X, Y) and dag.nodes[B].leaves == (X, Y) and dag.nodes[Q].leaves == (Y,)
    assert dag.ancestors(X) == [R, A, B, P1, P2]
    assert dag.per_level() == {0: 1, 1: 3, 2: 2, 3: 0}


def test_names_made_unique():
    tree = build_from_graph([X, Y], MINI)
    names = {w: n.name for w, n in tree.nodes.items()}
    # b and p1 share "thing": b has no other lemma, so its tree parent qualifies it; p1 takes "object".
    # p2 shares "dog" with the leaf x: the leaf keeps it, p2 is qualified by its parent.
    assert names == {R: "entity", A: "animal", B: "thing (entity)", P1: "object", P2: "dog (animal)", X: "dog", Y: "cat"}


def test_names_last_resort_is_the_wnid():
    lemmas = {"n00000001": ("root",), "n00000002": ("table",), "n00000003": ("table",), "n00000004": ("table_lamp",)}
    parents = {"n00000002": "n00000001", "n00000003": "n00000001", "n00000001": None, "n00000004": None}
    names = unique_names(list(lemmas), {"n00000004"}, lemmas, parents)
    assert names == {"n00000001": "root", "n00000002": "table (root)", "n00000003": "table (n00000003)",
                     "n00000004": "table lamp"}


def _all_paths(node, parents):
    if not parents[node]:
        return [(node,)]
    return [path + (node,) for p in parents[node] for path in _all_paths(p, parents)]


def test_longest_paths_match_brute_force_on_random_dags():
    rng = random.Random(0)
    for _ in range(30):
        ids = sorted(rng.sample(range(1, 10**6), 14))  # offsets in random relation to the topological order
        rng.shuffle(ids)
        wnids = [f"n{i:08d}" for i in ids]
        parents = {w: tuple(rng.sample(wnids[:k], min(k, rng.randint(1, 3)))) if k else ()
                   for k, w in enumerate(wnids)}
        best = longest_paths(parents, wnids[::-1])  # deepest first: the search recurses through parents
        for w in wnids:
            paths = _all_paths(w, parents)
            longest = max(map(len, paths))
            candidates = [p for p in paths if len(p) == longest]
            assert best[w].path == min(candidates, key=lambda p: [int(x[1:]) for x in p])
            assert best[w].count == len(candidates)


def test_graph_errors():
    with pytest.raises(HierarchyError, match="cycle"):
        longest_paths({"n00000001": ("n00000002",), "n00000002": ("n00000001",)}, ["n00000001"])
    with pytest.raises(HierarchyError, match="'n00000009' is not in the hypernym graph"):
        build_from_graph(["n00000009"], MINI)
    with pytest.raises(HierarchyError, match="repeated: n00000100"):
        build_from_graph([X, X], MINI)
    with pytest.raises(HierarchyError, match="leaf 1: 'dog' is not a WordNet id"):
        build_from_graph([X, "dog"], MINI)
    with pytest.raises(HierarchyError, match="mode 'forest'"):
        build_from_graph([X], MINI, mode="forest")
    with pytest.raises(HierarchyError, match="not a node of this hierarchy"):
        build_from_graph([X], MINI).ancestors(Y)


# ---------------------------------------------------------------------------------------------------------
# Real WordNet


@pytest.fixture(scope="module")
def wn(tmp_path_factory):
    try:
        return load_wordnet(download=False, cache_dir=tmp_path_factory.mktemp("wordnet"))
    except WordNetMissing as err:
        pytest.skip(f"no WordNet on this machine: {err}")


SHAPE_WNIDS = [s.wnid for s in synthetic.SHAPES]


def test_demo_shapes_on_wordnet(wn):
    tree = build_hierarchy(SHAPE_WNIDS, wn)
    assert tree.wordnet == "3.0" and tree.tied == ()
    coarse = {n.synset: n.level for n in tree.coarse_classes}
    assert coarse == {"entity.n.01": 0, "abstraction.n.06": 1, "attribute.n.02": 2, "shape.n.02": 3,
                      "figure.n.06": 4, "line.n.04": 4, "plane_figure.n.01": 5, "curve.n.01": 5,
                      "conic_section.n.01": 6, "polygon.n.01": 6, "quadrilateral.n.01": 7, "parallelogram.n.01": 8}
    assert tree.depth == 10 and tree.nodes["n13878634"].level == 10  # square, below rectangle
    square, rectangle = "n13878634", "n13883346"
    assert tree.nodes[square].parents == (rectangle,)  # the longer of its two paths (not via regular polygon)
    assert tree.nodes[rectangle].is_leaf and tree.nodes[rectangle].leaves == (square, rectangle)  # leaf order
    assert len(tree.nodes["n00001740"].leaves) == 12
    assert [n.name for n in tree.coarse_classes][:4] == ["entity", "abstraction", "attribute", "shape"]


def test_demo_dag_matches_the_generator_tables(wn):
    """Below shape.n.02 the DAG's coarse classes are exactly the hypernyms synthetic.py hard-codes."""
    dag = build_hierarchy(SHAPE_WNIDS, wn, mode="dag")
    shape_level = dag.nodes[wnid_of(wn.synset(synthetic.HIERARCHY_ROOT))].level
    below = {n.wnid for n in dag.coarse_classes if n.level > shape_level}
    tables = {wnid for synset, (_, wnid, _) in synthetic.CONCEPTS.items() if wnid not in SHAPE_WNIDS}
    assert below == tables and len(below) == 10
    for synset, (_, wnid, parents) in synthetic.CONCEPTS.items():
        expected = {synthetic.CONCEPTS[p][1] for p in parents} or {wnid_of(wn.synset(synthetic.HIERARCHY_ROOT))}
        assert set(dag.nodes[wnid].parents) == expected, synset


def test_demo_hierarchy_dataset_leaves_are_the_shapes():
    leaves = dataset_leaves("hierarchy", {"prepare": {"source": "synthetic", "task": "hierarchy", "splits": {"t": 1}}},
                            prepared=Path("/nonexistent"))
    assert list(leaves.wnids) == SHAPE_WNIDS  # the classes marked group: hypernym are coarse concepts
    assert leaf_wnids([{"wnid": "n1", "group": "hypernym"}, {"wnid": "n2"}, {"name": "x"}]) == ["n2"]


@pytest.fixture(scope="module")
def imagenet_wnid_list(tmp_path_factory):
    """The real ImageNet-1k list, through the download layer (the shared copy placed in a local mirror)."""
    if not REFERENCE.is_file():
        pytest.skip(f"no reference copy of BREEDS' dataset_class_info.json at {REFERENCE}")
    from vlbench.datasets.breeds import HIERARCHY_FILES

    mirror = tmp_path_factory.mktemp("mirror")
    shutil.copyfile(REFERENCE, mirror / HIERARCHY_FILES["class_info"]["file"])
    leaves = dataset_leaves("imagenet", {"prepare": {"source": "imagenet"}}, prepared=mirror / "not-prepared",
                            cache=tmp_path_factory.mktemp("cache"), mirror=mirror)
    assert leaves.origin.startswith("ImageNet-1k")
    return list(leaves.wnids)


def test_imagenet_820_coarse_classes(wn, imagenet_wnid_list):
    tree = build_hierarchy(imagenet_wnid_list, wn)
    assert len(tree.leaves) == 1000 and imagenet_wnid_list[0] == "n01440764"
    assert len(tree.coarse_classes) == 820  # the paper's count
    assert len(tree.tied) == 25  # the count of leaves with tied longest paths
    assert tree.depth == 18 and sum(tree.per_level().values()) == 820 and tree.per_level()[0] == 1
    assert all(len(n.parents) == 1 for n in tree.nodes.values() if n.level > 0)  # a tree
    names = [n.name for n in tree.coarse_classes]
    assert len(set(names)) == 820
    assert tree.nodes["n04388743"].name == "storage tank"  # tank.n.02; "tank" is the leaf n04389033
    assert build_hierarchy(imagenet_wnid_list, wn, mode="dag").coarse_classes.__len__() == 860


def test_imagenet_tied_paths_follow_the_rule_against_nltk(wn, imagenet_wnid_list):
    tree = build_hierarchy(imagenet_wnid_list, wn)
    for leaf in tree.tied:
        paths = synset_from_wnid(wn, leaf).hypernym_paths()
        longest = max(map(len, paths))
        tied = [p for p in paths if len(p) == longest]
        assert len(tied) > 1
        chosen = min(tied, key=lambda p: [s.offset() for s in p])
        assert tree.ancestors(leaf) == [wnid_of(s) for s in chosen[:-1]]


# ---------------------------------------------------------------------------------------------------------
# ImageNet's class list through the download layer


def _class_info(path: Path, wnids) -> dict:
    path.write_text(json.dumps([[i, w, "lemma"] for i, w in enumerate(wnids)]))
    return {"file": path.name, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def test_imagenet_list_downloaded_from_a_local_server(tmp_path, monkeypatch):
    www = tmp_path / "www"
    www.mkdir()
    spec = _class_info(www / "class_info.json", ["n01440764", "n01443537"])
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "cache"))
    monkeypatch.delenv("VLBENCH_MIRROR", raising=False)
    with serve(www) as base_url:
        wnids = imagenet_wnids(resource={**spec, "url": f"{base_url}/class_info.json"}, expected=2)
        assert base_url.requests["/class_info.json"] == 1
    assert wnids == ["n01440764", "n01443537"]
    assert (tmp_path / "cache" / "class_info.json").is_file()


def test_imagenet_list_offline_is_a_clear_error(tmp_path, monkeypatch):
    from vlbench.datasets.download import DownloadError

    monkeypatch.setenv("VLBENCH_DOWNLOAD_ATTEMPTS", "1")

    spec = {"file": "missing.json", "url": "http://127.0.0.1:9/missing.json", "sha256": "0" * 64}
    with pytest.raises(DownloadError, match="missing.json"):
        imagenet_wnids("imagenet", resource=spec, cache=tmp_path, mirror=None)


@pytest.mark.parametrize("content, problem", [
    ("not json", "not a readable JSON class list"),
    ('{"a": 1}', "expected a JSON list"),
    ('[[0, "n01440764", "tench"], [2, "n01443537", "goldfish"]]', "entry 1 is"),
    ('[[0, "tench", "tench"]]', "entry 0 is"),
    ('[[0, "n01440764", "a"], [1, "n01440764", "b"]]', "repeated: n01440764"),
    ('[[0, "n01440764", "a"]]', "1 classes, expected 1000"),
])
def test_class_info_errors_name_the_file(tmp_path, content, problem):
    path = tmp_path / "dataset_class_info.json"
    path.write_text(content)
    with pytest.raises(HierarchyError, match=problem) as err:
        parse_class_info(path, expected=1000)
    assert str(path) in str(err.value)


# ---------------------------------------------------------------------------------------------------------
# vlbench hierarchy


JSON_KEYS = {"dataset", "origin", "mode", "wordnet", "leaves", "coarse_classes", "depth", "per_level",
             "leaves_per_level", "tied_leaves", "classes", "leaf_classes"}


def _run(*args, conf=REPO / "conf"):
    result = CliRunner().invoke(main, ["--conf", str(conf), "hierarchy", *args])
    return result


def test_cli_json_shape(tmp_path, monkeypatch, wn):
    monkeypatch.chdir(tmp_path)  # no prepared copy here: the demo's class list is used
    result = _run("shapes", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert set(doc) == JSON_KEYS
    assert (doc["dataset"], doc["mode"], doc["wordnet"], doc["leaves"]) == ("shapes", "tree", "3.0", 12)
    assert doc["coarse_classes"] == len(doc["classes"]) == 12 and doc["depth"] == 10
    assert doc["per_level"] == {str(k): v for k, v in enumerate([1, 1, 1, 1, 2, 2, 2, 1, 1, 0, 0])}
    assert sum(doc["leaves_per_level"].values()) == 12 and doc["tied_leaves"] == []
    for row in doc["classes"]:
        assert set(row) == {"wnid", "synset", "name", "level", "parents", "leaves"}
        assert all(leaf in SHAPE_WNIDS for leaf in row["leaves"])
    root = doc["classes"][0]
    assert (root["wnid"], root["name"], root["level"], root["parents"]) == ("n00001740", "entity", 0, [])
    assert root["leaves"] == SHAPE_WNIDS
    assert [r["wnid"] for r in doc["leaf_classes"]] == SHAPE_WNIDS
    assert set(doc["leaf_classes"][0]) == {"wnid", "synset", "name", "level", "parents"}

    dag = json.loads(_run("shapes", "--json", "--dag").output)
    assert dag["mode"] == "dag" and dag["coarse_classes"] == 14


def test_cli_text_summary(tmp_path, monkeypatch, wn):
    monkeypatch.chdir(tmp_path)
    result = _run("hierarchy")
    assert result.exit_code == 0, result.output
    assert "leaves 12  coarse classes 12  depth 10" in result.output
    assert result.output.splitlines()[-1].split() == ["10", "0", "1"]  # level 10: no coarse class, the square


def _tiny_conf(root: Path) -> Path:
    conf = root / "conf"
    (conf / "dataset").mkdir(parents=True)
    (conf / "config.yaml").write_text("defaults: []\n")
    (conf / "dataset" / "mine.yaml").write_text(
        "prepare: {source: manifest, path: data/mine.csv}\ninput: data\ntexts: {templates: ['a {c}.']}\n")
    return conf


def test_cli_reads_a_prepared_class_list(tmp_path, monkeypatch, wn):
    monkeypatch.chdir(tmp_path)
    conf = _tiny_conf(tmp_path)
    result = _run("mine", conf=conf)
    assert result.exit_code != 0 and "run `dvc repro prepare@mine` first" in result.output

    classes = [{"index": 0, "name": "circle", "wnid": "n13873502"}, {"index": 1, "name": "star", "wnid": "n13881644"},
               {"index": 2, "name": "blob"}]
    prepared = tmp_path / "data" / "prepared" / "mine"
    prepared.mkdir(parents=True)
    (prepared / "classes.json").write_text(json.dumps({"name": "mine", "classes": classes}))
    doc = json.loads(_run("mine", "--json", conf=conf).output)
    assert doc["leaves"] == 2 and doc["origin"].endswith("classes.json")
    assert {r["synset"] for r in doc["classes"]} >= {"plane_figure.n.01", "shape.n.02"}


def test_cli_errors(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = _run("no-such-dataset")
    assert result.exit_code != 0 and "unknown dataset 'no-such-dataset'" in result.output
    result = _run("colors")
    assert result.exit_code != 0 and "no class has a WordNet id" in result.output



def test_leaf_classes_come_from_the_source_through_the_registry(tmp_path):
    """The source module says how to list its leaves (`leaf_classes`); a source that cannot before prepare is an
    error naming the dataset and the stage to run."""
    from vlbench.datasets.registry import leaf_classes

    spec = {"source": "synthetic", "task": "hierarchy", "splits": {"t": 1}}
    wnids, origin = leaf_classes("hierarchy", spec)
    assert wnids == SHAPE_WNIDS and origin == "the demo world's class list"
    assert leaf_classes("mine", {"source": "manifest", "path": "x.csv"}) is None
    with pytest.raises(HierarchyError, match=r"dataset 'mine' \(source 'manifest'\).*dvc repro prepare@mine"):
        dataset_leaves("mine", {"prepare": {"source": "manifest", "path": "x.csv"}}, prepared=tmp_path)
