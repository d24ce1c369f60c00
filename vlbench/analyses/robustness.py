"""Robustness to natural distribution shifts and effective robustness (Taori et al. 2020; CLIP, Radford et al. 2021,
Sec. 3.3), from cached features. docs/protocols.md "Robustness" lists every rule and its source.

A shift dataset (ImageNetV2, ImageNet-Sketch, ImageNet-R, ImageNet-A, ObjectNet; the demo's `shapes_outline`) is scored
with the class text features of its in-distribution dataset (`robustness.reference`, imagenet-1k: the very features
zeroshot@imagenet-1k scores, nothing embedded again), restricted to the classes the shift's authors keep: each shift
class stands for one or more reference classes (`reference_targets`: the prepared shift's provenance
`imagenet_classes`, else its classes' wnids); the logits are taken over the union of those classes only (ImageNet-R/A:
their 200; ObjectNet: the 313 ImageNet classes of its 113 classes) and a prediction is right when it is one of the
image's class's reference classes (ObjectNet: the prediction mapped back to ObjectNet's class).

Effective robustness: a reference line logit(y) = slope * logit(x) + intercept (`robustness.lines`: per shift, a key of
robustness_lines.json) predicts the shift accuracy from the reference accuracy x (zeroshot@<reference>'s `accuracy`);
the result reports the shift accuracy, x, the line's prediction and their difference.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa

from vlbench.analyses.base import Inputs, Result
from vlbench.analyses.zeroshot_classifier import template_weights, zeroshot_logits
from vlbench.datasets.canonical import load_meta
from vlbench.errors import VlbenchError
from vlbench.paths import prepared_dir
from vlbench.results import read_result
from vlbench.stats import bootstrap_sample_metric

LINES_FILE = Path(__file__).with_name("robustness_lines.json")
TEXT_SET = "prompts"


class RobustnessError(VlbenchError):
    """A shift that cannot be scored against its reference (unmapped class, missing line); the message names it."""


# ------------------------------------------------------------------------------------------------ the line


def logit(p):
    p = np.asarray(p, dtype=np.float64)
    return np.log(p) - np.log1p(-p)


def expit(z):
    return 1.0 / (1.0 + np.exp(-np.asarray(z, dtype=np.float64)))


def line_prediction(x: float, slope: float, intercept: float) -> float:
    """The shift accuracy the line predicts at reference accuracy x."""
    return float(expit(slope * logit(x) + intercept))


def effective_robustness(x: float, y: float, line: Mapping[str, float]) -> dict[str, float]:
    predicted = line_prediction(x, line["slope"], line["intercept"])
    return {"line_prediction": predicted, "effective_robustness": float(y - predicted)}


def reference_lines(path: Path = LINES_FILE) -> dict[str, dict]:
    return json.loads(Path(path).read_text())["lines"]


def line_for(dataset: str, cfg: Mapping) -> tuple[str, dict]:
    key = (cfg.get("lines") or {}).get(dataset)
    lines = reference_lines()
    if key not in lines:
        raise RobustnessError(f"params.yaml: robustness.lines.{dataset} is {key!r}; name one of {sorted(lines)} "
                              f"({LINES_FILE.name})")
    return key, lines[key]


# ------------------------------------------------------------------------------------------------ scoring


def reference_targets(shift_meta, reference_meta) -> list[list[int]]:
    """Per shift class, the reference classes it stands for: the shift's `provenance.imagenet_classes` where its
    source wrote one, else the reference class with the same wnid."""
    given = shift_meta.provenance.get("imagenet_classes")
    n = len(reference_meta.classes)
    if given is not None:
        if len(given) != len(shift_meta.classes) or any(not 0 <= i < n for t in given for i in t):
            raise RobustnessError(f"dataset {shift_meta.name!r}: provenance.imagenet_classes must list, per class, "
                                  f"indices of {reference_meta.name!r}'s {n} classes")
        return [list(t) for t in given]
    by_wnid = {c.wnid: c.index for c in reference_meta.classes if c.wnid}
    missing = [c.name for c in shift_meta.classes if c.wnid not in by_wnid]
    if missing:
        raise RobustnessError(f"dataset {shift_meta.name!r}: class(es) {missing[:5]} have no wnid of "
                              f"{reference_meta.name!r}'s classes, and its classes.json has no imagenet_classes")
    return [[by_wnid[c.wnid]] for c in shift_meta.classes]


def subset_predictions(image_emb: np.ndarray, weights: np.ndarray, labels: np.ndarray,
                       targets: list[list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(class sublist, predicted reference class per image, correct per image): logits over the sublist (the union
    of the targets, sorted), the top one mapped back to its reference class, right when among the label's targets."""
    sublist = np.array(sorted({i for t in targets for i in t}), dtype=np.int64)
    logits = zeroshot_logits(image_emb, weights[sublist])
    predicted = sublist[logits.argmax(axis=1)]
    member = np.zeros((len(targets), len(weights)), dtype=bool)
    for k, t in enumerate(targets):
        member[k, t] = True
    return sublist, predicted, member[np.asarray(labels), predicted]


def reference_inputs(inputs, reference: str):
    """The reference dataset's inputs, beside the shift's (same model, sibling folders)."""
    return Inputs(load_meta(prepared_dir(reference)), inputs.identity, inputs.features_dir.parent / reference,
                  inputs.texts_dir.parent / reference, decode=inputs.decode)


def reference_accuracy(reference: str) -> float:
    """The reference's zero-shot accuracy (reports/zeroshot/<reference>.json), the line's x."""
    result = read_result("zeroshot", reference)
    if "accuracy" not in result["metrics"]:
        raise RobustnessError(f"reports/zeroshot/{reference}.json has no accuracy (metrics: {sorted(result['metrics'])})")
    return float(result["metrics"]["accuracy"])


def run(inputs, cfg, seed: int):
    """robustness@<shift>: the shift's `cfg['split']` images against the reference's class prompts restricted to the
    shift's classes; effective robustness against the shift's line."""
    reference = cfg["reference"]
    ref = reference_inputs(inputs, reference)
    texts = ref.texts(TEXT_SET)
    weights = template_weights(texts.table, texts.embeddings, len(ref.meta.classes))
    targets = reference_targets(inputs.meta, ref.meta)
    images = inputs.images(cfg["split"])
    labels = images.table.column("label").to_numpy()
    sublist, predicted, correct = subset_predictions(images.embeddings, weights, labels, targets)
    accuracy, x = float(correct.mean()), reference_accuracy(reference)
    key, line = line_for(inputs.meta.name, cfg)
    metrics = {"accuracy": accuracy, "reference_accuracy": x, **effective_robustness(x, accuracy, line)}
    predictions = pa.table({"sample_id": images.table.column("sample_id"), "label": images.table.column("label"),
                            "predicted_reference_class": pa.array(predicted, pa.int64()),
                            "correct": pa.array(correct)})
    return Result(metrics,
                  counts={"samples": len(labels), "classes": len(targets), "reference_classes": int(sublist.size)},
                  params={"split": cfg["split"], "reference": reference, "text_set": TEXT_SET,
                          "prompts_per_class": texts.table.num_rows / max(len(ref.meta.classes), 1), "line": key,
                          "slope": line["slope"], "intercept": line["intercept"]},
                  tables={"predictions": predictions},
                  details={"line": line, "reference_classes": sublist.tolist()},
                  intervals={"accuracy": bootstrap_sample_metric("accuracy", correct, seed=seed).to_json()})
