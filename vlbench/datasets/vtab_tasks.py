"""VTAB's 19 tasks as data: which TFDS-prepared dataset each reads, its splits, its label rule, its class names.

The `vtab` source (vlbench/datasets/vtab.py) reads TFDS-prepared TFRecord files and asks this table how to
turn each stored `tf.train.Example` into a (sample, label) of a VTAB split. Rules follow
google-research/task_adaptation (`data/*.py`); docs/datasets.md ("VTAB tasks") cites each one.

An example is given to `label` as the record's features: {key: np.ndarray} with int64 or float32 values
(flat, as TFDS serialises them: nested features are `a/b` keys, sequences are flattened) or a list of bytes.

Where the table's facts come from:
- builder, version: task_adaptation's `tfds.builder("name:MAJOR.*.*")` fixes the major version; the pinned
  minor.patch is that major's version in TFDS whose split sizes `tfds_sizes` are (TFDS catalogue and builders).
- splits: task_adaptation's `tfds_splits`, computed from `tfds_sizes` with the code's integer arithmetic
  (`P * n // 100`); 1k subsets are the first 800 of `train` and the first 200 of `val`.
- group: vlbench/analyses/adapt/vtab_groups.json, the one place for it (the adapt analysis reads it too).
- classes and templates: vlbench/datasets/data/vtab.json, made by tools/vtab_data.py (CLIP_benchmark and the CLIP
  paper's lists; each task records its source).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vlbench.datasets.canonical import DatasetError

# One slice of a TFDS split: (TFDS split name, start, stop), rows [start, stop) in TFDS's prepared order.
Slice = tuple[str, int, int]
SPLITS = ("train", "val", "test", "train800", "val200", "train800val200")
GROUPS_FILE = Path(__file__).resolve().parents[1] / "analyses" / "adapt" / "vtab_groups.json"
NAMES_FILE = Path(__file__).with_name("data") / "vtab.json"
# task_adaptation's thresholds: label = the last index i with thresholds[i] < value (tf.where(thrs - v < 0))
CLEVR_DISTANCE_THRESHOLDS = (0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0)
KITTI_DISTANCE_THRESHOLDS = (-100.0, 8.0, 20.0, 999.0)
KITTI_NO_VEHICLE = 1000.0  # the depth task_adaptation appends, so that an image without a vehicle lands in bin 3
KITTI_VEHICLES = 3  # object types 0 Car, 1 Van, 2 Truck (TFDS kitti's `objects/type` ClassLabel order)


class VtabLabelError(DatasetError):
    """A stored example whose features cannot give its task's label (missing key, value out of the task's range)."""


@dataclass(frozen=True)
class VtabTask:
    name: str  # VTAB's task name, e.g. "clevr_count"
    group: str  # natural | specialized | structured
    tfds: str  # TFDS builder (and config) as task_adaptation loads it, e.g. "clevr", "diabetic_retinopathy_detection/btgraham-300"
    version: str  # the TFDS version VTAB used, pinned, e.g. "3.1.0"
    splits: Mapping[str, tuple[Slice, ...]]  # VTAB split (train, val, test, train800, val200, train800val200) -> slices
    classes: tuple[str, ...]  # class names for zero-shot, in label order
    label: Callable[[Mapping[str, Any]], int]  # the task's label from one stored example's features
    image_key: str = "image"  # the feature holding the encoded image
    class_source: str = ""  # where the class names come from (CLIP paper, CLIP_benchmark, TFDS, ...)
    tfds_sizes: Mapping[str, int] = field(default_factory=dict)  # examples per TFDS split of the pinned version
    pixel_scale: int = 1  # multiply decoded pixels by this (dSprites stores 0/1; task_adaptation multiplies by 255)
    templates: tuple[str, ...] = ()  # zero-shot templates ("{c}" is the class name), CLIP_benchmark's for the task
    template_source: str = ""
    metric: str = "accuracy"  # VTAB reports top-1 accuracy on every task
    # later TFDS versions whose release notes change only URLs or add features: same images, labels, keys, order
    same_examples: tuple[str, ...] = ()
    # a feature naming an example independently of its position, for a builder whose train/test partition is made at
    # preparation and can differ between two preparations (Caltech-101: file-system order): vtab.partition hashes it
    identity_key: str | None = None

    def split_sizes(self) -> dict[str, int]:
        return {split: sum(stop - start for _, start, stop in slices) for split, slices in self.splits.items()}


# ----------------------------------------------------------------------------------------------------------------
# Label rules (task_adaptation data/*.py)


def _feature(task: str, features: Mapping[str, Any], key: str) -> np.ndarray:
    if key not in features:
        raise VtabLabelError(f"VTAB task {task!r}: the example has no feature {key!r} "
                             f"(it has {sorted(features)}); is this the right TFDS dataset?")
    return np.asarray(features[key])


def _checked(task: str, label: int, n: int, why: str) -> int:
    if not 0 <= label < n:
        raise VtabLabelError(f"VTAB task {task!r}: label {label} from {why} is outside 0..{n - 1}")
    return label


def _bin(task: str, value: float, thresholds: tuple[float, ...], n: int, what: str) -> int:
    """The last index i with thresholds[i] < value, as task_adaptation's tf.reduce_max(tf.where(thrs - v < 0))."""
    below = [i for i, t in enumerate(thresholds) if t - value < 0]
    if not below:
        raise VtabLabelError(f"VTAB task {task!r}: {what} {value} is not above the first threshold {thresholds[0]}")
    return _checked(task, below[-1], n, f"{what} {value}")


def stored_label(task: str, key: str, n: int) -> Callable[[Mapping[str, Any]], int]:
    """The label TFDS stores under `key` (a ClassLabel: one int64)."""
    def label(features: Mapping[str, Any]) -> int:
        values = _feature(task, features, key)
        if values.size != 1:
            raise VtabLabelError(f"VTAB task {task!r}: feature {key!r} has {values.size} values, expected one")
        return _checked(task, int(values.reshape(-1)[0]), n, f"feature {key!r}")
    return label


def clevr_count(task: str, n: int) -> Callable[[Mapping[str, Any]], int]:
    """Number of objects - 3 (clevr.py `_count_preprocess_fn`: tf.size(objects/size) - 3)."""
    def label(features: Mapping[str, Any]) -> int:
        objects = _feature(task, features, "objects/size").size
        return _checked(task, objects - 3, n, f"{objects} objects")
    return label


def clevr_distance(task: str, n: int) -> Callable[[Mapping[str, Any]], int]:
    """The closest object's depth (the least 3rd pixel coordinate), binned at 0, 8, 8.5, 9, 9.5, 10, 100
    (clevr.py `_closest_object_preprocess_fn`)."""
    def label(features: Mapping[str, Any]) -> int:
        coords = _feature(task, features, "objects/pixel_coords").reshape(-1)
        if coords.size == 0 or coords.size % 3:
            raise VtabLabelError(f"VTAB task {task!r}: objects/pixel_coords has {coords.size} values, "
                                 "expected 3 per object and at least one object")
        return _bin(task, float(coords[2::3].min()), CLEVR_DISTANCE_THRESHOLDS, n, "closest depth")
    return label


def kitti_distance(task: str, n: int) -> Callable[[Mapping[str, Any]], int]:
    """The nearest Car/Van/Truck's depth (location z), binned at -100, 8, 20, 999; no vehicle is depth 1000 and
    bin 3 (kitti.py `_closest_vehicle_distance_pp`). Pedestrians, cyclists, trams and misc objects do not count."""
    def label(features: Mapping[str, Any]) -> int:
        types = _feature(task, features, "objects/type").reshape(-1)
        location = _feature(task, features, "objects/location").reshape(-1)
        if location.size != 3 * types.size:
            raise VtabLabelError(f"VTAB task {task!r}: {types.size} objects but {location.size} location values "
                                 "(expected x, y, z per object)")
        depths = location[2::3][types < KITTI_VEHICLES]
        nearest = float(min([*depths.tolist(), KITTI_NO_VEHICLE]))
        return _bin(task, nearest, KITTI_DISTANCE_THRESHOLDS, n, "nearest vehicle depth")
    return label


def grouped(task: str, key: str, original: int, n: int) -> Callable[[Mapping[str, Any]], int]:
    """TFDS's `key` (0..original-1) grouped into n classes: floor(value / (original / n)) in float32, as
    dsprites.py casts the value to float32 and tf.math.floordiv's it by class_division_factor."""
    factor = np.float32(original / n)
    stored = stored_label(task, key, original)

    def label(features: Mapping[str, Any]) -> int:
        value = stored(features)
        return _checked(task, int(math.floor(np.float32(value) / factor)), n, f"feature {key!r} = {value}")
    return label


# ----------------------------------------------------------------------------------------------------------------
# Splits: task_adaptation's tfds_splits as integer slices of the pinned TFDS sizes


def vtab_splits(train: Slice, val: Slice, test: Slice) -> dict[str, tuple[Slice, ...]]:
    """The six VTAB splits from train/val/test: train800 = the first 800 of train, val200 = the first 200 of val."""
    train800 = (train[0], train[1], train[1] + 800)
    val200 = (val[0], val[1], val[1] + 200)
    return {"train": (train,), "val": (val,), "test": (test,), "train800": (train800,), "val200": (val200,),
            "train800val200": (train800, val200)}


def tfds_three(sizes: Mapping[str, int]) -> dict[str, tuple[Slice, ...]]:
    """TFDS's own train / validation / test (dtd, flowers, sun397, camelyon, retinopathy, dmlab, kitti)."""
    return vtab_splits(("train", 0, sizes["train"]), ("validation", 0, sizes["validation"]),
                       ("test", 0, sizes["test"]))


def holdout(sizes: Mapping[str, int], train_percent: int, test: str = "test") -> dict[str, tuple[Slice, ...]]:
    """train = the first P * n // 100 of TFDS train, val = the rest; test = a TFDS split (caltech, cifar, pets,
    svhn; CLEVR tests on TFDS `validation`, its `test` has no labels)."""
    n = sizes["train"]
    cut = train_percent * n // 100
    return vtab_splits(("train", 0, cut), ("train", cut, n), (test, 0, sizes[test]))


def three_way(sizes: Mapping[str, int], train_percent: int, val_percent: int) -> dict[str, tuple[Slice, ...]]:
    """All three from TFDS train: P% train, V% val, the rest test (eurosat, resisc45 60/20; dsprites 80/10)."""
    n = sizes["train"]
    t, v = train_percent * n // 100, val_percent * n // 100
    return vtab_splits(("train", 0, t), ("train", t, t + v), ("train", t + v, n))


def smallnorb_splits(sizes: Mapping[str, int]) -> dict[str, tuple[Slice, ...]]:
    """TFDS train; val = test[:50%], test = test[50%:] (smallnorb.py, VAL_SPLIT_PERCENT = 50)."""
    cut = 50 * sizes["test"] // 100
    return vtab_splits(("train", 0, sizes["train"]), ("test", 0, cut), ("test", cut, sizes["test"]))


# ----------------------------------------------------------------------------------------------------------------
# The table


def _row(name, tfds, version, sizes, splits, label, **extra) -> dict[str, Any]:
    return {"name": name, "tfds": tfds, "version": version, "tfds_sizes": sizes, "splits": splits(sizes),
            "label": label, **extra}


def _rows() -> list[dict[str, Any]]:
    caltech = {"train": 3060, "test": 6084}
    cifar = {"train": 50000, "test": 10000}
    dtd = {"train": 1880, "validation": 1880, "test": 1880}
    flowers = {"train": 1020, "validation": 1020, "test": 6149}
    pets = {"train": 3680, "test": 3669}
    sun = {"train": 76128, "validation": 10875, "test": 21750}
    svhn = {"train": 73257, "test": 26032, "extra": 531131}
    camelyon = {"train": 262144, "validation": 32768, "test": 32768}
    eurosat = {"train": 27000}
    resisc = {"train": 31500}
    retino = {"train": 35126, "validation": 10906, "test": 42670, "sample": 10}
    clevr = {"train": 70000, "validation": 15000, "test": 15000}
    dmlab = {"train": 65550, "validation": 22628, "test": 22735}
    kitti = {"train": 6347, "validation": 423, "test": 711}
    dsprites = {"train": 737280}
    norb = {"train": 24300, "test": 24300}

    def p90(s):
        return holdout(s, 90)

    def p80(s):
        return holdout(s, 80)

    def p60_20(s):
        return three_way(s, 60, 20)

    def p80_10(s):
        return three_way(s, 80, 10)

    return [
        _row("caltech101", "caltech101", "3.0.0", caltech, p90, stored_label("caltech101", "label", 102),
             same_examples=("3.0.1", "3.0.2"), identity_key="image/file_name"),
        _row("cifar100", "cifar100", "3.0.2", cifar, p90, stored_label("cifar100", "label", 100)),
        _row("dtd", "dtd", "3.0.1", dtd, tfds_three, stored_label("dtd", "label", 47)),
        _row("oxford_flowers102", "oxford_flowers102", "2.1.1", flowers, tfds_three,
             stored_label("oxford_flowers102", "label", 102)),
        _row("oxford_iiit_pet", "oxford_iiit_pet", "3.2.0", pets, p80, stored_label("oxford_iiit_pet", "label", 37)),
        _row("sun397", "sun397/tfds", "4.0.0", sun, tfds_three, stored_label("sun397", "label", 397)),
        _row("svhn", "svhn_cropped", "3.0.0", svhn, p90, stored_label("svhn", "label", 10)),
        _row("patch_camelyon", "patch_camelyon", "2.0.0", camelyon, tfds_three,
             stored_label("patch_camelyon", "label", 2)),
        _row("eurosat", "eurosat/rgb", "2.0.0", eurosat, p60_20, stored_label("eurosat", "label", 10)),
        _row("resisc45", "resisc45", "3.0.0", resisc, p60_20, stored_label("resisc45", "label", 45)),
        _row("diabetic_retinopathy", "diabetic_retinopathy_detection/btgraham-300", "3.0.0", retino, tfds_three,
             stored_label("diabetic_retinopathy", "label", 5)),
        _row("clevr_count", "clevr", "3.0.0", clevr, lambda s: holdout(s, 90, test="validation"),
             clevr_count("clevr_count", 8), same_examples=("3.1.0",)),
        _row("clevr_distance", "clevr", "3.0.0", clevr, lambda s: holdout(s, 90, test="validation"),
             clevr_distance("clevr_distance", 6), same_examples=("3.1.0",)),
        _row("dmlab", "dmlab", "2.0.1", dmlab, tfds_three, stored_label("dmlab", "label", 6)),
        _row("kitti_distance", "kitti", "3.1.0", kitti, tfds_three, kitti_distance("kitti_distance", 4)),
        _row("dsprites_location", "dsprites", "2.0.0", dsprites, p80_10,
             grouped("dsprites_location", "label_x_position", 32, 16), pixel_scale=255),
        _row("dsprites_orientation", "dsprites", "2.0.0", dsprites, p80_10,
             grouped("dsprites_orientation", "label_orientation", 40, 16), pixel_scale=255),
        _row("smallnorb_azimuth", "smallnorb", "2.0.0", norb, smallnorb_splits,
             stored_label("smallnorb_azimuth", "label_azimuth", 18), same_examples=("2.1.0",)),
        _row("smallnorb_elevation", "smallnorb", "2.0.0", norb, smallnorb_splits,
             stored_label("smallnorb_elevation", "label_elevation", 9), same_examples=("2.1.0",)),
    ]


def _tasks() -> dict[str, VtabTask]:
    groups = json.loads(GROUPS_FILE.read_text())["groups"]
    texts = json.loads(NAMES_FILE.read_text(encoding="utf-8"))["tasks"]
    tasks = {}
    for row in _rows():
        t = texts[row["name"]]
        tasks[row["name"]] = VtabTask(
            group=groups[row["name"]], classes=tuple(t["classes"]), class_source=t["class_source"],
            templates=tuple(t["templates"]), template_source=t["template_source"], **row)
    return tasks


TASKS: dict[str, VtabTask] = _tasks()
