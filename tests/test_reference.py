"""Reference numbers: the schema's errors, the verdicts on constructed runs, `vlbench reference`, the shipped tables."""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from vlbench.analyses import ANALYSES
from vlbench.cli import main
from vlbench.reference import DATA_DIR, PAPERS, ReferenceDataError, UnknownPaperError, load_tables, validate_table
from vlbench.reference.verdicts import DEFAULT_TOLERANCE, reference_report, tolerance
from vlbench.results import Result, write_result

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
COLUMNS = ["Caltech101", "CIFAR10", "CIFAR100", "Country211", "DTD", "EuroSat", "FER2013", "FGVCAircraft", "Food101",
           "GTSRB", "HatefulMemes", "KittiDistance", "MNIST", "Flowers102", "OxfordPets", "PatchCamelyon", "SST2",
           "RESISC45", "StanfordCars", "VOC2007"]  # Table 15's header
PAPER_ELEVATER = SHARED / "papers" / "000_cb5af440255dc7ad.txt"
OPENCLIP_CSV = SHARED / "reference" / "open_clip" / "openclip_results.csv"


def row(**over):
    base = {"model": "vitb32", "model_name": "CLIP ViT-B/32", "analysis": "zeroshot", "dataset": "cifar-10",
            "metric": "accuracy", "value": 0.898, "published": "89.8", "spread": None, "settings": {},
            "row": "CLIP", "column": "CIFAR10"}
    return {**base, **over}


def table(rows, **over):
    base = {"paper": "elevater", "table": "Table 99", "title": "t", "source": "s", "settings": {},
            "how_to_run": "dvc exp run -S model=vitb32", "rows": rows}
    return {**base, **over}


MODEL = {"model": "vitb32", "precision": "fp32"}


def zeroshot_run(value, params=None):
    metrics = {"zeroshot": {"cifar-10": {"accuracy": value}}}
    results = {"zeroshot": {"cifar-10": {"params": params or {"scoring": "elevater", "split": "test"}}}}
    return metrics, results


# ---- the schema


@pytest.mark.parametrize("broken, message", [
    (lambda t: t["rows"][0].pop("metric"), r"t\.json: rows\[0\] \('CLIP' / 'CIFAR10'\): key 'metric' missing"),
    (lambda t: t["rows"][0].update(value="0.898"), r"rows\[0\].*key 'value' has type str; expected int/float"),
    (lambda t: t["rows"][0].update(analysis="fewshot"), r"rows\[0\].*analysis 'fewshot' is not one of"),
    (lambda t: t["rows"][0].update(value=89.8), r"rows\[0\].*'accuracy' is a fraction.*outside \[0, 1\]"),
    (lambda t: t["rows"][0].update(value=0.89), r"rows\[0\].*value 0\.89 is neither the published number 89\.8"),
    (lambda t: t["rows"][0].update(published="n/a"), r"rows\[0\].*holds no number"),
    (lambda t: t["rows"][0].update(spread={"kind": "var", "value": 0.01}), r"rows\[0\].*spread must be null or"),
    (lambda t: t["rows"][0].update(spread={"kind": "std", "value": -1}), r"rows\[0\].*spread value -1"),
    (lambda t: t["rows"][0].update(extra=1), r"rows\[0\].*unknown keys \['extra'\]"),
    (lambda t: t.update(paper="clip"), r"t\.json: paper 'clip' is not one of"),
    (lambda t: t.pop("how_to_run"), r"t\.json: key 'how_to_run' missing"),
    (lambda t: t.update(rows=[]), r"t\.json: 'rows' is empty"),
])
def test_schema_errors_name_file_row_and_key(broken, message):
    obj = table([row()])
    broken(obj)
    with pytest.raises(ReferenceDataError, match=message):
        validate_table(obj, "t.json")


def test_row_settings_overlay_the_table_settings():
    t = validate_table(table([row(settings={"split": "val"})], settings={"split": "test", "scoring": "elevater"}),
                       "t.json")
    assert t.rows[0].settings == {"split": "val", "scoring": "elevater"}
    assert t.summary()["rows"][0]["settings"] == {"split": "val"}


def test_a_broken_file_in_the_folder_is_named(tmp_path):
    (tmp_path / "good.json").write_text(json.dumps(table([row()])))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ReferenceDataError, match=r"^bad\.json: not valid JSON"):
        load_tables(data_dir=tmp_path)
    with pytest.raises(UnknownPaperError, match="known papers: elevater, vtab, openness, granularity, fewtrans"):
        load_tables("clip", data_dir=tmp_path)


# ---- verdicts on constructed runs


def test_zeroshot_inside_at_and_outside_the_default_tolerance():
    tables = [validate_table(table([row()]), "t.json")]
    tol = DEFAULT_TOLERANCE["zeroshot"] + 0.0005  # + half of the printed last digit (89.8: 0.05 points)
    assert tolerance(tables[0].rows[0], None)[0] == pytest.approx(tol)
    verdicts = {}
    for name, ours in {"inside": 0.898 - 0.004, "at": 0.898 + tol, "outside": 0.898 - tol - 0.001}.items():
        report = reference_report(tables, *zeroshot_run(ours)[:1], MODEL, zeroshot_run(ours)[1])
        (c,) = report["comparisons"]
        verdicts[name] = c["verdict"]
        assert c["ours"] == ours and c["theirs"] == 0.898 and c["tolerance"] == pytest.approx(tol)
        assert c["source"]["table"] == "Table 99" and c["source"]["column"] == "CIFAR10"
    assert verdicts == {"inside": "reproduced", "at": "reproduced", "outside": "off"}
    report = reference_report(tables, *zeroshot_run(0.878)[:1], MODEL, zeroshot_run(0.878)[1])
    assert report["summary"] == {"reproduced": 0, "off": 1}
    assert report["comparisons"][0]["message"].startswith("off by -2.00 points: 87.80 vs 89.80 published")
    assert report["comparisons"][0]["settings_checked"] == []


def adapt_run(per_seed_by_dataset, report="best_on_test"):
    """metrics and results of an ELEVATER probing run: head language_2p, 5 shots, the given per-seed scores."""
    metrics, results = {"adapt": {}}, {"adapt": {}}
    for dataset, per_seed in per_seed_by_dataset.items():
        mean = sum(per_seed) / len(per_seed)
        metrics["adapt"][dataset] = {f"elevater/language_2p/5/{report}": mean}
        results["adapt"][dataset] = {
            "params": {"elevater": {"report": report}},
            "details": {"elevater": {"summary": {"language_2p": {"5": {
                "mean": mean, "per_seed": per_seed, "seeds": [0, 1, 2]}}}}}}
    return metrics, results


def elevater_table(value, published, std):
    return validate_table(table([row(analysis="adapt", dataset="average", metric="dataset_metric", value=value,
                                     published=published, spread={"kind": "std", "value": std},
                                     settings={"head": "language_2p", "shots": 5})],
                                settings={"datasets": ["a", "b"], "params.elevater.report": "best_on_test",
                                          "model.precision": "fp32", "params.seeds": 3,
                                          "selection": "best test epoch"}), "t3.json")


def test_published_spread_combined_with_ours():
    # per seed, the mean over datasets a and b: 0.55, 0.59, 0.63 -> mean 0.59, std (ddof 1) 0.04
    metrics, results = adapt_run({"a": [0.50, 0.56, 0.60], "b": [0.60, 0.62, 0.66]})
    tables = [elevater_table(0.6535, "65.35±1.24", 0.0124)]
    (c,) = reference_report(tables, metrics, MODEL, results)["comparisons"]
    assert c["ours"] == pytest.approx(0.59)
    assert c["spread_ours"] == {"kind": "std", "value": pytest.approx(0.04)}
    assert c["tolerance"] == pytest.approx(1.96 * math.sqrt(0.0124 ** 2 + 0.04 ** 2) + 0.00005)
    assert c["verdict"] == "reproduced"  # 6.35 points off, within 1.96 * sqrt(1.24^2 + 4^2) = 8.2
    assert sorted(c["settings_checked"]) == ["model.precision", "params.elevater.report"]
    assert c["settings_unchecked"] == ["params.seeds"]  # the run does not record it; "selection" is words
    assert c["key"] == "mean over 2 datasets of elevater/language_2p/5/best_on_test"
    # seeds that agree closely: our spread is small, the published one dominates, 6.3 points is now off
    metrics, results = adapt_run({"a": [0.54, 0.54, 0.541], "b": [0.64, 0.64, 0.641]})
    (c,) = reference_report(tables, metrics, MODEL, results)["comparisons"]
    assert c["tolerance"] == pytest.approx(1.96 * math.hypot(0.0124, c["spread_ours"]["value"]) + 0.00005)
    assert c["verdict"] == "off" and c["difference"] == pytest.approx(0.59 + 0.001 / 3 - 0.6535)


def test_published_spread_alone_is_taken_for_ours_too():
    t = elevater_table(0.6535, "65.35±1.24", 0.0124)
    tol, rule = tolerance(t.rows[0], None)
    assert tol == pytest.approx(1.96 * math.sqrt(2) * 0.0124 + 0.00005) and "sqrt(2)" in rule
    tiny = elevater_table(0.6535, "65.35±0.01", 0.0001)  # never below the analysis's default
    assert tolerance(tiny.rows[0], None)[0] == pytest.approx(DEFAULT_TOLERANCE["adapt"] + 0.00005)


@pytest.mark.parametrize("analysis", sorted(ANALYSES))
def test_a_row_of_every_analysis_gets_a_verdict(analysis):
    """Issue 40: a reference row may name any analysis of the table (compositionality's had no default tolerance: a
    KeyError in the middle of `report`); each gets its analysis's default tolerance."""
    tables = [validate_table(table([row(analysis=analysis, dataset="sugarcrepe", metric="accuracy", value=0.85,
                                        published="85.0")]), "t.json")]
    metrics = {analysis: {"sugarcrepe": {"accuracy": 0.853}}}
    results = {analysis: {"sugarcrepe": {"params": {}}}}
    (c,) = reference_report(tables, metrics, MODEL, results)["comparisons"]
    assert c["analysis"] == analysis and c["verdict"] == "reproduced"
    assert c["tolerance"] == pytest.approx(DEFAULT_TOLERANCE[analysis] + 0.0005)
    assert c["tolerance_rule"] == f"default for {analysis}: {DEFAULT_TOLERANCE[analysis]:g} + 0.0005 (printed precision)"


def test_rows_that_do_not_apply_say_why():
    tables = [elevater_table(0.6535, "65.35±1.24", 0.0124)]
    metrics, results = adapt_run({"a": [0.6, 0.6, 0.6], "b": [0.6, 0.6, 0.6]}, report="last")
    report = reference_report(tables, metrics, MODEL, results)
    assert report["applies"] is False and "comparisons" not in report
    assert report["not_compared"][0]["reason"] == ("settings differ: params.elevater.report: run 'last', "
                                                   "reference 'best_on_test'")
    assert report["not_compared"][0]["how_to_run"] == "dvc exp run -S model=vitb32"
    metrics, results = adapt_run({"a": [0.6, 0.6, 0.6]})
    report = reference_report(tables, metrics, MODEL, results)
    assert report["not_compared"][0]["reason"] == "the average needs 2 datasets; the run lacks 1: b"
    metrics, results = adapt_run({"a": [0.6] * 3, "b": [0.6] * 3})
    report = reference_report(tables, metrics, {"model": "vitb32", "precision": "amp_bf16"}, results)
    assert "model.precision: run 'amp_bf16', reference 'fp32'" in report["not_compared"][0]["reason"]


def test_no_reference_for_the_model_is_one_line_and_no_comparison():
    tables = [validate_table(table([row()]), "t.json")]
    metrics, results = zeroshot_run(0.9)
    report = reference_report(tables, metrics, {"model": "toy"}, results)
    assert report == {"applies": False,
                      "reason": "no published number for model 'toy': the reference tables name vitb32"}
    other = reference_report(tables, {"zeroshot": {"mnist": {"accuracy": 0.5}}}, MODEL, {})
    assert other["applies"] is False and other["not_compared"] == [] and "comparisons" not in other


def test_report_writes_reference_json_from_result_files(tmp_path, monkeypatch):
    from vlbench.report.aggregate import read_results, reference

    monkeypatch.chdir(tmp_path)
    for dataset, value in {"cifar-10": 0.9, "cifar-100": 0.5}.items():
        write_result("zeroshot", dataset, Result({"accuracy": value}, {"samples": 10}, {"scoring": "elevater",
                                                                                        "split": "test"}),
                     {"model": "vitb32"})
    out = reference(read_results({"zeroshot": ["cifar-10", "cifar-100"]}), {"zeroshot": {"cifar-10": {"accuracy": 0.9},
                                                                            "cifar-100": {"accuracy": 0.5}}},
                    {"model": "vitb32", "precision": "fp32"})
    by_source = {(c["source"]["file"], c["dataset"]): c for c in out["comparisons"]}
    c = by_source[("elevater_table15.json", "cifar-10")]  # Table 15, B32 CLIP: CIFAR10 89.8
    assert c["theirs"] == 0.898 and c["verdict"] == "reproduced" and "params.scoring" in c["settings_checked"]
    assert by_source[("elevater_table15.json", "cifar-100")]["verdict"] == "off"  # 50.0 vs 65.2
    # open_clip's CIFAR numbers used CLIP's 18 templates: a run that does not record prompts_per_class is compared
    # with that setting unchecked
    assert "params.prompts_per_class" in by_source[("open_clip_results.json", "cifar-10")]["settings_unchecked"]


def test_words_in_settings_are_not_checked_and_unlisted_averages_are_not_compared():
    words = table([row(settings={"protocol": "Acc-C as Table 1"}),
                   row(dataset="average", metric="fewtrans/base/linear", analysis="adapt", value=0.5, published="50.0",
                       settings={"datasets": "FewTrans's ten datasets"})])
    metrics, results = zeroshot_run(0.898, params={"protocol": "paper"})
    metrics["adapt"] = {"mean": {"fewtrans/base/linear": 0.5}}
    report = reference_report([validate_table(words, "w.json")], metrics, MODEL, results)
    assert [c["verdict"] for c in report["comparisons"]] == ["reproduced"]
    assert report["comparisons"][0]["settings_checked"] == [] and report["not_compared"] == []


def test_a_number_printed_as_percent_is_reported_in_points():
    delta = table([row(metric="delta_acc_e_single", analysis="extensibility", dataset="cifar100", value=-0.129,
                       published="-12.9")])
    metrics = {"extensibility": {"cifar100": {"delta_acc_e_single": -0.100}}}
    (c,) = reference_report([validate_table(delta, "d.json")], metrics, MODEL, {})["comparisons"]
    assert c["message"] == "off by +2.90 points: -10.00 vs -12.90 published (tolerance 1.05; 1.85 points beyond it)"


def test_open_clip_imagenet_needs_clips_80_templates():
    tables = load_tables("open_clip")
    metrics = {"zeroshot": {"imagenet-1k": {"accuracy": 0.633}}}
    one = {"zeroshot": {"imagenet-1k": {"params": {"split": "test", "prompts_per_class": 1.0}}}}
    report = reference_report(tables, metrics, {"model": "vitb32"}, one)
    assert report["applies"] is False
    assert report["not_compared"][0]["reason"] == ("settings differ: params.prompts_per_class: run 1.0, "
                                                   "reference 80")
    eighty = {"zeroshot": {"imagenet-1k": {"params": {"split": "test", "prompts_per_class": 80.0}}}}
    (c,) = reference_report(tables, metrics, {"model": "vitb32"}, eighty)["comparisons"]
    assert (c["theirs"], c["verdict"]) == (0.6332, "reproduced")
    assert c["tolerance"] == pytest.approx(0.005 + 0.00005)


# ---- the command


def test_cli_json_shape_and_paper_filter():
    result = CliRunner().invoke(main, ["reference", "--json"])
    assert result.exit_code == 0, result.output
    tables = json.loads(result.output)["tables"]
    keys = {"file", "paper", "table", "title", "source", "settings", "how_to_run", "notes", "models", "rows"}
    assert tables and all(set(t) == keys for t in tables)
    assert {"elevater_table3.json", "elevater_table15.json", "open_clip_results.json"} <= {t["file"] for t in tables}
    row_keys = {"model", "model_name", "analysis", "dataset", "metric", "value", "published", "spread", "settings",
                "row", "column"}
    assert all(set(r) == row_keys for t in tables for r in t["rows"])
    only = json.loads(CliRunner().invoke(main, ["reference", "--paper", "open_clip", "--json"]).output)["tables"]
    assert [t["file"] for t in only] == ["open_clip_datacomp.json", "open_clip_results.json",
                                         "open_clip_retrieval.json"]
    assert only[1]["models"] == only[0]["models"] == sorted(["vitb32", "vitb16", "vitl14", "rn50", "vitb32-laion400m", "vitb32-laion2b",
                                        "vitl14-laion2b", "siglip-vitb16", "datacomp-vitb16", "dfn-vitb16",
                                        "dfn-vitl14", "metaclip-vitb16"])
    text = CliRunner().invoke(main, ["reference", "--paper", "elevater"]).output
    assert "elevater Table 3 (elevater_table3.json)" in text and "run: dvc exp run -S model=vitb32" in text


def test_cli_unknown_paper_lists_the_known_ones():
    result = CliRunner().invoke(main, ["reference", "--paper", "clip"])
    assert result.exit_code != 0
    assert f"unknown paper 'clip'; known papers: {', '.join(PAPERS)}" in result.output


# ---- the shipped tables (both helpers' files)


def test_every_shipped_table_validates_and_names_registered_models():
    tables = load_tables()
    assert {t.file for t in tables} == {p.name for p in DATA_DIR.glob("*.json")}
    models = {p.stem for p in (ROOT / "conf" / "model").glob("*.yaml")}
    for t in tables:
        assert t.how_to_run.strip() and t.source.strip()
        for r in t.rows:
            assert r.model is None or r.model in models, (t.file, r.row, r.model)


def test_elevater_tables_read_from_the_paper():
    t3, t15 = (next(t for t in load_tables("elevater") if t.table == name) for name in ("Table 3", "Table 15"))
    by = {(r.row, r.column): r for r in t3.rows}
    lang2p = by[("CLIP (ViT-B32) LP Language-2P", "Few-shot (5)")]
    assert (lang2p.model, lang2p.value, lang2p.spread) == ("vitb32", 0.6535, {"kind": "std", "value": 0.0124})
    assert lang2p.settings["params.elevater.report"] == "best_on_test" and lang2p.settings["head"] == "language_2p"
    assert by[("CLIP (ViT-B32)", "Zero-shot")].value == 0.5664
    (t11,) = (t for t in load_tables("elevater") if t.table == "Table 11")
    b16 = {(r.analysis, r.settings.get("adaptation"), r.settings.get("shots")): r for r in t11.rows}
    assert b16[("zeroshot", None, None)].value == 0.5996  # the caption's 59.96%
    assert (b16[("adapt", "linear_probe", 5)].published, b16[("adapt", "linear_probe", "full")].value) == \
        ("68.27±0.97", 0.8117)
    elevater = json.loads((ROOT / "vlbench/datasets/data/elevater.json").read_text())
    for r in t15.rows:
        assert r.dataset == "average" or r.metric == elevater[r.dataset]["metric"], (r.row, r.column)
    vitb32 = [r for r in t15.rows if r.model == "vitb32"]
    assert len(vitb32) == 17  # average + 16 legible cells (DTD, EuroSat, FER2013, FGVCAircraft left out)
    if PAPER_ELEVATER.is_file():  # every Table 15 number is on its checkpoint's line of the paper's text
        cells = {" ".join(ln.split("\t")[:3]): ln.split("\t")[3:] for ln in PAPER_ELEVATER.read_text().splitlines()}
        for r in t15.rows:
            assert r.published in cells[r.model_name], (r.row, r.column)
            assert r.column == "Average Score" or r.published == cells[r.model_name][1 + COLUMNS.index(r.column)]


def test_open_clip_rows_equal_the_published_csv():
    (t,) = [t for t in load_tables("open_clip") if t.table == "openclip_results.csv"]
    if not OPENCLIP_CSV.is_file():
        pytest.skip("open_clip's results table is not beside the checkout")
    records = {(r["name"], r["pretrained"]): r for r in csv.DictReader(OPENCLIP_CSV.open())}
    for r in t.rows:
        name, pretrained = r.row.split(",")
        assert r.value == float(records[(name, pretrained)][r.column]), (r.row, r.column)
    conf = {slug: yaml.safe_load((ROOT / "conf/model" / f"{slug}.yaml").read_text()) for slug in t.summary()["models"]}
    for r in t.rows:
        name, pretrained = r.row.split(",")
        assert conf[r.model]["pretrained"] == pretrained
        assert conf[r.model]["arch"].removesuffix("-quickgelu") == name.removesuffix("-quickgelu")


def test_a_fewtrans_suite_run_is_compared_with_the_fewtrans_tables_dataset_by_dataset_and_on_average():
    """Tables 5-7 name the fewtrans suite's entries: a run of the suite's datasets is compared row by row, and the
    average row over the ten (the mean computed here from the per-dataset numbers)."""
    (table5,) = [t for t in load_tables("fewtrans") if t.table == "Table 5"]
    linear = [r for r in table5.rows if r.metric == "fewtrans/base/linear"]
    datasets = [r.dataset for r in linear if r.dataset != "average"]
    assert len(datasets) == 10
    metrics = {"adapt": {r.dataset: {"fewtrans/base/linear": r.value} for r in linear if r.dataset != "average"}}
    results = {"adapt": {d: {"params": {}} for d in datasets}}
    report = reference_report([table5], metrics, {"model": "vitb16", "precision": "fp32"}, results)
    compared = {c["dataset"]: c for c in report["comparisons"] if c["metric"] == "fewtrans/base/linear"}
    assert sorted(compared) == sorted(datasets + ["average"])
    mean = sum(r.value for r in linear if r.dataset != "average") / 10
    assert compared["average"]["ours"] == pytest.approx(mean)
    assert all(c["verdict"] == "reproduced" for c in compared.values())


@pytest.mark.parametrize("table, method", [("Table 5", "lora"), ("Table 6", "visual_ft"), ("Table 7", "all_ft")])
def test_a_fewtrans_fine_tuning_run_gets_verdicts_from_tables_5_to_7(table, method):
    """The fine-tuning methods vlbench has (vlbench.finetune.fewtrans_episodic.TUNINGS) are compared with their rows of
    Tables 5-7 under the finetune analysis, dataset by dataset; a number off by more than the row's interval is off."""
    (found,) = [t for t in load_tables("fewtrans") if t.table == table]
    rows = [r for r in found.rows if r.analysis == "finetune" and r.metric.endswith(f"/{method}")]
    assert len(rows) == 11 and {r.settings["vlbench_method"] for r in rows} == {method}
    metric = rows[0].metric
    metrics = {"finetune": {r.dataset: {metric: r.value} for r in rows if r.dataset != "average"}}
    metrics["finetune"]["fewtrans-dtd"][metric] -= 0.2
    results = {"finetune": {d: {"params": {}} for d in metrics["finetune"]}}
    report = reference_report([found], metrics, {"model": "vitb16", "precision": "fp32"}, results)
    verdicts = {c["dataset"]: c["verdict"] for c in report["comparisons"] if c["metric"] == metric}
    assert set(verdicts) == {r.dataset for r in rows}
    assert verdicts["fewtrans-dtd"] == "off" and verdicts["eurosat"] == "reproduced"
