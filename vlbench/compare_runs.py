"""`vlbench compare REV REV ...`: the result files of git revisions or DVC experiments side by side, with the paired
significance of every difference (docs/protocols.md, "Intervals and paired tests").

Each revision is read through DVC (`dvc.api.DVCFileSystem(repo, rev)`), never checked out: result JSONs from git,
per-sample tables from the DVC cache or the remote. A revision is anything git resolves (HEAD~1, a branch, a tag, a
commit) or an experiment name as `dvc exp show` gives it.

A difference is paired where the analysis declares a per-sample table for the metric (its `ANALYSES` row,
`vlbench.analyses.SampleTable`: the table, the unit that pairs two runs, the statistic) and both revisions kept it:
paired bootstrap of b - a over the units, and for accuracy the exact McNemar test. Otherwise it is a normal
approximation from the two intervals (`paired: false`, with the reason in `unpaired_reason`). Two revisions whose
tables hold different units (another split, another dataset version) are refused, naming the table.
"""

from __future__ import annotations

import json
import math
import subprocess
from fnmatch import fnmatchcase
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vlbench import stats
from vlbench.analyses import ANALYSES, SampleTable
from vlbench.errors import VlbenchError

REPORTS = "reports"
ALPHA = 0.05  # a winner beats every other experiment with p below this


class CompareError(VlbenchError):
    """A revision that cannot be read, or results that cannot be compared (names the revision or dataset)."""


@dataclass
class Experiment:
    name: str  # as the user gave it
    rev: str  # the commit it resolves to
    results: dict[tuple[str, str], dict[str, Any]]  # (analysis, dataset) -> result JSON
    fs: Any = field(repr=False, default=None)  # its DVCFileSystem, for per-sample tables
    unavailable: list[str] = field(default_factory=list)  # per-sample tables in neither the cache nor the remote
    _tables: dict[str, tuple[Any, str]] = field(default_factory=dict, repr=False)

    def table(self, analysis: str, dataset: str, declared: SampleTable) -> tuple[Any, str]:
        """(the declared columns of reports/<analysis>/<dataset>.<table>.parquet as a pyarrow table, "") or (None, why
        not): the revision has no such file, neither the DVC cache nor the remote holds it (also listed in
        `unavailable`), or it lacks a declared column."""
        path = f"{REPORTS}/{analysis}/{dataset}.{declared.name}.parquet"
        if path not in self._tables:
            self._tables[path] = self._read(path, declared.columns())
        return self._tables[path]

    def _read(self, path: str, columns: list[str]) -> tuple[Any, str]:
        import pyarrow.parquet as pq
        from dvc.exceptions import DvcException

        if self.fs is None or not self.fs.exists(path):
            return None, f"{self.name} has no {path}"
        try:
            with self.fs.open(path, "rb") as f:
                found = pq.read_schema(f).names
                missing = [c for c in columns if c not in found]
                if missing:
                    return None, f"{self.name}'s {path} lacks the column(s) {missing} its analysis declares"
                f.seek(0)
                return pq.read_table(f, columns=columns), ""
        except (FileNotFoundError, DvcException):
            self.unavailable.append(path)
            return None, f"{self.name}'s {path} is in neither the DVC cache nor the remote (dvc pull)"


def resolve_commit(rev: str, repo: str | Path = ".") -> str:
    """The commit `rev` names (git, or a DVC experiment name); a tree or blob (`HEAD^{tree}`) is refused."""
    from dvc.scm import SCM, resolve_rev

    sha = resolve_rev(SCM(str(repo)), rev)
    kind = subprocess.run(["git", "cat-file", "-t", sha], cwd=repo, capture_output=True, text=True).stdout.strip()
    if kind != "commit":
        raise CompareError(f"revision {rev!r} is a {kind or 'unknown object'} ({sha[:10]}), not a commit: give a "
                           f"commit, branch, tag or experiment name")
    return sha


def open_revision(rev: str, repo: str | Path = ".") -> Experiment:
    """The result files of `rev` (a git revision or a DVC experiment name) in the DVC repository `repo`."""
    from dvc.api import DVCFileSystem
    from dvc.exceptions import DvcException
    from dvc.scm import RevError

    try:
        commit = resolve_commit(rev, repo)
        fs = DVCFileSystem(str(repo), rev=commit)
    except (RevError, DvcException) as err:
        raise CompareError(f"unknown revision {rev!r}: neither git nor `dvc exp show` knows it ({err})") from None
    results = {}
    for path in sorted(fs.glob(f"/{REPORTS}/*/*.json")):
        analysis, dataset = Path(path).parent.name, Path(path).stem
        doc = json.loads(fs.read_text(path))
        if isinstance(doc, dict) and isinstance(doc.get("metrics"), dict):
            results[(analysis, dataset)] = doc
    if not results:
        raise CompareError(f"revision {rev!r} ({commit[:10]}) has no result files under {REPORTS}/")
    return Experiment(rev, commit, results, fs)


# ------------------------------------------------------------------------------------------------- comparing


def declared_table(analysis: str, metric: str) -> tuple[SampleTable | None, str]:
    """The first per-sample table `analysis` declares for `metric`, or (None, why there is none)."""
    entry = ANALYSES.get(analysis)
    for declared in entry.tables if entry else ():
        if any(fnmatchcase(metric, pattern) for pattern in declared.metrics):
            return declared, ""
    return None, f"{analysis} declares no per-sample table for {metric!r}"


def _keys(table, declared: SampleTable) -> list:
    columns = [table.column(k).to_pylist() for k in declared.key]
    return columns[0] if len(columns) == 1 else list(zip(*columns))


def _correct(table, declared: SampleTable) -> np.ndarray:
    if declared.correct:
        return table.column(declared.correct).to_numpy(zero_copy_only=False).astype(bool)
    return table.column(declared.predicted).to_numpy() == table.column(declared.label).to_numpy()


def aligned_correctness(table_a, table_b, declared: SampleTable, where: str) -> tuple[np.ndarray, np.ndarray, Any]:
    """(correct_a, correct_b, labels or None) over the same units, matched by the declared key; refuses tables whose
    units or labels differ (another split or dataset version), naming the table."""
    ids_a, ids_b = _keys(table_a, declared), _keys(table_b, declared)
    if len(set(ids_a)) != len(ids_a) or len(set(ids_b)) != len(ids_b) or set(ids_a) != set(ids_b):
        only = sorted(map(str, set(ids_a) ^ set(ids_b)))[:3]
        raise CompareError(f"{where} scored different {declared.unit}s ({'/'.join(declared.key)} differ: "
                           f"{len(ids_a)} against {len(ids_b)}, e.g. {only}); a paired test needs the same test set")
    position = {sid: i for i, sid in enumerate(ids_b)}
    order_b = np.array([position[sid] for sid in ids_a], dtype=np.int64)
    table_b = table_b.take(order_b)
    labels = None
    if declared.label:
        labels = table_a.column(declared.label).to_numpy()
        if not np.array_equal(labels, table_b.column(declared.label).to_numpy()):
            raise CompareError(f"{where} label the same {declared.unit}s differently (another dataset version)")
    return _correct(table_a, declared), _correct(table_b, declared), labels


def paired_units(a: Experiment, b: Experiment, analysis: str, dataset: str, metric: str):
    """(declared table, correct_a, correct_b, labels, the stats metric) for a paired test of `metric`, or the reason
    it is not paired as a string."""
    declared, reason = declared_table(analysis, metric)
    if declared is None:
        return reason
    if declared.statistic is None:
        return f"{analysis}'s {declared.name} table (unit: {declared.unit}): {declared.unpaired}"
    (table_a, why_a), (table_b, why_b) = (e.table(analysis, dataset, declared) for e in (a, b))
    if table_a is None or table_b is None:
        return why_a or why_b
    where = f"{REPORTS}/{analysis}/{dataset}.{declared.name}.parquet"
    correct_a, correct_b, labels = aligned_correctness(table_a, table_b, declared, f"{where}: {a.name} and {b.name}")
    if declared.group:  # the metric is the accuracy of one group of rows
        rows = np.asarray(table_a.column(declared.group).to_pylist(), dtype=object) == metric
        if not rows.any():
            return f"{where} has no rows whose {declared.group} is {metric!r}: not the accuracy of one group"
        return (declared, correct_a[rows], correct_b[rows], None if labels is None else labels[rows], "accuracy")
    if metric not in stats.SAMPLE_METRICS:
        return f"{metric!r} is not computed from per-{declared.unit} correctness"
    return declared, correct_a, correct_b, labels, metric


def _number(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def difference(a: Experiment, b: Experiment, analysis: str, dataset: str, metric: str) -> dict[str, Any]:
    """One entry of a row's `differences`: b - a, paired over the unit the analysis declares for the metric, else
    from the two intervals with the reason in `unpaired_reason`."""
    doc_a, doc_b = a.results[(analysis, dataset)], b.results[(analysis, dataset)]
    paired = paired_units(a, b, analysis, dataset, metric)
    unit = reason = None
    if isinstance(paired, str):
        reason = paired
        d = stats.unpaired_difference(doc_a["metrics"][metric], doc_a.get("intervals", {}).get(metric),
                                      doc_b["metrics"][metric], doc_b.get("intervals", {}).get(metric))
    else:
        declared, correct_a, correct_b, labels, stat = paired
        unit = declared.unit
        d = stats.paired_difference(stat, correct_a, correct_b, labels)
    return {"a": a.name, "b": b.name, "delta": float(d.delta), "low": _number(d.low), "high": _number(d.high),
            "p_bootstrap": _number(d.p_bootstrap), "p_mcnemar": _number(d.p_mcnemar), "n": d.n, "paired": d.paired,
            "unit": unit, "unpaired_reason": reason}


def winner(names: Sequence[str], differences: Sequence[Mapping[str, Any]]) -> str | None:
    """The experiment better (higher) than every other with p_bootstrap < ALPHA, else None."""
    for name in names:
        beats = 0
        for d in differences:
            if name not in (d["a"], d["b"]) or d["p_bootstrap"] is None or d["p_bootstrap"] >= ALPHA:
                continue
            beats += (d["delta"] > 0) == (d["b"] == name)
        if beats == len(names) - 1 and len(names) > 1:
            return name
    return None


def compare(experiments: Sequence[Experiment]) -> dict[str, Any]:
    """The comparison as `vlbench compare --json` prints it (README, "Intervals and comparisons")."""
    keys = sorted({k for e in experiments for k in e.results})
    rows = []
    for analysis, dataset in keys:
        present = [e for e in experiments if (analysis, dataset) in e.results]
        metrics = sorted({m for e in present for m, v in e.results[(analysis, dataset)]["metrics"].items()
                          if not isinstance(v, str)})
        for metric in metrics:
            have = [e for e in present if metric in e.results[(analysis, dataset)]["metrics"]]
            values = {}
            for e in have:
                doc = e.results[(analysis, dataset)]
                interval = doc.get("intervals", {}).get(metric) or {}
                values[e.name] = {"value": float(doc["metrics"][metric]), "low": interval.get("low"),
                                  "high": interval.get("high")}
            diffs = [difference(a, b, analysis, dataset, metric)
                     for i, a in enumerate(have) for b in have[i + 1:]]
            rows.append({"analysis": analysis, "dataset": dataset, "metric": metric, "values": values,
                         "differences": diffs, "winner": winner([e.name for e in have], diffs)})
    return {"experiments": [{"name": e.name, "rev": e.rev} for e in experiments], "rows": rows}


# ---------------------------------------------------------------------------------------------------- output


def _value(v: Mapping[str, Any] | None) -> str:
    if v is None:
        return "-"
    if v["low"] is None:
        return f"{v['value']:.4f}"
    return f"{v['value']:.4f} [{v['low']:.4f}, {v['high']:.4f}]"


def _significance(d: Mapping[str, Any]) -> str:
    p = d["p_bootstrap"]
    shown = "p=?" if p is None else f"p={p:.3g}" + ("*" if p < ALPHA else "")
    return f"{d['b']}-{d['a']} {d['delta']:+.4f} {shown}" + ("" if d["paired"] else " (unpaired)")


def format_table(data: Mapping[str, Any]) -> str:
    """One line per analysis x dataset x metric: each experiment's value [interval], each difference with its p
    (* below ALPHA), the winner."""
    names = [e["name"] for e in data["experiments"]]
    head = ["analysis/dataset/metric", *names, "differences", "winner"]
    lines = [[f"{r['analysis']}/{r['dataset']}/{r['metric']}", *(_value(r["values"].get(n)) for n in names),
              "; ".join(_significance(d) for d in r["differences"]), r["winner"] or "-"] for r in data["rows"]]
    widths = [max(len(str(row[i])) for row in [head, *lines]) for i in range(len(head))]
    return "\n".join("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [head, *lines])


def write_page(data: Mapping[str, Any], out: Path) -> Path | None:
    """<out>/index.html by vlbench.report.html.render_comparison, atomically; None where that module is missing."""
    from vlbench.io import atomic_path

    try:
        from vlbench.report.html import render_comparison
    except ImportError:
        return None
    path = Path(out) / "index.html"
    with atomic_path(path) as tmp:
        Path(tmp).write_text(render_comparison(dict(data)), encoding="utf-8")
    return path
