"""Report pieces of the `extensibility` analysis, from the results' details (reports/extensibility/<d>.json):

- `extensibility_steps.svg`: accuracy against the number of groups in the vocabulary, one panel per dataset (or
  dataset-level vocabulary): Acc-E's step accuracy (the union of the groups so far) and the conditional accuracy of
  Acc-S (the target group's images, target plus distractors), sampled (solid) and the exact expectation over all
  orders (dashed), per prompt variant.
- `extensibility_drops.svg`: per group, the drop from its accuracy alone (Acc-C) to its mean conditional accuracy
  (Acc-S) and to the whole vocabulary, one panel per dataset, groups sorted by the drop: which groups suffer most.

Every variant that ran is a series (`repe` included where the dataset had REPE class weights); a variant a result
skipped (`details.skipped_variants`, e.g. repe without the repe stage's file) is named in both charts' subtitles,
and so is the caption corpus each `repe` series retrieved from (`details.repe`; the paper's is CC12M, App. A.5).
The headline numbers (Acc-C/E/S per variant, `acc_<c|e|s>_<variant>`) reach reports/metrics.json from the results'
metrics like every analysis's.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vlbench.io import atomic_path
from vlbench.report.plots import PALETTE, render_svg

STEPS_FILE = "extensibility_steps.svg"
DROPS_FILE = "extensibility_drops.svg"
CURVES = (("acc_e", "Acc-E step", "sampled"), ("acc_e_expected", "Acc-E step", "expected"),
          ("acc_s", "conditional (Acc-S)", "sampled"), ("acc_s_expected", "conditional (Acc-S)", "expected"))
FONT = "DejaVu Sans, Liberation Sans, Arial, sans-serif"


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def step_rows(results: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """[{dataset, variant, curve, kind, groups, value}]: Acc-E steps at 1..G groups, conditional accuracy at 2..G."""
    rows = []
    for dataset, result in results.items():
        for variant, values in ((result.get("details") or {}).get("variants") or {}).items():
            steps = values.get("steps") or {}
            for key, curve, kind in CURVES:
                first = 1 if key.startswith("acc_e") else 2
                rows += [{"dataset": dataset, "variant": variant, "curve": f"{variant}: {curve}", "kind": kind,
                          "groups": first + k, "value": float(v)}
                         for k, v in enumerate(steps.get(key) or []) if _number(v)]
    return rows


def drop_rows(results: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """[{dataset, variant, group, drop, kind, order}]: per group the drops to Acc-S and to the whole vocabulary."""
    rows = []
    for dataset, result in results.items():
        for variant, values in ((result.get("details") or {}).get("variants") or {}).items():
            groups = sorted(values.get("groups") or [], key=lambda g: -float(g.get("drop_s") or 0.0))
            for rank, g in enumerate(groups):
                rows += [{"dataset": dataset, "variant": variant, "group": str(g["group"]), "order": rank,
                          "kind": kind, "series": f"{variant}: {kind}", "drop": float(g[key])}
                         for key, kind in (("drop_s", "to Acc-S"), ("drop_full", "to the whole vocabulary"))
                         if _number(g.get(key))]
    return rows


def skipped_notes(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per skipped variant: which datasets did not run it (their results' `details.skipped_variants`)."""
    skipped: dict[str, list[str]] = {}
    for dataset, result in results.items():
        for variant in sorted((result.get("details") or {}).get("skipped_variants") or {}):
            skipped.setdefault(variant, []).append(dataset)
    return [f"{v} not run for {', '.join(ds)}: reports/extensibility/<dataset>.json, details.skipped_variants, says why"
            for v, ds in skipped.items()]


def repe_notes(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per REPE corpus: which datasets' repe numbers come from it, by which model it was searched, and
    whether it is the paper's (CC12M, App. A.5)."""
    by_corpus: dict[tuple[str, str, bool], list[str]] = {}
    for dataset, result in results.items():
        for source in ((result.get("details") or {}).get("repe") or {}).values():
            model = (source.get("retrieval_model") or {}).get("model")
            key = (str(source.get("corpus")), str(model), bool(source.get("paper_corpus")))
            if dataset not in by_corpus.setdefault(key, []):
                by_corpus[key].append(dataset)
    return [f"repe for {', '.join(ds)}: captions of {corpus}, searched with {model}"
            f"{'' if paper else ' (not the paper' + chr(39) + 's CC12M)'}"
            for (corpus, model, paper), ds in by_corpus.items()]


def _frame(title: str, rows: list[dict[str, Any]], spec: dict[str, Any], notes: list[str] | None = None
           ) -> dict[str, Any]:
    head = {"text": title, "fontSize": 16, "anchor": "start", "offset": 10}
    if notes:
        head.update(subtitle=notes, subtitleFontSize=12, subtitleColor="#8a2a2a")
    return {"$schema": "https://vega.github.io/schema/vega-lite/v5.json",
            "title": head,
            "background": "white", "padding": 12, "data": {"values": rows},
            "facet": {"column": {"field": "dataset", "type": "nominal", "title": None,
                                 "sort": list(dict.fromkeys(r["dataset"] for r in rows)),
                                 "header": {"labelFontSize": 13}}},
            "resolve": {"scale": {"x": "independent", "y": "independent"}},
            "spec": spec, "config": {"view": {"stroke": "#dddddd"}, "font": FONT}}


def steps_spec(rows: list[dict[str, Any]], notes: list[str] | None = None) -> dict[str, Any]:
    """Sampled values as lines, the exact expectations as open diamonds on top."""
    curves = list(dict.fromkeys(r["curve"] for r in rows))
    color = {"field": "curve", "type": "nominal", "title": None,
             "scale": {"domain": curves, "range": list(PALETTE[:len(curves)])},
             "legend": {"orient": "bottom", "columns": 2}}
    x = {"field": "groups", "type": "ordinal", "title": "groups in the vocabulary", "axis": {"labelAngle": 0}}
    y = {"field": "value", "type": "quantitative", "title": "accuracy", "scale": {"domain": [0, 1]}}
    tooltip = [{"field": "dataset"}, {"field": "curve"}, {"field": "kind"}, {"field": "groups"},
               {"field": "value", "format": ".4f"}]
    return _frame("extensibility: accuracy as the vocabulary grows (lines: sampled orders; diamonds: exact "
                  "expectation over all orders)", rows, {
        "width": 280, "height": 220,
        "layer": [
            {"transform": [{"filter": "datum.kind === 'sampled'"}], "mark": {"type": "line", "point": True},
             "encoding": {"x": x, "y": y, "color": color, "tooltip": tooltip}},
            {"transform": [{"filter": "datum.kind === 'expected'"}],
             "mark": {"type": "point", "shape": "diamond", "filled": False, "size": 70, "strokeWidth": 1.5},
             "encoding": {"x": x, "y": y, "color": color, "tooltip": tooltip}},
        ]}, notes)


def drops_spec(rows: list[dict[str, Any]], notes: list[str] | None = None) -> dict[str, Any]:
    series = list(dict.fromkeys(r["series"] for r in rows))
    return _frame("extensibility: per-group drop from Acc-C", rows, {
        "width": 260, "height": {"step": 9},
        "mark": {"type": "bar"},
        "encoding": {
            "y": {"field": "group", "type": "nominal", "title": None,
                  "sort": {"field": "order", "op": "min", "order": "ascending"}},
            "yOffset": {"field": "series", "type": "nominal", "sort": series},
            "x": {"field": "drop", "type": "quantitative", "title": "accuracy alone minus accuracy expanded"},
            "color": {"field": "series", "type": "nominal", "title": None,
                      "scale": {"domain": series, "range": list(PALETTE[:len(series)])},
                      "legend": {"orient": "bottom", "columns": 2}},
            "tooltip": [{"field": "dataset"}, {"field": "group"}, {"field": "series"},
                        {"field": "drop", "format": ".4f"}],
        }}, notes)


def _write(path: Path, spec: dict[str, Any]) -> Path:
    svg = render_svg(spec)
    with atomic_path(path) as tmp:
        tmp.write_text(svg if svg.endswith("\n") else svg + "\n", encoding="utf-8")
    return path


def write_extensibility_plots(results: Mapping[str, Mapping[str, Any]], out_dir: Path) -> list[Path]:
    """`extensibility_steps.svg` and `extensibility_drops.svg` in `out_dir` from {dataset: result JSON}; a chart
    without rows is not written."""
    written = []
    steps, drops = step_rows(results), drop_rows(results)
    notes = skipped_notes(results) + repe_notes(results)
    if steps:
        written.append(_write(Path(out_dir) / STEPS_FILE, steps_spec(steps, notes)))
    if drops:
        written.append(_write(Path(out_dir) / DROPS_FILE, drops_spec(drops, notes)))
    return written


def charts(analysis: str, results: Mapping[str, Mapping[str, Any]], metrics: Mapping[str, Any],
           out_dir: Path) -> list[Path]:
    return write_extensibility_plots(results, out_dir)
