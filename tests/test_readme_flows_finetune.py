"""The README's fine-tuning flow (section "Fine-tuning (opt-in)") through real DVC on a miniature copy of the demo
pipeline (tests/pipeline_repo.py: the smoke suite, a 3-step toy): the fine-tuned model's entry before its weights exist,
then the fine-tuning command itself, with a search grid in which some candidates diverge, as the demo's does (issue 30,
defects 2 and 5). To be merged into tests/test_readme_flows.py (one module for every README flow)."""

from __future__ import annotations

import json
import sys

import pyarrow.parquet as pq

from tests.pipeline_repo import make_repo, run

DVC = (sys.executable, "-m", "dvc")
VLBENCH = (sys.executable, "-m", "vlbench.cli")
MODEL_NEEDS = "dvc exp run -S model=toy -S 'suite.finetune=[shapes]' -S finetune.method=elevater_full"
# The README's command with a miniature search: one learning rate (0.01) over ELEVATER's weight-decay grid, whose
# candidates at weight decay 1e4 and 1e6 multiply the weights by -100 and more per step and so diverge within their
# 2 epochs; the final run (on the 1e-6 .. 1e2 side the search prefers) completes.
MINIATURE = ["-S", "finetune.elevater_full.shots=[4]", "-S", "finetune.elevater_full.seeds=[0]",
             "-S", "adapt.elevater.lr_grid.log_lower=-2", "-S", "adapt.elevater.lr_grid.log_upper=-2",
             "-S", "adapt.elevater.lr_grid.num=1", "-S", "adapt.elevater.search_epochs=2",
             "-S", "adapt.elevater.final_epochs=1", "-S", "adapt.elevater.batch_size=4"]


def test_readme_finetune_flow_on_the_pipeline(tmp_path):
    repo = make_repo(tmp_path / "repo")
    # `vlbench models` says what a fine-tuned entry needs; selecting it before that run is one line naming both
    listed = {line.split()[0]: line for line in run(repo, *VLBENCH, "models").stdout.splitlines()}
    assert f"needs `{MODEL_NEEDS}` (not made yet)" in listed["toy-elevater-shapes"]
    failed = run(repo, *DVC, "exp", "run", "-S", "model=toy-elevater-shapes", check=False)
    assert failed.returncode != 0 and "Running stage" not in failed.stdout  # refused at composition, nothing ran
    error = [line for line in (failed.stdout + failed.stderr).splitlines() if "ERROR" in line]
    assert len(error) == 1 and "No such file or directory" not in error[0], failed.stderr
    assert ("model 'toy-elevater-shapes' needs data/finetuned/shapes/elevater_full/checkpoint.pt, which is not there: "
            f"it is made by fine-tuning 'toy' on 'shapes' with elevater_full: `{MODEL_NEEDS}`") in error[0]

    # the README's fine-tuning command: some search candidates diverge, the stage completes
    done = run(repo, *DVC, "exp", "run", "-S", "suite.finetune=[shapes]", "-S", "finetune.method=elevater_full",
               *MINIATURE)
    assert "Running stage 'finetune@shapes'" in done.stdout and "a failed search run (score 0)" in done.stdout
    out = repo / "data/finetuned/shapes/elevater_full"
    fingerprint = json.loads((out / "fingerprint.json").read_text())
    assert (out / "checkpoint.pt").is_file() and fingerprint["weights_sha256"]
    assert fingerprint["base"]["model"] == "toy-smoke" and fingerprint["method"] == "elevater_full"
    result = json.loads((repo / "reports/finetune/shapes.json").read_text())
    assert result["fingerprint"]["finetuned"]["id"] == fingerprint["id"]
    assert 0 <= result["metrics"]["elevater_full/language_2p/4/last"] <= 1
    search = pq.read_table(repo / "reports/finetune/shapes.search.parquet").to_pylist()
    failed_runs = [r for r in search if r["status"] == "diverged"]
    assert failed_runs and {r["wd"] for r in failed_runs} >= {1e6} and all(r["val_score"] == 0 for r in failed_runs)
    assert result["details"]["runs"][0]["search_diverged"] == len(failed_runs)
    chosen = result["details"]["runs"][0]["chosen"]
    assert next(r for r in search if r["wd"] == chosen["wd"])["status"] == "ok" and chosen["val_score"] > 0
