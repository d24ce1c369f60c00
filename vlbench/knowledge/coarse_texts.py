"""Text sets for coarse classes: the prompts the granularity analysis scores coarse concepts with.

A dataset entry asks for them under `texts` (the texts stage calls `coarse_text_sets`; `vlbench.texts` does not
import this module, so only the texts stage depends on WordNet):

- `hierarchy: tree | dag` -> text set `hierarchy`: every coarse class of the WordNet hierarchy above the
  dataset's leaf classes (`vlbench.knowledge.hierarchy.build_hierarchy` in that mode), each filled into every
  template of the entry, owner `key` = the coarse class's wnid, `source` = `template`. The granularity analysis
  rebuilds the same hierarchy and checks that this set covers exactly its coarse classes.
- `groups: true` -> text set `groups`: the classes' `group` field (a two-level dataset: fine classes with a
  coarse group each, e.g. the demo's colour-shape pairs grouped by shape, BREEDS superclasses, CIFAR-100
  superclasses), owner `key` = the group string, one row per template; prompts say the group with underscores
  as spaces ("aquatic_mammals" -> "aquatic mammals").

Coarse-class texts are text sets like any other: embed_texts embeds them, and their version covers their rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from vlbench.datasets.canonical import DatasetError, DatasetMeta
from vlbench.datasets.wnids import leaf_wnids
from vlbench.knowledge.hierarchy import build_hierarchy
from vlbench.texts import entry_templates, text_table

HIERARCHY_SET = "hierarchy"
GROUPS_SET = "groups"
HIERARCHY_MODES = ("tree", "dag")


def coarse_text_sets(meta: DatasetMeta, cfg: Mapping[str, Any], wn=None) -> dict[str, pa.Table]:
    """The coarse-class text sets the entry's `texts` params (`cfg`) ask for: `hierarchy`, `groups`, both or none,
    with the entry's templates (`wn`: a WordNet reader, default `load_wordnet()`)."""
    sets: dict[str, pa.Table] = {}
    if cfg.get("hierarchy") is None and cfg.get("groups") is None:
        return sets
    templates = entry_templates(meta.name, cfg)
    mode = cfg.get("hierarchy")
    if mode is not None:
        sets[HIERARCHY_SET] = hierarchy_prompts(meta, templates, check_mode(meta.name, mode), wn)
    groups = cfg.get("groups")
    if groups not in (None, False, True):
        raise DatasetError(f"dataset {meta.name!r}: texts.groups must be true or false; got {groups!r}")
    if groups:
        sets[GROUPS_SET] = group_prompts(meta, templates)
    return sets


def check_mode(dataset: str, mode: Any) -> str:
    if mode not in HIERARCHY_MODES:
        raise DatasetError(f"dataset {dataset!r}: texts.hierarchy must be one of {', '.join(HIERARCHY_MODES)} "
                           f"(the WordNet hierarchy's shape); got {mode!r}")
    return mode


def fill(templates: list[str], owners: list[str], names: list[str]) -> pa.Table:
    """Every template filled with every name, owner-major, as a `key`-owned text set."""
    rows = [(owner, t.replace("{c}", name)) for owner, name in zip(owners, names) for t in templates]
    return text_table("key", [o for o, _ in rows], ["template"] * len(rows), [t for _, t in rows])


def hierarchy_prompts(meta: DatasetMeta, templates: list[str], mode: str, wn=None) -> pa.Table:
    """Prompts for every coarse class of the WordNet hierarchy above the dataset's leaves (`wn`: a WordNet reader,
    default `load_wordnet()`)."""
    leaves = leaf_wnids(meta.classes)
    if not leaves:
        raise DatasetError(f"dataset {meta.name!r}: texts.hierarchy needs classes with a WordNet id (`wnid` in "
                           f"classes.json); none of its {len(meta.classes)} classes has one")
    coarse = build_hierarchy(leaves, wn, mode=mode).coarse_classes
    return fill(templates, [n.wnid for n in coarse], [n.name for n in coarse])


def class_groups(meta: DatasetMeta) -> list[str]:
    """Each class's group, in class order; a class without one is an error naming it."""
    missing = [f"{c.index} ({c.name})" for c in meta.classes if not c.group]
    if missing:
        raise DatasetError(f"dataset {meta.name!r}: texts.groups needs a `group` on every class; classes "
                           f"{', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''} have none")
    return [c.group for c in meta.classes]


def group_name(group: str) -> str:
    return group.replace("_", " ")


def group_prompts(meta: DatasetMeta, templates: list[str]) -> pa.Table:
    groups = list(dict.fromkeys(class_groups(meta)))  # first-seen order
    return fill(templates, groups, [group_name(g) for g in groups])
