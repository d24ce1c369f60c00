"""The zero-shot classifier: class weights from text embeddings and the logits of images against them. What the
zero-shot analysis (`vlbench.analyses.zeroshot`, which computes the dataset metrics on these scores) shares with every
analysis that builds class weights from texts (granularity, robustness, retrieval, extensibility, adapt, fine-tuning);
it imports no analysis and computes no metric.

Class weights are the mean of the L2-normalised embeddings of a class's prompts, renormalised (prompt
ensembling; CLIP, Radford et al. 2021, Sec. 3.1.4); logits are 100 * cosine similarity, 100 being CLIP's learned,
clipped logit scale.

Knowledge variants (docs/protocols.md, "Knowledge variants in the pipeline"): `knowledge_variant` makes the class
weights of a knowledge text set as its stamp says (`normalized_mean`, or Menon & Vondrick's `mean_similarity`).
"""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_limits

from vlbench.errors import VlbenchError

LOGIT_SCALE = 100.0


class VariantError(VlbenchError, ValueError):
    """A knowledge set or a precomputed class-weight file that cannot be scored; the message names the file."""


def similarities(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(n, m) float32 products a @ b.T of the rows of `a` (n, d) and `b` (m, d), on one BLAS thread.

    OpenBLAS's sgemm rounds differently with one thread and with two (same inputs, same CPU), and a ranking metric
    turns such last-bit differences into other numbers wherever two scores (nearly) tie: the demo's hierarchy mAP of
    a knowledge variant moved at the fifth decimal between two runs (issue 25). With one thread the scores, and every
    number computed from them, are the same whatever the core count or OMP_NUM_THREADS / OPENBLAS_NUM_THREADS."""
    with threadpool_limits(limits=1, user_api="blas"):
        return np.asarray(a, dtype=np.float32) @ np.asarray(b, dtype=np.float32).T


def l2_normalize(x: np.ndarray, axis: int = -1) -> np.ndarray:
    norm = np.linalg.norm(x, axis=axis, keepdims=True)
    return x / np.maximum(norm, 1e-12)


def class_weights(text_embeddings: np.ndarray, class_index: np.ndarray, num_classes: int) -> np.ndarray:
    """(num_classes, d): per class, the renormalised mean of its normalised prompt embeddings."""
    class_index = np.asarray(class_index)
    missing = sorted(set(range(num_classes)) - set(class_index.tolist()))
    if missing:
        raise ValueError(f"no prompt embeddings for class indices {missing[:10]}")
    normed = l2_normalize(text_embeddings.astype(np.float64))
    sums = np.zeros((num_classes, normed.shape[1]))
    np.add.at(sums, class_index, normed)
    means = sums / np.bincount(class_index, minlength=num_classes)[:, None]
    return l2_normalize(means).astype(np.float32)


def mean_similarity_weights(text_embeddings: np.ndarray, class_index: np.ndarray, num_classes: int) -> np.ndarray:
    """(num_classes, d): per class the mean of its normalised text embeddings, *not* renormalised, so that a normalised
    image times it is the mean of its cosine similarities to the class's texts (Menon & Vondrick's class score)."""
    class_index = np.asarray(class_index)
    missing = sorted(set(range(num_classes)) - set(class_index.tolist()))
    if missing:
        raise ValueError(f"no text embeddings for class indices {missing[:10]}")
    sums = np.zeros((num_classes, text_embeddings.shape[1]))
    np.add.at(sums, class_index, l2_normalize(text_embeddings.astype(np.float64)))
    return (sums / np.bincount(class_index, minlength=num_classes)[:, None]).astype(np.float32)


WEIGHTINGS = {"normalized_mean": class_weights, "mean_similarity": mean_similarity_weights}


def zeroshot_logits(image_embeddings: np.ndarray, weights: np.ndarray, scale: float = LOGIT_SCALE) -> np.ndarray:
    if image_embeddings.shape[1] != weights.shape[1]:
        raise ValueError(f"image embeddings have dim {image_embeddings.shape[1]}, class weights {weights.shape[1]}")
    return similarities(scale * l2_normalize(image_embeddings.astype(np.float32)), weights)


def template_weights(text_table, text_emb: np.ndarray, num_classes: int) -> np.ndarray:
    """The class weights of the text set's template prompts (`class_weights`)."""
    templates = np.array([s == "template" for s in text_table.column("source").to_pylist()], dtype=bool)
    return class_weights(text_emb[templates], text_table.column("class_index").to_numpy()[templates], num_classes)


# ---------------------------------------------------------------------------------------------------- variants


def knowledge_variant(features, num_classes: int) -> tuple[np.ndarray, dict]:
    """(class weights, report entry) of one knowledge text set's features: every text of a class (templates x
    knowledge, or a fallback class's templates) weighted as its stamp's `knowledge.weights` says."""
    stamp = features.fingerprint.get("knowledge") or {}
    weighting = stamp.get("weights", "normalized_mean")
    if weighting not in WEIGHTINGS:
        raise VariantError(f"knowledge set {features.fingerprint.get('text_set')!r}: unknown weights {weighting!r} in "
                           f"its stamp; known: {', '.join(WEIGHTINGS)}")
    class_index = features.table.column("class_index").to_numpy()
    weights = WEIGHTINGS[weighting](features.embeddings, class_index, num_classes)
    entry = {"title": stamp.get("title"), "source": "knowledge", "text_set": features.fingerprint.get("text_set"),
             "text_version": features.fingerprint.get("text_version"), "weights": weighting,
             "texts": len(class_index), "coverage": stamp.get("coverage", {}),
             "template_only": stamp.get("template_only"), "files": stamp.get("files", []),
             "options": stamp.get("options", {})}
    return weights, entry
