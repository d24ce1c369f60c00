"""Write vlbench/reference/data/open_clip_results.json from open_clip's published results table.

    python tools/openclip_reference.py CSV [--out FILE]

CSV is open_clip's `docs/openclip_results.csv` (the zero-shot results of every pretrained model, made with
LAION's CLIP_benchmark). Only the rows of vlbench's registered real models (conf/model/*.yaml: arch and pretrained
tag, matched exactly) and only the columns below are written, in vlbench's reference schema; nothing else of the
CSV enters the project, and the project never downloads it. Deterministic: running it twice gives the same file.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import yaml

MODELS = ("vitb32", "vitb16", "vitl14", "rn50", "vitb32-laion400m", "vitb32-laion2b", "vitl14-laion2b",
          "siglip-vitb16", "datacomp-vitb16", "dfn-vitb16", "dfn-vitl14", "metaclip-vitb16")
# registered models the CSV has no row for (listed in the file's notes, so that their absence is said, not silent)
NO_ROW = {"siglip2-vitb16": "open_clip's results table has no SigLIP 2 rows (the CSV read for this file lists SigLIP "
                            "1 and nllb-clip SigLIP models only): no published number is compared for siglip2-vitb16"}
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--conf", type=Path, default=Path("conf"))
    ap.add_argument("--out", type=Path, default=Path("vlbench/reference/data/open_clip_results.json"))
    args = ap.parse_args()
    args.out.write_text(json.dumps(build(args.csv, args.conf), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
