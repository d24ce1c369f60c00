"""Zero-shot classification from cached features (CLIP, Radford et al. 2021, Sec. 3.1.4).

Class weights are the mean of the L2-normalised embeddings of a class's prompts, renormalised (prompt
ensembling); logits are 100 * cosine similarity, 100 being CLIP's learned, clipped logit scale.

`zeroshot.scoring` picks the scores the metric is computed on: `logits` (the default) or `elevater`, ELEVATER's
toolkit (`vision_benchmark/evaluation/clip_zeroshot_evaluator.py`): softmax over classes of 100 * cosine, in
float32, with its metric conventions (`vlbench.metrics.CONVENTIONS`). See docs/protocols.md, "ELEVATER scoring".
"""

from __future__ import annotations

import numpy as np

from vlbench.config import ParamsError

LOGIT_SCALE = 100.0
ELEVATER_LOGIT_SCALE = 100.0  # the toolkit's fixed `100. * image @ text` before its softmax (not a model's own scale)
SCORINGS = ("logits", "elevater")


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


def zeroshot_logits(image_embeddings: np.ndarray, weights: np.ndarray, scale: float = LOGIT_SCALE) -> np.ndarray:
    if image_embeddings.shape[1] != weights.shape[1]:
        raise ValueError(f"image embeddings have dim {image_embeddings.shape[1]}, class weights {weights.shape[1]}")
    return (scale * l2_normalize(image_embeddings.astype(np.float32)) @ weights.T).astype(np.float32)


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
    from vlbench.metrics import multilabel_indicator

    if meta.multi_label:
        return multilabel_indicator(table.column(meta.label_column).to_pylist(), len(meta.classes))
    return table.column(meta.label_column).to_numpy()


def evaluate_zeroshot(image_table, image_emb: np.ndarray, text_table, text_emb: np.ndarray, meta,
                      scoring: str = "logits"):
    """Return (metrics dict, predictions table) for one split of one dataset; the metrics on the scores that
    `scoring` names (`metric_scores`), the predictions always with the logits (ELEVATER's probabilities are
    their row-wise softmax)."""
    import pyarrow as pa

    from vlbench import metrics
    from vlbench.features import embedding_array

    templates = np.array([s == "template" for s in text_table.column("source").to_pylist()])
    weights = class_weights(text_emb[templates], text_table.column("class_index").to_numpy()[templates], len(meta.classes))
    scores, convention = metric_scores(image_emb, weights, scoring)
    logits = scores if scoring == "logits" else zeroshot_logits(image_emb, weights)
    labels = label_matrix(image_table, meta)
    results = {meta.metric: metrics.compute(meta.metric, scores, labels, convention)}
    if not meta.multi_label and meta.metric != "accuracy":
        results["accuracy"] = metrics.compute("accuracy", scores, labels, convention)
    predicted = logits.argmax(axis=1)
    names = np.array(meta.class_names)
    predictions = pa.table({
        "sample_id": image_table.column("sample_id"),
        meta.label_column: image_table.column(meta.label_column),
        "predicted": pa.array(predicted, pa.int64()),
        "predicted_name": pa.array(names[predicted].tolist(), pa.string()),
        "predicted_logit": pa.array(logits[np.arange(len(logits)), predicted], pa.float32()),
        "logits": embedding_array(logits),
    })
    return {k: float(v) for k, v in results.items()}, predictions


def run(inputs, cfg, seed: int):
    """The zeroshot analysis: the `cfg['split']` images against the class prompts (text set `prompts`), scored as
    `cfg['scoring']` says (default `logits`)."""
    from vlbench.analyses.base import Result

    scoring = check_scoring(cfg.get("scoring", "logits"))
    images, texts = inputs.images(cfg["split"]), inputs.texts("prompts")
    metrics, predictions = evaluate_zeroshot(images.table, images.embeddings, texts.table, texts.embeddings,
                                             inputs.meta, scoring)
    prompts_per_class = texts.table.num_rows / max(len(inputs.meta.classes), 1)
    return Result(metrics, counts={"samples": images.table.num_rows, "classes": len(inputs.meta.classes),
                                   "prompts": texts.table.num_rows},
                  params={"split": cfg["split"], "scoring": scoring, "text_set": "prompts",
                          "prompts_per_class": prompts_per_class},
                  tables={"predictions": predictions})
