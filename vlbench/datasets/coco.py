"""COCO 2017 val with captions and Localized Narratives (`source: coco`), for the specificity analysis.

Three upstream files, fetched and verified by the download layer:

- the images, `val2017.zip` (`val2017/<12-digit id>.jpg`), read as distributed from the extracted archive;
- the annotations, `annotations_trainval2017.zip`, of which two members are read without extracting the rest:
  `annotations/instances_val2017.json` (per-image object categories) and `annotations/captions_val2017.json`;
- Localized Narratives (Pont-Tuset et al.), `coco_val_localized_narratives.jsonl`: one JSON object a line with
  `image_id` (a string), `annotator_id`, `caption`, ...; several narratives per image are possible and some images
  have none.

The COCO JSON files are plain JSON: they are parsed with the standard library rather than pycocotools, whose
`COCO` class only adds an index over the same lists (and needs a compiled extension and numpy, and prints to
stdout); here each file is checked as it is read, with errors that name the file and the key.

Prepared dataset: one split (`val`, 5,000 images in image-id order), task multi-label over COCO's 80 categories in
category-id order (class `key` = the category id, `group` = its supercategory), per sample `labels` = the sorted
unique category indices of all its instance annotations (crowd regions included; an image without instances has
an empty list), `captions` (COCO's captions, in annotation-id order) and `narratives` (its Localized Narratives,
in file order), both lists of strings with surrounding whitespace stripped; `coco_id` the integer image id;
`sample_id` the 12-digit file stem.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pyarrow as pa

from vlbench.datasets.archives import extract, read_member
from vlbench.datasets.canonical import (
    ClassInfo,
    DatasetError,
    DatasetMeta,
    write_dataset,
)
from vlbench.datasets.images import checked_rows
from vlbench.datasets.download import Resource, fetch, forget_verification, resource
from vlbench.datasets.spec import check_flag, check_keys

SPEC_KEYS = ("source", "images", "annotations", "narratives", "coco_split", "splits", "classes", "metric",
             "skip_corrupt")
EXTRA_COLUMNS = {"captions": pa.list_(pa.string()), "narratives": pa.list_(pa.string()), "coco_id": pa.int64()}
MAX_REPORTED = 20  # ids named in one error; the rest are counted


@dataclass(frozen=True)
class CocoSpec:
    images: Resource
    annotations: Resource
    narratives: Resource
    coco_split: str  # COCO's name: val2017
    split: str  # ours: val
    size: int | None  # the expected number of images (5000)
    classes: int | None  # the expected number of categories (80)
    metric: str
    skip_corrupt: bool

    @property
    def instances_member(self) -> str:
        return f"annotations/instances_{self.coco_split}.json"

    @property
    def captions_member(self) -> str:
        return f"annotations/captions_{self.coco_split}.json"


@dataclass
class Annotations:
    """What the prepared dataset needs from COCO's files, by image id."""

    classes: list[ClassInfo]
    files: dict[int, str]  # image id -> file name
    labels: dict[int, list[int]]  # image id -> sorted unique class indices
    captions: dict[int, list[str]]
    narratives: dict[int, list[str]]


# ------------------------------------------------------------------------------------------------ public


def build(name: str, spec: dict, out_dir: str | Path) -> DatasetMeta:
    """Fetch the three files, read the annotations, and write the canonical multi-label dataset."""
    cfg = parse_spec(name, spec)
    paths = {key: fetch(getattr(cfg, key), name) for key in ("annotations", "narratives", "images")}
    ann = read_annotations(name, cfg, paths["annotations"], paths["narratives"])
    if cfg.size is not None and len(ann.files) != cfg.size:
        raise DatasetError(f"dataset {name!r}: {paths['annotations'].name}!{cfg.instances_member} lists "
                           f"{len(ann.files)} images, expected {cfg.size} (spec 'splits'); is this the right file?")
    if cfg.classes is not None and len(ann.classes) != cfg.classes:
        raise DatasetError(f"dataset {name!r}: {paths['annotations'].name}!{cfg.instances_member} has "
                           f"{len(ann.classes)} categories, expected {cfg.classes} (spec 'classes')")
    folder = extract(paths["images"]) / cfg.coco_split
    images = locate_images(name, paths["images"], folder, ann.files)
    provenance = {
        "source": "coco",
        "upstream": f"COCO 2017 ({cfg.coco_split}), captions and instances 2017; Localized Narratives (COCO val)",
        "files": [getattr(cfg, key).provenance(path) for key, path in paths.items()],
        "coco_split": cfg.coco_split,
        "captions": sum(map(len, ann.captions.values())),
        "narratives": sum(map(len, ann.narratives.values())),
        "images_without_instances": sum(1 for i in ann.files if not ann.labels.get(i)),
        "images_without_narratives": sum(1 for i in ann.files if not ann.narratives.get(i)),
        "counts": {},
        "skipped_corrupt": [],
    }
    meta = DatasetMeta(name=name, task="multi-label", metric=cfg.metric, classes=ann.classes, provenance=provenance)
    rows = {cfg.split: _rows(name, cfg, ann, images, provenance)}
    return write_dataset(out_dir, meta, rows, extra_columns=EXTRA_COLUMNS)


def catalogue_row(name: str, spec: dict) -> dict:
    """Classes, split size and metric from the spec (COCO's published numbers), without any download."""
    cfg = parse_spec(name, spec)
    resources = (cfg.images, cfg.annotations, cfg.narratives)
    return {"classes": cfg.classes, "splits": {cfg.split: cfg.size} if cfg.size is not None else {},
            "metric": cfg.metric, "manual_download": any(not res.urls for res in resources)}


def parse_spec(name: str, spec: Mapping) -> CocoSpec:
    check_keys(name, spec, SPEC_KEYS, "coco")
    for key in ("images", "annotations", "narratives"):
        if not isinstance(spec.get(key), Mapping):
            raise DatasetError(f"dataset {name!r}: {key!r} must be a resource mapping {{file, url, sha256|md5}}, "
                               f"got {spec.get(key)!r}")
    coco_split = spec.get("coco_split", "val2017")
    if not isinstance(coco_split, str) or not coco_split.isidentifier():
        raise DatasetError(f"dataset {name!r}: 'coco_split' must be COCO's split name such as 'val2017', got {coco_split!r}")
    splits = spec.get("splits", {"val": None})
    if not isinstance(splits, Mapping) or len(splits) != 1:
        raise DatasetError(f"dataset {name!r}: 'splits' must name the one split and its size, e.g. {{val: 5000}}, "
                           f"got {splits!r}")
    (split, size), = splits.items()
    metric = spec.get("metric", "map_11point")
    if metric != "map_11point":
        raise DatasetError(f"dataset {name!r}: metric {metric!r}: COCO's labels are multi-label, use map_11point")
    return CocoSpec(
        images=resource(name, spec["images"]), annotations=resource(name, spec["annotations"]),
        narratives=resource(name, spec["narratives"]), coco_split=coco_split, split=str(split),
        size=positive_int(name, f"splits.{split}", size), classes=positive_int(name, "classes", spec.get("classes")),
        metric=metric, skip_corrupt=check_flag(name, spec, "skip_corrupt"),
    )


def read_annotations(name: str, cfg: CocoSpec, annotations_zip: Path, narratives_path: Path) -> Annotations:
    """Classes, image files and labels from the instances file, captions from the captions file, narratives from
    the jsonl; every caption and narrative must belong to an image of the instances file."""
    instances = _json_member(name, annotations_zip, cfg.instances_member)
    where = f"{annotations_zip.name}!{cfg.instances_member}"
    classes, index = _categories(name, where, instances)
    files = _images(name, where, instances)
    labels = _labels(name, where, instances, files, index)
    del instances  # the largest object here (segmentation polygons): let it go before the next file
    captions_where = f"{annotations_zip.name}!{cfg.captions_member}"
    captions = _captions(name, captions_where, _json_member(name, annotations_zip, cfg.captions_member), files)
    try:
        narratives = read_narratives(name, narratives_path, files, f"mscoco_{cfg.coco_split}")
    except DatasetError as err:  # no checksum vouches for this file: let the next run download it again
        raise DatasetError(f"{err} ({narratives_path.name}: {forget_verification(narratives_path)})") from None
    return Annotations(classes=classes, files=files, labels=labels, captions=captions, narratives=narratives)


def read_narratives(name: str, path: Path, files: Mapping[int, str], dataset_id: str) -> dict[int, list[str]]:
    """{image id: [narrative, ...]} from a Localized Narratives jsonl, in file order; blank lines are skipped."""
    found: dict[int, list[str]] = defaultdict(list)
    for number, line in _numbered_lines(name, path):
        if not line.strip():
            continue
        where = f"{path.name} line {number}"
        obj = _json_line(name, where, line)
        if obj.get("dataset_id", dataset_id) != dataset_id:
            raise DatasetError(f"dataset {name!r}: {where}: dataset_id {obj['dataset_id']!r}, expected "
                               f"{dataset_id!r}: these are narratives of another image set")
        image_id = _image_id(name, where, obj.get("image_id"))
        if image_id not in files:
            raise DatasetError(f"dataset {name!r}: {where}: image_id {obj['image_id']!r} is not an image of the "
                               f"instances file; these narratives belong to another image set")
        found[image_id].append(_text(name, where, obj, "caption"))
    return dict(found)


def locate_images(name: str, archive: Path, folder: Path, files: Mapping[int, str]) -> dict[int, Path]:
    """{image id: file} in the extracted image archive; every missing image is reported at once."""
    if not folder.is_dir():
        raise DatasetError(f"dataset {name!r}: archive {str(archive)!r} has no folder {folder.name!r}")
    found = {image_id: folder / file_name for image_id, file_name in files.items()}
    missing = sorted(files[i] for i, path in found.items() if not path.is_file())
    if missing:
        raise DatasetError(f"dataset {name!r}: {len(missing)} image(s) of the annotations are not in "
                           f"{archive.name} ({folder.name}/): {preview(missing)}")
    return found


# ------------------------------------------------------------------------------------------------ reading


def _json_member(name: str, archive: Path, member: str) -> dict:
    try:
        obj = json.loads(read_member(archive, member))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DatasetError(f"dataset {name!r}: {archive.name}!{member} is not valid JSON ({err})") from err
    if not isinstance(obj, dict):
        raise DatasetError(f"dataset {name!r}: {archive.name}!{member} must be a JSON object, got {type(obj).__name__}")
    return obj


def _numbered_lines(name: str, path: Path) -> Iterator[tuple[int, str]]:
    try:
        with open(path, encoding="utf-8") as handle:
            yield from enumerate(handle, 1)
    except (OSError, UnicodeDecodeError) as err:
        raise DatasetError(f"dataset {name!r}: cannot read {path}: {err}") from err


def _json_line(name: str, where: str, line: str) -> dict:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        raise DatasetError(f"dataset {name!r}: {where}: not valid JSON ({err})") from err
    if not isinstance(obj, dict):
        raise DatasetError(f"dataset {name!r}: {where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def json_records(name: str, where: str, obj: dict, key: str, fields: dict[str, type]) -> Iterator[dict]:
    """The objects of list `key`, each checked to have `fields` of the given types."""
    items = obj.get(key)
    if not isinstance(items, list):
        raise DatasetError(f"dataset {name!r}: {where}: key {key!r} must be a list, got {type(items).__name__}")
    for i, item in enumerate(items):
        bad = [f for f, kind in fields.items()
               if not isinstance(item, dict) or not isinstance(item.get(f), kind) or isinstance(item.get(f), bool)]
        if bad:
            raise DatasetError(f"dataset {name!r}: {where}: {key}[{i}] lacks {bad} (or has the wrong type): {item!r:.200}")
        yield item


def _categories(name: str, where: str, obj: dict) -> tuple[list[ClassInfo], dict[int, int]]:
    """Classes in category-id order and {category id: class index}."""
    cats = sorted(json_records(name, where, obj, "categories", {"id": int, "name": str, "supercategory": str}),
                  key=lambda c: c["id"])
    ids = [c["id"] for c in cats]
    if len(set(ids)) != len(ids):
        raise DatasetError(f"dataset {name!r}: {where}: a category id occurs twice in 'categories'")
    if not cats:
        raise DatasetError(f"dataset {name!r}: {where}: 'categories' is empty")
    classes = [ClassInfo(index=i, name=c["name"], key=str(c["id"]), group=c["supercategory"]) for i, c in enumerate(cats)]
    return classes, {c["id"]: i for i, c in enumerate(cats)}


def _images(name: str, where: str, obj: dict) -> dict[int, str]:
    files: dict[int, str] = {}
    for image in json_records(name, where, obj, "images", {"id": int, "file_name": str}):
        file_name = image["file_name"]
        path = PurePosixPath(file_name)
        if len(path.parts) != 1 or file_name in (".", ".."):
            raise DatasetError(f"dataset {name!r}: {where}: image {image['id']} has file_name {file_name!r}, "
                               f"expected a plain file name such as '000000000139.jpg'")
        if image["id"] in files:
            raise DatasetError(f"dataset {name!r}: {where}: image id {image['id']} occurs twice in 'images'")
        files[image["id"]] = file_name
    if not files:
        raise DatasetError(f"dataset {name!r}: {where}: 'images' is empty")
    return files


def _labels(name: str, where: str, obj: dict, files: Mapping[int, str], index: Mapping[int, int]) -> dict[int, list[int]]:
    found: dict[int, set[int]] = defaultdict(set)
    for ann in json_records(name, where, obj, "annotations", {"image_id": int, "category_id": int}):
        if ann["image_id"] not in files:
            raise DatasetError(f"dataset {name!r}: {where}: annotation {ann.get('id')} names image {ann['image_id']}, "
                               f"which is not in 'images'")
        if ann["category_id"] not in index:
            raise DatasetError(f"dataset {name!r}: {where}: annotation {ann.get('id')} names category "
                               f"{ann['category_id']}, which is not in 'categories'")
        found[ann["image_id"]].add(index[ann["category_id"]])
    return {image_id: sorted(labels) for image_id, labels in found.items()}


def _captions(name: str, where: str, obj: dict, files: Mapping[int, str]) -> dict[int, list[str]]:
    """{image id: captions in annotation-id order}; every image of the instances file needs one."""
    anns = sorted(json_records(name, where, obj, "annotations", {"image_id": int, "id": int, "caption": str}),
                  key=lambda a: a["id"])
    found: dict[int, list[str]] = defaultdict(list)
    for ann in anns:
        if ann["image_id"] not in files:
            raise DatasetError(f"dataset {name!r}: {where}: caption {ann['id']} names image {ann['image_id']}, which "
                               f"is not in the instances file; are both files of the same split?")
        found[ann["image_id"]].append(ann["caption"].strip())
    without = sorted(files[i] for i in files if i not in found)
    if without:
        raise DatasetError(f"dataset {name!r}: {where}: {len(without)} image(s) of the instances file have no "
                           f"caption: {preview(without)}")
    return dict(found)


def _image_id(name: str, where: str, value: Any) -> int:
    """Localized Narratives write image ids as strings ("397133"); COCO's files as integers."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise DatasetError(f"dataset {name!r}: {where}: image_id must be a COCO image id, got {value!r}")


def _text(name: str, where: str, obj: dict, key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"dataset {name!r}: {where}: {key!r} must be a non-empty text, got {value!r:.80}")
    return value.strip()


def positive_int(name: str, key: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DatasetError(f"dataset {name!r}: {key!r} must be a positive integer, got {value!r}")
    return value


def preview(items: list, n: int = MAX_REPORTED) -> str:
    return ", ".join(str(i) for i in items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


# ------------------------------------------------------------------------------------------------ rows


def _rows(name: str, cfg: CocoSpec, ann: Annotations, images: Mapping[int, Path], provenance: dict) -> Iterator[dict]:
    """Rows in image-id order. Without skip_corrupt every bad image is reported in one error at the end."""
    rows = ({"sample_id": PurePosixPath(ann.files[image_id]).stem, "labels": ann.labels.get(image_id, []),
             "image": images[image_id].read_bytes(), "captions": ann.captions[image_id],
             "narratives": ann.narratives.get(image_id, []), "coco_id": image_id} for image_id in sorted(ann.files))
    files = {PurePosixPath(f).stem: f for f in ann.files.values()}
    return checked_rows(name, cfg.split, rows, cfg.skip_corrupt, provenance, f"re-download {cfg.images.filename}",
                        where=files)


