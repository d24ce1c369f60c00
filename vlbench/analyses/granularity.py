"""Granularity: consistency of zero-shot scores across the levels of a class hierarchy (Xu et al., "Benchmarking
Zero-Shot Recognition with Vision-Language Models: Challenges on Granularity and Specificity", arXiv 2306.16048).

Three parts, each run when the dataset's text sets allow it (docs/protocols.md, "Granularity analysis"):

- **Hierarchy** (text set `hierarchy`, made by the texts stage for entries with `texts.hierarchy: tree|dag`): the
  WordNet hierarchy above the dataset's leaf classes (`vlbench.knowledge.hierarchy`, mode `granularity.mode`).
  Every image scores every node by raw cosine similarity with prompt ensembles: leaves with the dataset's own class
  prompts (`prompts`), coarse classes three ways: *direct* (the coarse class's own prompt ensemble), *child*-
  propagated (the max of its children's scores, a leaf child scoring with its own prompts, a coarse child with its
  direct score) and *leaf*-propagated (the max over its leaf descendants). Average precision per class over all
  images, an image being a positive of its leaves and all their ancestors; mAP of the leaves and of the coarse
  classes under each scoring, per level too, the gaps (propagated minus direct) and how many coarse classes
  propagation helps.
- **Two-level** (text set `groups`, for entries with `texts.groups: true`: fine classes with a coarse `group`, like
  tieredImageNet's 608 classes in 34 categories): top-1 of the fine classes, of the groups by their own prompts, of
  the group of the predicted fine class, and of the groups scored by the mean of their fine classes' embeddings.
- **Link to training data** (`granularity.corpus`: a dataset whose `captions` text set is a caption corpus): per
  coarse class, how much more often its leaves' names occur in the corpus than its own name, correlated (Pearson)
  with its propagation gap.

Features only: no model, no torch. The hierarchy is rebuilt from WordNet exactly as the texts stage built it, and
the `hierarchy` text set must name exactly its coarse classes.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vlbench.analyses.base import Result
from vlbench.analyses.zeroshot_classifier import class_weights, l2_normalize, similarities, template_weights
from vlbench.datasets.wnids import HYPERNYM_GROUP, leaf_wnids
from vlbench.errors import VlbenchError
from vlbench.knowledge.hierarchy import build_hierarchy
from vlbench.metrics import average_precision_per_class
from vlbench.params import ParamsError
from vlbench.texts import read_text_set, text_set_names

HIERARCHY_SET = "hierarchy"  # vlbench.knowledge.coarse_texts.HIERARCHY_SET
GROUPS_SET = "groups"  # vlbench.knowledge.coarse_texts.GROUPS_SET
CORPUS_SET = "captions"
SCORINGS = ("direct", "child", "leaf")
ROW_CHUNK = 4096  # images per block when gathering columns for propagation
CLASS_CHUNK = 256  # classes per block of average precision (bounds the float64 copy)
MODES = ("tree", "dag")


class GranularityError(VlbenchError):
    """Inputs the granularity analysis cannot use; the message names the dataset, text set, class or sample."""


# ---------------------------------------------------------------------------------------------------------
# The hierarchy as index arrays


@dataclass(frozen=True)
class NodeIndex:
    """A hierarchy's nodes in one order, leaves first (in leaf order) then coarse classes (by level, offset)."""

    leaves: tuple[str, ...]  # leaf wnids
    coarse: tuple[str, ...]  # coarse wnids
    names: tuple[str, ...]  # coarse names
    levels: np.ndarray  # (N,) every node's level, leaves first
    children: tuple[np.ndarray, ...]  # per coarse class: node indices of its children
    below: tuple[np.ndarray, ...]  # per coarse class: leaf indices of its leaf descendants
    membership: np.ndarray  # (N, L) bool: node covers leaf (itself, or a descendant)

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.leaves + self.coarse


def index_hierarchy(tree) -> NodeIndex:
    """Index arrays of a `vlbench.knowledge.hierarchy.Hierarchy` (tree or DAG)."""
    leaves, coarse = tuple(tree.leaves), tuple(n.wnid for n in tree.coarse_classes)
    position = {w: i for i, w in enumerate(leaves + coarse)}
    leaf_position = {w: i for i, w in enumerate(leaves)}
    kids: dict[str, list[int]] = {w: [] for w in position}  # a leaf may be a parent too (rectangle of square)
    for node in tree.nodes.values():
        for parent in node.parents:
            kids[parent].append(position[node.wnid])
    membership = np.zeros((len(position), len(leaves)), dtype=bool)
    for wnid, i in position.items():
        membership[i, [leaf_position[x] for x in tree.nodes[wnid].leaves]] = True
    return NodeIndex(
        leaves=leaves, coarse=coarse, names=tuple(tree.nodes[w].name for w in coarse),
        levels=np.array([tree.nodes[w].level for w in leaves + coarse], dtype=np.int64),
        children=tuple(np.array(sorted(kids[w]), dtype=np.int64) for w in coarse),
        below=tuple(np.flatnonzero(membership[position[w]]) for w in coarse),
        membership=membership,
    )


def positives(image_leaves: np.ndarray, index: NodeIndex) -> np.ndarray:
    """(n, N) bool: an image is a positive of every node above (or at) any of its leaves."""
    return (image_leaves.astype(np.float32) @ index.membership.T.astype(np.float32)) > 0


# ---------------------------------------------------------------------------------------------------------
# Scores


def cosine(image_emb: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """(n, K) raw cosine similarities of images with unit class weights."""
    if image_emb.shape[1] != weights.shape[1]:
        raise GranularityError(f"image embeddings have dim {image_emb.shape[1]}, text embeddings {weights.shape[1]}")
    return similarities(l2_normalize(image_emb.astype(np.float32)), weights)


def group_max(scores: np.ndarray, groups: Sequence[np.ndarray]) -> np.ndarray:
    """(n, len(groups)): per group of columns of `scores`, the row-wise maximum (each group non-empty)."""
    sizes = np.array([len(g) for g in groups])
    if not len(groups) or (sizes == 0).any():
        raise ValueError("group_max needs at least one group and no empty group")
    columns = np.concatenate(groups)
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    out = np.empty((scores.shape[0], len(groups)), dtype=scores.dtype)
    for lo in range(0, scores.shape[0], ROW_CHUNK):
        out[lo:lo + ROW_CHUNK] = np.maximum.reduceat(scores[lo:lo + ROW_CHUNK][:, columns], starts, axis=1)
    return out


def hierarchy_scores(image_emb: np.ndarray, leaf_weights: np.ndarray, coarse_weights: np.ndarray,
                     index: NodeIndex) -> dict[str, np.ndarray]:
    """{"leaves": (n, L), "direct" | "child" | "leaf": (n, C)}: raw cosines and the two propagations."""
    leaves = cosine(image_emb, leaf_weights)
    direct = cosine(image_emb, coarse_weights)
    nodes = np.concatenate([leaves, direct], axis=1)
    return {"leaves": leaves, "direct": direct, "child": group_max(nodes, index.children),
            "leaf": group_max(leaves, index.below)}


# ---------------------------------------------------------------------------------------------------------
# Average precision


def average_precision(scores: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """(K,) non-interpolated AP per column (scikit-learn's definition; NaN without positives), in column blocks."""
    return np.concatenate([average_precision_per_class(scores[:, lo:lo + CLASS_CHUNK], targets[:, lo:lo + CLASS_CHUNK])
                           for lo in range(0, scores.shape[1], CLASS_CHUNK)])


def evaluated(targets: np.ndarray) -> np.ndarray:
    """(K,) bool: columns with at least one positive and one negative image. An all-positive class (the root)
    has AP 1 under any scores and one without positives has none; both are left out of every mean."""
    count = targets.sum(axis=0)
    return (count > 0) & (count < targets.shape[0])


def _mean(values: np.ndarray) -> float | None:
    return float(values.mean()) if values.size else None


@dataclass
class HierarchyResult:
    leaf_ap: np.ndarray  # (L,)
    coarse_ap: dict[str, np.ndarray]  # scoring -> (C,)
    prevalence: np.ndarray  # (N,) fraction of images that are positives
    leaf_ok: np.ndarray  # (L,) bool: evaluated
    coarse_ok: np.ndarray  # (C,) bool


def evaluate_hierarchy(scores: Mapping[str, np.ndarray], image_leaves: np.ndarray, index: NodeIndex) -> HierarchyResult:
    """AP of every leaf (own prompts) and coarse class (each scoring) against the hierarchy's positives."""
    targets = positives(image_leaves, index)
    n_leaves = len(index.leaves)
    ok = evaluated(targets)
    return HierarchyResult(
        leaf_ap=average_precision(scores["leaves"], targets[:, :n_leaves]),
        coarse_ap={s: average_precision(scores[s], targets[:, n_leaves:]) for s in SCORINGS},
        prevalence=targets.mean(axis=0), leaf_ok=ok[:n_leaves], coarse_ok=ok[n_leaves:],
    )


def hierarchy_metrics(res: HierarchyResult) -> dict[str, float | None]:
    """The headline: mAP of the leaves and of the coarse classes under each scoring (evaluated classes only)."""
    out = {"leaf_map": _mean(res.leaf_ap[res.leaf_ok])}
    out.update({f"coarse_map_{s}": _mean(res.coarse_ap[s][res.coarse_ok]) for s in SCORINGS})
    return out


def propagation_summary(res: HierarchyResult) -> dict[str, Any]:
    """Over the evaluated coarse classes: mean gap (propagated minus direct AP) and how many classes each
    propagation helps (AP strictly higher), hurts (strictly lower) or leaves equal."""
    ok = res.coarse_ok
    direct = res.coarse_ap["direct"][ok]
    out: dict[str, Any] = {}
    for s in ("child", "leaf"):
        gap = res.coarse_ap[s][ok] - direct
        out.update({f"gap_{s}": _mean(gap), f"helped_{s}": int((gap > 0).sum()), f"hurt_{s}": int((gap < 0).sum()),
                    f"equal_{s}": int((gap == 0).sum())})
    return out


def chance_levels(res: HierarchyResult, n_leaves: int) -> dict[str, float | None]:
    """The mAP a random ranking gets in expectation, to a close approximation: the mean positive rate."""
    return {"leaf_map": _mean(res.prevalence[:n_leaves][res.leaf_ok]),
            "coarse_map": _mean(res.prevalence[n_leaves:][res.coarse_ok])}


def per_level(res: HierarchyResult, index: NodeIndex) -> list[dict[str, Any]]:
    """One row per level: evaluated coarse classes and their mAP under each scoring, gaps, helped counts, and the
    evaluated leaves at that level with their mAP."""
    n_leaves = len(index.leaves)
    leaf_levels, coarse_levels = index.levels[:n_leaves], index.levels[n_leaves:]
    rows = []
    for level in range(int(index.levels.max()) + 1):
        c = res.coarse_ok & (coarse_levels == level)
        lf = res.leaf_ok & (leaf_levels == level)
        if not c.any() and not lf.any():
            continue
        direct = res.coarse_ap["direct"][c]
        row: dict[str, Any] = {"level": level, "coarse_classes": int(c.sum())}
        row.update({s: _mean(res.coarse_ap[s][c]) for s in SCORINGS})
        for s in ("child", "leaf"):
            row[f"gap_{s}"] = _mean(res.coarse_ap[s][c] - direct)
            row[f"helped_{s}"] = int((res.coarse_ap[s][c] > direct).sum())
        row.update({"leaves": int(lf.sum()), "leaf_map": _mean(res.leaf_ap[lf])})
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------------------
# Two-level variant


def evaluate_two_level(image_emb: np.ndarray, labels: np.ndarray, fine_weights: np.ndarray, group_of: np.ndarray,
                       group_weights: np.ndarray) -> dict[str, float]:
    """Top-1 of: fine classes; groups by their own prompts; the group of the predicted fine class; groups scored
    with the renormalised mean of their fine classes' (unit) class weights."""
    fine = cosine(image_emb, fine_weights).argmax(axis=1)
    truth = group_of[labels]
    mean_children = class_weights(fine_weights, group_of, len(group_weights))
    return {
        "twolevel_fine_top1": float((fine == labels).mean()),
        "twolevel_coarse_direct_top1": float((cosine(image_emb, group_weights).argmax(axis=1) == truth).mean()),
        "twolevel_coarse_from_fine_top1": float((group_of[fine] == truth).mean()),
        "twolevel_coarse_mean_children_top1": float((cosine(image_emb, mean_children).argmax(axis=1) == truth).mean()),
    }


# ---------------------------------------------------------------------------------------------------------
# Link to training data: name frequencies in a caption corpus

_TOKEN = re.compile(r"[a-z0-9]+")
_SUFFIX = re.compile(r"\s*\([^)]*\)$")  # "vessel (container)": the hierarchy's disambiguation, not said in captions


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def plural(word: str) -> str:
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    if word.endswith("y") and len(word) > 1 and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def name_forms(name: str) -> set[tuple[str, ...]]:
    """The token sequences that count as a mention of `name`: itself and its plural (last word pluralised)."""
    base = tuple(tokens(_SUFFIX.sub("", name)))
    return {base, base[:-1] + (plural(base[-1]),)} if base else set()


def mention_counts(captions: Sequence[str], names: Sequence[str]) -> np.ndarray:
    """(len(names),) occurrences of each name (as whole words, case-insensitive, singular or plural) in `captions`."""
    forms = [name_forms(n) for n in names]
    wanted = set().union(*forms) if forms else set()
    lengths = sorted({len(f) for f in wanted})
    found: Counter = Counter()
    for caption in captions:
        words = tokens(caption)
        for k in lengths:
            found.update(g for g in zip(*(words[i:] for i in range(k))) if g in wanted)
    return np.array([sum(found[f] for f in fs) for fs in forms], dtype=np.int64)


def frequency_gaps(coarse_counts: np.ndarray, leaf_counts: np.ndarray, below: Sequence[np.ndarray]) -> np.ndarray:
    """Per coarse class: log10(1 + mean count of its leaves' names) - log10(1 + count of its own name)."""
    leaves_mean = np.array([leaf_counts[b].mean() for b in below])
    return np.log10(1 + leaves_mean) - np.log10(1 + coarse_counts)


def pearson(x: np.ndarray, y: np.ndarray) -> tuple[float | None, float | None]:
    """(r, two-sided p) of scipy.stats.pearsonr; (None, None) for fewer than 3 points or a constant input."""
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None, None
    from scipy.stats import pearsonr

    r, p = pearsonr(x, y)
    return float(r), float(p)


# ---------------------------------------------------------------------------------------------------------
# Reading the inputs


def _template_rows(features) -> tuple[Any, np.ndarray]:
    keep = np.array([s == "template" for s in features.table.column("source").to_pylist()], dtype=bool)
    return features.table.filter(keep), features.embeddings[keep]


def keyed_weights(features, keys: Sequence[str], where: str) -> np.ndarray:
    """(len(keys), d) prompt-ensemble weights of a `key`-owned text set that must cover exactly `keys`."""
    table, emb = _template_rows(features)
    found = table.column("key").to_pylist()
    missing, extra = sorted(set(keys) - set(found)), sorted(set(found) - set(keys))
    if missing or extra:
        raise GranularityError(f"{where}: its prompts are for other classes than the analysis expects (missing "
                               f"{missing[:5]}{' ...' if len(missing) > 5 else ''}, extra {extra[:5]}"
                               f"{' ...' if len(extra) > 5 else ''}); re-run the texts stage, and check that the "
                               f"entry's texts.hierarchy mode is granularity.mode")
    position = {k: i for i, k in enumerate(keys)}
    return class_weights(emb, np.array([position[k] for k in found]), len(keys))


def check_names_in_texts(features, keys: Sequence[str], names: Sequence[str], where: str) -> None:
    """Every prompt of a coarse class says its name (the texts stage and the analysis built the same hierarchy)."""
    name_of = dict(zip(keys, names))
    table, _ = _template_rows(features)
    for key, text in zip(table.column("key").to_pylist(), table.column("text").to_pylist()):
        if name_of[key] not in text:
            raise GranularityError(f"{where}: prompt {text!r} of {key} does not name the class {name_of[key]!r} of "
                                   f"the hierarchy the analysis built; re-run the texts stage")


def leaf_classes(meta, leaves: Sequence[str]) -> np.ndarray:
    """(L,) class index of every leaf wnid (classes that are leaves: a wnid and no `group: hypernym`)."""
    index = {c.wnid: c.index for c in meta.classes if c.wnid and c.group != HYPERNYM_GROUP}
    return np.array([index[w] for w in leaves], dtype=np.int64)


def image_leaves(table, meta, leaf_class: np.ndarray) -> np.ndarray:
    """(n, L) bool: each image's leaf classes (single-label: its label; multi-label: its labels that are leaves).
    An image without a leaf label is an error naming it."""
    import pyarrow.compute as pc

    column = table.column(meta.label_column)
    lookup = np.full(len(meta.classes), -1, dtype=np.int64)
    lookup[leaf_class] = np.arange(len(leaf_class))
    if meta.multi_label:
        flat = pc.list_flatten(column).to_numpy()
        rows = pc.list_parent_indices(column).to_numpy()
    else:
        flat, rows = column.to_numpy(), np.arange(table.num_rows)
    out = np.zeros((table.num_rows, len(leaf_class)), dtype=bool)
    hit = lookup[flat] >= 0
    out[rows[hit], lookup[flat][hit]] = True
    lost = np.flatnonzero(~out.any(axis=1))
    if lost.size:
        first = table.column("sample_id")[int(lost[0])].as_py()
        raise GranularityError(f"dataset {meta.name!r}: {lost.size} image(s) have no leaf class (a class with a wnid "
                               f"that is not `group: hypernym`), e.g. sample {first!r}; the hierarchy cannot place them")
    return out


def group_index(meta, groups: Sequence[str], where: str) -> np.ndarray:
    """(C,) position in `groups` of every class's group."""
    position = {g: i for i, g in enumerate(groups)}
    bad = [f"{c.index} ({c.name}): {c.group!r}" for c in meta.classes if c.group not in position]
    if bad:
        raise GranularityError(f"{where}: classes {', '.join(bad[:5])} have a group without prompts; "
                               f"re-run the texts stage")
    return np.array([position[c.group] for c in meta.classes], dtype=np.int64)


# ---------------------------------------------------------------------------------------------------------
# The analysis


def check_cfg(cfg: Mapping[str, Any]) -> dict[str, Any]:
    mode = cfg.get("mode", "tree")
    if mode not in MODES:
        raise ParamsError(f"params.yaml: granularity.mode {mode!r} is not one of {list(MODES)}")
    corpus = cfg.get("corpus")
    if corpus is not None and not isinstance(corpus, str):
        raise ParamsError(f"params.yaml: granularity.corpus must be a dataset name or null; got {corpus!r}")
    return {"split": cfg.get("split", "test"), "mode": mode, "corpus": corpus or None}


def run(inputs, cfg, seed: int):
    """The granularity analysis of one dataset: the parts its text sets allow (module docstring)."""
    params = check_cfg(cfg)
    available = text_set_names(inputs.texts_dir)
    if HIERARCHY_SET not in available and GROUPS_SET not in available:
        raise GranularityError(f"dataset {inputs.meta.name!r}: no `{HIERARCHY_SET}` or `{GROUPS_SET}` text set in "
                               f"{inputs.texts_dir}; set texts.hierarchy (tree|dag) or texts.groups: true in its entry")
    images = inputs.images(params["split"])
    prompts = inputs.texts("prompts")
    fine = template_weights(prompts.table, prompts.embeddings, len(inputs.meta.classes))
    result = Result(metrics={}, counts={"samples": images.table.num_rows, "classes": len(inputs.meta.classes)},
                    params={**params, "scores": "cosine", "text_sets": []}, tables={"classes": _empty_classes()})
    if HIERARCHY_SET in available:
        _hierarchy_part(inputs, images, fine, params, result)
    if GROUPS_SET in available:
        _two_level_part(inputs, images, fine, result)
    result.metrics = {k: v for k, v in result.metrics.items() if v is not None and math.isfinite(v)}
    return result


def _hierarchy_part(inputs, images, fine: np.ndarray, params: dict, result) -> None:
    meta = inputs.meta
    tree = build_hierarchy(leaf_wnids(meta.classes), mode=params["mode"])
    index = index_hierarchy(tree)
    where = f"{inputs.texts_dir / HIERARCHY_SET}.parquet"
    texts = inputs.texts(HIERARCHY_SET)
    coarse_w = keyed_weights(texts, index.coarse, where)
    check_names_in_texts(texts, index.coarse, index.names, where)
    leaf_class = leaf_classes(meta, index.leaves)
    scores = hierarchy_scores(images.embeddings, fine[leaf_class], coarse_w, index)
    res = evaluate_hierarchy(scores, image_leaves(images.table, meta, leaf_class), index)
    frequency = _frequency_part(inputs, params["corpus"], res, index, meta.class_names, leaf_class)
    result.params.update({"text_sets": result.params["text_sets"] + ["prompts", HIERARCHY_SET],
                          "wordnet": tree.wordnet})
    _record_hierarchy(result, res, index, frequency, [meta.class_names[i] for i in leaf_class])


def _record_hierarchy(result, res: HierarchyResult, index: NodeIndex, frequency: Mapping[str, Any],
                      leaf_names: list[str]) -> None:
    """Headline mAPs and the frequency correlation into the metrics; per level, propagation, chance levels and the
    corpus summary into the details; one row per node into the `classes` table."""
    result.metrics.update(hierarchy_metrics(res))
    if frequency["summary"].get("r_leaf") is not None:
        result.metrics["freq_gap_r"] = frequency["summary"]["r_leaf"]
    result.counts.update({**_hierarchy_counts(res, index), "corpus_captions": frequency["summary"].get("captions", 0)})
    result.details.update({"propagation": propagation_summary(res), "levels": per_level(res, index),
                           "chance": chance_levels(res, len(index.leaves)), "frequency": frequency["summary"]})
    result.tables["classes"] = _classes_table(res, index, leaf_names + list(index.names), frequency)


def _hierarchy_counts(res: HierarchyResult, index: NodeIndex) -> dict[str, int]:
    ok = res.coarse_ok
    no_positive = res.prevalence[len(index.leaves):] == 0
    return {
        "leaves": len(index.leaves), "leaves_evaluated": int(res.leaf_ok.sum()),
        "coarse_classes": len(index.coarse), "coarse_evaluated": int(ok.sum()),
        "coarse_all_positive": int((~ok & ~no_positive).sum()), "coarse_without_positives": int(no_positive.sum()),
    }


def _frequency_part(inputs, corpus: str | None, res: HierarchyResult, index: NodeIndex, class_names: list[str],
                    leaf_class: np.ndarray) -> dict[str, Any]:
    """Name counts in the corpus captions and their correlation with the propagation gaps (evaluated classes)."""
    if corpus is None:
        return {"summary": {"corpus": None}}
    table, _ = read_text_set(inputs.texts_dir.parent / corpus / f"{CORPUS_SET}.parquet")
    captions = table.column("text").to_pylist()
    leaf_counts = mention_counts(captions, [class_names[i] for i in leaf_class])
    coarse_counts = mention_counts(captions, index.names)
    gaps = frequency_gaps(coarse_counts, leaf_counts, index.below)
    ok = res.coarse_ok
    summary: dict[str, Any] = {"corpus": corpus, "captions": len(captions), "classes": int(ok.sum()),
                               "definition": "log10(1 + mean leaf-name count) - log10(1 + coarse-name count)"}
    for s in ("child", "leaf"):
        r, p = pearson(gaps[ok], (res.coarse_ap[s] - res.coarse_ap["direct"])[ok])
        summary.update({f"r_{s}": r, f"p_{s}": p})
    return {"summary": summary, "coarse_counts": coarse_counts, "leaf_counts": leaf_counts, "gaps": gaps}


def _two_level_part(inputs, images, fine: np.ndarray, result) -> None:
    meta = inputs.meta
    if meta.multi_label:
        raise GranularityError(f"dataset {meta.name!r}: the two-level variant (text set {GROUPS_SET!r}) needs "
                               f"single-label data; this dataset is multi-label")
    texts = inputs.texts(GROUPS_SET)
    groups = list(dict.fromkeys(texts.table.column("key").to_pylist()))
    where = f"{inputs.texts_dir / GROUPS_SET}.parquet"
    group_of = group_index(meta, groups, where)
    labels = images.table.column(meta.label_column).to_numpy()
    result.metrics.update(evaluate_two_level(images.embeddings, labels, fine, group_of,
                                             keyed_weights(texts, groups, where)))
    result.counts.update({"fine_classes": len(meta.classes), "groups": len(groups)})
    result.params["text_sets"] += [s for s in ("prompts", GROUPS_SET) if s not in result.params["text_sets"]]
    result.details["twolevel_chance"] = {"fine_top1": 1 / len(meta.classes), "coarse_top1": 1 / len(groups)}


# ---------------------------------------------------------------------------------------------------------
# The per-class table: reports/granularity/<dataset>.classes.parquet

CLASS_COLUMNS = ("wnid", "name", "level", "is_leaf", "positive_rate", "evaluated", "ap_direct", "ap_child", "ap_leaf",
                 "name_count", "leaves_count_mean", "frequency_gap")


def _classes_schema():
    import pyarrow as pa

    types = {"wnid": pa.string(), "name": pa.string(), "level": pa.int64(), "is_leaf": pa.bool_(),
             "positive_rate": pa.float64(), "evaluated": pa.bool_()}
    return pa.schema([(c, types.get(c, pa.float64())) for c in CLASS_COLUMNS])


def _empty_classes():
    import pyarrow as pa

    return pa.Table.from_pylist([], schema=_classes_schema())


def _classes_table(res: HierarchyResult, index: NodeIndex, names: list[str], frequency: Mapping[str, Any]):
    """One row per node (leaves with their class names, then coarse classes): AP under each scoring (a leaf: its
    own prompts, as `ap_direct`), positive rate, and the corpus counts when a corpus was given."""
    import pyarrow as pa

    n_leaves, n_coarse = len(index.leaves), len(index.coarse)
    nan_leaves = np.full(n_leaves, np.nan)
    counts = {"name_count": np.r_[frequency.get("leaf_counts", nan_leaves),
                                  frequency.get("coarse_counts", np.full(n_coarse, np.nan))].astype(float),
              "leaves_count_mean": np.r_[nan_leaves, [frequency["leaf_counts"][b].mean() for b in index.below]
                                         if "leaf_counts" in frequency else np.full(n_coarse, np.nan)],
              "frequency_gap": np.r_[nan_leaves, frequency.get("gaps", np.full(n_coarse, np.nan))]}
    columns = {
        "wnid": list(index.nodes), "name": names, "level": index.levels,
        "is_leaf": np.arange(n_leaves + n_coarse) < n_leaves, "positive_rate": res.prevalence,
        "evaluated": np.r_[res.leaf_ok, res.coarse_ok],
        "ap_direct": np.r_[res.leaf_ap, res.coarse_ap["direct"]],
        "ap_child": np.r_[nan_leaves, res.coarse_ap["child"]], "ap_leaf": np.r_[nan_leaves, res.coarse_ap["leaf"]],
        **counts,
    }
    return pa.table({c: columns[c] for c in CLASS_COLUMNS}, schema=_classes_schema())
