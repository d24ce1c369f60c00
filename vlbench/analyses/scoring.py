"""Scoring images against class weights from cached features: what the zero-shot analysis and every analysis that
builds class weights from texts share (granularity, robustness, retrieval, extensibility, adapt, fine-tuning).

Class weights are the mean of the L2-normalised embeddings of a class's prompts, renormalised (prompt
ensembling; CLIP, Radford et al. 2021, Sec. 3.1.4); logits are 100 * cosine similarity, 100 being CLIP's learned,
clipped logit scale.

`zeroshot.scoring` picks the scores the metric is computed on: `logits` (the default) or `elevater`, ELEVATER's
toolkit (`vision_benchmark/evaluation/clip_zeroshot_evaluator.py`): softmax over classes of 100 * cosine, in
float32, with its metric conventions (`vlbench.metrics.CONVENTIONS`). See docs/protocols.md, "ELEVATER scoring".

Knowledge variants (docs/protocols.md, "Knowledge variants in the pipeline"): `knowledge_variant` makes the class
weights of a knowledge text set as its stamp says (`normalized_mean`, or Menon & Vondrick's `mean_similarity`),
`precomputed_variant` reads those of a `PRECOMPUTED_WEIGHTS` file (class weights another stage computed, e.g. REPE).
"""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_limits

from vlbench import metrics
from vlbench.config import ParamsError
from vlbench.datasets.canonical import GROUP_COLUMN
from vlbench.errors import VlbenchError
from vlbench.stats import metric_interval

LOGIT_SCALE = 100.0
KNOWLEDGE_FEATURES = "knowledge"  # features/<model>/<dataset>/knowledge/<variant>.parquet (stage embed_knowledge)
# Variants whose class weights another stage computes: name -> file under features/<model>/<dataset>/, a features file
# with one row per class (`class_index`, its weight as `embedding`) and the model's fingerprint; scored where present.
PRECOMPUTED_WEIGHTS = {"repe": "retrieval/class_weights.parquet"}


class VariantError(VlbenchError, ValueError):
    """A knowledge set or a precomputed class-weight file that cannot be scored; the message names the file."""


ELEVATER_LOGIT_SCALE = 100.0  # the toolkit's fixed `100. * image @ text` before its softmax (not a model's own scale)
SCORINGS = ("logits", "elevater")


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


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float32 (the max subtracted first, as torch does): probabilities that round to 1.0
    tie, as they do in ELEVATER's toolkit."""
    x = np.asarray(logits, dtype=np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def check_scoring(scoring: str) -> str:
    if scoring not in SCORINGS:
        raise ParamsError(f"params.yaml: zeroshot.scoring {scoring!r} is not one of {list(SCORINGS)}")
    return scoring


def metric_scores(image_embeddings: np.ndarray, weights: np.ndarray, scoring: str) -> tuple[np.ndarray, str]:
    """(the scores the dataset metric is computed on, the `vlbench.metrics` convention to compute it with).

    `logits`: 100 * cosine, default conventions. `elevater`: softmax(100 * cosine) in float32 and ELEVATER's
    conventions (11-point AP with precision 1 at recall 0, ROC-AUC on the probability of class 1)."""
    if check_scoring(scoring) == "elevater":
        return softmax(zeroshot_logits(image_embeddings, weights, ELEVATER_LOGIT_SCALE)), "elevater"
    return zeroshot_logits(image_embeddings, weights), "default"


def label_matrix(table, meta) -> np.ndarray:
    """Labels as metrics expect them: int array (single-label) or (n, C) 0/1 array (multi-label)."""
    if meta.multi_label:
        return metrics.multilabel_indicator(table.column(meta.label_column).to_pylist(), len(meta.classes))
    return table.column(meta.label_column).to_numpy()


def weights_metrics(image_emb: np.ndarray, weights: np.ndarray, labels: np.ndarray, meta,
                    scoring: str = "logits", groups: np.ndarray | None = None) -> tuple[dict[str, float], np.ndarray]:
    """(metrics, logits) of one set of class weights: the dataset's metric on the scores `scoring` names (a group
    metric over `groups`, the features' `group` column), plus top-1 accuracy for a single-label dataset whose metric
    is another."""
    scores, convention = metric_scores(image_emb, weights, scoring)
    logits = scores if scoring == "logits" else zeroshot_logits(image_emb, weights)
    results = {meta.metric: metrics.compute(meta.metric, scores, labels, convention, groups)}
    if not meta.multi_label and meta.metric != "accuracy":
        results["accuracy"] = metrics.compute("accuracy", scores, labels, convention)
    return {k: float(v) for k, v in results.items()}, logits


def template_weights(text_table, text_emb: np.ndarray, num_classes: int) -> np.ndarray:
    """The class weights of the text set's template prompts (`class_weights`)."""
    templates = np.array([s == "template" for s in text_table.column("source").to_pylist()])
    return class_weights(text_emb[templates], text_table.column("class_index").to_numpy()[templates], num_classes)


def score_intervals(image_emb: np.ndarray, weights: np.ndarray, labels: np.ndarray, keys: dict[str, str],
                    scoring: str, seed: int, groups: np.ndarray | None = None) -> dict[str, dict]:
    """{metric key: bootstrap interval over the test samples} of one set of class weights, for each key of `keys`
    ({key: the `vlbench.metrics` name it is}), on the scores `scoring` names (vlbench.stats.metric_interval)."""
    scores, convention = metric_scores(image_emb, weights, scoring)
    return {key: metric_interval(name, scores, labels, convention, seed=seed, groups=groups).to_json()
            for key, name in keys.items()}


def sample_groups(image_table) -> np.ndarray | None:
    """The features' per-sample `group` (region, income bucket), where the prepared data has one."""
    if GROUP_COLUMN not in image_table.column_names:
        return None
    return np.asarray(image_table.column(GROUP_COLUMN).to_pylist(), dtype=object)


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


def precomputed_variant(features, num_classes: int, path: str, where: str | None = None) -> tuple[np.ndarray, dict]:
    """(class weights, report entry) of a precomputed class-weight file (`path` under the dataset's features folder,
    `where` the full path for messages): one row per class (`class_index`), its weight as the embedding (scored as it
    is); a boolean `fallback` column is counted."""
    index = features.table.column("class_index").to_numpy()
    if sorted(index.tolist()) != list(range(num_classes)):
        raise VariantError(f"{where or path}: class weights must have one row per class 0..{num_classes - 1}, got {len(index)} "
                           f"rows")
    weights = np.empty((num_classes, features.embeddings.shape[1]), np.float32)
    weights[index] = features.embeddings
    entry = {"source": "precomputed", "file": path, "text_version": features.fingerprint.get("text_version")}
    if "fallback" in features.table.column_names:
        entry["fallback"] = int(sum(bool(x) for x in features.table.column("fallback").to_pylist()))
    return weights, entry
