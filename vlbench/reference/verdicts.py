"""Match a run's headline numbers to the reference rows that apply, and give each a verdict (reports/reference.json).

A row applies to a run when its `model` is the run's model slug (reports/model.json), its analysis ran on its
dataset (or, for an `average` row, on every dataset of its `settings.datasets`), the number it names is in
reports/metrics.json, and none of its checkable settings contradicts the run: `model.<key>` against
reports/model.json, `params.<dotted path>` against the `params` of the result files involved; a checkable key the
run does not record is listed as unchecked; `head`, `shots`, `adaptation` and `datasets` say which number is
meant; any other key describes the protocol in words and is not checked. Tolerance and verdict:
docs/protocols.md, "Reference numbers and verdicts".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import numpy as np

from vlbench.reference import FRACTION_METRICS, Row, Table, published_number, published_scale
from vlbench.reference.datacomp import cell_value

# used when the row has no published spread: the run is deterministic given features (zero-shot), or trained
# (one per analysis of vlbench.analyses.ANALYSES: tests/test_reference.py walks the table)
DEFAULT_TOLERANCE = {"zeroshot": 0.005, "linear_probe": 0.01, "adapt": 0.01, "extensibility": 0.01,
                     "granularity": 0.01, "specificity": 0.01,
                     # deterministic given features like zero-shot, but on small sets (Winoground: 400 items, one
                     # flipped by an implementation difference moves a score 0.25 points)
                     "compositionality": 0.01,
                     "retrieval": 0.01,  # one point: CLIP_benchmark's fp16 features and topk tie order differ
                     "robustness": 0.005,  # robustness: a zero-shot accuracy on a shifted test set
                     "finetune": 0.01}  # as adapt: a mean over episodes or seeds
Z = {"std": 1.96, "sem": 1.96, "ci95": 1.0}  # multiplier that turns a spread into a 95% half-width
EPS = 1e-12  # a difference equal to the tolerance (in floating point) is within it


def _number(metrics: Mapping[str, Any], key: str) -> float | None:
    """The number under `key`, or a derived one (DataComp's mean_recall_at_1: the mean of i2t_r1 and t2i_r1)."""
    return cell_value(metrics, key)


def _adapt_key(row: Row, metrics: Mapping[str, Any]) -> tuple[str | None, str]:
    """ELEVATER probing: `elevater/<head>/<shots>/<report>`; (None, why) for what vlbench does not run."""
    s = row.settings
    if s.get("adaptation", "linear_probe") != "linear_probe":
        return None, f"adaptation {s['adaptation']!r}: vlbench runs linear probing only"
    if "head" in s and "shots" in s:
        return f"elevater/{s['head']}/{s['shots']}/{s.get('params.elevater.report', 'last')}", ""
    return row.metric, ""


def _plain_key(row: Row, metrics: Mapping[str, Any]) -> tuple[str | None, str]:
    """The row's metric; `dataset_metric`: the dataset's own metric (the first number of its zero-shot result)."""
    if row.metric == "dataset_metric":
        return next((k for k, v in metrics.items() if isinstance(v, (int, float))), None), ""
    return row.metric, ""


KEYS: dict[str, Callable[[Row, Mapping[str, Any]], tuple[str | None, str]]] = {"adapt": _adapt_key}


def _our_spread_adapt(row: Row, results: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """ELEVATER: the std over seeds (ddof 1) of the per-seed mean over the datasets involved (one dataset: its std)."""
    s = row.settings
    if "head" not in s or "shots" not in s:
        return None
    per_seed = []
    for result in results:
        entry = ((((result.get("details") or {}).get("elevater") or {}).get("summary") or {})
                 .get(s["head"]) or {}).get(str(s["shots"]))
        if not entry or len(entry.get("per_seed") or []) < 2:
            return None
        per_seed.append(dict(zip(entry["seeds"], entry["per_seed"])))
    seeds = sorted(set.intersection(*(set(p) for p in per_seed)))
    if len(seeds) < 2:
        return None
    means = [float(np.mean([p[seed] for p in per_seed])) for seed in seeds]
    return {"kind": "std", "value": float(np.std(means, ddof=1))}


OUR_SPREAD: dict[str, Callable[[Row, Sequence[Mapping[str, Any]]], dict[str, Any] | None]] = {
    "adapt": _our_spread_adapt}


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-9)
    return a == b


def _lookup(tree: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def check_settings(settings: Mapping[str, Any], results: Sequence[Mapping[str, Any]],
                   model: Mapping[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """(checked, unchecked, differing) setting keys; a differing entry reads 'key: run X, reference Y'."""
    checked, unchecked, differs = [], [], []
    for key, want in settings.items():
        if key.startswith("model."):
            found = [_lookup(model, key.removeprefix("model."))]
        elif key.startswith("params."):
            found = [_lookup(r.get("params") or {}, key.removeprefix("params.")) for r in results]
        else:
            continue  # words for the reader, or which number is meant (head, shots, ...)
        values = [v for ok, v in found if ok]
        if not values:
            unchecked.append(key)
        elif all(_equal(v, want) for v in values):
            checked.append(key)
        else:
            differs.append(f"{key}: run {next(v for v in values if not _equal(v, want))!r}, reference {want!r}")
    return checked, unchecked, differs


def tolerance(row: Row, ours: dict[str, Any] | None) -> tuple[float, str]:
    """(the tolerance in the row's units, the rule that gave it); docs/protocols.md, "Reference numbers and verdicts".

    Both spreads of one kind: z * sqrt(s_pub^2 + s_ours^2) (z = 1.96 for std/sem, 1 for 95% half-widths); only the
    published one: the run is taken to have the same spread (same protocol, same number of seeds), z * sqrt(2) *
    s_pub; neither: the analysis's default. Never less than that default, plus half a unit of the printed last digit.
    """
    default = DEFAULT_TOLERANCE[row.analysis]
    pub = row.spread
    if pub and ours and ours["kind"] == pub["kind"]:
        tol = Z[pub["kind"]] * math.hypot(pub["value"], ours["value"])
        rule = f"{Z[pub['kind']]:g} * sqrt(s_pub^2 + s_ours^2) ({pub['kind']})"
    elif pub:
        tol = Z[pub["kind"]] * math.sqrt(2.0) * pub["value"]
        rule = f"{Z[pub['kind']]:g} * sqrt(2) * s_pub ({pub['kind']}; ours taken equal to the published one)"
    else:
        tol, rule = default, f"default for {row.analysis}: {default:g}"
    if tol < default:
        tol, rule = default, f"{rule}, raised to the default {default:g}"
    _, decimals = published_number(row.published) or (0.0, 0)
    rounding = 0.5 * 10.0 ** -decimals * published_scale(row.value, row.published)
    return tol + rounding, f"{rule} + {rounding:g} (printed precision)"


def verdict(ours: float, theirs: float, tol: float) -> str:
    return "reproduced" if abs(ours - theirs) <= tol + EPS else "off"


def _points(row: Row) -> float:
    """Factor to the units people read: percentage points for fractions and for numbers printed as percentages."""
    return 100.0 if FRACTION_METRICS.match(row.metric) or published_scale(row.value, row.published) != 1.0 else 1.0


def compare_row(row: Row, table: Table, ours: float, our_spread: dict[str, Any] | None,
                checked: list[str], unchecked: list[str], key: str, datasets: list[str]) -> dict[str, Any]:
    tol, rule = tolerance(row, our_spread)
    diff = ours - row.value
    outcome = verdict(ours, row.value, tol)
    f = _points(row)
    unit, d = (" points", 2) if f == 100.0 else ("", 4)
    message = (f"reproduced: {ours * f:.{d}f} vs {row.value * f:.{d}f} published ({diff * f:+.{d}f}{unit}, "
               f"tolerance {tol * f:.{d}f})" if outcome == "reproduced" else
               f"off by {diff * f:+.{d}f}{unit}: {ours * f:.{d}f} vs {row.value * f:.{d}f} published "
               f"(tolerance {tol * f:.{d}f}; {(abs(diff) - tol) * f:.{d}f}{unit} beyond it)")
    return {"analysis": row.analysis, "dataset": row.dataset, "metric": row.metric, "key": key,
            "datasets": datasets, "ours": ours, "theirs": row.value, "published": row.published,
            "difference": diff, "tolerance": tol, "tolerance_rule": rule, "verdict": outcome, "message": message,
            "spread_published": row.spread, "spread_ours": our_spread,
            "settings_checked": checked, "settings_unchecked": unchecked,
            "source": {"paper": table.paper, "table": table.table, "file": table.file, "row": row.row,
                       "column": row.column, "model_name": row.model_name, "citation": table.source}}


def _involved(row: Row, metrics: Mapping[str, Any]) -> tuple[list[str] | None, str]:
    """The datasets whose numbers make the row's value in this run, or (None, why not)."""
    ran = metrics.get(row.analysis) or {}
    if row.dataset != "average":
        return ([row.dataset], "") if row.dataset in ran else (None, "")
    datasets = row.settings.get("datasets")
    if not isinstance(datasets, list) or not all(isinstance(d, str) for d in datasets) or not datasets:
        return None, ""  # an average over datasets the table does not list by vlbench name: nothing to compare
    if not any(d in ran for d in datasets):
        return None, ""
    missing = [d for d in datasets if d not in ran]
    if missing:
        return None, f"the average needs {len(datasets)} datasets; the run lacks {len(missing)}: {', '.join(missing)}"
    return list(datasets), ""


def _cells(row: Row) -> list[tuple[str, str, str]] | None:
    """An average over cells of several analyses (open_clip's DataComp average): settings.cells = [[analysis,
    dataset, metric], ...]; None for any other row."""
    cells = row.settings.get("cells")
    if row.dataset != "average" or not isinstance(cells, list):
        return None
    return [tuple(c) for c in cells]


def compare_cells(row: Row, table: Table, cells: list[tuple[str, str, str]], metrics: Mapping[str, Any],
                  model: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]]
                  ) -> tuple[dict[str, Any] | None, str | None]:
    """The mean of the cells' numbers (each its own analysis, dataset and metric) against the row: compared when
    the run has every cell, said why not when it has some, silent when it has none."""
    ran = [c for c in cells if c[1] in (metrics.get(c[0]) or {})]
    if not ran:
        return None, None
    if len(ran) < len(cells):
        missing = [f"{a}@{d}" for a, d, _ in cells if (a, d, _) not in ran]
        return None, f"the average needs {len(cells)} tasks; the run lacks {len(missing)}: {', '.join(missing)}"
    values = []
    for a, d, m in cells:
        value = _number(metrics[a][d], m)
        if value is None:
            return None, f"{a}@{d} reports no {m!r}"
        values.append(value)
    involved = [results.get(a, {}).get(d) or {} for a, d, _ in cells]
    checked, unchecked, differs = check_settings(row.settings, involved, model)
    if differs:
        return None, "settings differ: " + "; ".join(differs)
    return compare_row(row, table, float(np.mean(values)), None, checked, unchecked,
                       f"mean over {len(cells)} tasks of each task's metric (settings.cells)",
                       [d for _, d, _ in cells]), None


def compare_one(row: Row, table: Table, metrics: Mapping[str, Any], model: Mapping[str, Any],
                results: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, Any] | None, str | None]:
    """(a comparison, None), (None, why the row does not apply although its analysis ran), or (None, None)."""
    cells = _cells(row)
    if cells is not None:
        return compare_cells(row, table, cells, metrics, model, results)
    datasets, why = _involved(row, metrics)
    if datasets is None:
        return None, why or None
    ran = metrics[row.analysis]
    involved = [results.get(row.analysis, {}).get(d) or {} for d in datasets]
    checked, unchecked, differs = check_settings(row.settings, involved, model)
    if differs:
        return None, "settings differ: " + "; ".join(differs)
    keyer = KEYS.get(row.analysis, _plain_key)
    values, keys = [], []
    for d in datasets:
        key, why = keyer(row, ran[d])
        if key is None:
            return None, why or f"{d}: no number to compare"
        value = _number(ran[d], key)
        if value is None:
            return None, f"{row.analysis}@{d} reports no {key!r}"
        values.append(value)
        keys.append(key)
    ours = float(np.mean(values))
    spread = OUR_SPREAD[row.analysis](row, involved) if row.analysis in OUR_SPREAD else None
    shown = keys[0] if len(set(keys)) == 1 else "each dataset's own metric"
    shown = f"mean over {len(datasets)} datasets of {shown}" if row.dataset == "average" else shown
    return compare_row(row, table, ours, spread, checked, unchecked, shown, datasets), None


def reference_report(tables: Sequence[Table], metrics: Mapping[str, Any], model: Mapping[str, Any],
                     results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The content of reports/reference.json: {"applies": false, "reason"} or the comparisons and the rows that
    name this model and an analysis-dataset the run has but do not apply (with the reason)."""
    slug = model.get("model")
    rows = [(r, t) for t in tables for r in t.rows if r.model is not None and r.model == slug]
    if not rows:
        known = sorted({r.model for t in tables for r in t.rows if r.model})
        return {"applies": False, "reason": f"no published number for model {slug!r}: the reference tables name "
                                            f"{', '.join(known)}"}
    comparisons, skipped = [], []
    for row, table in rows:
        done, why = compare_one(row, table, metrics, model, results)
        if done is not None:
            comparisons.append(done)
        elif why is not None:
            skipped.append({"paper": table.paper, "table": table.table, "row": row.row, "column": row.column,
                            "analysis": row.analysis, "dataset": row.dataset, "reason": why,
                            "how_to_run": table.how_to_run})
    if not comparisons:
        return {"applies": False, "model": slug,
                "reason": f"no reference number applies to this run of {slug!r}"
                          + (f" ({len(skipped)} rows for its analyses and datasets do not: see not_compared)"
                             if skipped else " (the run has none of the tables' analyses and datasets)"),
                "not_compared": skipped}
    counts = {v: sum(c["verdict"] == v for c in comparisons) for v in ("reproduced", "off")}
    return {"applies": True, "model": slug, "summary": counts, "comparisons": comparisons, "not_compared": skipped}
