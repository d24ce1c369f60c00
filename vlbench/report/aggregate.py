"""Aggregate per-dataset results into reports/metrics.json (stable keys for `dvc metrics diff`) and plot data."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any, Mapping

from vlbench.io import atomic_path, write_json

ANALYSES = ("zeroshot", "linear_probe")
FINGERPRINT_KEYS = ("model", "arch", "pretrained", "weights_sha256", "precision", "vlbench_version")


def collect(reports_dir: Path, datasets_by_analysis: Mapping[str, list[str]]) -> dict[str, Any]:
    """{analysis: {dataset: {metric: value}}, "model": fingerprint}; a missing result file is an error."""
    out: dict[str, Any] = {}
    fingerprint: dict[str, Any] = {}
    for analysis, datasets in datasets_by_analysis.items():
        for dataset in datasets:
            path = reports_dir / analysis / f"{dataset}.json"
            if not path.exists():
                raise FileNotFoundError(f"{path}: result missing; run the {analysis}@{dataset} stage")
            result = json.loads(path.read_text())
            out.setdefault(analysis, {})[dataset] = result["metrics"]
            fingerprint = fingerprint or {k: result["fingerprint"].get(k) for k in FINGERPRINT_KEYS}
    out["model"] = fingerprint
    return out


def summary_rows(metrics: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        {"analysis": analysis, "dataset": dataset, "metric": name, "value": round(value, 6)}
        for analysis, per_dataset in metrics.items() if analysis != "model"
        for dataset, values in per_dataset.items()
        for name, value in values.items()
    ]


def write_report(reports_dir: Path, datasets_by_analysis: Mapping[str, list[str]]) -> dict[str, Any]:
    metrics = collect(reports_dir, datasets_by_analysis)
    write_json(reports_dir / "metrics.json", metrics)
    rows = summary_rows(metrics)
    with atomic_path(reports_dir / "plots" / "summary.csv") as tmp:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["analysis", "dataset", "metric", "value"])
            writer.writeheader()
            writer.writerows(rows)
    return metrics
