"""What the held-out search (stage heldout@, vlbench/finetune/heldout.py) and a FewTrans fine-tuning table (stage
finetune@ with finetune.method fewtrans_episodic, vlbench/finetune/fewtrans_episodic.py) will train, counted from the
params and the prepared data without training anything; and the device time that takes at a measured step rate
(`vlbench plan`, key "finetune").

Counts, per stage and method:
- the table: `units` = episodes x methods (the cached work units), `runs` = episodes x ensemble members (each member is
  one training run), `steps` = sum over episodes and members of epochs x ceil(support images / the method's batch);
- the search: the tasks (adapt.fewtrans under finetune.heldout.search.sampler), the coarse grid's points and its
  `units` = points x tasks (each one run of the point's epochs), `steps` likewise; the neighbour rounds that follow
  depend on the scores (each evaluates at most 3^d - 1 new points), so the search's counts are lower bounds.
Steps need the episodes' support sizes (the prepared dataset) and the table's ensembles their centres (the held-out
search's result, the authors' or params'); where one is missing the count is None and `unknown` says why.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vlbench.analyses.adapt import fewtrans as episodic
from vlbench.errors import VlbenchError
from vlbench.finetune import FinetuneError, heldout
from vlbench.finetune import fewtrans_episodic as fft
from vlbench.models import rates as model_rates
from vlbench.paths import prepared_dir


def supports(params: Mapping[str, Any], dataset: str,
             sampler: Mapping[str, Any]) -> tuple[int, list[int] | None, str | None]:
    """(number of episodes, support images of each, None) as adapt's FewTrans sampler draws them on the prepared
    dataset; (the sampler's episodes, None, why) when the dataset is not prepared yet or the sampler refuses it (the
    stage would fail the same way: the plan says so instead of failing)."""
    episodes = int(episodic.settings(sampler)["episodes"])
    folder = prepared_dir(dataset)
    if not (folder / "classes.json").is_file():
        return episodes, None, f"dataset {dataset!r} not prepared yet: support sizes unknown"
    try:
        pairs = fft.draw_episodes(folder, sampler, int(params["seed"]))[5]
    except VlbenchError as err:
        return episodes, None, f"the episodes of {dataset!r} cannot be drawn ({err})"
    return len(pairs), [sum(b.shots) for b, _ in pairs], None


def _steps(epochs: int, support: list[int] | None, batch: int) -> int | None:
    return None if support is None else sum(epochs * math.ceil(n / batch) for n in support)


def table_passes(params: Mapping[str, Any], dataset: str) -> dict[str, Any]:
    finetune = params.get("finetune") or {}
    s = fft.settings(finetune.get("fewtrans_episodic"))
    episodes, support, why = supports(params, dataset, (params.get("adapt") or {}).get("fewtrans") or {})
    methods, unknown = {}, [why] if why else []
    for name in s["methods"]:
        row: dict[str, Any] = {"units": episodes, "batch_size": int(s[name]["batch_size"])}
        try:
            resolved, source = fft.resolve_centres({**s, "methods": [name]}, fft.heldout_path(params))
        except FinetuneError as err:
            unknown.append(f"{name}: centre unknown ({err})")
            methods[name] = {**row, "members": None, "runs": None, "steps": None, "centre": None}
            continue
        members = fft.members(name, resolved)
        steps = [_steps(m.epochs, support, row["batch_size"]) for m in members]
        methods[name] = {**row, "members": len(members), "runs": episodes * len(members),
                         "steps": None if support is None else sum(steps), "centre": source[name]}
    return {"name": f"finetune@{dataset}", "kind": "fewtrans_table", "episodes": episodes, "methods": methods,
            **_totals(methods), "unknown": unknown}


def search_passes(params: Mapping[str, Any], dataset: str) -> dict[str, Any]:
    finetune = params.get("finetune") or {}
    hs = heldout.settings((finetune.get("heldout") or {}).get("search"))
    s = fft.settings(finetune.get("fewtrans_episodic"))
    names = list(hs["methods"]) if hs["methods"] is not None else s["methods"]
    sampler = {**dict((params.get("adapt") or {}).get("fewtrans") or {}), **dict(hs["sampler"] or {})}
    tasks, support, why = supports(params, dataset, sampler)
    methods = {}
    for name in names:
        axes = heldout.axes_of(name)
        grid = list(itertools.product(*(hs["coarse"][a] for a in axes)))
        batch = int(s[name]["batch_size"])
        epochs = [dict(zip(axes, p))["epochs"] for p in grid]
        methods[name] = {"coarse_points": len(grid), "neighbours_per_round_max": 3 ** len(axes) - 1,
                         "units": len(grid) * tasks, "runs": len(grid) * tasks, "batch_size": batch,
                         "steps": None if support is None else sum(_steps(int(e), support, batch) for e in epochs)}
    unknown = ["the neighbour rounds after the coarse grid depend on the scores: counts are lower bounds"]
    unknown += [why] if why else []
    return {"name": f"heldout@{dataset}", "kind": "heldout_search", "tasks": tasks, "methods": methods,
            **_totals(methods), "unknown": unknown}


def _totals(methods: Mapping[str, Mapping[str, Any]]) -> dict[str, int | None]:
    out = {}
    for key in ("units", "runs", "steps"):
        values = [m[key] for m in methods.values()]
        out[key] = None if any(v is None for v in values) else sum(values)
    return out


def stage_passes(params: Mapping[str, Any], stages: list[str]) -> list[dict[str, Any]]:
    """The passes of each heldout@ stage, and of each finetune@ stage when finetune.method is fewtrans_episodic."""
    out = []
    fewtrans = (params.get("finetune") or {}).get("method") == "fewtrans_episodic"
    for name in stages:
        group, _, dataset = name.partition("@")
        if group == "heldout":
            out.append(search_passes(params, dataset))
        elif group == "finetune" and fewtrans:
            out.append(table_passes(params, dataset))
    return out


def estimate(model_cfg: Mapping[str, Any], passes: list[dict[str, Any]], device: str | None,
             warmup: bool) -> dict[str, Any]:
    """{"seconds", "device_hours", "device", "seconds_per_step": {batch: s}, "rate": {batch: source}, "reason"}: every
    counted step at the rate of its batch size, measured in a capped child, cached or estimated from FLOPs
    (vlbench.models.rates.step_seconds). Only the training steps are counted (not the query scoring, the image
    decoding or a frozen tower's support encoding); a text_ft step is counted at the image tower's cost."""
    from vlbench.models.loading import pick_device
    from vlbench.models.timing import describe_device

    dev = pick_device(device)
    unknown = {"seconds": None, "device_hours": None, "device": describe_device(dev), "seconds_per_step": {},
               "rate": {}}
    if not passes:
        return {**unknown, "seconds": 0.0, "device_hours": 0.0, "reason": "no fine-tuning stage to run"}
    if not warmup:
        return {**unknown, "reason": "warm-up skipped (--no-warmup): no step rate measured"}
    batches = sorted({m["batch_size"] for p in passes for m in p["methods"].values()})
    arch = model_rates.architecture(model_cfg)
    steps = {b: model_rates.step_seconds(model_cfg, arch, dev, b) for b in batches}
    rates = {b: r.value for b, r in steps.items()}
    how = ("training steps of the image tower (Adam, forward + backward on random input): " +
           ", ".join(f"{steps[b].how} [{steps[b].source}]" for b in batches) +
           "; query scoring, decoding and a frozen tower's support encoding not counted")
    known = {"seconds_per_step": {str(b): r for b, r in rates.items()},
             "rate": {str(b): r.source for b, r in steps.items()}}
    missing = [p["name"] for p in passes if p["steps"] is None]
    if missing:
        return {**unknown, **known, "reason": f"steps unknown for {', '.join(missing)} (see its `unknown`); {how}"}
    seconds = sum(m["steps"] * rates[m["batch_size"]] for p in passes for m in p["methods"].values())
    bound = " (a lower bound: the held-out search's neighbour rounds not counted)" if any(
        p["kind"] == "heldout_search" for p in passes) else ""
    return {"seconds": seconds, "device_hours": seconds / 3600, "device": unknown["device"], **known,
            "reason": how + bound}


def plan(params: Mapping[str, Any], stages: list[str], device: str | None, warmup: bool) -> dict[str, Any]:
    """The plan's "finetune" entry for the stages that would run: {"stages": [passes...], "estimate": {...}}."""
    passes = stage_passes(params, stages)
    return {"stages": passes, "estimate": estimate(params["model"], passes, device, warmup)}


__all__ = ["plan", "search_passes", "table_passes", "estimate"]
