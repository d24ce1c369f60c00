"""The one owner of result paths and the result file format.

`reports/<analysis>/<dataset>.json`: {analysis, dataset, metrics, intervals?, counts, params, details?, fingerprint,
vlbench_version}; `intervals`: {metric: {low, high, level, method, resamples?, seed?}} (vlbench.stats.Interval.to_json)
(a plain output, in git); `reports/<analysis>/<dataset>.<table>.parquet`: per-sample tables (DVC cache);
`reports/metrics.json`: {analysis: {dataset: {metric: value}}}, numbers (and a name that goes with them, e.g.
zeroshot's `knowledge_best_variant`), the one file declared as DVC metrics so `dvc exp show` stays readable;
`reports/model.json`: the model fingerprint behind those numbers; `reports/reference.json`: those numbers against
the papers' published ones (vlbench.reference.verdicts).
Paths never contain the model slug, so any two experiments are comparable.

Results hold only what the inputs determine, so a rerun of the same inputs on the same machine type writes them
byte-identical (DESIGN.md "Reruns"). Timings and other facts of one run (host, time, threads) go to
`runs/<stage>/<key>.json` instead (`write_run_facts`): git-ignored, no stage's output or dependency, so neither git
nor dvc.lock sees them; `write_result` refuses a result with a key that names a timing (`RUN_FACT_KEY`).
"""

from __future__ import annotations

import json
import os
import platform
import re
from datetime import datetime, timezone
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from vlbench import __version__
from vlbench.errors import VlbenchError
from vlbench.io import atomic_path, write_json
from vlbench.params import check_name
from vlbench.paths import REPORTS

METRICS_FILE = REPORTS / "metrics.json"  # every number; `dvc metrics diff --targets reports/metrics.json`
HEADLINE_FILE = REPORTS / "headline.json"  # one number per analysis and dataset: dvc.yaml's metrics (dvc exp show)
MODEL_FILE = REPORTS / "model.json"
PLOTS_DIR = REPORTS / "plots"
REFERENCE_FILE = REPORTS / "reference.json"  # the run's headline numbers against the papers' (vlbench.reference)
RUNS = Path("runs")  # run facts (timings, host): git-ignored, no stage's output or dependency
MODEL_KEYS = ("model", "arch", "pretrained", "weights_sha256", "precision", "vlbench_version")
# how the model saw images and texts and scores pairs (open_clip reference rows check them: docs/protocols.md); in
# reports/model.json where the features recorded them (features embedded before they existed have none)
RECORDED_MODEL_KEYS = ("model_preprocess", "text", "logits")
# keys of run facts, never of results: a timing differs on every run and would make committed results change
RUN_FACT_KEY = re.compile(r"(^|_)(seconds|elapsed|duration|timestamp|hostname|per_second|per_s)($|_)")


@dataclass
class Result:
    metrics: dict[str, float | str]  # the numbers people compare (they go to reports/metrics.json); str: a name
    counts: dict[str, int]
    params: dict[str, Any]  # what was used, including choices made on the way (e.g. a chosen C)
    tables: dict[str, pa.Table] = field(default_factory=dict)  # written as reports/<analysis>/<dataset>.<name>.parquet
    details: dict[str, Any] = field(default_factory=dict)  # JSON-able breakdowns (per level, chance levels); "details"
    run: dict[str, Any] = field(default_factory=dict)  # timings and other facts of this run: runs/<analysis>/<dataset>.json
    intervals: dict[str, dict[str, Any]] = field(default_factory=dict)  # metric -> vlbench.stats.Interval.to_json()


class MissingResultError(VlbenchError):
    """A result the report needs has not been computed."""


def result_path(analysis: str, dataset: str, suffix: str = ".json") -> Path:
    return REPORTS / check_name("analysis", analysis) / f"{check_name('dataset', dataset)}{suffix}"


def _metric(value: Any) -> float | str:
    """A number, or a name that goes with the numbers (zeroshot's `knowledge_best_variant`): DVC shows and diffs both."""
    return value if isinstance(value, str) else float(value)


def run_fact_keys(obj: Any, where: str = "") -> list[str]:
    """The dotted paths of the keys in `obj` (nested dicts and lists) that name a run fact (`RUN_FACT_KEY`)."""
    if isinstance(obj, Mapping):
        return [f"{where}{k}" for k in obj if RUN_FACT_KEY.search(str(k))] + [
            found for k, v in obj.items() for found in run_fact_keys(v, f"{where}{k}.")]
    if isinstance(obj, (list, tuple)):
        return [found for i, v in enumerate(obj) for found in run_fact_keys(v, f"{where}{i}.")]
    return []


def write_result(analysis: str, dataset: str, result: Result, fingerprint: Mapping[str, Any],
                 partition: Mapping[str, Any] | None = None) -> Path:
    """Write the tables, then the JSON (atomically, each): the JSON is there only when everything is; then the run
    facts (`result.run`) to runs/<analysis>/<dataset>.json. `partition`: the prepared data's
    `provenance.partition` where its builder partitions at preparation (VTAB's Caltech-101), so that two results
    show whether they were computed on the same train/test split."""
    doc = {
        "analysis": analysis, "dataset": dataset,
        **({"partition": dict(partition)} if partition else {}),
        "metrics": {k: _metric(v) for k, v in result.metrics.items()},
        **({"intervals": check_intervals(analysis, dataset, result)} if result.intervals else {}),
        "counts": dict(result.counts), "params": dict(result.params),
        **({"details": dict(result.details)} if result.details else {}),
        "fingerprint": dict(fingerprint),
        "vlbench_version": __version__,
    }
    timings = run_fact_keys(doc)
    if timings:
        raise ValueError(f"result {analysis}/{dataset}: {', '.join(timings[:5])} look like run facts (timings); "
                         f"put them in Result.run, which goes to {run_facts_path(analysis, dataset)}")
    for name, table in result.tables.items():
        with atomic_path(result_path(analysis, dataset, f".{check_name('table', name)}.parquet")) as tmp:
            pq.write_table(table, tmp)
    path = result_path(analysis, dataset)
    write_json(path, doc)
    write_run_facts(analysis, dataset, result.run)
    return path


def check_intervals(analysis: str, dataset: str, result: Result) -> dict[str, dict[str, Any]]:
    """The result's intervals, each of a numeric metric of the result."""
    unknown = [k for k in result.intervals if isinstance(result.metrics.get(k, ""), str)]
    if unknown:
        raise ValueError(f"result {analysis}/{dataset}: intervals of {', '.join(unknown)}, which are not numeric metrics")
    return {k: dict(v) for k, v in result.intervals.items()}


def run_facts_path(stage: str, key: str) -> Path:
    return RUNS / check_name("stage", stage) / f"{check_name('key', key)}.json"


def write_run_facts(stage: str, key: str, facts: Mapping[str, Any]) -> Path:
    """runs/<stage>/<key>.json: `facts` (timings, throughput) and where and when the run happened. Overwritten by
    the next run; not committed, not tracked by DVC (.gitignore)."""
    path = run_facts_path(stage, key)
    write_json(path, {"stage": stage, "key": key, "finished_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      "host": platform.node(), "cpu_count": os.cpu_count(), **dict(facts)})
    return path


def read_result(analysis: str, dataset: str) -> dict[str, Any]:
    path = result_path(analysis, dataset)
    if not path.is_file():
        raise MissingResultError(f"{path}: result missing; run the {analysis}@{dataset} stage")
    return json.loads(path.read_text())


def model_of(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """reports/model.json's content from a result's fingerprint: MODEL_KEYS, then the RECORDED_MODEL_KEYS it has."""
    return {**{k: fingerprint.get(k) for k in MODEL_KEYS},
            **{k: fingerprint[k] for k in RECORDED_MODEL_KEYS if k in fingerprint}}


def write_metrics(metrics: Mapping[str, Any], model: Mapping[str, Any], headline: Mapping[str, Any]) -> None:
    write_json(METRICS_FILE, dict(metrics))
    write_json(HEADLINE_FILE, dict(headline))
    write_json(MODEL_FILE, dict(model))
