"""Write vlbench/reference/data/open_clip_retrieval.json from open_clip's published retrieval results.

    python tools/openclip_retrieval_reference.py CSV [--out FILE]

CSV is open_clip's `docs/openclip_retrieval_results.csv` (zero-shot retrieval of every pretrained model on Flickr30k
and MSCOCO, made with LAION's CLIP_benchmark). Only the rows of vlbench's registered real models (as
tools/openclip_reference.py matches them) and only the twelve Recall@K columns are written, in vlbench's reference
schema; nothing else of the CSV enters the project, and the project never downloads it. Deterministic.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

from openclip_reference import MODELS, model_rows  # tools/ is this script's folder

DATASETS = {"Flickr": "flickr30k-karpathy-1k", "MSCOCO": "coco-karpathy-5k"}
DIRECTIONS = {"text": "i2t", "image": "t2i"}  # CLIP_benchmark's "text retrieval" queries with images
COLUMNS = {f"{name} {kind} retr. R@{k}": (dataset, f"{direction}_r{k}")
           for name, dataset in DATASETS.items() for kind, direction in DIRECTIONS.items() for k in (1, 5, 10)}
SOURCE = ("open_clip (Ilharco et al., OpenCLIP, Zenodo 2021; github.com/mlfoundations/open_clip), "
          "docs/openclip_retrieval_results.csv: zero-shot retrieval with LAION's CLIP_benchmark; row = (name, "
          "pretrained)")


def build(csv_path: Path, conf: Path) -> dict:
    wanted = model_rows(conf)
    rows = []
    for record in csv.DictReader(csv_path.open(newline="")):
        slug = wanted.get((record["name"], record["pretrained"]))
        if slug is None or any(r["model"] == slug for r in rows):  # the first of a quickgelu / plain pair
            continue
        for column, (dataset, metric) in COLUMNS.items():
            printed = record[column]
            rows.append({"model": slug, "model_name": f"{record['name']} {record['pretrained']}",
                         "analysis": "retrieval", "dataset": dataset, "metric": metric, "value": float(printed),
                         "published": printed, "spread": None, "settings": {},
                         "row": f"{record['name']},{record['pretrained']}", "column": column})
    missing = sorted(set(wanted.values()) - {r["model"] for r in rows})
    if missing:
        raise SystemExit(f"{csv_path}: no row for {missing} (arch, pretrained as in conf/model/)")
    rows.sort(key=lambda r: (MODELS.index(r["model"]), list(COLUMNS).index(r["column"])))
    return {
        "paper": "open_clip", "table": "openclip_retrieval_results.csv",
        "title": "Zero-shot retrieval of open_clip's pretrained models (CLIP_benchmark), registered models only",
        "source": SOURCE,
        "settings": {"tool": "CLIP_benchmark zeroshot_retrieval", "params.split": "test", "params.text_set": "captions",
                     "params.duplicates": "distinct",
                     "captions": "raw captions, no prompt, the model's open_clip tokenizer",
                     "ties": "torch.topk's order (unspecified; vlbench's retrieval.ties: index is the stable order)",
                     "precision": "CLIP_benchmark's default fp16 autocast on GPU",
                     "value": "Recall@K as a fraction: text retrieval = i2t (image queries), image retrieval = t2i"},
        "how_to_run": ("dvc exp run -S model=<slug> -S suite=retrieval -S retrieval.text_set=captions "
                       "(CLIP_benchmark's raw captions; the default prepends the CLIP paper's 'a photo of '). "
                       "Flickr30k's images are a manual download (flickr30k-images.tar.gz, see its entry)."),
        "rows": rows,
        "notes": ["Rows are the CSV's (name, pretrained) pairs equal to conf/model's (arch, pretrained), as in "
                  "open_clip_results.json.",
                  "CLIP_benchmark reads its own conversions of Karpathy's test splits (coco_test_karpathy.json, "
                  "flickr30k_test_karpathy.txt) and Kaggle's Flickr30k images; vlbench reads Karpathy's "
                  "dataset_*.json and the official images: the same test images, caption counts not verified here.",
                  "Values are printed to four decimals as fractions: the tolerance includes half of that last digit."],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", type=Path)
    ap.add_argument("--conf", type=Path, default=Path("conf"))
    ap.add_argument("--out", type=Path, default=Path("vlbench/reference/data/open_clip_retrieval.json"))
    args = ap.parse_args()
    args.out.write_text(json.dumps(build(args.csv, args.conf), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
