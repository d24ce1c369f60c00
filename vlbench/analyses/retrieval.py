"""Zero-shot image-text retrieval (CLIP, Radford et al. 2021, Sec. 3.1 and Table 13): Recall@K in both directions on
a captioned test set (COCO 5k and Flickr30k 1k, Karpathy's test splits; the demo's `captions`).

Every image of the split and every caption of those images (the text set `retrieval.text_set`, owner `sample_id`) are
scored by cosine similarity of their features. Image-to-text (i2t, CLIP_benchmark's "text_retrieval"): each image
queries all captions; its positives are all of its own captions; R@K is the fraction of images with at least one
positive among the K best captions. Text-to-image (t2i, "image_retrieval"): each caption queries all images; its
positive is its own image; R@K is the fraction of captions whose image is among the K best. A query's rank is the
position of its best-placed positive (1 = first).

Ties (`retrieval.ties`): `pessimistic` (default): a negative with exactly the score of a positive is ranked above it,
so no model gains from a tie (a constant scorer gets no hit); `index`: ties go in gallery order (caption rows, image
rows), what a stable sort gives and what CLIP_benchmark's `torch.topk` usually, but not by contract, does.
Duplicate captions (`retrieval.duplicates`): `distinct` (default, CLIP_benchmark): every caption row is its own text,
a positive only for the image it belongs to, even where another image has the identical sentence; `merge`: captions
whose texts are equal (case and white space ignored) are one text, a positive for every image that has it, both as
gallery items (i2t) and as a query's positives (t2i). Counts say how many captions are such duplicates and how many
queries had a negative tied with their best positive, so the effect of both choices is visible.

Scores are exact (`exact_scores`): the normalised features are rounded to multiples of 2**-25 and their products summed
in float64, where every partial sum is an integer multiple of 2**-50 below 2**53 of them, so no rounding happens and a
score does not depend on how many queries are scored at once (`CHUNK`), on the BLAS kernel or on the CPU. Texts with
identical features (duplicate captions) therefore score exactly alike and tie as `ties` says, never by rounding.

Intervals: a percentile bootstrap over the test images (`vlbench.stats.cluster_ratio_interval`): an image is drawn
with all of its captions, since t2i's queries are captions and those of one image are not independent.
Choices and the differences from CLIP_benchmark: docs/protocols.md, "Zero-shot retrieval".
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from vlbench.analyses.base import Result
from vlbench.analyses.specificity import text_ids
from vlbench.analyses.zeroshot_classifier import l2_normalize
from vlbench.errors import VlbenchError
from vlbench.params import ParamsError, defaults
from vlbench.stats import cluster_ratio_interval
from vlbench.texts import read_text_set

TIES = ("pessimistic", "index")
DUPLICATES = ("distinct", "merge")
DIRECTIONS = ("i2t", "t2i")
DEFAULTS = defaults("retrieval")  # conf/config.yaml and conf/settings/retrieval.yaml
CHUNK = 256  # queries scored at once: 256 x 25,010 COCO captions is 51 MB of float64 scores
FIXED_POINT = 2.0 ** 25  # features rounded to multiples of 2**-25: exact float64 sums (exact_scores)


class RetrievalError(VlbenchError):
    """The retrieval analysis cannot run on these inputs; the message names the text set, sample or key."""


# ---------------------------------------------------------------------------------------------------------------------
# Ranks


def first_positive_ranks(queries: np.ndarray, gallery: np.ndarray, positives: np.ndarray,
                         ties: str = "pessimistic") -> tuple[np.ndarray, np.ndarray]:
    """(rank, tied) per query: `rank` the 1-based position of the query's best-placed positive when the gallery is
    sorted by decreasing cosine score, `tied` whether a negative has exactly the score of its best positive (its
    highest-scored one), the same under either `ties` rule.

    `queries` (n, d) and `gallery` (m, d) are normalised features; `positives` (n, k) the gallery rows positive for
    each query, -1 padded (at least one each). The best-placed positive p has only negatives above it, so its position
    is 1 + the number of negatives ranked above p, and that number is smallest for p: the rank is the minimum over
    the positives of 1 + (negatives scoring more) + (negatives scoring the same that `ties` puts first)."""
    n = queries.shape[0]
    queries, gallery = fixed_point(queries), fixed_point(gallery)
    ranks, tied = np.empty(n, np.int64), np.zeros(n, bool)
    for lo in range(0, n, CHUNK):
        scores = exact_scores(queries[lo:lo + CHUNK], gallery)
        pos = positives[lo:lo + CHUNK]
        ranks[lo:lo + CHUNK], tied[lo:lo + CHUNK] = _chunk_ranks(scores, pos, ties)
    return ranks, tied


def fixed_point(x: np.ndarray) -> np.ndarray:
    """Normalised features as float64 integers: x * 2**25 rounded (|x| <= 1, so at most 2**25 each)."""
    x = np.asarray(x, np.float64)
    if x.size and np.linalg.norm(x, axis=1).max() > 1.001:
        raise ValueError("retrieval scores need L2-normalised features (exact_scores)")
    return np.rint(x * FIXED_POINT)


def exact_scores(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(n, m) a @ b.T of `fixed_point` rows, exactly: by Cauchy-Schwarz every partial sum of a row pair's products is
    at most |a||b| <= (2**25 + sqrt(d))**2 < 2**53 in magnitude, an integer that float64 holds exactly, so the result
    is the same in any summation order, chunk size, BLAS kernel or CPU. Scores are in units of 2**-50."""
    return a @ b.T


def _chunk_ranks(scores: np.ndarray, pos: np.ndarray, ties: str) -> tuple[np.ndarray, np.ndarray]:
    """(rank, tied) of a chunk's queries (`first_positive_ranks`); `tied`: a negative has exactly the score of the
    query's best positive (its highest-scored one), whichever `ties` rule ranks it."""
    rows = np.arange(scores.shape[0])[:, None]
    negative = np.ones(scores.shape, bool)
    negative[np.broadcast_to(rows, pos.shape)[pos >= 0], pos[pos >= 0]] = False
    columns = np.arange(scores.shape[1])[None, :]
    best = np.full(scores.shape[0], np.iinfo(np.int64).max)
    for j in range(pos.shape[1]):
        valid = pos[:, j] >= 0
        s = scores[rows[:, 0], np.maximum(pos[:, j], 0)][:, None]
        equal = negative & (scores == s)
        first = equal if ties == "pessimistic" else equal & (columns < pos[:, j:j + 1])
        rank = 1 + (negative & (scores > s)).sum(axis=1) + first.sum(axis=1)
        best = np.where(valid & (rank < best), rank, best)
    top = np.where(pos >= 0, scores[rows, np.maximum(pos, 0)], -np.inf).max(axis=1)
    return best, (negative & (scores == top[:, None])).any(axis=1)


def recall_at(ranks: np.ndarray, k: int) -> float:
    return float(np.mean(ranks <= k))


# ---------------------------------------------------------------------------------------------------------------------
# Positives


def caption_owners(owners: list[str], image_ids: list[str]) -> np.ndarray:
    """The image position of each caption (-1: an image outside the split)."""
    position = {sid: i for i, sid in enumerate(image_ids)}
    return np.array([position.get(o, -1) for o in owners], dtype=np.int64)


def positive_sets(owner: np.ndarray, texts: list[str], n_images: int, duplicates: str) -> tuple[np.ndarray, np.ndarray]:
    """(i2t positives (n_images, k) caption rows, t2i positives (n_captions, k) image rows), -1 padded.

    `distinct`: an image's own captions; a caption's own image. `merge`: every caption whose text equals one of the
    image's captions' (`text_ids`: case and white space ignored); every image that has the caption's text."""
    ids = text_ids(texts) if duplicates == "merge" else np.arange(len(owner))
    captions_of_text, images_of_text = defaultdict(list), defaultdict(set)
    texts_of_image: list[set[int]] = [set() for _ in range(n_images)]
    for c, (i, t) in enumerate(zip(owner.tolist(), ids.tolist())):
        captions_of_text[t].append(c)
        images_of_text[t].add(i)
        texts_of_image[i].add(t)
    i2t = [sorted(c for t in ts for c in captions_of_text[t]) for ts in texts_of_image]
    t2i = [sorted(images_of_text[t]) for t in ids.tolist()]
    return padded(i2t), padded(t2i)


def padded(rows: list[list[int]]) -> np.ndarray:
    out = np.full((len(rows), max(map(len, rows), default=1) or 1), -1, np.int64)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def duplicate_counts(owner: np.ndarray, texts: list[str]) -> dict[str, int]:
    """Captions whose text (case and white space ignored) another image also has, and the images with such a caption;
    and captions repeated within their own image."""
    ids = text_ids(texts)
    images_of = {}
    for i, t in zip(owner.tolist(), ids.tolist()):
        images_of.setdefault(t, set()).add(i)
    shared = np.array([len(images_of[t]) > 1 for t in ids.tolist()], bool)
    within = len(ids) - len(set(zip(owner.tolist(), ids.tolist())))
    return {"captions_shared_with_other_images": int(shared.sum()),
            "images_with_shared_captions": len({int(i) for i in owner[shared]}),
            "captions_repeated_within_image": int(within)}


# ---------------------------------------------------------------------------------------------------------------------
# The analysis


def check_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    out = {**DEFAULTS, **cfg}
    unknown = sorted(set(out) - set(DEFAULTS))
    if unknown:
        raise ParamsError(f"params.yaml: unknown retrieval key(s) {unknown}; known: {', '.join(DEFAULTS)}")
    for key, known in (("ties", TIES), ("duplicates", DUPLICATES)):
        if out[key] not in known:
            raise ParamsError(f"params.yaml: retrieval.{key} {out[key]!r} is not one of {list(known)}")
    ks = out["recall_at"]
    if not isinstance(ks, list) or not ks or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1
                                                     for k in ks):
        raise ParamsError(f"params.yaml: retrieval.recall_at must be a non-empty list of integers >= 1; got {ks!r}")
    if not isinstance(out["dataset_text_sets"], Mapping):
        raise ParamsError(f"params.yaml: retrieval.dataset_text_sets must map dataset -> text set; got "
                          f"{out['dataset_text_sets']!r}")
    return out


def text_set_for(cfg: Mapping[str, Any], dataset: str) -> str:
    return cfg["dataset_text_sets"].get(dataset, cfg["text_set"])


def load_captions(inputs, name: str):
    path = inputs.texts_dir / f"{name}.parquet"
    if not path.is_file():
        raise RetrievalError(f"{path}: text set {name!r} missing for dataset {inputs.meta.name!r}; `captions_prompted` "
                             f"is made by the entry's texts.caption_prompt (the CLIP paper's 'a photo of {{c}}'), "
                             f"`captions` from the prepared captions; pick one with retrieval.text_set or "
                             f"retrieval.dataset_text_sets")
    found = inputs.texts(name)
    if "sample_id" not in found.table.column_names:
        raise RetrievalError(f"{path}: text set {name!r} is not owned by sample_id; retrieval needs captions")
    return found


def check_coverage(path, image_ids: list[str], owner: np.ndarray) -> None:
    without = sorted(set(range(len(image_ids))) - set(owner[owner >= 0].tolist()))
    if without:
        shown = ", ".join(repr(image_ids[i]) for i in without[:10])
        raise RetrievalError(f"{path}: {len(without)} image(s) of the split have no caption, e.g. sample {shown}; "
                             f"every retrieval image needs at least one")


def run(inputs, cfg, seed: int):
    """The retrieval analysis of one dataset (module docstring)."""
    cfg = check_config(cfg)
    name = text_set_for(cfg, inputs.meta.name)
    if cfg["split"] not in inputs.meta.splits:
        raise ParamsError(f"params.yaml: retrieval.split {cfg['split']!r} is not a split of dataset "
                          f"{inputs.meta.name!r} ({', '.join(inputs.meta.splits)})")
    images = inputs.images(cfg["split"])
    captions = load_captions(inputs, name)
    image_ids = images.table.column("sample_id").to_pylist()
    owner_all = caption_owners(captions.table.column("sample_id").to_pylist(), image_ids)
    check_coverage(inputs.texts_dir / f"{name}.parquet", image_ids, owner_all)
    keep = np.flatnonzero(owner_all >= 0)  # captions of other splits' images are not in this gallery
    all_texts = captions.table.column("text").to_pylist()
    owner, texts = owner_all[keep], [all_texts[i] for i in keep]
    if images.embeddings.shape[1] != captions.embeddings.shape[1]:
        raise RetrievalError(f"{inputs.features_dir / 'text' / (name + '.parquet')}: text features have "
                             f"{captions.embeddings.shape[1]} dimensions, the {cfg['split']} image features "
                             f"{images.embeddings.shape[1]}; embed both with the same model")
    x, t = l2_normalize(images.embeddings), l2_normalize(captions.embeddings[keep])
    i2t_pos, t2i_pos = positive_sets(owner, texts, len(image_ids), cfg["duplicates"])
    i2t, i2t_tied = first_positive_ranks(x, t, i2t_pos, cfg["ties"])
    t2i, t2i_tied = first_positive_ranks(t, x, t2i_pos, cfg["ties"])
    ranks = {"i2t": i2t, "t2i": t2i}
    metrics = {f"{d}_r{k}": recall_at(ranks[d], k) for d in DIRECTIONS for k in cfg["recall_at"]}
    stamp = read_text_set(inputs.texts_dir / f"{name}.parquet")[1]
    per_image = Counter(np.bincount(owner, minlength=len(image_ids)).tolist())
    return Result(
        metrics,
        counts={"images": len(image_ids), "captions": len(keep), "captions_other_splits": int(len(owner_all) - len(keep)),
                "i2t_tied_queries": int(i2t_tied.sum()), "t2i_tied_queries": int(t2i_tied.sum()),
                **duplicate_counts(owner, texts)},
        params={"split": cfg["split"], "text_set": name, "text_version": stamp.get("text_version"),
                "recall_at": list(cfg["recall_at"]),
                "ties": cfg["ties"], "duplicates": cfg["duplicates"], "score": "cosine"},
        details={"example_text": texts[0], "captions_per_image": {str(k): v for k, v in sorted(per_image.items())},
                 "median_rank": {d: float(np.median(ranks[d])) for d in DIRECTIONS},
                 "mean_rank": {d: float(np.mean(ranks[d])) for d in DIRECTIONS}},
        tables=rank_tables(image_ids, owner, keep, texts, i2t, i2t_tied, t2i, t2i_tied),
        intervals=intervals(ranks, owner, len(image_ids), cfg["recall_at"], seed),
    )


def intervals(ranks: dict[str, np.ndarray], owner: np.ndarray, n_images: int, ks: list[int], seed: int) -> dict:
    """Bootstrap over images: i2t one query per image; t2i an image's captions' hits over their number."""
    sizes = np.bincount(owner, minlength=n_images)
    out = {}
    for k in ks:
        out[f"i2t_r{k}"] = cluster_ratio_interval(ranks["i2t"] <= k, np.ones(n_images), seed=seed).to_json()
        hits = np.bincount(owner, weights=ranks["t2i"] <= k, minlength=n_images)
        out[f"t2i_r{k}"] = cluster_ratio_interval(hits, sizes, seed=seed).to_json()
    return out


def rank_tables(image_ids, owner, keep, texts, i2t, i2t_tied, t2i, t2i_tied) -> dict:
    """Per query: `i2t_ranks` (sample_id, captions, rank, tied) and `t2i_ranks` (caption_row: the row in the text set,
    sample_id: its image, text, rank, tied)."""
    return {
        "i2t_ranks": pa.table({"sample_id": pa.array(image_ids, pa.string()),
                               "captions": pa.array(np.bincount(owner, minlength=len(image_ids)), pa.int64()),
                               "rank": pa.array(i2t, pa.int64()), "tied": pa.array(i2t_tied, pa.bool_())}),
        "t2i_ranks": pa.table({"caption_row": pa.array(keep, pa.int64()),
                               "sample_id": pa.array([image_ids[i] for i in owner], pa.string()),
                               "text": pa.array(texts, pa.string()),
                               "rank": pa.array(t2i, pa.int64()), "tied": pa.array(t2i_tied, pa.bool_())}),
    }
