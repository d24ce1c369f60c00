"""The held-out search that sets FewTrans's ensemble ranges (Luo et al., Section 5.1, App. A and B.2).

"We determine the range on a held-out dataset by finding the best average optimal hyperparameters on this dataset,
setting it as the center of the hyperparameter range" (Section 5.1): for each fine-tuning method, tasks are drawn from
the held-out dataset with the FewTrans sampler (adapt.fewtrans's settings with `finetune.heldout.sampler` over them,
the global seed), every configuration (lr, head_lr for a linear head, epochs) is one run per task (no ensemble), and
its score is the mean base-query accuracy over the tasks. The search is App. A's: epochs from [1, 2, 5, 10, 15, 20,
30, 40, 50, 60, 70, 80, 90, 100], learning rates 1, 2 and 5 times each power of ten, down to 1e-8 and without an
upper limit; a coarse grid first (the paper's ViT example: epochs [30, 50, 70], backbone [1e-6, 1e-5, 1e-4], head
[1e-3, 1e-2, 1e-1]), then from its best point the neighbouring points (one step along any axes, 3^d - 1 of them), moving
to the best of them while it scores strictly higher, until no neighbour is better. Ties (in the coarse grid, or among
better neighbours) go to fewer epochs, then smaller rates. Each (point, task) is a work unit
(vlbench.finetune.units): cached, on the local or the Ray engine.

`search(...)` returns (document, table): the centres per method (what `finetune.fewtrans_episodic` reads with
`centres: heldout`), the settings, and one row per evaluated point. Stage `heldout@<dataset>` (stages/heldout.py)
writes them to reports/heldout/<dataset>.json and .search.parquet.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from vlbench.analyses.adapt import fewtrans as episodic
from vlbench.finetune import FinetuneError, units
from vlbench.finetune import fewtrans_episodic as fft
from vlbench.models.identity import model_identity

# params finetune.heldout.search overrides these; finetune.heldout.dataset names the held-out dataset (the paper:
# ImageNet's validation set for models not trained on ImageNet, CUB for ImageNet models)
DEFAULTS: dict[str, Any] = {
    "methods": None,  # null: finetune.fewtrans_episodic.methods
    "sampler": {"episodes": 50, "novel_fraction": 0},  # over adapt.fewtrans: the held-out tasks (all classes base)
    "epochs": list(episodic.EPOCH_SEARCH),  # App. A's search space of E*
    "lr_min": 1.0e-8,  # App. A's lower limit; no upper one (lr_max null)
    "lr_max": None,
    "coarse": {"lr": [1.0e-6, 1.0e-5, 1.0e-4], "head_lr": [1.0e-3, 1.0e-2, 1.0e-1], "epochs": [30, 50, 70]},
    "max_rounds": 100,  # neighbour rounds before the search gives up (an error names the method)
}
MANTISSAS = (1, 2, 5)


def settings(cfg: Mapping[str, Any] | None) -> dict[str, Any]:
    cfg = dict(cfg or {})
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise FinetuneError(f"params.yaml: finetune.heldout.search has unknown key(s) {unknown}; known: "
                            f"{sorted(DEFAULTS)}")
    s = {**DEFAULTS, **cfg, "coarse": {**DEFAULTS["coarse"], **(cfg.get("coarse") or {})}}
    epochs = [int(e) for e in s["epochs"]]
    problems = {
        "epochs": (not epochs or epochs != sorted(set(epochs)) or epochs[0] < 1) and "must be increasing whole numbers >= 1",
        "lr_min": float(s["lr_min"]) <= 0 and "must be positive",
        "lr_max": s["lr_max"] is not None and float(s["lr_max"]) < float(s["lr_min"]) and "must be null or >= lr_min",
        "coarse.epochs": not set(s["coarse"]["epochs"]) <= set(epochs) and f"must be values of epochs {epochs}",
        **{f"coarse.{k}": _off_ladder(s, s["coarse"][k]) for k in ("lr", "head_lr")},
        "max_rounds": int(s["max_rounds"]) < 1 and "must be at least 1",
    }
    for key, problem in problems.items():
        if problem:
            raise FinetuneError(f"params.yaml: finetune.heldout.search.{key} {problem}")
    return s


# ----------------------------------------------------------------------------------------------------------------
# The search space


def rung(lr: float) -> int | None:
    """The index of `lr` on the 1-2-5 ladder (1e0 is 0, 2e0 1, 5e0 2, 1e1 3, 1e-1 -3), None if it is not on it."""
    exponent = math.floor(math.log10(lr) + 1e-9)
    mantissa = lr / 10.0 ** exponent
    for k, m in enumerate(MANTISSAS):
        if abs(mantissa - m) < 1e-6:
            return 3 * exponent + k
    return None


def rate(index: int) -> float:
    return float(f"{MANTISSAS[index % 3]}e{index // 3}")


def _off_ladder(s: Mapping[str, Any], values: Sequence[float]) -> str | None:
    bad = [v for v in values if rung(float(v)) is None or not _in_range(s, float(v))]
    return (not values or bad) and f"must be 1, 2 or 5 times a power of ten within [lr_min, lr_max], got {list(values)}"


def _in_range(s: Mapping[str, Any], lr: float) -> bool:
    return lr >= float(s["lr_min"]) * (1 - 1e-9) and (s["lr_max"] is None or lr <= float(s["lr_max"]) * (1 + 1e-9))


def steps(s: Mapping[str, Any], axis: str, value: float) -> list[float]:
    """The values one step from `value` on an axis (learning rates: the ladder within the limits; epochs: the list)."""
    if axis == "epochs":
        space = [int(e) for e in s["epochs"]]
        i = space.index(int(value))
        return [space[j] for j in (i - 1, i + 1) if 0 <= j < len(space)]
    i = rung(float(value))
    return [rate(j) for j in (i - 1, i + 1) if _in_range(s, rate(j))]


def neighbours(s: Mapping[str, Any], axes: Sequence[str], point: tuple) -> list[tuple]:
    """Every point one step away along any non-empty set of axes (3^d - 1 at most), in a fixed order."""
    options = [[v, *steps(s, a, v)] for a, v in zip(axes, point)]
    return [p for p in itertools.product(*options) if p != tuple(point)]


def axes_of(name: str) -> tuple[str, ...]:
    return ("lr", "epochs") if fft.TUNINGS[name].head == "text" else ("lr", "head_lr", "epochs")


def rank_key(axes: Sequence[str], point: tuple, score: float) -> tuple:
    """Best first: the highest score, then fewer epochs, then smaller rates."""
    values = dict(zip(axes, point))
    return (-score, values["epochs"], values["lr"], values.get("head_lr") or 0.0)


def climb(evaluate: Callable[[list[tuple]], list[float]], s: Mapping[str, Any], axes: Sequence[str], name: str):
    """App. A's search for one method: the coarse grid, then rounds of the best point's neighbours, moving while a
    neighbour scores strictly higher. `evaluate(points)` gives their scores. Returns (best point, [(point, score, round)] in order)."""
    scores: dict[tuple, float] = {}
    order: list[tuple[tuple, float, int]] = []

    def score(points: list[tuple], round_: int) -> None:
        new = [p for p in dict.fromkeys(points) if p not in scores]
        for p, value in zip(new, evaluate(new)):
            scores[p] = float(value)
            order.append((p, float(value), round_))

    score(list(itertools.product(*(s["coarse"][a] for a in axes))), 0)
    best = min(scores, key=lambda p: rank_key(axes, p, scores[p]))
    for round_ in range(1, int(s["max_rounds"]) + 1):
        score(neighbours(s, axes, best), round_)
        top = min(scores, key=lambda p: rank_key(axes, p, scores[p]))
        if scores[top] <= scores[best]:  # no neighbour is better: a plateau is not walked
            return best, order
        best = top
    raise FinetuneError(f"finetune.heldout: the search for {name!r} still moved after max_rounds "
                        f"{s['max_rounds']} rounds (at {dict(zip(axes, best))}); raise finetune.heldout.search.max_rounds")


# ----------------------------------------------------------------------------------------------------------------
# The search on the held-out dataset


def search(model_cfg: Mapping[str, Any], prepared_dir: str | Path, texts_path: str | Path | None,
           cfg: Mapping[str, Any] | None, fewtrans_cfg: Mapping[str, Any] | None, seed: int,
           episodes_cfg: Mapping[str, Any] | None = None, device: str | None = None, *,
           units_dir: Path | None = None, engine: str | None = None, gpus: float | None = None,
           progress: bool = False) -> tuple[dict[str, Any], pa.Table, units.Tally]:
    """(document, search table, unit tally) of the held-out search on one prepared dataset.

    `cfg`: params `finetune.heldout.search` (over DEFAULTS); `fewtrans_cfg`: params `finetune.fewtrans_episodic` (the methods'
    batch sizes, LoRA's rank and alpha, the text set; its centres are not read); `episodes_cfg`: params
    `adapt.fewtrans`, under `cfg.sampler`. The document: `centres` {method: {lr, [head_lr], epochs, accuracy}},
    the model identity, dataset, tasks, seed and settings; the table one row per evaluated point."""
    hs = settings(cfg)
    s = fft.settings(fewtrans_cfg)
    if hs["methods"] is not None:
        s = {**s, "methods": list(hs["methods"])}
        fft.check_settings(s, "finetune.heldout.search")  # only its methods are new here
    sampler_cfg = {**dict(episodes_cfg or {}), **dict(hs["sampler"] or {})}
    meta, sampler, _, _, _, pairs = fft.draw_episodes(Path(prepared_dir), sampler_cfg, seed)
    fft.check_texts(s, texts_path, meta.name)
    where = units.plan_device(engine, device, gpus)
    work = fft.EpisodeWork(dict(model_cfg), str(prepared_dir), None if texts_path is None else str(texts_path), s,
                           seed, where, sampler_cfg, torch.get_num_threads())
    cache, tally = units.UnitCache(units_dir), units.Tally(engine=units.engine_name(engine))
    kept: list[units.Unit] = []
    rows: list[dict[str, Any]] = []
    centres: dict[str, dict[str, Any]] = {}
    tasks = range(len(pairs))
    for name in s["methods"]:
        axes = axes_of(name)
        context = fft.unit_context(model_cfg, Path(prepared_dir), texts_path, s, name, seed, where, sampler, "search")
        per_task: dict[tuple, list[float]] = {}

        def evaluate(points: list[tuple]) -> list[float]:
            identities = [{"method": name, **point_identity(axes, p), "episode": t} for p in points for t in tasks]
            todo = units.make_units(context, identities)
            todo_sorted = sorted(todo, key=lambda u: u.identity["episode"])  # one decode per task on the local engine
            results, part = units.run_units(work, todo_sorted, cache, engine, gpus, progress)
            tally.cached, tally.computed = tally.cached + part.cached, tally.computed + part.computed
            kept.extend(todo)
            by_key = {u.key: r["base"] for u, r in zip(todo_sorted, results)}
            out = []
            for k, p in enumerate(points):
                per_task[p] = [by_key[u.key] for u in todo[k * len(tasks):(k + 1) * len(tasks)]]
                out.append(float(np.mean(per_task[p])))
            return out

        best, order = climb(evaluate, hs, axes, name)
        centre = {k: v for k, v in point_identity(axes, best).items() if v is not None}
        centres[name] = {**centre, "accuracy": float(np.mean(per_task[best]))}
        rows += [{"method": name, "round": r, **point_identity(axes, p), "accuracy": v,
                  "ci95": ci95(per_task[p]), "chosen": p == best, "per_task": per_task[p]} for p, v, r in order]
    cache.prune(kept)
    doc = {"dataset": meta.name, "model": model_identity(model_cfg), "centres": centres, "tasks": len(pairs),
           "seed": int(seed), "device": where, "settings": hs, "sampler": sampler,
           "methods": {m: s[m] for m in s["methods"]}, "text_set": s["text_set"],
           "points": {m: sum(r["method"] == m for r in rows) for m in s["methods"]}}
    return doc, search_table(rows), tally


def point_identity(axes: Sequence[str], point: tuple) -> dict[str, Any]:
    values = dict(zip(axes, point))
    return {"lr": float(values["lr"]), "head_lr": None if "head_lr" not in values else float(values["head_lr"]),
            "epochs": int(values["epochs"])}


def ci95(values: Sequence[float]) -> float:
    return float(1.96 * np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0


def search_table(rows: list[dict[str, Any]]) -> pa.Table:
    types = {"method": pa.string(), "round": pa.int64(), "lr": pa.float64(), "head_lr": pa.float64(),
             "epochs": pa.int64(), "accuracy": pa.float64(), "ci95": pa.float64(), "chosen": pa.bool_(),
             "per_task": pa.list_(pa.float64())}
    return pa.table({k: pa.array([r[k] for r in rows], t) for k, t in types.items()})
