"""The zero-shot classification analysis (CLIP, Radford et al. 2021, Sec. 3.1.4), on cached features: the class
prompts' weights (the zero-shot classifier, `vlbench.analyses.zeroshot_classifier`, which this module imports and
which imports nothing from here) scored against the test images, and the dataset metrics on those scores.

`zeroshot.scoring` picks the scores the metric is computed on: `logits` (the default) or `elevater`, ELEVATER's
toolkit (`vision_benchmark/evaluation/clip_zeroshot_evaluator.py`): softmax over classes of 100 * cosine, in
float32, with its metric conventions (`vlbench.metrics.CONVENTIONS`). See docs/protocols.md, "ELEVATER scoring".

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

WinoGAViL (metric `winogavil_jaccard`, vlbench/datasets/winogavil.py: one class per instance, whose prompt is the cue,
one image row per candidate with its `association`): `evaluate_winogavil` scores each candidate image against its own
instance's prompt only and computes DataComp's Jaccard per instance (docs/protocols.md, "WinoGAViL").
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from vlbench import metrics as metric_fns
from vlbench.analyses.base import Result
from vlbench.analyses.zeroshot_classifier import (
    LOGIT_SCALE,
    VariantError,
    knowledge_variant,
    l2_normalize,
    template_weights,
    zeroshot_logits,
)
from vlbench.params import ParamsError
from vlbench.datasets.canonical import (
    ASSOCIATION_COLUMN,
    GROUP_COLUMN,
    OBJECTIVES_KEY,
    metadata_columns,
    objective_classes,
)
from vlbench.errors import VlbenchError
from vlbench.features import embedding_array
from vlbench.stats import bootstrap_sample_metric, cluster_ratio_interval, group_table_intervals, metric_interval

TEMPLATES_VARIANT = "templates"  # the variant name of the `prompts` text set (templates filled with class names)
WINOGAVIL = "winogavil_jaccard"
WINOGAVIL_MIN_CANDIDATES = 10  # DataComp's main metric: the instances with 10 or 12 candidates
ELEVATER_LOGIT_SCALE = 100.0  # the toolkit's fixed `100. * image @ text` before its softmax (not a model's own scale)
SCORINGS = ("logits", "elevater")
# Variants whose class weights another stage computes: name -> file under features/<model>/<dataset>/, a features file
# with one row per class (`class_index`, its weight as `embedding`) and the model's fingerprint; scored where present.
PRECOMPUTED_WEIGHTS = {"repe": "retrieval/class_weights.parquet"}


class ZeroshotError(VlbenchError):
    """The zero-shot analysis cannot run on these features; the message names the dataset and what is missing."""


# ------------------------------------------------------------------------------------------------- the dataset metric


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
        return metric_fns.multilabel_indicator(table.column(meta.label_column).to_pylist(), len(meta.classes))
    return table.column(meta.label_column).to_numpy()


def weights_metrics(image_emb: np.ndarray, weights: np.ndarray, labels: np.ndarray, meta,
                    scoring: str = "logits", groups: np.ndarray | None = None) -> tuple[dict[str, float], np.ndarray]:
    """(metrics, logits) of one set of class weights: the dataset's metric on the scores `scoring` names (a group
    metric over `groups`, the features' `group` column), plus top-1 accuracy for a single-label dataset whose metric
    is another."""
    scores, convention = metric_scores(image_emb, weights, scoring)
    logits = scores if scoring == "logits" else zeroshot_logits(image_emb, weights)
    results = {meta.metric: metric_fns.compute(meta.metric, scores, labels, convention, groups)}
    if not meta.multi_label and meta.metric != "accuracy":
        results["accuracy"] = metric_fns.compute("accuracy", scores, labels, convention)
    return {k: float(v) for k, v in results.items()}, logits


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


def identical_prompts(text_table, num_classes: int) -> list[list[int]]:
    """Groups (lowest index first) of the classes whose prompts are the same texts in the same order: their class
    weights are the same vector, so every image scores them exactly alike (e.g. CLIP_benchmark's ImageNet names
    repeat "missile" and "sunglasses")."""
    texts: dict[int, list[str]] = {c: [] for c in range(num_classes)}
    for owner, text in zip(text_table.column("class_index").to_pylist(), text_table.column("text").to_pylist()):
        texts[owner].append(text)
    groups: dict[tuple[str, ...], list[int]] = {}
    for c, found in texts.items():
        groups.setdefault(tuple(found), []).append(c)
    return [g for g in groups.values() if len(g) > 1]


def tie_report(logits: np.ndarray, labels: np.ndarray, groups: list[list[int]], names: list[str]) -> dict:
    """What classes with identical prompts do to top-1 (docs/protocols.md, "Ties"): `tied_top1`, the images whose
    highest logit several classes share exactly; `decided_by_tie`, those whose label is among them, whose hit depends
    on the convention: vlbench predicts the lowest index (numpy's argmax), DataComp's acc1 takes torch.topk's order,
    which is unspecified for ties."""
    top = logits.max(axis=1, keepdims=True)
    at_top = logits == top
    tied = at_top.sum(axis=1) > 1
    decided = tied & at_top[np.arange(len(labels)), labels]
    return {"identical_prompts": [[names[c] for c in g] for g in groups], "tied_top1": int(tied.sum()),
            "decided_by_tie": int(decided.sum()), "convention": "lowest class index"}


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


def precomputed_variant(features, num_classes: int, path: str, where: str | None = None) -> tuple[np.ndarray, dict]:
    """(class weights, report entry) of a precomputed class-weight file (`path` under the dataset's features folder,
    `where` the full path for messages): one row per class (`class_index`), its weight as the embedding (scored as it
    is); a boolean `fallback` column is counted."""
    index = features.table.column("class_index").to_numpy()
    if sorted(index.tolist()) != list(range(num_classes)):
        raise VariantError(f"{where or path}: class weights must have one row per class 0..{num_classes - 1}, got "
                           f"{len(index)} rows")
    weights = np.empty((num_classes, features.embeddings.shape[1]), np.float32)
    weights[index] = features.embeddings
    entry = {"source": "precomputed", "file": path, "text_version": features.fingerprint.get("text_version")}
    if "fallback" in features.table.column_names:
        entry["fallback"] = int(sum(bool(x) for x in features.table.column("fallback").to_pylist()))
    return weights, entry


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
    if inputs.meta.metric == WINOGAVIL:
        return winogavil_result(images, texts, inputs.meta, cfg["split"], seed)
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
    details = {"variants": variants} if len(variants) > 1 else {}
    tied = identical_prompts(texts.table, len(inputs.meta.classes))
    if tied and not objectives and labels.ndim == 1:  # reported only where classes share their prompts
        logits = zeroshot_logits(images.embeddings, template_weights(texts.table, texts.embeddings,
                                                                     len(inputs.meta.classes)))
        details["ties"] = tie_report(logits, labels, tied, inputs.meta.class_names)
    return Result({**metrics, **best}, counts={"samples": images.table.num_rows, "classes": len(inputs.meta.classes),
                                               "prompts": texts.table.num_rows},
                  params={"split": cfg["split"], "scoring": scoring, "text_set": "prompts",
                          "prompts_per_class": prompts_per_class},
                  tables={"predictions": predictions}, details=details, intervals=intervals)


# ---------------------------------------------------------------------------------------------------------- WinoGAViL


def evaluate_winogavil(image_table, image_emb: np.ndarray, text_table, text_emb: np.ndarray, meta
                       ) -> tuple[float, pa.Table]:
    """(DataComp's `jaccard_score_10-12`, the per-instance table) of WinoGAViL's candidate images: each image scored
    by 100 x the cosine of its features with its own instance's prompt weight (`template_weights`: the one prompt,
    normalised), in float64; per instance `metrics.winogavil_case` picks as many of the highest-scored candidates as
    it has associations and scores the Jaccard index; the headline is `metrics.winogavil_jaccard` of the instances.

    The table (reports/zeroshot/<dataset>.predictions.parquet) has one row per instance: sample_id (the instance,
    the prefix of its candidates' ids), label, cue, prompt, candidates, associations (how many), counted (10 or more
    candidates: in the headline), counts_in (`winogavil_jaccard` where counted, else ""), jaccard, and per candidate
    in order: candidate_ids, scores, association, picked."""
    if ASSOCIATION_COLUMN not in image_table.column_names:
        raise ZeroshotError(f"dataset {meta.name!r}: the image features have no {ASSOCIATION_COLUMN!r} column, which "
                            f"WinoGAViL's Jaccard needs; re-run prepare and embed_images with this vlbench")
    labels = image_table.column("label").to_numpy()
    weights = template_weights(text_table, text_emb, len(meta.classes)).astype(np.float64)
    scores = LOGIT_SCALE * np.einsum("ij,ij->i", l2_normalize(image_emb.astype(np.float64)), weights[labels])
    truth = np.asarray(image_table.column(ASSOCIATION_COLUMN).to_pylist(), bool)
    ids = np.asarray(image_table.column("sample_id").to_pylist(), dtype=object)
    instances, starts = np.unique(labels, return_index=True)
    rows = [np.flatnonzero(labels == i) for i in instances[np.argsort(starts)]]
    cases = [(scores[r], truth[r]) for r in rows]
    picks = [metric_fns.winogavil_case(s, t, f"dataset {meta.name!r} instance {meta.classes[labels[r[0]]].key!r}")
             for r, (s, t) in zip(rows, cases)]
    headline = metric_fns.winogavil_jaccard(cases, WINOGAVIL_MIN_CANDIDATES)
    table = pa.table({
        "sample_id": pa.array([ids[r[0]].split("/")[0] for r in rows], pa.string()),
        "label": pa.array([int(labels[r[0]]) for r in rows], pa.int64()),
        "cue": pa.array([meta.classes[labels[r[0]]].key for r in rows], pa.string()),
        "prompt": pa.array([meta.classes[labels[r[0]]].name for r in rows], pa.string()),
        "candidates": pa.array([r.size for r in rows], pa.int64()),
        "associations": pa.array([int(truth[r].sum()) for r in rows], pa.int64()),
        "counted": pa.array([r.size >= WINOGAVIL_MIN_CANDIDATES for r in rows], pa.bool_()),
        # the metric an instance counts in, for `vlbench compare` to pair it (the analyses table's `select`)
        "counts_in": pa.array([WINOGAVIL if r.size >= WINOGAVIL_MIN_CANDIDATES else "" for r in rows], pa.string()),
        "jaccard": pa.array([j for _, j in picks], pa.float64()),
        "candidate_ids": pa.array([ids[r].tolist() for r in rows], pa.list_(pa.string())),
        "scores": pa.array([scores[r].tolist() for r in rows], pa.list_(pa.float64())),
        "association": pa.array([truth[r].tolist() for r in rows], pa.list_(pa.bool_())),
        "picked": pa.array([p.tolist() for p, _ in picks], pa.list_(pa.bool_())),
    })
    return headline, table


def winogavil_breakdown(table: pa.Table) -> dict[str, float]:
    """DataComp's other WinoGAViL numbers (wino_eval.py): the mean Jaccard over all instances and by candidate count
    (5, 6, 10, 12, 5-6, 10-12), each only where the count has an instance."""
    jaccard, n = (table.column(c).to_numpy() for c in ("jaccard", "candidates"))
    masks = {"avg_jaccard_score": n > 0, **{f"jaccard_score_{k}": n == k for k in (5, 6, 10, 12)},
             "jaccard_score_5-6": n <= 6, "jaccard_score_10-12": n >= WINOGAVIL_MIN_CANDIDATES}
    return {key: float(jaccard[m].mean()) for key, m in masks.items() if m.any()}


def winogavil_result(images, texts, meta, split: str, seed: int):
    """The zero-shot result of WinoGAViL: `winogavil_jaccard` with a bootstrap interval over the counted instances
    (each instance one unit: its Jaccard), the per-instance table, DataComp's breakdown in `details`."""
    headline, table = evaluate_winogavil(images.table, images.embeddings, texts.table, texts.embeddings, meta)
    counted = table.column("counted").to_numpy(zero_copy_only=False)
    jaccard = table.column("jaccard").to_numpy()[counted]
    interval = cluster_ratio_interval(jaccard, np.ones(jaccard.size), seed=seed).to_json()
    return Result({WINOGAVIL: headline},
                  counts={"samples": images.table.num_rows, "instances": table.num_rows, "counted": int(counted.sum()),
                          "prompts": texts.table.num_rows},
                  params={"split": split, "text_set": "prompts", "score": "100 x cosine",
                          "min_candidates": WINOGAVIL_MIN_CANDIDATES, "ties": "stable: the later candidate"},
                  tables={"predictions": table}, details={"datacomp": winogavil_breakdown(table)},
                  intervals={WINOGAVIL: interval})
