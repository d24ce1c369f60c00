"""CoOp's fixed splits as dataset sources (`source: coop`): the openness paper's dataset-level vocabularies.

Ren et al. ("Delving into the Openness of CLIP") build their dataset-level vocabularies (CIFAR100-Caltech101-SUN397,
Flowers102-Pets-Cars) from the splits that CoOp (Zhou et al., github KaiyangZhou/CoOp, DATASETS.md) fixed for each
dataset: one JSON file per dataset, `split_zhou_<Dataset>.json`, shaped

    {"train": [[impath, label, classname], ...], "val": [...], "test": [...]}

where `impath` is relative to the folder CoOp reads images from (`101_ObjectCategories/` for Caltech-101, `SUN397/`,
`jpg/` for Flowers102, `images/` for Oxford Pets, the dataset folder holding `cars_train/` and `cars_test/` for
Stanford Cars). The split files live on Google Drive: they are manual resources. The images come from the official
archives (an archive inside an archive for Caltech-101's current distribution), extracted safely by
`archives.extract` and read as distributed.

Spec (a registry entry's `prepare`, all checksums in the YAML):

    source: coop
    split_file: {file, manual, sha256?|md5?}   # the split JSON, a download.Resource
    images: [{file, url|urls, md5|sha256, manual?, member?, root?}, ...]
        # image archives; `member`: the archive inside this archive that holds the images;
        # `root`: the folder of the extracted archive that the split file's paths are relative to (default ".")
    classes: 102                # CoOp's published class count: checked, and the catalogue's number
    splits: {train: 4093, val: 1633, test: 2463}   # CoOp's published sizes: checked, and the catalogue's numbers
    metric: accuracy            # or mean_per_class
    upstream: "..."             # free text: what the split file is (recorded in provenance)
    skip_corrupt: false

Classes and their order come from the split file's (label, classname) pairs: class i is the name every entry with
label i carries. A label with two names, a name with two labels, or a gap in the labels is refused, naming the file
and the conflicting entries. Display names have underscores as spaces (Pets' "american_bulldog" becomes "american
bulldog", as the openness code writes its prompts); the raw name is kept as the class `key` where it differs.
Rows keep the split file's order; `sample_id` is the split file's `impath`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from vlbench.datasets.archives import extract
from vlbench.datasets.canonical import (
    ClassInfo,
    DatasetError,
    DatasetMeta,
    write_dataset,
)
from vlbench.datasets.images import checked_rows
from vlbench.datasets.download import Resource, fetch, resource
from vlbench.datasets.spec import check_flag, check_keys

SPEC_KEYS = ("source", "split_file", "images", "classes", "splits", "metric", "upstream", "skip_corrupt")
ARCHIVE_KEYS = ("member", "root")  # ours; the rest of an `images` entry is a download.Resource
METRICS = ("accuracy", "mean_per_class")
MAX_REPORTED = 20  # missing or corrupt images named in one error; the rest are counted

# One row to write: (sample_id = the split file's impath, label).
Entry = tuple[str, int]


@dataclass(frozen=True)
class ImageArchive:
    """An image archive: its resource, the archive inside it that holds the images (or None), and the folder of the
    extracted tree that the split file's image paths are relative to."""

    resource: Resource
    member: str | None
    root: str


@dataclass(frozen=True)
class CoopSpec:
    split_file: Resource
    images: tuple[ImageArchive, ...]
    classes: int | None
    splits: dict[str, int]
    metric: str
    upstream: str | None
    skip_corrupt: bool


# ------------------------------------------------------------------------------------------------ public


def build(name: str, spec: dict, out_dir: str | Path) -> DatasetMeta:
    """Fetch the split file and the image archives, check the split against CoOp's published sizes, and write the
    canonical dataset (splits as in the split file, rows in its order)."""
    cfg = parse_spec(name, spec)
    split_path = fetch(cfg.split_file, name)
    entries, classes = read_split_file(name, split_path, list(cfg.splits))
    check_sizes(name, split_path, entries, classes, cfg)
    archive_paths = [fetch(archive.resource, name) for archive in cfg.images]
    roots = [image_root(name, archive, path) for archive, path in zip(cfg.images, archive_paths)]
    images = locate_images(name, split_path, entries, roots)
    provenance = {
        "source": "coop",
        "upstream": cfg.upstream,
        "files": [cfg.split_file.provenance(split_path)]
        + [archive.resource.provenance(path) for archive, path in zip(cfg.images, archive_paths)],
        "image_roots": [_describe_root(archive) for archive in cfg.images],
        "counts": {},
        "skipped_corrupt": [],
    }
    meta = DatasetMeta(name=name, task="single-label", metric=cfg.metric, classes=classes, provenance=provenance)
    rows = {split: _rows(name, split, split_entries, images, cfg.skip_corrupt, provenance)
            for split, split_entries in entries.items()}
    return write_dataset(out_dir, meta, rows)


def catalogue_row(name: str, spec: dict) -> dict:
    """Classes, split sizes (CoOp's published numbers from the spec) and metric, without any download. The split
    file is always a manual download (Google Drive)."""
    cfg = parse_spec(name, spec)
    resources = [cfg.split_file] + [archive.resource for archive in cfg.images]
    return {"classes": cfg.classes, "splits": dict(cfg.splits), "metric": cfg.metric,
            "manual_download": any(not res.urls for res in resources)}


def parse_spec(name: str, spec: Mapping) -> CoopSpec:
    check_keys(name, spec, SPEC_KEYS, "coop")
    if not isinstance(spec.get("split_file"), Mapping):
        raise DatasetError(f"dataset {name!r}: 'split_file' must be a mapping {{file, manual, sha256?}} naming CoOp's "
                           f"split_zhou_<Dataset>.json, got {spec.get('split_file')!r}")
    images = spec.get("images")
    if not isinstance(images, Sequence) or isinstance(images, (str, bytes)) or not images:
        raise DatasetError(f"dataset {name!r}: 'images' must be a non-empty list of image archives "
                           f"{{file, url, md5|sha256, member?, root?}}, got {images!r}")
    metric = spec.get("metric", "accuracy")
    if metric not in METRICS:
        raise DatasetError(f"dataset {name!r}: metric {metric!r} is not one of {METRICS} (CoOp's splits are single-label)")
    return CoopSpec(
        split_file=resource(name, spec["split_file"]),
        images=tuple(_archive(name, i, obj) for i, obj in enumerate(images)),
        classes=_count(name, "classes", spec.get("classes"), optional=True),
        splits=_split_sizes(name, spec.get("splits")),
        metric=metric,
        upstream=spec.get("upstream"),
        skip_corrupt=check_flag(name, spec, "skip_corrupt"),
    )


def read_split_file(name: str, path: Path, split_names: list[str]) -> tuple[dict[str, list[Entry]], list[ClassInfo]]:
    """({split: [(impath, label)]} in the file's order, classes in label order) of a CoOp split file."""
    obj = _load_json(name, path)
    if not isinstance(obj, dict) or set(obj) != set(split_names):
        found = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
        raise DatasetError(f"dataset {name!r}: {path}: expected a JSON object with the splits {split_names} "
                           f"(CoOp's split format), found {found}")
    names: dict[int, tuple[str, str]] = {}  # label -> (classname, where it was first seen)
    labels: dict[str, tuple[int, str]] = {}  # classname -> (label, where)
    entries: dict[str, list[Entry]] = {}
    seen: dict[str, str] = {}  # impath -> split
    for split in split_names:
        if not isinstance(obj[split], list):
            raise DatasetError(f"dataset {name!r}: {path}: split {split!r} must be a list of "
                               f"[image path, label, class name], got {type(obj[split]).__name__}")
        entries[split] = []
        for i, raw in enumerate(obj[split]):
            where = f"split {split!r} entry {i}"
            impath, label, classname = _entry(name, f"{path}: {where}", raw)
            _check_class(name, path, where, label, classname, names, labels)
            if impath in seen:
                raise DatasetError(f"dataset {name!r}: {path}: {where}: image {impath!r} is already in split {seen[impath]!r}; "
                                   f"an image belongs to one split")
            seen[impath] = split
            entries[split].append((impath, label))
    return entries, _classes(name, path, names)


def check_sizes(name: str, path: Path, entries: dict[str, list[Entry]], classes: list[ClassInfo], cfg: CoopSpec) -> None:
    """Refuse a split file whose sizes or class count differ from CoOp's published ones (the spec's): the split
    files are unverified manual downloads, so this is what tells a wrong or edited file apart."""
    for split, expected in cfg.splits.items():
        if len(entries[split]) != expected:
            raise DatasetError(
                f"dataset {name!r}: {path}: split {split!r} has {len(entries[split])} images but CoOp's split has "
                f"{expected} (spec 'splits'); is this the right split file?"
            )
    if cfg.classes is not None and len(classes) != cfg.classes:
        raise DatasetError(f"dataset {name!r}: {path}: {len(classes)} classes but CoOp's split has {cfg.classes} "
                           f"(spec 'classes'); is this the right split file?")


def image_root(name: str, archive: ImageArchive, path: Path) -> Path:
    """The folder the split file's image paths are relative to, in the extracted archive (or the extracted archive
    inside it)."""
    tree = extract(path)
    if archive.member is not None:
        inner = tree / archive.member
        if not inner.is_file():
            raise DatasetError(f"dataset {name!r}: archive {str(path)!r} has no member {archive.member!r} "
                               f"(spec 'member'); its top level: {_listing(tree)}")
        tree = extract(inner, path.with_name(f"{path.name}.{PurePosixPath(archive.member).name}.d"))
    root = tree / archive.root
    if not root.is_dir():
        raise DatasetError(f"dataset {name!r}: archive {str(path)!r} has no folder {archive.root!r} (spec 'root'), "
                           f"which CoOp's image paths are relative to; its top level: {_listing(tree)}")
    return root


def locate_images(name: str, split_path: Path, entries: dict[str, list[Entry]], roots: list[Path]) -> dict[str, Path]:
    """{impath: file} for every entry, looked up under each root in order; every missing image is reported at once,
    before anything is written."""
    found: dict[str, Path] = {}
    missing: list[str] = []
    for split_entries in entries.values():
        for impath, _ in split_entries:
            path = next((root / impath for root in roots if (root / impath).is_file()), None)
            if path is None:
                missing.append(impath)
            else:
                found[impath] = path
    if missing:
        shown = ", ".join(repr(m) for m in missing[:MAX_REPORTED])
        more = f" and {len(missing) - MAX_REPORTED} more" if len(missing) > MAX_REPORTED else ""
        raise DatasetError(
            f"dataset {name!r}: {len(missing)} image(s) listed in {split_path.name} are not in the extracted "
            f"archive(s) (looked under {', '.join(str(r) for r in roots)}): {shown}{more}"
        )
    return found


# ------------------------------------------------------------------------------------------------ helpers


def _archive(name: str, index: int, obj: Any) -> ImageArchive:
    if not isinstance(obj, Mapping):
        raise DatasetError(f"dataset {name!r}: images[{index}] must be a mapping {{file, url, md5|sha256, member?, "
                           f"root?}}, got {obj!r}")
    member, root = obj.get("member"), obj.get("root", ".")
    for key, value in (("member", member), ("root", root)):
        if value is not None and not _safe_relative(value):
            raise DatasetError(f"dataset {name!r}: images[{index}].{key} must be a relative path inside the archive "
                               f"(no '..', not absolute), got {value!r}")
    res = resource(name, {k: v for k, v in obj.items() if k not in ARCHIVE_KEYS})
    return ImageArchive(resource=res, member=member, root=root)


def _count(name: str, key: str, value: Any, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DatasetError(f"dataset {name!r}: {key!r} must be a positive integer, got {value!r}")
    return value


def _split_sizes(name: str, value: Any) -> dict[str, int]:
    if not isinstance(value, Mapping) or not value:
        raise DatasetError(f"dataset {name!r}: 'splits' must map each split of CoOp's file to its published size, "
                           f"e.g. {{train: 4093, val: 1633, test: 2463}}; got {value!r}")
    return {str(split): _count(name, f"splits.{split}", n) for split, n in value.items()}


def _load_json(name: str, path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DatasetError(f"dataset {name!r}: {path}: not a readable JSON split file ({err})") from err


def _entry(name: str, where: str, raw: Any) -> tuple[str, int, str]:
    ok = (isinstance(raw, list) and len(raw) == 3 and isinstance(raw[0], str) and isinstance(raw[1], int)
          and not isinstance(raw[1], bool) and isinstance(raw[2], str) and raw[2].strip())
    if not ok:
        raise DatasetError(f"dataset {name!r}: {where}: expected [image path, integer label, class name], got {raw!r}")
    impath, label, classname = raw
    if not _safe_relative(impath) or impath in ("", "."):
        raise DatasetError(f"dataset {name!r}: {where}: image path {impath!r} must be relative to the image folder, "
                           f"without '..' and not absolute")
    if label < 0:
        raise DatasetError(f"dataset {name!r}: {where}: label {label} is negative")
    return impath, label, classname


def _check_class(name: str, path: Path, where: str, label: int, classname: str,
                 names: dict[int, tuple[str, str]], labels: dict[str, tuple[int, str]]) -> None:
    """One name per label and one label per name, across the whole file."""
    known_name, first = names.setdefault(label, (classname, where))
    if known_name != classname:
        raise DatasetError(f"dataset {name!r}: {path}: {where}: label {label} is named {classname!r}, but {first} names it "
                           f"{known_name!r}; a CoOp split file gives each label one class name")
    known_label, first = labels.setdefault(classname, (label, where))
    if known_label != label:
        raise DatasetError(f"dataset {name!r}: {path}: {where}: class {classname!r} has label {label}, but {first} gives it "
                           f"label {known_label}; a CoOp split file gives each class one label")


def _classes(name: str, path: Path, names: dict[int, tuple[str, str]]) -> list[ClassInfo]:
    if not names:
        raise DatasetError(f"dataset {name!r}: {path}: the split file lists no images")
    absent = sorted(set(range(max(names) + 1)) - set(names))
    if absent:
        raise DatasetError(f"dataset {name!r}: {path}: labels must be 0..{max(names)} without gaps; no image has "
                           f"label(s) {absent[:MAX_REPORTED]}")
    infos = []
    for label in range(len(names)):
        raw = names[label][0]
        display = raw.replace("_", " ").strip()
        infos.append(ClassInfo(index=label, name=display, key=raw if raw != display else None))
    return infos


def _safe_relative(value: Any) -> bool:
    if not isinstance(value, str) or "\\" in value:
        return False
    path = PurePosixPath(value)
    return not path.is_absolute() and ".." not in path.parts


def _listing(folder: Path, n: int = 10) -> str:
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else []
    return ", ".join(names[:n]) + (", ..." if len(names) > n else "") if names else "(empty)"


def _describe_root(archive: ImageArchive) -> str:
    inside = f"{archive.resource.filename}!{archive.member}" if archive.member else archive.resource.filename
    return f"{inside}:{archive.root}"


def _rows(name: str, split: str, entries: list[Entry], images: dict[str, Path], skip: bool,
          provenance: dict) -> Iterator[dict]:
    """Verified rows of one split in the split file's order. Without skip_corrupt, every bad image of the split is
    reported in one error at the end (nothing is written: the dataset folder is atomic)."""
    rows = ({"sample_id": impath, "label": label, "image": images[impath].read_bytes()} for impath, label in entries)
    return checked_rows(name, split, rows, skip, provenance, "re-download the archive")


