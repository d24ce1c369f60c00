"""Reruns (DESIGN.md "Reruns"): committed result files hold only what the inputs determine, so the same inputs rerun on
the same machine type write them byte-identical; timings and other run facts go to runs/<stage>/<key>.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from vlbench.analyses import adapt
from vlbench.knowledge import repe as rt
from vlbench.results import Result, result_path, run_fact_keys, run_facts_path, write_result


def test_a_result_writer_keeps_run_facts_out_of_the_result(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    written = []
    for seconds in (1.25, 7.5):
        result = Result({"accuracy": 0.5}, {"samples": 4}, {"split": "test"}, details={"per_level": [{"level": 1}]},
                        run={"seconds": seconds})
        path = write_result("zeroshot", "d", result, {"model": "m"})
        written.append(path.read_bytes())
        facts = json.loads(run_facts_path("zeroshot", "d").read_text())
        assert facts["seconds"] == seconds and facts["stage"] == "zeroshot" and facts["key"] == "d"
        assert {"host", "finished_utc", "cpu_count"} <= set(facts)
    assert written[0] == written[1]  # two runs, different timings: the same bytes
    doc = json.loads(written[0])
    assert run_fact_keys(doc) == [] and "seconds" not in json.dumps(doc) and "host" not in doc
    assert run_facts_path("zeroshot", "d") == tmp_path.joinpath("runs/zeroshot/d.json").relative_to(tmp_path)


def test_a_timing_inside_a_result_is_refused_and_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = Result({"accuracy": 0.5}, {}, {}, details={"runs": [{"seed": 0, "search_seconds": 0.3}]})
    with pytest.raises(ValueError, match=r"details\.runs\.0\.search_seconds.*Result\.run.*runs/zeroshot/d\.json"):
        write_result("zeroshot", "d", result, {})
    assert not result_path("zeroshot", "d").exists()


@pytest.mark.parametrize("key, is_fact", [("seconds", True), ("search_seconds", True), ("index_build_seconds", True),
                                          ("queries_per_second", True), ("images_per_s", True), ("elapsed", True),
                                          ("per_seed", False), ("seed", False), ("second_best", False),
                                          ("durations_note", False)])
def test_run_fact_keys_are_timings_not_lookalikes(key, is_fact):
    assert bool(run_fact_keys({"details": {key: 1}})) == is_fact


def test_the_elevater_protocol_puts_its_timings_in_run_facts_only():
    from tests.test_adapt_elevater import FAST, FakeInputs, blobs

    result = adapt.run(FakeInputs(*blobs(seed=3)), {"protocols": ["elevater"], "elevater": {**FAST, "shots": [5],
                                                                                          "seeds": [0, 1]}}, seed=0)
    assert run_fact_keys(result.details) == []
    assert [r["seed"] for r in result.details["elevater"]["runs"]] == [0, 1]
    facts = result.run["elevater"]
    assert facts["seconds"] > 0 and [(r["shots"], r["seed"]) for r in facts["runs"]] == [(5, 0), (5, 1)]
    assert all(r["search_seconds"] > 0 for r in facts["runs"])


def test_retrieval_summary_returns_timings_apart_from_the_report():
    rng = np.random.default_rng(5)
    unit = lambda n: (lambda x: x / np.linalg.norm(x, axis=1, keepdims=True))(rng.normal(size=(n, 8)).astype(np.float32))
    caps = [f"a {'circle' if i % 2 else 'square'} {i}" for i in range(40)]
    ids = np.array([f"s{i}" for i in range(40)])
    corpus = rt.Corpus("c", ids, caps, unit(40), image_ids=ids, image_emb=unit(40))
    cfg = rt.RepeConfig(top_k=10, keep=3)
    run = rt.run_retrieval(corpus, ["circle", "square"], unit(4), np.array([0, 0, 1, 1]), [], cfg, device="cpu")
    metrics, counts, params, timings = rt.summary(run, cfg, corpus)
    assert run_fact_keys({"metrics": metrics, "counts": counts, "params": params}) == []
    assert set(timings) == {"index_build_seconds", "query_seconds", "queries_per_second"}
    assert params["index_built"]["kind"] == "flat"


# Scores that do not depend on the BLAS thread count (the drift of issue 25: OpenBLAS's sgemm rounds differently with
# one and two threads, and the hierarchy mAP of a knowledge variant moved at the fifth decimal between two runs)


def demo_sized(seed: int = 0):
    """Embeddings shaped like the demo's hierarchy test split (1000 images, toy width 128, 39 text rows)."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(1000, 128)).astype(np.float32), rng.normal(size=(39, 128)).astype(np.float32)


def under_blas_threads(n: int, fn, *args):
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=n, user_api="blas"):
        return fn(*args)


def test_zeroshot_scores_and_metrics_are_the_same_bytes_with_one_or_two_blas_threads():
    from vlbench.analyses import zeroshot, zeroshot_classifier
    from vlbench.datasets.canonical import ClassInfo, DatasetMeta

    images, texts = demo_sized()
    weights = zeroshot_classifier.class_weights(texts, np.arange(39) % 13, 13)
    targets = (np.random.default_rng(1).random((1000, 13)) < 0.3).astype(np.int64)
    meta = DatasetMeta("h", "multi-label", "map_11point", [ClassInfo(i, f"c{i}") for i in range(13)], splits={})
    one, two = (under_blas_threads(n, zeroshot.weights_metrics, images, weights, targets, meta) for n in (1, 2))
    assert one[1].tobytes() == two[1].tobytes() and one[0] == two[0]


def test_granularity_cosines_are_the_same_bytes_with_one_or_two_blas_threads():
    from vlbench.analyses import granularity

    images, texts = demo_sized(2)
    weights = texts / np.linalg.norm(texts, axis=1, keepdims=True)
    one, two = (under_blas_threads(n, granularity.cosine, images, weights) for n in (1, 2))
    assert one.dtype == np.float32 and one.tobytes() == two.tobytes()
    np.testing.assert_allclose(one, granularity.l2_normalize(images) @ weights.T, rtol=1e-5, atol=1e-6)


# A rerun from a fresh clone: committed files stay byte-identical (git status clean)

DVC = (sys.executable, "-m", "dvc")
# adapt@shapes is in the suite because its report held timings (ELEVATER's search seconds) before issue 25
ADAPT = ["adapt.protocols=[elevater]", "+adapt.elevater.shots=[2]", "+adapt.elevater.seeds=[0]",
         "+adapt.elevater.heads=[random_2p,language_2p]", "+adapt.elevater.search_epochs=1", "+adapt.elevater.final_epochs=1"]


@pytest.fixture(scope="module")
def rerun(tmp_path_factory):
    """The smoke pipeline (shapes: zeroshot, adapt) reproduced and committed, then a fresh `git clone` of it (no DVC
    cache, so every stage runs again) reproduced on the same machine."""
    from tests.pipeline_repo import make_repo, run

    base = tmp_path_factory.mktemp("rerun")
    first = make_repo(base / "first")
    suite = yaml.safe_load((first / "conf/suite/smoke.yaml").read_text())
    suite.update(datasets={"shapes": suite["datasets"]["shapes"]}, embed=["shapes"], zeroshot=["shapes"],
                 linear_probe=[], adapt=["shapes"])
    (first / "conf/suite/smoke.yaml").write_text(yaml.safe_dump(suite))
    run(first, sys.executable, "-m", "vlbench.cli", "compose", *ADAPT)
    run(first, *DVC, "repro")
    run(first, "git", "add", "-A")
    run(first, "git", "commit", "-qm", "results")
    second = base / "second"
    run(base, "git", "clone", "-q", str(first), str(second))
    assert not (second / ".dvc/cache").exists() and not (second / "features").exists()
    out = run(second, *DVC, "repro").stdout
    return first, second, out


def test_a_rerun_from_a_fresh_clone_leaves_every_committed_file_byte_identical(rerun):
    from tests.pipeline_repo import run

    first, second, out = rerun
    assert "Running stage 'adapt@shapes'" in out and "Running stage 'pretrain@toy-smoke'" in out  # it did run again
    assert run(second, "git", "status", "--porcelain").stdout == ""
    assert (second / "dvc.lock").read_bytes() == (first / "dvc.lock").read_bytes()


def test_the_timings_of_both_runs_are_run_facts_outside_git(rerun):
    from tests.pipeline_repo import run

    first, second, _ = rerun
    report = json.loads((second / "reports/adapt/shapes.json").read_text())
    assert run_fact_keys(report) == [] and report["details"]["elevater"]["runs"][0]["shots"] == 2
    for repo in (first, second):
        facts = json.loads((repo / "runs/adapt/shapes.json").read_text())
        assert facts["elevater"]["seconds"] > 0 and facts["elevater"]["runs"][0]["search_seconds"] > 0
        assert run(repo, "git", "check-ignore", "-q", "runs/adapt/shapes.json", check=False).returncode == 0
