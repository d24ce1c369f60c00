"""Compositionality: does the image-text score prefer the right text among compositional distractors?

SugarCrepe (Hsieh et al., NeurIPS 2023 D&B), Winoground (Thrush et al., CVPR 2022) and ARO (Yuksekgonul et al.,
ICLR 2023), prepared by vlbench/datasets/compositional.py: each image comes with candidate texts grouped into items
(text set `candidates`: sample_id, item, category, source positive | negative, index). Scores are cosine similarities
of cached image and text features. Each benchmark's own metric (`BENCHMARKS`, chosen by the prepared dataset's
provenance `benchmark`):

- SugarCrepe: per category, the fraction of items whose positive scores strictly above the negative (main_eval.py:
  `pos_score > neg_score`); `mean` is the unweighted mean of the seven (ours: the paper reports the seven).
- Winoground: per example, text score: both images prefer their own caption, s(c0,i0) > s(c1,i0) and
  s(c1,i1) > s(c0,i1); image score: both captions prefer their own image, s(c0,i0) > s(c0,i1) and s(c1,i1) > s(c1,i0);
  group score: both. Means over examples, overall and per `collapsed_tag`.
- ARO VG-Relation / VG-Attribution: an item is right when ARO's `np.argmax` over [false, true] picks the true
  caption (index 1: a tie goes to the false one); `macro_accuracy` is the mean over relations (attribute pairs) of their
  accuracies, as ARO's notebook reports it: VG-Relation without its list of symmetric relations, VG-Attribution without
  pairs of fewer than 25 items (evaluate_scores); `accuracy` is over all items.
- ARO COCO-Order / Flickr-Order: right when `np.argmax` over the five options picks the true caption (index 0: a tie
  goes to it); `precision_at_1` over all items.
- demo: as SugarCrepe.

Choices and every difference from CLIP_benchmark: docs/protocols.md, "Compositionality".
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from vlbench.analyses.base import Result
from vlbench.errors import VlbenchError
from vlbench.stats import bootstrap_sample_metric

TEXT_SET = "candidates"
SYMMETRIC_FILE = Path(__file__).parent / "data" / "aro_symmetric_relations.json"


class CompositionalityError(VlbenchError):
    """The compositionality analysis cannot run on these params or inputs."""


# ---------------------------------------------------------------------------------------------------------------------
# Trials: one (item, image) with its positive and negatives


@dataclass
class Trials:
    """One row per (item, image): the positive's score and index, the negatives' scores and indices (NaN / -1 padded)."""

    item: np.ndarray
    category: np.ndarray
    sample_id: np.ndarray
    pos_score: np.ndarray
    pos_index: np.ndarray
    neg_scores: np.ndarray  # (n, k)
    neg_index: np.ndarray  # (n, k)


def trials(table, scores: np.ndarray, where: str) -> Trials:
    """Group the candidate rows (columns sample_id, item, category, source, index) by (item, sample_id)."""
    sid = np.asarray(table.column("sample_id").to_pylist(), dtype=object)
    item = np.asarray(table.column("item").to_pylist(), dtype=object)
    positive = np.asarray(table.column("source").to_pylist(), dtype=object) == "positive"
    index = np.asarray(table.column("index").to_pylist(), dtype=np.int64)
    keys = np.char.add(np.char.add(item.astype(str), "\x00"), sid.astype(str))
    uniq, first, group = np.unique(keys, return_index=True, return_inverse=True)
    n_pos = np.bincount(group, weights=positive, minlength=len(uniq))
    bad = np.flatnonzero(n_pos != 1)
    if len(bad):
        raise CompositionalityError(f"{where}: item {item[first[bad[0]]]!r} of image {sid[first[bad[0]]]!r} has "
                                    f"{int(n_pos[bad[0]])} positive texts; each (item, image) needs exactly one")
    pos_rows = np.empty(len(uniq), dtype=np.int64)
    pos_rows[group[positive]] = np.flatnonzero(positive)
    neg = np.flatnonzero(~positive)
    order = neg[np.argsort(group[neg], kind="stable")]
    counts = np.bincount(group[order], minlength=len(uniq))
    if counts.min(initial=1) < 1:
        raise CompositionalityError(f"{where}: item {item[first[np.argmin(counts)]]!r} has no negative text")
    rank = np.arange(len(order)) - np.repeat(np.cumsum(counts) - counts, counts)
    width = int(counts.max(initial=1))
    neg_scores = np.full((len(uniq), width), np.nan)
    neg_index = np.full((len(uniq), width), -1, dtype=np.int64)
    neg_scores[group[order], rank] = scores[order]
    neg_index[group[order], rank] = index[order]
    category = np.asarray(table.column("category").to_pylist(), dtype=object)
    return Trials(item[pos_rows], category[pos_rows], sid[pos_rows], scores[pos_rows].astype(np.float64),
                  index[pos_rows], neg_scores, neg_index)


def strict(t: Trials) -> np.ndarray:
    """The positive scores strictly above every negative."""
    return t.pos_score > np.nanmax(t.neg_scores, axis=1)


def argmax_first(t: Trials) -> np.ndarray:
    """`np.argmax` over the options in index order picks the positive: above every negative listed before it, at least
    equal to every one listed after it."""
    before = np.where(t.neg_index < t.pos_index[:, None], t.neg_scores, -np.inf)
    after = np.where(t.neg_index > t.pos_index[:, None], t.neg_scores, -np.inf)
    before = np.where(np.isnan(before), -np.inf, before)
    after = np.where(np.isnan(after), -np.inf, after)
    return (t.pos_score > before.max(axis=1)) & (t.pos_score >= after.max(axis=1))


# ---------------------------------------------------------------------------------------------------------------------
# Metrics per benchmark: f(trials, cfg) -> (metrics, per-trial correct, details)


def category_accuracy(t: Trials, correct: np.ndarray) -> dict[str, dict[str, float | int]]:
    out = {}
    for c in sorted(set(t.category.tolist())):
        mask = t.category == c
        out[c] = {"accuracy": float(correct[mask].mean()), "items": int(mask.sum())}
    return out


def sugarcrepe(t: Trials, cfg: Mapping[str, Any]):
    correct = strict(t)
    per = category_accuracy(t, correct)
    metrics = {c: v["accuracy"] for c, v in per.items()}
    metrics["mean"] = float(np.mean(list(metrics.values())))
    return metrics, correct, {"categories": per, "macro_over": sorted(per)}


def aro_vg(exclude: Callable[[Mapping[str, Any]], set[str]], min_items: Callable[[Mapping[str, Any]], int]):
    def score(t: Trials, cfg: Mapping[str, Any]):
        correct = argmax_first(t)
        per = category_accuracy(t, correct)
        dropped, n = exclude(cfg), min_items(cfg)
        kept = {c: v for c, v in per.items() if c not in dropped and v["items"] >= n}
        if not kept:
            raise CompositionalityError(f"no category is left for the macro accuracy (excluded {len(dropped)}, "
                                        f"at least {n} items each)")
        metrics = {"macro_accuracy": float(np.mean([v["accuracy"] for v in kept.values()])),
                   "accuracy": float(correct.mean())}
        return metrics, correct, {"categories": per, "macro_over": sorted(kept)}
    return score


def symmetric_relations(cfg: Mapping[str, Any]) -> set[str]:
    if cfg["aro_symmetric"] == "keep":
        return set()
    return set(json.loads(SYMMETRIC_FILE.read_text())["relations"])


def aro_order(t: Trials, cfg: Mapping[str, Any]):
    correct = argmax_first(t)
    return {"precision_at_1": float(correct.mean())}, correct, {}


def winoground(t: Trials, cfg: Mapping[str, Any]):
    """Text, image and group scores per example from the four scores s(c_j, i_k)."""
    if t.neg_scores.shape[1] != 1:
        raise CompositionalityError("winoground: each image needs exactly two captions")
    examples = sorted(set(t.item.tolist()))
    position = {e: i for i, e in enumerate(examples)}
    s = np.full((len(examples), 2, 2), np.nan)  # [example, caption j, image k]; image k is the one caption k fits
    rows = np.array([position[i] for i in t.item.tolist()], dtype=np.int64)
    k = t.pos_index
    s[rows, k, k] = t.pos_score
    s[rows, t.neg_index[:, 0], k] = t.neg_scores[:, 0]
    if np.isnan(s).any():
        bad = examples[int(np.flatnonzero(np.isnan(s).any(axis=(1, 2)))[0])]
        raise CompositionalityError(f"winoground: example {bad!r} lacks one of its two images or captions")
    text = (s[:, 0, 0] > s[:, 1, 0]) & (s[:, 1, 1] > s[:, 0, 1])
    image = (s[:, 0, 0] > s[:, 0, 1]) & (s[:, 1, 1] > s[:, 1, 0])
    group = text & image
    category = {i: c for i, c in zip(t.item.tolist(), t.category.tolist())}
    cats = np.array([category[e] for e in examples], dtype=object)
    metrics = {"text": float(text.mean()), "image": float(image.mean()), "group": float(group.mean())}
    per = {c: {"text": float(text[cats == c].mean()), "image": float(image[cats == c].mean()),
               "group": float(group[cats == c].mean()), "items": int((cats == c).sum())}
           for c in sorted(set(cats.tolist()))}
    correct = group[rows]  # per trial: its example's group score
    return metrics, correct, {"categories": per, "examples": len(examples)}


BENCHMARKS: dict[str, Callable] = {
    "sugarcrepe": sugarcrepe,
    "demo": sugarcrepe,
    "winoground": winoground,
    "aro-vg-relation": aro_vg(symmetric_relations, lambda cfg: 0),
    "aro-vg-attribution": aro_vg(lambda cfg: set(), lambda cfg: cfg["aro_min_items"]),
    "aro-coco-order": aro_order,
    "aro-flickr-order": aro_order,
}
HEADLINE = {"sugarcrepe": "mean", "demo": "mean", "winoground": "group", "aro-vg-relation": "macro_accuracy",
            "aro-vg-attribution": "macro_accuracy", "aro-coco-order": "precision_at_1",
            "aro-flickr-order": "precision_at_1"}


def headline_interval(t: Trials, correct: np.ndarray, details: Mapping[str, Any], seed: int) -> dict:
    """The headline's 95% bootstrap interval over items: a mean over categories (SugarCrepe's mean, ARO's macro
    accuracy) resamples items and averages the categories it kept (mean-per-class accuracy); the others are accuracies
    over items (Winoground: over examples)."""
    if "macro_over" not in details:
        return bootstrap_sample_metric("accuracy", _per_item(t, correct), seed=seed).to_json()
    kept = np.isin(t.category, details["macro_over"])
    _, codes = np.unique(t.category[kept].astype(str), return_inverse=True)
    return bootstrap_sample_metric("mean_per_class", correct[kept], codes.astype(np.int64), seed=seed).to_json()


# ---------------------------------------------------------------------------------------------------------------------
# The analysis


def check_config(cfg: Mapping[str, Any], splits: list[str]) -> dict[str, Any]:
    out = {"split": None, "aro_symmetric": "exclude", "aro_min_items": 25, **cfg}
    if out["aro_symmetric"] not in ("exclude", "keep"):
        raise CompositionalityError(f"params.yaml: compositionality.aro_symmetric must be exclude or keep; got "
                                    f"{out['aro_symmetric']!r}")
    n = out["aro_min_items"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise CompositionalityError(f"params.yaml: compositionality.aro_min_items must be an integer >= 0; got {n!r}")
    if out["split"] is None:
        if len(splits) != 1:
            raise CompositionalityError(f"params.yaml: compositionality.split is null but the dataset has splits "
                                        f"{splits}; name one")
        out["split"] = splits[0]
    elif out["split"] not in splits:
        raise CompositionalityError(f"params.yaml: compositionality.split {out['split']!r} is not a split of the "
                                    f"dataset {splits}")
    return out


def benchmark_of(meta) -> str:
    found = meta.provenance.get("benchmark")
    if found not in BENCHMARKS:
        raise CompositionalityError(f"dataset {meta.name!r}: classes.json provenance names benchmark {found!r}; the "
                                    f"compositionality analysis knows {', '.join(BENCHMARKS)} (prepare it with "
                                    f"source: compositional)")
    return found


def unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def candidate_scores(image_ids, image_emb, table, text_emb, where: str) -> np.ndarray:
    """Cosine similarity of every candidate text with its own image."""
    position = {sid: i for i, sid in enumerate(image_ids)}
    owners = table.column("sample_id").to_pylist()
    missing = [o for o in owners if o not in position]
    if missing:
        raise CompositionalityError(f"{where}: candidate texts of image {missing[0]!r}, which the image features lack "
                                    f"({len(set(missing))} image(s)); re-run embed_images")
    rows = np.array([position[o] for o in owners], dtype=np.int64)
    return np.einsum("nd,nd->n", unit(image_emb)[rows], unit(text_emb)).astype(np.float64)


def run(inputs, cfg, seed: int):
    cfg = check_config(cfg, list(inputs.meta.splits))
    benchmark = benchmark_of(inputs.meta)
    images = inputs.images(cfg["split"])
    texts = inputs.texts(TEXT_SET)
    where = str(inputs.texts_dir / f"{TEXT_SET}.parquet")
    scores = candidate_scores(images.table.column("sample_id").to_pylist(), images.embeddings, texts.table,
                              texts.embeddings, where)
    t = trials(texts.table, scores, where)
    metrics, correct, details = BENCHMARKS[benchmark](t, cfg)
    headline = HEADLINE[benchmark]
    per_item = _per_item(t, correct)
    return Result(
        metrics=metrics,
        counts={"images": images.table.num_rows, "texts": texts.table.num_rows, "trials": len(t.item),
                "items": len(per_item)},
        params={"split": cfg["split"], "benchmark": benchmark, "score": "cosine", "text_set": TEXT_SET,
                "aro_symmetric": cfg["aro_symmetric"], "aro_min_items": cfg["aro_min_items"], "seed": seed},
        details={"benchmark": benchmark, "headline": headline, **details},
        tables={"trials": trials_table(t, correct)},
        intervals={headline: headline_interval(t, correct, details, seed)},
    )


def _per_item(t: Trials, correct: np.ndarray) -> np.ndarray:
    """One correctness per item (Winoground: its two images agree, both carry the group score)."""
    _, first = np.unique(t.item.astype(str), return_index=True)
    return correct[np.sort(first)]


def trials_table(t: Trials, correct: np.ndarray):
    """Per (item, image): item, category, sample_id, the positive's score, the best negative's, correct."""
    return pa.table({
        "item": pa.array(t.item.tolist(), pa.string()),
        "category": pa.array(t.category.tolist(), pa.string()),
        "sample_id": pa.array(t.sample_id.tolist(), pa.string()),
        "positive_score": pa.array(t.pos_score),
        "best_negative_score": pa.array(np.nanmax(t.neg_scores, axis=1)),
        "correct": pa.array(correct.astype(bool)),
    })
