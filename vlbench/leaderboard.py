"""The leaderboard of `vlbench compare` (more than two experiments, or `--leaderboard`): one row per experiment, one
column per analysis x dataset (its main number, `Analysis.main_metric`) and the suite's averages (adapt's `mean`,
DataComp's average of 38), each cell with its interval, its rank and rank interval, and the reference verdict where a
published number exists for the experiment's model; the published rows of the reference tables beside them.

Ranks (docs/protocols.md, "Leaderboard"): within a column, the experiments' units are resampled jointly (the paired
statistic's replicates, `vlbench.stats`), each replicate ranked (1 = highest), and the 2.5% and 97.5% percentiles of
each experiment's ranks are its rank interval. The rank shown counts the experiments that are better in every
likely world: 1 + how many have a rank interval entirely above this one's (`shown_ranks`: experiments the
intervals separate never share a rank; experiments whose intervals overlap share one only when as many intervals lie
entirely above each). A column without replicates (no per-sample table, a summary) ranks by value, without
intervals. Verdicts are reports/reference.json's (`vlbench.reference.verdicts.reference_report`) for each
experiment's own results; nothing is recomputed here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from vlbench import stats
from vlbench.analyses import ANALYSES
from vlbench.reference import load_tables
from vlbench.datasets.registry import declared_metrics
from vlbench.reference.datacomp import AVERAGE, cell_interval, run_numbers
from vlbench.reference.verdicts import reference_report
from vlbench.report.aggregate import headline, headline_numbers

DATACOMP_AVERAGE = ("datacomp", "average", "mean_of_38")  # the column of DataComp's average


def column_id(analysis: str, dataset: str, metric: str) -> str:
    return f"{analysis}/{dataset}/{metric}"


def _by_analysis(results: Mapping[tuple[str, str], Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for (analysis, dataset), doc in results.items():
        if analysis in ANALYSES:  # a result without a fingerprint (a hand-made one) names no model
            out.setdefault(analysis, {})[dataset] = {"fingerprint": {}, **doc}
    return out


def experiment_cells(results: Mapping[tuple[str, str], Mapping[str, Any]]
                     ) -> tuple[dict[tuple[str, str, str], dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """({(analysis, dataset, metric): {"value", "low", "high"}} of one experiment's main numbers and suite averages,
    its metrics as reports/metrics.json holds them, its model), from its result files and the metric each dataset's
    entry declares in this checkout's registry (`declared_metrics`, as the report stage chooses reports/headline.json's
    numbers)."""
    per = _by_analysis(results)
    declared = declared_metrics({d for _, d in results})
    metrics, model = headline(per, declared)
    cells = {}
    for analysis, datasets in headline_numbers(metrics, declared).items():
        for dataset, numbers in datasets.items():
            (metric, value), = numbers.items()
            intervals = (per.get(analysis, {}).get(dataset) or {}).get("intervals") or {}
            cells[(analysis, dataset, metric)] = {"value": float(value), **cell_interval(intervals, metric)}
    average = run_numbers(metrics, per).get(AVERAGE)
    if average:
        cells[DATACOMP_AVERAGE] = dict(average)
    return cells, metrics, model


def _order(key: tuple[str, str, str]) -> tuple:
    names = list(ANALYSES)
    analysis, dataset, _ = key
    return (names.index(analysis) if analysis in names else len(names), dataset == "mean", dataset)


def _ranks(values: Mapping[str, float], replicates: tuple[list[str], np.ndarray] | None
           ) -> dict[str, dict[str, int | None]]:
    """{name: {"rank", "rank_low", "rank_high", "rank_by_value"}} within one column."""
    names = list(values)
    by_value = {n: 1 + sum(values[m] > values[n] for m in names) for n in names}
    if replicates is None or set(replicates[0]) != set(names) or len(names) < 2:
        return {n: {"rank": by_value[n], "rank_low": None, "rank_high": None, "rank_by_value": by_value[n]}
                for n in names}
    order, reps = replicates
    low, high = stats.rank_intervals(reps)
    interval = {n: (int(low[i]), int(high[i])) for i, n in enumerate(order)}
    shown = shown_ranks(interval)
    return {n: {"rank": shown[n], "rank_low": interval[n][0], "rank_high": interval[n][1],
                "rank_by_value": by_value[n]} for n in names}


def shown_ranks(intervals: Mapping[str, tuple[int, int]]) -> dict[str, int]:
    """{name: the rank shown} from each experiment's rank interval (low, high): 1 + the number of experiments whose
    interval lies entirely above (their worst rank better than this one's best). An experiment separated from another
    (the intervals disjoint) always shows a better rank than it; two whose intervals overlap show the same rank only
    when as many intervals lie entirely above each (A (1,1), B (2,3), C (2,4), D (3,4), E (4,5) show 1, 2, 2, 2, 3:
    C and E overlap but differ, as E has B above it and C has not)."""
    return {n: 1 + sum(high < low_n for _, high in intervals.values()) for n, (low_n, _) in intervals.items()}


def _verdicts(metrics: Mapping[str, Any], model: Mapping[str, Any], per: Mapping[str, Any], tables
              ) -> dict[tuple[str, str, str], dict[str, Any]]:
    """{column: the reference comparison} for the experiment (reports/reference.json's comparisons)."""
    report = reference_report(tables, metrics, model, per)
    out = {}
    for c in report.get("comparisons") or []:
        if c["dataset"] == "average" and c["key"].startswith("mean over") and "settings.cells" in c["key"]:
            out[DATACOMP_AVERAGE] = c
        else:
            out[(c["analysis"], c["dataset"], c["key"])] = c
    return out


def _published(columns: Sequence[tuple[str, str, str]], tables) -> list[dict[str, Any]]:
    """The reference tables' rows with a number in one of the columns, one entry per (paper, table, row)."""
    wanted = set(columns)
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for table in tables:
        for r in table.rows:
            if r.dataset == "average" and "cells" in r.settings:
                key = DATACOMP_AVERAGE
            else:
                key = next((c for c in wanted if c[:2] == (r.analysis, r.dataset)
                            and r.metric in (c[2], "dataset_metric")), None)
            if key not in wanted:
                continue
            entry = rows.setdefault((table.paper, table.table, r.row), {
                "model": r.model, "model_name": r.model_name, "paper": table.paper, "table": table.table,
                "row": r.row, "values": {}})
            entry["values"][column_id(*key)] = {"value": r.value, "published": r.published}
    return sorted(rows.values(), key=lambda e: (e["paper"], e["table"], e["row"]))


def separated_first(cells: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The experiment whose rank interval lies entirely above every other's in one column ({name: cell}), else None."""
    for name, cell in cells.items():
        if cell.get("rank_high") is not None and len(cells) > 1 and all(
                other.get("rank_low") is not None and cell["rank_high"] < other["rank_low"]
                for o, other in cells.items() if o != name):
            return name
    return None


def agreement(first: str | None, winner: str | None, correction: Mapping[str, Any]) -> str | None:
    """Why a column's leaderboard and its row of the pairwise table tell different stories (None where they agree):
    the rank intervals are each column's own 95% percentiles, not adjusted for the comparison's many tests; the
    pairwise winner needs an adjusted p below 0.05 against every other experiment (docs/protocols.md, "Leaderboard")."""
    if first == winner:
        return None
    family = f"{correction.get('method', 'holm')} over {correction.get('tests', 0)} tests"
    if first is not None and winner is None:
        return (f"{first}'s rank interval lies above every other's (95% percentiles of this column's ranks, not "
                f"adjusted), but not all its pairwise differences survive the correction ({family}): no winner")
    if first is None:
        return (f"{winner} beats every other experiment at adjusted p < 0.05 ({family}), but the rank intervals do "
                f"not separate it from all of them (the joint ranks of the column's resamples overlap)")
    return f"the rank intervals put {first} first, the pairwise table calls {winner} the winner ({family})"


def build(experiments: Sequence[Any], rows: Sequence[Mapping[str, Any]],
          replicates: Mapping[tuple[str, str, str], tuple[list[str], np.ndarray]],
          correction: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The `leaderboard` key of `vlbench compare --json`: {"columns": [{"id", "analysis", "dataset", "metric",
    "winner", "first", "note"?}] (`winner`: the pairwise table's for the column's row; `first`: `separated_first`;
    `note`: `agreement`, where the two differ),
    "rows": [{"experiment", "rev", "model", "cells": {id: {"value", "low", "high", "rank", "rank_low", "rank_high",
    "rank_by_value", "verdict"?, "published"?, "tolerance"?}}}], "published": [{"model", "model_name", "paper",
    "table", "row", "values": {id: {"value", "published"}}}], "method"}."""
    tables = load_tables()
    cells, verdicts, models = {}, {}, {}
    for e in experiments:
        cells[e.name], metrics, model = experiment_cells(e.results)
        model = getattr(e, "model", None) or model  # reports/model.json, else the first result's fingerprint
        models[e.name] = model.get("model")
        verdicts[e.name] = _verdicts(metrics, model, _by_analysis(e.results), tables) if model.get("model") else {}
    columns = sorted({k for c in cells.values() for k in c}, key=_order)
    winners = {(r["analysis"], r["dataset"], r["metric"]): r["winner"] for r in rows}
    stories = {}
    for key in columns:
        values = {n: c[key]["value"] for n, c in cells.items() if key in c}
        for name, rank in _ranks(values, replicates.get(key)).items():
            cells[name][key].update(rank)
            found = verdicts[name].get(key)
            if found:
                cells[name][key].update(verdict=found["verdict"], published=found["theirs"],
                                        tolerance=found["tolerance"])
        first = separated_first({n: c[key] for n, c in cells.items() if key in c})
        note = agreement(first, winners.get(key), correction or {}) if key in winners else None
        stories[key] = {"winner": winners.get(key), "first": first, **({"note": note} if note else {})}
    return {"columns": [{"id": column_id(*k), "analysis": k[0], "dataset": k[1], "metric": k[2], **stories[k]}
                        for k in columns],
            "rows": [{"experiment": e.name, "rev": e.rev, "model": models[e.name],
                      "cells": {column_id(*k): cells[e.name][k] for k in columns if k in cells[e.name]}}
                     for e in experiments],
            "published": _published(columns, tables),
            "method": f"ranks: 1 = highest; rank interval: {100 * (1 - stats.LEVEL) / 2:g}% and "
                      f"{100 * (1 + stats.LEVEL) / 2:g}% percentiles of each experiment's rank over "
                      f"{stats.RESAMPLES} joint resamples of the column's units; the rank shown is 1 + the number of "
                      f"experiments whose rank interval lies entirely above (experiments whose intervals overlap may "
                      f"still show different ranks)"}


def _cell_text(cell: Mapping[str, Any] | None) -> str:
    if not cell:
        return "-"
    text = f"{cell['value']:.4f}"
    if cell.get("low") is not None and cell.get("high") is not None:
        text += f" [{cell['low']:.4f},{cell['high']:.4f}]"
    rank = f"#{cell['rank']}"
    if cell.get("rank_low") is not None:
        rank += f" ({cell['rank_low']}-{cell['rank_high']})"
    return text + " " + rank + (f" {cell['verdict']}" if cell.get("verdict") else "")


def format_leaderboard(board: Mapping[str, Any]) -> str:
    """The leaderboard as a text table: one line per experiment (then each published row), one column per id."""
    ids = [c["id"] for c in board["columns"]]
    head = ["experiment", "model", *ids]
    lines = [[r["experiment"], r["model"] or "-", *(_cell_text(r["cells"].get(i)) for i in ids)] for r in board["rows"]]
    lines += [[f"published: {p['model_name']}", p["model"] or "-",
               *(f"{p['values'][i]['value']:.4f}" if i in p["values"] else "-" for i in ids)]
              for p in board["published"]]
    widths = [max(len(str(row[i])) for row in [head, *lines]) for i in range(len(head))]
    notes = [f"note: {c['id']}: {c['note']}" for c in board["columns"] if c.get("note")]
    return "\n".join(["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in [head, *lines]]
                     + notes)
