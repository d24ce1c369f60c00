"""Report piece of the `robustness` analysis: `robustness.svg`, the reference accuracy against each shift's accuracy
on logit axes (Taori et al. 2020, Fig. 1; CLIP Fig. 13): per shift its reference line (robustness_lines.json, the
coefficients the result records) and this model's point, whose height above the line is its effective robustness.
Drawn from the results alone (reports/robustness/<shift>.json)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vlbench.io import atomic_path
from vlbench.report.plots import PALETTE, render_svg

CHART_FILE = "robustness.svg"
LINE_POINTS = np.linspace(-4.0, 4.0, 33)  # logit x from 1.8% to 98.2%
TICKS = (0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98)
FONT = "DejaVu Sans, Liberation Sans, Arial, sans-serif"


def _logit(p: float) -> float:
    p = min(max(float(p), 1e-4), 1 - 1e-4)  # a perfect or zero accuracy still gets a point, at the axis' edge
    return float(np.log(p / (1 - p)))


def chart_rows(results: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """[{dataset, kind: line|model, lx, ly, ...}]: each shift's line at LINE_POINTS and this model's point."""
    rows = []
    for dataset, result in results.items():
        m, p = result["metrics"], result["params"]
        rows += [{"dataset": dataset, "kind": "line", "lx": float(x), "ly": float(p["slope"] * x + p["intercept"])}
                 for x in LINE_POINTS]
        rows.append({"dataset": dataset, "kind": "model", "lx": _logit(m["reference_accuracy"]),
                     "ly": _logit(m["accuracy"]), "reference_accuracy": m["reference_accuracy"],
                     "accuracy": m["accuracy"], "effective_robustness": m["effective_robustness"],
                     "line": p["line"]})
    return rows


def chart_spec(rows: list[dict[str, Any]], reference: str) -> dict[str, Any]:
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    ticks = [_logit(t) for t in TICKS]
    axis = {"values": ticks, "labelExpr": "format(1 / (1 + exp(-datum.value)), '.0%')", "grid": True}
    scale = {"domain": [ticks[0], ticks[-1]], "nice": False}
    color = {"field": "dataset", "type": "nominal", "title": None,
             "scale": {"domain": datasets, "range": list(PALETTE[:len(datasets)] * (len(datasets) // len(PALETTE) + 1))[:len(datasets)]},
             "legend": {"orient": "bottom", "columns": 3}}
    x = {"field": "lx", "type": "quantitative", "title": f"{reference} accuracy (logit axis)", "axis": axis,
         "scale": scale}
    y = {"field": "ly", "type": "quantitative", "title": "accuracy under the shift (logit axis)", "axis": axis,
         "scale": scale}
    tooltip = [{"field": "dataset"}, {"field": "accuracy", "format": ".4f"},
               {"field": "reference_accuracy", "format": ".4f"}, {"field": "effective_robustness", "format": "+.4f"},
               {"field": "line"}]
    return {"$schema": "https://vega.github.io/schema/vega-lite/v5.json",
            "title": {"text": ["robustness: accuracy under each shift vs in-distribution accuracy",
                               "lines: reference fits; points: this model (height above its line = effective "
                               "robustness)"], "fontSize": 13, "anchor": "start"},
            "background": "white", "padding": 12, "width": 420, "height": 420, "data": {"values": rows},
            "layer": [
                {"transform": [{"filter": "datum.kind === 'line'"}], "mark": {"type": "line", "clip": True},
                 "encoding": {"x": x, "y": y, "color": color, "detail": {"field": "dataset"}}},
                {"transform": [{"filter": "datum.kind === 'model'"}],
                 "mark": {"type": "point", "filled": True, "size": 90},
                 "encoding": {"x": x, "y": y, "color": color, "tooltip": tooltip}},
            ],
            "config": {"font": FONT, "view": {"stroke": "#dddddd"}}}


def write_chart(results: Mapping[str, Mapping[str, Any]], out_dir: Path) -> Path | None:
    rows = chart_rows(results)
    if not rows:
        return None
    references = sorted({r["params"]["reference"] for r in results.values()})
    svg = render_svg(chart_spec(rows, " / ".join(references)))
    path = Path(out_dir) / CHART_FILE
    with atomic_path(path) as tmp:
        tmp.write_text(svg if svg.endswith("\n") else svg + "\n", encoding="utf-8")
    return path


def charts(analysis: str, results: Mapping[str, Mapping[str, Any]], metrics: Mapping[str, Any],
           out_dir: Path) -> list[Path]:
    path = write_chart(results, out_dir)
    return [] if path is None else [path]
