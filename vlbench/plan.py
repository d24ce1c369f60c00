"""`vlbench plan`: what `dvc exp run -S ...` would run, how much it embeds and how long that takes, running nothing.

DVC itself decides what is stale: the repository is opened through a filesystem that reads the overrides' composed
params in place of params.yaml (`ParamsOverlay`) and nothing else. DVC's own parametrisation (dvc.yaml's `foreach`
over the params) and its params dependencies both read params.yaml through that filesystem, so the stages, their paths
and their status are exactly what `dvc status` would give after `vlbench compose OVERRIDES`, while params.yaml, dvc.lock
and the workspace stay untouched (the composed file lives in a temporary folder). Resolving dvc.yaml ourselves would
re-implement DVC's interpolation and status rules and drift from them.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

import yaml

from vlbench.dataset_entries import dataset_entry
from vlbench.datasets.canonical import load_meta, split_path
from vlbench.datasets.registry import describe
from vlbench.errors import VlbenchError
from vlbench.models import rates
from vlbench.models.timing import describe_device
from vlbench.params import PARAMS_FILE
from vlbench.paths import knowledge_dir, prepared_dir, texts_dir

FINETUNE_STAGES = ("heldout", "finetune")  # stage groups whose training passes plan counts (vlbench/finetune/passes.py)
DECODE_SAMPLE = 32  # images per prepared dataset decoded and preprocessed to measure the per-image CPU cost


class PlanError(VlbenchError):
    """The plan cannot be made (the DVC repository is locked or unreadable); the message says why."""


def _params_overlay(real: Path, composed: Path):
    """DVC's local filesystem with the file `real` read from `composed` (DVC reads params files only through `open`)."""
    from dvc.fs import LocalFileSystem

    class ParamsOverlay(LocalFileSystem):
        def open(self, path, *args, **kwargs):
            if isinstance(path, str) and os.path.realpath(path) == str(real):
                path = str(composed)
            return super().open(path, *args, **kwargs)

    return ParamsOverlay()


def stage_statuses(params: Mapping[str, Any], root: Path = Path(".")) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(every stage of dvc.yaml for `params` in DAG order as {"name", "status", "cached": {"local", "remote"},
    "after"},
    {"name": the default remote or None, "reason": why `remote` is unknown, or None}).

    status: "never run" (no entry in dvc.lock), "stale" (`dvc status` lists it), "downstream" (runs after the stages
    in `after`, on their new outputs; `_mark_downstream`) or "up to date". cached.local: the
    stage is up to date, or DVC's run cache holds its outputs for the current inputs (`dvc repro` restores them instead
    of running). cached.remote: those outputs are all on the default remote (`dvc status -c`); None when there is no
    remote, it cannot be reached, or no outputs for these inputs are known here."""
    from dvc.exceptions import DvcException
    from dvc.lock import LockError
    from dvc.repo import Repo

    root = root.resolve()
    if not (root / PARAMS_FILE).is_file():
        raise PlanError(f"{root / PARAMS_FILE}: not found; run `vlbench plan` from the project root")
    lock = root / "dvc.lock"
    locked = (yaml.safe_load(lock.read_text()) or {}).get("stages", {}) if lock.is_file() else {}
    with tempfile.TemporaryDirectory(prefix="vlbench-plan-") as tmp:
        composed = Path(tmp) / PARAMS_FILE.name
        composed.write_text(yaml.safe_dump(dict(params), sort_keys=False))
        try:
            with Repo(str(root), fs=_params_overlay((root / PARAMS_FILE).resolve(), composed)) as repo:
                stale = set(repo.status())  # `dvc status` (it takes the repository lock itself): the changed stages
                with repo.lock:
                    order = _dag_order(repo)
                    rows, outputs = zip(*(_stage_row(repo, stage, locked, stage.addressing in stale)
                                         for stage in order))
                    outputs = _mark_downstream(repo.index.graph, order, rows, outputs)
                    remote = _on_remote(repo, outputs)
        except LockError as err:
            raise PlanError(f"the DVC repository {str(root)!r} is locked by another DVC command (a `dvc repro` "
                            f"running?); plan again when it ends ({err})") from err
        except DvcException as err:
            raise PlanError(f"DVC cannot read the pipeline for these overrides: {err}") from err
    on_remote, info = remote
    for row, present in zip(rows, on_remote):
        row["cached"]["remote"] = present
    return list(rows), info


def _dag_order(repo) -> list:
    """Stages with every stage after those it depends on; ties in dvc.yaml's order (then foreach order)."""
    import networkx as nx

    position = {stage: f"{i:06d}" for i, stage in enumerate(repo.index.stages)}
    return list(nx.lexicographical_topological_sort(repo.index.graph.reverse(copy=False), key=position.__getitem__))


def _stage_row(repo, stage, locked: Mapping[str, Any], stale: bool) -> tuple[dict[str, Any], Any]:
    """(the stage's row, the stage whose outputs are cached locally for its current inputs, or None)."""
    status = "never run" if stage.addressing not in locked else "stale" if stale else "up to date"
    outputs = _run_cached(repo, stage) if stale else stage
    row = {"name": stage.addressing, "status": status, "cached": {"local": outputs is not None, "remote": None},
           "after": []}
    return row, outputs


def _mark_downstream(graph, order: list, rows: tuple, outputs: tuple) -> tuple:
    """Stages up to date by their own dependencies that depend on a stage that runs: `dvc status` lists only the
    latter, but `dvc repro` checks each stage again after its upstream ran and runs it when those outputs changed
    (which a rerun of a changed stage normally does). Such a row gets status "downstream" and `after`: the stages
    it depends on directly that run; its cached outputs are unknown until then. Returns the outputs per stage."""
    runs: set[str] = set()
    outputs = list(outputs)
    for i, (stage, row) in enumerate(zip(order, rows)):
        after = sorted(up.addressing for up in graph.successors(stage) if up.addressing in runs)
        if row["status"] == "up to date" and after:
            row.update(status="downstream", after=after, cached={"local": False, "remote": None})
            outputs[i] = None
        if row["status"] != "up to date":
            runs.add(row["name"])
    return tuple(outputs)


def _run_cached(repo, stage):
    """The stage as DVC's run cache recorded it for its current dependencies and params, when its outputs are in the
    local cache; None otherwise (a dependency missing, never run with these inputs, outputs gone from the cache). DVC
    has no public API for a run-cache entry: it is read through `vlbench.adapters.dvc`."""
    from dvc.exceptions import DvcException

    from vlbench.adapters import dvc as dvc_private

    try:
        cached = dvc_private.run_cache_entry(repo, stage)
    except DvcException:
        return None
    return cached if cached is not None and cached.outs_cached() else None


def _on_remote(repo, stages: tuple) -> tuple[list[bool | None], dict[str, Any]]:
    """Per stage (None: outputs unknown here), whether all its cached outputs are on the default remote, from one
    `dvc status -c` query; every answer None, with the reason, when there is no remote or it cannot be reached."""
    name = repo.config["core"].get("remote")
    unknown = [None] * len(stages)
    if not name:
        return unknown, {"name": None, "reason": "no default DVC remote configured"}
    try:
        objs = [{o for odb, ids in s.get_used_objs().items() if odb is None for o in ids} if s else None
                for s in stages]
        result = repo.cloud.status(set().union(*(o for o in objs if o)))
    except Exception as err:  # noqa: BLE001 - any backend's failure (network, credentials, config) means "unknown"
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        return unknown, {"name": name, "reason": f"remote {name!r} cannot be reached: {first}"}
    absent = result.new | result.missing
    return [None if o is None else not (o & absent) for o in objs], {"name": name, "reason": None}


def _rows(folder: Path) -> int | None:
    import pyarrow.parquet as pq

    if not folder.is_dir():
        return None
    return sum(pq.ParquetFile(p).metadata.num_rows for p in sorted(folder.glob("*.parquet")))


def image_count(params: Mapping[str, Any], dataset: str) -> int | None:
    """Images of every split: from the prepared classes.json, else the catalogue (no download); None if unknown."""
    splits = describe(dataset, dataset_entry(params, dataset))["splits"]
    return sum(splits.values()) if splits else None


# What each embedding stage embeds, by its dvc.yaml name: (images of the dataset, texts of the folder it reads).
EMBED_COUNTS = {
    "embed_images": lambda params, d: (image_count(params, d), None),
    "embed_texts": lambda params, d: (None, _rows(texts_dir(d))),
    "embed_knowledge": lambda params, d: (None, _rows(knowledge_dir(d))),
}


def stage_counts(params: Mapping[str, Any], name: str) -> tuple[int | None, int | None]:
    group, _, dataset = name.partition("@")
    count = EMBED_COUNTS.get(group)
    return count(params, dataset) if count else (None, None)


def manual_downloads(params: Mapping[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    """The suite's datasets that need files fetched by hand (catalogue's manual_download) and are not prepared yet."""
    todo = {row["name"].partition("@")[2] for row in rows if row["name"].startswith("prepare@")
            and row["status"] != "up to date"}
    return [d for d in params["suite"]["datasets"]
            if d in todo and describe(d, dataset_entry(params, d))["manual_download"]]


def measure_decode_seconds(load, datasets: list[str], sample: int = DECODE_SAMPLE) -> tuple[float | None, int]:
    """Seconds per image of `load` (a decoder's worker step: bytes to the model's input, `vlbench.decoding`) in one
    process, over the first `sample` images of the first split of each prepared dataset; (None, 0) when none is
    prepared."""
    import pyarrow.parquet as pq

    images = []
    for dataset in datasets:
        if (prepared_dir(dataset) / "classes.json").is_file():
            meta = load_meta(prepared_dir(dataset))
            batch = next(pq.ParquetFile(split_path(prepared_dir(dataset), next(iter(meta.splits)))).iter_batches(
                batch_size=sample, columns=["image"]), None)
            images += batch.column("image").to_pylist() if batch is not None else []
    if not images:
        return None, 0
    load(images[0])  # untimed: the decoders' and transforms' first-call costs
    start = time.perf_counter()
    for data in images:
        load(data)
    return (time.perf_counter() - start) / len(images), len(images)


def estimate(model_cfg: Mapping[str, Any], images: int, datasets: list[str], device: str | None,
             warmup: bool, decoding: str = "pil", cap_s: float = rates.CAP_S,
             cap_bytes: int = rates.CAP_BYTES) -> dict[str, Any]:
    """{"seconds", "device", "images_per_second", "rate", "reason"}: images / the stage's rate, from the model's rate
    (`rate`: measured in a capped child process, cached from an earlier plan, or estimated from FLOPs:
    vlbench.models.rates) and the measured decode cost (of `decoding`, the params' embed.decode: what the workers run;
    with `torchvision` the JPEG decoding runs on the device and is not counted) spread over the stage's DataLoader
    workers, whichever is slower (docs/benchmarks.md, "The plan's estimate": how close this comes to the stage)."""
    from vlbench.models.loading import pick_device

    dev = pick_device(device)
    unknown = {"seconds": None, "device": describe_device(dev), "images_per_second": None, "rate": None}
    if not warmup:
        return {**unknown, "reason": "warm-up skipped (--no-warmup)"}
    if not images:
        return {**unknown, "seconds": 0.0, "reason": "no image to embed"}
    from vlbench.decoding import decoder
    from vlbench.embed import default_workers

    arch = rates.architecture(model_cfg)
    model = rates.model_rate(model_cfg, arch, dev, cap_s=cap_s, cap_bytes=cap_bytes)
    decode, sampled = measure_decode_seconds(decoder(decoding, arch.preprocess, dev, model_cfg["slug"]).worker,
                                             datasets)
    workers = default_workers(dev)
    rate = model.value if decode is None else min(model.value, workers / decode)
    how = model.how + "; " + (f"decoding {1 / decode:.0f} img/s per worker x {workers} workers, from {sampled} "
                              "prepared images" if decode else
                              "decoding not included (no dataset of the plan is prepared yet)")
    return {"seconds": images / rate, "device": unknown["device"], "images_per_second": rate, "rate": model.source,
            "reason": how}


def make_plan(params: Mapping[str, Any], device: str | None = None, warmup: bool = True) -> dict[str, Any]:
    """The plan for composed `params` (see the module's docstring): stages, counts, caches, manual files, estimate."""
    stages, remote = stage_statuses(params)
    todo = [row for row in stages if row["status"] != "up to date"]
    for row in stages:
        row["images"], row["texts"] = stage_counts(params, row["name"])
    embedded = [row["name"].partition("@")[2] for row in todo if row["name"].startswith("embed_images@")]
    images = sum(row["images"] or 0 for row in todo)
    plan = {"model": params["model"]["slug"], "suite": params["suite"]["slug"], "stages": stages, "images": images,
            "texts": sum(row["texts"] or 0 for row in todo), "manual_downloads": manual_downloads(params, stages),
            "remote": remote}
    return {**plan, "estimate": estimate(params["model"], images, embedded, device, warmup,
                                         params.get("embed", {}).get("decode", "pil")),
            "finetune": finetune_plan(params, [row["name"] for row in todo], device, warmup)}


def finetune_plan(params: Mapping[str, Any], todo: list[str], device: str | None, warmup: bool) -> dict[str, Any]:
    """The passes of the held-out search and FewTrans fine-tuning stages that would run, and their device time
    (vlbench/finetune/passes.py); {"stages": [], "estimate": None} when none would run (torch not imported)."""
    if not any(name.partition("@")[0] in FINETUNE_STAGES for name in todo):
        return {"stages": [], "estimate": None}
    from vlbench.finetune import passes  # torch: only where fine-tuning is planned

    return passes.plan(params, todo, device, warmup)


def summary(plan: Mapping[str, Any], arch: str) -> str:
    """One line: "toy (vlbench-toy) on suite demo: 41k images, ~3 min on this CPU, 1 dataset needs manual files"."""
    est = plan["estimate"]
    where = "this GPU" if est["device"].startswith("cuda") else "this CPU"
    time_ = f"~{_duration(est['seconds'])} on {where}" if est["seconds"] is not None else "time unknown"
    time_ += f" (model rate {est['rate']})" if est.get("rate") else ""
    manual = plan["manual_downloads"]
    files = f"{len(manual)} dataset{'s' if len(manual) != 1 else ''} need{'s' if len(manual) == 1 else ''} manual files"
    files += f" ({', '.join(manual)})" if manual else ""
    unknown = [row["name"] for row in plan["stages"] if row["status"] != "up to date"
               and row["name"].partition("@")[0] in EMBED_COUNTS and row["images"] is None and row["texts"] is None]
    counted = f" (+ {len(unknown)} embed stages whose inputs are not prepared yet)" if unknown else ""
    return f"{plan['model']} ({arch}) on suite {plan['suite']}: {_count(plan['images'])} images, " \
           f"{_count(plan['texts'])} texts{counted}, {time_}, {files}"


def _count(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k" if n >= 1e4 else str(n)


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{max(1, round(seconds / 60))} min" if seconds >= 60 \
        else f"{seconds:.0f} s"
