"""The `adapt` analysis (issue 11): how well a model transfers with few or many labels, on cached features only.

`run(inputs, cfg, seed)` runs the protocols that `cfg["protocols"]` names (default: all of `PROTOCOLS`), each a module
of this package with `evaluate(inputs, cfg[<protocol>], seed) -> ProtocolResult` (`protocol.py`), and merges them into
one `Result`: metrics as the protocols key them ("elevater/...", "vtab/...", "fewtrans/..."), counts prefixed with the
protocol, details under the protocol's name, and the tables of `PROTOCOL_TABLES` (every one is written, empty for a
protocol that did not run, because dvc.yaml declares them as outputs of `adapt@<dataset>`).
Docs: docs/protocols.md "Adapt: ELEVATER linear probing" (and the VTAB-1k and FewTrans sections).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from vlbench.analyses.adapt.protocol import AdaptError, ProtocolResult
from vlbench.results import Result

PROTOCOLS = ("elevater", "vtab", "fewtrans")
# The tables each protocol writes as reports/adapt/<dataset>.<table>.parquet; dvc.yaml's adapt block lists them all.
PROTOCOL_TABLES: dict[str, tuple[str, ...]] = {"elevater": ("elevater_search", "elevater_predictions"), "vtab": ("vtab_predictions",),
                                                "fewtrans": ("episodes",)}


def protocols(cfg: Mapping[str, Any]) -> list[str]:
    names = list(cfg.get("protocols", PROTOCOLS) or [])
    unknown = [p for p in names if p not in PROTOCOLS]
    if unknown or not names:
        raise AdaptError(f"params.yaml: adapt.protocols {names!r} must be a non-empty list drawn from {list(PROTOCOLS)}")
    return names


def evaluate(name: str, inputs, cfg: Mapping[str, Any], seed: int) -> ProtocolResult:
    module = importlib.import_module(f"vlbench.analyses.adapt.{name}")
    result = module.evaluate(inputs, dict(cfg.get(name) or {}), seed)
    bad = [k for k in result.metrics if not k.startswith(f"{name}/")]
    extra = sorted(set(result.tables) - set(PROTOCOL_TABLES[name]))
    if bad or extra:
        raise AdaptError(f"adapt protocol {name!r}: metric keys {bad} lack the prefix '{name}/' or tables {extra} are "
                         f"not declared in PROTOCOL_TABLES (and dvc.yaml)")
    return result


def placeholder_table(protocol: str) -> pa.Table:
    """What a declared table holds when its protocol did not run: no rows, one column saying so."""
    return pa.table({f"{protocol}_not_run": pa.array([], pa.string())})


def run(inputs, cfg: Mapping[str, Any], seed: int):
    metrics: dict[str, float] = {}
    counts: dict[str, int] = {"classes": len(inputs.meta.classes)}
    details: dict[str, Any] = {}
    facts: dict[str, Any] = {}
    intervals: dict[str, dict[str, Any]] = {}
    tables = {t: placeholder_table(p) for p, names in PROTOCOL_TABLES.items() for t in names}
    chosen = protocols(cfg)
    for name in chosen:
        result = evaluate(name, inputs, cfg, seed)
        metrics.update({k: float(v) for k, v in result.metrics.items()})
        counts.update({f"{name}/{k}": int(v) for k, v in result.counts.items()})
        details[name] = result.details
        tables.update(result.tables)
        intervals.update(result.intervals)
        if result.run:
            facts[name] = result.run
    params = {"protocols": chosen, **{p: dict(cfg.get(p) or {}) for p in chosen}, "seed": seed}
    return Result(metrics, counts, params, tables, details, facts, intervals)
