"""tieredImageNet's two-level split (Ren et al., ICLR 2018) over ImageNet's validation images.

The granularity paper (Xu et al.) evaluates its two-level variant on the ILSVRC-12 validation images of the 608
tieredImageNet classes, grouped into their 34 categories. The split files (`train.csv`, `val.csv`, `test.csv`,
headerless `class_wnid,category_wnid`) come from renmengye/few-shot-ssl-public at a pinned commit, verified by
sha256; their union is the class set (the few-shot train/val/test partition does not matter here and is kept
per class as `tiered_split`). Classes keep the standard ImageNet order with CLIP's names and wnids; `group` is
the category's name: the first lemma of its WordNet 3.0 synset (underscores as spaces), so no other file is
needed. Images: the manual ImageNet files of `imagenet-1k` (vlbench/datasets/imagenet.py), split `test`.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pyarrow as pa

from vlbench.datasets import imagenet
from vlbench.datasets.canonical import (
    ClassInfo,
    DatasetError,
    DatasetMeta,
    write_dataset,
)
from vlbench.datasets.images import checked_rows
from vlbench.datasets.download import fetch_files
from vlbench.datasets.spec import check_flag, check_keys

KEYS = ("source", "files", "skip_corrupt")
COMMIT = "4ce8726c036ae2811050e9571e8d2b4b46b2acac"
BASE_URL = f"https://raw.githubusercontent.com/renmengye/few-shot-ssl-public/{COMMIT}/fewshot/data/tiered_imagenet_split/"
UPSTREAM = f"renmengye/few-shot-ssl-public@{COMMIT[:8]} fewshot/data/tiered_imagenet_split; ILSVRC2012 validation"
SPLIT_SHA256 = {
    "train": "6b87c8440f610d406bce85ac70db018485cc1b036a9106d512e75e4988eb3e15",
    "val": "e63540c17e82c2de98df9244b03cdb7e214ea513ae543d6dbc29998f9597cfc5",
    "test": "a478b4481aae4003b6b3c7a09f9ddc56b36f54652e01b83d07a8e6ee1b789d56",
}
SPLIT_FILES = {f"split_{s}": {"file": f"tieredImageNet-{COMMIT[:8]}-{s}.csv", "url": f"{BASE_URL}{s}.csv",
                              "sha256": sha} for s, sha in SPLIT_SHA256.items()}
FILES = {**SPLIT_FILES, **imagenet.FILES}
CLASSES, CATEGORIES = 608, 34  # as published


def catalogue_row(name: str, spec: dict) -> dict:
    check_keys(name, spec, KEYS)
    return {"classes": CLASSES, "splits": {imagenet.SPLIT: CLASSES * imagenet.VAL_PER_CLASS}, "metric": "accuracy",
            "manual_download": True}


def read_split_files(name: str, paths: dict[str, Path]) -> dict[str, tuple[str, str]]:
    """class wnid -> (category wnid, tieredImageNet split), refusing a class listed twice or a malformed line."""
    category_of: dict[str, tuple[str, str]] = {}
    for split in SPLIT_SHA256:
        path = paths[f"split_{split}"]
        with path.open(newline="") as f:
            for line_no, row in enumerate(csv.reader(f), 1):
                if len(row) != 2 or not all(w.startswith("n") and len(w) == 9 for w in row):
                    raise DatasetError(f"dataset {name!r}: {path} line {line_no}: expected 'class_wnid,category_wnid', got {row}")
                if row[0] in category_of:
                    raise DatasetError(f"dataset {name!r}: {path} line {line_no}: class {row[0]} is listed twice")
                category_of[row[0]] = (row[1], split)
    return category_of


def category_names(name: str, categories: list[str]) -> dict[str, str]:
    """category wnid -> its WordNet 3.0 first lemma (underscores as spaces); the wnid appended where two clash."""
    from vlbench.wordnet import load_wordnet, synset_from_wnid

    wn = load_wordnet()
    lemmas = {c: synset_from_wnid(wn, c).lemma_names()[0].replace("_", " ") for c in categories}
    clashes = {n for n in lemmas.values() if list(lemmas.values()).count(n) > 1}
    return {c: f"{n} ({c})" if n in clashes else n for c, n in lemmas.items()}


def tiered_classes(name: str, imagenet_classes: list[ClassInfo], category_of: dict[str, tuple[str, str]],
                   names: dict[str, str]) -> list[ClassInfo]:
    missing = sorted(set(category_of) - {c.wnid for c in imagenet_classes})
    if missing:
        raise DatasetError(f"dataset {name!r}: tieredImageNet classes not among ImageNet's: {missing[:10]}")
    chosen = [c for c in imagenet_classes if c.wnid in category_of]
    return [ClassInfo(index=i, name=c.name, wnid=c.wnid, group=names[category_of[c.wnid][0]], aliases=list(c.aliases))
            for i, c in enumerate(chosen)]


def build(name: str, spec: dict, out_dir: Path) -> DatasetMeta:
    check_keys(name, spec, KEYS)
    skip = check_flag(name, spec, "skip_corrupt")
    files = fetch_files(name, spec, FILES)
    paths = {role: path for role, (_, path) in files.items()}
    category_of = read_split_files(name, paths)
    categories = sorted({c for c, _ in category_of.values()})
    if (len(category_of), len(categories)) != (CLASSES, CATEGORIES):
        raise DatasetError(f"dataset {name!r}: the split files give {len(category_of)} classes in {len(categories)} "
                           f"categories; tieredImageNet has {CLASSES} in {CATEGORIES} (use {UPSTREAM.split(';')[0]})")
    names = category_names(name, categories)
    devkit = imagenet.read_devkit(name, paths["devkit"])
    classes = tiered_classes(name, imagenet.imagenet_classes(name, devkit), category_of, names)
    provenance = {
        "source": "tiered", "upstream": UPSTREAM, "class_names": imagenet.CLASS_NAMES_SOURCE,
        "categories": [{"wnid": c, "name": names[c]} for c in categories],
        "files": {role: res.provenance(path) for role, (res, path) in files.items()},
        "skipped_corrupt": [],
    }
    meta = DatasetMeta(name=name, task="single-label", metric="accuracy", classes=classes, provenance=provenance)
    label = {c.wnid: c.index for c in classes}
    category_label = {c: i for i, c in enumerate(categories)}
    samples = ({"sample_id": sid, "label": label[wnid], "image": data, "category": category_label[category_of[wnid][0]],
                "tiered_split": category_of[wnid][1]}
               for sid, wnid, data in imagenet.iter_val_images(name, paths["val_images"], devkit) if wnid in label)
    rows = checked_rows(name, imagenet.SPLIT, samples, skip, provenance, imagenet.FIX)
    return write_dataset(out_dir, meta, {imagenet.SPLIT: rows},
                         extra_columns={"category": pa.int64(), "tiered_split": pa.string()})
