"""`vlbench compare` for real: git and DVC in a temporary repository, result files written by vlbench.results and
committed (JSON in git, per-sample tables through `dvc add` or as `dvc exp run` outputs), read back by revision."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats as sps

from tests.pipeline_repo import run
from vlbench import stats

ROOT = Path(__file__).resolve().parent.parent
N = 400
LABELS = np.arange(N) % 4


def predictions(accuracy: float, seed: int = 0) -> np.ndarray:
    """Predicted classes that are right on the first accuracy * N samples of a fixed permutation."""
    order = np.random.default_rng(seed).permutation(N)
    predicted = (LABELS + 1) % 4
    right = order[: int(round(accuracy * N))]
    predicted[right] = LABELS[right]
    return predicted


def write(accuracy: float, ids=None, probe=None) -> None:
    """Result files as an analysis writes them (vlbench.results), in the current directory."""
    from vlbench.results import Result, write_result

    predicted = predictions(accuracy)
    ids = ids or [f"s{i}" for i in range(N)]
    correct = predicted == LABELS
    table = pa.table({"sample_id": ids, "label": LABELS, "predicted": predicted})
    interval = stats.bootstrap_sample_metric("accuracy", correct).to_json()
    write_result("zeroshot", "d", Result({"accuracy": float(correct.mean())}, {"samples": N}, {},
                                         tables={"predictions": table}, intervals={"accuracy": interval}), {"model": "m"})
    if probe is not None:  # a result without per-sample results: its interval only
        write_result("linear_probe", "d", Result({"accuracy": probe[0]}, {}, {}, intervals={"accuracy": probe[1]}),
                     {"model": "m"})


WRITER = """
import sys, yaml
sys.path.insert(0, {root!r})
from tests.test_compare import write
write(yaml.safe_load(open("params.yaml"))["accuracy"])
"""


def cli(*args: str):
    """`vlbench compare ARGS` in this process (the current directory is the repository)."""
    from click.testing import CliRunner

    from vlbench.cli import main

    return CliRunner().invoke(main, ["compare", *args])


@pytest.fixture()
def repo(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "compare_writer.py").write_text(WRITER.format(root=str(ROOT)))
    from dvc.repo import Repo

    run(repo, "git", "init", "-q")
    Repo.init(str(repo)).close()
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "init")
    monkeypatch.chdir(repo)
    return repo


def commit(repo: Path, message: str) -> None:
    from dvc.repo import Repo

    with Repo(str(repo)) as dvc_repo:
        dvc_repo.add("reports/zeroshot/d.predictions.parquet")
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", message)


def test_compare_two_commits_pairs_per_sample_results_and_names_the_winner(repo):
    probe_a = {"low": 0.70, "high": 0.80, "level": 0.95, "method": "bootstrap", "resamples": 2000, "seed": 0}
    probe_b = {"low": 0.71, "high": 0.81, "level": 0.95, "method": "bootstrap", "resamples": 2000, "seed": 0}
    write(0.60, probe=(0.75, probe_a))
    commit(repo, "a")
    write(0.70, probe=(0.76, probe_b))
    commit(repo, "b")
    (repo / "reports/zeroshot/d.predictions.parquet").unlink()  # read from DVC's cache by revision, not the workspace
    proc = cli("HEAD~1", "HEAD", "--json", "--out", "cmp")
    data = json.loads(proc.stdout)
    heads = run(repo, "git", "rev-list", "-2", "HEAD").stdout.split()
    assert data["experiments"] == [{"name": "HEAD~1", "rev": heads[1]}, {"name": "HEAD", "rev": heads[0]}]
    rows = {(r["analysis"], r["metric"]): r for r in data["rows"]}
    zs = rows[("zeroshot", "accuracy")]
    assert zs["values"]["HEAD~1"]["value"] == pytest.approx(0.60)
    assert zs["values"]["HEAD"]["value"] == pytest.approx(0.70)
    (diff,) = zs["differences"]
    a, b = predictions(0.60) == LABELS, predictions(0.70) == LABELS
    expected = stats.paired_difference("accuracy", a, b)
    assert (diff["a"], diff["b"], diff["n"], diff["paired"]) == ("HEAD~1", "HEAD", N, True)
    assert diff["delta"] == pytest.approx(0.10)
    assert diff["low"] == pytest.approx(expected.low, abs=1e-9) and diff["high"] == pytest.approx(expected.high, abs=1e-9)
    p_exact = sps.binomtest(int(np.sum(a & ~b)), int(np.sum(a != b))).pvalue
    assert diff["p_mcnemar"] == pytest.approx(p_exact) and (diff["test"], diff["p"]) == ("mcnemar", diff["p_mcnemar"])
    # two tests in the comparison (zeroshot's paired one; linear probe's is untested without --unpaired): Holm
    assert data["correction"] == {"method": "holm", "alpha": 0.05, "tests": 1, "unpaired": False,
                                  "identical_left_out": 0}
    assert diff["p_adjusted"] == pytest.approx(p_exact) and zs["winner"] == "HEAD"
    lp = rows[("linear_probe", "accuracy")]
    (untested,) = lp["differences"]
    assert untested["paired"] is False and untested["p"] is None and untested["p_adjusted"] is None
    assert "--unpaired" in untested["unpaired_reason"] and untested["delta"] == pytest.approx(0.01)
    assert lp["winner"] is None and lp["values"]["HEAD"] == {"value": 0.76, "low": 0.71, "high": 0.81}
    data = json.loads(cli("HEAD~1", "HEAD", "--json", "--out", "cmp", "--unpaired").stdout)
    (unpaired,) = next(r for r in data["rows"] if r["analysis"] == "linear_probe")["differences"]
    assert unpaired["paired"] is False and unpaired["p_mcnemar"] is None and unpaired["test"] == "normal"
    assert unpaired["p"] == unpaired["p_bootstrap"] > 0.05 and data["correction"]["tests"] == 2
    table = cli("HEAD~1", "HEAD", "--out", "cmp")
    header, *lines = table.stdout.splitlines()
    assert header.split()[:3] == ["analysis/dataset/metric", "HEAD~1", "HEAD"]
    zs_line = next(line for line in lines if line.startswith("zeroshot/d/accuracy"))
    assert "HEAD-HEAD~1 +0.1000 p=" in zs_line and "(mcnemar)" in zs_line and zs_line.rstrip().endswith("HEAD")
    assert (repo / "cmp/index.html").is_file() and f"wrote {Path('cmp/index.html')}" in table.stderr


def test_unknown_revision_and_different_samples_are_one_line_errors(repo):
    write(0.6)
    commit(repo, "a")
    write(0.6, ids=[f"x{i}" for i in range(N)])
    commit(repo, "b")
    proc = cli("HEAD", "no-such-rev")
    assert proc.exit_code == 1 and "unknown revision 'no-such-rev'" in proc.stderr
    proc = cli("HEAD~1", "HEAD")
    assert proc.exit_code == 1 and "reports/zeroshot/d.predictions.parquet: HEAD~1 and HEAD " in proc.stderr
    assert "scored different images (sample_id differ: 400 against 400, e.g. [" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_compare_two_dvc_experiments_by_name(repo, monkeypatch):
    (repo / "params.yaml").write_text("accuracy: 0.5\n")
    (repo / "dvc.yaml").write_text(
        "stages:\n  results:\n    cmd: python compare_writer.py\n    params: [accuracy]\n"
        "    deps: [compare_writer.py]\n    outs:\n      - reports/zeroshot/d.json:\n          cache: false\n"
        "      - reports/zeroshot/d.predictions.parquet\n")
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "pipeline")
    from dvc.repo import Repo

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # the stage's python
    with Repo(str(repo)) as dvc_repo:
        for name, accuracy in (("low", 0.55), ("high", 0.75)):
            dvc_repo.experiments.run(params=[f"accuracy={accuracy}"], name=name)
    data = json.loads(cli("low", "high", "--json").stdout)
    (row,) = data["rows"]
    values = {k: v["value"] for k, v in row["values"].items()}
    assert values == {"low": pytest.approx(0.55), "high": pytest.approx(0.75)}
    assert row["differences"][0]["paired"] and row["winner"] == "high"


def test_per_sample_files_missing_from_cache_and_remote_fall_back_to_unpaired_with_a_note(repo):
    import shutil

    write(0.6)
    commit(repo, "a")
    write(0.7)
    commit(repo, "b")
    shutil.rmtree(repo / ".dvc/cache")
    (repo / "reports/zeroshot/d.predictions.parquet").unlink()
    proc = cli("HEAD~1", "HEAD", "--json")
    assert proc.exit_code == 0
    assert "note: HEAD~1: 1 per-sample file(s) in neither the DVC cache nor the remote" in proc.stderr
    (diff,) = json.loads(proc.stdout)["rows"][0]["differences"]
    assert diff["paired"] is False and diff["p_mcnemar"] is None and diff["delta"] == pytest.approx(0.1)
    assert diff["p"] is None and "in neither the DVC cache nor the remote" in diff["unpaired_reason"]  # never silently
    (diff,) = json.loads(cli("HEAD~1", "HEAD", "--json", "--unpaired").stdout)["rows"][0]["differences"]
    assert diff["paired"] is False and diff["test"] == "normal" and diff["p"] is not None


def test_each_metric_is_paired_by_the_table_its_analysis_declares(tmp_path, monkeypatch):
    """Robustness's `correct` column, compositionality's per-category trials and their mean over categories,
    multi-label zero-shot without logits and a metric no table declares: paired where declared, else untested with
    the reason; never an ArrowInvalid."""
    import fsspec

    from vlbench.compare_runs import Experiment, compare

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    correct = {name: rng.random((2, 40)) < p for name, p in (("a", 0.5), ("b", 0.8))}
    docs = {}
    for i, name in enumerate("ab"):
        folder = tmp_path / name / "reports"
        for sub in ("robustness", "compositionality", "zeroshot"):
            (folder / sub).mkdir(parents=True)
        pq.write_table(pa.table({"sample_id": [f"s{k}" for k in range(40)], "label": LABELS[:40],
                                 "predicted_reference_class": LABELS[:40], "correct": correct[name][0]}),
                       folder / "robustness/shift.predictions.parquet")
        pq.write_table(pa.table({"item": [f"i{k}" for k in range(40)], "sample_id": ["s0"] * 40,
                                 "category": ["swap"] * 20 + ["replace"] * 20, "correct": correct[name][1]}),
                       folder / "compositionality/c.trials.parquet")
        pq.write_table(pa.table({"sample_id": ["s0"], "labels": [[0, 1]], "predicted": [0]}),
                       folder / "zeroshot/h.predictions.parquet")
        c = correct[name][1]
        docs[name] = {("robustness", "shift"): {"metrics": {"accuracy": float(correct[name][0].mean()),
                                                            "effective_robustness": 0.1 * i}},
                      ("compositionality", "c"): {"metrics": {"swap": float(c[:20].mean()),
                                                              "mean": float((c[:20].mean() + c[20:].mean()) / 2),
                                                              "text": 0.5}},
                      ("zeroshot", "h"): {"metrics": {"map_11point": 0.3, "accuracy": 0.2}}}
    fs = fsspec.filesystem("dir", path=str(tmp_path / "a")), fsspec.filesystem("dir", path=str(tmp_path / "b"))
    data = compare([Experiment("a", "1" * 40, docs["a"], fs[0]), Experiment("b", "2" * 40, docs["b"], fs[1])])
    rows = {(r["analysis"], r["metric"]): r["differences"][0] for r in data["rows"]}
    robust = rows[("robustness", "accuracy")]
    expected = stats.paired_difference("accuracy", correct["a"][0], correct["b"][0], LABELS[:40])
    assert (robust["paired"], robust["unit"], robust["n"], robust["test"]) == (True, "image", 40, "mcnemar")
    assert (robust["low"], robust["high"]) == pytest.approx((expected.low, expected.high), abs=1e-9)
    assert robust["p_mcnemar"] == pytest.approx(expected.p_mcnemar)
    swap = rows[("compositionality", "swap")]
    expected = stats.paired_difference("accuracy", correct["a"][1][:20], correct["b"][1][:20])
    assert (swap["paired"], swap["unit"], swap["n"]) == (True, "trial", 20)
    assert swap["p_mcnemar"] == pytest.approx(expected.p_mcnemar)
    assert swap["delta"] == pytest.approx(correct["b"][1][:20].mean() - correct["a"][1][:20].mean())
    mean = rows[("compositionality", "mean")]  # the mean over categories: mean-per-class with category as class
    expected = stats.paired_difference("mean_per_class", correct["a"][1], correct["b"][1], np.repeat([1, 0], 20))
    assert (mean["paired"], mean["n"], mean["test"]) == (True, 40, "bootstrap")
    assert (mean["low"], mean["high"]) == pytest.approx((expected.low, expected.high), abs=0.03)
    reasons = {key: rows[key]["unpaired_reason"] for key in (("compositionality", "text"), ("zeroshot", "map_11point"),
                                                             ("robustness", "effective_robustness"),
                                                             ("zeroshot", "accuracy"))}
    assert {k: v.removesuffix(" (vlbench compare --unpaired compares it from the two intervals)")
            for k, v in reasons.items()} == {
        ("compositionality", "text"): "reports/compositionality/c.trials.parquet has no rows for 'text' "
                                      "({'category': 'text'})",
        ("zeroshot", "map_11point"): "a's reports/zeroshot/h.predictions.parquet lacks the column(s) ['logits'] its "
                                     "analysis declares",
        ("robustness", "effective_robustness"): "robustness declares no per-sample table for 'effective_robustness'",
        ("zeroshot", "accuracy"): "a's reports/zeroshot/h.predictions.parquet lacks the column(s) ['label'] its "
                                  "analysis declares"}


def test_every_per_sample_table_in_dvc_yaml_is_declared_by_its_analysis():
    """dvc.yaml's reports/<analysis>/${item}.<table>.parquet outputs and the ANALYSES rows' tables are the same set."""
    import re

    from vlbench.analyses import ANALYSES

    outs = set(re.findall(r"reports/(\w+)/\$\{item\}\.(\w+)\.parquet", (ROOT / "dvc.yaml").read_text()))
    declared = {(name, t.name) for name, a in ANALYSES.items() for t in a.tables}
    assert {o for o in outs if o[0] in ANALYSES} == declared
