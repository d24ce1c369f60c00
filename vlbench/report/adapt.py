"""Report pieces of the `adapt` analysis: cross-dataset means in reports/metrics.json and accuracy against shots.

- `with_means(metrics)`: `metrics["adapt"]["mean"]` = per key, the mean over the suite's adapt datasets of every key
  that all of them report (for "elevater/<head>/<shots>/<report>" keys this is the ELEVATER score: the mean over
  datasets of each dataset's metric).
- `write_shots_plot(metrics, out_dir)`: `adapt_shots.svg`, the test metric against shots per dataset (and the mean),
  one line per head, with zero-shot at 0 shots where the zeroshot analysis ran on the dataset.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from vlbench.analyses.adapt.vtab import group_means
from vlbench.io import atomic_path
from vlbench.report.plots import PALETTE, render_svg

MEAN = "mean"  # the pseudo-dataset of cross-dataset means under metrics["adapt"]
SHOTS_FILE = "adapt_shots.svg"
_ELEVATER_KEY = re.compile(r"elevater/(?P<head>[a-z0-9_]+)/(?P<shots>\d+|full)/(?P<report>last|best_on_test)")


def with_means(metrics: dict[str, Any]) -> dict[str, Any]:
    """`metrics` with metrics["adapt"]["mean"] added when at least two datasets ran adapt (keys all of them share)."""
    per_dataset = {d: v for d, v in (metrics.get("adapt") or {}).items() if d != MEAN}
    if len(per_dataset) < 2:
        return metrics
    shared = set.intersection(*(set(v) for v in per_dataset.values()))
    keys = [k for k in next(iter(per_dataset.values())) if k in shared]
    means = {k: float(np.mean([per_dataset[d][k] for d in per_dataset])) for k in keys}
    return {**metrics, "adapt": {**per_dataset, MEAN: means}}


def with_vtab_groups(metrics: dict[str, Any], results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """`metrics` with VTAB's summary in metrics["adapt"]["mean"]: `vtab/<group>` (natural, specialized, structured:
    the mean of the group's task medians) and `vtab/mean` (over all tasks), from each result's VTAB group."""
    per_dataset = {d: v for d, v in (metrics.get("adapt") or {}).items() if d != MEAN}
    medians = {d: v["vtab/median"] for d, v in per_dataset.items() if "vtab/median" in v}
    if not medians:
        return metrics
    groups = {d: results[d]["details"]["vtab"]["group"] for d in medians}
    means = {**(metrics["adapt"].get(MEAN) or {}), **group_means(medians, groups)}
    return {**metrics, "adapt": {**per_dataset, MEAN: means}}


def shot_rows(metrics: Mapping[str, Any]) -> list[dict[str, Any]]:
    """[{dataset, head, shots, x, value}] from the elevater keys of metrics["adapt"], plus zero-shot (shots 0) from
    metrics["zeroshot"] (its first number: the dataset's metric) for the datasets that have adapt rows."""
    rows = []
    for dataset, values in (metrics.get("adapt") or {}).items():
        for key, value in values.items():
            m = _ELEVATER_KEY.fullmatch(key)
            if m:
                rows.append({"dataset": dataset, "head": f"{m['head']} ({m['report']})", "shots": m["shots"],
                             "value": float(value)})
    zeroshot = {d: float(next(iter(v.values()))) for d, v in (metrics.get("zeroshot") or {}).items() if v}
    datasets = [d for d in dict.fromkeys(r["dataset"] for r in rows) if d != MEAN]
    if MEAN in (metrics.get("adapt") or {}) and all(d in zeroshot for d in datasets):
        zeroshot[MEAN] = float(np.mean([zeroshot[d] for d in datasets]))
    rows += [{"dataset": d, "head": "zero-shot", "shots": "0", "value": zeroshot[d]}
             for d in dict.fromkeys(r["dataset"] for r in rows) if d in zeroshot]
    return rows


def shots_spec(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Lines with points: the test metric against shots (0 = zero-shot, ..., full), one panel per dataset."""
    order = sorted({r["shots"] for r in rows if r["shots"] != "full"}, key=int) + ["full"]
    heads = sorted({r["head"] for r in rows})
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v5.json",
        "title": {"text": "adapt: ELEVATER linear probing, test metric against shots", "fontSize": 16,
                  "anchor": "start", "offset": 10},
        "background": "white", "padding": 12, "data": {"values": rows},
        "facet": {"column": {"field": "dataset", "type": "nominal", "title": None,
                             "sort": list(dict.fromkeys(r["dataset"] for r in rows)), "header": {"labelFontSize": 13}}},
        "spec": {
            "width": 220, "height": 200, "mark": {"type": "line", "point": True},
            "encoding": {
                "x": {"field": "shots", "type": "ordinal", "sort": order, "title": "shots per class",
                      "axis": {"labelAngle": 0}},
                "y": {"field": "value", "type": "quantitative", "title": "test metric",
                      "scale": {"domain": [0, 1], "nice": False}},
                "color": {"field": "head", "type": "nominal", "title": None,
                          "scale": {"domain": heads, "range": list(PALETTE[:len(heads)])},
                          "legend": {"orient": "bottom", "columns": 3}},
                "tooltip": [{"field": "dataset"}, {"field": "head"}, {"field": "shots"},
                            {"field": "value", "format": ".4f"}],
            },
        },
        "config": {"view": {"stroke": "#dddddd"}, "font": "DejaVu Sans, Liberation Sans, Arial, sans-serif"},
    }


def write_shots_plot(metrics: Mapping[str, Any], out_dir: Path) -> Path | None:
    """`<out_dir>/adapt_shots.svg`; None (and no file) when metrics.json has no elevater numbers."""
    rows = shot_rows(metrics)
    if not any(r["head"] != "zero-shot" for r in rows):
        return None
    path = Path(out_dir) / SHOTS_FILE
    svg = render_svg(shots_spec(rows))
    with atomic_path(path) as tmp:
        tmp.write_text(svg if svg.endswith("\n") else svg + "\n", encoding="utf-8")
    return path


def summary(metrics: dict[str, Any], results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The adapt entry's summary: `with_means`, then `with_vtab_groups` (results: {dataset: adapt result JSON})."""
    return with_vtab_groups(with_means(metrics), results)


def shots_chart(analysis: str, results: Mapping[str, Any], metrics: Mapping[str, Any], out_dir: Path) -> list[Path]:
    path = write_shots_plot(metrics, out_dir)
    return [] if path is None else [path]
