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
INSIDE_FROM = 0.5                # bars at least this long carry their label inside if it fits, others just after
LABEL_PX_PER_CHAR = 8.0          # an upper bound of a bold 12 px DejaVu Sans character's width
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


def _fits(label: str, value: float) -> bool:
    """Whether the label fits inside its bar: its width at 12 px bold (DejaVu Sans, at most ~8 px a character; an
    over-estimate puts a label outside, never cuts it) within the bar's length less the 6 px inset and a margin."""
    return len(label) * LABEL_PX_PER_CHAR + 12 <= min(value, 1.0) * CHART_WIDTH


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
            # bars long enough hold their label inside (white on colour), others just after the end (the chart
            # grows to the right to hold it: a label is never cut)
            "inside": bool(finite and value >= INSIDE_FROM and _fits(_label(metric, value), value)),
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
         "axis": {"labelExpr": label_expr, "labelFontSize": 13, "ticks": False,
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


# Vega cuts an axis label past 180 px, a legend label past 160 px, with an ellipsis: no label of ours is cut (the
# drawing grows to hold it), whatever a spec says
NO_CUT = {part: {"labelLimit": 0, "titleLimit": 0} for part in ("axis", "legend", "header")}


def render_svg(spec: Mapping[str, Any]) -> str:
    """SVG text of a Vega-Lite spec, rendered offline (Vega-Lite 5.21 pinned inside vl-convert), its axis, legend and
    header labels and titles never cut (`NO_CUT` over the spec's own config)."""
    import vl_convert  # imported here so that importing vlbench.report does not need it

    config = dict(spec.get("config") or {})
    config.update({part: {**(config.get(part) or {}), **limits} for part, limits in NO_CUT.items()})
    return _renumber_ids(vl_convert.vegalite_to_svg({**spec, "config": config}, vl_version="5.21"))


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



# ---------------------------------------------------------------------------------------------------------
# The charts the ANALYSES table names: f(analysis, results {dataset: result JSON}, metrics, out_dir) -> [paths]


def _listed(path: Path | None) -> list[Path]:
    return [] if path is None else [path]


def bars(analysis: str, results: Mapping[str, Any], metrics: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """`<analysis>.svg`: the analysis's numbers in reports/metrics.json as bars."""
    return write_plots({analysis: metrics.get(analysis) or {}}, out_dir)


def granularity_levels(analysis: str, results: Mapping[str, Any], metrics: Mapping[str, Any],
                       out_dir: Path) -> list[Path]:
    return _listed(write_granularity_levels(results, out_dir))


def specificity_heatmap(analysis: str, results: Mapping[str, Any], metrics: Mapping[str, Any],
                        out_dir: Path) -> list[Path]:
    return _listed(write_specificity_heatmap(results, out_dir))


def knowledge_variants(analysis: str, results: Mapping[str, Any], metrics: Mapping[str, Any],
                       out_dir: Path) -> list[Path]:
    return _listed(write_knowledge_variants(results, out_dir))

# ---------------------------------------------------------------------------------------------------------
# Granularity: mAP per WordNet level (reports/granularity/<dataset>.json, details.levels)

LEVEL_SERIES = (("direct", "coarse: direct"), ("child", "coarse: child-propagated"),
                ("leaf", "coarse: leaf-propagated"), ("leaf_map", "leaves (own prompts)"))
LEVELS_FILE = "granularity_levels.svg"


def level_rows(results: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """[{dataset, level, series, value}] from each result's `details.levels` (datasets without levels: none)."""
    rows = []
    for dataset, result in results.items():
        for level in (result.get("details") or {}).get("levels", []):
            rows += [{"dataset": dataset, "level": int(level["level"]), "series": name, "value": float(level[key])}
                     for key, name in LEVEL_SERIES if _is_number(level.get(key))]
    return rows


def levels_spec(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Lines with points: mAP per level (entity = 0) for each scoring, one panel per dataset."""
    series = [name for _, name in LEVEL_SERIES]
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": {"text": "granularity: mAP per WordNet level", "fontSize": 16, "anchor": "start", "offset": 10},
        "background": "white",
        "padding": 12,
        "data": {"values": rows},
        "facet": {"column": {"field": "dataset", "type": "nominal", "title": None, "sort": list(dict.fromkeys(
            r["dataset"] for r in rows)), "header": {"labelFontSize": 13}}},
        "spec": {
            "width": 260, "height": 200,
            "mark": {"type": "line", "point": True},
            "encoding": {
                "x": {"field": "level", "type": "quantitative", "title": "level (entity = 0)",
                      "axis": {"tickMinStep": 1, "format": "d"}, "scale": {"zero": False, "nice": False}},
                "y": {"field": "value", "type": "quantitative", "title": "mAP",
                      "scale": {"domain": [0, 1], "nice": False}},
                "color": {"field": "series", "type": "nominal", "title": None,
                          "scale": {"domain": series, "range": list(PALETTE[:len(series)])},
                          "legend": {"orient": "bottom", "columns": 2}},
                "tooltip": [{"field": "dataset"}, {"field": "level"}, {"field": "series"},
                            {"field": "value", "format": ".4f"}],
            },
        },
        "config": {"view": {"stroke": "#dddddd"}, "font": "DejaVu Sans, Liberation Sans, Arial, sans-serif"},
    }


def write_granularity_levels(results: Mapping[str, Mapping[str, Any]], out_dir: Path) -> Path | None:
    """`<out_dir>/granularity_levels.svg` from the granularity results ({dataset: result JSON}); None (and no
    file) when no dataset has levels (e.g. only two-level datasets)."""
    rows = level_rows(results)
    if not rows:
        return None
    path = Path(out_dir) / LEVELS_FILE
    svg = render_svg(levels_spec(rows))
    with atomic_path(path) as tmp:
        tmp.write_text(svg if svg.endswith("\n") else svg + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------------
# Specificity: the paper's Table 3 as a heat map (reports/specificity/<dataset>.json, details.table)

HEATMAP_FILE = "specificity_heatmap.svg"
HEATMAP_CELL = 118  # px per cell side
DARK_FROM = 0.55    # cells at least this dark carry white text


def heatmap_rows(results: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """[{dataset, positive, negative, map, chance, ...}] from each result's `details.table`, cells with images only."""
    rows = []
    for dataset, result in results.items():
        details = result.get("details") or {}
        for positive, row in (details.get("table") or {}).items():
            for negative, cell in row.items():
                if _is_number(cell.get("map")) and _is_number(cell.get("chance")):
                    rows.append({"dataset": dataset, "positive": positive, "negative": negative,
                                 "map": float(cell["map"]), "chance": float(cell["chance"]),
                                 "value": VALUE_FORMAT.format(cell["map"]),
                                 "note": f"chance {VALUE_FORMAT.format(cell['chance'])}",
                                 "dark": bool(cell["map"] >= DARK_FROM), "images": int(cell.get("images") or 0)})
    return rows


def _axis_order(results: Mapping[str, Mapping[str, Any]], key: str) -> list[str]:
    """Positive (`rows`) or negative (`columns`) types in the order the results list them."""
    return list(dict.fromkeys(t for r in results.values() for t in ((r.get("details") or {}).get(key) or [])))


def heatmap_spec(rows: list[dict[str, Any]], positives: list[str], negatives: list[str]) -> dict[str, Any]:
    """mAP per (positive type, negative type) cell, coloured on a 0..1 scale, each with its chance level; one panel per
    dataset."""
    text = {"type": "text", "baseline": "middle", "fontSize": 13}
    color = {"condition": {"test": "datum.dark", "value": "white"}, "value": "#222222"}
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": {"text": "specificity: mAP of positives (rows) among negatives (columns), chance below", "fontSize": 16,
                  "anchor": "start", "offset": 10},
        "background": "white",
        "padding": 12,
        "data": {"values": rows},
        "facet": {"column": {"field": "dataset", "type": "nominal", "title": None,
                             "sort": list(dict.fromkeys(r["dataset"] for r in rows)), "header": {"labelFontSize": 13}}},
        "spec": {
            "width": HEATMAP_CELL * max(len(negatives), 1), "height": HEATMAP_CELL * max(len(positives), 1) * 0.6,
            "encoding": {
                "x": {"field": "negative", "type": "nominal", "sort": negatives, "title": None,
                      "axis": {"orient": "top", "labelAngle": 0, "labelFontSize": 12}},
                "y": {"field": "positive", "type": "nominal", "sort": positives, "title": None,
                      "axis": {"labelFontSize": 12}},
            },
            "layer": [
                {"mark": {"type": "rect", "stroke": "white", "strokeWidth": 2},
                 "encoding": {"color": {"field": "map", "type": "quantitative", "title": "mAP",
                                        "scale": {"scheme": "blues", "domain": [0, 1]}},
                              "tooltip": [{"field": "dataset"}, {"field": "positive"}, {"field": "negative"},
                                          {"field": "map", "format": ".4f"}, {"field": "chance", "format": ".4f"},
                                          {"field": "images"}]}},
                {"mark": {**text, "fontWeight": "bold", "dy": -8},
                 "encoding": {"text": {"field": "value"}, "color": color}},
                {"mark": {**text, "fontSize": 10, "dy": 9},
                 "encoding": {"text": {"field": "note"}, "color": color}},
            ],
        },
        "config": {"view": {"stroke": None}, "font": "DejaVu Sans, Liberation Sans, Arial, sans-serif"},
    }


def write_specificity_heatmap(results: Mapping[str, Mapping[str, Any]], out_dir: Path) -> Path | None:
    """`<out_dir>/specificity_heatmap.svg` from the specificity results ({dataset: result JSON}); None (and no file)
    when no cell has a value."""
    rows = heatmap_rows(results)
    if not rows:
        return None
    path = Path(out_dir) / HEATMAP_FILE
    svg = render_svg(heatmap_spec(rows, _axis_order(results, "rows"), _axis_order(results, "columns")))
    with atomic_path(path) as tmp:
        tmp.write_text(svg if svg.endswith("\n") else svg + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------------
# Zero-shot knowledge variants: the dataset metric per variant (reports/zeroshot/<dataset>.json, details.variants)

KNOWLEDGE_FILE = "zeroshot_knowledge.svg"


def variant_rows(results: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str, float]]:
    """[(dataset, variant, value of the dataset's headline metric)] from each zeroshot result's `details.variants`,
    templates first; datasets without variants give none. The headline metric is the result's first metric key."""
    rows = []
    for dataset, result in results.items():
        variants = (result.get("details") or {}).get("variants") or {}
        metric = next(iter(result.get("metrics") or {}), None)
        rows += [(dataset, name, float(entry["metrics"][metric])) for name, entry in variants.items()
                 if metric is not None and _is_number(entry.get("metrics", {}).get(metric))]
    return rows


def write_knowledge_variants(results: Mapping[str, Mapping[str, Any]], out_dir: Path) -> Path | None:
    """`<out_dir>/zeroshot_knowledge.svg`: one bar per dataset and variant (the bars of `vegalite_spec`, coloured by
    variant); None (nothing written) when no result has variants."""
    rows = variant_rows(results)
    if not rows:
        return None
    path = Path(out_dir) / KNOWLEDGE_FILE
    svg = render_svg(vegalite_spec("zeroshot: knowledge variants (each dataset's metric)", rows))
    with atomic_path(path) as tmp:
        tmp.write_text(svg if svg.endswith("\n") else svg + "\n", encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------------------
# Toy pretraining: loss per step (data/models/<toy>/train_log.csv, written by vlbench.models.toy)

TRAIN_LOG_PLOT = "train_log.svg"


def train_log_rows(log_csv: Path) -> list[dict[str, float]]:
    """[{step, loss}] of a `step,loss,lr` training log."""
    import csv

    with open(log_csv, newline="") as f:
        return [{"step": int(row["step"]), "loss": float(row["loss"])} for row in csv.DictReader(f)]


def train_log_spec(model: str, rows: list[dict[str, float]]) -> dict[str, Any]:
    """One line: the contrastive loss per training step (what DVC's template plot of the CSV drew, but static)."""
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": {"text": f"pretrain {model}: training loss", "fontSize": 16, "anchor": "start", "offset": 10},
        "background": "white",
        "padding": 12,
        "width": CHART_WIDTH, "height": 240,
        "data": {"values": rows},
        "mark": {"type": "line", "color": PALETTE[0], "strokeWidth": 1.5},
        "encoding": {
            "x": {"field": "step", "type": "quantitative", "title": "step", "axis": {"format": "d"}},
            "y": {"field": "loss", "type": "quantitative", "title": "loss", "scale": {"zero": False}},
        },
        "config": {"view": {"stroke": "#dddddd"}, "font": "DejaVu Sans, Liberation Sans, Arial, sans-serif"},
    }


def write_train_log_plot(model: str, log_csv: Path, svg_path: Path) -> Path:
    """`svg_path` (static SVG, viewable offline) from the training log `log_csv`; byte-identical for the same log."""
    svg = render_svg(train_log_spec(model, train_log_rows(Path(log_csv))))
    with atomic_path(svg_path) as tmp:
        tmp.write_text(svg if svg.endswith("\n") else svg + "\n", encoding="utf-8")
    return Path(svg_path)
