"""Aggregate per-dataset results into reports/metrics.json, reports/model.json, reports/reference.json (the verdicts
against the papers' tables) and one chart per analysis."""

from __future__ import annotations

from typing import Any, Mapping

from vlbench.io import write_json
from vlbench.results import PLOTS_DIR, REFERENCE_FILE, collect, read_result, write_metrics


def write_report(datasets_by_analysis: Mapping[str, list[str]]) -> dict[str, Any]:
    metrics, model = collect(datasets_by_analysis)
    if datasets_by_analysis.get("adapt"):  # adapt.mean: the mean over datasets of each key (the ELEVATER score)
        from vlbench.report.adapt import with_means, with_vtab_groups

        metrics = with_means(metrics)
        metrics = with_vtab_groups(metrics, {d: read_result("adapt", d) for d in datasets_by_analysis["adapt"]})
    write_metrics(metrics, model)
    write_json(REFERENCE_FILE, reference(datasets_by_analysis, metrics, model))
    from vlbench.report.plots import write_plots

    PLOTS_DIR.mkdir(parents=True, exist_ok=True)  # a declared output, even for a suite without analyses
    write_plots(metrics, PLOTS_DIR)
    if datasets_by_analysis.get("adapt"):  # the test metric against shots (ELEVATER probing), zero-shot at 0
        from vlbench.report.adapt import write_shots_plot

        write_shots_plot(metrics, PLOTS_DIR)
    if datasets_by_analysis.get("granularity"):  # mAP per WordNet level, from the results' details
        from vlbench.report.plots import write_granularity_levels

        write_granularity_levels({d: read_result("granularity", d) for d in datasets_by_analysis["granularity"]},
                                 PLOTS_DIR)
    if datasets_by_analysis.get("specificity"):  # Table 3 as a heat map, with chance levels, from the results' details
        from vlbench.report.plots import write_specificity_heatmap

        write_specificity_heatmap({d: read_result("specificity", d) for d in datasets_by_analysis["specificity"]},
                                  PLOTS_DIR)
    if datasets_by_analysis.get("zeroshot"):  # the dataset metric per knowledge variant, from the results' details
        from vlbench.report.plots import write_knowledge_variants

        write_knowledge_variants({d: read_result("zeroshot", d) for d in datasets_by_analysis["zeroshot"]}, PLOTS_DIR)
    if datasets_by_analysis.get("extensibility"):  # per-step curves and per-group drops, from the results' details
        from vlbench.report.extensibility import write_extensibility_plots

        write_extensibility_plots({d: read_result("extensibility", d) for d in datasets_by_analysis["extensibility"]},
                                  PLOTS_DIR)
    return metrics


def reference(datasets_by_analysis: Mapping[str, list[str]], metrics: Mapping[str, Any],
              model: Mapping[str, Any]) -> dict[str, Any]:
    """reports/reference.json: every headline number that has a published one, with its verdict."""
    from vlbench.reference import load_tables
    from vlbench.reference.compare import reference_report

    results = {a: {d: read_result(a, d) for d in ds} for a, ds in datasets_by_analysis.items()}
    return reference_report(load_tables(), metrics, model, results)
