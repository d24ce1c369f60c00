"""VTAB's 19 tasks as data: which TFDS-prepared dataset each reads, its splits, its label rule, its class names.

The `vtab` source (vlbench/datasets/vtab.py) reads TFDS-prepared TFRecord files and asks this table how to
turn each stored `tf.train.Example` into a (sample, label) of a VTAB split. Rules follow
google-research/task_adaptation (`data/*.py`); docs/datasets.md and docs/protocols.md cite each one.

An example is given to `label` as the record's features: {key: np.ndarray} with int64 or float32 values
(flat, as TFDS serialises them: nested features are `a/b` keys, sequences are flattened) or a list of bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# One slice of a TFDS split: (TFDS split name, start, stop), rows [start, stop) in TFDS's prepared order.
Slice = tuple[str, int, int]


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

    def split_sizes(self) -> dict[str, int]:
        return {split: sum(stop - start for _, start, stop in slices) for split, slices in self.splits.items()}


TASKS: dict[str, VtabTask] = {}
