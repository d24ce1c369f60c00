"""Karpathy's caption splits (`source: karpathy`): COCO 5k and Flickr30k 1k test sets for zero-shot retrieval.

Two upstream files per dataset, fetched and verified by the download layer:

- the split file, `caption_datasets.zip` (Karpathy & Fei-Fei, "Deep Visual-Semantic Alignments", 2015), of which one
  member is read: `dataset_coco.json` or `dataset_flickr30k.json` (`member`). Its structure: `{"images": [{"filename",
  "filepath"? (COCO: the 2014 folder), "imgid", "split" (train | val | test | restval), "sentences": [{"raw", "tokens",
  "imgid", "sentid"}], "cocoid"? ...}], "dataset"}`. Karpathy publishes no checksum: the file is recorded as
  unverified (its sha256 computed and kept in provenance), and a file that cannot be parsed is forgotten so that the
  next run downloads it again;
- the images: COCO's `val2014.zip` (every image of Karpathy's COCO test split is a COCO 2014 *val* image:
  `filepath` val2014, `COCO_val2014_<12 digits>.jpg`), or Flickr30k's `flickr30k-images.tar.gz` (the folder
  `flickr30k-images/` of `<id>.jpg`), a manual download: the Flickr30k terms are accepted on a request form.

Prepared dataset: one split, named as Karpathy's (`test`), its images in the file's order, each with `captions`: every
sentence's `raw` text, surrounding white space stripped, in the file's order (no caption dropped: COCO has images with
6 and 7; `tokens`, lower-cased and without punctuation, are not used: the model's own tokenizer sees the raw caption),
`karpathy_id` (the file's `imgid`); `sample_id` the file stem. The spec names the split and its size, which are
checked: a split missing from the file, or of another size, is an error naming both (no split is ever ignored or
replaced silently). Task `captions` with one placeholder class, `image` (the canonical label column needs one; the
retrieval analysis reads captions only).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pyarrow as pa

from vlbench.datasets.archives import extract, members, read_member
from vlbench.datasets.canonical import ClassInfo, DatasetError, DatasetMeta, write_dataset
from vlbench.datasets.coco import positive_int, preview, json_records
from vlbench.datasets.download import Resource, fetch, forget_verification, resource
from vlbench.datasets.images import checked_rows
from vlbench.datasets.spec import check_flag, check_keys

SPEC_KEYS = ("source", "annotations", "member", "images", "image_folder", "karpathy_split", "splits", "skip_corrupt")
EXTRA_COLUMNS = {"captions": pa.list_(pa.string()), "karpathy_id": pa.int64()}
CLASSES = [ClassInfo(index=0, name="image")]  # a placeholder: captioned images have no classes


@dataclass(frozen=True)
class KarpathySpec:
    annotations: Resource
    member: str  # dataset_coco.json | dataset_flickr30k.json
    images: Resource
    image_folder: str | None  # the images' folder inside the archive; None: each image's `filepath`
    karpathy_split: str  # test
    split: str  # ours, the same name
    size: int | None
    skip_corrupt: bool


@dataclass(frozen=True)
class Image:
    file: str  # relative to the extracted archive: <folder>/<filename>
    imgid: int
    captions: list[str]


# ------------------------------------------------------------------------------------------------ public


def build(name: str, spec: dict, out_dir: str | Path) -> DatasetMeta:
    cfg = parse_spec(name, spec)
    paths = {key: fetch(getattr(cfg, key), name) for key in ("annotations", "images")}
    try:
        images, split_sizes = read_split(name, cfg, paths["annotations"])
    except DatasetError as err:  # no checksum vouches for the split file: let the next run download it again
        raise DatasetError(f"{err} ({paths['annotations'].name}: {forget_verification(paths['annotations'])})") from None
    root = extract(paths["images"])
    files = locate(name, paths["images"], root, images)
    provenance = {
        "source": "karpathy",
        "upstream": f"Karpathy's caption splits ({cfg.member}), split {cfg.karpathy_split!r}",
        "files": [getattr(cfg, key).provenance(path) for key, path in paths.items()],
        "karpathy_splits": split_sizes,
        "captions": sum(len(im.captions) for im in images),
        "captions_per_image": {str(k): v for k, v in sorted(Counter(len(im.captions) for im in images).items())},
        "counts": {},
        "skipped_corrupt": [],
    }
    meta = DatasetMeta(name=name, task="captions", metric="accuracy", classes=list(CLASSES), provenance=provenance)
    rows = ({"sample_id": PurePosixPath(im.file).stem, "label": 0, "image": files[im.file].read_bytes(),
             "captions": im.captions, "karpathy_id": im.imgid} for im in images)
    where = {PurePosixPath(im.file).stem: im.file for im in images}
    checked = checked_rows(name, cfg.split, rows, cfg.skip_corrupt, provenance, f"re-download {cfg.images.filename}",
                           where=where)
    return write_dataset(out_dir, meta, {cfg.split: checked}, extra_columns=EXTRA_COLUMNS)


def catalogue_row(name: str, spec: dict) -> dict:
    cfg = parse_spec(name, spec)
    return {"classes": len(CLASSES), "splits": {cfg.split: cfg.size} if cfg.size is not None else {},
            "metric": "accuracy", "manual_download": any(not res.urls for res in (cfg.annotations, cfg.images))}


def parse_spec(name: str, spec: Mapping) -> KarpathySpec:
    check_keys(name, spec, SPEC_KEYS, "karpathy")
    for key in ("annotations", "images"):
        if not isinstance(spec.get(key), Mapping):
            raise DatasetError(f"dataset {name!r}: {key!r} must be a resource mapping {{file, url|manual, sha256|md5}}, "
                               f"got {spec.get(key)!r}")
    member = spec.get("member")
    if not isinstance(member, str) or not member.endswith(".json"):
        raise DatasetError(f"dataset {name!r}: 'member' must name the split file in the archive, e.g. "
                           f"'dataset_coco.json', got {member!r}")
    folder = spec.get("image_folder")
    if folder is not None and (not isinstance(folder, str) or not _plain_path(folder)):
        raise DatasetError(f"dataset {name!r}: 'image_folder' must be a relative folder inside the image archive "
                           f"(e.g. 'flickr30k-images') or null, got {folder!r}")
    split = spec.get("karpathy_split", "test")
    splits = spec.get("splits", {split: None})
    if not isinstance(splits, Mapping) or list(splits) != [split]:
        raise DatasetError(f"dataset {name!r}: 'splits' must name the one split karpathy_split names and its size, e.g. "
                           f"{{{split}: 5000}}, got {splits!r}")
    return KarpathySpec(
        annotations=resource(name, spec["annotations"]), member=member, images=resource(name, spec["images"]),
        image_folder=folder, karpathy_split=str(split), split=str(split),
        size=positive_int(name, f"splits.{split}", splits[split]), skip_corrupt=check_flag(name, spec, "skip_corrupt"))


# ------------------------------------------------------------------------------------------------ reading


def read_split(name: str, cfg: KarpathySpec, archive: Path) -> tuple[list[Image], dict[str, int]]:
    """The images of `cfg.karpathy_split` in file order with their captions, and every split's size in the file."""
    member = find_member(name, archive, cfg.member)
    where = f"{archive.name}!{member}"
    try:
        obj = json.loads(read_member(archive, member))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DatasetError(f"dataset {name!r}: {where} is not valid JSON ({err})") from err
    if not isinstance(obj, dict):
        raise DatasetError(f"dataset {name!r}: {where} must be a JSON object, got {type(obj).__name__}")
    records = list(json_records(name, where, obj, "images", {"filename": str, "split": str, "imgid": int,
                                                          "sentences": list}))
    sizes = dict(sorted(Counter(r["split"] for r in records).items()))
    chosen = [image(name, where, r, cfg.image_folder) for r in records if r["split"] == cfg.karpathy_split]
    if not chosen:
        raise DatasetError(f"dataset {name!r}: {where} has no image in split {cfg.karpathy_split!r}; its splits: {sizes}")
    if cfg.size is not None and len(chosen) != cfg.size:
        raise DatasetError(f"dataset {name!r}: {where} lists {len(chosen)} images in split {cfg.karpathy_split!r}, "
                           f"expected {cfg.size} (spec 'splits'); its splits: {sizes}")
    seen = Counter(im.file for im in chosen)
    twice = sorted(f for f, n in seen.items() if n > 1)
    if twice:
        raise DatasetError(f"dataset {name!r}: {where}: image(s) listed twice in split {cfg.karpathy_split!r}: "
                           f"{preview(twice)}")
    return chosen, sizes


def find_member(name: str, archive: Path, file_name: str) -> str:
    """The archive member whose base name is `file_name` (the zip's own layout may put it in a folder)."""
    found = [m for m in members(archive) if PurePosixPath(m).name == file_name]
    if len(found) != 1:
        what = "no member" if not found else f"{len(found)} members"
        raise DatasetError(f"dataset {name!r}: {archive.name} has {what} named {file_name!r}; its members: "
                           f"{preview(members(archive), 10)}")
    return found[0]


def image(name: str, where: str, record: Mapping[str, Any], folder: str | None) -> Image:
    label = f"{where}: image {record['filename']!r} (imgid {record['imgid']})"
    folder = folder if folder is not None else record.get("filepath")
    if not isinstance(folder, str) or not _plain_path(folder) or not _plain_path(record["filename"]):
        raise DatasetError(f"dataset {name!r}: {label}: no usable folder (filepath {record.get('filepath')!r}) and "
                           f"file name; set prepare.image_folder")
    captions = [s["raw"].strip() for s in json_records(name, label, record, "sentences", {"raw": str})]
    if not captions or not all(captions):
        raise DatasetError(f"dataset {name!r}: {label}: every image needs sentences with a non-empty 'raw' caption")
    return Image(file=f"{folder}/{record['filename']}", imgid=record["imgid"], captions=captions)


def locate(name: str, archive: Path, root: Path, images: list[Image]) -> dict[str, Path]:
    """{relative file: path} in the extracted archive; every missing image is reported at once."""
    found = {im.file: root / im.file for im in images}
    missing = sorted(f for f, path in found.items() if not path.is_file())
    if missing:
        raise DatasetError(f"dataset {name!r}: {len(missing)} image(s) of the split are not in {archive.name}: "
                           f"{preview(missing)}")
    return found


def _plain_path(value: str) -> bool:
    parts = PurePosixPath(value).parts
    return bool(parts) and not PurePosixPath(value).is_absolute() and ".." not in parts
