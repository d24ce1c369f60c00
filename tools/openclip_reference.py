"""Write vlbench's reference data from open_clip's published results table (and the new families' own numbers).

    python tools/openclip_reference.py CSV [--mobileclip2 DIR] [--out FILE]

Writes, from the CSV: vlbench/reference/data/open_clip_results.json (the columns vlbench's other suites run),
vlbench/reference/data/open_clip_datacomp.json (all 38 columns and the average, as the `datacomp` suite's entries
and DataComp's main metrics: vlbench.reference.datacomp.TASKS) and vlbench/reference/openclip_population.json (every
row's 39 numbers, the population `vlbench.reference.datacomp.place` ranks a run in); from MobileCLIP2's result files
(`--mobileclip2`, apple/ml-mobileclip's results/*.jsonl): vlbench/reference/data/mobileclip2_results.json; and
vlbench/reference/data/pe_core.json and siglip2_readme.json from the cells of Perception Encoder's and SigLIP 2's
READMEs transcribed in README_CELLS below.

CSV is open_clip's `docs/openclip_results.csv` (the zero-shot results of every pretrained model, made with
LAION's CLIP_benchmark; MIT). The reference rows are those of vlbench's registered real models (conf/model/*.yaml:
arch and pretrained tag, matched exactly) in vlbench's reference schema; the placement population keeps every row's
name, tag and 39 numbers (not its params or FLOPs); the project never downloads the CSV. Deterministic: running it twice gives the same file.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vlbench.reference.datacomp import AVERAGE, TASKS  # noqa: E402  (the tool runs from a checkout)

MODELS = ("vitb32", "vitb16", "vitl14", "rn50", "vitb32-laion400m", "vitb32-laion2b", "vitl14-laion2b",
          "siglip-vitb16", "datacomp-vitb16", "dfn-vitb16", "dfn-vitl14", "metaclip-vitb16")
# registered models the CSV has no row for (listed in the file's notes, so that their absence is said, not silent)
NO_ROW = {"siglip2-vitb16": "open_clip's results table has no SigLIP 2 rows (the CSV read for this file lists SigLIP "
                            "1 and nllb-clip SigLIP models only): this table compares no number for siglip2-vitb16 (its "
                            "authors' README numbers: siglip2_readme.json)"}
# the 2025 families (registered; none has a row in the CSV): where their authors' own numbers are, or that there are none
NEW_FAMILIES = {
    "siglip2-vitl16": "SigLIP 2 L/16 (256 px, Tschannen et al. 2025): no row in open_clip's table; its README's "
                      "ImageNet and COCO numbers are siglip2_readme.json",
    "siglip2-so400m": "SigLIP 2 So400m/14 (224 px): no row in open_clip's table; its README's ImageNet and COCO "
                      "numbers are siglip2_readme.json",
    "metaclip2-vith14": "MetaCLIP 2 worldwide H/14 (Chuang et al. 2025): no row in open_clip's table; its authors' "
                        "README prints only CVQA-LOCAL zero-shot accuracy for it, a task vlbench does not run: no "
                        "published number is compared",
    "pe-core-vitb16": "PE-Core B/16: no row in open_clip's table; its README's five zero-shot numbers are "
                      "pe_core.json",
    "pe-core-vitl14": "PE-Core L/14 (336 px): no row in open_clip's table; its README's five zero-shot numbers are "
                      "pe_core.json",
    "mobileclip2-s0": "MobileCLIP2-S0: no row in open_clip's table; its authors' 38 DataComp main metrics are "
                      "mobileclip2_results.json",
    "mobileclip2-b": "MobileCLIP2-B: no row in open_clip's table; its authors' 38 are mobileclip2_results.json",
    "mobileclip2-l14": "MobileCLIP2-L/14: no row in open_clip's table; its authors' 38 are mobileclip2_results.json",
}
MOBILECLIP2 = {"mobileclip2-s0": "mobileclip2_s0.jsonl", "mobileclip2-b": "mobileclip2_b.jsonl",
               "mobileclip2-l14": "mobileclip2_l14.jsonl"}
MOBILECLIP2_REV = "apple/ml-mobileclip@4144bb1f081a6bcb9bc9e6552dee3b29a9ef9855"
# the authors' README tables, as printed (percent): {paper: {slug: (row label, {column: printed})}} and each column's
# (open_clip column, vlbench metric)
README_CELLS = {
    # facebookresearch/perception_models apps/pe/README.md, "Model Performance" (PE core)
    "pe": {"pe-core-vitb16": ("B/16 224px", {"IN-1k": "78.4", "IN-v2": "71.7", "IN-A": "62.4", "ObjectNet": "71.9",
                                             "COCO-T2I": "50.9"}),
           "pe-core-vitl14": ("L/14 336px", {"IN-1k": "83.5", "IN-v2": "77.9", "IN-A": "89.0", "ObjectNet": "84.7",
                                             "COCO-T2I": "57.1"})},
    # google-research/big_vision big_vision/configs/proj/image_text/README_siglip2.md, "Checkpoints"
    "siglip2": {"siglip2-vitb16": ("SigLIP 2 B/16 224", {"INet 0-shot": "78.2", "COCO T→I": "52.1",
                                                         "COCO I→T": "68.9"}),
                "siglip2-vitl16": ("SigLIP 2 L/16 256", {"INet 0-shot": "82.5", "COCO T→I": "54.7",
                                                         "COCO I→T": "71.5"}),
                "siglip2-so400m": ("SigLIP 2 So400m/14 224", {"INet 0-shot": "83.2", "COCO T→I": "55.1",
                                                              "COCO I→T": "71.5"})},
}
README_COLUMNS = {"IN-1k": ("ImageNet 1k", "accuracy"), "IN-v2": ("ImageNet v2", "accuracy"),
                  "IN-A": ("ImageNet-A", "accuracy"), "ObjectNet": ("ObjectNet", "accuracy"),
                  "COCO-T2I": ("MSCOCO", "t2i_r1"), "INet 0-shot": ("ImageNet 1k", "accuracy"),
                  "COCO T→I": ("MSCOCO", "t2i_r1"), "COCO I→T": ("MSCOCO", "i2t_r1")}
README_TABLES = {
    "pe": {"file": "pe_core.json", "table": "apps/pe/README.md, PE core 'Model Performance'",
           "title": "Perception Encoder core: its authors' zero-shot numbers (README)",
           "source": ("Bolya et al., Perception Encoder: The best visual embeddings are not at the output of the "
                      "network, arXiv:2504.13181 (2025); facebookresearch/perception_models apps/pe/README.md"),
           "settings": {"tool": "PE's CLIP_benchmark evaluation (apps/pe/docs/evaluation.md)", "params.split": "test",
                        "value": "top-1 accuracy; COCO-T2I: text-to-image Recall@1 on COCO's 5k test images"},
           "slugs": "pe-core-vitb16, pe-core-vitl14",
           "notes": ["The README prints five zero-shot image numbers per checkpoint (percent, one decimal); the "
                     "paper's larger tables are not transcribed here. Kinetics-400 and VTT-T2I are video tasks "
                     "vlbench does not run. The PE evaluation's class names and templates may differ from the "
                     "shards'."]},
    "siglip2": {"file": "siglip2_readme.json", "table": "big_vision README_siglip2.md, 'Checkpoints'",
                "title": "SigLIP 2: its authors' ImageNet zero-shot and COCO retrieval numbers (README)",
                "source": ("Tschannen et al., SigLIP 2: Multilingual Vision-Language Encoders with Improved Semantic "
                           "Understanding, Localization, and Dense Features, arXiv:2502.14786 (2025); "
                           "google-research/big_vision big_vision/configs/proj/image_text/README_siglip2.md"),
                "settings": {"tool": "big_vision's evaluators", "params.split": "test",
                             "value": "ImageNet top-1 accuracy; COCO Recall@1 (T→I: t2i, I→T: i2t) on COCO's 5k "
                                      "test images"},
                "slugs": "siglip2-vitb16, siglip2-vitl16, siglip2-so400m",
                "notes": ["The README prints three numbers per checkpoint (percent, one decimal); the rows are the "
                          "registered sizes and resolutions (B/16 224, L/16 256, So400m/14 224). big_vision's "
                          "prompts and class names are its own, not the shards'."]},
}
# CSV column -> (vlbench dataset, metric, prompts per class in CLIP_benchmark's run: CLIP's template sets, analysis)
COLUMNS = {
    "Average perf. on 38 datasets": ("average", "dataset_metric", None, "zeroshot"),
    "ImageNet 1k": ("imagenet-1k", "accuracy", 80, "zeroshot"),
    "CIFAR-10": ("cifar-10", "accuracy", 18, "zeroshot"),
    "CIFAR-100": ("cifar-100", "accuracy", 18, "zeroshot"),
    # the shifts: scored with imagenet-1k's 80-template class features restricted to each shift's classes, as
    # CLIP_benchmark's 80-template classifiers over the same classes (ObjectNet left out: CLIP_benchmark classifies
    # over ObjectNet's own 113 names without the border crop, vlbench as imagenet-testbed; docs/protocols.md)
    "ImageNet v2": ("imagenetv2", "accuracy", 80, "robustness"),
    "ImageNet Sketch": ("imagenet-sketch", "accuracy", 80, "robustness"),
    "ImageNet-R": ("imagenet-r", "accuracy", 80, "robustness"),
    "ImageNet-A": ("imagenet-a", "accuracy", 80, "robustness"),
}
PREPROCESS_CHECKED = ("size", "mean", "std", "interpolation", "resize_mode")
SOURCE = ("open_clip (Ilharco et al., OpenCLIP, Zenodo 2021; github.com/mlfoundations/open_clip), "
          "docs/openclip_results.csv: zero-shot results with LAION's CLIP_benchmark; row = (name, pretrained)")


def model_rows(conf: Path) -> tuple[dict[tuple[str, str], str], dict[tuple[str, str], str]]:
    """({(arch, tag): slug} exactly as conf/model names them, {(plain arch, tag): slug} for -quickgelu entries): the
    CSV names some QuickGELU checkpoints by the plain arch (OpenAI's; DFN-2B B/16, whose tag open_clip marks
    quick_gelu), which is the same weights and activation; a plain row is taken only where no exact row exists."""
    exact, plain = {}, {}
    for slug in MODELS:
        cfg = yaml.safe_load((conf / "model" / f"{slug}.yaml").read_text())
        exact[(cfg["arch"], cfg["pretrained"])] = slug
        if cfg["arch"].endswith("-quickgelu"):
            plain[(cfg["arch"].removesuffix("-quickgelu"), cfg["pretrained"])] = slug
    return exact, plain


def pick_records(csv_path: Path, conf: Path) -> list[tuple[str, dict]]:
    """[(slug, CSV record)]: each registered model's exact row, else its plain-arch row (the first of each)."""
    exact, plain = model_rows(conf)
    records = list(csv.DictReader(csv_path.open(newline="")))
    found = {}
    for r in records:
        slug = exact.get((r["name"], r["pretrained"]))
        if slug is not None and slug not in found:
            found[slug] = r
    for r in records:
        slug = plain.get((r["name"], r["pretrained"]))
        if slug is not None and slug not in found:
            found[slug] = r
    return list(found.items())


def entry_settings(conf: Path, slug: str) -> dict:
    """The checkable settings of a model's rows: the preprocessing and text handling its entry declares, which are
    open_clip's for the tag, what CLIP_benchmark ran (it builds models and tokenizers with open_clip's defaults). A
    run that deviates (reports/model.json's model_preprocess / text) gets no verdict against the published number."""
    cfg = yaml.safe_load((conf / "model" / f"{slug}.yaml").read_text())
    pp = dict(cfg["preprocess"])
    pp["size"] = [pp["size"], pp["size"]] if isinstance(pp["size"], int) else pp["size"]
    return {**{f"model.model_preprocess.{k}": pp[k] for k in PREPROCESS_CHECKED},
            **{f"model.text.{k}": v for k, v in cfg["text"].items()}}


def build(csv_path: Path, conf: Path) -> dict:
    exact, _ = model_rows(conf)
    rows = []
    for slug, record in pick_records(csv_path, conf):
        for column, (dataset, metric, prompts, analysis) in COLUMNS.items():
            printed = record[column]
            settings = {**entry_settings(conf, slug), **({} if prompts is None else {"params.prompts_per_class": prompts})}
            if dataset == "average":
                settings["datasets"] = None
            rows.append({"model": slug, "model_name": f"{record['name']} {record['pretrained']}",
                         "analysis": analysis, "dataset": dataset, "metric": metric, "value": float(printed),
                         "published": printed, "spread": None, "settings": settings,
                         "row": f"{record['name']},{record['pretrained']}", "column": column})
    missing = sorted(set(exact.values()) - {r["model"] for r in rows})
    if missing:
        raise SystemExit(f"{csv_path}: no row for {missing} (arch, pretrained as in conf/model/)")
    rows.sort(key=lambda r: (MODELS.index(r["model"]), list(COLUMNS).index(r["column"])))
    return {
        "paper": "open_clip", "table": "openclip_results.csv",
        "title": "Zero-shot results of open_clip's pretrained models (CLIP_benchmark), registered models only",
        "source": SOURCE,
        "settings": {"tool": "CLIP_benchmark zeroshot_classification", "params.split": "test",
                     "prompts": "CLIP's class names and template sets per dataset (80 for ImageNet-1k, 18 for CIFAR)",
                     "value": "top-1 accuracy as a fraction; the average is over CLIP_benchmark's 38 datasets"},
        "how_to_run": ("ImageNet-1k: dvc exp run -S model=<slug> -S suite=granularity (its zeroshot@imagenet-1k; "
                       "ImageNet's validation tars are a manual download); imagenet-1k's entry prompts with CLIP's "
                       "80 ImageNet templates (texts.templates: openclip:openai_imagenet), so prompts_per_class is 80 "
                       "as the reference needs. CIFAR-10/100: dvc exp run -S model=<slug> -S suite=elevater "
                       "(ELEVATER's distribution of the same test sets, with CLIP's 18 templates). The 38-dataset "
                       "average needs datasets vlbench does not register: listed, never compared. ImageNetV2, "
                       "ImageNet-Sketch, ImageNet-R, ImageNet-A: dvc exp run -S model=<slug> -S suite=robustness (each "
                       "shift scored with imagenet-1k's 80-template class features restricted to its classes, as "
                       "CLIP_benchmark's 80-template classifiers over the same classes)."),
        "rows": rows,
        "notes": ["Rows are the CSV's (name, pretrained) pairs equal to conf/model's (arch, pretrained); "
                  "vitb32-laion400m is ViT-B-32-quickgelu laion400m_e32 (not the plain ViT-B-32 row); "
                  "QuickGELU models without a -quickgelu row take the plain row (the same weights and activation: "
                  "OpenAI's, and dfn-vitb16's ViT-B-16 dfn2b, a tag open_clip marks quick_gelu).",
                  *NO_ROW.values(),
                  "Other per-dataset columns are left out: vlbench's entries for them are ELEVATER's distributions "
                  "with ELEVATER's metrics (mean-per-class, 11-point mAP, ROC-AUC) and templates, which are not "
                  "CLIP_benchmark's.",
                  "Values are printed to four decimals as fractions: the tolerance includes half of that last digit."],
    }


DATACOMP_SETTINGS = {
    "tool": "CLIP_benchmark zeroshot_classification / zeroshot_retrieval on DataComp's webdataset shards",
    "params.split": "test",
    "prompts": "the shards' classnames.txt and zeroshot_classification_templates.txt (what the table used)",
    "value": "each task's DataComp main metric as a fraction (tasklist.yml: acc1 unless it names another); the "
             "average is the plain mean of the 38 (DataComp's aggregate_scores.py)",
    "cells": [[t["analysis"], t["entry"], t["metric"]] for t in TASKS.values()],
}
DATACOMP_HOW = ("dvc exp run -S suite=datacomp -S model=<slug>: the 38 `wds-<task>` entries (DataComp's shards, "
                "pinned per shard), each scored with DataComp's main metric; the average row is compared when all 38 "
                "ran (mean of the cells listed in settings.cells). A model without a row is placed on the table "
                "instead (reports/index.html, 'On open_clip's table').")


def task_row(slug: str, model_name: str, row: str, column: str, printed: str, settings: dict) -> dict:
    """One reference row of a DataComp column (`column`: a TASKS key or the average)."""
    if column == AVERAGE:
        analysis, dataset, metric = "zeroshot", "average", "dataset_metric"
    else:
        analysis, dataset, metric = TASKS[column]["analysis"], TASKS[column]["entry"], TASKS[column]["metric"]
    value = float(printed)
    return {"model": slug, "model_name": model_name, "analysis": analysis, "dataset": dataset, "metric": metric,
            "value": value if value <= 1 else value / 100, "published": printed, "spread": None,
            "settings": settings, "row": row, "column": column}


def check_columns(csv_path: Path) -> list[str]:
    """The CSV's per-dataset columns, which must be TASKS' in order (else the table changed: update TASKS)."""
    header = next(csv.reader(csv_path.open(newline="")))
    columns = header[header.index(AVERAGE) + 1:]
    if columns != list(TASKS):
        raise SystemExit(f"{csv_path}: columns {columns} are not vlbench.reference.datacomp.TASKS' {list(TASKS)}")
    return [AVERAGE, *columns]


def build_datacomp(csv_path: Path, conf: Path) -> dict:
    columns = check_columns(csv_path)
    rows = [task_row(slug, f"{r['name']} {r['pretrained']}", f"{r['name']},{r['pretrained']}", column, r[column],
                     entry_settings(conf, slug))
            for slug, r in pick_records(csv_path, conf) for column in columns]
    rows.sort(key=lambda r: (MODELS.index(r["model"]), columns.index(r["column"])))
    return {
        "paper": "open_clip", "table": "openclip_results.csv (DataComp's 38)",
        "title": "Zero-shot results of open_clip's pretrained models on DataComp's 38 evaluation tasks and their "
                 "average (CLIP_benchmark on DataComp's shards), registered models only",
        "source": SOURCE + "; columns = DataComp's tasks (mlfoundations/datacomp tasklist.yml, main_metric)",
        "settings": DATACOMP_SETTINGS, "how_to_run": DATACOMP_HOW, "rows": rows,
        "notes": ["Every column of the CSV: the 38 tasks (dataset = the `datacomp` suite's entry wds-<DataComp task "
                  "key, '/' as '-'>, metric = DataComp's main metric as vlbench names it) and the average "
                  "(dataset 'average', the mean of the 38 cells in settings.cells).",
                  *NO_ROW.values(), *(f"{slug}: {text}" for slug, text in NEW_FAMILIES.items()),
                  "Values are printed to four decimals as fractions: the tolerance includes half of that last digit."],
    }


def build_population(csv_path: Path) -> dict:
    columns = check_columns(csv_path)
    models = [{"name": r["name"], "pretrained": r["pretrained"], "values": {c: float(r[c]) for c in columns}}
              for r in csv.DictReader(csv_path.open(newline=""))]
    return {"source": SOURCE, "about": "every row of the CSV, its average and 38 per-task numbers (fractions); the "
                                      "population vlbench.reference.datacomp.place ranks a run in",
            "columns": columns, "models": models}


def build_mobileclip2(folder: Path, conf: Path) -> dict:
    rows = []
    for slug, name in MOBILECLIP2.items():
        cells = {json.loads(line)["dataset"]: json.loads(line) for line in (folder / name).read_text().splitlines()
                 if line.strip()}
        for column, task in TASKS.items():
            cell = cells[column]
            if cell["key"] != task["task"]:
                raise SystemExit(f"{folder / name}: {column!r} has key {cell['key']!r}, not {task['task']!r}")
            rows.append(task_row(slug, f"MobileCLIP2 {name}", f"results/{name}", column,
                                 repr(float(cell["metrics"]["main_metric"])), entry_settings(conf, slug)))
    return {
        "paper": "mobileclip2", "table": "results/mobileclip2_*.jsonl",
        "title": "MobileCLIP2's published zero-shot results on DataComp's 38 tasks (its authors' result files)",
        "source": ("Faghri et al., MobileCLIP2: Improving Multi-Modal Reinforced Training, TMLR 2025; "
                   f"{MOBILECLIP2_REV} results/<model>.jsonl, each task's main_metric"),
        "settings": {**{k: v for k, v in DATACOMP_SETTINGS.items() if k != "cells"},
                     "tool": "DataComp's evaluation (open_clip with MobileCLIP2's models)"},
        "how_to_run": "dvc exp run -S suite=datacomp -S model=<slug> (slug: mobileclip2-s0, mobileclip2-b, "
                      "mobileclip2-l14)",
        "rows": rows,
        "notes": ["The files print no average: none is compared. Values are the files' full-precision floats."],
    }


def build_readme(paper: str, conf: Path) -> dict:
    """One of README_TABLES: the authors' printed cells as rows naming the `datacomp` suite's entries."""
    spec = README_TABLES[paper]
    rows = []
    for slug, (row, cells) in README_CELLS[paper].items():
        for column, printed in cells.items():
            name, metric = README_COLUMNS[column]
            t = TASKS[name]
            rows.append({"model": slug, "model_name": row, "analysis": t["analysis"], "dataset": t["entry"],
                         "metric": metric, "value": float(printed) / 100, "published": printed, "spread": None,
                         "settings": entry_settings(conf, slug), "row": row, "column": column})
    return {"paper": paper, "table": spec["table"], "title": spec["title"], "source": spec["source"],
            "settings": spec["settings"],
            "how_to_run": f"dvc exp run -S suite=datacomp -S model=<slug> (slug: {spec['slugs']}); the rows name the "
                          "wds- entries of the tasks (ImageNet 1k, v2, -A, ObjectNet, MSCOCO)",
            "rows": rows, "notes": spec["notes"]}


def write(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--conf", type=Path, default=Path("conf"))
    ap.add_argument("--mobileclip2", type=Path, default=None,
                    help="folder of apple/ml-mobileclip's results/mobileclip2_*.jsonl (left out: that file is not "
                         "written)")
    ap.add_argument("--out", type=Path, default=Path("vlbench/reference/data/open_clip_results.json"))
    ap.add_argument("--out-dir", type=Path, default=Path("vlbench/reference"),
                    help="where the other files go (data/open_clip_datacomp.json, data/pe_core.json, "
                         "data/siglip2_readme.json, "
                         "data/mobileclip2_results.json, openclip_population.json)")
    args = ap.parse_args()
    write(args.out, build(args.csv, args.conf))
    write(args.out_dir / "data" / "open_clip_datacomp.json", build_datacomp(args.csv, args.conf))
    write(args.out_dir / "openclip_population.json", build_population(args.csv))
    for paper, spec in README_TABLES.items():
        write(args.out_dir / "data" / spec["file"], build_readme(paper, args.conf))
    if args.mobileclip2 is not None:
        write(args.out_dir / "data" / "mobileclip2_results.json", build_mobileclip2(args.mobileclip2, args.conf))


if __name__ == "__main__":
    main()
