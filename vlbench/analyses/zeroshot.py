"""The zero-shot classification analysis (CLIP, Radford et al. 2021, Sec. 3.1.4), on cached features: the class
prompts' weights scored against the test images as `zeroshot.scoring` says (`logits` or `elevater`; the shared
scoring is `vlbench.analyses.scoring`). See docs/protocols.md, "ELEVATER scoring".

Knowledge variants (docs/protocols.md, "Knowledge variants in the pipeline"): besides the templates (`prompts`, the
headline metrics), every variant present is scored the same way and reported in `details.variants` with its coverage
counts: each knowledge text set of features/<model>/<dataset>/knowledge/ (embed_knowledge), whose stamp says how its
texts make a class weight (`normalized_mean`, or Menon & Vondrick's `mean_similarity`), and each file of
`PRECOMPUTED_WEIGHTS` (class weights another stage computed, e.g. REPE). The metrics add the best of them on the
dataset's metric (`knowledge_best_<metric>`) and its name (`knowledge_best_variant`).

Multi-objective datasets (DataComp's FairFace and UTKFace, classes '<objective>:<class>'; vlbench/datasets/wds.py):
the same class weights and logits, each objective predicted by the argmax over its own classes (DataComp's
fairness_eval.py masks the others); the metrics are `accuracy` of the label objective (over its classes) and DataComp's
fairness numbers (vlbench.metrics.fairness_outcomes), each with a bootstrap interval; the predictions file adds each
objective's prediction (`predicted_<objective>`, an index among its classes) and the metadata columns. `scoring` does
not apply (an argmax of the logits, as DataComp), and knowledge variants are not scored on them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from vlbench import metrics as metric_fns
from vlbench.analyses.base import Result
from vlbench.analyses.scoring import (
    PRECOMPUTED_WEIGHTS,
    check_scoring,
    knowledge_variant,
    label_matrix,
    precomputed_variant,
    sample_groups,
    score_intervals,
    template_weights,
    weights_metrics,
    zeroshot_logits,
)
from vlbench.datasets.canonical import GROUP_COLUMN, OBJECTIVES_KEY, metadata_columns, objective_classes
from vlbench.features import embedding_array
from vlbench.stats import bootstrap_sample_metric, group_table_intervals

TEMPLATES_VARIANT = "templates"  # the variant name of the `prompts` text set (templates filled with class names)


def evaluate_zeroshot(image_table, image_emb: np.ndarray, text_table, text_emb: np.ndarray, meta,
                      scoring: str = "logits"):
    """Return (metrics dict, predictions table) for one split of one dataset; the metrics on the scores that
    `scoring` names (`metric_scores`), the predictions always with the logits (ELEVATER's probabilities are
    their row-wise softmax)."""
    weights = template_weights(text_table, text_emb, len(meta.classes))
    objectives = objective_classes(meta)
    if objectives:
        logits = zeroshot_logits(image_emb, weights)
        chosen = objective_predictions(logits, objectives)
        label_objective = meta.provenance[OBJECTIVES_KEY]["label"]
        predicted = np.asarray(objectives[label_objective])[chosen[label_objective]]
        results = {name: value for name, (outcome, groups) in objective_outcomes(image_table, meta, chosen).items()
                   for name, value in (metric_fns.fairness_table(name, outcome, groups) if groups is not None
                                       else {name: float(np.mean(outcome))}).items()}
    else:
        results, logits = weights_metrics(image_emb, weights, label_matrix(image_table, meta), meta, scoring,
                                          sample_groups(image_table))
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
    if GROUP_COLUMN in image_table.column_names:  # the per-sample file keeps what a group metric's interval needs
        predictions = predictions.append_column(GROUP_COLUMN, image_table.column(GROUP_COLUMN))
    for objective, found in (chosen.items() if objectives else ()):
        predictions = predictions.append_column(f"predicted_{objective}", pa.array(found, pa.int64()))
    for column in metadata_columns(meta) if objectives else ():
        predictions = predictions.append_column(column, image_table.column(column))
    return results, predictions


def objective_predictions(logits: np.ndarray, objectives) -> dict[str, np.ndarray]:
    """{objective: (n,) the argmax of the logits over its own classes, as an index among them} (ties to the lower
    class, as numpy's and torch's argmax; DataComp's fairness_eval.py sets the other classes' logits to -1e9)."""
    return {objective: logits[:, index].argmax(axis=1) for objective, index in objectives.items()}


def objective_outcomes(image_table, meta, chosen) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """{metric: (per-sample 0/1 outcome, per-sample group or None)}: `accuracy` of the label objective, then
    DataComp's fairness outcomes (vlbench.metrics.fairness_outcomes) from the metadata columns."""
    label_objective = meta.provenance[OBJECTIVES_KEY]["label"]
    fields = {c: image_table.column(c).to_numpy() for c in metadata_columns(meta)}
    return {"accuracy": (chosen[label_objective] == fields[label_objective], None),
            **metric_fns.fairness_outcomes(chosen, fields)}


def objective_intervals(image_table, meta, logits: np.ndarray, seed: int) -> dict[str, dict]:
    """The bootstrap interval of every metric `evaluate_zeroshot` reports for a multi-objective dataset."""
    out = {}
    chosen = objective_predictions(logits, objective_classes(meta))
    for name, (outcome, groups) in objective_outcomes(image_table, meta, chosen).items():
        if groups is None:
            out[name] = bootstrap_sample_metric("accuracy", outcome, seed=seed).to_json()
        else:
            found = group_table_intervals(outcome, groups, name.startswith("acc_"), seed=seed)
            out.update({f"{name}_{key}": interval.to_json() for key, interval in found.items()})
    return out


def variant_weights(inputs) -> list[tuple[str, np.ndarray, dict]]:
    """Every variant besides the templates that is present for the dataset: knowledge sets (in the knowledge stage's
    order), then `PRECOMPUTED_WEIGHTS` files. Inputs without knowledge support (a hand-made stand-in) give none."""
    if not hasattr(inputs, "knowledge_sets"):
        return []
    n = len(inputs.meta.classes)
    sets = [(name, inputs.knowledge(name)) for name in inputs.knowledge_sets()]
    sets.sort(key=lambda s: ((s[1].fingerprint.get("knowledge") or {}).get("order", len(sets)), s[0]))
    found = [(name, *knowledge_variant(features, n)) for name, features in sets]
    for name, path in PRECOMPUTED_WEIGHTS.items():
        if inputs.has_features(path):
            where = str(inputs.features_dir / path)
            found.append((name, *precomputed_variant(inputs.precomputed(path), n, path, where)))
    return found


def score_variants(image_emb: np.ndarray, labels: np.ndarray, meta, scoring: str, baseline: dict, variants: list,
                   groups: np.ndarray | None = None) -> tuple[dict[str, dict], dict[str, float | str]]:
    """({variant: report entry with its metrics}, the headline additions: the best non-template variant on the
    dataset's metric, `knowledge_best_<metric>`, and its name, `knowledge_best_variant`; ties go to the first)."""
    report = {TEMPLATES_VARIANT: {"source": "templates", "text_set": "prompts", "metrics": baseline}}
    for name, weights, entry in variants:
        report[name] = {**entry, "metrics": weights_metrics(image_emb, weights, labels, meta, scoring, groups)[0]}
    scored = [name for name in report if name != TEMPLATES_VARIANT]
    if not scored:
        return report, {}
    best = max(scored, key=lambda name: (report[name]["metrics"][meta.metric], -scored.index(name)))
    return report, {f"knowledge_best_{meta.metric}": report[best]["metrics"][meta.metric], "knowledge_best_variant": best}


def run(inputs, cfg, seed: int):
    """The zeroshot analysis: the `cfg['split']` images against the class prompts (text set `prompts`), scored as
    `cfg['scoring']` says (default `logits`); then every knowledge or precomputed variant present (`variant_weights`)."""
    scoring = check_scoring(cfg.get("scoring", "logits"))
    images, texts = inputs.images(cfg["split"]), inputs.texts("prompts")
    metrics, predictions = evaluate_zeroshot(images.table, images.embeddings, texts.table, texts.embeddings,
                                             inputs.meta, scoring)
    labels, groups = label_matrix(images.table, inputs.meta), sample_groups(images.table)
    objectives = bool(objective_classes(inputs.meta))
    found = [] if objectives else variant_weights(inputs)
    variants, best = score_variants(images.embeddings, labels, inputs.meta, scoring, dict(metrics), found, groups)
    weights = template_weights(texts.table, texts.embeddings, len(inputs.meta.classes))
    if objectives:
        intervals = objective_intervals(images.table, inputs.meta, zeroshot_logits(images.embeddings, weights), seed)
    else:
        intervals = score_intervals(images.embeddings, weights, labels, {k: k for k in metrics}, scoring, seed, groups)
    if best:  # the best variant's headline number, on its own class weights
        weights = next(w for name, w, _ in found if name == best["knowledge_best_variant"])
        intervals.update(score_intervals(images.embeddings, weights, labels,
                                         {f"knowledge_best_{inputs.meta.metric}": inputs.meta.metric}, scoring, seed,
                                         groups))
    prompts_per_class = texts.table.num_rows / max(len(inputs.meta.classes), 1)
    return Result({**metrics, **best}, counts={"samples": images.table.num_rows, "classes": len(inputs.meta.classes),
                                               "prompts": texts.table.num_rows},
                  params={"split": cfg["split"], "scoring": scoring, "text_set": "prompts",
                          "prompts_per_class": prompts_per_class},
                  tables={"predictions": predictions},
                  details={"variants": variants} if len(variants) > 1 else {}, intervals=intervals)
