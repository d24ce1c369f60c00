"""REPE (retrieval-enhanced prompts): FAISS search against brute force, the caption filter, fallbacks, the lambda
mixing per template, and the repe stage in a temporary pipeline repository."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from vlbench.analyses.zeroshot_classifier import class_weights
from vlbench.features import StaleFeaturesError
from vlbench.knowledge import repe as rt
from vlbench.params import ParamsError

DVC = (sys.executable, "-m", "dvc")
ROOT = Path(__file__).resolve().parent.parent


def unit(rng, n, d=16):
    return rt.l2_normalize(rng.standard_normal((n, d)).astype(np.float32))


def clustered(rng, n, d=32, centers=50, noise=0.3):
    """Vectors around a few centres: structure an approximate index can exploit (like real embeddings)."""
    c = rng.standard_normal((centers, d)).astype(np.float32)
    return rt.l2_normalize(c[rng.integers(centers, size=n)] + noise * rng.standard_normal((n, d)).astype(np.float32))


# --------------------------------------------------------------------------------------------------------------
# Search


def test_exact_index_equals_numpy_brute_force():
    rng = np.random.default_rng(0)
    corpus, queries = unit(rng, 3000), unit(rng, 40)
    index, info = rt.build_index(corpus, rt.IndexConfig(), device="cpu")
    assert (info.kind, info.vectors, info.dim, info.exact) == ("flat", 3000, 16, True)
    scores, ids, _ = rt.search(index, queries, 25)
    full = queries @ corpus.T
    expect = np.argsort(-full, axis=1, kind="stable")[:, :25]
    np.testing.assert_array_equal(ids, expect)
    np.testing.assert_allclose(scores, np.take_along_axis(full, expect, 1), atol=1e-5)


def test_numpy_exact_search_streams_chunks_and_breaks_ties_by_lower_id():
    rng = np.random.default_rng(1)
    corpus, queries = unit(rng, 1000), unit(rng, 7)
    s, i = rt.exact_search(corpus, queries, 30, chunk=64)
    full = queries @ corpus.T
    np.testing.assert_array_equal(i, np.argsort(-full, axis=1, kind="stable")[:, :30])
    np.testing.assert_allclose(s, np.take_along_axis(full, i, 1), rtol=1e-6)
    tied = np.ones((5, 4), np.float32)
    assert rt.exact_search(tied, tied[:1], 3, chunk=2)[1].tolist() == [[0, 1, 2]]


def test_k_is_capped_by_the_corpus_size():
    rng = np.random.default_rng(2)
    index, _ = rt.build_index(unit(rng, 12), rt.IndexConfig(), device="cpu")
    _, ids, _ = rt.search(index, unit(rng, 3), 1000)
    assert ids.shape == (3, 12) and sorted(ids[0].tolist()) == list(range(12))


def test_the_index_is_chosen_by_size_with_thresholds_as_params():
    cfg = rt.IndexConfig(exact_max=100, hnsw_max=1000)
    assert [rt.choose_kind(n, cfg) for n in (100, 101, 1000, 1001)] == ["flat", "hnsw", "hnsw", "ivf"]
    assert rt.choose_kind(10, rt.IndexConfig(kind="ivf")) == "ivf"
    assert rt.ivf_nlist(1_000_000, rt.IndexConfig(train_size=200_000)) == 4000
    assert rt.ivf_nlist(1_000_000, rt.IndexConfig()) == 2564  # faiss wants 39 training vectors per cell
    assert rt.ivf_nlist(390, rt.IndexConfig(nlist=64)) == 10


@pytest.mark.parametrize("kind", ["ivf", "hnsw"])
def test_approximate_indexes_reach_high_recall_against_exact_search(kind):
    rng = np.random.default_rng(3)
    corpus, queries = clustered(rng, 6000), clustered(rng, 50)
    cfg = rt.IndexConfig(kind=kind, nlist=32, nprobe=8, train_size=3000)
    index, info = rt.build_index(corpus, cfg, device="cpu")
    assert info.kind == kind and not info.exact and info.build_seconds > 0
    _, ids, _ = rt.search(index, queries, 100)
    recall = rt.recall_at_k(ids, rt.exact_search(corpus, queries, 100)[1])
    assert 0.9 <= recall <= 1.0


def test_recall_counts_missing_hits_as_misses():
    exact = np.array([[1, 2, 3, 4]])
    assert rt.recall_at_k(np.array([[4, 3, -1, 9]]), exact) == 0.5


def test_cuda_is_refused_without_a_gpu_faiss():
    faiss = rt.faiss_module()
    if rt.gpu_available(faiss):
        pytest.skip("this machine has a FAISS GPU")
    with pytest.raises(rt.RepeError, match="faiss-gpu"):
        rt.build_index(unit(np.random.default_rng(0), 10), rt.IndexConfig(), device="cuda")


# --------------------------------------------------------------------------------------------------------------
# Filter


CAPTIONS = ["a gray circle", "a ray in the sea", "three rays", "an X-ray photo", "RAY!", "array of shapes", "a raygun"]


def test_word_filter_matches_words_and_plurals_not_substrings():
    assert rt.caption_passes("ray", CAPTIONS, "word").tolist() == [False, True, True, True, True, False, False]
    assert rt.caption_passes("ray", CAPTIONS, "exact_word").tolist() == [False, True, False, True, True, False, False]


def test_substring_filter_is_the_authors_rule_ray_matches_gray():
    assert rt.caption_passes("ray", CAPTIONS, "substring").tolist() == [True] * 7


def test_any_word_of_the_class_name_passes_split_at_spaces_and_underscores():
    caps = ["a goldfish in a tank", "a FISH bowl", "an aquarium", "a fishing rod"]
    assert rt.class_words("aquarium_fish") == ["aquarium", "fish"]
    assert rt.caption_passes("aquarium_fish", caps, "word").tolist() == [False, True, True, False]
    assert rt.caption_passes("aquarium_fish", caps, "substring").tolist() == [True, True, True, True]
    assert rt.caption_passes("box", ["two boxes", "a boxer"], "word").tolist() == [True, False]


def test_pieces_without_letters_are_no_words_but_substrings_keep_them():
    caps = ["see http://x.org/a", "a handrail"]
    assert rt.class_words("baluster / handrail") == ["baluster", "/", "handrail"]
    assert rt.caption_passes("baluster / handrail", caps, "word").tolist() == [False, True]
    assert rt.caption_passes("baluster / handrail", caps, "substring").tolist() == [True, True]
    assert rt.caption_passes("/", caps, "word").tolist() == [False, False]


# --------------------------------------------------------------------------------------------------------------
# Mixing


def test_lambda_mixing_math_for_one_template():
    p, m = np.array([[3.0, 4.0, 0.0]]), np.array([[0.0, 0.0, 0.5]])
    w = rt.repe_class_weights(p, np.array([0]), m, 0.25)
    expect = 0.75 * np.array([0.6, 0.8, 0.0]) + 0.25 * np.array([0.0, 0.0, 0.5])
    np.testing.assert_allclose(w[0], expect / np.linalg.norm(expect), rtol=1e-6)
    np.testing.assert_allclose(rt.repe_class_weights(p, np.array([0]), m, 1.0)[0], [0, 0, 1], atol=1e-7)
    np.testing.assert_allclose(rt.repe_class_weights(p, np.array([0]), m, 0.0)[0], [0.6, 0.8, 0], atol=1e-7)


def test_lambda_is_applied_per_template_then_averaged():
    rng = np.random.default_rng(4)
    prompts = rng.standard_normal((6, 8)).astype(np.float32)  # 2 classes x 3 templates, unnormalised
    cls = np.array([0, 0, 0, 1, 1, 1])
    means = rng.standard_normal((2, 8)).astype(np.float32) * 0.3
    w = rt.repe_class_weights(prompts, cls, means, 0.25)
    for c in range(2):
        per_template = [0.75 * p / np.linalg.norm(p) + 0.25 * means[c] for p in prompts[cls == c]]
        avg = np.mean([t / np.linalg.norm(t) for t in per_template], axis=0)
        np.testing.assert_allclose(w[c], avg / np.linalg.norm(avg), rtol=1e-5)
    once = rt.mix(class_weights(prompts, cls, 2), means, 0.25)  # mixing the ensemble once is not the same
    assert not np.allclose(w, once, atol=1e-4)
    np.testing.assert_allclose(rt.ensemble_weights(prompts, cls, 2), class_weights(prompts, cls, 2), rtol=1e-6)


def test_first_keep_passing_captions_are_averaged_normalised_not_renormalised():
    emb = np.array([[2, 0, 0], [0, 3, 0], [0, 0, 1], [0, 5, 5]], np.float32)
    corpus = rt.Corpus("c", np.array(["a", "b", "c", "d"]), ["x circle", "y square", "two circles", "circle z"], emb)
    cfg = rt.RepeConfig(modality="text", keep=2)
    hits = (np.ones((1, 4), np.float32), np.array([[1, 0, 2, 3]]))
    found = rt.retrieve_classes(corpus, ["circle"], hits, cfg)
    assert found[0].passed.tolist() == [False, True, True, True]
    assert found[0].kept.tolist() == [False, True, True, False]
    means = rt.caption_means(found, emb, np.zeros((1, 3), np.float32))
    np.testing.assert_allclose(means[0], [0.5, 0, 0.5])  # norm 0.707: the authors' mean, not renormalised


def test_a_class_with_no_passing_caption_falls_back_to_its_query():
    emb = np.eye(3, dtype=np.float32)
    corpus = rt.Corpus("c", np.array(["a", "b", "c"]), ["a square", "a star", "a square"], emb)
    hits = (np.ones((2, 3), np.float32), np.array([[0, 1, 2], [2, 1, 0]]))
    found = rt.retrieve_classes(corpus, ["circle", "star"], hits, rt.RepeConfig(modality="text"))
    assert [f.fallback for f in found] == [True, False]
    query = np.array([[0, 3, 4], [1, 0, 0]], np.float32)
    means = rt.caption_means(found, emb, query)
    np.testing.assert_allclose(means, [[0, 0.6, 0.8], [0, 1, 0]])
    w = rt.repe_class_weights(np.array([[1, 0, 0], [0, 0, 1]], np.float32), np.array([0, 1]), means, 0.25)
    expect = 0.75 * np.array([1, 0, 0]) + 0.25 * np.array([0, 0.6, 0.8])
    np.testing.assert_allclose(w[0], expect / np.linalg.norm(expect), rtol=1e-6)


def test_image_hits_expand_to_all_captions_of_each_image_in_rank_order():
    image_ids = np.array(["i0", "i1", "i2"])
    caption_ids = np.array(["i2", "i0", "i2", "zz", "i1"])
    cmap = rt.caption_map(image_ids, caption_ids)
    assert cmap.unmatched == 1 and cmap.count.tolist() == [1, 1, 2]
    rows, ranks, sims = rt.rank_captions(np.array([2, 0, -1]), np.array([0.9, 0.5, 0.0]), "image", cmap)
    assert rows.tolist() == [0, 2, 1] and ranks.tolist() == [0, 0, 1] and sims.tolist() == [0.9, 0.9, 0.5]


# --------------------------------------------------------------------------------------------------------------
# Queries and params


def prompt_table(rows):
    return pa.table({"class_index": pa.array([r[0] for r in rows], pa.int64()), "text": [r[1] for r in rows]})


def test_query_is_the_embedded_text_or_the_prompt_ensemble():
    emb = np.array([[0, 2, 0], [1, 0, 0]], np.float32)
    table = prompt_table([(0, "a photo of a circle."), (1, "a star.")])
    ensemble = np.array([[1, 0, 0], [0, 0, 1]], np.float32)
    cfg = rt.RepeConfig()
    q, sources = rt.query_embeddings(["circle", "star"], [(table, emb)], cfg, ensemble)
    assert sources == ["text", "ensemble"]
    np.testing.assert_allclose(q, [[0, 1, 0], [0, 0, 1]])
    with pytest.raises(rt.RepeError, match=r"'a photo of a star\.'.*query_missing"):
        rt.query_embeddings(["circle", "star"], [(table, emb)], rt.RepeConfig(query_missing="error"), ensemble)


def test_run_retrieval_end_to_end_on_arrays():
    rng = np.random.default_rng(5)
    names = ["circle", "square"]
    caps = [f"a {'circle' if i % 2 else 'square'} {i}" for i in range(40)]
    cap_emb = unit(rng, 40, 8)
    corpus = rt.Corpus("c", np.array([f"s{i}" for i in range(40)]), caps, cap_emb,
                       image_ids=np.array([f"s{i}" for i in range(40)]), image_emb=unit(rng, 40, 8))
    prompts, cls = unit(rng, 4, 8), np.array([0, 0, 1, 1])
    cfg = rt.RepeConfig(top_k=10, keep=3)
    run = rt.run_retrieval(corpus, names, prompts, cls, [], cfg, device="cpu")
    assert run.k == 10 and run.recall == 1.0 and run.query_sources == ["ensemble", "ensemble"]
    for c, f in enumerate(run.found):
        assert len(f.caption_rows) == 10 and f.kept.sum() == min(3, f.passed.sum())
        assert all(names[c] in caps[r] for r in f.caption_rows[f.passed])
    means = rt.caption_means(run.found, cap_emb, rt.ensemble_weights(prompts, cls, 2))
    np.testing.assert_allclose(run.weights, rt.repe_class_weights(prompts, cls, means, 0.25), rtol=1e-6)


def test_params_errors_name_the_key():
    with pytest.raises(ParamsError, match=r"repe\.filter 'fuzzy'"):
        rt.parse_config({"filter": "fuzzy"})
    with pytest.raises(ParamsError, match=r"repe\.shift_lambda"):
        rt.parse_config({"shift_lambda": 1.5})
    with pytest.raises(ParamsError, match=r"repe\.index\.nprobe"):
        rt.parse_config({"index": {"nprobe": 0}})
    with pytest.raises(ParamsError, match=r"unknown key\(s\) repe\.\['topk'\]"):
        rt.parse_config({"topk": 5})
    with pytest.raises(ParamsError, match=r"repe\.query must"):
        rt.parse_config({"query": "a photo"})
    with pytest.raises(ParamsError, match=r"repe\.prompts must name a text set"):
        rt.parse_config({"prompts": "prompts ensemble"})
    config = yaml.safe_load((ROOT / "conf/config.yaml").read_text())
    assert rt.parse_config(config["repe"]) == rt.RepeConfig()  # the defaults are the documented ones
    assert rt.RepeConfig().prompts == "prompts"


def test_a_missing_prompt_set_names_the_dataset_the_set_and_the_param():
    assert rt.check_prompt_set("cifar10", "prompts_ensemble", ["prompts", "prompts_ensemble"]) == "prompts_ensemble"
    with pytest.raises(rt.RepeError) as err:
        rt.check_prompt_set("coop-x", "prompts_ensemble", ["prompts_single", "prompts"])
    assert str(err.value) == (
        "dataset 'coop-x' has no class text set 'prompts_ensemble' (repe.prompts; its class text sets: "
        "['prompts', 'prompts_single']): add `prompt_sets: {ensemble: [...]}` under `texts` in its entry "
        "(conf/dataset/coop-x.yaml) or set repe.prompts to one of them")
    with pytest.raises(rt.RepeError, match=r"no class text set 'captions' \(repe\.prompts.*\): set repe"):
        rt.check_prompt_set("coco", "captions", ["prompts"])


def test_template_prompts_are_the_template_rows_and_every_class_needs_one():
    from vlbench.features import Features

    table = pa.table({"class_index": pa.array([0, 0, 1, 1], pa.int64()),
                      "source": ["template", "other", "template", "template"], "text": list("abcd")})
    feats = Features(table, np.eye(4, dtype=np.float32), {}, [])
    emb, cls = rt.template_prompts(feats, "d", "prompts_ensemble", 2)
    assert cls.tolist() == [0, 1, 1] and emb.tolist() == np.eye(4)[[0, 2, 3]].tolist()
    with pytest.raises(rt.RepeError, match=r"dataset 'd', text set 'prompts_ensemble' \(repe\.prompts\): no "
                                                r"template prompt for 1 of 3 classes \(class indices \[2\]\)"):
        rt.template_prompts(feats, "d", "prompts_ensemble", 3)


def made_from_hash(fp: dict, keys) -> str:
    import hashlib

    return hashlib.sha256(json.dumps({k: fp[k] for k in keys}, sort_keys=True, default=str).encode()).hexdigest()[:16]


def test_the_default_prompt_set_leaves_the_fingerprint_as_it_was_before_the_param():
    corpus = rt.Corpus("c", np.array(["s"]), ["x"], np.ones((1, 2), np.float32), fingerprint={"corpus": "c"})
    base = {"model": "m", "dataset": "d", "text_set": "prompts", "text_version": "v1"}
    fp = rt.weights_fingerprint(base, corpus, rt.RepeConfig(), ["ensemble"])
    old_settings = {k: v for k, v in rt.RepeConfig().as_dict().items() if k != "prompts"}
    assert "prompts_set" not in fp and fp["retrieval"] == old_settings  # the settings as they were, no new key
    assert fp["text_version"] == made_from_hash(fp, ["prompts_version", "corpus", "retrieval", "query_sources"])
    other = rt.weights_fingerprint({**base, "text_set": "prompts_ensemble"}, corpus,
                                   rt.RepeConfig(prompts="prompts_ensemble"), ["ensemble"])
    assert other["prompts_set"] == "prompts_ensemble" and other["text_set"] == "repe"
    assert other["retrieval"] == old_settings and other["text_version"] != fp["text_version"]


def test_the_openness_suite_runs_repe_on_the_single_prompt_over_coco_captions():
    """The paper's REPE mixes into the single prompt (its Table 9 against Table 1's CLIP rows); the corpus is COCO's
    captions, not the paper's CC12M (the results say so in details.repe); the code's ensemble is an override."""
    from vlbench.compose import compose
    from vlbench.dataset_entries import dataset_entry
    from vlbench.params import effective

    params = effective(compose(["suite=openness"]))  # the settings the stages read
    suite, cfg = params["suite"], rt.parse_config(params["repe"])
    assert (cfg.corpus, cfg.split, cfg.captions, cfg.prompts) == ("coco-2017-val", "val", "captions", "prompts_single")
    code = rt.parse_config(compose(["suite=openness", "repe.prompts=prompts_ensemble"])["repe"])
    assert code.prompts == "prompts_ensemble"
    assert cfg.corpus in suite["embed"] and cfg.corpus not in suite["zeroshot"] and cfg.corpus in suite["datasets"]
    entries = {name: dataset_entry(params, name) for name in suite["datasets"]}
    assert cfg.split in entries[cfg.corpus]["prepare"]["splits"]
    assert entries[cfg.corpus]["texts"]["specificity"] is None  # the suite's override: no altered captions to embed
    members = {d for ds in suite["extensibility_sets"].values() for d in ds}
    assert set(suite["repe"]) == set(suite["extensibility"]) | members and len(suite["repe"]) == 10
    for name in suite["repe"]:
        assert entries[name]["texts"]["prompt_sets"]["single"], name  # the set prompts_single exists
        assert entries[name]["texts"]["prompt_sets"]["ensemble"], name  # and prompts_ensemble
        assert name in suite["embed"]
    assert params["repe"]["shift_lambda"] == 0.25 and params["repe"]["keep"] == 100  # the authors' 0.25, 100


# --------------------------------------------------------------------------------------------------------------
# The stage in a pipeline


ENSEMBLE = ["a {c}.", "a picture of a {c}.", "a {c} shape."]  # no "a photo of a {c}.": queries stay ensemble weights


@pytest.fixture(scope="module")
def retrieved(smoke_run, tmp_path_factory):
    """A copy of the session's smoke run (tests/conftest.py) with a caption corpus added: repe@shapes."""
    from tests.pipeline_repo import read_suite, run, synthetic_entry, write_suite

    repo = smoke_run(tmp_path_factory.mktemp("repe") / "repo")
    suite = read_suite(repo, "smoke")
    suite["datasets"]["corpus"] = synthetic_entry("corpus", {"train": 200}, ["a {c}."])
    suite["datasets"]["shapes"]["texts"]["prompt_sets"] = {"ensemble": ENSEMBLE}  # for repe.prompts
    suite.update(embed=suite["embed"] + ["corpus"], repe=["shapes"])
    write_suite(repo, suite)
    run(repo, sys.executable, "-m", "vlbench.cli", "compose")
    run(repo, *DVC, "repro", "repe@shapes")
    return repo


def test_the_stage_writes_weights_captions_index_info_and_a_report(retrieved):
    out = retrieved / "features/toy-smoke/shapes/retrieval"
    assert sorted(p.name for p in out.iterdir()) == ["class_weights.parquet", "index.json", "retrieved.parquet"]
    weights = pq.read_table(out / "class_weights.parquet")
    assert weights.num_rows == 12 and weights.column("query_source").to_pylist() == ["ensemble"] * 12
    emb = np.stack(weights.column("embedding").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    found = {k: np.array(v) for k, v in pq.read_table(out / "retrieved.parquet").to_pydict().items()}
    assert len(found["class_index"]) == 12 * 200  # top_k 1000 capped by the 200 corpus images, one caption each
    names = weights.column("name").to_pylist()
    for c in range(12):
        mine = found["class_index"] == c
        passed, kept = found["passed"][mine], found["kept"][mine]
        assert found["hit_rank"][mine].tolist() == list(range(200))
        assert kept.sum() == min(100, passed.sum()) and not (kept & ~passed).any()
        words = rt.class_words(names[c])
        assert all(any(w in cap.lower() for w in words) for cap in found["caption"][mine][passed])
    assert json.loads((out / "index.json").read_text())["kind"] == "flat"
    report = json.loads((retrieved / "reports/repe/shapes.json").read_text())
    assert report["metrics"]["recall_at_200"] == 1.0 and report["counts"]["classes"] == 12
    timings = json.loads((retrieved / "runs/repe/shapes.json").read_text())  # run facts, not in the report
    assert timings["index_build_seconds"] >= 0 and timings["query_seconds"] >= 0 and "timings" not in report["params"]
    assert report["counts"]["kept"] == int(weights.column("kept").to_numpy().sum())


def test_the_weights_are_fingerprinted_for_the_model_and_prompts_version(retrieved, monkeypatch):
    from vlbench.models.identity import model_identity
    from vlbench.texts import read_text_set

    monkeypatch.chdir(retrieved)
    params = yaml.safe_load((retrieved / "params.yaml").read_text())
    identity = model_identity(params["model"])
    version = read_text_set(retrieved / "data/texts/shapes/prompts.parquet")[1]["text_version"]
    features = retrieved / "features/toy-smoke/shapes"
    got = rt.read_repe_class_weights(features, identity, "shapes", version)
    assert got.embeddings.shape[0] == 12 and got.fingerprint["text_set"] == "repe"
    assert got.fingerprint["corpus"] == "corpus" and got.fingerprint["retrieval"]["shift_lambda"] == 0.25
    with pytest.raises(StaleFeaturesError, match="prompts_version"):
        rt.read_repe_class_weights(features, identity, "shapes", "0000")
    with pytest.raises(StaleFeaturesError, match="weights_sha256"):
        rt.read_repe_class_weights(features, {**identity, "weights_sha256": "x"}, "shapes", version)


def test_nothing_is_stale_after_a_run_and_a_lambda_change_reruns_retrieve_only(retrieved):
    from tests.pipeline_repo import run

    assert json.loads(run(retrieved, *DVC, "status", "--json", "repe@shapes").stdout) == {}
    config = retrieved / "conf/settings/repe.yaml"  # the section's defaults: a file dependency of repe@
    text = config.read_text()
    assert text.count("shift_lambda: 0.25") == 1
    config.write_text(text.replace("shift_lambda: 0.25", "shift_lambda: 0.5"))
    try:
        run(retrieved, sys.executable, "-m", "vlbench.cli", "compose")
        status = json.loads(run(retrieved, *DVC, "status", "--json", "repe@shapes").stdout)
        assert list(status) == ["repe@shapes"]
    finally:
        config.write_text(text)
        run(retrieved, sys.executable, "-m", "vlbench.cli", "compose")


def test_a_corpus_without_captions_is_one_clear_line(retrieved, tmp_path):
    from tests.pipeline_repo import run

    params = yaml.safe_load((retrieved / "params.yaml").read_text())
    params["repe"]["captions"] = "prompts"
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(params))
    proc = run(retrieved, sys.executable, "-m", "stages.repe", "--dataset", "shapes", "--params",
               str(tmp_path / "p.yaml"), check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: corpus 'corpus': text set 'prompts' is not owned by sample_id (columns "
                                   "['class_index', 'source', 'text']); repe.captions must name its captions")


def run_stage_with(repo: Path, dest: Path, **repe) -> tuple[Path, object]:
    """A copy of the pipeline repository at `dest` (no .dvc, no git), repe@shapes run there with `repe`
    params changed: (the copy, the finished process)."""
    import shutil

    from tests.pipeline_repo import run

    shutil.copytree(repo, dest, ignore=shutil.ignore_patterns(".git", ".dvc"))
    params = yaml.safe_load((dest / "params.yaml").read_text())
    params["repe"].update(repe)
    (dest / "p.yaml").write_text(yaml.safe_dump(params))
    return dest, run(dest, sys.executable, "-m", "stages.repe", "--dataset", "shapes", "--params",
                     str(dest / "p.yaml"), check=False)


def features_of(path: Path) -> np.ndarray:
    return np.stack(pq.read_table(path).column("embedding").to_numpy(zero_copy_only=False)).astype(np.float64)


def test_repe_on_the_prompt_ensemble_mixes_the_captions_into_every_template(retrieved, tmp_path):
    from vlbench.models.identity import model_identity
    from vlbench.texts import read_text_set

    repo, proc = run_stage_with(retrieved, tmp_path / "repo", prompts="prompts_ensemble")
    assert proc.returncode == 0, proc.stderr
    out, text = repo / "features/toy-smoke/shapes/retrieval", repo / "features/toy-smoke/shapes/text"
    weights = pq.read_table(out / "class_weights.parquet")
    got = features_of(out / "class_weights.parquet")
    # by hand: per class the mean of its kept captions' normalised embeddings (or, for a class without one, its
    # query: the normalised mean of its ensemble prompts), mixed into each of its 3 templates, then averaged
    prompts = pq.read_table(text / "prompts_ensemble.parquet")
    p = features_of(text / "prompts_ensemble.parquet")
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    cls = np.array(prompts.column("class_index").to_pylist())
    assert np.bincount(cls).tolist() == [len(ENSEMBLE)] * 12
    caps = features_of(repo / "features/toy-smoke/corpus/text/captions.parquet")
    caps /= np.linalg.norm(caps, axis=1, keepdims=True)
    found = pq.read_table(out / "retrieved.parquet").to_pydict()
    kept_rows = np.array(found["caption_row"])[np.array(found["kept"])]
    kept_cls = np.array(found["class_index"])[np.array(found["kept"])]
    assert len(kept_rows) > 0
    for c in range(12):
        query = p[cls == c].mean(0)
        mean = caps[kept_rows[kept_cls == c]].mean(0) if (kept_cls == c).any() else query / np.linalg.norm(query)
        mixed = 0.75 * p[cls == c] + 0.25 * mean
        mixed /= np.linalg.norm(mixed, axis=1, keepdims=True)
        expect = mixed.mean(0) / np.linalg.norm(mixed.mean(0))
        np.testing.assert_allclose(got[c], expect, atol=2e-6)
    assert weights.column("fallback").to_pylist() == [not (kept_cls == c).any() for c in range(12)]
    default = features_of(retrieved / "features/toy-smoke/shapes/retrieval/class_weights.parquet")
    assert np.abs(got - default).max() > 0.01  # not the weights of the `prompts` set
    # the fingerprint names the set and its version; a reader asking for another set refuses the weights
    params = yaml.safe_load((repo / "params.yaml").read_text())
    identity, version = model_identity(params["model"]), read_text_set(repo / "data/texts/shapes/prompts_ensemble.parquet")[1]["text_version"]
    read = rt.read_repe_class_weights(out.parent, identity, "shapes", version, "prompts_ensemble")
    assert read.fingerprint["prompts_set"] == "prompts_ensemble" and read.fingerprint["prompts_version"] == version
    with pytest.raises(StaleFeaturesError, match=r"made from text set 'prompts_ensemble', expected 'prompts'"):
        rt.read_repe_class_weights(out.parent, identity, "shapes", None, "prompts")
    old = rt.read_repe_class_weights(retrieved / "features/toy-smoke/shapes", identity, "shapes", None, "prompts")
    assert "prompts_set" not in old.fingerprint and "prompts" not in old.fingerprint["retrieval"]


def test_naming_the_default_set_explicitly_gives_byte_identical_weights(retrieved, tmp_path):
    repo, proc = run_stage_with(retrieved, tmp_path / "repo", prompts="prompts")
    assert proc.returncode == 0, proc.stderr
    for name in ("class_weights.parquet", "retrieved.parquet", "index.json"):
        mine = (repo / "features/toy-smoke/shapes/retrieval" / name).read_bytes()
        assert mine == (retrieved / "features/toy-smoke/shapes/retrieval" / name).read_bytes(), name


def test_a_missing_prompt_set_stops_the_stage_with_one_line(retrieved, tmp_path):
    _, proc = run_stage_with(retrieved, tmp_path / "repo", prompts="prompts_single")
    assert proc.returncode == 2
    # checked when the stage loads its params (vlbench.analyses.text_sets.check_text_sets), before anything is read
    assert proc.stderr.strip() == (
        "error: suite 'smoke': repe on dataset 'shapes' needs text set 'prompts_single', which "
        "conf/dataset/shapes.yaml does not make: add `prompt_sets: {single: [...]}` under its `texts` (or the suite's "
        "`entries: {shapes: {texts: ...}}`), or change the repe params that ask for it")
