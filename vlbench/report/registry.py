"""The report's part of each analysis, keyed by its name in `vlbench.analyses.ANALYSES`: the charts it draws and the
summary that adds its cross-dataset numbers. The analyses table holds what an analysis is (its module, title, headline
metrics, the text of its page section, its tables); what the report draws of it is here, where the functions live.

`CHARTS[name]`: functions `f(analysis, results, metrics, out_dir) -> list[Path]` (results: {dataset: result JSON};
metrics: all of reports/metrics.json) writing SVGs under reports/plots; an analysis not listed gets the bar chart
alone (`DEFAULT_CHARTS`). `SUMMARIES[name]`: `f(metrics, results) -> metrics` adding cross-dataset numbers (adapt's
means). A new analysis that draws more than the bar chart adds its entry here (docs/architecture.md, "Adding things").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vlbench.report import adapt, extensibility, finetune, plots, robustness

Chart = Callable[[str, Mapping[str, Any], Mapping[str, Any], Path], list[Path]]
Summary = Callable[[dict[str, Any], Mapping[str, Mapping[str, Any]]], dict[str, Any]]

DEFAULT_CHARTS: tuple[Chart, ...] = (plots.bars,)
CHARTS: dict[str, tuple[Chart, ...]] = {
    "zeroshot": (plots.bars, plots.knowledge_variants),
    "specificity": (plots.bars, plots.specificity_heatmap),
    "granularity": (plots.bars, plots.granularity_levels),
    "adapt": (plots.bars, adapt.shots_chart),
    "extensibility": (plots.bars, extensibility.charts),
    "robustness": (robustness.charts,),
    "finetune": (plots.bars, finetune.method_charts),
}
SUMMARIES: dict[str, Summary] = {"adapt": adapt.summary}


def charts_of(analysis: str) -> tuple[Chart, ...]:
    """The charts the report draws for `analysis`, in order."""
    return CHARTS.get(analysis, DEFAULT_CHARTS)
