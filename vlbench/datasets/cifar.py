"""CIFAR-10 and CIFAR-100, official python version (Krizhevsky, 2009), as a dataset source (`source: cifar`).

`prepare: {source: cifar, variant: cifar10 | cifar100}` (optional `files: {archive: {...}}` to use another
mirror of the archive).

Files: https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz (md5 c58f30108f718f92721af3b95e74349a) and
cifar-100-python.tar.gz (md5 eb9058c3a382ffc7106e4002c42a8d85), the md5s the CIFAR page and torchvision
publish; extracted safely (archives.extract) and parsed with torchvision's `CIFAR10` / `CIFAR100` classes
(`download=False`; they check each batch file's md5 too).

Splits: the official `train` (50,000) and `test` (10,000), in the official order; `sample_id` is
`<split>/<position, 5 digits>`. Classes: the official label order and names (`batches.meta` label_names,
`meta` fine_label_names), shown with underscores as spaces ("maple_tree" -> "maple tree"; the official
spelling is kept as the class `key`). This is not ELEVATER's class order (its CIFAR-100 starts "chimpanzee");
ELEVATER's entries are separate.

CIFAR-100 superclasses: each class's `group` is its superclass (`coarse_label_names` in the official spelling,
e.g. "aquatic_mammals", "vehicles_1"), found from the (fine, coarse) label pairs of the data; each sample also
has its `coarse_label` (int) as an extra column.

Images are distributed as 32x32 RGB uint8 arrays, not as files: each is stored as a PNG (lossless: decoding
gives back exactly the official pixels). The PNG bytes come from Pillow's encoder, so another Pillow/zlib build
may give other bytes (and so another dataset version) for the same pixels.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from vlbench.datasets.archives import extract
from vlbench.datasets.canonical import (
    ClassInfo,
    DatasetError,
    DatasetMeta,
    write_dataset,
)
from vlbench.datasets.download import fetch_files
from vlbench.datasets.spec import check_keys

KEYS = ("source", "variant", "files")
SPLITS = {"train": 50_000, "test": 10_000}
BASE_URL = "https://www.cs.toronto.edu/~kriz/"


@dataclass(frozen=True)
class Variant:
    title: str
    classes: int
    archive: dict  # the spec mapping of its archive (download.resource)
    torchvision_class: str  # in torchvision.datasets
    superclasses: bool = False


VARIANTS = {
    "cifar10": Variant(
        title="CIFAR-10 python version", classes=10, torchvision_class="CIFAR10",
        archive={"file": "cifar-10-python.tar.gz", "url": BASE_URL + "cifar-10-python.tar.gz",
                 "md5": "c58f30108f718f92721af3b95e74349a"}),
    "cifar100": Variant(
        title="CIFAR-100 python version", classes=100, torchvision_class="CIFAR100", superclasses=True,
        archive={"file": "cifar-100-python.tar.gz", "url": BASE_URL + "cifar-100-python.tar.gz",
                 "md5": "eb9058c3a382ffc7106e4002c42a8d85"}),
}


def _variant(name: str, spec: dict) -> tuple[str, Variant]:
    key = spec.get("variant")
    if key not in VARIANTS:
        raise DatasetError(f"dataset {name!r}: 'variant' must be one of {', '.join(VARIANTS)}, got {key!r}")
    return key, VARIANTS[key]


def catalogue_row(name: str, spec: dict) -> dict:
    check_keys(name, spec, KEYS)
    _, variant = _variant(name, spec)
    return {"classes": variant.classes, "splits": dict(SPLITS), "metric": "accuracy", "manual_download": False}


def build(name: str, spec: dict, out_dir: Path) -> DatasetMeta:
    check_keys(name, spec, KEYS)
    key, variant = _variant(name, spec)
    res, archive = fetch_files(name, spec, {"archive": variant.archive})["archive"]
    root = extract(archive)
    loaded = {split: load_split(name, variant, root, split) for split in SPLITS}
    official = loaded["train"].classes
    coarse = coarse_labels(name, variant, root) if variant.superclasses else None
    if coarse is not None:
        _check_same_length(name, root, loaded, coarse)
    classes = cifar_classes(official, coarse)
    provenance = {
        "source": "cifar", "variant": key, "upstream": f"{variant.title} (Krizhevsky 2009), {BASE_URL}cifar.html",
        "files": {"archive": res.provenance(archive)},
        "image_encoding": "PNG (lossless) of the official 32x32 RGB uint8 arrays",
    }
    if coarse is not None:
        provenance["superclasses"] = coarse.names
    meta = DatasetMeta(name=name, task="single-label", metric="accuracy", classes=classes, provenance=provenance)
    rows = {split: _rows(split, loaded[split], coarse.per_split[split] if coarse else None) for split in SPLITS}
    extra = {"coarse_label": pa.int64()} if coarse is not None else None
    return write_dataset(out_dir, meta, rows, extra_columns=extra)


def load_split(name: str, variant: Variant, root: Path, split: str) -> Any:
    """torchvision's CIFAR dataset of one split, from the extracted archive (no download)."""
    import torchvision.datasets

    cls = getattr(torchvision.datasets, variant.torchvision_class)
    try:
        return cls(root=str(root), train=split == "train", download=False)
    except (RuntimeError, OSError, pickle.UnpicklingError, KeyError, ValueError, EOFError) as err:
        raise DatasetError(
            f"dataset {name!r}: torchvision's {variant.torchvision_class} cannot read {root / cls.base_folder} "
            f"({type(err).__name__}: {err}); the archive must be the official {variant.archive['file']} "
            f"(md5 {variant.archive['md5']})"
        ) from err


@dataclass(frozen=True)
class Coarse:
    """CIFAR-100's superclasses: names in the official order, each fine class's superclass, per-sample labels."""

    names: list[str]
    of_fine: list[int]
    per_split: dict[str, list[int]]


def coarse_labels(name: str, variant: Variant, root: Path) -> Coarse:
    """Superclasses from the official pickles: `meta` coarse_label_names and each split's coarse_labels.
    torchvision's CIFAR100 keeps only the fine labels, so these are read here from the same files."""
    import torchvision.datasets

    cls = getattr(torchvision.datasets, variant.torchvision_class)
    folder = root / cls.base_folder
    names = list(unpickle(name, folder / cls.meta["filename"])["coarse_label_names"])
    files = {"train": cls.train_list, "test": cls.test_list}
    per_split, pairs = {}, set()
    for split, listed in files.items():
        per_split[split] = []
        for filename, _ in listed:
            batch = unpickle(name, folder / filename)
            per_split[split] += [int(c) for c in batch["coarse_labels"]]
            pairs |= {(int(f), int(c)) for f, c in zip(batch["fine_labels"], batch["coarse_labels"])}
    return Coarse(names=names, of_fine=_fine_to_coarse(name, folder, pairs, variant.classes, len(names)),
                  per_split=per_split)


def _check_same_length(name: str, root: Path, loaded: dict[str, Any], coarse: Coarse) -> None:
    for split, dataset in loaded.items():
        if len(coarse.per_split[split]) != len(dataset.targets):
            raise DatasetError(f"dataset {name!r}: in {root}, split {split!r} has {len(dataset.targets)} fine labels "
                               f"but {len(coarse.per_split[split])} coarse labels")


def unpickle(name: str, path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return pickle.load(f, encoding="latin1")
    except (OSError, pickle.UnpicklingError, EOFError) as err:
        raise DatasetError(f"dataset {name!r}: cannot read the CIFAR pickle {path}: {err}") from err


def _fine_to_coarse(name: str, folder: Path, pairs: set[tuple[int, int]], fine: int, coarse: int) -> list[int]:
    """Each fine class's one superclass, from the (fine, coarse) label pairs of the data."""
    found: dict[int, set[int]] = {}
    for f, c in pairs:
        found.setdefault(f, set()).add(c)
    for f in range(fine):
        if len(found.get(f, ())) != 1:
            raise DatasetError(f"dataset {name!r}: in {folder}, fine class {f} has superclass(es) "
                               f"{sorted(found.get(f, ()))}; expected exactly one")
    bad = sorted(c for cs in found.values() for c in cs if not 0 <= c < coarse)
    if bad:
        raise DatasetError(f"dataset {name!r}: in {folder}, coarse label {bad[0]} is not in 0..{coarse - 1}")
    return [next(iter(found[f])) for f in range(fine)]


def cifar_classes(official: list[str], coarse: Coarse | None) -> list[ClassInfo]:
    """Classes in the official label order; display names with spaces, the official spelling as `key`."""
    return [ClassInfo(index=i, name=label.replace("_", " "), key=label,
                      group=coarse.names[coarse.of_fine[i]] if coarse else None)
            for i, label in enumerate(official)]


def _rows(split: str, dataset: Any, coarse: list[int] | None) -> Iterator[dict]:
    from PIL import Image

    for i, (pixels, label) in enumerate(zip(dataset.data, dataset.targets)):
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")
        row = {"sample_id": f"{split}/{i:05d}", "label": int(label), "image": buffer.getvalue()}
        if coarse is not None:
            row["coarse_label"] = coarse[i]
        yield row
