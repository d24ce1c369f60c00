"""Aggregate per-dataset results into reports/metrics.json, reports/model.json, reports/reference.json (the verdicts
against the papers' tables), the charts `vlbench.report.registry` gives each analysis of `vlbench.analyses.ANALYSES`,
and reports/index.html (the page people read): one loop over the table, each result file read once."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vlbench.analyses import ANALYSES
from vlbench.dataset_entries import dataset_entry
from vlbench.datasets.registry import declared_metric
from vlbench.io import atomic_path, write_json
from vlbench.params import get
from vlbench.reference import load_tables
from vlbench.reference.datacomp import DERIVED, cell_value
from vlbench.reference.verdicts import reference_report
from vlbench.report.html import index_page
from vlbench.report.registry import SUMMARIES, charts_of
from vlbench.results import PLOTS_DIR, REFERENCE_FILE, REPORTS, model_of, read_result, write_metrics

INDEX_FILE = REPORTS / "index.html"


def report_datasets(params: Mapping[str, Any]) -> dict[str, list[str]]:
    """{analysis: [dataset, ...]} the suite reports, in table order; analyses without datasets left out. The
    dataset-level vocabularies (stage extensibility_sets@<name>) report under extensibility, each by its name."""
    datasets = {a: list(get(params, f"suite.{a}", list)) for a in ANALYSES}
    datasets["extensibility"] = datasets["extensibility"] + list(params["suite"].get("extensibility_sets") or {})
    return {a: d for a, d in datasets.items() if d}


def read_results(datasets_by_analysis: Mapping[str, list[str]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{analysis: {dataset: result JSON}}, each file read once."""
    return {a: {d: read_result(a, d) for d in ds} for a, ds in datasets_by_analysis.items() if ds}


def headline(results: Mapping[str, Mapping[str, Mapping[str, Any]]], declared: Mapping[str, str] | None = None
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """({analysis: {dataset: metrics}} with each analysis's summary applied (`vlbench.report.registry.SUMMARIES`),
    the model fingerprint of the results). `declared`: {dataset: the metric its entry declares} (`declared_metrics`);
    where an analysis reports the dataset's metric and that one is the mean of two of its numbers (DataComp's mean
    recall@1 of a retrieval task, `vlbench.reference.datacomp.DERIVED`), the metrics gain it."""
    declared = declared or {}
    metrics: dict[str, Any] = {a: {d: _with_declared(a, r["metrics"], declared.get(d)) for d, r in per.items()}
                               for a, per in results.items()}
    first = next((r for per in results.values() for r in per.values()), None)
    model = model_of(first["fingerprint"]) if first else {}
    for analysis in results:
        if analysis in SUMMARIES:
            metrics = SUMMARIES[analysis](metrics, results[analysis])
    return metrics, model


def _with_declared(analysis: str, values: Mapping[str, Any], declared: str | None) -> Mapping[str, Any]:
    if not ANALYSES[analysis].dataset_metric or declared is None or declared in values or declared not in DERIVED:
        return values
    value = cell_value(values, declared)
    return values if value is None else {**values, declared: value}


def declared_metrics(params: Mapping[str, Any]) -> dict[str, str]:
    """{dataset: the metric its entry declares} for the suite's datasets (vlbench.datasets.registry.declared_metric)."""
    out = {}
    for name in get(params, "suite.datasets", Mapping):
        metric = declared_metric(name, dataset_entry(params, name))
        if metric:
            out[name] = metric
    return out


def headline_numbers(metrics: Mapping[str, Mapping[str, Mapping[str, Any]]],
                     declared: Mapping[str, str] | None = None) -> dict[str, Any]:
    """reports/headline.json: {analysis: {dataset: {metric: value}}}, each dataset's main number (Analysis.main_metric:
    the metric the dataset's entry declares, `declared`, where the analysis reports it); summary rows (adapt's `mean`)
    included."""
    declared = declared or {}
    out: dict[str, Any] = {}
    for analysis, per_dataset in metrics.items():
        for dataset, values in per_dataset.items():
            key = ANALYSES[analysis].main_metric(values, declared.get(dataset))
            if key is not None:
                out.setdefault(analysis, {})[dataset] = {key: values[key]}
    return out


def write_charts(results: Mapping[str, Mapping[str, Any]], metrics: Mapping[str, Any],
                 out_dir: Path) -> dict[str, list[Path]]:
    """{analysis: [SVG written]}: every chart of each analysis (`vlbench.report.registry.charts_of`)."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)  # a declared output, even for a suite without analyses
    return {a: [p for chart in charts_of(a) for p in chart(a, results[a], metrics, out_dir)]
            for a in results}


def write_report(datasets_by_analysis: Mapping[str, list[str]], run: Mapping[str, Any] | None = None,
                 declared: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Everything `report` writes; `run`: what the page says about reproducing it ({"model", "suite"}); `declared`:
    {dataset: the metric its entry declares} (`declared_metrics`)."""
    results = read_results(datasets_by_analysis)
    metrics, model = headline(results, declared)
    write_metrics(metrics, model, headline_numbers(metrics, declared))
    ref = reference(results, metrics, model)
    write_json(REFERENCE_FILE, ref)
    charts = write_charts(results, metrics, PLOTS_DIR)
    page = index_page(model=model, metrics=metrics, results=results, reference=ref, charts=charts, run=run or {},
                      declared=declared)
    with atomic_path(INDEX_FILE) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return metrics


def reference(results: Mapping[str, Mapping[str, Any]], metrics: Mapping[str, Any],
              model: Mapping[str, Any]) -> dict[str, Any]:
    """reports/reference.json: every headline number that has a published one, with its verdict."""
    return reference_report(load_tables(), metrics, model, results)
