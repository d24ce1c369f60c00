"""Static, offline plots of reports/metrics.json: one SVG bar chart per analysis.

`dvc plots show` draws data files through an HTML page that loads Vega from a CDN (blank offline), and a
single summary CSV overlapped the bars of different analyses. Here each analysis gets its own
`<analysis>.svg`, rendered from a Vega-Lite spec by vl-convert (no browser, no network); DVC shows such
files as images (dvc.yaml declares the folder once), and the numbers themselves are in metrics.json. The output is a
pure function of the metrics: the same numbers give byte-identical files, so DVC sees no spurious change.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Mapping

from vlbench.io import atomic_path

VALUE_FORMAT = "{:.3f}"          # the value printed on each bar
BAR_STEP = 28                    # px per bar
CHART_WIDTH = 480                # px, the 0..1 axis
INSIDE_FROM = 0.5                # bars at least this long carry their label inside, others just after
# dark colours that keep white bold labels readable (ColorBrewer Dark2 with its yellow swapped for blue)
PALETTE = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#1f78b4", "#a6761d", "#66a61e", "#666666")
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def analyses(metrics: Mapping[str, Any]) -> dict[str, list[tuple[str, str, float]]]:
    """{analysis: [(dataset, metric, value), ...]} in the order of `metrics`.

    An analysis is a top-level entry whose value maps datasets to dicts of numbers; anything else (the
    model fingerprint, a version string) is ignored, as are non-numeric values inside a dataset's dict.
    """
    out: dict[str, list[tuple[str, str, float]]] = {}
    for analysis, per_dataset in metrics.items():
        if not isinstance(per_dataset, Mapping) or not per_dataset:
            continue
        if not all(isinstance(v, Mapping) for v in per_dataset.values()):
            continue
        rows = [(str(dataset), str(name), float(value))
                for dataset, values in per_dataset.items()
                for name, value in values.items() if _is_number(value)]
        if rows:
            out[str(analysis)] = rows
    return out


def _label(metric: str, value: float) -> str:
    return f"{metric} {VALUE_FORMAT.format(value)}" if math.isfinite(value) else f"{metric} n/a"


def vegalite_spec(analysis: str, rows: list[tuple[str, str, float]]) -> dict[str, Any]:
    """Horizontal bars on a 0..1 axis, one per (dataset, metric), each labelled "metric value".

    Bars are coloured by metric, over this chart's metrics sorted by name: a chart depends on its own
    analysis only, so a change elsewhere in metrics.json never rewrites it.
    """
    metric_names = sorted({m for _, m, _ in rows})
    values = []
    for i, (dataset, metric, value) in enumerate(rows):
        finite = math.isfinite(value)
        values.append({
            "key": f"{i:04d}",                       # one band per (dataset, metric), in input order
            "dataset": dataset,
            "metric": metric,
            "value": value if finite else None,
            "label": _label(metric, value),
            # bars long enough hold their label inside (white on colour), short ones just after the end
            "inside": bool(finite and value >= INSIDE_FROM),
        })
    datasets_by_key = {v["key"]: v["dataset"] for v in values}
    # the y axis names each dataset once: on its first band; a dataset's further metrics get no repeat
    first_key: dict[str, str] = {}
    for v in values:
        first_key.setdefault(v["dataset"], v["key"])
    axis_labels = {k: (d if first_key[d] == k else "") for k, d in datasets_by_key.items()}
    label_expr = "".join(f"datum.value === {json.dumps(k)} ? {json.dumps(lbl)} : "
                         for k, lbl in axis_labels.items()) + "''"

    # explicit order: a band whose bar is filtered out (value n/a) must not drift to the end
    y = {"field": "key", "type": "nominal", "sort": list(datasets_by_key), "title": None,
         "axis": {"labelExpr": label_expr, "labelFontSize": 13, "labelLimit": 400, "ticks": False,
                  "domain": False, "labelPadding": 6}}
    x = {"field": "value", "type": "quantitative", "title": None,
         "scale": {"domain": [0, 1], "clamp": True, "nice": False, "zero": True},
         "axis": {"values": [0, 0.2, 0.4, 0.6, 0.8, 1.0], "format": ".1f", "labelFontSize": 12,
                  "labelFlush": False, "grid": True, "gridColor": "#e5e5e5"}}
    text_common = {"type": "text", "baseline": "middle", "fontSize": 12}
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": {"text": analysis, "fontSize": 16, "anchor": "start", "offset": 10},
        "background": "white",
        "padding": 12,
        "width": CHART_WIDTH,
        "height": {"step": BAR_STEP},
        "data": {"values": values},
        "encoding": {"y": y},
        "layer": [
            {"mark": {"type": "bar", "height": {"band": 0.78}},    # values past 1 are clamped, not clipped
             "encoding": {"x": x,
                          "color": {"field": "metric", "type": "nominal", "legend": None,
                                    "scale": {"domain": metric_names, "range": list(PALETTE)}},
                          "tooltip": [{"field": "dataset"}, {"field": "metric"},
                                      {"field": "value", "format": ".4f"}]}},
            {"transform": [{"filter": "datum.inside"}],
             "mark": {**text_common, "align": "right", "dx": -6, "color": "white", "fontWeight": "bold"},
             "encoding": {"x": {"field": "value", "type": "quantitative"}, "text": {"field": "label"}}},
            {"transform": [{"filter": "!datum.inside"},
                           {"calculate": "isValid(datum.value) ? datum.value : 0", "as": "at"}],
             "mark": {**text_common, "align": "left", "dx": 6, "color": "#222222"},
             "encoding": {"x": {"field": "at", "type": "quantitative"}, "text": {"field": "label"}}},
        ],
        "config": {"view": {"stroke": None}, "font": "DejaVu Sans, Liberation Sans, Arial, sans-serif"},
    }


_SVG_ID = re.compile(r'\bid="([A-Za-z_-]+?)(\d+)"')


def _renumber_ids(svg: str) -> str:
    """Vega numbers clip paths and gradients with process-wide counters (clip1, clip3, ...): renumber them
    per document, in order of appearance, so that the same chart gives the same bytes in any process."""
    mapping: dict[str, str] = {}
    counters: dict[str, int] = {}
    for prefix, number in _SVG_ID.findall(svg):
        old = f"{prefix}{number}"
        if old not in mapping:
            counters[prefix] = counters.get(prefix, 0) + 1
            mapping[old] = f"{prefix}{counters[prefix]}"
    if not mapping:
        return svg
    pattern = re.compile(r'(id="|#)(' + "|".join(map(re.escape, sorted(mapping, key=len, reverse=True))) + r')(?=[")])')
    return pattern.sub(lambda m: m.group(1) + mapping[m.group(2)], svg)


def render_svg(spec: Mapping[str, Any]) -> str:
    """SVG text of a Vega-Lite spec, rendered offline (Vega-Lite 5.21 pinned inside vl-convert)."""
    import vl_convert  # imported here so that importing vlbench.report does not need it

    return _renumber_ids(vl_convert.vegalite_to_svg(dict(spec), vl_version="5.21"))


def _check_name(analysis: str) -> None:
    if not _SAFE_NAME.fullmatch(analysis):
        raise ValueError(f"analysis name {analysis!r} is not usable as a file name")


def write_plots(metrics: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Write `<out_dir>/<analysis>.svg` per analysis; return the paths.

    `metrics` has the shape of reports/metrics.json: `{analysis: {dataset: {metric: value}}}`; other
    top-level entries (the model fingerprint) are skipped. Files are written atomically, in the order of
    `metrics`. Files of analyses no longer present are left alone.
    """
    out_dir = Path(out_dir)
    written: list[Path] = []
    for analysis, rows in analyses(metrics).items():
        _check_name(analysis)
        svg_path = out_dir / f"{analysis}.svg"
        svg = render_svg(vegalite_spec(analysis, rows))
        with atomic_path(svg_path) as tmp:
            tmp.write_text(svg if svg.endswith("\n") else svg + "\n", encoding="utf-8")
        written.append(svg_path)
    return written
