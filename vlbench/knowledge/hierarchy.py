"""WordNet hierarchies over a dataset's leaf classes: the coarse classes of the granularity analysis.

`build_hierarchy(leaf_wnids)` collects the WordNet 3.0 ancestors of a set of leaf synsets (ImageNet-1k
wnids, the demo's shapes) and returns a `Hierarchy`:

- **tree** (the default): each leaf keeps one hypernym path, its *longest* path from the root; among
  longest paths of equal length the one whose sequence of synset offsets, read from the root, is
  lexicographically smallest wins. This tie rule is normative: NLTK's `hypernym_paths()` order changes
  from run to run, so "the first path" is not reproducible. The prefix of a chosen path up to any node
  is that node's own chosen path, so the union of the chosen paths is a tree.
- **dag**: every hypernym path of every leaf (all ancestors, every parent link).

Hypernym links are `hypernyms()` plus `instance_hypernyms()` (as NLTK's `hypernym_paths()`). A node's
level is the length of its longest path from the root (`entity` = 0), in both modes. Coarse classes are
the nodes that are not leaves; a leaf that is an ancestor of another leaf (the demo's `rectangle` above
`square`) stays a leaf and is not a coarse class.

Names (see `unique_names`): a coarse class is named by its first WordNet lemma (underscores as spaces)
unless another node of the hierarchy (leaf or coarse) has the same first lemma; then it takes its first
other lemma that no node uses, else "<lemma> (<its tree parent's lemma>)", else "<lemma> (<wnid>)".

The core (`build_from_graph`) works on a plain parent table, so tests can hand-build a miniature
hierarchy; `wordnet_graph` reads that table from WordNet. A registered dataset's leaf wnids come from
`vlbench.datasets.leaves.dataset_leaves` (prepared classes.json, else what the dataset's source lists); the leaf
checks and ImageNet-1k's class list live below both, in `vlbench.datasets.wnids`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vlbench.datasets.wnids import HierarchyError, check_leaves

MODES = ("tree", "dag")

# ---------------------------------------------------------------------------------------------------------
# The graph: what a hierarchy needs from WordNet


@dataclass(frozen=True)
class Graph:
    """A hypernym graph by wnid: each node's parents and lemmas (and NLTK synset name, for display)."""

    parents: Mapping[str, tuple[str, ...]]
    lemmas: Mapping[str, tuple[str, ...]]
    synsets: Mapping[str, str] = field(default_factory=dict)
    version: str = ""


def wordnet_graph(leaf_wnids: Iterable[str], wn=None) -> Graph:
    """The part of WordNet above `leaf_wnids`: every ancestor's parents and lemmas, read from `wn`
    (default `load_wordnet()`)."""
    from vlbench.wordnet import (
        WnidError,
        load_wordnet,
        synset_from_wnid,
        wnid_of,
    )

    wn = wn if wn is not None else load_wordnet()
    parents: dict[str, tuple[str, ...]] = {}
    lemmas: dict[str, tuple[str, ...]] = {}
    synsets: dict[str, str] = {}
    try:
        frontier = [synset_from_wnid(wn, w) for w in leaf_wnids]
    except WnidError as err:
        raise HierarchyError(str(err)) from None
    while frontier:
        synset = frontier.pop()
        wnid = wnid_of(synset)
        if wnid in parents:
            continue
        above = synset.hypernyms() + synset.instance_hypernyms()
        parents[wnid] = tuple(wnid_of(p) for p in above)
        lemmas[wnid] = tuple(lemma.name() for lemma in synset.lemmas())
        synsets[wnid] = synset.name()
        frontier.extend(above)
    return Graph(parents, lemmas, synsets, version=str(wn.get_version()))


# ---------------------------------------------------------------------------------------------------------
# Longest paths and the tie rule


def _order_key(wnid: str) -> tuple[int, str]:
    """How the tie rule compares synsets: by offset (the 8 digits), then the whole id."""
    return int(wnid[1:]), wnid


@dataclass(frozen=True)
class _Best:
    path: tuple[str, ...]  # root first, the node last
    key: tuple[tuple[int, str], ...]
    count: int  # how many longest paths reach the node


def longest_paths(parents: Mapping[str, Sequence[str]], nodes: Iterable[str]) -> dict[str, _Best]:
    """Each node's chosen path: longest from a root, ties to the lexicographically smallest offset sequence.

    Dynamic programming over parents (a node's chosen path extends one parent's chosen path); the result
    holds every ancestor of `nodes` too. Also counts the longest paths, so tied leaves are known. A cycle is
    an error naming a node on it."""
    best: dict[str, _Best] = {}
    for node in nodes:
        _resolve(node, parents, best, visiting=set())
    return best


def _resolve(node: str, parents: Mapping[str, Sequence[str]], best: dict[str, _Best], visiting: set[str]) -> _Best:
    """`best[node]`, computed after its parents (depth first; hypernym chains are a few dozen deep at most)."""
    if node in best:
        return best[node]
    if node in visiting:
        raise HierarchyError(f"hypernym cycle through {node!r}")
    visiting.add(node)
    options = [_resolve(p, parents, best, visiting) for p in _parents_of(node, parents)]
    visiting.discard(node)
    best[node] = _extend(node, options)
    return best[node]


def _parents_of(node: str, parents: Mapping[str, Sequence[str]]) -> Sequence[str]:
    if node not in parents:
        raise HierarchyError(f"synset {node!r} is not in the hypernym graph")
    return parents[node]


def _extend(node: str, options: list[_Best]) -> _Best:
    own = (_order_key(node),)
    if not options:
        return _Best((node,), own, 1)
    length = max(len(o.path) for o in options)
    longest = [o for o in options if len(o.path) == length]
    chosen = min(longest, key=lambda o: o.key)
    return _Best(chosen.path + (node,), chosen.key + own, sum(o.count for o in longest))


# ---------------------------------------------------------------------------------------------------------
# The hierarchy


@dataclass(frozen=True)
class HierarchyNode:
    wnid: str
    synset: str  # NLTK name, e.g. "car.n.01" ("" for a hand-built graph without names)
    name: str  # unique among the hierarchy's coarse classes; a leaf's is its first lemma
    level: int  # longest path length from the root (entity = 0)
    parents: tuple[str, ...]  # tree: the one parent on the chosen path (none at the root); dag: every hypernym
    leaves: tuple[str, ...]  # the leaves at or below this node, in leaf order
    is_leaf: bool


@dataclass(frozen=True)
class Hierarchy:
    mode: str
    leaves: tuple[str, ...]
    nodes: Mapping[str, HierarchyNode]  # every node, ordered by (level, offset)
    tied: tuple[str, ...]  # leaves with more than one longest path (the tie rule decided)
    wordnet: str = ""

    @property
    def coarse_classes(self) -> list[HierarchyNode]:
        return [n for n in self.nodes.values() if not n.is_leaf]

    @property
    def depth(self) -> int:
        """The deepest level of any node (a leaf's), counted from the root = 0."""
        return max(n.level for n in self.nodes.values())

    def per_level(self, leaves: bool = False) -> dict[int, int]:
        """How many coarse classes (or, with `leaves=True`, leaves) sit at each level, every level listed."""
        counts = Counter(n.level for n in self.nodes.values() if n.is_leaf == leaves)
        return {level: counts.get(level, 0) for level in range(self.depth + 1)}

    def ancestors(self, wnid: str) -> list[str]:
        """Every node above `wnid` (tree: its chosen path; dag: all hypernym paths), by (level, offset)."""
        seen: set[str] = set()
        frontier = list(self._node(wnid).parents)
        while frontier:
            current = frontier.pop()
            if current not in seen:
                seen.add(current)
                frontier.extend(self.nodes[current].parents)
        return [w for w in self.nodes if w in seen]

    def children(self, wnid: str) -> list[str]:
        self._node(wnid)
        return [n.wnid for n in self.nodes.values() if wnid in n.parents]

    def _node(self, wnid: str) -> HierarchyNode:
        if wnid not in self.nodes:
            raise HierarchyError(f"{wnid!r} is not a node of this hierarchy ({len(self.nodes)} nodes)")
        return self.nodes[wnid]

    def to_json(self, dataset: str | None = None, origin: str = "") -> dict[str, Any]:
        """The `vlbench hierarchy --json` document (a contract; docs/protocols.md, "Granularity: the hierarchy")."""
        return {
            "dataset": dataset,
            "origin": origin,
            "mode": self.mode,
            "wordnet": self.wordnet,
            "leaves": len(self.leaves),
            "coarse_classes": len(self.coarse_classes),
            "depth": self.depth,
            "per_level": {str(k): v for k, v in self.per_level().items()},
            "leaves_per_level": {str(k): v for k, v in self.per_level(leaves=True).items()},
            "tied_leaves": list(self.tied),
            "classes": [_node_json(n, leaves=True) for n in self.coarse_classes],
            "leaf_classes": [_node_json(self.nodes[w], leaves=False) for w in self.leaves],
        }


def _node_json(node: HierarchyNode, leaves: bool) -> dict[str, Any]:
    row = {"wnid": node.wnid, "synset": node.synset, "name": node.name, "level": node.level,
           "parents": list(node.parents)}
    if leaves:
        row["leaves"] = list(node.leaves)
    return row


def build_hierarchy(leaf_wnids: Sequence[str], wn=None, *, mode: str = "tree") -> Hierarchy:
    """The WordNet hierarchy above `leaf_wnids` (see the module docstring); `wn` defaults to `load_wordnet()`."""
    leaves = check_leaves(leaf_wnids)
    return build_from_graph(leaves, wordnet_graph(leaves, wn), mode=mode)


def build_from_graph(leaf_wnids: Sequence[str], graph: Graph, *, mode: str = "tree") -> Hierarchy:
    """The hierarchy above `leaf_wnids` in `graph` (parents by wnid); see the module docstring."""
    if mode not in MODES:
        raise HierarchyError(f"hierarchy mode {mode!r} is not one of {', '.join(MODES)}")
    leaves = check_leaves(leaf_wnids)
    best = longest_paths(graph.parents, leaves)
    members = _members(leaves, best, graph, mode)
    order = sorted(members, key=lambda w: (len(best[w].path) - 1, _order_key(w)))
    leaf_set = set(leaves)
    names = unique_names(order, leaf_set, graph.lemmas, {w: _tree_parent(best[w]) for w in order})
    nodes = {
        w: HierarchyNode(wnid=w, synset=graph.synsets.get(w, ""), name=names[w], level=len(best[w].path) - 1,
                         parents=_node_parents(w, best, graph, mode), leaves=members[w], is_leaf=w in leaf_set)
        for w in order
    }
    tied = tuple(w for w in leaves if best[w].count > 1)
    return Hierarchy(mode=mode, leaves=leaves, nodes=nodes, tied=tied, wordnet=graph.version)


def _tree_parent(best: _Best) -> str | None:
    return best.path[-2] if len(best.path) > 1 else None


def _node_parents(wnid: str, best: Mapping[str, _Best], graph: Graph, mode: str) -> tuple[str, ...]:
    """tree: the parent on the node's chosen path; dag: every hypernym, by offset."""
    if mode == "tree":
        return best[wnid].path[-2:-1]
    return tuple(sorted(graph.parents[wnid], key=_order_key))


def _members(leaves: Sequence[str], best: Mapping[str, _Best], graph: Graph, mode: str) -> dict[str, tuple[str, ...]]:
    """Every node of the hierarchy with the leaves at or below it (leaf order). `best` already holds every
    ancestor of the leaves (`longest_paths` resolves all parents)."""
    below: dict[str, list[str]] = {}
    for leaf in leaves:
        above = best[leaf].path if mode == "tree" else _closure(leaf, graph.parents)
        for node in above:
            below.setdefault(node, []).append(leaf)
    return {node: tuple(ls) for node, ls in below.items()}


def _closure(leaf: str, parents: Mapping[str, Sequence[str]]) -> list[str]:
    """`leaf` and all its ancestors."""
    seen = {leaf}
    frontier = list(parents[leaf])
    while frontier:
        current = frontier.pop()
        if current not in seen:
            seen.add(current)
            frontier.extend(parents[current])
    return sorted(seen, key=_order_key)


# ---------------------------------------------------------------------------------------------------------
# Names


def lemma_text(lemma: str) -> str:
    return lemma.replace("_", " ")


def unique_names(order: Sequence[str], leaves: set[str], lemmas: Mapping[str, Sequence[str]],
                 tree_parent: Mapping[str, str | None]) -> dict[str, str]:
    """A display name per node: leaves keep their first lemma; coarse classes get names that no other node has.

    A coarse class keeps its first lemma when no other node (leaf or coarse) has the same first lemma. The
    others, taken in `order` (level, then offset), take their first other lemma that is no node's first
    lemma and not yet given, else "<first lemma> (<tree parent's first lemma>)", else "<first lemma> (<wnid>)".
    """
    first = {w: _first_lemma(w, lemmas) for w in order}
    counts = Counter(first.values())
    names = {w: first[w] for w in order if w in leaves or counts[first[w]] == 1}
    used = set(first.values())
    for wnid in order:
        if wnid in names:
            continue
        parent = tree_parent.get(wnid)
        options = [lemma_text(x) for x in lemmas[wnid][1:]]
        options += [f"{first[wnid]} ({first[parent]})"] if parent in first else []
        names[wnid] = next((o for o in options if o not in used), f"{first[wnid]} ({wnid})")
        used.add(names[wnid])
    return names


def _first_lemma(wnid: str, lemmas: Mapping[str, Sequence[str]]) -> str:
    names = lemmas.get(wnid) or ()
    return lemma_text(names[0]) if names else wnid


