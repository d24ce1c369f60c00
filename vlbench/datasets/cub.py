"""Caltech-UCSD Birds-200-2011 (Wah et al., 2011) as a dataset source (`source: cub`): FewTrans's held-out dataset
for ImageNet-trained models (its Sec. 5).

`prepare: {source: cub}` (optional `files: {archive: {...}}` for another mirror of the archive).

File: CUB_200_2011.tgz from data.caltech.edu (1,150,585,339 bytes), verified by its sha256 (the one torchvision's
prototype CUB200 pins) and md5. Read from the archive as a stream, nothing extracted: a first pass reads the four
listings of `CUB_200_2011/`, then one pass per split reads that split's JPEGs under `CUB_200_2011/images/`.

- `classes.txt` (`<class_id> <NNN.Class_Name>`): the 200 classes in class-id order; shown name = the folder name
  without its `NNN.` prefix, `_` as spaces ("001.Black_footed_Albatross" -> "Black footed Albatross"); the folder
  name is the class `key`. These are the 200 classes FewTrans and Meta-Dataset use.
- `images.txt` (`<image_id> <path>`), `image_class_labels.txt` (`<image_id> <class_id>`): each image's label
  (class id - 1); an image's folder must be its class's folder.
- `train_test_split.txt` (`<image_id> <1|0>`): splits `train` (1: 5,994 images) and `test` (0: 5,794).

`sample_id` = the image's path in images.txt; rows in archive order. Every listed image must be in the archive.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

from vlbench.datasets.archives import iter_members
from vlbench.datasets.canonical import ClassInfo, DatasetError, DatasetMeta, write_dataset
from vlbench.datasets.download import fetch_files
from vlbench.datasets.images import checked_rows
from vlbench.datasets.spec import check_flag, check_keys

KEYS = ("source", "files", "skip_corrupt")
ROOT = "CUB_200_2011"
ARCHIVE = {"file": "CUB_200_2011.tgz",
           "url": "https://data.caltech.edu/records/65de6-vp158/files/CUB_200_2011.tgz?download=1",
           "sha256": "0c685df5597a8b24909f6a7c9db6d11e008733779a671760afef78feb49bf081",
           "md5": "97eceeb196236b17998738112f37df78"}
LISTINGS = ("classes.txt", "images.txt", "image_class_labels.txt", "train_test_split.txt")
SPLITS = {"train": 5_994, "test": 5_794}
SPLIT_FLAG = {"1": "train", "0": "test"}


def catalogue_row(name: str, spec: dict) -> dict:
    check_keys(name, spec, KEYS)
    return {"classes": 200, "splits": dict(SPLITS), "metric": "accuracy", "manual_download": False}


def build(name: str, spec: dict, out_dir: Path) -> DatasetMeta:
    check_keys(name, spec, KEYS)
    res, archive = fetch_files(name, spec, {"archive": ARCHIVE})["archive"]
    listings = read_listings(name, archive)
    classes = class_infos(name, listings["classes.txt"])
    images = image_table(name, listings, classes)
    provenance = {"source": "cub",
                  "upstream": "CUB-200-2011 (Wah et al., 2011), https://www.vision.caltech.edu/datasets/cub_200_2011/",
                  "files": {"archive": res.provenance(archive)}, "counts": {}, "skipped_corrupt": []}
    meta = DatasetMeta(name=name, task="single-label", metric="accuracy", classes=classes, provenance=provenance)
    skip = check_flag(name, spec, "skip_corrupt")
    rows = {split: checked_rows(name, split, _rows(name, archive, images, split), skip, provenance,
                                "replace the archive") for split in SPLITS}
    return write_dataset(out_dir, meta, rows)


def read_listings(name: str, archive: Path) -> dict[str, list[list[str]]]:
    """The four listings of CUB_200_2011/, each line split in two at its first space."""
    wanted = {f"{ROOT}/{f}": f for f in LISTINGS}
    found = {wanted[m]: data for m, data in iter_members(archive, (".txt",)) if m in wanted}
    missing = [f"{ROOT}/{f}" for f in LISTINGS if f not in found]
    if missing:
        raise DatasetError(f"dataset {name!r}: archive {archive} has no {', '.join(missing)}; is it CUB_200_2011.tgz?")
    return {f: [line.split(" ", 1) for line in found[f].decode().splitlines() if line.strip()] for f in LISTINGS}


def class_infos(name: str, lines: list[list[str]]) -> list[ClassInfo]:
    ids = [int(i) for i, _ in lines]
    if ids != list(range(1, len(ids) + 1)):
        raise DatasetError(f"dataset {name!r}: {ROOT}/classes.txt's class ids are not 1..{len(ids)}")
    return [ClassInfo(index=i, name=folder.strip().split(".", 1)[-1].replace("_", " "), key=folder.strip())
            for i, (_, folder) in enumerate(lines)]


def image_table(name: str, listings: Mapping[str, list[list[str]]],
                classes: list[ClassInfo]) -> dict[str, tuple[str, int]]:
    """{archive member: (split, label)} of every image images.txt lists."""
    labels = {i: int(c) - 1 for i, c in listings["image_class_labels.txt"]}
    splits = {i: flag.strip() for i, flag in listings["train_test_split.txt"]}
    table = {}
    for image_id, path in listings["images.txt"]:
        path = path.strip()
        if image_id not in labels or splits.get(image_id) not in SPLIT_FLAG:
            raise DatasetError(f"dataset {name!r}: image {image_id} ({path}) of {ROOT}/images.txt has no class in "
                               f"image_class_labels.txt or no 1/0 in train_test_split.txt")
        label = labels[image_id]
        if not 0 <= label < len(classes) or path.split("/")[0] != classes[label].key:
            raise DatasetError(f"dataset {name!r}: image {path} has class id {label + 1}, whose folder in "
                               f"{ROOT}/classes.txt is not the image's folder")
        table[f"{ROOT}/images/{path}"] = (SPLIT_FLAG[splits[image_id]], label)
    return table


def _rows(name: str, archive: Path, images: Mapping[str, tuple[str, int]], split: str) -> Iterator[dict]:
    """One split's rows, streamed from the archive; every listed image of the split must be there."""
    prefix = f"{ROOT}/images/"
    seen = 0
    for member, data in iter_members(archive, (".jpg",)):
        if images.get(member, ("",))[0] == split:
            seen += 1
            yield {"sample_id": member[len(prefix):], "label": images[member][1], "image": data}
    expected = sum(s == split for s, _ in images.values())
    if seen != expected:
        raise DatasetError(f"dataset {name!r}: archive {archive} holds {seen} of the {expected} {split} images "
                           f"{ROOT}/images.txt lists; is the archive complete?")
