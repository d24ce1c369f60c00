"""Aggregate per-dataset results into reports/metrics.json, reports/model.json and one chart per analysis."""

from __future__ import annotations

from typing import Any, Mapping

from vlbench.results import PLOTS_DIR, collect, write_metrics


def write_report(datasets_by_analysis: Mapping[str, list[str]]) -> dict[str, Any]:
    metrics, model = collect(datasets_by_analysis)
    write_metrics(metrics, model)
    from vlbench.report.plots import write_plots

    PLOTS_DIR.mkdir(parents=True, exist_ok=True)  # a declared output, even for a suite without analyses
    write_plots(metrics, PLOTS_DIR)
    return metrics
