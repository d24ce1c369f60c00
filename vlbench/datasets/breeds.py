"""BREEDS Entity13 and Living17 (Santurkar et al., 2021) as a dataset source (`source: breeds`).

`prepare: {source: breeds, breeds: entity13 | living17}`. A BREEDS dataset is a set of ImageNet classes grouped
into superclasses of a modified WordNet hierarchy. The groupings are generated here exactly as the BREEDS code
does (MadryLab/robustness, `robustness/tools/breeds_helpers.py`: `make_entity13` / `make_living17` with
`split=None`, i.e. `BreedsDatasetGenerator.get_superclasses(level, Nsubclasses, balanced=True, ancestor,
random_seed=2)`), re-implemented without networkx or pandas:

- the hierarchy is the graph of `class_hierarchy.txt` restricted to the ancestors of the 1000 ImageNet classes
  of `dataset_class_info.json`; a node's level is its longest distance from the root `n00001740`;
- the candidate superclasses are the nodes at `level` (below `ancestor`, if given), sorted by wnid; those with
  at least `Nsubclasses` ImageNet classes below them are kept, in that order (their index is the BREEDS label);
- each keeps `Nsubclasses` of its (sorted) ImageNet classes drawn by `numpy.random.RandomState(2).choice(...,
  replace=False)`, one draw per superclass in order, from one generator, as BREEDS does.

Entity13 = level 3, 20 subclasses each (13 x 20 = 260 classes); Living17 = level 5 under "living thing"
(n00004258), 4 subclasses each (17 x 4 = 68 classes). The hierarchy files are downloaded at run time from
MadryLab/BREEDS-Benchmarks at a fixed commit and verified by sha256.

The prepared dataset: one class per chosen ImageNet class, in the standard ImageNet order (sorted wnids, as
the openness paper's loaders list them), named with CLIP's ImageNet names like `imagenet-1k`, with
`group` = the superclass's BREEDS node name (e.g. "snake, serpent, ophidian"), `wnid` and WordNet `aliases`.
Images are the ImageNet validation images of those classes (split `val`, 50 per class), read from the same
manually downloaded ILSVRC2012 files as `imagenet-1k` (see imagenet.py). Per-sample extra columns:
`superclass` (the BREEDS label: index of the superclass) and `imagenet_label` (the standard ImageNet index).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from vlbench.datasets import imagenet
from vlbench.datasets.canonical import (
    ClassInfo,
    DatasetError,
    DatasetMeta,
    write_dataset,
)
from vlbench.datasets.images import checked_rows
from vlbench.datasets.download import fetch_files
from vlbench.datasets.spec import check_flag, check_keys
from vlbench.datasets.wnids import BREEDS_COMMIT, CLASS_INFO, breeds_file, parse_class_info

KEYS = ("source", "breeds", "files", "skip_corrupt")
ROOT = "n00001740"  # entity
SEED = 2  # BREEDS' random_seed for every standard dataset
TRAVERSE_DEPTH = 100  # ClassHierarchy.traverse's default depth, used by get_nodes_at_level
COMMIT = BREEDS_COMMIT
UPSTREAM = f"MadryLab/BREEDS-Benchmarks@{COMMIT[:8]} imagenet_class_hierarchy/modified; ILSVRC2012 validation"


HIERARCHY_FILES = {
    "class_hierarchy": breeds_file(
        "class_hierarchy.txt", "039cfaddf9732855b93f7899ba4b5ba6d80f8dbe15cfaad566f575b6c8ce0216"),
    "node_names": breeds_file(
        "node_names.txt", "322af45711ed69a7b199f11225bd964c7dae71df3c586498bef2f7c9e031dedb"),
    "class_info": CLASS_INFO,
}
FILES = {**HIERARCHY_FILES, **imagenet.FILES}


@dataclass(frozen=True)
class Recipe:
    """The arguments of one BREEDS `make_*` function (split=None, balanced=True, random_seed=2)."""

    level: int
    subclasses: int
    superclasses: int  # how many the published dataset has: a different count means different files
    ancestor: str | None = None

    @property
    def classes(self) -> int:
        return self.superclasses * self.subclasses


RECIPES = {
    "entity13": Recipe(level=3, subclasses=20, superclasses=13),
    "living17": Recipe(level=5, subclasses=4, superclasses=17, ancestor="n00004258"),
}


@dataclass(frozen=True)
class Superclass:
    wnid: str
    name: str
    subclasses: tuple[str, ...]  # ImageNet wnids, in the order BREEDS draws them


# ----------------------------------------------------------------------------------------------- hierarchy


@dataclass
class ClassHierarchy:
    """The BREEDS class hierarchy restricted to the ancestors of the dataset's classes (`ClassHierarchy`)."""

    leaves: list[tuple[int, str, str]]  # (ImageNet index, wnid, WordNet lemmas) as in dataset_class_info.json
    names: dict[str, str]  # node wnid -> node name (node_names.txt)
    children: dict[str, set[str]]
    level: dict[str, int]  # longest distance from the root, for every node the root reaches

    @classmethod
    def from_files(cls, class_info: Path, class_hierarchy: Path, node_names: Path,
                   root: str = ROOT) -> ClassHierarchy:
        leaves = parse_class_info(class_info)
        edges = parse_edges(class_hierarchy)
        names = parse_node_names(node_names)
        return cls.build(leaves, edges, names, root, where=str(class_hierarchy))

    @classmethod
    def build(cls, leaves: list[tuple[int, str, str]], edges: Iterable[tuple[str, str]], names: dict[str, str],
              root: str = ROOT, where: str = "the class hierarchy") -> ClassHierarchy:
        children = ancestor_graph([wnid for _, wnid, _ in leaves], edges)
        if root not in children:
            raise DatasetError(f"{where}: the root {root!r} is not an ancestor of any dataset class")
        return cls(leaves=leaves, names=names, children=children, level=longest_levels(children, root, where))

    @property
    def leaf_ids(self) -> set[str]:
        return {wnid for _, wnid, _ in self.leaves}

    def name(self, node: str) -> str:
        return self.names.get(node, node)

    def leaves_below(self, node: str) -> set[str]:
        """The dataset classes below `node` (itself if it is one); the walk stops at a class, as BREEDS' does."""
        leaf_ids = self.leaf_ids
        found = {node} & leaf_ids
        todo = {node}
        while todo:
            below = {c for n in todo for c in self.children.get(n, ())}
            found |= below & leaf_ids
            todo = below - leaf_ids
        return found

    def descendants(self, node: str, depth: int = TRAVERSE_DEPTH) -> set[str]:
        """`node` and every node at most `depth` edges below it (breadth first: each at its shortest distance)."""
        seen, frontier = {node}, {node}
        for _ in range(depth):
            frontier = {c for n in frontier for c in self.children.get(n, ())} - seen
            if not frontier:
                break
            seen |= frontier
        return seen

    def nodes_at_level(self, level: int, ancestor: str | None = None) -> list[str]:
        """`get_nodes_at_level`, sorted by wnid."""
        nodes = [n for n, lv in self.level.items() if lv == level]
        if ancestor is not None:
            below = self.descendants(ancestor)
            nodes = [n for n in nodes if n in below]
        return sorted(nodes)


def ancestor_graph(leaves: Iterable[str], edges: Iterable[tuple[str, str]]) -> dict[str, set[str]]:
    """parent -> children for every edge on a path up from a dataset class (`_make_parent_graph`); classes that
    are not in the hierarchy are skipped."""
    parents: dict[str, set[str]] = {}
    for parent, child in edges:
        parents.setdefault(child, set()).add(parent)
    known = {n for ps in parents.values() for n in ps} | set(parents)
    children: dict[str, set[str]] = {}
    todo = {leaf for leaf in leaves if leaf in known}
    visited = set(todo)
    while todo:
        found = set()
        for node in todo:
            for parent in parents.get(node, ()):
                children.setdefault(parent, set()).add(node)
                found.add(parent)
        todo = found - visited  # BREEDS walks every path; a node's edges only need adding once
        visited |= todo
    return children


def longest_levels(children: Mapping[str, set[str]], root: str, where: str) -> dict[str, int]:
    """Each node's longest distance from `root` (BREEDS' `_make_level_dict` keeps the longest path)."""
    reachable, todo = {root}, {root}
    while todo:
        todo = {c for n in todo for c in children.get(n, ())} - reachable
        reachable |= todo
    indegree = {n: 0 for n in reachable}
    for n in reachable:
        for c in children.get(n, ()):
            indegree[c] += 1
    level = {root: 0}
    ready = deque([root])
    while ready:
        node = ready.popleft()
        for c in children.get(node, ()):
            level[c] = max(level.get(c, 0), level[node] + 1)
            indegree[c] -= 1
            if indegree[c] == 0:
                ready.append(c)
    if len(level) != len(reachable) or any(indegree.values()):
        raise DatasetError(f"{where}: the hierarchy below {root!r} has a cycle")
    return level


def superclasses(hierarchy: ClassHierarchy, level: int, subclasses: int, ancestor: str | None = None,
                 seed: int = SEED) -> list[Superclass]:
    """BREEDS' `get_superclasses(level, Nsubclasses=subclasses, split=None, ancestor, balanced=True, seed)`."""
    nodes = hierarchy.nodes_at_level(level, ancestor)
    if not nodes:
        raise DatasetError(f"BREEDS: no hierarchy node at level {level}" + (f" below {ancestor!r}" if ancestor else ""))
    below = [sorted(hierarchy.leaves_below(n)) for n in nodes]
    empty = [n for n, leaves in zip(nodes, below) if not leaves]
    if empty:  # BREEDS asserts min_desc > 0
        raise DatasetError(f"BREEDS: hierarchy node(s) {empty} at level {level} have no ImageNet class below them")
    rng = np.random.RandomState(seed)
    kept = [(n, leaves) for n, leaves in zip(nodes, below) if len(leaves) >= subclasses]
    return [Superclass(wnid=n, name=hierarchy.name(n),
                       subclasses=tuple(str(w) for w in rng.choice(leaves, subclasses, replace=False)))
            for n, leaves in kept]


def make(hierarchy: ClassHierarchy, breeds: str) -> list[Superclass]:
    """The superclasses of a standard BREEDS dataset (`make_entity13` / `make_living17`, split=None)."""
    recipe = RECIPES[breeds]
    return superclasses(hierarchy, recipe.level, recipe.subclasses, recipe.ancestor)


# ----------------------------------------------------------------------------------------------- file parsing


def parse_edges(path: Path) -> list[tuple[str, str]]:
    """class_hierarchy.txt: one `parent child` edge a line."""
    edges = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 2:
            raise DatasetError(f"{path} line {number}: expected 'parent_wnid child_wnid', got {line!r}")
        edges.append((parts[0], parts[1]))
    return edges


def parse_node_names(path: Path) -> dict[str, str]:
    """node_names.txt: `wnid<TAB>name` a line."""
    names = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.strip().split("\t")
        if len(parts) != 2:
            raise DatasetError(f"{path} line {number}: expected 'wnid<TAB>name', got {line!r}")
        names[parts[0]] = parts[1]
    return names


# ------------------------------------------------------------------------------------------------- source


def _breeds(name: str, spec: Mapping) -> str:
    breeds = spec.get("breeds")
    if breeds not in RECIPES:
        raise DatasetError(f"dataset {name!r}: 'breeds' must be one of {', '.join(RECIPES)}, got {breeds!r}")
    return breeds


def catalogue_row(name: str, spec: dict) -> dict:
    """Classes and split size of a BREEDS entry, known without any download (50 val images per class)."""
    check_keys(name, spec, KEYS)
    recipe = RECIPES[_breeds(name, spec)]
    return {"classes": recipe.classes, "splits": {imagenet.SPLIT: recipe.classes * imagenet.VAL_PER_CLASS},
            "metric": "accuracy", "manual_download": True}


def build(name: str, spec: dict, out_dir: Path) -> DatasetMeta:
    check_keys(name, spec, KEYS)
    breeds = _breeds(name, spec)
    skip = check_flag(name, spec, "skip_corrupt")
    files = fetch_files(name, spec, FILES)
    paths = {role: path for role, (_, path) in files.items()}
    hierarchy = ClassHierarchy.from_files(paths["class_info"], paths["class_hierarchy"], paths["node_names"])
    groups = make(hierarchy, breeds)
    _check_published_shape(name, breeds, groups)
    devkit = imagenet.read_devkit(name, paths["devkit"])
    _check_same_classes(name, hierarchy, devkit, paths["class_info"])
    classes, superclass_of = breeds_classes(imagenet.imagenet_classes(name, devkit), groups)
    provenance = {
        "source": "breeds", "breeds": breeds, "upstream": UPSTREAM,
        "recipe": {"level": RECIPES[breeds].level, "subclasses": RECIPES[breeds].subclasses,
                   "ancestor": RECIPES[breeds].ancestor, "balanced": True, "split": None, "random_seed": SEED},
        "superclasses": [{"label": i, "wnid": g.wnid, "name": g.name, "subclasses": list(g.subclasses)}
                         for i, g in enumerate(groups)],
        "files": {role: res.provenance(path) for role, (res, path) in files.items()},
        "class_names": imagenet.CLASS_NAMES_SOURCE,
        "skipped_corrupt": [],
    }
    meta = DatasetMeta(name=name, task="single-label", metric="accuracy", classes=classes, provenance=provenance)
    samples = _samples(imagenet.iter_val_images(name, paths["val_images"], devkit), classes, superclass_of, devkit)
    rows = checked_rows(name, imagenet.SPLIT, samples, skip, provenance, imagenet.FIX)
    return write_dataset(out_dir, meta, {imagenet.SPLIT: rows},
                         extra_columns={"superclass": pa.int64(), "imagenet_label": pa.int64()})


def breeds_classes(imagenet_classes: list[ClassInfo], groups: list[Superclass]) -> tuple[list[ClassInfo], dict[str, int]]:
    """The chosen ImageNet classes in ImageNet order, each with its superclass as `group`; and wnid -> BREEDS label."""
    superclass_of = {wnid: label for label, g in enumerate(groups) for wnid in g.subclasses}
    chosen = [c for c in imagenet_classes if c.wnid in superclass_of]
    classes = [ClassInfo(index=i, name=c.name, wnid=c.wnid, group=groups[superclass_of[c.wnid]].name,
                         aliases=list(c.aliases)) for i, c in enumerate(chosen)]
    return classes, superclass_of


def _samples(images: Iterator[tuple[str, str, bytes]], classes: list[ClassInfo], superclass_of: dict[str, int],
             devkit: imagenet.Devkit) -> Iterator[dict]:
    """Rows for the val images of the chosen classes only."""
    label = {c.wnid: c.index for c in classes}
    imagenet_label = {wnid: i for i, wnid in enumerate(devkit.wnids)}
    for sample_id, wnid, data in images:
        if wnid in label:
            yield {"sample_id": sample_id, "label": label[wnid], "image": data,
                   "superclass": superclass_of[wnid], "imagenet_label": imagenet_label[wnid]}


def _check_published_shape(name: str, breeds: str, groups: list[Superclass]) -> None:
    recipe = RECIPES[breeds]
    if len(groups) != recipe.superclasses:
        raise DatasetError(
            f"dataset {name!r}: the BREEDS hierarchy files give {len(groups)} {breeds} superclasses "
            f"({', '.join(g.name for g in groups)}), but {breeds} has {recipe.superclasses}; "
            f"use the files of MadryLab/BREEDS-Benchmarks@{COMMIT[:8]}"
        )


def _check_same_classes(name: str, hierarchy: ClassHierarchy, devkit: imagenet.Devkit, class_info: Path) -> None:
    """The hierarchy's class list must be the devkit's classes in the standard order (BREEDS numbers classes so)."""
    expected = list(enumerate(devkit.wnids))
    found = [(i, wnid) for i, wnid, _ in hierarchy.leaves]
    if found != expected:
        first = next((k for k, (a, b) in enumerate(zip(found, expected)) if a != b), min(len(found), len(expected)))
        got = found[first] if first < len(found) else None
        want = expected[first] if first < len(expected) else None
        raise DatasetError(
            f"dataset {name!r}: {class_info} does not list the ImageNet devkit's classes in the standard order "
            f"({len(found)} vs {len(expected)} classes; first difference at position {first}: {got} vs {want})"
        )
