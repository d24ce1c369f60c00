"""A dataset's headline is the metric its registry entry declares (issues 44.3 and 42.0): reports/headline.json, the
page's matrix and the leaderboard (`vlbench compare --leaderboard`), for an entry of your own with `metric:
mean_per_class` and for DataComp runs made of published rows of open_clip's table (39 cells each, the published
number beside each, every one reproduced)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from vlbench.compare_runs import Experiment, compare
from vlbench.leaderboard import experiment_cells, format_leaderboard
from vlbench.reference import load_tables
from vlbench.reference.datacomp import AVERAGE, TASKS, place, run_numbers
from vlbench.report.aggregate import declared_metrics, write_report
from vlbench.results import Result, write_result


def interval(value: float) -> dict:
    return {"low": value - 0.02, "high": value + 0.02, "level": 0.95, "method": "bootstrap", "resamples": 2000,
            "seed": 0}


def test_an_entry_declaring_mean_per_class_has_it_as_its_headline(tmp_path, monkeypatch):
    """Zero-shot reports the dataset's metric and top-1 accuracy (here accuracy first, so no order decides): the
    headline, the page's cell and the leaderboard's column are mean-per-class; the linear probe's too."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf" / "dataset").mkdir(parents=True)
    (tmp_path / "conf" / "config.yaml").write_text("defaults: []\n")
    entry = {"prepare": {"source": "imagefolder", "root": "data/mine", "metric": "mean_per_class"},
             "input": "data/mine", "texts": {"templates": ["a photo of a {c}."]}}
    (tmp_path / "conf" / "dataset" / "mine.yaml").write_text(yaml.safe_dump(entry))
    params = {"suite": {"slug": "mine", "datasets": {"mine": "data/mine"}}}
    declared = declared_metrics(params)
    assert declared == {"mine": "mean_per_class"}
    write_result("zeroshot", "mine", Result({"accuracy": 0.70, "mean_per_class": 0.61}, {"samples": 10}, {},
                                            intervals={"accuracy": interval(0.70), "mean_per_class": interval(0.61)}),
                 {"model": "m"})
    write_result("linear_probe", "mine", Result({"mean_per_class": 0.55}, {"test": 10}, {}), {"model": "m"})
    write_report({"zeroshot": ["mine"], "linear_probe": ["mine"]}, {"model": "m", "suite": "mine"}, declared)
    headline = json.loads(Path("reports/headline.json").read_text())
    assert headline == {"zeroshot": {"mine": {"mean_per_class": 0.61}},
                        "linear_probe": {"mine": {"mean_per_class": 0.55}}}
    page = Path("reports/index.html").read_text()
    assert 'data-analysis="zeroshot" data-dataset="mine" data-metric="mean_per_class" data-value="0.61"' in page
    docs = {(a, "mine"): json.loads(Path(f"reports/{a}/mine.json").read_text()) for a in ("zeroshot", "linear_probe")}
    cells, _, _ = experiment_cells(docs)
    assert cells[("zeroshot", "mine", "mean_per_class")] == {"value": 0.61, "low": 0.59, "high": 0.63}
    assert set(cells) == {("zeroshot", "mine", "mean_per_class"), ("linear_probe", "mine", "mean_per_class")}


def published_row(model: str) -> dict[str, float]:
    (table,) = [t for t in load_tables("open_clip") if t.file == "open_clip_datacomp.json"]
    return {r.column: r.value for r in table.rows if r.model == model}


def datacomp_run(name: str, model: str) -> Experiment:
    """A `datacomp` run whose 38 numbers are the model's published ones, its result files as the analyses write
    them: zero-shot reports top-1 accuracy beside a task's other main metric (first, so no order decides),
    retrieval i2t and t2i recall, whose mean is DataComp's mean recall@1."""
    published = published_row(model)
    results = {}
    for column, t in TASKS.items():
        value = published[column]
        if t["analysis"] == "retrieval":
            metrics = {"i2t_r1": value + 0.01, "i2t_r5": 0.99, "t2i_r1": value - 0.01, "t2i_r5": 0.98}
        elif t["metric"] in ("accuracy", "winogavil_jaccard"):
            metrics = {t["metric"]: value}
        else:
            metrics = {"accuracy": min(1.0, value + 0.05), t["metric"]: value}
        results[(t["analysis"], t["entry"])] = {"metrics": metrics, "params": {"split": "test"},
                                                "fingerprint": {"model": model}}
    return Experiment(name, name * 8, results)


def test_datacomp_runs_of_published_rows_get_39_cells_in_each_tasks_metric_all_reproduced():
    models = {"mine": "dfn-vitl14", "theirs": "vitb32"}
    board = compare([datacomp_run(n, m) for n, m in models.items()], leaderboard=True)["leaderboard"]
    ids = [c["id"] for c in board["columns"]]
    assert len(ids) == 39
    expected = {f"{t['analysis']}/{t['entry']}/{t['metric']}": column for column, t in TASKS.items()}
    expected["datacomp/average/mean_of_38"] = AVERAGE
    assert set(ids) == set(expected)
    # the ten tasks whose main metric is not top-1 accuracy (issue 42.0)
    assert {i for i in ids if not i.endswith(("/accuracy", "/mean_of_38"))} == {
        "zeroshot/wds-vtab-caltech101/mean_per_class", "zeroshot/wds-fgvc_aircraft/mean_per_class",
        "zeroshot/wds-vtab-flowers/mean_per_class", "zeroshot/wds-vtab-pets/mean_per_class",
        "retrieval/wds-flickr30k/mean_recall_at_1", "retrieval/wds-mscoco/mean_recall_at_1",
        "zeroshot/wds-winogavil/winogavil_jaccard", "zeroshot/wds-wilds-iwildcam/f1_macro",
        "zeroshot/wds-wilds-fmow/worst_group_accuracy", "zeroshot/wds-dollar_street/worst_group_top5",
        "zeroshot/wds-geode/worst_group_accuracy"}
    for row in board["rows"]:
        published = published_row(models[row["experiment"]])
        assert set(row["cells"]) == set(ids)
        for i, cell in row["cells"].items():
            assert cell["verdict"] == "reproduced", (row["experiment"], i)
            assert cell["published"] == pytest.approx(published[expected[i]]), (row["experiment"], i)
            # the average: the mean of the 38 published (rounded) numbers, against the published average
            tolerance = 5e-4 if expected[i] == AVERAGE else 1e-9
            assert cell["value"] == pytest.approx(published[expected[i]], abs=tolerance), (row["experiment"], i)
    text = format_leaderboard(board)
    assert all(line.count("reproduced") == 39 for line in text.splitlines()[1:3])
    # open_clip's placement takes the same numbers
    cells, metrics, _ = experiment_cells(datacomp_run("mine", "dfn-vitl14").results)
    placed = place(run_numbers(metrics))
    assert len(placed) == 39
    for i, column in expected.items():
        key = next(k for k in cells if "/".join(k) == i)
        assert placed[column]["value"] == pytest.approx(cells[key]["value"]), i
