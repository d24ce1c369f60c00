"""open_clip's results table as DataComp's 38 tasks: a verdict in every cell of a datacomp run, the placement of a
model without a row among the published models, and the reference files the tool writes."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from vlbench.cli import main
from vlbench.reference import load_tables
from vlbench.reference.verdicts import reference_report
from vlbench.reference.datacomp import (AVERAGE, TASKS, PlacementError, average_interval, load_population, place,
                                        run_numbers)
from vlbench.report.html import index_page

ROOT = Path(__file__).resolve().parents[1]
# ../shared beside the checkout (a helper's worktree: two levels up)
SHARED = next((p / "shared" / "reference" for p in (ROOT.parent, ROOT.parent.parent) if (p / "shared").is_dir()),
              ROOT.parent / "shared" / "reference")
CSV = SHARED / "open_clip" / "openclip_results.csv"
MOBILECLIP2 = SHARED / "mobileclip2"


def datacomp_table():
    (t,) = [t for t in load_tables("open_clip") if t.file == "open_clip_datacomp.json"]
    return t


def run_of(model: str, shift: dict[str, float] | None = None):
    """A datacomp run whose 38 numbers are the model's published ones (plus `shift` per column): metrics, results."""
    shift = shift or {}
    metrics: dict = {}
    results: dict = {}
    for r in datacomp_table().rows:
        if r.model == model and r.dataset != "average":
            metrics.setdefault(r.analysis, {})[r.dataset] = {r.metric: r.value + shift.get(r.column, 0.0)}
            results.setdefault(r.analysis, {})[r.dataset] = {"params": {"split": "test"}}
    return metrics, results


# ---- the table


def test_reference_lists_the_39_columns_of_open_clips_table_for_every_model_with_a_row():
    out = CliRunner().invoke(main, ["reference", "--paper", "open_clip", "--json"])
    assert out.exit_code == 0, out.output
    (t,) = [t for t in json.loads(out.output)["tables"] if t["file"] == "open_clip_datacomp.json"]
    columns = list(dict.fromkeys(r["column"] for r in t["rows"]))
    assert columns == [AVERAGE, *TASKS] and len(columns) == 39
    for model in t["models"]:
        rows = [r for r in t["rows"] if r["model"] == model]
        assert [r["column"] for r in rows] == columns, model
        for r in rows[1:]:  # each task's row names its wds- entry and DataComp's main metric
            assert (r["dataset"], r["metric"]) == (TASKS[r["column"]]["entry"], TASKS[r["column"]]["metric"])
    assert len(t["models"]) == 12 and "vitb32" in t["models"]
    by = {(r["model"], r["column"]): r for r in t["rows"]}
    assert by[("vitb32", "ImageNet 1k")]["value"] == 0.6332 and by[("vitb32", "ImageNet 1k")]["dataset"] == \
        "wds-imagenet1k"
    assert by[("vitb32", "CIFAR-100")]["dataset"] == "wds-vtab-cifar100"
    assert (by[("vitb32", "GeoDE")]["dataset"], by[("vitb32", "MSCOCO")]["dataset"]) == ("wds-geode", "wds-mscoco")
    assert by[("vitb32", "Oxford-IIIT Pet")]["metric"] == "mean_per_class"
    assert by[("vitb32", "Dollar Street")]["metric"] == "worst_group_top5"
    if CSV.is_file():
        header = next(csv.reader(CSV.open()))
        assert columns == header[header.index(AVERAGE):]


def test_models_without_a_row_are_named_in_the_notes():
    notes = " ".join(datacomp_table().notes)
    for slug in ("siglip2-vitb16", "siglip2-vitl16", "siglip2-so400m", "metaclip2-vith14", "pe-core-vitb16",
                 "pe-core-vitl14", "mobileclip2-s0", "mobileclip2-b", "mobileclip2-l14"):
        assert f"{slug}: " in notes or f"for {slug}" in notes, slug
    text = CliRunner().invoke(main, ["reference", "--paper", "open_clip"]).output
    assert "note: metaclip2-vith14: MetaCLIP 2 worldwide H/14" in text
    assert "prints only CVQA-LOCAL zero-shot accuracy for it, a task vlbench does not run: no published number is " \
        "compared" in text


@pytest.mark.skipif(not CSV.is_file() or not MOBILECLIP2.is_dir(), reason="the published files are not beside the checkout")
def test_the_tool_writes_the_committed_files(tmp_path):
    (tmp_path / "data").mkdir()
    subprocess.run([sys.executable, "tools/openclip_reference.py", str(CSV), "--mobileclip2", str(MOBILECLIP2),
                    "--out", str(tmp_path / "data" / "open_clip_results.json"), "--out-dir", str(tmp_path)],
                   cwd=ROOT, check=True, capture_output=True)
    for name in ("data/open_clip_results.json", "data/open_clip_datacomp.json", "data/pe_core.json",
                 "data/siglip2_readme.json",
                 "data/mobileclip2_results.json", "openclip_population.json"):
        assert (tmp_path / name).read_text() == (ROOT / "vlbench/reference" / name).read_text(), name


@pytest.mark.skipif(not CSV.is_file(), reason="open_clip's results table is not beside the checkout")
def test_the_population_is_every_row_of_the_csv():
    records = list(csv.DictReader(CSV.open()))
    population = load_population()
    assert len(population["models"]) == len(records) == 121
    for m, r in zip(population["models"], records):
        assert (m["name"], m["pretrained"]) == (r["name"], r["pretrained"])
        assert m["values"] == {c: float(r[c]) for c in population["columns"]}
        # the average is DataComp's: the plain mean of the 38 (within the printed fourth decimals' rounding)
        assert abs(sum(m["values"][c] for c in TASKS) / 38 - m["values"][AVERAGE]) <= 0.0001


def test_mobileclip2_and_pe_rows_name_the_datacomp_entries():
    (mc,) = load_tables("mobileclip2")
    assert {r.model for r in mc.rows} == {"mobileclip2-s0", "mobileclip2-b", "mobileclip2-l14"}
    assert all(sum(r.model == m for r in mc.rows) == 38 for m in {r.model for r in mc.rows})
    by = {(r.model, r.column): r for r in mc.rows}
    assert by[("mobileclip2-b", "ImageNet 1k")].value == 0.79414  # results/mobileclip2_b.jsonl, main_metric
    assert by[("mobileclip2-s0", "FMoW")].metric == "worst_group_accuracy"
    (pe,) = load_tables("pe")
    pe_by = {(r.model, r.column): r for r in pe.rows}
    assert pe_by[("pe-core-vitl14", "IN-1k")].value == pytest.approx(0.835)
    assert pe_by[("pe-core-vitb16", "COCO-T2I")].metric == "t2i_r1"
    (sig,) = load_tables("siglip2")
    sig_by = {(r.model, r.column): r for r in sig.rows}
    assert {r.model for r in sig.rows} == {"siglip2-vitb16", "siglip2-vitl16", "siglip2-so400m"}
    assert (sig_by[("siglip2-vitl16", "INet 0-shot")].value, sig_by[("siglip2-vitl16", "INet 0-shot")].dataset) == \
        (pytest.approx(0.825), "wds-imagenet1k")
    assert sig_by[("siglip2-so400m", "COCO I→T")].metric == "i2t_r1"
    if MOBILECLIP2.is_dir():
        line = next(json.loads(x) for x in (MOBILECLIP2 / "mobileclip2_b.jsonl").read_text().splitlines()
                    if json.loads(x)["dataset"] == "GeoDE")
        assert by[("mobileclip2-b", "GeoDE")].value == line["metrics"]["main_metric"]


# ---- verdicts


def test_a_datacomp_run_of_a_registered_model_gets_39_verdicts():
    metrics, results = run_of("vitb32", shift={"MNIST": -0.02})
    report = reference_report(load_tables(), metrics, {"model": "vitb32"}, results)
    mine = [c for c in report["comparisons"] if c["source"]["file"] == "open_clip_datacomp.json"]
    assert len(mine) == 39 and {c["source"]["column"] for c in mine} == {AVERAGE, *TASKS}
    by = {c["source"]["column"]: c for c in mine}
    assert by["MNIST"]["verdict"] == "off" and by["ImageNet 1k"]["verdict"] == "reproduced"
    assert sum(c["verdict"] == "reproduced" for c in mine) == 38
    published = {r.column: r.value for r in datacomp_table().rows if r.model == "vitb32"}
    mean = (sum(published[c] for c in TASKS) - 0.02) / 38  # the average as DataComp computes it, from the 38
    assert by[AVERAGE]["ours"] == pytest.approx(mean)
    assert by[AVERAGE]["theirs"] == published[AVERAGE] and by[AVERAGE]["verdict"] == "reproduced"
    assert by["Flickr"]["analysis"] == "retrieval" and by["Flickr"]["dataset"] == "wds-flickr30k"


def test_a_partial_datacomp_run_says_why_the_average_is_not_compared():
    metrics, results = run_of("vitb16")
    del metrics["zeroshot"]["wds-mnist"]
    report = reference_report(load_tables(), metrics, {"model": "vitb16"}, results)
    mine = [c for c in report["comparisons"] if c["source"]["file"] == "open_clip_datacomp.json"]
    assert len(mine) == 37
    (why,) = [n for n in report["not_compared"] if n["column"] == AVERAGE and n["table"].endswith("(DataComp's 38)")]
    assert why["reason"] == "the average needs 38 tasks; the run lacks 1: zeroshot@wds-mnist"


def test_a_run_with_another_preprocessing_gets_no_verdict():
    metrics, results = run_of("vitb32")
    model = {"model": "vitb32", "model_preprocess": {"size": [256, 256]}}
    report = reference_report([datacomp_table()], metrics, model, results)
    assert report["applies"] is False and len(report["not_compared"]) == 39
    assert report["not_compared"][0]["reason"].startswith("settings differ: model.model_preprocess.size: run [256, 256]")


# ---- placement


def hand_rank(column: str, value: float) -> int:
    """1 + the CSV's rows strictly above `value` in `column`, read with the csv module."""
    return 1 + sum(float(r[column]) > value for r in csv.DictReader(CSV.open()))


@pytest.mark.skipif(not CSV.is_file(), reason="open_clip's results table is not beside the checkout")
def test_placement_equals_a_hand_count_on_the_csv():
    numbers = {"ImageNet 1k": {"value": 0.70, "low": 0.695, "high": 0.705},
               "GeoDE": {"value": 0.9, "low": None, "high": None}}
    placed = place(numbers)
    assert placed["ImageNet 1k"]["rank"] == hand_rank("ImageNet 1k", 0.70)
    assert placed["ImageNet 1k"]["rank_best"] == hand_rank("ImageNet 1k", 0.705)
    assert placed["ImageNet 1k"]["rank_worst"] == hand_rank("ImageNet 1k", 0.695)
    assert placed["ImageNet 1k"]["of"] == 121 and placed["GeoDE"]["rank_best"] is None
    # a tie: the best published ImageNet value itself ranks first, a hair below it second
    best = max(float(r["ImageNet 1k"]) for r in csv.DictReader(CSV.open()))
    assert place({"ImageNet 1k": {"value": best}})["ImageNet 1k"]["rank"] == 1
    assert place({"ImageNet 1k": {"value": best - 1e-6}})["ImageNet 1k"]["rank"] == 2
    assert place({"ImageNet 1k": {"value": best}})["ImageNet 1k"]["standing"] == "1 of 121"
    # below every published model: rank 122, said "below all 121" (not "rank 122 of 121")
    worst = min(float(r["ImageNet 1k"]) for r in csv.DictReader(CSV.open()))
    below = place({"ImageNet 1k": {"value": worst - 1e-6}})["ImageNet 1k"]
    assert (below["rank"], below["standing"]) == (122, "below all 121")
    # ViT-B-32 openai's own published row ranks where the hand count puts it
    row = next(r for r in csv.DictReader(CSV.open()) if (r["name"], r["pretrained"]) == ("ViT-B-32", "openai"))
    avg = float(row[AVERAGE])
    assert place({AVERAGE: {"value": avg}})[AVERAGE]["rank"] == hand_rank(AVERAGE, avg)


def test_a_run_without_a_published_row_is_placed_with_the_average_and_its_interval():
    metrics, results = run_of("vitb32")
    for analysis, per in metrics.items():
        for dataset, values in per.items():
            (key, value), = values.items()
            results[analysis][dataset]["intervals"] = {key: {"low": value - 0.01, "high": value + 0.02}}
    numbers = run_numbers(metrics, results)
    assert len(numbers) == 39
    # a retrieval result holds i2t_r1 and t2i_r1, with their intervals: the cell is their mean, its ends the mean's
    metrics["retrieval"]["wds-flickr30k"] = {"i2t_r1": 0.8, "t2i_r1": 0.6}
    results["retrieval"]["wds-flickr30k"]["intervals"] = {"i2t_r1": {"low": 0.78, "high": 0.82},
                                                          "t2i_r1": {"low": 0.57, "high": 0.61}}
    numbers = run_numbers(metrics, results)
    assert numbers["Flickr"] == {"value": pytest.approx(0.7), "low": pytest.approx(0.675), "high": pytest.approx(0.715)}
    numbers["Flickr"] = {"value": numbers["Flickr"]["value"], "low": 0.69, "high": 0.72}  # the 0.015 the check wants
    numbers[AVERAGE] = average_interval(numbers)
    avg = numbers[AVERAGE]
    assert avg["value"] == pytest.approx(sum(numbers[c]["value"] for c in TASKS) / 38)
    assert avg["high"] - avg["value"] == pytest.approx(math.sqrt(38 * 0.015 ** 2) / 38)
    report = reference_report(load_tables(), metrics, {"model": "my-checkpoint"}, results)
    assert report["applies"] is False
    page = index_page(model={"model": "my-checkpoint"}, metrics=metrics, results=results, reference=report,
                      charts={}, run={"model": "my-checkpoint", "suite": "datacomp"})
    placed = place(numbers)
    assert "<h2 id=\"placement\">On open_clip's table</h2>" in page
    assert f"{placed[AVERAGE]['rank']} of 121" in page
    assert f"{placed[AVERAGE]['rank_best']}&ndash;{placed[AVERAGE]['rank_worst']}" in page


def test_without_datacomp_tasks_the_page_has_no_placement_and_bad_input_is_named():
    page = index_page(model={"model": "toy"}, metrics={"zeroshot": {"shapes": {"accuracy": 0.5}}}, results={},
                      reference={"applies": False, "reason": "x"}, charts={}, run={})
    assert "On open_clip" not in page
    with pytest.raises(PlacementError, match="'Imagenet' is not a column of open_clip's results table"):
        place({"Imagenet": {"value": 0.5}})
    with pytest.raises(PlacementError, match="'MNIST': value nan is not a finite number"):
        place({"MNIST": {"value": float("nan")}})
    assert average_interval({c: {"value": 0.5, "low": None, "high": None} for c in TASKS}) == \
        {"value": 0.5, "low": None, "high": None}


def test_the_report_stage_gives_39_verdicts_from_datacomp_result_files(tmp_path, monkeypatch):
    """Result files written as the analyses write them (vlbench.results), read back by the report stage's own
    functions: reports/reference.json's content has a verdict for every cell of the model's row."""
    from vlbench.report.aggregate import headline, read_results, reference
    from vlbench.results import Result, write_result

    monkeypatch.chdir(tmp_path)
    published = {r.column: r for r in datacomp_table().rows if r.model == "dfn-vitl14"}
    datasets: dict[str, list[str]] = {}
    for column, t in TASKS.items():
        value = published[column].value  # retrieval reports i2t_r1 and t2i_r1: DataComp's cell is their mean
        numbers = {"i2t_r1": value + 0.01, "t2i_r1": value - 0.01} if t["analysis"] == "retrieval" else \
            {t["metric"]: value}
        write_result(t["analysis"], t["entry"], Result(numbers, {"samples": 10}, {"split": "test"}),
                     {"model": "dfn-vitl14"})
        datasets.setdefault(t["analysis"], []).append(t["entry"])
    results = read_results(datasets)
    metrics, model = headline(results)
    out = reference(results, metrics, {**model, "model": "dfn-vitl14"})
    mine = [c for c in out["comparisons"] if c["source"]["file"] == "open_clip_datacomp.json"]
    assert len(mine) == 39 and all(c["verdict"] == "reproduced" for c in mine)
    assert {c["source"]["column"] for c in mine} == {AVERAGE, *TASKS}
    assert all("params.split" in c["settings_checked"] for c in mine)
    by = {c["source"]["column"]: c for c in mine}
    assert by["MSCOCO"]["ours"] == pytest.approx(published["MSCOCO"].value)
    assert (by["MSCOCO"]["dataset"], by["MSCOCO"]["key"]) == ("wds-mscoco", "mean_recall_at_1")
