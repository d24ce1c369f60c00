"""finetune@<dataset> through DVC, as the docs say to run it: `dvc exp run -S suite.finetune=[...]` writes the weights
with their fingerprint and the result; then `-S model=<the fine-tuned model>` runs an analysis on it, and its features
carry the fine-tuned weights' fingerprint id (on a copy of the session's smoke run: the smoke suite, a 3-step toy)."""

from __future__ import annotations

import json
import sys

import pyarrow.parquet as pq
import yaml

from tests.pipeline_repo import run

DVC = (sys.executable, "-m", "dvc")
TINY = ["-S", "+finetune.elevater_full.shots=[2]", "-S", "+finetune.elevater_full.seeds=[0]",
        "-S", "+adapt.elevater.lr_grid.log_lower=-3", "-S", "+adapt.elevater.lr_grid.num=1",
        "-S", "+adapt.elevater.search_epochs=1", "-S", "+adapt.elevater.final_epochs=1", "-S", "+adapt.elevater.batch_size=8"]


def test_dvc_exp_run_fine_tunes_and_the_weights_run_as_a_model(smoke_run, tmp_path):
    repo = smoke_run(tmp_path / "repo")  # the session's smoke run (tests/conftest.py): toy model and features reused
    assert "finetune@shapes" not in run(repo, *DVC, "status").stdout  # opt-in: the default suite has no finetune stage
    tuned = {"slug": "toy-smoke-ft", "arch": "vlbench-toy", "base": "toy-smoke",
             "finetune": {"dataset": "shapes", "method": "elevater_full"},
             "pretrained": "data/finetuned/shapes/elevater_full/checkpoint.pt", "weights_file": "${vlbench.finetuned:}",
             "precision": "fp32", "pretrain": []}
    (repo / "conf/model/toy-smoke-ft.yaml").write_text(yaml.safe_dump(tuned, sort_keys=False))
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "fine-tuned model entry")

    run(repo, *DVC, "exp", "run", "-S", "suite.finetune=[shapes]", "-S", "finetune.method=elevater_full", *TINY,
        "finetune@shapes")
    out = repo / "data/finetuned/shapes/elevater_full"
    fingerprint = json.loads((out / "fingerprint.json").read_text())
    assert fingerprint["base"]["model"] == "toy-smoke" and fingerprint["method"] == "elevater_full"
    assert fingerprint["hyper"]["shots"] == 2 and fingerprint["data_version"]["dataset_version"]
    result = json.loads((repo / "reports/finetune/shapes.json").read_text())
    assert result["fingerprint"]["finetuned"]["id"] == fingerprint["id"]
    assert "elevater_full/language_2p/2/last" in result["metrics"] and (repo / "reports/finetune/shapes.svg").is_file()
    assert pq.read_table(repo / "reports/finetune/shapes.search.parquet").num_rows >= 7  # 7 coarse weight decays at least
    assert pq.read_table(repo / "reports/finetune/shapes.comparison.parquet").num_rows == 0  # negclip's table

    run(repo, *DVC, "exp", "run", "-S", "model=toy-smoke-ft", "zeroshot@shapes")
    features = repo / "features/toy-smoke-ft/shapes/images/test.parquet"
    stamp = json.loads(pq.read_schema(features).metadata[b"vlbench.fingerprint"])
    assert stamp["finetune"] == fingerprint["id"] and stamp["weights_sha256"] == fingerprint["weights_sha256"]
    assert json.loads((repo / "reports/zeroshot/shapes.json").read_text())["fingerprint"]["model"] == "toy-smoke-ft"
