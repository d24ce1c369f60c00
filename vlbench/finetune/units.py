"""Work units and their cache: fine-tuning's episodes and search points, run locally or on Ray, each result kept.

A unit is one piece of a fine-tuning method's work that gives a few numbers: one FewTrans episode of one method (its
whole ensemble), one point of a held-out search on one task, one ELEVATER search run. Its key is the sha256 of
(context, identity): the context holds what every unit of a run shares and what changes its numbers (the model's
fingerprint, the method and its settings, the data versions, the seed, the device type), the identity what the unit
is (method, episode, search point). Each finished unit is written at once, atomically, to `<cache>/<key>.json`
(key, identity, result and the sha256 of those three), so a kill loses only the units in flight, a rerun computes only
the missing ones, and units pulled from a teammate's DVC remote are reused. A unit file is used only as it was written:
one whose content does not match its checksum (a result edited by hand), that has no result or no checksum (written
before unit files carried one) is recomputed with a warning naming it, or stops the run in one line in strict mode
($VLBENCH_STRICT_UNITS=1); an unreadable (truncated) file or one holding another unit's key always stops it.
Callers assemble their tables from the results in the order of their unit list, never in completion order, so the
bytes do not depend on which unit finished first.

Engines (a runtime choice, never a param): `local` runs the units one after another in this process; `ray` runs one
Ray task per unit (`vlbench.embed_ray.connect`: $VLBENCH_RAY_ADDRESS or a local Ray; the portable settings reach the
workers through runtime_env), each holding one CPU and its GPU share (`gpus`, else $VLBENCH_GPUS_PER_UNIT, else 1 on a
cluster with GPUs and 0 without; 0.25 runs four units per GPU). Both engines call the same `compute_unit`: the work's
state is set up once per process (`Work.setup`, cached), every unit runs under seeds drawn from its own key (never
from a global stream) and with the torch thread count of the process that planned the run, so the numbers are the
same on both engines, bit for bit on the CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from vlbench.finetune import FinetuneError
from vlbench.io import write_json

GPUS_VARIABLE = "VLBENCH_GPUS_PER_UNIT"
STRICT_VARIABLE = "VLBENCH_STRICT_UNITS"  # 1: a unit file that fails its checksum stops the run instead of recomputing
_STATE: dict[str, Any] = {}  # per process: the token of the work set up last and its state


class UnitError(FinetuneError):
    """A unit failed; the message names its identity."""


class Work(Protocol):
    """What the units of one run share. Picklable (it travels to Ray workers); `setup()` builds the heavy state
    (model, images) once per process; `compute(state, identity)` returns a unit's JSON-able result."""

    token: str  # identifies the state setup() builds (processes reuse a state with the same token)
    threads: int  # torch threads every unit runs with (the planning process's)

    def setup(self) -> Any: ...

    def compute(self, state: Any, identity: Mapping[str, Any]) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Unit:
    key: str
    identity: dict[str, Any]


@dataclass
class Tally:
    """How a run's units were obtained: found in the cache or computed now."""

    cached: int = 0
    computed: int = 0
    engine: str = "local"
    keys: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"cached": self.cached, "computed": self.computed, "engine": self.engine}


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def make_units(context: Mapping[str, Any], identities: Sequence[Mapping[str, Any]]) -> list[Unit]:
    """One unit per identity, keyed by sha256(context, identity)."""
    return [Unit(hashlib.sha256(canonical({"context": context, "identity": i}).encode()).hexdigest(), dict(i))
            for i in identities]


def describe(identity: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in identity.items())


def checksum(doc: Mapping[str, Any]) -> str:
    """The sha256 of a unit file's key, identity and result (canonical JSON: the same before writing and after
    reading)."""
    return hashlib.sha256(canonical({k: doc.get(k) for k in ("key", "identity", "result")}).encode()).hexdigest()


def untrusted(doc: Mapping[str, Any]) -> str | None:
    """Why a unit file's content cannot be used as it is, or None."""
    if "result" not in doc:
        return "has no `result`"
    if "sha256" not in doc:
        return "has no checksum (written before unit files carried one)"
    if doc["sha256"] != checksum(doc):
        return "does not match its checksum (edited after it was written)"
    return None


class UnitCache:
    """`<root>/<key>.json` per finished unit; root None keeps results in memory only. `strict` (default
    $VLBENCH_STRICT_UNITS): a unit file that fails its checksum stops the run instead of being recomputed."""

    def __init__(self, root: str | os.PathLike | None, strict: bool | None = None):
        self.root = Path(root) if root is not None else None
        self.memory: dict[str, dict[str, Any]] = {}
        self.strict = os.environ.get(STRICT_VARIABLE, "0") not in ("", "0") if strict is None else strict

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def get(self, unit: Unit) -> dict[str, Any] | None:
        if self.root is None:
            return self.memory.get(unit.key)
        path = self.path(unit.key)
        if not path.is_file():
            return None
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise UnitError(f"{path}: unreadable unit file ({err}); delete it to recompute the unit "
                            f"({describe(unit.identity)})") from None
        if not isinstance(doc, dict):
            raise UnitError(f"{path}: not a unit file (a JSON {type(doc).__name__}); delete it to recompute the unit "
                            f"({describe(unit.identity)})")
        if doc.get("key") != unit.key:
            raise UnitError(f"{path}: holds unit {doc.get('key')!r}, not {unit.key!r}; delete it to recompute")
        why = untrusted(doc)
        if why is None:
            return doc["result"]
        if self.strict:
            raise UnitError(f"{path}: unit file {why}; delete it to recompute the unit ({describe(unit.identity)}), "
                            f"or run without ${STRICT_VARIABLE}=1")
        print(f"warning: {path}: unit file {why}: recomputing the unit ({describe(unit.identity)})", file=sys.stderr)
        return None

    def put(self, unit: Unit, result: dict[str, Any]) -> None:
        if self.root is None:
            self.memory[unit.key] = result
            return
        doc = {"key": unit.key, "identity": unit.identity, "result": result}
        write_json(self.path(unit.key), {**doc, "sha256": checksum(doc)})

    def prune(self, keep: Sequence[Unit]) -> list[Path]:
        """Delete unit files not in `keep` (the folder then holds exactly one run's units: a stage output whose
        bytes do not depend on the runs before it). Returns what was deleted."""
        if self.root is None or not self.root.is_dir():
            return []
        wanted = {u.key for u in keep}
        stale = [p for p in self.root.glob("*.json") if p.stem not in wanted]
        for p in stale:
            p.unlink()
        return stale


# ----------------------------------------------------------------------------------------------------------------
# Running one unit (both engines)


def state_of(work: Work) -> Any:
    """The work's state in this process, set up on first use (one work at a time is kept)."""
    if work.token not in _STATE:
        _STATE.clear()
        _STATE[work.token] = work.setup()
    return _STATE[work.token]


def adopt(work: Work, state: Any) -> None:
    """Make `state` this process's state of `work` (a caller that built it already: no second setup)."""
    _STATE.clear()
    _STATE[work.token] = state


def unit_seed(key: str) -> int:
    return int(key[:8], 16)


def compute_unit(work: Work, unit: Unit) -> dict[str, Any]:
    """One unit: the work's state, the planning process's thread count, seeds from the unit's key; the global
    generators are restored afterwards."""
    import torch

    state = state_of(work)
    threads = torch.get_num_threads()
    torch.set_num_threads(work.threads)
    saved = random.getstate(), np.random.get_state()
    seed = unit_seed(unit.key)
    random.seed(seed)
    np.random.seed(seed)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return work.compute(state, unit.identity)
    finally:
        torch.set_num_threads(threads)
        random.setstate(saved[0])
        np.random.set_state(saved[1])


def _failed(unit: Unit, err: BaseException | str) -> UnitError:
    what = err if isinstance(err, str) else f"{type(err).__name__}: {err}"
    return UnitError(f"unit {describe(unit.identity)} (key {unit.key[:12]}) failed: {what}")


# ----------------------------------------------------------------------------------------------------------------
# Engines


def engine_name(name: str | None) -> str:
    """`name`, else $VLBENCH_ENGINE, else local; the Ray engine's module must import."""
    from vlbench.engines import engine

    return "ray" if engine(name).__name__ == "vlbench.embed_ray" else "local"


def plan_device(engine: str | None, requested: str | None, gpus: float | None) -> str:
    """The device type the units will run on (it is part of their key: CUDA kernels and autocast change numbers):
    locally `requested` else cuda when available; on Ray cuda when units hold a GPU share, else cpu."""
    import torch

    if engine_name(engine) == "local":
        return torch.device(requested or ("cuda" if torch.cuda.is_available() else "cpu")).type
    import ray

    from vlbench.embed_ray import connect

    connect()
    return "cuda" if gpu_share(gpus, ray.cluster_resources().get("GPU", 0)) > 0 else "cpu"


def run_units(work: Work, units: Sequence[Unit], cache: UnitCache, engine: str | None = None,
              gpus: float | None = None, progress: bool = False) -> tuple[list[dict[str, Any]], Tally]:
    """The results of `units`, in their order: each from the cache, or computed on `engine` and written to the cache
    the moment it finishes. A unit that fails raises UnitError naming it (units finished before it are kept)."""
    tally = Tally(engine=engine_name(engine), keys=[u.key for u in units])
    results: dict[str, dict[str, Any]] = {}
    pending = []
    for unit in units:
        found = cache.get(unit)
        if found is None:
            pending.append(unit)
        else:
            results[unit.key] = found
    tally.cached = len(units) - len(pending)
    unique = list({u.key: u for u in pending}.values())
    run = _run_ray if tally.engine == "ray" and unique else _run_local
    for unit, result in run(work, unique, gpus, progress):
        cache.put(unit, result)
        results[unit.key] = result
        tally.computed += 1
    return [results[u.key] for u in units], tally


def _run_local(work: Work, units: Sequence[Unit], gpus, progress: bool):
    from tqdm.auto import tqdm

    for unit in tqdm(units, desc="units", disable=not progress or not units, dynamic_ncols=True):
        try:
            result = compute_unit(work, unit)
        except FinetuneError as err:
            raise _failed(unit, str(err)) from err
        except Exception as err:  # noqa: BLE001 - any failure is named with the unit's identity
            raise _failed(unit, err) from err
        yield unit, result


def gpu_share(gpus: float | None, cluster_gpus: float) -> float:
    """The GPU share each unit's task declares: `gpus`, else $VLBENCH_GPUS_PER_UNIT, else 1 with GPUs, 0 without."""
    value = gpus if gpus is not None else os.environ.get(GPUS_VARIABLE)
    if value is None or value == "":
        return 1.0 if cluster_gpus >= 1 else 0.0
    try:
        share = float(value)
    except ValueError:
        raise FinetuneError(f"--gpus-per-unit / ${GPUS_VARIABLE} must be a number, got {value!r}") from None
    if share < 0 or share > 0 and cluster_gpus < min(share, 1):
        raise FinetuneError(f"--gpus-per-unit / ${GPUS_VARIABLE} {share:g}: the cluster has {cluster_gpus:g} GPU(s) "
                            "(0 runs the units on CPUs)")
    return share


def _remote(work: Work, unit: Unit) -> dict[str, Any]:
    """A Ray task: one unit; a failure comes back as {"error": ...} so the driver names the unit."""
    try:
        return {"result": compute_unit(work, unit)}
    except Exception as err:  # noqa: BLE001
        return {"error": str(err) if isinstance(err, FinetuneError) else f"{type(err).__name__}: {err}"}


def _run_ray(work: Work, units: Sequence[Unit], gpus, progress: bool):
    import ray

    from vlbench.embed_ray import connect

    connect()
    share = gpu_share(gpus, ray.cluster_resources().get("GPU", 0))
    task = ray.remote(_remote).options(num_cpus=1, num_gpus=share)
    shipped = ray.put(work)
    futures = {task.remote(shipped, unit): unit for unit in units}
    try:
        while futures:
            done, _ = ray.wait(list(futures), num_returns=1)
            for ref in done:
                unit = futures.pop(ref)
                try:
                    answer = ray.get(ref)
                except ray.exceptions.RayError as err:
                    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
                    raise _failed(unit, f"the Ray task failed ({type(err).__name__}: {first})") from err
                if "error" in answer:
                    raise _failed(unit, answer["error"])
                yield unit, answer["result"]
    finally:
        for ref in futures:
            ray.cancel(ref)
