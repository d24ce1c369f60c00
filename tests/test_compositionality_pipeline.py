"""The compositionality stages in a real DVC pipeline: the demo set prepared, its candidate texts embedded by a toy
model, scored and reported (31-44 s on the 2-core machine at loads 2-3, most of it the toy model's training and the
two embed stages)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.pipeline_repo import read_suite, run, write_suite

ROOT = Path(__file__).resolve().parents[1]


def test_the_pipeline_prepares_embeds_scores_and_reports_the_demo_set(smoke_run, tmp_path):
    repo = smoke_run(tmp_path / "repo")  # the session's smoke run (tests/conftest.py): its toy model is reused
    suite = read_suite(repo, "smoke")
    entry = yaml_entry("compositional")
    entry["prepare"]["size"] = 12
    suite["datasets"] = {"compositional": entry}
    suite.update(embed=["compositional"], zeroshot=[], linear_probe=[], compositionality=["compositional"])
    write_suite(repo, suite)
    run(repo, sys.executable, "-m", "vlbench.cli", "compose")
    run(repo, sys.executable, "-m", "dvc", "repro", "report")
    texts = pq.read_table(repo / "data/texts/compositional/candidates.parquet")
    assert texts.num_rows == 12 * 6
    result = json.loads((repo / "reports/compositionality/compositional.json").read_text())
    assert result["counts"] == {"images": 12, "texts": 72, "trials": 36, "items": 36, "skipped_corrupt": 0}
    trials = pq.read_table(repo / "reports/compositionality/compositional.trials.parquet").to_pylist()
    assert all(t["correct"] == (t["positive_score"] > t["best_negative_score"]) for t in trials)
    for category in ("swap_att", "replace_att", "replace_obj"):  # the JSON agrees with the per-trial file
        right = [t["correct"] for t in trials if t["category"] == category]
        assert result["metrics"][category] == pytest.approx(sum(right) / len(right))
    assert result["metrics"]["mean"] == pytest.approx(sum(result["metrics"][c] for c in
                                                          ("swap_att", "replace_att", "replace_obj")) / 3)
    assert result["intervals"]["mean"]["low"] <= result["metrics"]["mean"] <= result["intervals"]["mean"]["high"]
    metrics = json.loads((repo / "reports/metrics.json").read_text())
    assert metrics["compositionality"]["compositional"] == result["metrics"]
    assert (repo / "reports/plots/compositionality.svg").is_file()
    page = (repo / "reports/index.html").read_text()
    assert 'id="compositionality"' in page and "compositionality.svg" in page
    assert "up to date" in run(repo, sys.executable, "-m", "dvc", "status", "report").stdout  # nothing left stale


def yaml_entry(name: str) -> dict:
    return yaml.safe_load((ROOT / "conf/dataset" / f"{name}.yaml").read_text())
