"""A registered dataset's leaf classes (WordNet ids), for the hierarchy above them (`vlbench hierarchy`): from its
prepared classes.json, else as its source lists them before prepare (the source module's `leaf_classes`, looked up
through vlbench.datasets.registry like `catalogue_row`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlbench.datasets.registry import leaf_classes
from vlbench.datasets.wnids import HierarchyError, leaf_wnids
from vlbench.paths import prepared_dir


@dataclass(frozen=True)
class LeafSet:
    wnids: tuple[str, ...]
    origin: str  # where they came from, for the user (a file path or a description)


def dataset_leaves(name: str, entry: Mapping[str, Any], prepared: Path | None = None, *,
                   cache: Path | None = None, mirror: Path | None = None) -> LeafSet:
    """Leaf wnids of registered dataset `name`: from its prepared classes.json (`prepared`, default
    data/prepared/<name>), else as its source lists them before prepare (`leaf_classes` of the source module, through
    vlbench.datasets.registry: the demo's class list, ImageNet's list through the download layer). Errors say which
    dataset and what to do."""
    classes_json = (prepared or prepared_dir(name)) / "classes.json"
    if classes_json.is_file():
        return _with_wnids(name, leaf_wnids(_read_classes(classes_json)), str(classes_json))
    spec = entry.get("prepare") if isinstance(entry, Mapping) else None
    listed = leaf_classes(name, spec, cache=cache, mirror=mirror) if isinstance(spec, Mapping) else None
    if listed is not None:
        return _with_wnids(name, *listed)
    raise HierarchyError(
        f"dataset {name!r} (source {(spec or {}).get('source')!r}): its classes are known only once prepared; "
        f"run `dvc repro prepare@{name}` first (no {classes_json})"
    )


def _with_wnids(name: str, wnids: list[str], origin: str) -> LeafSet:
    if not wnids:
        raise HierarchyError(f"dataset {name!r}: no class has a WordNet id (wnid) in {origin}; a hierarchy needs them")
    return LeafSet(tuple(wnids), origin)


def _read_classes(path: Path) -> list[dict]:
    try:
        classes = json.loads(path.read_text())["classes"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise HierarchyError(f"{path}: cannot read the class list ({type(err).__name__}: {err})") from None
    if not isinstance(classes, list) or not all(isinstance(c, Mapping) for c in classes):
        raise HierarchyError(f"{path}: key 'classes' must be a list of objects")
    return classes
