"""The knowledge stages under DVC: knowledge@shapes (the demo world's own files, fetched from their file:// URLs) ->
embed_knowledge@shapes -> zeroshot@shapes scoring every variant -> report, on a copy of this repository with one tiny
dataset and a randomly initialised toy model (no pretraining: these tests check the wiring, not the numbers)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from tests.llm_server import serve_llm
from tests.pipeline_repo import add_all, make_repo, run, synthetic_entry, write_suite
from vlbench.knowledge.variants import DEFAULT_VARIANTS as VARIANTS

DVC = (sys.executable, "-m", "dvc")
SUITE = {
    "slug": "knowledge-smoke",
    "datasets": {"shapes": synthetic_entry("shapes", {"test": 24}, ["a {c}.", "a drawing of a {c}."])},
    "embed": ["shapes"], "zeroshot": ["shapes"], "linear_probe": [], "knowledge": ["shapes"],
}
SUITE["datasets"]["shapes"]["texts"]["knowledge"] = "demo-shapes"


def random_model(repo: Path) -> None:
    """conf/model/toy-random.yaml: the toy architecture with seeded random weights saved in the repository."""
    import open_clip
    import torch

    from vlbench.models import register_local_configs

    register_local_configs()
    torch.manual_seed(0)
    weights = repo / "weights" / "toy-random.pt"
    weights.parent.mkdir()
    torch.save(open_clip.create_model("vlbench-toy").state_dict(), weights)
    model = {"slug": "toy-random", "arch": "vlbench-toy", "pretrained": "weights/toy-random.pt",
             "weights_file": "weights/toy-random.pt", "precision": "fp32", "pretrain": []}
    (repo / "conf/model/toy-random.yaml").write_text(yaml.safe_dump(model))


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = make_repo(tmp_path_factory.mktemp("knowledge") / "repo")
    write_suite(repo, SUITE)
    random_model(repo)
    run(repo, sys.executable, "-m", "vlbench.cli", "compose", "suite=knowledge-smoke", "model=toy-random")
    repro = run(repo, *DVC, "repro")
    (repo.parent / "repro.log").write_text(repro.stdout + repro.stderr)
    add_all(repo)
    run(repo, "git", "commit", "-qm", "knowledge results")
    return repo


def status(repo: Path) -> set[str]:
    return set(json.loads(run(repo, *DVC, "status", "--json").stdout))


def test_every_variant_is_scored_with_its_coverage(repo):
    result = json.loads((repo / "reports/zeroshot/shapes.json").read_text())
    variants = result["details"]["variants"]
    assert list(variants) == ["templates", *VARIANTS]
    for name in VARIANTS:
        entry = variants[name]
        assert 0 <= entry["metrics"]["accuracy"] <= 1 and entry["text_set"] == name
        assert all(c["classes"] == 12 and c["covered"] == 12 for c in entry["coverage"].values()), name
        assert entry["template_only"] == 0
    assert variants["menon"]["weights"] == "mean_similarity" and variants["gpt3"]["options"]["gpt3_items"] == 1
    assert variants["wiktionary"]["files"][0]["upstream"] == "vlbench:demo/demo-shapes_knowledge.tsv"
    best = max(VARIANTS, key=lambda v: (variants[v]["metrics"]["accuracy"], -list(VARIANTS).index(v)))
    assert result["metrics"] == {"accuracy": variants["templates"]["metrics"]["accuracy"],
                                 "knowledge_best_accuracy": variants[best]["metrics"]["accuracy"],
                                 "knowledge_best_variant": best}
    metrics = json.loads((repo / "reports/metrics.json").read_text())
    assert metrics["zeroshot"]["shapes"] == result["metrics"]
    assert (repo / "reports/plots/zeroshot_knowledge.svg").is_file()


def test_the_stage_outputs(repo):
    sets = sorted(p.stem for p in (repo / "data/knowledge/shapes").glob("*.parquet"))
    assert sets == sorted(VARIANTS)
    assert sorted(p.stem for p in (repo / "features/toy-random/shapes/knowledge").glob("*.parquet")) == sets
    summary = json.loads((repo / "data/knowledge/shapes/knowledge.json").read_text())
    assert summary["vocabulary"] == "demo-shapes" and summary["skipped"] == {} and len(summary["files"]) == 4
    wordnet = json.loads((repo / "data/knowledge/shapes/wordnet.json").read_text())["classes"]
    assert [c["chosen_by"] for c in wordnet] == ["wnid"] * 12 and wordnet[5]["synset"] == "rhombus.n.01"
    assert (repo / "data/downloads/GPT3_demo-shapes.tsv").is_file()  # fetched through the download layer


def test_dvc_does_not_warn_of_an_empty_answer_cache(repo):
    log = (repo.parent / "repro.log").read_text()
    assert "Running stage 'knowledge@shapes'" in log and "is empty" not in log
    assert (repo / "data/llm/shapes.jsonl").read_text() == "\n"


def test_knowledge_params_rerun_the_knowledge_stage_only(repo):
    assert status(repo) == set()
    params = repo / "params.yaml"
    before = params.read_text()
    settings = repo / "conf/settings/knowledge.yaml"  # the section's defaults: a file dependency (issue 32)
    defaults = settings.read_text()
    try:
        params.write_text(more_gpt3_items(before))  # `-S +knowledge.gpt3_items=2`
        assert status(repo) == {"knowledge@shapes"}
        params.write_text(before)
        settings.write_text(defaults.replace("gpt3_items: 1 ", "gpt3_items: 2 "))
        assert settings.read_text() != defaults and status(repo) == {"knowledge@shapes"}
        settings.write_text(defaults)
        entry = repo / "conf/dataset/shapes.yaml"  # the registry entry: a file dependency, not a param
        entry_before = entry.read_text()
        entry.write_text(entry_before.replace("a drawing of a {c}.", "a sketch of a {c}."))
        # `code` too: it resolves each entry's source to its fingerprint (conf/dataset is its dependency); it writes
        # the same fingerprints, so nothing more reruns (docs/architecture.md, "edit this -> these stages rerun")
        assert status(repo) == {"code", "prepare@shapes", "texts@shapes", "knowledge@shapes"}
        entry.write_text(entry_before)
    finally:
        params.write_text(before)
        settings.write_text(defaults)
    assert status(repo) == set()


def more_gpt3_items(params_text: str) -> str:
    """params.yaml with `knowledge.gpt3_items: 2` added, as `dvc exp run -S +knowledge.gpt3_items=2` writes it (the
    default, 1, is in conf/settings/knowledge.yaml, not in params.yaml)."""
    assert "gpt3_items" not in params_text
    return re.sub(r"(?m)^knowledge:\n", "knowledge:\n  gpt3_items: 2\n", params_text, count=1)


def test_an_llm_variant_asks_the_endpoint_once_and_its_answers_survive_reruns(repo):
    """llm_cupl under DVC against a local OpenAI-compatible server: the first run asks 12 classes x 5 questions, the
    answers land in data/llm/shapes.jsonl (a persistent output), the variant is embedded and scored by zeroshot, and a
    rerun for another knowledge param asks nothing, without any endpoint set."""
    cache = repo / "data/llm/shapes.jsonl"
    assert cache.is_file() and cache.read_text() == "\n"  # no answer: one blank line (DVC warns of an empty file)
    params = repo / "params.yaml"
    before = params.read_text()
    with_llm = before.replace("  - wn30_definition\n", "  - wn30_definition\n  - llm_cupl\n", 1)
    assert with_llm != before
    try:
        params.write_text(with_llm)
        with serve_llm() as server:
            run(repo, *DVC, "repro", "zeroshot@shapes",
                env={"VLBENCH_LLM_BASE_URL": server.url, "VLBENCH_LLM_MODEL": "test-model"})
            assert len(server.requests) == 12 * 5
        answers = cache.read_bytes()
        assert len(answers.splitlines()) == 60 and (repo / "data/knowledge/shapes/llm_cupl.parquet").is_file()
        scored = json.loads((repo / "reports/zeroshot/shapes.json").read_text())["details"]["variants"]["llm_cupl"]
        assert scored["texts"] == 12 * 5 * 10 and 0 <= scored["metrics"]["accuracy"] <= 1  # embedded and scored
        assert scored["coverage"]["cupl"]["covered"] == 12 and scored["options"]["llm_style"] == "cupl"
        params.write_text(more_gpt3_items(with_llm))
        assert status(repo) >= {"knowledge@shapes"}
        run(repo, *DVC, "repro", "knowledge@shapes", env={"VLBENCH_LLM_MODEL": "test-model"})  # no endpoint at all
        assert cache.read_bytes() == answers
        summary = json.loads((repo / "data/knowledge/shapes/knowledge.json").read_text())
        assert summary["variants"]["llm_cupl"]["files"][0]["model"] == "test-model"
    finally:
        params.write_text(before)
        run(repo, *DVC, "repro", "knowledge@shapes")
    assert "knowledge@shapes" not in status(repo) and cache.read_bytes() == answers  # turned off: the answers stay
