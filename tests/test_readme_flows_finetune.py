"""The README's fine-tuning and own-data flows (docs/fine-tuning.md, docs/own-data.md), run as a user runs them: the
second half of tests/test_readme_flows.py, in a module of its own so that pytest-xdist runs the two halves on both
workers. Its fine-tuning flow starts from a copy of the session's smoke run; the others from a copy of the README
flows' miniature demo (tests/conftest.py, `flows_demo`), as tests/test_readme_flows.py's do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.pipeline_repo import run
from tests.test_byo_pipeline import PETS, SUITE, XRAY, own_data
from tests.test_readme_flows import DVC, VLBENCH, restore, rows, vlbench


@pytest.fixture(scope="module")
def demo(flows_demo, tmp_path_factory) -> Path:
    """This module's copy of the session's README flows demo (tests/conftest.py, `flows_demo`)."""
    return flows_demo(tmp_path_factory.mktemp("flows") / "repo")


# ---------------------------------------------------------------------------------------------- fine-tuning
# docs/fine-tuning.md's flow (issue 30 defects 2 and 5) on a copy of the session's smoke run of its own (the smoke
# suite, a 3-step toy: tests/conftest.py, `smoke_run`): `dvc exp run` there changes the
# workspace, which the `demo` fixture's other flows read. First the fine-tuned model's entry before its weights exist,
# then the fine-tuning command itself, with a search grid in which some candidates diverge, as the demo's does.
MODEL_NEEDS = "dvc exp run -S model=toy -S 'suite.finetune=[shapes]' -S finetune.method=elevater_full"
# docs/fine-tuning.md's command with a miniature search: one learning rate (0.01) over ELEVATER's weight-decay
# grid, whose candidates at weight decay 1e4 and 1e6 multiply the weights by -100 and more per step and so diverge
# within their 2 epochs; the final run (on the 1e-6 .. 1e2 side the search prefers) completes.
FINETUNE_MINIATURE = ["-S", "+finetune.elevater_full.shots=[4]", "-S", "+finetune.elevater_full.seeds=[0]",
             "-S", "+adapt.elevater.lr_grid.log_lower=-2", "-S", "+adapt.elevater.lr_grid.log_upper=-2",
             "-S", "+adapt.elevater.lr_grid.num=1", "-S", "+adapt.elevater.search_epochs=2",
             "-S", "+adapt.elevater.final_epochs=1", "-S", "+adapt.elevater.batch_size=4"]


def test_readme_finetune_flow_on_the_pipeline(smoke_run, tmp_path):
    repo = smoke_run(tmp_path / "repo")
    # `vlbench models` says what a fine-tuned entry needs; selecting it before that run is one line naming both
    listed = {line.split()[0]: line for line in run(repo, *VLBENCH, "models").stdout.splitlines()}
    assert f"needs `{MODEL_NEEDS}` (not made yet)" in listed["toy-elevater-shapes"]
    failed = run(repo, *DVC, "exp", "run", "-S", "model=toy-elevater-shapes", check=False)
    assert failed.returncode != 0 and "Running stage" not in failed.stdout  # refused at composition, nothing ran
    error = [line for line in (failed.stdout + failed.stderr).splitlines() if "ERROR" in line]
    assert len(error) == 1 and "No such file or directory" not in error[0], failed.stderr
    assert ("model 'toy-elevater-shapes' needs data/finetuned/shapes/elevater_full/checkpoint.pt, which is not there: "
            f"it is made by fine-tuning 'toy' on 'shapes' with elevater_full: `{MODEL_NEEDS}`") in error[0]

    # docs/fine-tuning.md's fine-tuning command: some search candidates diverge, the stage completes
    done = run(repo, *DVC, "exp", "run", "-S", "suite.finetune=[shapes]", "-S", "finetune.method=elevater_full",
               *FINETUNE_MINIATURE)
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
    # fine-tuning is a row of the analyses table: its numbers, headline, chart and section reach the report
    metrics = json.loads((repo / "reports/metrics.json").read_text())
    assert metrics["finetune"]["shapes"] == {k: v for k, v in result["metrics"].items()}
    headline = json.loads((repo / "reports/headline.json").read_text())
    assert headline["finetune"]["shapes"] == {"elevater_full/language_2p/4/last":
                                              result["metrics"]["elevater_full/language_2p/4/last"]}
    assert (repo / "reports/plots/finetune_shapes.svg").read_bytes() == \
        (repo / "reports/finetune/shapes.svg").read_bytes()
    assert "Fine-tuning (ELEVATER full fine-tuning" in (repo / "reports/index.html").read_text()


# ------------------------------------------------------------------------------------- FewTrans fine-tuning


def test_fewtrans_fine_tuning_appears_on_the_page_and_compare_pairs_it_by_episode(demo):
    """docs/fine-tuning.md: two `fewtrans_episodic` runs on the demo's episodes (authors' centres replaced by tiny
    explicit ones); the page shows fine-tuning, reports/metrics.json has its numbers, and `vlbench compare` pairs the
    two runs over the same episodes with a paired t-interval."""
    def settings(lr: float) -> str:
        return (f"+finetune.fewtrans_episodic={{methods: [text_ft], lr_factors: [1.0], epoch_offset: 0, "
                f"text_ft: {{lr: {lr}, epochs: 2}}}}")

    try:
        for name, lr in (("fta", 0.001), ("ftb", 0.01)):
            done = run(demo, *DVC, "exp", "run", "-n", name, "-S", "suite.finetune=[shapes]",
                       "-S", "finetune.method=fewtrans_episodic", "-S", settings(lr))
            assert "Running stage 'finetune@shapes'" in done.stdout
        metrics = json.loads((demo / "reports/metrics.json").read_text())
        assert 0 <= metrics["finetune"]["shapes"]["fewtrans/base/text_ft"] <= 1
        assert "Fine-tuning (ELEVATER full fine-tuning" in (demo / "reports/index.html").read_text()
        data = json.loads(vlbench(demo, "compare", "fta", "ftb", "--json").stdout)
        d = rows(data)[("finetune", "shapes", "fewtrans/base/text_ft")]["differences"][0]
        assert (d["paired"], d["unit"], d["test"], d["n"]) == (True, "episode", "t", 2), d
        episodes = pq.read_table(demo / "reports/finetune/shapes.episodes.parquet").to_pylist()
        assert sorted(r["episode"] for r in episodes if r["split"] == "base") == [0, 1]
    finally:
        restore(demo)


# -------------------------------------------------------------------------------------------- your own data


def test_your_own_data_runs_as_an_experiment_and_compares(demo, tmp_path):
    """README and docs/own-data.md: `vlbench data-root`, entries pets and xray and a suite (those of
    tests/test_byo_pipeline.py, which tests the data's edge cases), `dvc exp run -S suite=<it>`, then `vlbench
    compare` against the demo run."""
    own_data(tmp_path / "data")
    try:
        vlbench(demo, "data-root", str(tmp_path / "data"))
        (demo / "conf/dataset/pets.yaml").write_text(PETS)
        (demo / "conf/dataset/xray.yaml").write_text(XRAY)
        (demo / "conf/suite/byo.yaml").write_text(SUITE)  # the README's conf/suite/mydata.yaml, smaller
        run(demo, *DVC, "exp", "run", "-n", "mine", "-S", "suite=byo")
        data = json.loads(vlbench(demo, "compare", "HEAD", "mine", "--json").stdout)
    finally:
        restore(demo)
        (demo / "data/own").unlink(missing_ok=True)
    found = rows(data)
    pets = found[("zeroshot", "pets", "accuracy")]
    assert list(pets["values"]) == ["mine"] and pets["differences"] == [] and pets["winner"] is None
    both = found[("zeroshot", "shapes", "accuracy")]  # the demo's file, left in the workspace (docs/own-data.md)
    assert set(both["values"]) == {"HEAD", "mine"}
