"""WordNet ids of a dataset's classes, below both the sources and the knowledge hierarchy.

- `leaf_wnids(classes)`: the leaf wnids of a class list (what `vlbench hierarchy` builds above);
- `check_leaves(wnids)`: a leaf list a hierarchy can be built from (non-empty, valid, distinct wnids);
- ImageNet-1k's class list: its 1000 wnids in class-index order come from BREEDS-Benchmarks' copy of the
  ILSVRC-2012 class list (`dataset_class_info.json`, a JSON list of [index, wnid, "comma-separated WordNet
  lemmas"]), the very file and cache name the `breeds` source fetches (`CLASS_INFO`). `parse_class_info` is the
  one reader of that file (the `breeds` source and `vlbench.datasets.imagenet.imagenet_wnids` both use it).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from vlbench.datasets.canonical import DatasetError

WNID = re.compile(r"^[nvasr]\d{8}$")
HYPERNYM_GROUP = "hypernym"  # classes.json group of a class that lists a coarse concept, not a leaf
IMAGENET_CLASSES = 1000
BREEDS_COMMIT = "f83be509107e89f41dde0e4e8e7f8be051fbb891"
BREEDS_BASE_URL = (f"https://raw.githubusercontent.com/MadryLab/BREEDS-Benchmarks/{BREEDS_COMMIT}"
                   "/imagenet_class_hierarchy/modified/")


def breeds_file(upstream: str, sha256: str) -> dict:
    """The download spec of one file of BREEDS-Benchmarks' `imagenet_class_hierarchy/modified` folder."""
    return {"file": f"BREEDS-{BREEDS_COMMIT[:8]}-{upstream}", "url": BREEDS_BASE_URL + upstream, "sha256": sha256}


CLASS_INFO = breeds_file("dataset_class_info.json", "be90503d57a001f95e094a81dc4de90772bfc58546ca58061d6474799829afd0")


class HierarchyError(DatasetError):
    """A leaf set or a class list a hierarchy cannot be built from; the message names the dataset, file or wnid."""


def check_leaves(leaf_wnids: Sequence[str]) -> tuple[str, ...]:
    leaves = tuple(leaf_wnids)
    if not leaves:
        raise HierarchyError("no leaf wnids given: a hierarchy needs at least one WordNet id")
    for i, wnid in enumerate(leaves):
        if not isinstance(wnid, str) or not WNID.match(wnid):
            raise HierarchyError(f"leaf {i}: {wnid!r} is not a WordNet id (a POS letter and 8 digits, e.g. 'n02084071')")
    repeated = sorted(w for w, n in Counter(leaves).items() if n > 1)
    if repeated:
        raise HierarchyError(f"leaf wnids must be distinct; repeated: {', '.join(repeated)}")
    return leaves


# ---------------------------------------------------------------------------------------------------------
# Where a dataset's leaves come from


def leaf_wnids(classes: Iterable[Any]) -> list[str]:
    """The leaf wnids of a class list (ClassInfo objects or classes.json dicts): every class with a wnid,
    except classes marked `group: hypernym` (a dataset that lists coarse concepts as classes of their own)."""
    out = []
    for c in classes:
        wnid, group = (c.get("wnid"), c.get("group")) if isinstance(c, Mapping) else (c.wnid, c.group)
        if wnid and group != HYPERNYM_GROUP:
            out.append(wnid)
    return out


def parse_class_info(path: Path, expected: int | None = None) -> list[tuple[int, str, str]]:
    """The rows (index, wnid, lemmas) of a BREEDS `dataset_class_info.json`: a JSON list of
    `[index, wnid, "comma-separated lemmas"]`, index == position, wnids valid and distinct; `expected`, when given,
    is the number of classes it must list."""
    try:
        rows = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise HierarchyError(f"{path}: not a readable JSON class list ({err})") from None
    if not isinstance(rows, list):
        raise HierarchyError(f"{path}: expected a JSON list of [index, wnid, names], got {type(rows).__name__}")
    parsed = [_class_info_row(path, i, row) for i, row in enumerate(rows)]
    check_leaves_in(path, [wnid for _, wnid, _ in parsed])
    if expected is not None and len(parsed) != expected:
        raise HierarchyError(f"{path}: {len(parsed)} classes, expected {expected}")
    return parsed


def _class_info_row(path: Path, i: int, row: Any) -> tuple[int, str, str]:
    if not (isinstance(row, list) and len(row) == 3 and row[0] == i and isinstance(row[1], str) and WNID.match(row[1])):
        raise HierarchyError(f"{path}: entry {i} is {row!r}; expected [{i}, wnid, names]")
    return i, row[1], str(row[2])


def check_leaves_in(path: Path, wnids: list[str]) -> tuple[str, ...]:
    try:
        return check_leaves(wnids)
    except HierarchyError as err:
        raise HierarchyError(f"{path}: {err}") from None
