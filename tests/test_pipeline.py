"""End to end: the real DVC pipeline on a copy of this repository, with a smoke suite and a few-step toy model."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
import yaml

from tests.pipeline_repo import run

DVC = (sys.executable, "-m", "dvc")


def ran_stages(output: str) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", output)


def status_stages(repo: Path) -> set[str]:
    return set(json.loads(run(repo, *DVC, "status", "--json").stdout))


@pytest.fixture(scope="module")
def reproduced(smoke_run, tmp_path_factory) -> Path:
    """This module's copy of the session's smoke run (tests/conftest.py): the smoke suite reproduced, committed."""
    return smoke_run(tmp_path_factory.mktemp("pipeline") / "repo")


def test_repro_writes_metrics_with_stable_keys_and_the_model_fingerprint(reproduced):
    metrics = json.loads((reproduced / "reports/metrics.json").read_text())
    assert set(metrics) == {"zeroshot", "linear_probe"}
    assert set(metrics["zeroshot"]) == {"shapes", "hierarchy"}
    assert set(metrics["zeroshot"]["hierarchy"]) == {"map_11point"}
    for value in (metrics["zeroshot"]["shapes"]["accuracy"], metrics["linear_probe"]["shapes"]["accuracy"],
                  metrics["zeroshot"]["hierarchy"]["map_11point"]):
        assert 0.0 <= value <= 1.0
    model = json.loads((reproduced / "reports/model.json").read_text())
    assert model["model"] == "toy-smoke" and len(model["weights_sha256"]) == 64
    per_dataset = json.loads((reproduced / "reports/zeroshot/shapes.json").read_text())
    assert per_dataset["metrics"] == metrics["zeroshot"]["shapes"]
    assert per_dataset["counts"] == {"samples": 36, "classes": 12, "prompts": 24, "skipped_corrupt": 0}


def test_predictions_hold_every_test_sample_with_its_logits(reproduced):
    preds = pq.read_table(reproduced / "reports/zeroshot/shapes.predictions.parquet")
    assert preds.num_rows == 36
    assert preds.column_names == ["sample_id", "label", "predicted", "predicted_name", "predicted_logit", "logits"]
    row = preds.slice(0, 1).to_pylist()[0]
    assert len(row["logits"]) == 12 and max(row["logits"]) == pytest.approx(row["predicted_logit"])


def test_results_carry_intervals_and_the_linear_probe_keeps_its_predictions(reproduced):
    from vlbench import stats

    for analysis, metric in (("zeroshot", "accuracy"), ("linear_probe", "accuracy"), ("zeroshot", "map_11point")):
        dataset = "hierarchy" if metric == "map_11point" else "shapes"
        doc = json.loads((reproduced / f"reports/{analysis}/{dataset}.json").read_text())
        interval = doc["intervals"][metric]
        assert interval["method"] == "bootstrap" and interval["resamples"] == stats.RESAMPLES
        assert interval["low"] <= doc["metrics"][metric] <= interval["high"]
    preds = pq.read_table(reproduced / "reports/linear_probe/shapes.predictions.parquet")
    assert preds.num_rows == 36 and preds.column_names == ["sample_id", "label", "predicted", "logits"]
    correct = [p == y for p, y in zip(preds.column("predicted").to_pylist(), preds.column("label").to_pylist())]
    doc = json.loads((reproduced / "reports/linear_probe/shapes.json").read_text())
    assert doc["metrics"]["accuracy"] == pytest.approx(sum(correct) / 36)


def test_features_live_under_the_model_slug_and_reports_do_not(reproduced):
    assert (reproduced / "features/toy-smoke/shapes/images/train.parquet").exists()
    assert (reproduced / "features/toy-smoke/shapes/text/prompts.parquet").exists()
    assert not any("toy-smoke" in str(p.relative_to(reproduced)) for p in (reproduced / "reports").rglob("*"))


def test_second_repro_runs_nothing(reproduced):
    out = run(reproduced, *DVC, "repro").stdout
    assert ran_stages(out) == []
    assert "up to date" in out


def test_every_declared_plot_renders_offline(reproduced, tmp_path):
    """docs/comparing.md: `dvc plots show` works offline. A DVC template plot (a CSV or JSON data file, such as the toy
    model's training log) makes index.html load vega, vega-lite and vega-embed from a CDN, blank without network: every
    declared plot must be an image, embedded from dvc_plots/static."""
    out = tmp_path / "dvc_plots"
    run(reproduced, *DVC, "plots", "show", "-o", str(out))
    html = (out / "index.html").read_text()
    remote = re.findall(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//[^"'\s>]*|url\(\s*["']?(?:https?:)?//[^)]*""", html)
    assert not remote, f"index.html loads from the network: {remote}"
    images = re.findall(r"<img[^>]*\ssrc=\"([^\"]+)\"", html)
    assert any("train_log" in i for i in images) and any("zeroshot" in i for i in images), images
    assert all((out / i).is_file() for i in images)


def test_a_changed_template_reembeds_texts_only(reproduced):
    """The entry conf/dataset/shapes.yaml is a file dependency of its stages (no compose needed): exactly the
    dataset's prepare@ and texts@ are stale (and the code fingerprints, which read each entry's source); prepare's output is unchanged, so no image is embedded again."""
    entry = reproduced / "conf/dataset/shapes.yaml"
    before = entry.read_text()
    try:
        entry.write_text(before.replace("a drawing of a {c}.", "a sketch of a {c}."))
        # code: an entry names its source, so the fingerprints are rewritten (the same bytes: nothing more reruns)
        assert status_stages(reproduced) == {"code", "prepare@shapes", "texts@shapes"}
        out = run(reproduced, *DVC, "repro").stdout
        assert sorted(ran_stages(out)) == ["code", "embed_texts@shapes", "prepare@shapes", "report", "texts@shapes",
                                           "zeroshot@shapes"]
    finally:
        entry.write_text(before)
        run(reproduced, *DVC, "repro")
    assert status_stages(reproduced) == set()


def test_a_suite_change_to_one_entry_reruns_that_datasets_stages_only(reproduced):
    """Issue 40: prepare@, texts@ (and knowledge@) depend on their own `suite.entries.<name>`, not on the whole
    `suite.entries`: a suite's change to hierarchy's templates leaves shapes' stages up to date."""
    suite_file, params = reproduced / "conf/suite/smoke.yaml", reproduced / "params.yaml"
    before = suite_file.read_text()
    try:
        suite = yaml.safe_load(before)
        suite_file.write_text(yaml.safe_dump({**suite, "entries": {"hierarchy": {"texts": {"templates": ["a {c}!"]}}}}))
        run(reproduced, sys.executable, "-m", "vlbench.cli", "compose")
        assert yaml.safe_load(params.read_text())["suite"]["entries"] == {
            "shapes": {}, "hierarchy": {"texts": {"templates": ["a {c}!"]}}}
        # code reads every entry's source (the same bytes: nothing more reruns for it); report's param is the suite
        assert status_stages(reproduced) == {"code", "prepare@hierarchy", "texts@hierarchy", "report"}
        out = run(reproduced, *DVC, "repro").stdout
        assert sorted(ran_stages(out)) == ["code", "embed_texts@hierarchy", "prepare@hierarchy", "report",
                                           "texts@hierarchy", "zeroshot@hierarchy"]
    finally:
        suite_file.write_text(before)
        run(reproduced, sys.executable, "-m", "vlbench.cli", "compose")
        run(reproduced, *DVC, "repro")
    assert status_stages(reproduced) == set()


def test_an_analysis_run_by_hand_refuses_features_of_other_weights(reproduced, tmp_path):
    import open_clip

    from vlbench.models import register_local_configs

    register_local_configs()
    other = tmp_path / "other.pt"
    torch.manual_seed(123)
    torch.save(open_clip.create_model("vlbench-toy").state_dict(), other)
    params = tmp_path / "params.yaml"
    composed = yaml.safe_load((reproduced / "params.yaml").read_text())
    composed["model"]["pretrained"] = str(other)
    params.write_text(yaml.safe_dump(composed))
    proc = run(reproduced, sys.executable, "-m", "stages.analysis", "--analysis", "zeroshot", "--dataset", "shapes",
               "--params", str(params), check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "weights_sha256" in lines[0] and "features/toy-smoke/shapes" in lines[0]


def test_pretrain_writes_its_declared_output_never_the_users_checkpoint(reproduced, tmp_path):
    user_ckpt = tmp_path / "mine.pt"
    user_ckpt.write_bytes(b"my own weights")
    params = tmp_path / "params.yaml"
    composed = yaml.safe_load((reproduced / "params.yaml").read_text())
    composed["model"]["pretrained"] = str(user_ckpt)
    params.write_text(yaml.safe_dump(composed))
    declared = reproduced / "data/models/toy-smoke/checkpoint.pt"
    declared.unlink()
    run(reproduced, sys.executable, "-m", "stages.pretrain", "--model", "toy-smoke", "--params", str(params))
    assert user_ckpt.read_bytes() == b"my own weights"
    assert declared.is_file()
    assert status_stages(reproduced) == set()  # the same seed wrote the same checkpoint


def test_a_dataset_key_that_is_a_path_is_refused_and_touches_nothing(reproduced, tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("precious")
    proc = run(reproduced, sys.executable, "-m", "stages.prepare", "--dataset", str(victim), check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: dataset name {str(victim)!r} is not allowed: use letters, digits, '-' and '_' (it becomes a folder name)"]
    assert (victim / "keep.txt").read_text() == "precious"


def test_exp_run_with_another_model_is_listed_diffable_and_fits_a_terminal(reproduced):
    run(reproduced, *DVC, "exp", "run", "-S", "model=toy-wide-smoke")
    params = yaml.safe_load((reproduced / "params.yaml").read_text())
    assert params["model"]["arch"] == "vlbench-toy-wide" and params["suite"]["slug"] == "smoke"
    assert (reproduced / "features/toy-wide-smoke/shapes/images/test.parquet").exists()
    assert json.loads((reproduced / "reports/model.json").read_text())["model"] == "toy-wide-smoke"
    shown = json.loads(run(reproduced, *DVC, "exp", "show", "--json").stdout)
    assert "toy-wide-smoke" in json.dumps(shown)
    diff = json.loads(run(reproduced, *DVC, "metrics", "diff", "--json").stdout)
    assert set(diff) == {"reports/headline.json"}  # one number per analysis x dataset
    assert "zeroshot.shapes.accuracy" in diff["reports/headline.json"]
    every = json.loads(run(reproduced, *DVC, "metrics", "diff", "--json", "--targets", "reports/metrics.json").stdout)
    assert set(every["reports/metrics.json"]) >= set(diff["reports/headline.json"])  # the smoke suite: one each
    header = run(reproduced, *DVC, "exp", "show", "--only-changed", "--csv").stdout.splitlines()[0].split(",")
    metric_columns = [c for c in header if c.startswith(("zeroshot.", "linear_probe."))]
    assert "zeroshot.shapes.accuracy" in metric_columns and len(metric_columns) <= 3, header
    assert len(header) <= 30, f"{len(header)} columns: {header}"
    everything = run(reproduced, *DVC, "exp", "show", "--no-pager", "--csv").stdout.splitlines()[0].split(",")
    inputs = set(params["suite"]["datasets"].values())  # a generated dataset's input is its generator module
    assert not [c for c in everything if c.startswith(("vlbench/", "stages/")) and c not in inputs], everything


def test_exp_run_with_unknown_model_names_the_known_ones(reproduced):
    proc = run(reproduced, *DVC, "exp", "run", "-S", "model=vitb17", check=False)
    assert proc.returncode != 0
    assert "vitb17" in proc.stderr + proc.stdout and "vitb16" in proc.stderr + proc.stdout


def test_real_models_have_no_pretrain_stage(reproduced):
    repo = reproduced
    params = repo / "params.yaml"
    before = params.read_text()
    try:
        run(repo, sys.executable, "-m", "vlbench.cli", "compose", "model=vitb16")
        stages = run(repo, *DVC, "stage", "list").stdout
        assert "embed_images@shapes" in stages and "pretrain@" not in stages
        run(repo, sys.executable, "-m", "vlbench.cli", "compose", "model=toy-smoke")
        assert "pretrain@toy-smoke" in run(repo, *DVC, "stage", "list").stdout
    finally:
        params.write_text(before)


# docs/architecture.md, "Edit this -> these stages rerun", on the smoke suite (shapes, hierarchy; toy-smoke)
EVERY_STAGE = None  # all of them (but `code`)
RERUNS = {
    "vlbench/config.py": EVERY_STAGE,  # params I/O: every command reads params.yaml through it
    "vlbench/datasets/coco.py": set(),  # a dataset source the suite does not use
    "vlbench/metrics.py": {"zeroshot@shapes", "zeroshot@hierarchy", "linear_probe@shapes", "report"},
    "vlbench/analyses/linear_probe.py": {"linear_probe@shapes"},  # one analysis: its stages
    "vlbench/report/html.py": {"report"},
}


def test_an_edit_reruns_only_the_stages_whose_command_runs_it(reproduced):
    """Each row: append a comment to the module, rerun the fingerprints (`dvc repro -s code`), and `dvc status` lists
    exactly the stages whose command can run the module; undone, nothing is stale."""
    run(reproduced, "git", "checkout", "-q", "--", ".")  # the committed toy-smoke results (an earlier test's
    run(reproduced, *DVC, "checkout", "-q")               # `dvc exp run` may have left another model's)
    assert status_stages(reproduced) == set()
    every = set(run(reproduced, *DVC, "stage", "list", "--name-only").stdout.split()) - {"code"}
    for name, expected in RERUNS.items():
        path = reproduced / name
        before = path.read_text()
        try:
            path.write_text(before + "\n# an edit\n")
            run(reproduced, *DVC, "repro", "-s", "code")
            assert status_stages(reproduced) == (every if expected is EVERY_STAGE else expected), name
        finally:
            path.write_text(before)
            run(reproduced, *DVC, "repro", "-s", "code")
        assert status_stages(reproduced) == set(), name


def test_robustness_stage_scores_a_shift_against_the_reference_zeroshot_result(reproduced):
    """Last in this file (it recomposes the repository's params): the smoke suite plus a tiny outline shift;
    `dvc repro robustness@shapes_outline` runs only what it lacks and its numbers agree with the files it read."""
    from tests.pipeline_repo import SMOKE_SUITE, synthetic_entry, write_suite

    run(reproduced, "git", "checkout", "-q", "--", ".")  # the committed toy-smoke results (an earlier test's
    run(reproduced, *DVC, "checkout", "-q")               # `dvc exp run` may have left another model's in the workspace)
    outline = synthetic_entry("shapes_outline", {"test": 24}, ["a {c}."])
    suite = {**SMOKE_SUITE, "slug": "rob", "datasets": {**SMOKE_SUITE["datasets"], "shapes_outline": outline},
             "embed_images": [*SMOKE_SUITE["embed"], "shapes_outline"], "robustness": ["shapes_outline"]}
    write_suite(reproduced, suite, "rob")
    run(reproduced, sys.executable, "-m", "vlbench.cli", "compose", "suite=rob")
    out = run(reproduced, *DVC, "repro", "robustness@shapes_outline").stdout
    assert sorted(ran_stages(out)) == ["code", "embed_images@shapes_outline", "prepare@shapes_outline",
                                       "robustness@shapes_outline"]  # code: a new dataset, a new fingerprint
    doc = json.loads((reproduced / "reports/robustness/shapes_outline.json").read_text())
    zeroshot = json.loads((reproduced / "reports/zeroshot/shapes.json").read_text())
    preds = pq.read_table(reproduced / "reports/robustness/shapes_outline.predictions.parquet").to_pylist()
    assert doc["metrics"]["reference_accuracy"] == zeroshot["metrics"]["accuracy"]
    assert doc["metrics"]["accuracy"] == pytest.approx(sum(p["correct"] for p in preds) / len(preds))
    assert all(p["correct"] == (p["predicted_reference_class"] == p["label"]) for p in preds)  # the same 12 classes
    x, y = doc["metrics"]["reference_accuracy"], doc["metrics"]["accuracy"]
    assert doc["metrics"]["effective_robustness"] == pytest.approx(y - x)  # the identity line (y = x)
    assert doc["counts"]["samples"] == 24 and not (reproduced / "features/toy-smoke/shapes_outline/text").exists()


def test_a_copy_of_the_shared_smoke_run_is_its_own(smoke_run, tmp_path):
    """What a module does to its copy of the session's smoke run (tests/conftest.py) never reaches another copy: a
    tracked file appended to in place, a DVC output rewritten in place, a commit. The shared run itself is checked at
    the session's end (tree_state)."""
    first = smoke_run(tmp_path / "first")
    head = run(first, "git", "rev-parse", "HEAD").stdout
    code, output = first / "vlbench/stats.py", first / "reports/zeroshot/shapes.json"
    text, result = code.read_text(), output.read_bytes()
    with code.open("a") as f:
        f.write("\n# an edit\n")
    with output.open("r+b") as f:
        f.write(b"X")
    run(first, "git", "commit", "-qam", "an edit")
    second = smoke_run(tmp_path / "second")
    assert (second / "vlbench/stats.py").read_text() == text
    assert (second / "reports/zeroshot/shapes.json").read_bytes() == result
    assert run(second, "git", "rev-parse", "HEAD").stdout == head
    assert run(second, "git", "status", "--porcelain").stdout == ""
    assert status_stages(second) == set()


def test_tree_state_sees_a_file_rewritten_in_place_with_its_size_unchanged(tmp_path):
    from tests.pipeline_repo import tree_state

    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub/file"
    path.write_bytes(b"ab")
    os.utime(path, ns=(10**9, 10**9))  # a write now cannot give the same time
    before = tree_state(tmp_path)
    path.write_bytes(b"ba")
    assert tree_state(tmp_path) != before and set(before) == {os.path.join("sub", "file")}
