"""FewTrans' hierarchical class sampling (the sampler's USE_DAG_HIERARCHY path, Meta-Dataset's ImageNet rule) for
datasets whose classes are WordNet synsets.

Read from Frankluox/FewTrans at 9290c48 (`data/sampling.py`, `data/dataset_spec.py` `create_ImageNet_spec`,
`data/ImageNet_graph_operations.py`), itself Meta-Dataset's code:

- The sampling graph of a set of classes (`create_sampling_graph`): the classes and all their WordNet ancestors,
  links restricted to those nodes (`isolate_graph`), then every node with exactly one child removed and its child
  attached to its parents, pass after pass until none is left (`collapse`; children are lists, so a node that ends
  with the same child twice stays). With a root, only the root and its descendants are kept above the classes.
- A split's eligible nodes: its internal nodes by wnid, each with the split's classes below it by wnid (base: those
  with at least MIN_EXAMPLES_IN_CLASS images), kept when min_ways <= count <= MAX_SPANNING_LEAVES_ELIGIBLE (392).
- Per episode the sampler draws a node uniformly (`rng.choice(range(nodes))`) and takes all its classes, or
  `rng.choice(classes, max_ways, replace=False)` of them when it spans more than max_ways.

Here the graph comes from `vlbench.knowledge.hierarchy.wordnet_graph` (WordNet 3.0 via NLTK: `hypernyms()` and
`instance_hypernyms()`), where Meta-Dataset reads ImageNet's `wordnet.is_a.txt`. Each class is a leaf of its own
concept node, so a class that is an ancestor of another class (the demo's ellipse above circle) stays a class while
its concept spans both; on ImageNet, where no class is above another, the concept nodes collapse away and the graph
is Meta-Dataset's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from vlbench.analyses.adapt.protocol import AdaptError
from vlbench.knowledge.hierarchy import HierarchyError, wordnet_graph

MODES = ("dag",)


@dataclass(frozen=True)
class Node:
    wnid: str
    classes: tuple[int, ...]  # dataset class indices below the node, ordered by their wnids


@dataclass(frozen=True)
class DagSplits:
    """Each split's internal nodes (all of them, before the eligibility bounds) and the class split."""

    base: np.ndarray
    novel: np.ndarray
    base_nodes: list[Node]
    novel_nodes: list[Node]
    dataset: str = ""


# ----------------------------------------------------------------------------------------------------------------
# The sampling graph (create_sampling_graph); nodes: wnid strings (concepts) and int class indices (leaves)


def _closure(wnid: str, parents: Mapping[str, Sequence[str]]) -> set[str]:
    """`wnid` and all its ancestors."""
    seen, frontier = {wnid}, [wnid]
    while frontier:
        for p in parents[frontier.pop()]:
            if p not in seen:
                seen.add(p)
                frontier.append(p)
    return seen


def _links(parents, wnids, classes, root):
    """(children, parents) lists of the isolated graph: the classes' concepts, their ancestors (with a root: only
    the root and its descendants), and one leaf per class under its concept."""
    nodes = set().union(*(_closure(wnids[c], parents) for c in classes))
    if root is not None:
        nodes = {n for n in nodes if root in _closure(n, parents)}
    up: dict = {n: sorted(set(parents[n]) & nodes) for n in sorted(nodes)}
    up.update({c: [wnids[c]] if wnids[c] in nodes else [] for c in classes})
    down: dict = {n: [] for n in up}
    for n, ps in up.items():
        for p in ps:
            down[p].append(n)
    return down, up


def _collapse(down: dict, up: dict) -> None:
    """Meta-Dataset's `collapse`, in place, nodes visited in a fixed order (wnid, then class index)."""
    order = sorted(down, key=lambda n: (1, "", n) if isinstance(n, int) else (0, n, 0))
    changed = True
    while changed:
        changed = False
        for n in order:
            if len(down[n]) != 1:
                continue
            child = down[n][0]
            up[child] += up[n]
            for p in up[n]:
                down[p].append(child)
            for p in up[n]:
                down[p].remove(n)
            up[child].remove(n)
            down[n], up[n] = [], []
            changed = True


def sampling_graph(parents: Mapping[str, Sequence[str]], wnids: Sequence[str], classes: Iterable[int],
                   root: str | None = None) -> dict:
    """Children lists of the collapsed sampling graph of `classes` (`wnids[c]` is class c's synset). Concepts left
    without links (collapsed away) are dropped."""
    classes = [int(c) for c in classes]
    if not classes:
        return {}
    down, up = _links(parents, wnids, classes, root)
    _collapse(down, up)
    return {n: ch for n, ch in down.items() if ch or (isinstance(n, int) and up[n])}


def internal_nodes(children: Mapping, wnids: Sequence[str]) -> list[Node]:
    """Every internal node by wnid with the classes it spans, ordered by wnid (`get_spanning_leaves`)."""
    below: dict = {}

    def leaves(n) -> frozenset:
        if n not in below:
            below[n] = frozenset([n]) if isinstance(n, int) else frozenset().union(*(leaves(c) for c in children[n]))
        return below[n]

    return [Node(n, tuple(sorted(leaves(n), key=lambda c: wnids[c])))
            for n in sorted(k for k in children if isinstance(k, str))]


def eligible_nodes(nodes: Sequence[Node], allowed: set[int], min_ways: int, max_leaves: int) -> list[Node]:
    """The nodes whose allowed classes number min_ways..max_leaves, restricted to those classes (order kept)."""
    out = []
    for node in nodes:
        kept = tuple(c for c in node.classes if c in allowed)
        if min_ways <= len(kept) <= max_leaves:
            out.append(Node(node.wnid, kept))
    return out


def draw_classes(rng: np.random.RandomState, nodes: Sequence[Node], max_ways: int) -> tuple[np.ndarray, str]:
    """(classes, node wnid) of one episode: a node uniformly, its classes, max_ways of them drawn when more."""
    node = nodes[rng.choice(len(nodes))]
    classes = np.array(node.classes, dtype=np.int64)
    if len(classes) > max_ways:
        classes = rng.choice(classes, size=max_ways, replace=False)
    return classes, node.wnid


# ----------------------------------------------------------------------------------------------------------------
# Splits


def root_split(parents, wnids: Sequence[str], roots: Sequence[str], dataset: str) -> list[np.ndarray]:
    """Per novel root, the classes below it in the whole dataset's sampling graph (Meta-Dataset's `get_class_splits`
    with given roots, e.g. ImageNet's carnivore n02075296 and device n03183080)."""
    nodes = {n.wnid: n.classes for n in internal_nodes(sampling_graph(parents, wnids, range(len(wnids))), wnids)}
    missing = [r for r in roots if r not in nodes]
    if missing:
        raise AdaptError(f"dataset {dataset!r}: adapt.fewtrans.novel_roots {missing} are not internal nodes of its "
                         "WordNet sampling graph (not above two or more of its classes)")
    below = [np.array(sorted(nodes[r]), dtype=np.int64) for r in roots]
    counts = np.bincount(np.concatenate(below), minlength=len(wnids))
    if counts.max() > 1:
        shared = [wnids[c] for c in np.flatnonzero(counts > 1)]
        raise AdaptError(f"dataset {dataset!r}: adapt.fewtrans.novel_roots {list(roots)} share classes {shared[:5]}; "
                         "Meta-Dataset deals shared classes out in an unordered set's order, which cannot be "
                         "reproduced: choose roots whose classes are disjoint")
    return below


def build(parents, wnids: Sequence[str], base: np.ndarray, novel: np.ndarray,
          roots: Sequence[str] | None = None, novel_by_root: Sequence[np.ndarray] | None = None,
          dataset: str = "") -> DagSplits:
    """The base graph over the base classes; the novel graph over the novel classes, or with roots the union of one
    graph per root (`create_splits`: each root's classes, ancestors restricted to the root and below)."""
    base_nodes = internal_nodes(sampling_graph(parents, wnids, base), wnids)
    if roots:
        parts = [n for r, cs in zip(roots, novel_by_root) for n in internal_nodes(sampling_graph(parents, wnids, cs, r), wnids)]
        novel_nodes = sorted(parts, key=lambda n: n.wnid)
    else:
        novel_nodes = internal_nodes(sampling_graph(parents, wnids, novel), wnids)
    return DagSplits(np.asarray(base, dtype=np.int64), np.asarray(novel, dtype=np.int64), base_nodes, novel_nodes,
                     dataset)


def class_wnids(meta, key: str = "adapt.fewtrans.hierarchy") -> list[str]:
    """Each class's wnid, or an error naming the dataset and `key` when some class has none or they repeat."""
    wnids = [c.wnid for c in meta.classes]
    lacking = [c.name for c in meta.classes if not c.wnid]
    if lacking:
        raise AdaptError(f"dataset {meta.name!r}: {key} needs WordNet classes, but {len(lacking)} class(es) have no "
                         f"wnid (e.g. {lacking[:3]}); remove the dataset from {key}")
    if len(set(wnids)) != len(wnids):
        raise AdaptError(f"dataset {meta.name!r}: {key} needs distinct class wnids; some repeat")
    return wnids


def wordnet_parents(wnids: Sequence[str], dataset: str) -> Mapping[str, Sequence[str]]:
    """The hypernym table above `wnids`, from the repository's offline WordNet (`wordnet_graph`)."""
    try:
        return wordnet_graph(wnids).parents
    except HierarchyError as err:
        raise AdaptError(f"dataset {dataset!r} (adapt.fewtrans.hierarchy): {err}") from None
