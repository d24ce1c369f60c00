"""VTAB-1k linear evaluation on cached features (Zhai et al., "A Large-scale Study of Representation Learning with the
Visual Task Adaptation Benchmark"; code: github.com/google-research/task_adaptation).

A zero-initialised linear head (`tf.layers.dense(kernel_initializer=zeros)`, zero bias) on the frozen features,
trained with SGD momentum 0.9, batch 512, no weight decay and no augmentation, its learning rate divided by 10 at
30%, 60% and 90% of the steps (`tf.train.piecewise_constant`, the README's `--decay_steps 750,1500,2250` for 2,500
steps). VTAB's lightweight sweep, learning rate {0.1, 0.01} x steps {2,500, 10,000}, is trained on `train800`
(the first 800 images of the train split, TFDS `train[:800]`) and scored on `val200` (the first 200 of the
validation split), or with `selection: paper` (the paper's App. I) trained on the 1,000 and scored on the whole
validation split; the chosen setting is retrained on the 1,000 (`train800val200`) and tested on the whole test split.
Three runs (seeds), median reported. Every dataset must be prepared with `preprocess: squash` (App. I: "We resize all
images to 224x224", no centre crop). The heads train batched (`train_heads`): on the CPU the 12 sweep heads (3 runs
x 4 settings) in one loop of 10,000 steps, then the 3 final heads in another; on the GPU the sweep and every
setting's final run (24 heads) in one loop.

docs/protocols.md, "Adapt: VTAB-1k", has every rule with its source and every difference.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from vlbench.analyses.adapt.protocol import AdaptError, ProtocolResult, cpu_threads, device as pick_device
from vlbench.analyses.zeroshot_classifier import l2_normalize
from vlbench.params import defaults
from vlbench.features import (
    PRE_PROJECTION,
    Features,
    pre_projection_path,
    read_features,
)
from vlbench.stats import median_of_runs_interval

GROUPS = ("natural", "specialized", "structured")
GROUPS_FILE = Path(__file__).with_name("vtab_groups.json")  # VTAB's 19 tasks -> group, as data
SELECTIONS = ("val200", "paper")  # the code's train800 / val200 | the paper's App. I: train on 1,000, select on all of val
PREPROCESSES = ("squash", "default")  # the prepared dataset's `preprocess`: VTAB resizes to 224 x 224 without a crop
REPRESENTATIONS = ("projected", "pre_projection")  # the embedding as the model outputs it | before its projection
BLOCK = 250  # steps of batch indices drawn at a time (runtime only: the stream is the same)

DEFAULTS: dict[str, Any] = defaults("adapt.vtab")  # conf/settings/adapt.yaml


def settings(cfg: Mapping[str, Any] | None) -> dict[str, Any]:
    cfg = dict(cfg or {})
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise AdaptError(f"params.yaml: adapt.vtab has unknown key(s) {unknown}; known: {sorted(DEFAULTS)}")
    s = {**DEFAULTS, **cfg}
    problems = {
        "selection": s["selection"] not in SELECTIONS and f"must be one of {list(SELECTIONS)}" + (
            " (full_val is now paper: the sweep trains on the 1,000 too)" if s["selection"] == "full_val" else ""),
        "preprocess": s["preprocess"] not in PREPROCESSES and f"must be one of {list(PREPROCESSES)}",
        "representation": s["representation"] not in REPRESENTATIONS and f"must be one of {list(REPRESENTATIONS)}",
        "runs": s["runs"] < 1 and "must be at least 1",
        "learning_rates": not s["learning_rates"] and "must not be empty",
        "steps": (not s["steps"] or min(s["steps"]) < 1) and "must be positive step counts",
        "decay_at": any(not 0 < f < 1 for f in s["decay_at"]) and "must be fractions in (0, 1)",
        "groups": any(g not in GROUPS for g in s["groups"].values()) and f"values must be in {list(GROUPS)}",
    }
    for key, problem in problems.items():
        if problem:
            raise AdaptError(f"params.yaml: adapt.vtab.{key} {problem}")
    return s


def task_group(dataset: str, groups: Mapping[str, str], own: str | None = None) -> str:
    """The dataset's VTAB group: `adapt.vtab.groups` first, then the group its prepared data records (`own`: the
    `vtab` source's classes.json provenance), then vtab_groups.json (VTAB's own task names)."""
    known = {**json.loads(GROUPS_FILE.read_text())["groups"], **({dataset: own} if own else {}), **groups}
    if dataset not in known:
        raise AdaptError(f"dataset {dataset!r} has no VTAB group; add it to params adapt.vtab.groups "
                         f"(one of {list(GROUPS)})")
    return known[dataset]


# ----------------------------------------------------------------------------------------------------------------
# The schedule and the batches


def decay_boundaries(steps: int, decay_at: list[float]) -> list[int]:
    """The steps after which the rate drops: round(fraction * steps), e.g. [750, 1500, 2250] for 2,500 steps."""
    return [round(f * steps) for f in decay_at]


def learning_rates(base: float, steps: int, s: Mapping[str, Any]) -> np.ndarray:
    """The rate of every step t = 0..steps-1: base * factor^(boundaries b with t > b), as
    tf.train.piecewise_constant(global_step, boundaries, values) gives it (the global step before the update);
    with warmup_steps w > 0, t * base / w while t < w (the code's apply_warmup_lr)."""
    t = np.arange(steps)
    passed = (t[:, None] > np.array(decay_boundaries(steps, s["decay_at"]))[None, :]).sum(axis=1)
    lr = base * s["decay_factor"] ** passed
    w = s["warmup_steps"]
    return np.where(t < w, t * base / max(w, 1), lr).astype(np.float32)


def batch_stream(rng: np.random.Generator, n: int, batch: int, steps: int, block: int = BLOCK) -> Iterator[np.ndarray]:
    """(k, batch) index blocks of one stream: epochs, each a fresh permutation of range(n), cut into consecutive
    batches (a batch may span two epochs), like tf.data's repeat().shuffle() with a buffer of all the data."""
    left = np.zeros(0, np.int64)
    for start in range(0, steps, block):
        k = min(block, steps - start)
        need = k * batch - left.size
        epochs = rng.random((-(-need // n), n)).argsort(axis=1).reshape(-1) if need > 0 else left[:0]
        left = np.concatenate([left, epochs])
        yield left[:k * batch].reshape(k, batch)
        left = left[k * batch:]


@contextmanager
def flush_denormals() -> Iterator[None]:
    """Subnormal floats flushed to zero while heads train on the CPU: softmax tails and late, tiny updates
    underflow into subnormals, which x86 handles ~100x slower (measured: 2,000 VTAB steps on the demo's count
    features took 2.5 s with them, 1.1 s without). Values below 1.2e-38 become 0; no accuracy we report moves."""
    import torch

    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


# ----------------------------------------------------------------------------------------------------------------
# Heads: R streams (each its own batches, from the first n_r rows) x A settings per stream, one batched SGD


def train_heads(x: np.ndarray, y: np.ndarray, num_classes: int, lrs: np.ndarray, ends: np.ndarray, rngs: list,
                rows: list[int], s: Mapping[str, Any], device: str | None = None):
    """Train R x A zero-initialised heads. lrs (R, A, steps): every head's rate at every step, 0 after its last;
    ends (R, A): each head's number of steps, non-increasing along A (the loop narrows to the heads still
    training). Stream r draws its batches from the first rows[r] rows of (x, y) with rngs[r]; its A heads share
    them. SGD as tf.train.MomentumOptimizer (accum = momentum * accum + grad; w -= lr * accum) on the mean
    cross-entropy. The bias is the weight of a constant feature 1 (the same updates, one product fewer).
    Returns (weight (R, A, d, C), bias (R, A, C)) as torch tensors."""
    import torch

    dev = pick_device(device)
    r, a, total = lrs.shape
    if np.any(np.diff(ends, axis=1) > 0):
        raise ValueError("train_heads needs each stream's heads ordered by decreasing steps")
    live = (ends[:, :, None] > np.arange(total)[None, None, :]).sum(axis=1).max(axis=0) * num_classes  # columns
    xt = torch.as_tensor(np.hstack([x, np.ones((len(x), 1))]).astype(np.float32), device=dev)
    onehot = torch.nn.functional.one_hot(torch.as_tensor(np.asarray(y, np.int64), device=dev), num_classes).float()
    b, c = s["batch_size"], num_classes
    w = torch.zeros(r, xt.shape[1], a * c, device=dev)
    acc = torch.zeros_like(w)
    rates = torch.as_tensor(lrs, device=dev).repeat_interleave(c, dim=1).transpose(1, 2)[:, :, None, :]  # R,T,1,AC
    streams = [batch_stream(g, n, b, total) for g, n in zip(rngs, rows)]
    with cpu_threads(dev, r * b * xt.shape[1] * a * c), flush_denormals():
        for start in range(0, total, BLOCK):
            block = torch.as_tensor(np.stack([next(st) for st in streams], axis=1), device=dev)  # (k, R, B)
            for i in range(block.shape[0]):
                flat, k = block[i].reshape(-1), int(live[start + i])
                xb = torch.index_select(xt, 0, flat).view(r, b, -1)  # per step: the rows stay in cache
                yb = torch.index_select(onehot, 0, flat).view(r, b, 1, c)
                _sgd_step(xb, yb, w[..., :k], acc[..., :k], rates[:, start + i, :, :k], s["momentum"], c)
    w = w.view(r, xt.shape[1], a, c).permute(0, 2, 1, 3)
    return w[:, :, :-1], w[:, :, -1]


def exp_shifted(z):
    """exp(z - max over classes), the arguments clamped at -80: the numerator of the softmax. By hand because
    torch.softmax is 5x slower on 4-15 classes; clamped because exp of arguments below about -88 (which underflow)
    is 5-15x slower than elsewhere. exp(-80) = 2e-35 changes no probability at float32 precision (the largest term is
    1) and leaves a class's own probability at most 2e-35 away from the unclamped one."""
    return (z - z.amax(dim=-1, keepdim=True)).clamp_(min=-80.0).exp_()


def _sgd_step(xb, yb, w, acc, lr, momentum: float, c: int) -> None:
    """One step of every live head on the batch xb (R, B, d + 1) with one-hot labels yb (R, B, 1, C): w and acc
    are views of the live columns."""
    r, b = xb.shape[:2]
    z = xb.bmm(w).view(r, b, -1, c)
    e = exp_shifted(z)
    g = (e / e.sum(dim=-1, keepdim=True) - yb).view(r, b, -1)
    acc.baddbmm_(xb.transpose(1, 2), g, beta=momentum, alpha=1.0 / b)  # accum = momentum * accum + grad
    w.addcmul_(lr, acc, value=-1.0)


def predictions(weight, bias, x: np.ndarray) -> np.ndarray:
    """(R, A, N) the class each head predicts for each row of x; ties to the lower class index."""
    import torch

    xt = torch.tensor(np.asarray(x, dtype=np.float32), device=weight.device)
    logits = torch.einsum("nd,radc->ranc", xt, weight) + bias[:, :, None, :]
    return logits.argmax(dim=-1).cpu().numpy()


def accuracies(weight, bias, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(R, A) top-1 accuracy of each head on (x, y)."""
    return (predictions(weight, bias, x) == np.asarray(y)[None, None, :]).mean(axis=-1)


# ----------------------------------------------------------------------------------------------------------------
# The protocol


@dataclass
class Split:
    x: np.ndarray
    y: np.ndarray
    ids: list[str] | None = None  # sample ids (the test split's, for its per-sample predictions)


def load_splits(inputs, s: Mapping[str, Any]) -> dict[str, Split]:
    """train800, the sweep's training set (train800, or with selection `paper` train800val200), the selection set
    (val200, or with `paper` the whole validation split), train800val200 and test, as row ranges of the prepared
    splits (index lists, never copies of images)."""
    meta = inputs.meta
    if meta.multi_label:
        raise AdaptError(f"dataset {meta.name!r}: VTAB linear evaluation needs single-label data")
    got = {}
    for key in ("train_split", "val_split", "test_split"):
        if not inputs.has_split(s[key]):
            raise AdaptError(f"dataset {meta.name!r} has no split {s[key]!r} (adapt.vtab.{key}); "
                             f"it has {sorted(meta.splits)}")
        f = inputs.images(s[key]) if s["representation"] == "projected" else pre_projection_images(inputs, s[key])
        x = l2_normalize(f.embeddings) if s["normalize"] else f.embeddings
        got[key] = Split(x, f.table.column("label").to_numpy(), f.table.column("sample_id").to_pylist())
    train, val = got["train_split"], got["val_split"]
    for key, part, n in (("train_examples", train, s["train_examples"]), ("val_examples", val, s["val_examples"])):
        if len(part.y) < n:
            raise AdaptError(f"dataset {meta.name!r}: adapt.vtab.{key} is {n} but the split has {len(part.y)} images")
    tr = Split(train.x[:s["train_examples"]], train.y[:s["train_examples"]])
    va = Split(val.x[:s["val_examples"]], val.y[:s["val_examples"]])
    both = Split(np.concatenate([tr.x, va.x]), np.concatenate([tr.y, va.y]))
    paper = s["selection"] == "paper"
    return {"train800": tr, "sweep": both if paper else tr, "select": val if paper else va, "train800val200": both,
            "test": got["test_split"]}


def check_preprocess(meta, s: Mapping[str, Any]) -> None:
    """VTAB squashes every image to the model's input (App. I: "We resize all images to 224x224"; task_adaptation's
    `tf.image.resize` to (224, 224), no crop): a dataset prepared otherwise is refused, naming the fix."""
    if meta.preprocess != s["preprocess"]:
        raise AdaptError(f"dataset {meta.name!r} is prepared with preprocess {meta.preprocess!r} but "
                         f"adapt.vtab.preprocess is {s['preprocess']!r}: set `preprocess: {s['preprocess']}` under prepare: in its dataset entry "
                         f"(conf/dataset/{meta.name}.yaml), or adapt.vtab.preprocess: {meta.preprocess}")


def pre_projection_images(inputs, split: str) -> Features:
    """A split's pre-projection features (the embed step's `embed.pre_projection`), for this model and data version."""
    meta = inputs.meta
    path = pre_projection_path(inputs.features_dir / "images", split)
    if not path.is_file():
        raise AdaptError(f"dataset {meta.name!r}: adapt.vtab.representation is pre_projection but {path} does not exist; "
                         f"set embed.pre_projection: true and re-run embed_images@{meta.name}")
    return read_features(path, {**inputs.image_identity(), "representation": PRE_PROJECTION})


def sweep_plan(s: Mapping[str, Any]) -> list[tuple[float, int]]:
    """The sweep's (learning rate, steps) settings, in order: by decreasing steps, then learning rates as listed.
    (The order only breaks ties between equal selection accuracies: the longer run, then the earlier rate.)"""
    return [(float(lr), int(n)) for n in sorted(set(s["steps"]), reverse=True) for lr in s["learning_rates"]]


def rate_table(plan: list[list[tuple[float, int]]], s: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """((R, A, max steps) learning rates, 0 after each setting's last step; (R, A) steps) of R streams x A settings."""
    total = max(n for run in plan for _, n in run)
    out = np.zeros((len(plan), len(plan[0]), total), np.float32)
    for i, run in enumerate(plan):
        for j, (lr, n) in enumerate(run):
            out[i, j, :n] = learning_rates(lr, n, s)
    return out, np.array([[n for _, n in run] for run in plan])


def run_rngs(seed: int, runs: int, phase: str) -> list[np.random.Generator]:
    """One batch-order generator per run and phase ("sweep" or "final"), from (seed, run)."""
    return [np.random.default_rng([seed, r, {"sweep": 0, "final": 1}[phase]]) for r in range(runs)]


def choose(val_acc: np.ndarray) -> list[int]:
    """Per run, the setting with the best selection accuracy; ties to the earlier setting of the plan."""
    return [int(np.argmax(row)) for row in val_acc]


def train_runs(data: Mapping[str, Split], num_classes: int, s: Mapping[str, Any], seed: int,
               device: str | None = None):
    """(plan, sweep heads (R, A), final heads (R, A')), each as (weight, bias). The sweep trains every setting on
    train800 (selection `paper`: on train800val200); the final runs train on train800val200 (train800 is its first 800 rows). On the GPU both go in one
    loop (2R streams, every setting also trained on the 1,000: launches, not arithmetic, bound a GPU step), A' = A;
    on the CPU the final loop trains the chosen setting only (A' = 1, less arithmetic). Streams and results are
    the same either way."""
    plan, runs, both = sweep_plan(s), s["runs"], data["train800val200"]
    n800, n1000 = len(data["sweep"].y), len(both.y)  # the sweep's rows are the first of train800val200's
    sweep_rngs, final_rngs = run_rngs(seed, runs, "sweep"), run_rngs(seed, runs, "final")
    if pick_device(device).type == "cuda":
        lrs, ends = rate_table([plan] * (2 * runs), s)
        w, b = train_heads(both.x, both.y, num_classes, lrs, ends, sweep_rngs + final_rngs,
                           [n800] * runs + [n1000] * runs, s, device)
        return plan, (w[:runs], b[:runs]), (w[runs:], b[runs:]), None
    lrs, ends = rate_table([plan] * runs, s)
    sweep = train_heads(both.x, both.y, num_classes, lrs, ends, sweep_rngs, [n800] * runs, s, device)
    return plan, sweep, None, final_rngs


def final_test_predictions(data: Mapping[str, Split], num_classes: int, plan, chosen: list[int], final, final_rngs,
                           s: Mapping[str, Any], device: str | None = None) -> np.ndarray:
    """(R, N) the test predictions of each run's final head of its chosen setting; on the CPU the final heads are
    trained here, the chosen setting only."""
    if final is None:
        lrs, ends = rate_table([[plan[k]] for k in chosen], s)
        both = data["train800val200"]
        final = train_heads(both.x, both.y, num_classes, lrs, ends, final_rngs, [len(both.y)] * s["runs"], s, device)
        chosen = [0] * s["runs"]
    test_all = predictions(*final, data["test"].x)
    return np.stack([test_all[r, k] for r, k in enumerate(chosen)])


def evaluate(inputs, cfg: Mapping[str, Any], seed: int, device: str | None = None) -> ProtocolResult:
    """VTAB-1k on one dataset: sweep on train800 / val200 (selection `paper`: on the 1,000 / the whole validation
    split), retrain the chosen setting on the 1,000, test; 3 runs."""
    s = settings(cfg)
    group = task_group(inputs.meta.name, s["groups"], inputs.meta.provenance.get("group"))
    check_preprocess(inputs.meta, s)
    data, c = load_splits(inputs, s), len(inputs.meta.classes)
    plan, sweep, final, final_rngs = train_runs(data, c, s, seed, device)
    val_acc = accuracies(*sweep, data["select"].x, data["select"].y)
    chosen = choose(val_acc)
    predicted = final_test_predictions(data, c, plan, chosen, final, final_rngs, s, device)
    correct = predicted == data["test"].y[None, :]
    test_acc = correct.mean(axis=1)
    median = float(np.median(test_acc))
    runs = [{"run": r, "selection_accuracy": {f"lr={lr},steps={n}": float(v) for (lr, n), v in zip(plan, val_acc[r])},
             "chosen": {"learning_rate": plan[k][0], "steps": plan[k][1]}, "test_accuracy": float(test_acc[r])}
            for r, k in enumerate(chosen)]
    details = {"group": group, "median": median, "runs": runs, "seed": seed, "settings": s,
               "schedule": {str(n): decay_boundaries(n, s["decay_at"]) for n in s["steps"]}}
    counts = {"train800": len(data["train800"].y), "sweep_train": len(data["sweep"].y), "selection": len(data["select"].y),
              "final_train": len(data["train800val200"].y), "test": len(data["test"].y)}
    return ProtocolResult({"vtab/median": median}, details, {"vtab_predictions": predictions_table(data["test"], predicted)},
                          counts, intervals={"vtab/median": median_of_runs_interval(correct, seed=seed).to_json()})


def predictions_table(test: Split, predicted: np.ndarray) -> pa.Table:
    """One row per (run, test sample): the class the run's final head predicts, beside the label:
    reports/adapt/<dataset>.vtab_predictions.parquet, for paired comparisons."""
    runs, n = predicted.shape
    return pa.table({"run": pa.array(np.repeat(np.arange(runs), n), pa.int64()),
                     "sample_id": pa.array(list(test.ids) * runs, pa.string()),
                     "label": pa.array(np.tile(test.y, runs), pa.int64()),
                     "predicted": pa.array(predicted.ravel(), pa.int64())})


def group_means(median_by_dataset: Mapping[str, float], group_by_dataset: Mapping[str, str]) -> dict[str, float]:
    """VTAB's summary over datasets: `vtab/<group>` (mean of the group's tasks, for the groups present) and
    `vtab/mean` (mean over all tasks, not over groups)."""
    out = {}
    for g in GROUPS:
        values = [v for d, v in median_by_dataset.items() if group_by_dataset[d] == g]
        if values:
            out[f"vtab/{g}"] = float(np.mean(values))
    if median_by_dataset:
        out["vtab/mean"] = float(np.mean(list(median_by_dataset.values())))
    return out
