"""Bring your own data: local image folders and manifest files as dataset sources.

Two sources turn data already on disk into the canonical format (`canonical.py`), by config alone:

- `imagefolder`: torchvision's `ImageFolder` layout, `root/<split folder>/<class folder>/**/<image>`.
  Classes are the sorted class folder names and samples are listed in torchvision's order
  (`find_classes` / `make_dataset`, same `IMG_EXTENSIONS`), so labels agree with
  `torchvision.datasets.ImageFolder`.
- `manifest`: a CSV/TSV or Parquet file (read with polars) listing an image path, a label and
  optionally a split per row.

Images are stored as distributed (the file's bytes, never re-encoded or resized) and verified at prepare
time; rows are streamed into `write_dataset` one image at a time. `sample_id` is the image path relative
to the root (or the manifest's folder), POSIX style, so it is stable across machines.

Paths and links (docs/protocols.md, "Bring-your-own data: paths and links"). A dataset's root is the
ImageFolder `root`, or the folder of each manifest file. Relative manifest paths resolve against that
folder, never the working directory. Every image, split folder and class folder must lie under the root
once symlinks are resolved: a manifest path (absolute or relative) or a link that leaves it is refused,
naming the manifest row or the link, unless the spec sets `allow_outside_root: true` (then such an image's
`sample_id` is its absolute path). Image file links are followed (DVC hashes a linked file's content), but a
folder link below an ImageFolder root is always refused, with or without `allow_outside_root`: DVC does not
follow folder links when it hashes the root, so images behind one would escape `dvc status` (and a link to
an ancestor would loop). The root itself may be a link.

Class names. Each class's source key (the ImageFolder folder name, or a manifest's label string) is kept
beside its display name in classes.json (`ClassInfo.key`). For `imagefolder`, `classnames` and `wnids`
must be mappings `{folder: value}` (folders not named keep the folder name with spaces, and no wnid);
a list is refused, because it would be matched by position to the folders sorted by name and a list in
any other order would silently mislabel classes. For a manifest, a list is unambiguous: with integer
labels it is in label order, with string labels it lists the labels themselves in class order.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from vlbench.datasets.canonical import (
    ClassInfo,
    DatasetError,
    DatasetMeta,
    write_dataset,
)
from vlbench.datasets.images import checked_rows
from vlbench.datasets.spec import check_flag, check_keys
from vlbench.io import sha256_file

# torchvision.datasets.folder.IMG_EXTENSIONS (lower case; matching is case-insensitive, as there).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
COMMON_KEYS = ("source", "classnames", "metric", "wnids", "skip_corrupt", "allow_outside_root")
IMAGEFOLDER_KEYS = COMMON_KEYS + ("root", "splits")
MANIFEST_KEYS = COMMON_KEYS + ("path", "splits", "image_column", "label_column", "split_column")
MANIFEST_FORMATS = {".csv": ",", ".tsv": "\t", ".parquet": None, ".pq": None}
_SPLIT_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")

# One sample to write: (absolute image path, sample_id, class index).
Item = tuple[Path, str, int]
MAX_REPORTED = 20  # corrupt images named in one error; the rest are counted
OUTSIDE_HINT = "move the data under the root or set allow_outside_root: true"
LINK_FIX = ("Replace the link by a copy of the folder or a bind mount (mount --bind), or point root at the real "
            "folder (a root that is itself a link is fine)")


# --------------------------------------------------------------------------------------------- imagefolder


def build_imagefolder(name: str, spec: dict, out_dir: Path) -> DatasetMeta:
    """`{source: imagefolder, root, splits: {split: subfolder} (default {test: .}), classnames?, ...}`."""
    check_keys(name, spec, IMAGEFOLDER_KEYS)
    root = _path_key(name, spec, "root")
    if not root.is_dir():
        raise DatasetError(f"dataset {name!r}: root {str(root)!r} is not a directory")
    splits = _split_folders(name, spec.get("splits", {"test": "."}))
    allow_outside = check_flag(name, spec, "allow_outside_root")
    trees = {split: _Tree(name, split, root, os.path.realpath(root), allow_outside) for split in splits}

    class_sets: dict[str, list[str]] = {}
    for split, sub in splits.items():
        split_dir = trees[split].split_dir(sub)
        class_sets[split] = find_classes(split_dir)
        if not class_sets[split]:
            raise DatasetError(f"dataset {name!r} split {split!r}: no class folders in {str(split_dir)!r}")
    folders = _same_classes(name, class_sets)

    items = {}
    for split, sub in splits.items():
        items[split] = list(_folder_items(trees[split], trees[split].split_dir(sub), folders))
        if not items[split]:
            raise DatasetError(
                f"dataset {name!r} split {split!r}: empty split, no image files ({', '.join(IMG_EXTENSIONS)}) "
                f"in the class folders of {str(root / sub)!r}"
            )

    for key in ("classnames", "wnids"):
        _require_mapping(name, key, spec.get(key), folders)
    classes = _class_infos(name, folders, spec.get("classnames"), spec.get("wnids"), "class folders")
    provenance = {
        "source": "imagefolder",
        "root": str(root),
        "splits": dict(splits),
        "class_folders": folders,
    }
    return _write(name, spec, out_dir, classes, provenance, items)


def find_classes(directory: Path) -> list[str]:
    """Class folders as torchvision's `find_classes`: every sub-directory, sorted by name."""
    return sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())


def _folder_items(tree: _Tree, split_dir: Path, folders: list[str]) -> Iterator[Item]:
    """Samples in torchvision's `make_dataset` order: sorted classes, then a sorted recursive walk."""
    for index, folder in enumerate(folders):
        for dirpath, _, fnames in sorted(tree.walk(split_dir / folder)):
            for fname in sorted(fnames):
                if fname.lower().endswith(IMG_EXTENSIONS):
                    path = Path(dirpath) / fname
                    tree.check_file(path)
                    yield path, Path(os.path.relpath(path, tree.root)).as_posix(), index


@dataclass(frozen=True)
class _Tree:
    """One split's walk under an ImageFolder root. A folder link below the root (split, class or any sub-folder)
    is refused: DVC does not follow folder links when it hashes the root, so what lies behind one would change
    without `dvc status` noticing. File links are followed (DVC hashes their content), and must resolve under the
    root unless `allow_outside`."""

    name: str
    split: str
    root: Path
    real_root: str
    allow_outside: bool

    def split_dir(self, sub: str) -> Path:
        path = Path(os.path.normpath(self.root / sub))
        if not path.is_dir():
            raise DatasetError(f"dataset {self.name!r} split {self.split!r}: folder {str(path)!r} does not exist")
        rel = Path(os.path.relpath(path, self.root))
        if rel.parts and rel.parts[0] != "..":
            for depth in range(1, len(rel.parts) + 1):
                self._refuse_link(self.root.joinpath(*rel.parts[:depth]))
        self._check_inside(path, "folder")
        return path

    def walk(self, top: Path) -> Iterator[tuple[str, list[str], list[str]]]:
        """os.walk(top) that refuses a folder link before it would descend into it."""
        self._refuse_link(top)
        for dirpath, dirnames, fnames in os.walk(top):
            for d in dirnames:  # os.walk lists links to folders here (and never enters them)
                self._refuse_link(Path(dirpath) / d)
            yield dirpath, dirnames, fnames

    def check_file(self, path: Path) -> None:
        if path.is_symlink():
            self._check_inside(path, "image link")

    def _refuse_link(self, path: Path) -> None:
        if path.is_symlink():
            raise DatasetError(
                f"{self._where()}: folder link {str(path)!r} leads to {os.path.realpath(path)!r}; DVC does not "
                f"follow folder links when it hashes the data, so images behind it would change without `dvc status` "
                f"noticing. {LINK_FIX}"
            )

    def _check_inside(self, path: Path, what: str) -> None:
        real = os.path.realpath(path)
        if not self.allow_outside and not _inside(real, self.real_root):
            shown = f"{str(path)!r}" if real == str(path) else f"{str(path)!r} (resolves to {real!r})"
            raise DatasetError(
                f"{self._where()}: {what} {shown} is outside the root {str(self.root)!r}; {OUTSIDE_HINT}"
            )

    def _where(self) -> str:
        return f"dataset {self.name!r} split {self.split!r}"


def _inside(path: str, folder: str) -> bool:
    """Whether resolved `path` is `folder` or below it (both absolute and resolved)."""
    return os.path.commonpath([path, folder]) == folder


def _same_classes(name: str, class_sets: dict[str, list[str]]) -> list[str]:
    first, expected = next(iter(class_sets.items()))
    for split, found in class_sets.items():
        missing, extra = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
        if missing or extra:
            raise DatasetError(
                f"dataset {name!r} split {split!r}: class folders differ from split {first!r}: "
                f"missing {missing}, extra {extra}"
            )
    return expected


def _split_folders(name: str, splits: Any) -> dict[str, str]:
    if not isinstance(splits, Mapping) or not splits:
        raise DatasetError(f"dataset {name!r}: 'splits' must be a non-empty mapping split -> subfolder of root")
    out = {}
    for split, sub in splits.items():
        _check_split_name(name, split)
        if not isinstance(sub, str) or not sub:
            raise DatasetError(f"dataset {name!r}: splits.{split} must be a folder name, got {sub!r}")
        out[split] = sub
    return out


# ------------------------------------------------------------------------------------------------ manifest


def build_manifest(name: str, spec: dict, out_dir: Path) -> DatasetMeta:
    """`{source: manifest, path | splits: {split: file}, image_column, label_column, split_column?, ...}`."""
    check_keys(name, spec, MANIFEST_KEYS)
    allow_outside = check_flag(name, spec, "allow_outside_root")
    image_col = spec.get("image_column", "path")
    label_col = spec.get("label_column", "label")
    split_col = spec.get("split_column")
    files = _manifest_files(name, spec)

    # rows[split] = [(manifest file, row, image path as written, raw label)]; paths and labels only.
    rows: dict[str, list[tuple[Path, int, str, Any]]] = {}
    kinds: dict[str, Path] = {}
    for fixed_split, path in files:
        df = _read_manifest(name, path, image_col, label_col, split_col)
        if df.height == 0:
            where = f"split {fixed_split!r}" if fixed_split else "every split"
            raise DatasetError(f"dataset {name!r} {where}: empty split, manifest {str(path)!r} has no rows")
        kinds.setdefault(_label_kind(name, path, df[label_col]), path)
        if len(kinds) > 1:
            raise DatasetError(
                f"dataset {name!r}: manifests {[str(p) for p in kinds.values()]} mix integer and string labels"
            )
        _check_nulls(name, path, df, [image_col, label_col] + ([split_col] if split_col else []))
        images, labels = df[image_col].to_list(), df[label_col].to_list()
        splits = df[split_col].to_list() if split_col else [fixed_split] * len(images)
        for i, (image, label, split) in enumerate(zip(images, labels, splits)):
            if split not in rows:
                _check_split_name(name, split, f"manifest {str(path)!r} row {i}")
            rows.setdefault(split, []).append((path, i, image, label))

    kind = next(iter(kinds))
    keys, classes = _manifest_classes(name, spec, kind, rows)
    index = {k: i for i, k in enumerate(keys)}
    items: dict[str, list[Item]] = {}
    for split in sorted(rows) if split_col else rows:
        items[split] = []
        for path, i, image, label in rows[split]:
            if label not in index:
                raise DatasetError(
                    f"dataset {name!r} split {split!r}: manifest {str(path)!r} row {i}: label {label!r} is not "
                    f"in classnames ({_label_range(kind, keys)})"
                )
            where = f"dataset {name!r} split {split!r}: manifest {str(path)!r} row {i}"
            abs_path, sid = _manifest_image(where, path.parent, image, allow_outside)
            items[split].append((abs_path, sid, index[label]))

    provenance: dict[str, Any] = {
        "source": "manifest",
        "image_column": image_col,
        "label_column": label_col,
    }
    if split_col:
        provenance["split_column"] = split_col
    if "path" in spec:
        provenance["manifest"] = str(files[0][1])
        provenance["sha256"] = sha256_file(files[0][1])
    else:
        provenance["manifest"] = {split: str(path) for split, path in files}
        provenance["sha256"] = {split: sha256_file(path) for split, path in files}
    if kind == "string":
        provenance["class_labels"] = keys
    return _write(name, spec, out_dir, classes, provenance, items)


def _manifest_files(name: str, spec: dict) -> list[tuple[str | None, Path]]:
    """[(split or None when the split comes from split_column, absolute manifest path)]."""
    if ("path" in spec) == ("splits" in spec):
        raise DatasetError(
            f"dataset {name!r}: give exactly one of 'path' (one manifest) or 'splits' (split -> manifest file)"
        )
    if "path" in spec:
        paths = [(None if spec.get("split_column") else "test", _path_key(name, spec, "path"))]
    else:
        if spec.get("split_column"):
            raise DatasetError(f"dataset {name!r}: 'split_column' needs a single manifest 'path', not 'splits'")
        splits = spec["splits"]
        if not isinstance(splits, Mapping) or not splits:
            raise DatasetError(f"dataset {name!r}: 'splits' must be a non-empty mapping split -> manifest file")
        for split in splits:
            _check_split_name(name, split)
        paths = [(split, _path_key(name, splits, split, f"splits.{split}")) for split in splits]
    for split, path in paths:
        if not path.is_file():
            raise DatasetError(f"dataset {name!r}: manifest file {str(path)!r} does not exist")
        if path.suffix.lower() not in MANIFEST_FORMATS:
            raise DatasetError(
                f"dataset {name!r}: manifest {str(path)!r}: unknown format {path.suffix!r}; "
                f"expected one of {', '.join(MANIFEST_FORMATS)}"
            )
    return paths


def _read_manifest(name: str, path: Path, image_col: str, label_col: str, split_col: str | None) -> pl.DataFrame:
    wanted = [image_col, label_col] + ([split_col] if split_col else [])
    sep = MANIFEST_FORMATS[path.suffix.lower()]
    try:
        if sep is None:
            columns = list(pl.read_parquet_schema(path))
        else:
            columns = pl.read_csv(path, n_rows=0, separator=sep).columns
        missing = [c for c in wanted if c not in columns]
        if missing:
            raise DatasetError(
                f"dataset {name!r}: manifest {str(path)!r} has no column(s) {missing}; its columns are {columns}"
            )
        if sep is None:
            df = pl.read_parquet(path, columns=wanted)
        else:
            as_text = {c: pl.String for c in wanted if c != label_col}
            df = pl.read_csv(path, columns=wanted, separator=sep, infer_schema_length=None, schema_overrides=as_text)
    except (pl.exceptions.PolarsError, OSError) as err:
        raise DatasetError(f"dataset {name!r}: cannot read manifest {str(path)!r}: {err}") from err
    if df[image_col].dtype != pl.String:
        raise DatasetError(
            f"dataset {name!r}: manifest {str(path)!r}: column {image_col!r} must hold image paths (strings), "
            f"got {df[image_col].dtype}"
        )
    casts = [pl.col(split_col).cast(pl.String)] if split_col else []
    if isinstance(df[label_col].dtype, (pl.Categorical, pl.Enum)):
        casts.append(pl.col(label_col).cast(pl.String))
    return df.with_columns(casts) if casts else df


def _label_kind(name: str, path: Path, labels: pl.Series) -> str:
    if labels.dtype.is_integer():
        return "int"
    if labels.dtype == pl.String:
        return "string"
    raise DatasetError(
        f"dataset {name!r}: manifest {str(path)!r}: label column {labels.name!r} must hold integers or strings, "
        f"got {labels.dtype}"
    )


def _check_nulls(name: str, path: Path, df: pl.DataFrame, columns: list[str]) -> None:
    for col in columns:
        nulls = df[col].is_null()
        if nulls.any():
            row = nulls.arg_true()[0]
            raise DatasetError(f"dataset {name!r}: manifest {str(path)!r} row {row}: column {col!r} is empty")


def _manifest_classes(name: str, spec: dict, kind: str, rows: dict) -> tuple[list, list[ClassInfo]]:
    """(class keys in class order: the int labels or label strings, ClassInfos)."""
    classnames = spec.get("classnames")
    if kind == "int":
        if not _is_list(classnames):
            raise DatasetError(f"dataset {name!r}: integer labels need 'classnames', a list of names in label order")
        keys: list = list(range(len(classnames)))
    elif _is_list(classnames):
        keys = list(classnames)
        repeated = sorted({str(k) for k in keys if keys.count(k) > 1})
        if repeated:
            raise DatasetError(f"dataset {name!r}: 'classnames' lists the label(s) {repeated} more than once")
    else:
        keys = sorted({label for split_rows in rows.values() for *_, label in split_rows})
    what = "classes" if kind == "int" or _is_list(classnames) else "labels"
    return keys, _class_infos(name, keys, classnames, spec.get("wnids"), what)


def _label_range(kind: str, keys: list) -> str:
    if kind == "int":
        return f"labels must be 0..{len(keys) - 1}"
    shown = ", ".join(repr(k) for k in keys[:20])
    return f"known: {shown}{', ...' if len(keys) > 20 else ''}"


def _manifest_image(where: str, base: Path, image: str, allow_outside: bool) -> tuple[Path, str]:
    """(absolute path, sample_id) of a manifest row's image; relative paths resolve against `base`.

    The sample_id is the path relative to `base`, POSIX style, or the absolute path when it leaves `base`
    (allowed only with allow_outside_root). Leaving is judged after resolving symlinks.
    """
    abs_path = Path(os.path.normpath(base / image))  # an absolute `image` replaces `base`
    if not abs_path.is_file():
        raise DatasetError(f"{where}: image file {str(abs_path)!r} does not exist")
    real = os.path.realpath(abs_path)
    if not allow_outside and not _inside(real, os.path.realpath(base)):
        raise DatasetError(
            f"{where}: image {image!r} resolves to {real!r}, outside the manifest's folder {str(base)!r}; "
            f"{OUTSIDE_HINT}"
        )
    rel = Path(os.path.relpath(abs_path, base))
    return abs_path, (abs_path if rel.parts[0] == ".." else rel).as_posix()


# ------------------------------------------------------------------------------------------------- common


def _check_split_name(name: str, split: Any, where: str = "splits") -> None:
    if not isinstance(split, str) or not _SPLIT_NAME.match(split):
        raise DatasetError(
            f"dataset {name!r}: {where}: split name {split!r} must be letters, digits, '_', '-' or '.' "
            f"(it names the file <split>.parquet)"
        )


def _path_key(name: str, spec: Mapping, key: str, label: str | None = None) -> Path:
    value = spec.get(key)
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise DatasetError(f"dataset {name!r}: '{label or key}' must be a path, got {value!r}")
    return Path(os.path.abspath(os.path.expanduser(value)))


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _class_infos(name: str, keys: list, classnames: Any, wnids: Any, what: str) -> list[ClassInfo]:
    """One ClassInfo per key (class folder or label); display names from `classnames`, else the key."""
    names = _per_class(name, "classnames", classnames, keys, what)
    names = [str(k).replace("_", " ") if n is None else n for k, n in zip(keys, names)]
    for key, display in zip(keys, names):
        if not isinstance(display, str) or not display.strip():
            raise DatasetError(
                f"dataset {name!r}: classnames: name for {key!r} must be a non-empty string, got {display!r}"
            )
    codes = _per_class(name, "wnids", wnids, keys, what)
    return [ClassInfo(index=i, name=n, wnid=w, key=k if isinstance(k, str) else None)
            for i, (k, n, w) in enumerate(zip(keys, names, codes))]


def _require_mapping(name: str, key: str, value: Any, folders: list[str]) -> None:
    """Refuse a list for a per-class ImageFolder option: matched by position, a list in any other order than
    the sorted folders would silently mislabel classes."""
    if value is None or isinstance(value, Mapping):
        return
    example = ", ".join(f"{f}: ..." for f in folders[:3]) + (", ..." if len(folders) > 3 else "")
    raise DatasetError(
        f"dataset {name!r}: '{key}' must be a mapping class folder -> value, not a list (a list would be matched "
        f"by position to the class folders sorted by name: {_preview(folders)}); write {key}: {{{example}}}"
    )


def _per_class(name: str, key: str, value: Any, keys: list, what: str) -> list:
    """A per-class spec value given as a list in class order or a mapping key -> value (None: unset)."""
    if value is None:
        return [None] * len(keys)
    if _is_list(value):
        if len(value) != len(keys):
            raise DatasetError(
                f"dataset {name!r}: '{key}' has {len(value)} entries but there are {len(keys)} {what}: "
                f"{_preview(keys)}"
            )
        return list(value)
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in keys]
        if unknown:
            raise DatasetError(f"dataset {name!r}: '{key}' names {unknown} which are not {what} ({_preview(keys)})")
        return [value.get(k) for k in keys]
    raise DatasetError(f"dataset {name!r}: '{key}' must be a list (in class order) or a mapping, got {value!r}")


def _preview(keys: list, n: int = 20) -> str:
    return ", ".join(str(k) for k in keys[:n]) + (", ..." if len(keys) > n else "")


def _write(name: str, spec: dict, out_dir: Path, classes: list[ClassInfo], provenance: dict,
           items: dict[str, list[Item]]) -> DatasetMeta:
    skip = check_flag(name, spec, "skip_corrupt")
    if spec.get("allow_outside_root"):
        provenance["allow_outside_root"] = True
    provenance["counts"] = {}
    provenance["skipped_corrupt"] = []
    meta = DatasetMeta(
        name=name, task="single-label", metric=spec.get("metric", "accuracy"), classes=classes,
        provenance=provenance,
    )
    # The generators fill provenance's counts and skipped files; write_dataset serialises it after the splits.
    key_kind = "folder" if provenance["source"] == "imagefolder" else "label"
    rows = {split: _warn_empty_classes(name, split, _rows(name, split, split_items, skip, provenance), classes, key_kind)
            for split, split_items in items.items()}
    return write_dataset(out_dir, meta, rows)


def _rows(name: str, split: str, items: list[Item], skip: bool, provenance: dict) -> Iterator[dict]:
    """Verified rows of one split. Without skip_corrupt every bad image of the split is collected and
    reported in one error at the end (nothing is written: the dataset folder is atomic)."""
    rows = ({"sample_id": sid, "label": label, "image": _read(name, split, path)} for path, sid, label in items)
    return checked_rows(name, split, rows, skip, provenance, "fix or remove them",
                        where={sid: str(path) for path, sid, _ in items})


def _warn_empty_classes(name: str, split: str, rows: Iterator[dict], classes: list[ClassInfo],
                        key_kind: str) -> Iterator[dict]:
    """Pass the split's rows on; once they are all written, warn (one line) about the classes that got no image in
    it, corrupt ones skipped included. Not an error: a split may lack a class on purpose, but it is often a folder
    or manifest mistake, and per-class metrics are undefined for it."""
    counts = [0] * len(classes)
    for row in rows:
        counts[row["label"]] += 1
        yield row
    empty = [c for c, n in zip(classes, counts) if n == 0]
    if not empty:
        return
    shown = ", ".join(f"{c.name!r}" + (f" ({key_kind} {c.key!r})" if c.key and c.key != c.name else "")
                      for c in empty[:MAX_REPORTED])
    more = f" and {len(empty) - MAX_REPORTED} more" if len(empty) > MAX_REPORTED else ""
    print(f"warning: dataset {name!r} split {split!r}: class{'es' if len(empty) > 1 else ''} {shown}{more} "
          f"{'have' if len(empty) > 1 else 'has'} no images", file=sys.stderr)


def _read(name: str, split: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise DatasetError(f"dataset {name!r} split {split!r}: cannot read image {str(path)!r}: {err}") from err


