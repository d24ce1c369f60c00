"""End to end: the real DVC pipeline on a copy of this repository, with a smoke suite and a few-step toy model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent

SMOKE_SUITE = {
    "slug": "smoke",
    "datasets": {
        "shapes": {"source": "synthetic", "task": "shapes", "seed": 0, "image_size": 32,
                   "splits": {"train": 48, "val": 24, "test": 36}},
        "hierarchy": {"source": "synthetic", "task": "hierarchy", "seed": 0, "image_size": 32,
                      "splits": {"test": 30}},
    },
    "embed": ["shapes", "hierarchy"],
    "zeroshot": ["shapes", "hierarchy"],
    "linear_probe": ["shapes"],
}


def smoke_model(slug: str, arch: str) -> dict:
    train = {"corpus": {"source": "synthetic", "task": "corpus", "seed": 1, "image_size": 32, "splits": {"train": 96}},
             "steps": 3, "batch_size": 16, "lr": 0.001, "weight_decay": 0.1, "warmup_steps": 1, "seed": 0}
    return {"slug": slug, "arch": arch, "pretrained": f"data/models/{slug}/checkpoint.pt",
            "weights_file": f"data/models/{slug}/checkpoint.pt", "precision": "fp32", "pretrain": {slug: train}}


def run(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    proc = subprocess.run(list(args), cwd=cwd, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is needed to copy the repository")
    dest = tmp_path_factory.mktemp("pipeline") / "repo"
    files = run(ROOT, "git", "ls-files", "--cached", "--others", "--exclude-standard").stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    (dest / "conf/suite/smoke.yaml").write_text(yaml.safe_dump(SMOKE_SUITE))
    (dest / "conf/model/toy-smoke.yaml").write_text(yaml.safe_dump(smoke_model("toy-smoke", "vlbench-toy")))
    (dest / "conf/model/toy-wide-smoke.yaml").write_text(yaml.safe_dump(smoke_model("toy-wide-smoke", "vlbench-toy-wide")))
    config = (dest / "conf/config.yaml").read_text().replace("model: toy\n", "model: toy-smoke\n").replace("suite: demo\n", "suite: smoke\n")
    (dest / "conf/config.yaml").write_text(config)
    run(dest, sys.executable, "-m", "vlbench.cli", "compose")
    run(dest, "git", "init", "-q")
    run(dest, "git", "add", "-A")
    run(dest, "git", "commit", "-qm", "copy")
    return dest


@pytest.fixture(scope="module")
def reproduced(repo) -> Path:
    run(repo, sys.executable, "-m", "dvc", "repro")
    return repo


def test_repro_writes_metrics_with_stable_keys_and_the_model_fingerprint(reproduced):
    metrics = json.loads((reproduced / "reports/metrics.json").read_text())
    assert set(metrics) == {"zeroshot", "linear_probe", "model"}
    assert set(metrics["zeroshot"]) == {"shapes", "hierarchy"}
    assert set(metrics["zeroshot"]["hierarchy"]) == {"map_11point"}
    for value in (metrics["zeroshot"]["shapes"]["accuracy"], metrics["linear_probe"]["shapes"]["accuracy"],
                  metrics["zeroshot"]["hierarchy"]["map_11point"]):
        assert 0.0 <= value <= 1.0
    assert metrics["model"]["model"] == "toy-smoke" and len(metrics["model"]["weights_sha256"]) == 64
    per_dataset = json.loads((reproduced / "reports/zeroshot/shapes.json").read_text())
    assert per_dataset["metrics"] == metrics["zeroshot"]["shapes"]
    assert per_dataset["counts"] == {"samples": 36, "classes": 12}


def test_predictions_hold_every_test_sample_with_its_logits(reproduced):
    preds = pq.read_table(reproduced / "reports/zeroshot/shapes.predictions.parquet")
    assert preds.num_rows == 36
    assert preds.column_names == ["sample_id", "label", "predicted", "predicted_name", "predicted_logit", "logits"]
    row = preds.slice(0, 1).to_pylist()[0]
    assert len(row["logits"]) == 12 and max(row["logits"]) == pytest.approx(row["predicted_logit"])


def test_features_live_under_the_model_slug_and_reports_do_not(reproduced):
    assert (reproduced / "features/toy-smoke/shapes/train.parquet").exists()
    assert not any("toy-smoke" in str(p.relative_to(reproduced)) for p in (reproduced / "reports").rglob("*"))


def test_second_repro_runs_nothing(reproduced):
    out = run(reproduced, sys.executable, "-m", "dvc", "repro").stdout
    assert "Running stage" not in out
    assert "up to date" in out


def test_exp_run_with_another_model_is_listed_and_diffable(reproduced):
    run(reproduced, "git", "add", "-A")
    run(reproduced, "git", "commit", "-qm", "toy-smoke results")
    run(reproduced, sys.executable, "-m", "dvc", "exp", "run", "-S", "model=toy-wide-smoke")
    params = yaml.safe_load((reproduced / "params.yaml").read_text())
    assert params["model"]["arch"] == "vlbench-toy-wide" and params["suite"]["slug"] == "smoke"
    assert (reproduced / "features/toy-wide-smoke/shapes/test.parquet").exists()
    metrics = json.loads((reproduced / "reports/metrics.json").read_text())
    assert metrics["model"]["model"] == "toy-wide-smoke"
    shown = json.loads(run(reproduced, sys.executable, "-m", "dvc", "exp", "show", "--json").stdout)
    assert "toy-wide-smoke" in json.dumps(shown)
    diff = json.loads(run(reproduced, sys.executable, "-m", "dvc", "metrics", "diff", "--json").stdout)
    assert "reports/metrics.json" in diff


def test_exp_run_with_unknown_model_names_the_known_ones(reproduced):
    proc = run(reproduced, sys.executable, "-m", "dvc", "exp", "run", "-S", "model=vitb17", check=False)
    assert proc.returncode != 0
    assert "vitb17" in proc.stderr + proc.stdout and "vitb16" in proc.stderr + proc.stdout


def test_real_models_have_no_pretrain_stage(repo):
    params = repo / "params.yaml"
    before = params.read_text()
    try:
        run(repo, sys.executable, "-m", "vlbench.cli", "compose", "model=vitb16")
        stages = run(repo, sys.executable, "-m", "dvc", "stage", "list").stdout
        assert "embed@shapes" in stages and "pretrain@" not in stages
        run(repo, sys.executable, "-m", "vlbench.cli", "compose", "model=toy-smoke")
        assert "pretrain@toy-smoke" in run(repo, sys.executable, "-m", "dvc", "stage", "list").stdout
    finally:
        params.write_text(before)
