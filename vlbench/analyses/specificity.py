"""Specificity (Xu et al., "Benchmarking zero-shot recognition with vision-language models: challenges on granularity
and specificity", Sec. 5 and Table 3): does the image-text score rank an image's true texts above subtly wrong ones?

Per image, its positives of one type are ranked among its negatives of one type by cosine similarity (image to text);
AP per image; mAP over the images per cell (positive type x negative type), each cell with its chance level, the mean
over its images of the expected AP of a random ranking (it depends on the numbers of positives and negatives).

Positive types (`POSITIVES`): the image's true captions (text set `captions`), the single-label prompt of one label of
the image (`single_label_prompts`; the paper's Sec. 5: "apply the classification prompts on one label of the query
image"; `single_label: each` takes every label's), one multi-label prompt naming them all (`multi_label_prompts`), its Localized
Narratives (`narratives`, where the dataset has them). Negative types (`NEGATIVES`): captions of random other images
(`random`), captions of other images that share a class with it (`relevant`), its own captions with one noun replaced
(`altered_captions`, made by the texts stage: vlbench/knowledge/negatives.py). Choices: docs/protocols.md, "Specificity".
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from vlbench.analyses.base import Result
from vlbench.errors import VlbenchError

POSITIVES = ("captions", "single_label", "multi_label", "narratives")
NEGATIVES = ("random", "relevant", "altered")
TEXT_SETS = {"captions": "captions", "narratives": "narratives", "single_label": "single_label_prompts",
             "multi_label": "multi_label_prompts", "altered": "altered_captions"}
OPTIONAL = ("narratives",)  # positive types a dataset may lack (COCO has narratives, the demo has not)
CHUNK = 256  # images scored at once
SINGLE_LABEL = ("one", "each")  # the single-label positives: one label of the image (the paper), or every label


class SpecificityError(VlbenchError):
    """The specificity analysis cannot run on these params or inputs."""


# ---------------------------------------------------------------------------------------------------------------------
# Metrics


def average_precision_rows(scores: np.ndarray, positive: np.ndarray) -> np.ndarray:
    """AP of each row: `scores` (n, k) with NaN for absent items, `positive` (n, k) bool. Tied scores form one threshold,
    as in scikit-learn's `average_precision_score` (sum over thresholds of recall gained x precision there). Rows
    without a positive give NaN."""
    scores = np.asarray(scores, dtype=np.float64)
    present = ~np.isnan(scores)
    s = np.where(present, scores, -np.inf)
    order = np.argsort(-s, axis=1, kind="stable")
    s = np.take_along_axis(s, order, axis=1)
    pos = np.take_along_axis(np.asarray(positive, bool) & present, order, axis=1)
    k = s.shape[1]
    tp = np.cumsum(pos, axis=1)
    is_end = np.ones_like(pos)
    is_end[:, :-1] = s[:, :-1] != s[:, 1:]
    group_end = np.minimum.accumulate(np.where(is_end, np.arange(k), k)[:, ::-1], axis=1)[:, ::-1]
    precision_at_end = np.take_along_axis(tp, group_end, axis=1) / (group_end + 1)
    n_pos = pos.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_pos > 0, (pos * precision_at_end).sum(axis=1) / n_pos, np.nan)


def expected_random_ap(n_pos, n_total) -> np.ndarray:
    """Expected AP of a uniformly random ranking of `n_total` items of which `n_pos` are positive (exact):
    (R - 1)/(N - 1) + (N - R) H_N / (N (N - 1)), H_N the N-th harmonic number; 1 when N = 1."""
    r = np.asarray(n_pos, dtype=np.float64)
    n = np.asarray(n_total, dtype=np.float64)
    if np.any(r < 1) or np.any(n < r):
        raise ValueError("expected_random_ap needs 1 <= n_pos <= n_total")
    top = int(n.max(initial=1))
    harmonic = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, top + 1))])
    h = harmonic[n.astype(np.int64)]
    with np.errstate(invalid="ignore", divide="ignore"):
        value = (r - 1) / (n - 1) + (n - r) * h / (n * (n - 1))
    return np.where(n == 1, 1.0, value)


# ---------------------------------------------------------------------------------------------------------------------
# Grouping texts by image


def padded_groups(owners: np.ndarray, image_ids: np.ndarray, limit: int | None = None) -> np.ndarray:
    """(n_images, k) row indices of the texts each image owns, in table order, -1 padded; texts of other images are
    ignored; at most `limit` per image."""
    position = {sid: i for i, sid in enumerate(image_ids.tolist())}
    owner_pos = np.array([position.get(o, -1) for o in owners.tolist()], dtype=np.int64)
    rows = np.flatnonzero(owner_pos >= 0)
    rows = rows[np.argsort(owner_pos[rows], kind="stable")]
    return _pad(owner_pos[rows], rows, len(image_ids), limit)


def _pad(group: np.ndarray, values: np.ndarray, n_groups: int, limit: int | None) -> np.ndarray:
    """Sorted `group` ids and their `values` as a (n_groups, k) matrix, -1 padded."""
    counts = np.bincount(group, minlength=n_groups)
    rank = np.arange(len(group)) - np.repeat(np.cumsum(counts) - counts, counts)
    keep = rank < (limit if limit is not None else len(group) + 1)
    width = int(min(counts.max(initial=0), limit if limit is not None else counts.max(initial=0)))
    out = np.full((n_groups, max(width, 1)), -1, dtype=np.int64)
    out[group[keep], rank[keep]] = values[keep]
    return out


def class_positives(image_classes: list[list[int]], class_row: Mapping[int, int]) -> np.ndarray:
    """(n_images, k) rows of the single-label prompts of each image's classes, -1 padded."""
    group = np.repeat(np.arange(len(image_classes)), [len(c) for c in image_classes])
    values = np.array([class_row[c] for cs in image_classes for c in cs], dtype=np.int64)
    return _pad(group, values, len(image_classes), None)


# ---------------------------------------------------------------------------------------------------------------------
# Sampling negatives from other images' captions


def sample_caption_negatives(caption_image: np.ndarray, caption_text_id: np.ndarray, image_texts: np.ndarray,
                             n: int, rng: np.random.Generator, allowed: np.ndarray | None = None) -> np.ndarray:
    """(n_images, n) caption rows drawn uniformly without replacement for every image from the captions of other
    images whose text is none of its own captions' (and, with `allowed` (n_images, n_images) bool, only of the
    images it allows), -1 where the pool is smaller than `n`.

    `caption_image`: the image position of every caption (-1: not an image of this split); `caption_text_id`: an id per
    distinct (normalised) text; `image_texts`: (n_images, k) text ids of each image's own captions, -1 padded.
    Random keys per (image, caption) pick the `n` smallest among the allowed: one uniform draw per image, vectorised."""
    n_images = image_texts.shape[0]
    out = np.full((n_images, n), -1, dtype=np.int64)
    for lo in range(0, n_images, CHUNK):
        hi = min(lo + CHUNK, n_images)
        keys = rng.random((hi - lo, len(caption_image)))
        ok = (caption_image[None, :] >= 0) & (caption_image[None, :] != np.arange(lo, hi)[:, None])
        ok &= ~(caption_text_id[None, None, :] == image_texts[lo:hi, :, None]).any(axis=1)
        if allowed is not None:
            ok &= allowed[lo:hi][:, np.maximum(caption_image, 0)]
        keys[~ok] = np.inf
        m = min(n, keys.shape[1])
        pick = np.argpartition(keys, m - 1, axis=1)[:, :m] if m else np.zeros((hi - lo, 0), dtype=np.int64)
        pick = np.take_along_axis(pick, np.argsort(np.take_along_axis(keys, pick, axis=1), axis=1), axis=1)
        out[lo:hi, :m] = np.where(np.isfinite(np.take_along_axis(keys, pick, axis=1)), pick, -1)
    return out


def text_ids(texts: list[str]) -> np.ndarray:
    """An id per distinct text, compared case- and white-space-insensitively."""
    _, inverse = np.unique(np.array([" ".join(t.lower().split()) for t in texts], dtype=object), return_inverse=True)
    return inverse.astype(np.int64)


def share_a_class(image_classes: list[list[int]], num_classes: int) -> np.ndarray:
    """(n_images, n_images) bool: the two images have a class in common."""
    y = np.zeros((len(image_classes), num_classes), dtype=np.float32)
    for i, cs in enumerate(image_classes):
        y[i, cs] = 1.0
    return (y @ y.T) > 0


# ---------------------------------------------------------------------------------------------------------------------
# Scores


def l2_normalize(x: np.ndarray, inplace: bool = False) -> np.ndarray:
    """Rows scaled to unit length, in float32 (in place when asked and `x` is a writable float32 array: COCO's
    500,000 altered captions are 1 GB at 512 dimensions)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    if inplace and x.flags.writeable:
        x /= norms
        return x
    return x / norms


def gathered_scores(images: np.ndarray, texts: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """(n_images, k) cosine similarity of each image with the texts `rows` names (NaN where -1); inputs normalised."""
    out = np.full(rows.shape, np.nan, dtype=np.float32)
    if texts.shape[0] == 0:
        return out
    for lo in range(0, rows.shape[0], CHUNK):
        r = rows[lo:lo + CHUNK]
        s = np.einsum("nd,nkd->nk", images[lo:lo + CHUNK], texts[np.maximum(r, 0)])
        out[lo:lo + CHUNK] = np.where(r >= 0, s, np.nan)
    return out


@dataclass
class Cell:
    positive: str
    negative: str
    images: np.ndarray   # image positions scored in this cell
    ap: np.ndarray
    chance: np.ndarray
    n_pos: np.ndarray
    n_neg: np.ndarray


def score_cell(positive: str, negative: str, pos_scores: np.ndarray, neg_scores: np.ndarray) -> Cell:
    """AP and chance level of every image that has at least one positive and one negative of these types."""
    n_pos = (~np.isnan(pos_scores)).sum(axis=1)
    n_neg = (~np.isnan(neg_scores)).sum(axis=1)
    images = np.flatnonzero((n_pos > 0) & (n_neg > 0))
    scores = np.concatenate([pos_scores[images], neg_scores[images]], axis=1)
    is_pos = np.zeros(scores.shape, dtype=bool)
    is_pos[:, :pos_scores.shape[1]] = True
    ap = average_precision_rows(scores, is_pos)
    chance = expected_random_ap(n_pos[images], n_pos[images] + n_neg[images]) if len(images) else np.zeros(0)
    return Cell(positive, negative, images, ap, chance, n_pos[images], n_neg[images])


# ---------------------------------------------------------------------------------------------------------------------
# The analysis


def check_config(cfg: Mapping[str, Any], splits: list[str]) -> dict[str, Any]:
    """The `specificity` params with defaults; the split resolved (null: the dataset's only split)."""
    out = {"split": None, "negatives": 100, "positives": list(POSITIVES), "negative_types": list(NEGATIVES),
           "single_label": "one", **cfg}
    if out["single_label"] not in SINGLE_LABEL:
        raise SpecificityError(f"params.yaml: specificity.single_label must be one of {list(SINGLE_LABEL)}; "
                               f"got {out['single_label']!r}")
    n = out["negatives"]
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise SpecificityError(f"params.yaml: specificity.negatives must be an integer >= 1; got {n!r}")
    for key, known in (("positives", POSITIVES), ("negative_types", NEGATIVES)):
        bad = [t for t in out[key] or [] if t not in known]
        if bad or not out[key]:
            raise SpecificityError(f"params.yaml: specificity.{key} must be a non-empty list of {list(known)}; "
                                   f"got {out[key]!r}")
    if out["split"] is None:
        if len(splits) != 1:
            raise SpecificityError(f"params.yaml: specificity.split is null but the dataset has splits {splits}; "
                                   f"name one")
        out["split"] = splits[0]
    elif out["split"] not in splits:
        raise SpecificityError(f"params.yaml: specificity.split {out['split']!r} is not a split of the dataset {splits}")
    return out


def _text_set(inputs, name: str):
    if not (inputs.texts_dir / f"{name}.parquet").is_file():
        raise SpecificityError(f"{inputs.texts_dir / (name + '.parquet')}: text set {name!r} missing; the specificity "
                               f"analysis needs `texts.specificity` in the dataset entry of {inputs.meta.name!r} "
                               f"(then run its texts and embed_texts stages)")
    return inputs.texts(name)


@dataclass
class Texts:
    """One text set's normalised embeddings and the table they came with."""

    table: Any
    emb: np.ndarray


def load_texts(inputs, name: str) -> Texts:
    found = _text_set(inputs, name)
    return Texts(found.table, l2_normalize(found.embeddings, inplace=True))


def image_class_lists(multi: Texts, image_ids: np.ndarray) -> list[list[int]]:
    """Each image's classes, as the texts stage wrote them beside its multi-label prompt (none without one)."""
    found = dict(zip(multi.table.column("sample_id").to_pylist(), multi.table.column("classes").to_pylist()))
    return [sorted(found.get(sid) or []) for sid in image_ids.tolist()]


def one_label(classes: list[list[int]], seed: int) -> list[list[int]]:
    """One of each image's labels, drawn uniformly (seeded; the draw of an image depends on its position only), none
    for an image without a label."""
    u = np.random.default_rng([seed, zlib.crc32(b"single_label")]).random(len(classes))
    return [[cs[int(x * len(cs))]] if cs else [] for cs, x in zip(classes, u)]


def positive_rows(kind: str, texts: Texts, image_ids: np.ndarray, classes: list[list[int]],
                  single_label: str = "one", seed: int = 0) -> np.ndarray:
    if kind == "single_label":
        class_row = {c: i for i, c in enumerate(texts.table.column("class_index").to_pylist())}
        return class_positives(one_label(classes, seed) if single_label == "one" else classes, class_row)
    return padded_groups(texts.table.column("sample_id").to_numpy(zero_copy_only=False), image_ids)


def negative_rows(kind: str, captions: Texts, altered: Texts | None, image_ids: np.ndarray,
                  classes: list[list[int]], num_classes: int, n: int, seed: int) -> np.ndarray:
    if kind == "altered":
        return padded_groups(altered.table.column("sample_id").to_numpy(zero_copy_only=False), image_ids, limit=n)
    owners = captions.table.column("sample_id").to_numpy(zero_copy_only=False)
    position = {sid: i for i, sid in enumerate(image_ids.tolist())}
    caption_image = np.array([position.get(o, -1) for o in owners.tolist()], dtype=np.int64)
    ids = text_ids(captions.table.column("text").to_pylist())
    own = padded_groups(owners, image_ids)
    own_texts = np.where(own >= 0, ids[np.maximum(own, 0)], -1)
    rng = np.random.default_rng([seed, zlib.crc32(b"specificity"), zlib.crc32(kind.encode())])
    allowed = share_a_class(classes, num_classes) if kind == "relevant" else None
    return sample_caption_negatives(caption_image, ids, own_texts, n, rng, allowed)


def run(inputs, cfg, seed: int):
    """The specificity analysis of one dataset (see the module docstring)."""
    cfg = check_config(cfg, list(inputs.meta.splits))
    images = inputs.images(cfg["split"])
    image_ids = images.table.column("sample_id").to_numpy(zero_copy_only=False)
    x = l2_normalize(images.embeddings)
    texts = {k: load_texts(inputs, TEXT_SETS[k]) for k in ("captions", "multi_label")}
    classes = image_class_lists(texts["multi_label"], image_ids)
    positives = [p for p in cfg["positives"]
                 if p not in OPTIONAL or (inputs.texts_dir / f"{TEXT_SETS[p]}.parquet").is_file()]
    for kind in [*positives, *(["altered"] if "altered" in cfg["negative_types"] else [])]:
        texts.setdefault(kind, load_texts(inputs, TEXT_SETS[kind]))
    pos_scores = {p: gathered_scores(x, texts[p].emb, positive_rows(p, texts[p], image_ids, classes,
                                                                    cfg["single_label"], seed)) for p in positives}
    neg_scores = {n: gathered_scores(x, texts["altered" if n == "altered" else "captions"].emb,
                                     negative_rows(n, texts["captions"], texts.get("altered"), image_ids, classes,
                                                   len(inputs.meta.classes), cfg["negatives"], seed))
                  for n in cfg["negative_types"]}
    cells = [score_cell(p, n, pos_scores[p], neg_scores[n]) for p in positives for n in cfg["negative_types"]]
    return Result(
        metrics={f"{c.positive}_vs_{c.negative}": float(np.mean(c.ap)) for c in cells if len(c.images)},
        counts=counts(image_ids, pos_scores, neg_scores, cfg["negatives"]),
        params={"split": cfg["split"], "negatives": cfg["negatives"], "positives": positives,
                "positives_missing": [p for p in cfg["positives"] if p not in positives],
                "negative_types": list(cfg["negative_types"]), "single_label": cfg["single_label"],
                "score": "cosine", "seed": seed,
                "text_sets": {k: TEXT_SETS[k] for k in texts}},
        details={"table": table(cells), "rows": positives, "columns": list(cfg["negative_types"])},
        tables={"ap": ap_table(cells, image_ids)},
    )


def counts(image_ids, pos_scores, neg_scores, n: int) -> dict[str, int]:
    out = {"images": len(image_ids)}
    for p, s in pos_scores.items():
        out[f"images_with_{p}"] = int((~np.isnan(s)).any(axis=1).sum())
    for k, s in neg_scores.items():
        have = (~np.isnan(s)).sum(axis=1)
        out[f"images_with_{k}"] = int((have > 0).sum())
        out[f"images_short_of_{k}"] = int(((have > 0) & (have < n)).sum())
    return out


def table(cells: list[Cell]) -> dict[str, dict[str, dict[str, float | int | None]]]:
    """The paper's Table 3: {positive: {negative: {map, chance, images, mean_positives, mean_negatives}}}."""
    out: dict[str, dict[str, dict[str, float | int | None]]] = {}
    for c in cells:
        empty = not len(c.images)
        out.setdefault(c.positive, {})[c.negative] = {
            "map": None if empty else float(np.mean(c.ap)),
            "chance": None if empty else float(np.mean(c.chance)),
            "images": len(c.images),
            "mean_positives": None if empty else float(np.mean(c.n_pos)),
            "mean_negatives": None if empty else float(np.mean(c.n_neg)),
        }
    return out


def ap_table(cells: list[Cell], image_ids: np.ndarray):
    """Per image and cell: sample_id, positive, negative, positives, negatives, ap, chance."""
    import pyarrow as pa

    def col(f):
        return np.concatenate([f(c) for c in cells]) if cells else np.zeros(0)

    return pa.table({
        "sample_id": pa.array(col(lambda c: image_ids[c.images]).tolist(), pa.string()),
        "positive": pa.array(col(lambda c: np.full(len(c.images), c.positive, dtype=object)).tolist(), pa.string()),
        "negative": pa.array(col(lambda c: np.full(len(c.images), c.negative, dtype=object)).tolist(), pa.string()),
        "positives": pa.array(col(lambda c: c.n_pos).astype(np.int64)),
        "negatives": pa.array(col(lambda c: c.n_neg).astype(np.int64)),
        "ap": pa.array(col(lambda c: c.ap).astype(np.float64)),
        "chance": pa.array(col(lambda c: c.chance).astype(np.float64)),
    })
