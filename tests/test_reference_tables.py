"""The papers' reference tables (vlbench/reference/data/<paper>_<table>.json): the fixed schema, names that exist in
vlbench, values that agree with the printed cells, and each table's internal consistency with facts the paper itself
publishes (its Δ and average columns, numbers its text quotes, claims its text makes about the table), computed from
the stored values."""

from __future__ import annotations

import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "vlbench" / "reference" / "data"
# the tables transcribed from the openness, Xu et al. and FewTrans papers (test_reference.py validates every file)
FILES = sorted(p for p in DATA.glob("*.json") if p.stem.startswith(("openness_", "granularity_", "fewtrans_")))
PAPERS = {"elevater", "vtab", "openness", "granularity", "fewtrans", "open_clip"}
ANALYSES = {"zeroshot", "linear_probe", "adapt", "extensibility", "granularity", "specificity", "robustness", "finetune"}
TOP_KEYS = {"paper", "table", "title", "source", "settings", "how_to_run", "notes", "rows"}
ROW_KEYS = {"model", "model_name", "analysis", "dataset", "metric", "value", "published", "spread", "settings",
            "row", "column"}
SPREADS = {"std", "ci95", "sem"}
RAW_METRICS = ("alignment", "uniformity")  # losses as printed; every other metric is a percentage stored as a fraction
NUMBER = re.compile(r"^[+-]?\d+(?:\.\d+)?")
GAIN = re.compile(r"\(\s*([+-]\d+(?:\.\d+)?)\s*\)")
PM = re.compile(r"±\s*(\d+(?:\.\d+)?)")


def load(name: str) -> dict:
    return json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))


def cells(name: str) -> dict[tuple[str, str, str], dict]:
    """(row label, dataset, metric) -> row; each cell once."""
    out = {}
    for r in load(name)["rows"]:
        key = (r["row"], r["dataset"], r["metric"])
        assert key not in out, f"{name}: {key} twice"
        out[key] = r
    return out


def percent(r: dict) -> float:
    return 100.0 * r["value"]


def registry(kind: str) -> set[str]:
    return {p.stem for p in (ROOT / "conf" / kind).glob("*.yaml")}


def test_every_listed_table_has_its_file():
    names = {p.stem for p in FILES}
    expected = {f"openness_table{n}" for n in (1, 2, 7, 9)} | {f"granularity_table{n}" for n in (2, 3, 5)} \
        | {f"fewtrans_table{n}" for n in (5, 6, 7)}
    assert expected <= names


# --------------------------------------------------------------------------------------------------------------------
# every file: schema, names, values against the printed cells


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_schema(path):
    t = json.loads(path.read_text(encoding="utf-8"))
    assert set(t) == TOP_KEYS
    assert t["paper"] in PAPERS
    number = re.fullmatch(r"Table (\d+)", t["table"])
    assert number and path.stem == f"{t['paper']}_table{number.group(1)}"
    assert all(isinstance(t[k], str) and t[k] for k in ("title", "source", "how_to_run"))
    assert isinstance(t["settings"], dict) and t["settings"]
    assert isinstance(t["notes"], list) and all(isinstance(n, str) and n for n in t["notes"])
    assert t["rows"]
    for r in t["rows"]:
        assert set(r) == ROW_KEYS, r
        assert r["analysis"] in ANALYSES
        assert r["model"] is None or isinstance(r["model"], str)
        assert all(isinstance(r[k], str) and r[k] for k in ("model_name", "dataset", "metric", "published", "row",
                                                             "column"))
        assert isinstance(r["value"], (int, float)) and not isinstance(r["value"], bool) and math.isfinite(r["value"])
        assert isinstance(r["settings"], dict)
        if r["spread"] is not None:
            assert set(r["spread"]) == {"kind", "value"} and r["spread"]["kind"] in SPREADS
            assert math.isfinite(r["spread"]["value"]) and r["spread"]["value"] >= 0


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_each_printed_cell_once(path):
    rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
    keys = [(r["row"], r["column"]) for r in rows]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_models_and_datasets_exist_in_vlbench(path):
    """Model slugs are conf/model entries; a dataset is a registry entry, an openness dataset-level set, an average,
    or a name the file's settings or notes describe (a paper's own dataset)."""
    t = json.loads(path.read_text(encoding="utf-8"))
    models, datasets = registry("model"), registry("dataset")
    text = json.dumps([t["settings"], t["notes"]], ensure_ascii=False)
    for r in t["rows"]:
        assert r["model"] is None or r["model"] in models, r["model"]
        d = r["dataset"]
        if d in datasets or d == "average" or d.endswith(" average"):
            continue
        assert d in text, f"{path.stem}: dataset {d!r} is neither a registry entry nor described in the file"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_values_are_the_printed_numbers(path):
    """value = the cell's leading number / 100 (raw losses: the number); spread = the printed ± / 100."""
    for r in json.loads(path.read_text(encoding="utf-8"))["rows"]:
        printed = float(NUMBER.match(r["published"].strip()).group())
        scale = 1.0 if r["metric"].startswith(RAW_METRICS) else 100.0
        assert r["value"] * scale == pytest.approx(printed, abs=1e-9), r
        pm = PM.search(r["published"])
        assert (pm is None) == (r["spread"] is None), r
        if pm:
            assert r["spread"]["value"] * 100 == pytest.approx(float(pm.group(1)), abs=1e-9)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_fractions_in_unit_interval(path):
    for r in json.loads(path.read_text(encoding="utf-8"))["rows"]:
        if r["metric"].startswith(RAW_METRICS):
            continue
        low = -1.0 if r["metric"].startswith("delta_") else 0.0
        assert low <= r["value"] <= 1.0, r
        if r["spread"] is not None:
            assert r["spread"]["value"] <= 0.1, r  # a printed interval of 10 points or more would be a misreading


# --------------------------------------------------------------------------------------------------------------------
# openness (Ren et al.)

CLIP_ROWS = ("CLIP (RN101)", "CLIP (ViT-B/32)", "CLIP (ViT-B/16)")


def variant_of(metric: str) -> str:
    return metric.rsplit("_", 1)[1]


@pytest.mark.parametrize("name", ["openness_table1", "openness_table7"])
def test_openness_deltas_are_acc_minus_acc_c(name):
    """Δ columns = Acc-E (Acc-S) minus Acc-C, within the rounding of three printed numbers; every (row, dataset) has
    all five columns."""
    c = cells(name)
    groups = defaultdict(dict)
    for (row, dataset, metric), r in c.items():
        groups[(row, dataset)][metric.rsplit("_", 1)[0]] = percent(r)
    for key, g in groups.items():
        assert set(g) == {"acc_c", "acc_e", "acc_s", "delta_acc_e", "delta_acc_s"}, key
        assert g["delta_acc_e"] == pytest.approx(g["acc_e"] - g["acc_c"], abs=0.15), key
        assert g["delta_acc_s"] == pytest.approx(g["acc_s"] - g["acc_c"], abs=0.15), key


def test_openness_table1_text_facts():
    c = cells("openness_table1")
    v = {k: percent(r) for k, r in c.items()}
    # Section 1 / 3.2: "CLIP (RN101) on CIFAR100 experiences a 12.9% drop"; Section 3.3: "Acc-S ... decreased by 13.4%"
    rn = "CLIP (RN101)"
    assert v[(rn, "cifar100", "acc_e_single")] - v[(rn, "cifar100", "acc_c_single")] == pytest.approx(-12.9, abs=0.05)
    assert v[(rn, "cifar100", "acc_s_single")] - v[(rn, "cifar100", "acc_c_single")] == pytest.approx(-13.4, abs=0.05)
    rows = {k[0] for k in c}
    datasets = {k[1] for k in c}
    assert datasets == {"cifar100", "breeds-entity13", "breeds-living17"}
    for row in rows:
        var = next(variant_of(k[2]) for k in c if k[0] == row)
        for d in datasets:
            # "all models exhibit a clear drop in performance as the vocabulary expands"
            assert v[(row, d, f"acc_e_{var}")] < v[(row, d, f"acc_c_{var}")]
            assert v[(row, d, f"acc_s_{var}")] < v[(row, d, f"acc_c_{var}")]
    for d in datasets:
        acc_e = {row: v[k] for k in c if k[1] == d and k[2].startswith("acc_e_") for row in [k[0]]}
        # "The most extensible results are obtained by CoOp"
        assert max(acc_e, key=acc_e.get) == "CoOp (ViT-B/16)"
        # widespread supervision (DeCLIP vs CLIP) and more pre-training data (CLIP vs SLIP) improve extensibility
        assert acc_e["DeCLIP (ViT-B/32)"] > acc_e["CLIP (ViT-B/32)"]
        assert acc_e["CLIP (ViT-B/16)"] > acc_e["SLIP (ViT-B/16)"]


def test_openness_table7_text_facts():
    c = cells("openness_table7")
    v = {k: percent(r) for k, r in c.items()}
    rn, generic = "CLIP (RN101)", ("cifar100-caltech101-sun397", "cifar10-cifar100-imagenet")
    # Appendix A.3: RN101's Acc-E falls 14.2 (CIFAR100-Caltech101-SUN397) and 14.5 (CIFAR10-CIFAR100-ImageNet); its
    # Acc-S on the latter is 28.2 below Acc-C
    assert v[(rn, generic[0], "acc_e_single")] - v[(rn, generic[0], "acc_c_single")] == pytest.approx(-14.2, abs=0.05)
    assert v[(rn, generic[1], "acc_e_single")] - v[(rn, generic[1], "acc_c_single")] == pytest.approx(-14.5, abs=0.05)
    assert v[(rn, generic[1], "acc_s_single")] - v[(rn, generic[1], "acc_c_single")] == pytest.approx(-28.2, abs=0.05)
    # Section 3.2: "a more dramatic decline of an average of 15.3% on generic dataset expansion" (the CLIP rows' Acc-E
    # over the two generic compositions: 15.25, printed rounded half up)
    drops = [v[(row, d, "acc_c_single")] - v[(row, d, "acc_e_single")] for row in CLIP_ROWS for d in generic]
    assert statistics.mean(drops) == pytest.approx(15.3, abs=0.05 + 1e-9)
    # the specialized composition is far more stable than the generic ones, for every model
    for row in {k[0] for k in c}:
        var = next(variant_of(k[2]) for k in c if k[0] == row)
        spec = v[(row, "flowers102-pets-cars", f"acc_c_{var}")] - v[(row, "flowers102-pets-cars", f"acc_s_{var}")]
        assert all(spec < v[(row, d, f"acc_c_{var}")] - v[(row, d, f"acc_s_{var}")] for d in generic)
        assert all(v[(row, d, f"acc_e_{var}")] < v[(row, d, f"acc_c_{var}")] for d in (*generic, "flowers102-pets-cars"))


def test_openness_table2_geometry_and_accuracies():
    c = cells("openness_table2")
    t1 = cells("openness_table1")
    rows = {k[0] for k in c}
    for row in rows:
        var = next(variant_of(k[2]) for k in c if k[0] == row)
        g = {m: c[(row, "cifar100", f"{m}_{var}")]["value"] for m in
             ("alignment", "uniformity_texts", "uniformity_images", "uniformity", "acc_c", "acc_e")}
        # ℓ_uniform = ℓ_uniform-I + ℓ_uniform-T (Eq. 9), within the rounding of three printed numbers
        assert g["uniformity"] == pytest.approx(g["uniformity_texts"] + g["uniformity_images"], abs=0.015), row
        # Acc-C and Acc-E are Table 1's CIFAR100 numbers
        assert g["acc_c"] == t1[(row, "cifar100", f"acc_c_{var}")]["value"]
        assert g["acc_e"] == t1[(row, "cifar100", f"acc_e_{var}")]["value"]
    u = {row: c[(row, "cifar100", f"uniformity_{variant_of(next(k[2] for k in c if k[0] == row))}")]["value"]
         for row in rows}
    # Section 4.2: CLIP "results in poor intra-modal uniformity (ℓ_uniform > -2.0)"; SLIP and DeCLIP "ℓ_uniform < -4.5"
    assert all(u[r] > -2.0 for r in CLIP_ROWS)
    assert u["SLIP (ViT-B/16)"] < -4.5 and u["DeCLIP (ViT-B/32)"] < -4.5
    # CoOp has "the lowest intra-modal uniformity loss on the text side"
    text = {row: r["value"] for (row, _, m), r in c.items() if m.startswith("uniformity_texts_")}
    assert min(text, key=text.get) == "CoOp (ViT-B/16)"
    # image uniformity depends on the images only: the same for CLIP and PE of one backbone
    images = {row: r["value"] for (row, _, m), r in c.items() if m.startswith("uniformity_images_")}
    assert images["CLIP (ViT-B/32)"] == images["PE (ViT-B/32)"]
    assert images["CLIP (ViT-B/16)"] == images["PE (ViT-B/16)"]


def test_openness_table9_gains():
    c = cells("openness_table9")
    t1 = cells("openness_table1")
    gains = defaultdict(list)
    for (row, dataset, metric), r in c.items():
        if row.startswith("CLIP"):
            assert r["value"] == t1[(row, dataset, metric)]["value"]  # the CLIP rows repeat Table 1
            continue
        base = c[(row.replace("REPE", "CLIP"), dataset, metric.replace("_repe", "_single"))]
        gain = percent(r) - percent(base)
        assert gain == pytest.approx(float(GAIN.search(r["published"]).group(1)), abs=1e-6), (row, dataset, metric)
        assert gain > 0  # "REPE consistently improves"
        gains[metric.split("_")[1]].append(gain)
    assert sum(len(g) for g in gains.values()) == 27
    # Appendix A.5: "improves the extensibility and stability of CLIP by an average of 1.2%"
    assert statistics.mean(gains["e"] + gains["s"]) == pytest.approx(1.2, abs=0.05)


# --------------------------------------------------------------------------------------------------------------------
# granularity and specificity (Xu et al.)


def by_model(name: str) -> dict[str, dict[str, dict]]:
    out = defaultdict(dict)
    for r in load(name)["rows"]:
        out[r["row"]][r["metric"]] = r
    return out


def printed_gain(r: dict) -> float:
    return float(GAIN.search(r["published"]).group(1))


def test_granularity_table2_propagation():
    t = by_model("granularity_table2")
    for row, m in t.items():
        assert set(m) == {"leaf_map", "coarse_map_direct", "coarse_map_child", "coarse_map_leaf"}, row
        raw = percent(m["coarse_map_direct"])
        for s in ("child", "leaf"):  # Δ = propagated minus raw (printed from unrounded mAPs: within 0.01)
            assert percent(m[f"coarse_map_{s}"]) - raw == pytest.approx(printed_gain(m[f"coarse_map_{s}"]), abs=0.011)
        # "direct predictions with CG labels consistently yield inferior results ... propagation from the leaf ...
        # leads to the most substantial performance improvements"
        assert raw < percent(m["coarse_map_child"]) < percent(m["coarse_map_leaf"]), row
    # Section 4.2: "UniCL_YFCC ... significantly outperform ... UniCL_IN21K in FG leaf label classification (35.75 vs.
    # 26.28 mAP)"; UniCL_IN21K's raw ancestor mAP surpasses every CLIP and OpenCLIP model
    assert percent(t["UniCL(Swin-B) / YFCC"]["leaf_map"]) == pytest.approx(35.75)
    assert percent(t["UniCL(Swin-B) / IN21K"]["leaf_map"]) == pytest.approx(26.28)
    in21k = t["UniCL(Swin-B) / IN21K"]["coarse_map_direct"]["value"]
    assert all(in21k > m["coarse_map_direct"]["value"] for row, m in t.items() if "CLIP" in row)


def test_granularity_table5_two_level():
    t = by_model("granularity_table5")
    for row, m in t.items():
        assert len(m) == 4, row
        direct = percent(m["twolevel_coarse_direct_top1"])
        for key in ("twolevel_coarse_from_fine_top1", "twolevel_coarse_mean_children_top1"):
            assert percent(m[key]) - direct == pytest.approx(printed_gain(m[key]), abs=0.011), (row, key)
            assert percent(m[key]) > direct  # propagating from the fine level beats coarse prompts, every model
    assert {m["twolevel_fine_top1"]["model"] for m in t.values()} >= {"vitb32", "vitb32-laion2b", "vitl14-laion2b"}


def test_granularity_table3_specificity():
    t = by_model("granularity_table3")
    positives, negatives = ("captions", "multi_label", "single_label", "narratives"), ("random", "relevant", "altered")
    for row, m in t.items():
        assert set(m) == {f"{p}_vs_{n}" for p in positives for n in negatives}, row
        # "using harder ... negatives can degrade image-to-text retrieval performance": random > relevant > altered
        for p in positives:
            assert m[f"{p}_vs_random"]["value"] > m[f"{p}_vs_relevant"]["value"] > m[f"{p}_vs_altered"]["value"]
        # "True COCO captions generate higher score than classification prompts"
        assert m["captions_vs_random"]["value"] > max(m["multi_label_vs_random"]["value"],
                                                      m["single_label_vs_random"]["value"])

    def best(metric):
        return max(t, key=lambda row: t[row][metric]["value"])

    # "the BLIP model with the fusion design fine-tuned on COCO is the best when the positive text are true captions
    # ... however, results in worse performance when distinguishing poisoned captions"
    assert best("captions_vs_random") == best("captions_vs_relevant") == "BLIP_ft-coco-fusion"
    fusion, ft = t["BLIP_ft-coco-fusion"], t["BLIP_ft-coco"]
    assert fusion["captions_vs_altered"]["value"] < ft["captions_vs_altered"]["value"]
    # FLAVA best with multi-label prompts; "UniCL is the best when single-label prompts are the positives"
    assert {best(f"multi_label_vs_{n}") for n in negatives} == {"FLAVA"}
    assert best("single_label_vs_random") == best("single_label_vs_relevant") == "UniCL_All"
    # Figure 5 (CLIP ViT-B/32): multi-label prompts score higher than single-label ones
    clip = t["CLIP-B"]
    assert all(clip[f"multi_label_vs_{n}"]["value"] > clip[f"single_label_vs_{n}"]["value"] for n in negatives)


# --------------------------------------------------------------------------------------------------------------------
# FewTrans


def fewtrans_rows(n: int) -> dict[str, dict[str, dict]]:
    out = defaultdict(dict)
    for r in load(f"fewtrans_table{n}")["rows"]:
        out[r["row"]][r["dataset"]] = r
    return out


@pytest.mark.parametrize("n", [5, 6, 7])
def test_fewtrans_average_is_mean_of_datasets(n):
    for row, d in fewtrans_rows(n).items():
        assert len(d) == 11 and "average" in d, row
        values = [percent(r) for k, r in d.items() if k != "average"]
        # mean of ten printed values (each +-0.05) against the printed average (+-0.05)
        assert statistics.mean(values) == pytest.approx(percent(d["average"]), abs=0.1 + 1e-9), row
        cis = [r["spread"]["value"] for r in d.values()]
        assert all(r["spread"]["kind"] == "ci95" for r in d.values()) and all(0 < ci < 0.05 for ci in cis)
        ci_avg = d["average"]["spread"]["value"]
        assert min(cis) <= ci_avg <= max(cis), row


def average(rows: dict[str, dict[str, dict]], row: str) -> float:
    return rows[row]["average"]["value"]


def test_fewtrans_text_claims():
    base, novel, visual = fewtrans_rows(6), fewtrans_rows(7), fewtrans_rows(5)
    prompt_methods = ("CoOp", "ProGrad", "VPT", "MaPLe", "KgCoOp", "CoCoOp")
    finetunes = ("AllFT", "VisualFT", "TextFT")
    # Section 5.3: every method designed for CLIP beats zero-shot in base evaluation (Table 6) and loses to it in
    # base-to-novel evaluation (Table 7); finetuning surpasses all of them in both
    assert all(average(base, m) > average(base, "Zero-shot") for m in prompt_methods)
    assert all(average(novel, m) < average(novel, "Zero-shot") for m in prompt_methods)
    for rows in (base, novel):
        assert min(average(rows, f) for f in finetunes) > max(average(rows, m) for m in prompt_methods)
    # Table 5: "except for linear probing, all transfer algorithms ... have very similar performance and have
    # intersected confidence intervals"
    assert min(visual, key=lambda row: average(visual, row)) == "Linear"
    intervals = [(average(visual, r) - visual[r]["average"]["spread"]["value"],
                  average(visual, r) + visual[r]["average"]["spread"]["value"]) for r in visual if r != "Linear"]
    assert max(lo for lo, _ in intervals) <= min(hi for _, hi in intervals)


def test_fewtrans_runnable_rows_name_vlbench_methods():
    """The rows vlbench can run on cached features carry its metric names; the zero-shot rows of base and novel
    evaluation are different numbers."""
    assert fewtrans_rows(5)["Linear"]["fewtrans-dtd"]["metric"] == "fewtrans/base/linear"
    assert fewtrans_rows(6)["Zero-shot"]["fewtrans-dtd"]["metric"] == "fewtrans/base/zeroshot"
    assert fewtrans_rows(7)["Zero-shot"]["fewtrans-dtd"]["metric"] == "fewtrans/novel/zeroshot"
    assert fewtrans_rows(6)["Zero-shot"]["average"]["value"] != fewtrans_rows(7)["Zero-shot"]["average"]["value"]


def test_fewtrans_rows_name_the_fewtrans_suites_entries():
    """Each row names a dataset of conf/suite/fewtrans.yaml (so a run of that suite gets verdicts); every average
    row lists all ten, in the suite's order."""
    suite = yaml.safe_load((ROOT / "conf/suite/fewtrans.yaml").read_text())
    datasets = list((suite.get("suite") or suite)["datasets"])
    for n in (5, 6, 7):
        for row, by_dataset in fewtrans_rows(n).items():
            assert sorted(by_dataset) == sorted(datasets + ["average"]), (n, row)
            assert by_dataset["average"]["settings"]["datasets"] == datasets, (n, row)
