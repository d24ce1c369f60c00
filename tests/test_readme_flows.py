"""The flows of the README and of the docs/ pages it points to (docs/comparing.md, docs/fine-tuning.md,
docs/own-data.md, docs/pipeline.md, docs/real-datasets.md), run as a user runs them, on the demo pipeline's own outputs
(issue 30, "The rule this issue adds"; DESIGN.md, "Every README flow runs on the demo's own outputs in a test").

The flows run on a copy of the session's miniature demo (tests/conftest.py, `flows_demo`; built once per test run by
tests/pipeline_repo.py, make_flows_demo): the session's smoke run given a miniature demo suite whose analyses write
every kind of per-sample file the demo writes (zero-shot on a single- and a multi-label dataset, linear probe,
robustness, retrieval, compositionality, adapt's ELEVATER and FewTrans tables) with a few-step toy model, `dvc repro`
once and committed (HEAD~1), then docs/pipeline.md's experiment `dvc exp run -n a -S zeroshot.scoring=elevater`
committed (HEAD): two commits and an experiment of real results, shared by every flow below, each run with the command
the README or its docs/ page shows. The fine-tuning and own-data flows are in tests/test_readme_flows_finetune.py (a
module of its own, so that the two halves run on both xdist workers). A flow tested only on constructed files is not
tested: add the test of a new command of the README or docs/ here or there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.pipeline_repo import run
from tests.test_byo_pipeline import PETS, SUITE, XRAY, own_data

DVC = (sys.executable, "-m", "dvc")
VLBENCH = (sys.executable, "-m", "vlbench.cli")


def vlbench(repo: Path, *args: str, check: bool = True):
    return run(repo, *VLBENCH, *args, check=check)


def restore(repo: Path) -> None:
    """Back to HEAD's files and outputs after a flow that ran `dvc exp run` in the workspace."""
    run(repo, "git", "checkout", "-q", "--", ".")
    run(repo, "git", "clean", "-qfd", "--", "conf", "reports")
    run(repo, *DVC, "checkout", "-q", "--force")


@pytest.fixture(scope="module")
def demo(flows_demo, tmp_path_factory) -> Path:
    """This module's copy of the session's miniature demo (tests/conftest.py, `flows_demo`; tests/pipeline_repo.py,
    make_flows_demo): its results committed (HEAD~1), then docs/pipeline.md's `dvc exp run -n a -S
    zeroshot.scoring=elevater`, applied and committed with the same setting in conf/ (HEAD)."""
    return flows_demo(tmp_path_factory.mktemp("flows") / "repo")


def rows(data: dict) -> dict[tuple[str, str, str], dict]:
    return {(r["analysis"], r["dataset"], r["metric"]): r for r in data["rows"]}


# ------------------------------------------------------------------------------------------ vlbench compare


def test_every_per_sample_file_the_demo_writes_is_declared(demo):
    """Each reports/<analysis>/<dataset>.<table>.parquet the pipeline wrote is a table its ANALYSES row declares,
    with the columns that name its units (so compare never meets a file it does not know); a paired table has every
    declared column but on multi-label data (zero-shot's `labels`), where compare says why it does not pair."""
    import pyarrow.parquet as pq

    from vlbench.analyses import ANALYSES

    written = sorted((demo / "reports").glob("*/*.parquet"))
    assert {p.parent.name for p in written} >= {"zeroshot", "linear_probe", "robustness", "retrieval",
                                                 "compositionality", "adapt"}
    for path in written:
        dataset, table = path.name.split(".")[:2]
        variants = [t for t in ANALYSES[path.parent.name].tables if t.name == table]
        assert variants, f"{path.relative_to(demo)}: not declared in ANALYSES[{path.parent.name!r}].tables"
        names = pq.read_schema(path).names
        if names[0].endswith("_not_run"):  # a protocol that did not run (adapt's vtab here)
            continue
        # a table name may be declared once per metric family (zero-shot's predictions: per image, per instance for
        # WinoGAViL): the file must carry the columns of every declaration that covers a metric of its result
        reported = set(json.loads((path.parent / f"{dataset}.json").read_text())["metrics"])
        for declared in [t for t in variants if reported & set(t.metrics)] or variants:
            assert set(declared.key) <= set(names), path
            if declared.statistic and "labels" not in names:
                assert set(declared.columns()) <= set(names), (path, declared.metrics)


def test_compare_two_commits_pairs_every_declared_metric_on_the_demo_outputs(demo):
    """README and docs/comparing.md: `vlbench compare HEAD~1 HEAD` (issue 30, defect 1: it ended in ArrowInvalid on
    these files)."""
    proc = vlbench(demo, "compare", "HEAD~1", "HEAD", "--json")
    data = json.loads(proc.stdout)
    heads = [run(demo, "git", "rev-parse", r).stdout.strip() for r in ("HEAD~1", "HEAD")]
    assert [e["rev"] for e in data["experiments"]] == heads
    found = rows(data)
    paired = {("zeroshot", "shapes", "accuracy"): ("image", 36, "mcnemar"),
              ("linear_probe", "shapes", "accuracy"): ("image", 36, "mcnemar"),
              ("robustness", "shapes_outline", "accuracy"): ("image", 24, "mcnemar"),
              ("compositionality", "compositional", "swap_att"): ("trial", 12, "mcnemar"),
              ("compositionality", "compositional", "mean"): ("trial", 36, "bootstrap"),  # over its categories
              ("retrieval", "captions", "i2t_r1"): ("image", 24, "mcnemar"),
              ("retrieval", "captions", "t2i_r1"): ("image", 24, "bootstrap"),  # captions clustered by image
              ("adapt", "shapes", "elevater/random_2p/2/last"): ("image", 36, "mcnemar")}  # one seed: its images
    for key, (unit, n, test) in paired.items():
        d = found[key]["differences"][0]
        assert (d["paired"], d["unit"], d["n"], d["test"], d["unpaired_reason"]) == (True, unit, n, test, None), key
        values = found[key]["values"]
        assert d["delta"] == pytest.approx(values["HEAD"]["value"] - values["HEAD~1"]["value"])
        assert 0 <= d["p"] <= d["p_adjusted"] <= 1 and d["low"] <= d["delta"] <= d["high"]
    assert found[("zeroshot", "shapes", "accuracy")]["differences"][0]["p_mcnemar"] == 1.0  # same predictions
    episodes = found[("adapt", "shapes", "fewtrans/base/prototype")]["differences"][0]
    assert (episodes["paired"], episodes["unit"], episodes["test"]) == (True, "episode", "t")
    # HEAD~1 scored the multi-label dataset on logits, HEAD on their softmax with ELEVATER's conventions
    assert found[("zeroshot", "hierarchy", "map_11point")]["differences"][0]["paired"] is True
    unpaired = {("robustness", "shapes_outline", "effective_robustness"): "robustness declares no per-sample table"}
    for key, reason in unpaired.items():
        d = found[key]["differences"][0]
        assert d["paired"] is False and d["p"] is None and reason in d["unpaired_reason"], (key, d)
    assert data["correction"]["method"] == "holm" and "leaderboard" not in data


def test_compare_prints_a_table_and_writes_its_page_outside_git(demo):
    proc = vlbench(demo, "compare", "HEAD~1", "HEAD")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("zeroshot/shapes/accuracy "))
    assert "HEAD-HEAD~1 +0.0000" in line and "(unpaired)" not in line and "(mcnemar)" in line
    effective = next(x for x in proc.stdout.splitlines() if x.startswith("robustness/shapes_outline/effective_rob"))
    assert "(not tested: unpaired)" in effective
    page = (demo / "reports/compare/index.html").read_text()  # the page: the unit paired, or why not
    assert "n = 36 images, paired" in page and "declares no per-sample table for" in page
    assert run(demo, "git", "status", "--porcelain").stdout == ""  # reports/compare/ is git-ignored


def test_compare_refuses_bad_revisions_and_outputs_in_one_line(demo):
    for args, message in ((("HEAD^{tree}", "HEAD"), "Error: revision 'HEAD^{tree}' is a tree ("),
                          (("HEAD:README.md", "HEAD"), "Error: revision 'HEAD:README.md' is a blob ("),
                          (("HEAD~1", "HEAD", "--out", "README.md"),
                           "Invalid value for --out: README.md is a file; --out names the folder")):
        proc = vlbench(demo, "compare", *args, check=False)
        assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_compare_two_experiments_by_name(demo):
    """docs/comparing.md: `dvc exp run -n a -S zeroshot.scoring=elevater` (the fixture ran it), then `vlbench compare
    HEAD a` and `--json`."""
    text = vlbench(demo, "compare", "HEAD", "a").stdout
    assert text.splitlines()[0].split()[:3] == ["analysis/dataset/metric", "HEAD", "a"]
    data = json.loads(vlbench(demo, "compare", "HEAD~1", "a", "--json").stdout)
    assert [e["name"] for e in data["experiments"]] == ["HEAD~1", "a"]
    heads = [run(demo, "git", "rev-parse", r).stdout.strip() for r in ("HEAD~1", "HEAD")]
    assert data["experiments"][0]["rev"] == heads[0] and len(data["experiments"][1]["rev"]) == 40
    assert data["experiments"][1]["rev"] not in heads  # the experiment's own commit
    found = rows(data)
    same = found[("zeroshot", "shapes", "accuracy")]["differences"][0]
    assert (same["paired"], same["delta"], same["p_mcnemar"], same["n"]) == (True, 0.0, 1.0, 36)  # softmax: same argmax
    robust = found[("robustness", "shapes_outline", "accuracy")]["differences"][0]
    assert robust["paired"] and robust["unit"] == "image" and robust["n"] == 24


def test_compare_refuses_runs_on_different_samples_by_name(demo):
    """An experiment that scored another test set (here fewer outline images) is refused, naming the table."""
    entry = demo / "conf/dataset/shapes_outline.yaml"
    try:
        entry.write_text(entry.read_text().replace("test: 24", "test: 20"))
        run(demo, *DVC, "exp", "run", "-n", "fewer")
        proc = vlbench(demo, "compare", "HEAD", "fewer", check=False)
    finally:
        restore(demo)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1
    assert ("Error: reports/robustness/shapes_outline.predictions.parquet: HEAD and fewer scored different images "
            "(sample_id differ: 24 against 20, e.g. [") in proc.stderr


# README / docs/benchmarks.md, "Reading `dvc exp show`": what differs between runs, without the dependency columns
READABLE_EXP_SHOW = ("--only-changed", "--drop", "Created|.*/.*")


def flat_keys(tree: dict, prefix: str = "") -> set[str]:
    """`a.b.c` for every leaf of a nested mapping (how `dvc exp show` names params and metrics)."""
    keys = set()
    for key, value in tree.items():
        keys |= flat_keys(value, f"{prefix}{key}.") if isinstance(value, dict) and value else {f"{prefix}{key}"}
    return keys


def check_readable_exp_show(readable: str, everything: str, runs: list[list[str]]) -> None:
    """The readable `dvc exp show` of HEAD and the `wide` experiment (`runs`: each one's params.yaml and headline.json):
    the params that differ (the model entry) and the headline numbers that differ; no dependency column (99 of the
    demo's 185), no timestamp."""
    import csv

    import yaml

    header, *table = list(csv.reader(readable.splitlines()))
    assert header[:3] == ["Experiment", "rev", "typ"] and "Created" not in header
    columns = set(header[3:])
    params = set().union(*(flat_keys(yaml.safe_load(p)) for p, _ in runs))
    metrics = set().union(*(flat_keys(json.loads(m)) for _, m in runs))
    assert {"model.slug", "model.arch"} <= columns <= params | metrics
    assert columns & metrics  # the toy-wide model's numbers differ from the toy's
    assert not any("/" in c for c in columns)
    rows = [dict(zip(header, row)) for row in table]
    head = next(r for r in rows if r["typ"] == "baseline" and r["rev"] != "workspace")
    assert head["model.slug"] == "toy-smoke"
    assert next(r for r in rows if r["Experiment"] == "wide")["model.slug"] == "toy-wide-smoke"
    assert len(columns) * 4 < len(everything.splitlines()[0].split(","))


def test_a_sweep_of_three_experiments_gets_a_leaderboard(demo):
    """docs/comparing.md ("A sweep and its leaderboard"): `dvc exp run -n wide -S model=toy-wide-smoke` beside the two
    commits, then `vlbench compare HEAD~1 HEAD wide` (three experiments: a leaderboard, ranks with bootstrap rank
    intervals) and its page."""
    try:
        run(demo, *DVC, "exp", "run", "-n", "wide", "-S", "model=toy-wide-smoke")
        data = json.loads(vlbench(demo, "compare", "HEAD~1", "HEAD", "wide", "--json").stdout)
        text = vlbench(demo, "compare", "HEAD~1", "HEAD", "wide", "--correction", "bh").stdout
        readable = run(demo, *DVC, "exp", "show", "--no-pager", "--csv", *READABLE_EXP_SHOW).stdout
        everything = run(demo, *DVC, "exp", "show", "--no-pager", "--csv").stdout
        wide = [(demo / name).read_text() for name in ("params.yaml", "reports/headline.json")]
    finally:
        restore(demo)
    head = [(demo / name).read_text() for name in ("params.yaml", "reports/headline.json")]
    check_readable_exp_show(readable, everything, [head, wide])
    board = data["leaderboard"]
    assert [(r["experiment"], r["model"]) for r in board["rows"]] == [
        ("HEAD~1", "toy-smoke"), ("HEAD", "toy-smoke"), ("wide", "toy-wide-smoke")]
    ids = [c["id"] for c in board["columns"]]
    assert {"zeroshot/shapes/accuracy", "linear_probe/shapes/accuracy", "retrieval/captions/i2t_r1"} <= set(ids)
    assert any(i.startswith("adapt/shapes/") for i in ids)
    for r in board["rows"]:
        assert set(r["cells"]) == set(ids)  # every experiment has every column
    zs = {r["experiment"]: r["cells"]["zeroshot/shapes/accuracy"] for r in board["rows"]}
    assert all(c["rank_low"] <= c["rank_by_value"] <= c["rank_high"] and c["rank"] <= c["rank_by_value"]
               for c in zs.values())
    assert zs["HEAD"]["value"] == zs["HEAD~1"]["value"] and zs["HEAD"]["rank"] == zs["HEAD~1"]["rank"]  # a tie
    assert board["published"] == [] and not any("verdict" in c for r in board["rows"] for c in r["cells"].values())
    assert text.splitlines()[0].split()[:2] == ["experiment", "model"] and "\nwide " in text
    page = (demo / "reports/compare/index.html").read_text()
    assert '<table class="sortable leaderboard">' in page and "<script>" in page


# ---------------------------------------------------------------------------------------- plan and reference


def test_plan_on_the_reproduced_demo_lists_what_an_override_reruns(demo):
    """docs/real-datasets.md ("Before a big run"): `vlbench plan -S ...` runs nothing and lists the stages `dvc exp run
    -S ...` would run."""
    plan = json.loads(vlbench(demo, "plan", "--json", "--no-warmup").stdout)
    assert (plan["model"], plan["suite"]) == ("toy-smoke", "flows")
    assert {r["status"] for r in plan["stages"]} == {"up to date"}
    plan = json.loads(vlbench(demo, "plan", "-S", "zeroshot.scoring=logits", "--json", "--no-warmup").stdout)
    stale = {r["name"] for r in plan["stages"] if r["status"] != "up to date"}
    assert {"zeroshot@shapes", "zeroshot@hierarchy"} <= stale and not any(s.startswith("embed") for s in stale)
    assert run(demo, "git", "status", "--porcelain").stdout == ""  # params.yaml untouched


def test_reference_lists_the_tables_and_the_demo_says_none_applies(demo):
    """docs/comparing.md ("Reference numbers"): `vlbench reference [--paper P] [--json]`; after `report`,
    reports/reference.json."""
    tables = json.loads(vlbench(demo, "reference", "--json").stdout)["tables"]
    assert {"elevater", "open_clip"} <= {t["paper"] for t in tables} and all(t["rows"] for t in tables)
    assert "ELEVATER" in vlbench(demo, "reference", "--paper", "elevater").stdout.upper()
    verdicts = json.loads((demo / "reports/reference.json").read_text())
    assert verdicts["applies"] is False and "toy-smoke" in verdicts["reason"]


# ---------------------------------------------------------------------------- the house: layers, generated stages


def stale_stages(repo: Path) -> set[str]:
    return set(json.loads(run(repo, *DVC, "status", "--json").stdout))


def test_an_edit_reruns_the_stages_whose_layer_imports_it_and_no_costly_stage(demo):
    """Code dependencies per stage (vlbench.pipeline): after an edit of the statistics module, `dvc repro code`
    leaves every analysis stage stale and no embedding or pre-training stage; after an edit of the toy model's
    training, pre-training is stale and no analysis is."""
    def reset() -> None:
        run(demo, "git", "reset", "-q", "--hard")  # dvc.lock was staged by `dvc repro` (core.autostage)
        restore(demo)

    try:
        for module, stale, fresh in (
                ("vlbench/stats.py", {"zeroshot@shapes", "linear_probe@shapes", "retrieval@captions", "report"},
                 {"embed_images@shapes", "embed_texts@shapes", "pretrain@toy-smoke", "prepare@shapes"}),
                ("vlbench/models/toy.py", {"pretrain@toy-smoke"},
                 {"zeroshot@shapes", "embed_images@shapes", "embed_texts@shapes", "report"})):
            reset()
            with (demo / module).open("a") as f:
                f.write("\n# an edit\n")
            assert stale_stages(demo) == {"code"}  # DVC sees the folder change; the fingerprints are not known yet
            run(demo, *DVC, "repro", "code")
            found = stale_stages(demo)
            assert stale <= found and not fresh & found, (module, sorted(found))
    finally:
        reset()


def test_exp_run_reaches_a_deep_setting_and_reruns_only_its_stages(demo):
    """`dvc exp run -S +adapt.elevater.final_epochs=3` (docs/pipeline.md, "params.yaml, `vlbench compose` and
    settings"): the setting lands in params.yaml and only adapt@ and the report re-run; the embedding, the other
    analyses and pre-training do not."""
    try:
        proc = run(demo, *DVC, "exp", "run", "-n", "deep", "-S", "+adapt.elevater.final_epochs=3")
        ran = {line.split("'")[1] for line in proc.stdout.splitlines() if line.startswith("Running stage")}
        assert ran == {"adapt@shapes", "report"}, sorted(ran)
        assert "final_epochs: 3" in (demo / "params.yaml").read_text()
    finally:
        restore(demo)


FEATURE_NORM = '''"""The mean norm of a dataset's image features: an analysis added through its four places (a test's)."""

import numpy as np

from vlbench.results import Result


def run(inputs, cfg, seed):
    norms = np.linalg.norm(inputs.images(cfg["split"]).embeddings.astype(np.float64), axis=1)
    return Result({"mean_norm": float(norms.mean())}, {"images": len(norms)}, dict(cfg))
'''
FEATURE_NORM_CHART = '''"""The feature-norm analysis's chart (a test's): a bar chart drawn by a function of its own."""

from pathlib import Path

from vlbench.report.plots import write_plots


def chart(analysis, results, metrics, out_dir):
    return write_plots({analysis: metrics.get(analysis) or {}}, Path(out_dir))
'''
FEATURE_NORM_ROW = ('    Analysis("feature_norm", "vlbench.analyses.feature_norm", "Image feature norms",\n'
                    '             reads=("prepared", "features")),\n')


def test_an_analysis_added_in_its_four_places_runs_reports_and_charts(demo, tmp_path):
    """docs/architecture.md's four places: the module, its ANALYSES row, its chart, its config section; then
    `vlbench compose` writes its stage and `dvc repro` runs it (and the analyses, whose command reads the table), not the
    embedding; its number reaches reports/headline.json, the page and a chart."""
    import numpy as np
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(demo, repo, symlinks=True)
    (repo / "vlbench/analyses/feature_norm.py").write_text(FEATURE_NORM)  # 1. the module
    table = repo / "vlbench/analyses/__init__.py"
    head = "ANALYSES = {a.name: a for a in (\n"
    table.write_text(table.read_text().replace(head, head + FEATURE_NORM_ROW))  # 2. the row
    (repo / "vlbench/report/feature_norm.py").write_text(FEATURE_NORM_CHART)  # 3. its chart, in the report's registry
    registry = repo / "vlbench/report/registry.py"
    text = registry.read_text().replace("from vlbench.report import ", "from vlbench.report import feature_norm, ", 1)
    head = "CHARTS: dict[str, tuple[Chart, ...]] = {\n"
    registry.write_text(text.replace(head, head + '    "feature_norm": (feature_norm.chart,),\n', 1))
    (repo / "conf/settings/feature_norm.yaml").write_text("split: test\n")  # 4. its config section: defaults,
    config = repo / "conf/config.yaml"  # its (empty) params section and the suite's list
    text = config.read_text().replace("  finetune: []", "  feature_norm: []\n  finetune: []", 1)
    config.write_text(text + "\nfeature_norm: {}\n")
    suite = repo / "conf/suite/flows.yaml"  # the user's suite runs it on shapes
    suite.write_text(suite.read_text() + "feature_norm: [shapes]\n")
    vlbench(repo, "compose")
    assert "  feature_norm:\n    foreach: ${suite.feature_norm}" in (repo / "dvc.yaml").read_text()
    ran = {line.split("'")[1] for line in run(repo, *DVC, "repro").stdout.splitlines()
           if line.startswith("Running stage")}
    assert {"code", "feature_norm@shapes", "zeroshot@shapes", "report"} <= ran
    assert not {s for s in ran if s.startswith(("embed_", "pretrain", "prepare", "texts"))}, sorted(ran)
    features = pq.read_table(repo / "features/toy-smoke/shapes/images/test.parquet")
    vectors = np.array(features.column("embedding").to_pylist(), dtype=np.float64)
    result = json.loads((repo / "reports/feature_norm/shapes.json").read_text())
    assert result["metrics"]["mean_norm"] == pytest.approx(np.linalg.norm(vectors, axis=1).mean(), rel=1e-6)
    headline = json.loads((repo / "reports/headline.json").read_text())
    assert headline["feature_norm"] == {"shapes": {"mean_norm": result["metrics"]["mean_norm"]}}
    assert "Image feature norms" in (repo / "reports/index.html").read_text()
    assert (repo / "reports/plots/feature_norm.svg").is_file()
