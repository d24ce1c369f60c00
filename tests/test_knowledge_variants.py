"""Knowledge variants: the demo world's knowledge files, the variants the knowledge stage builds (with their coverage
and fallback counts), and how the zero-shot analysis scores each variant (no model, no DVC)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.test_knowledge_sources import (
    REFERENCE,
    local_file,
    needs_reference,
    write_json,
)
from vlbench.analyses import zeroshot, zeroshot_classifier
from vlbench.analyses.base import Inputs
from vlbench.datasets import synthetic
from vlbench.datasets.canonical import ClassInfo, DatasetMeta
from vlbench.params import ParamsError
from vlbench.features import (
    StaleFeaturesError,
    embedding_array,
    features_schema,
    write_table,
)
from vlbench.knowledge import demo, sources
from vlbench.knowledge.sources import KnowledgeError
from vlbench.knowledge.variants import (
    DEFAULT_VARIANTS,
    VARIANTS,
    build_knowledge,
    knowledge_options,
    wordnet_records,
)
from vlbench.wordnet import load_wordnet
from vlbench.texts import write_text_sets

SHAPES_TEMPLATES = ["a {c}.", "a drawing of a {c}."]


@pytest.fixture(scope="module")
def wn():
    return load_wordnet()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "cache"))
    monkeypatch.delenv("VLBENCH_MIRROR", raising=False)
    return tmp_path / "cache"


def shapes_meta() -> DatasetMeta:
    return DatasetMeta("shapes", "single-label", "accuracy",
                       [ClassInfo(i, s.name, wnid=s.wnid) for i, s in enumerate(synthetic.SHAPES)])


# ---------------------------------------------------------------------------------------------------- demo files


def test_the_demo_files_are_what_the_generator_writes_and_resources_json_pins_them(wn):
    rendered = demo.render(wn)
    assert len(rendered) == 8
    pinned = {name: f.resource.sha256 for name, f in sources.knowledge_files().items() if f.local is not None}
    assert sorted(pinned) == sorted(rendered)
    for name, data in rendered.items():
        assert (demo.DEMO_DIR / name).read_bytes() == data, f"{name}: run python -m vlbench.knowledge.demo"
        assert hashlib.sha256(data).hexdigest() == pinned[name], name
    assert demo.main(["--check"]) == 0


def test_demo_files_parse_in_the_upstream_formats_with_elevaters_wordnet_rule(cache):
    files = {f.name: f for f in sources.vocabulary_files("demo-shapes")}
    external = files["demo-shapes_knowledge.tsv"]
    tables = external.parse(external.fetch("shapes", progress=False))  # the download layer, from its file:// URL
    assert (cache / "demo-shapes_knowledge.tsv").is_file()
    assert tables["wordnet_definition"].entries["diamond"].startswith("a transparent piece of diamond")  # the gem
    assert tables["wordnet_path"].entries["star"][:2] == ["star", "celestial_body"]
    assert tables["wordnet_definition"].entries["conic section"] == "" == tables["wordnet_path"].entries["conic section"]
    gpt3 = files["GPT3_demo-shapes.tsv"].parse(files["GPT3_demo-shapes.tsv"].fetch("shapes", progress=False))["gpt3"]
    assert gpt3.entries["hexagon"][0] == " A six-sided polygon with six straight sides."
    assert all(len(v) == 5 for v in gpt3.entries.values()) and len(gpt3) == 22
    colors = {f.name: f for f in sources.vocabulary_files("demo-colors")}
    menon = colors["descriptors_demo-colors.json"]
    assert menon.parse(menon.fetch("colors", progress=False))["menon"].entries["red"][0] == "the hue of ripe tomatoes"


@needs_reference
def test_the_elevater_wordnet_rule_reproduces_every_real_definition(wn):
    """The demo files' def_wn / path_wn rule, checked on ELEVATER's 21 real external files: every definition (2,151,
    1,157 of them empty) and 2,093 of the 2,151 paths (ELEVATER's path generator is not released)."""
    total = definitions = paths = 0
    for path in sorted((REFERENCE / "elevater" / "knowledge" / "external").glob("*_knowledge.tsv")):
        for record in json.loads(path.read_text()):
            def_wn, path_wn = demo.elevater_wordnet(wn, record["classname"])
            total += 1
            definitions += def_wn == record["def_wn"]
            paths += path_wn == record["path_wn"]
    assert (total, definitions, paths) == (2151, 2151, 2093)


# ---------------------------------------------------------------------------------------------------- variants


def test_every_variant_of_the_demo_shapes_with_coverage_and_wordnet_records(cache, wn):
    built = build_knowledge("shapes", {"texts": {"knowledge": "demo-shapes"}}, shapes_meta(), SHAPES_TEMPLATES,
                            knowledge_options({}), wn)
    assert list(built.sets) == list(DEFAULT_VARIANTS) and built.skipped == {}
    rows = {v: built.sets[v].to_pylist() for v in built.sets}
    assert {v: len(r) for v, r in rows.items()} == {
        "wordnet_path": 24, "wordnet_definition": 24, "wiktionary": 24, "gpt3": 24, "wiktionary_gpt3": 48,
        "cupl": 36, "menon": 36, "wn30_path": 24, "wn30_definition": 24}
    diamond = 5
    assert [r["text"] for r in rows["wiktionary"] if r["class_index"] == diamond] == [
        f"{t.replace('{c}', 'diamond')} ; diamond , A rhombus , especially one standing on a corner . The shape of the "
        f"suit of playing cards of that name ." for t in SHAPES_TEMPLATES]
    assert rows["wordnet_path"][2 * diamond]["text"] == "a diamond. ; diamond , diamond jewel jewelry"  # by name
    assert rows["wn30_path"][2 * diamond]["text"] == "a diamond. ; diamond , rhombus parallelogram quadrilateral"
    assert rows["menon"][3 * diamond]["text"] == "diamond, which has four equal straight sides"
    stamp = built.stamps["wiktionary_gpt3"]["knowledge"]
    assert stamp["coverage"] == {s: {"classes": 12, "covered": 12, "empty": 0, "null": 0, "missing": 0}
                                 for s in ("wiktionary", "gpt3")}
    assert stamp["template_only"] == 0 and stamp["options"] == {"style": "elevater", "tokenizer": "punkt-untrained",
                                                                 "gpt3_items": 1, "aggregation": "and"}
    assert [f["file"] for f in stamp["files"]] == ["demo-shapes_knowledge.tsv", "GPT3_demo-shapes.tsv"]
    assert built.stamps["menon"]["knowledge"]["weights"] == "mean_similarity"
    record = built.wordnet[diamond]
    assert (record["chosen_by"], record["synset"], record["lemmas"]) == ("wnid", "rhombus.n.01",
                                                                        ["rhombus", "rhomb", "diamond"])
    assert record["path"][-1] == "entity" and record["path_wnids"][0] == "n13882961"
    assert built.summary()["vocabulary"] == "demo-shapes"


def test_a_class_without_wnid_is_looked_up_by_name_and_the_choice_recorded(wn):
    classes = [ClassInfo(0, "orange"), ClassInfo(1, "no such thing", aliases=["hexagon"]), ClassInfo(2, "zzqx")]
    records = wordnet_records(classes, wn)
    assert (records[0]["chosen_by"], records[0]["synset"]) == ("name", "orange.n.01")
    assert records[0]["candidates"][:3] == ["orange.n.01", "orange.n.02", "orange.n.03"]
    assert (records[1]["chosen_by"], records[1]["synset"]) == ("alias 'hexagon'", "hexagon.n.01")
    assert records[2]["chosen_by"] == "none" and "synset" not in records[2]


def test_two_classes_with_one_name_get_their_own_synsets(wn):
    meta = DatasetMeta("cranes", "single-label", "accuracy",
                       [ClassInfo(0, "crane", wnid="n02012849"), ClassInfo(1, "crane", wnid="n03126707")])
    built = build_knowledge("cranes", {}, meta, ["a {c}."], knowledge_options({"variants": ["wn30_definition"]}), wn)
    texts = [r["text"] for r in built.sets["wn30_definition"].to_pylist()]
    assert "wading bird" in texts[0] and "lifts and moves heavy objects" in texts[1]


def test_fallbacks_are_counted_per_source(tmp_path, cache, monkeypatch):
    """ELEVATER's rules on a vocabulary with every case: empty appends " ; c ,", null and missing keep the templates."""
    names = ["cat", "dog", "bird", "eel"]
    external = write_json(tmp_path / "up" / "toy_knowledge.tsv", [
        {"classname": "cat", "def_wiki": "A pet.", "path_wn": ["cat", "feline"], "def_wn": "a feline"},
        {"classname": "dog", "def_wiki": "", "path_wn": "", "def_wn": ""},
        {"classname": "bird", "def_wiki": None, "path_wn": "", "def_wn": ""}])  # eel: missing
    gpt3 = write_json(tmp_path / "up" / "GPT3_toy.tsv", [{"classname": "cat", "gpt3": [" Purrs.", " Naps."]},
                                                          {"classname": "eel", "gpt3": [" Slippery."]}])
    files = {p.name: local_file(p, fam, urls=[p.as_uri()]) for p, fam in
             ((external, "elevater_external"), (gpt3, "elevater_gpt3"))}
    monkeypatch.setattr(sources, "knowledge_files", lambda: files)
    monkeypatch.setattr(sources, "vocabularies", lambda: {"toy": list(files)})
    meta = DatasetMeta("toy", "single-label", "accuracy", [ClassInfo(i, n) for i, n in enumerate(names)])
    options = knowledge_options({"variants": ["wiktionary", "gpt3", "wiktionary_gpt3", "cupl"], "gpt3_items": 2})
    built = build_knowledge("toy", {"texts": {"knowledge": "toy"}}, meta, ["a {c}."], options)
    assert built.skipped == {"cupl": "no cupl file for vocabulary 'toy'"}
    wiki = built.stamps["wiktionary"]["knowledge"]
    assert wiki["coverage"] == {"wiktionary": {"classes": 4, "covered": 1, "empty": 1, "null": 1, "missing": 1}}
    assert wiki["template_only"] == 2  # bird (null) and eel (missing)
    assert [r["text"] for r in built.sets["wiktionary"].to_pylist()] == [
        "a cat. ; cat , A pet .", "a dog. ; dog ,", "a bird.", "a eel."]
    assert built.stamps["gpt3"]["knowledge"]["coverage"]["gpt3"] == {"classes": 4, "covered": 2, "empty": 0, "null": 0,
                                                                     "missing": 2}
    both = built.sets["wiktionary_gpt3"].to_pylist()
    assert [r["text"] for r in both if r["class_index"] == 0] == [
        "a cat. ; cat , A pet .", "a cat. ; cat , Purrs .", "a cat. ; cat , Naps ."]
    assert [(r["source"], r["text"]) for r in both if r["class_index"] == 3] == [("gpt3", "a eel. ; eel , Slippery .")]
    assert built.stamps["wiktionary_gpt3"]["knowledge"]["template_only"] == 1  # bird: null wiki, no GPT-3


def test_knowledge_options_name_the_key():
    assert knowledge_options(None).variants == DEFAULT_VARIANTS == tuple(v for v in VARIANTS if not v.startswith("llm_"))
    with pytest.raises(ParamsError, match=r"knowledge.variants .* unknown or repeated names \['wiki'\]"):
        knowledge_options({"variants": ["wiki"]})
    with pytest.raises(ParamsError, match=r"knowledge.gpt3_items must be an integer >= 1, got 0"):
        knowledge_options({"gpt3_items": 0})
    with pytest.raises(ParamsError, match=r"knowledge.style 'fancy' is not one of \['elevater', 'plain'\]"):
        knowledge_options({"style": "fancy"})
    with pytest.raises(ParamsError, match=r"unknown key\(s\) \['items'\] under 'knowledge'"):
        knowledge_options({"items": 2})


def test_a_wrong_wnid_is_one_clear_error(wn):
    with pytest.raises(KnowledgeError, match=r"class 0 \('x'\): malformed WordNet id 'n123'"):
        wordnet_records([ClassInfo(0, "x", wnid="n123")], wn)


# ---------------------------------------------------------------------------------------------------- zeroshot


IDENTITY = {"model": "m", "arch": "a", "pretrained": "p", "weights_sha256": "w"}
META = DatasetMeta("toy", "single-label", "accuracy", [ClassInfo(0, "a"), ClassInfo(1, "b")], version="v1")
# Three images on a plane (at -20, 52 and 90 degrees); class a's texts at 0 and 90 degrees, class b's at 60: the
# renormalised mean points a at 45 degrees and wins the image at 52, a's unnormalised mean (|mean| = 0.707) loses it.
IMAGES = np.array([[np.cos(a), np.sin(a)] for a in (-0.35, 0.9, np.pi / 2)], np.float32)
LABELS = [0, 1, 1]
KNOWLEDGE_EMB = np.array([[1, 0], [0, 1], [np.cos(np.pi / 3), np.sin(np.pi / 3)]], np.float32) * 3


def _write_features(path: Path, rows: pa.Table, emb: np.ndarray, fingerprint: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_table(path, [rows.append_column("embedding", embedding_array(emb))],
                features_schema(rows.schema, emb.shape[1], fingerprint))


def toy_inputs(tmp_path: Path, weights: str = "normalized_mean") -> Inputs:
    """Features on disk as the embed stages write them: images, the prompts set, one knowledge set (whose source set
    is in data/knowledge), in a layout `Inputs` reads."""
    texts_dir, knowledge_dir, features = tmp_path / "texts", tmp_path / "knowledge", tmp_path / "features"
    prompts = pa.table({"class_index": [0, 1], "source": ["template"] * 2, "text": ["a", "b"]})
    write_text_sets(texts_dir, "toy", {"prompts": prompts})
    _write_features(features / "text" / "prompts.parquet", prompts, np.array([[1, 0.2], [0.2, 1]], np.float32),
                    {**IDENTITY, **json.loads(pq.read_schema(texts_dir / "prompts.parquet").metadata[b"vlbench.text_set"])})
    rows = pa.table({"class_index": [0, 0, 1], "source": ["wiktionary"] * 3, "text": ["a1", "a2", "b1"]})
    stamp = {"knowledge": {"variant": "wiki", "order": 0, "weights": weights, "template_only": 0,
                           "coverage": {"wiktionary": {"classes": 2, "covered": 2, "empty": 0, "null": 0, "missing": 0}}}}
    write_text_sets(knowledge_dir, "toy", {"wiki": rows}, {"wiki": stamp})
    set_stamp = json.loads(pq.read_schema(knowledge_dir / "wiki.parquet").metadata[b"vlbench.text_set"])
    _write_features(features / "knowledge" / "wiki.parquet", rows, KNOWLEDGE_EMB, {**IDENTITY, **set_stamp})
    images = pa.table({"sample_id": list("pqr"), "label": LABELS})
    _write_features(features / "images" / "test.parquet", images, IMAGES,
                    {**IDENTITY, "dataset": "toy", "dataset_version": "v1"})
    return Inputs(META, IDENTITY, features, texts_dir, knowledge_dir)


def brute_force_accuracy(class_vectors: np.ndarray) -> float:
    unit = IMAGES / np.linalg.norm(IMAGES, axis=1, keepdims=True)
    return float(np.mean((unit @ class_vectors.T).argmax(1) == np.array(LABELS)))


@pytest.mark.parametrize("weights", ["normalized_mean", "mean_similarity"])
def test_each_variant_is_scored_with_its_own_weighting(tmp_path, weights):
    result = zeroshot.run(toy_inputs(tmp_path, weights), {"split": "test"}, seed=0)
    unit = KNOWLEDGE_EMB / np.linalg.norm(KNOWLEDGE_EMB, axis=1, keepdims=True)
    means = np.stack([unit[:2].mean(0), unit[2]])
    if weights == "normalized_mean":
        means /= np.linalg.norm(means, axis=1, keepdims=True)
    expected = brute_force_accuracy(means)
    assert expected == (2 / 3 if weights == "normalized_mean" else 1.0)  # the weightings disagree on the 2nd image
    variants = result.details["variants"]
    assert list(variants) == ["templates", "wiki"]
    assert variants["wiki"]["metrics"] == {"accuracy": expected} and variants["wiki"]["weights"] == weights
    assert variants["wiki"]["coverage"]["wiktionary"]["covered"] == 2 and variants["wiki"]["texts"] == 3
    prompts = np.array([[1, 0.2], [0.2, 1]]) / np.linalg.norm([1, 0.2])
    assert result.metrics == {"accuracy": brute_force_accuracy(prompts), "knowledge_best_accuracy": expected,
                              "knowledge_best_variant": "wiki"}
    assert variants["templates"]["metrics"] == {"accuracy": result.metrics["accuracy"]}


def test_precomputed_class_weights_are_a_variant(tmp_path):
    inputs = toy_inputs(tmp_path)
    path = inputs.features_dir / zeroshot.PRECOMPUTED_WEIGHTS["repe"]
    rows = pa.table({"class_index": [1, 0], "fallback": [True, False]})
    _write_features(path, rows, np.array([[0, 1], [1, 0]], np.float32), {**IDENTITY, "dataset": "toy", "text_version": "x"})
    result = zeroshot.run(inputs, {"split": "test"}, seed=0)
    repe = result.details["variants"]["repe"]
    assert repe["metrics"] == {"accuracy": brute_force_accuracy(np.eye(2))} and repe["fallback"] == 1
    assert list(result.details["variants"]) == ["templates", "wiki", "repe"]
    _write_features(path, rows.slice(0, 1), np.array([[0, 1]], np.float32), {**IDENTITY, "dataset": "toy"})
    with pytest.raises(zeroshot_classifier.VariantError, match=r"retrieval/class_weights.parquet: class weights must "
                                                               r"have one row per class 0..1, got 1 rows"):
        zeroshot.run(inputs, {"split": "test"}, seed=0)
    _write_features(path, rows, np.eye(2, dtype=np.float32), {**IDENTITY, "weights_sha256": "other", "dataset": "toy"})
    with pytest.raises(StaleFeaturesError, match=r"weights_sha256"):
        zeroshot.run(inputs, {"split": "test"}, seed=0)


def test_knowledge_features_of_an_older_text_set_are_refused(tmp_path):
    inputs = toy_inputs(tmp_path)
    rows = pa.table({"class_index": [0, 1], "source": ["wiktionary"] * 2, "text": ["new a", "new b"]})
    write_text_sets(inputs.knowledge_dir, "toy", {"wiki": rows})  # the set changed, its features did not
    with pytest.raises(StaleFeaturesError, match=r"knowledge/wiki.parquet: features do not match .*text_version"):
        zeroshot.run(inputs, {"split": "test"}, seed=0)


def test_without_knowledge_the_result_is_unchanged(tmp_path):
    inputs = toy_inputs(tmp_path)
    for path in (inputs.features_dir / "knowledge").glob("*.parquet"):
        path.unlink()
    result = zeroshot.run(inputs, {"split": "test"}, seed=0)
    assert set(result.metrics) == {"accuracy"} and result.details == {}


def test_a_string_metric_reaches_the_result_file(tmp_path, monkeypatch):
    from vlbench.results import read_result, write_result

    monkeypatch.chdir(tmp_path)
    result = zeroshot.run(toy_inputs(tmp_path), {"split": "test"}, seed=0)
    write_result("zeroshot", "toy", result, IDENTITY)
    written = read_result("zeroshot", "toy")
    assert written["metrics"]["knowledge_best_variant"] == "wiki"
    assert written["details"]["variants"]["wiki"]["metrics"]["accuracy"] == result.metrics["knowledge_best_accuracy"]


def test_the_variant_plot_lists_every_variant(tmp_path):
    from vlbench.report.plots import variant_rows, write_knowledge_variants

    results = {"toy": {"metrics": {"accuracy": 0.5, "knowledge_best_accuracy": 0.75, "knowledge_best_variant": "wiki"},
                       "details": {"variants": {"templates": {"metrics": {"accuracy": 0.5}},
                                                "wiki": {"metrics": {"accuracy": 0.75}}}}},
               "plain": {"metrics": {"accuracy": 0.4}}}
    assert variant_rows(results) == [("toy", "templates", 0.5), ("toy", "wiki", 0.75)]
    path = write_knowledge_variants(results, tmp_path)
    assert path == tmp_path / "zeroshot_knowledge.svg" and "wiki 0.750" in path.read_text()
    assert write_knowledge_variants({"plain": results["plain"]}, tmp_path / "none") is None
