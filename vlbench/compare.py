"""`vlbench compare REV REV ...`: the result files of git revisions or DVC experiments side by side, with the paired
significance of every difference (docs/protocols.md, "Intervals and paired tests").

Each revision is read through DVC (`dvc.api.DVCFileSystem(repo, rev)`), never checked out: result JSONs from git,
per-sample tables from the DVC cache or the remote. A revision is anything git resolves (HEAD~1, a branch, a tag, a
commit) or an experiment name as `dvc exp show` gives it.

A difference is paired when both revisions kept per-sample results for the metric (a `<dataset>.predictions.parquet`
with `sample_id`, `label` and `predicted`, for `accuracy` and `mean_per_class`): paired bootstrap of b - a, and for
accuracy the exact McNemar test. Otherwise it is a normal approximation from the two intervals (`paired: false`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vlbench import stats
from vlbench.errors import VlbenchError

REPORTS = "reports"
SAMPLE_TABLE = "predictions"  # reports/<analysis>/<dataset>.predictions.parquet: sample_id, label, predicted
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

    def samples(self, analysis: str, dataset: str):
        """The per-sample table of (analysis, dataset) as a pyarrow table; None where the revision has none, or where
        neither the DVC cache nor the remote holds it (listed in `unavailable`)."""
        import pyarrow.parquet as pq
        from dvc.exceptions import DvcException

        path = f"{REPORTS}/{analysis}/{dataset}.{SAMPLE_TABLE}.parquet"
        if self.fs is None or not self.fs.exists(path):
            return None
        try:
            with self.fs.open(path, "rb") as f:
                return pq.read_table(f, columns=["sample_id", "label", "predicted"])
        except (FileNotFoundError, DvcException):
            self.unavailable.append(path)
            return None


def open_revision(rev: str, repo: str | Path = ".") -> Experiment:
    """The result files of `rev` (a git revision or a DVC experiment name) in the DVC repository `repo`."""
    from dvc.api import DVCFileSystem
    from dvc.exceptions import DvcException
    from dvc.scm import RevError

    try:
        fs = DVCFileSystem(str(repo), rev=rev)
        commit = fs.repo.get_rev()
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


def aligned_correctness(table_a, table_b, where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(correct_a, correct_b, labels) over the same samples, matched by sample_id; refuses samples that differ."""
    ids_a, ids_b = table_a.column("sample_id").to_pylist(), table_b.column("sample_id").to_pylist()
    if len(set(ids_a)) != len(ids_a) or len(set(ids_b)) != len(ids_b) or set(ids_a) != set(ids_b):
        only = sorted(set(ids_a) ^ set(ids_b))[:3]
        raise CompareError(f"{where}: the two revisions scored different samples ({len(ids_a)} against {len(ids_b)}, "
                           f"e.g. {only}); a paired test needs the same test set")
    position = {sid: i for i, sid in enumerate(ids_b)}
    order_b = np.array([position[sid] for sid in ids_a], dtype=np.int64)
    label_a = table_a.column("label").to_numpy()
    label_b = table_b.column("label").to_numpy()[order_b]
    if not np.array_equal(label_a, label_b):
        raise CompareError(f"{where}: the two revisions label the same samples differently (another dataset version)")
    correct_a = table_a.column("predicted").to_numpy() == label_a
    correct_b = table_b.column("predicted").to_numpy()[order_b] == label_b
    return correct_a, correct_b, label_a


def _number(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def difference(a: Experiment, b: Experiment, analysis: str, dataset: str, metric: str,
               samples: Mapping[str, Any]) -> dict[str, Any]:
    """One entry of a row's `differences`: b - a, paired where both kept per-sample results for the metric."""
    doc_a, doc_b = a.results[(analysis, dataset)], b.results[(analysis, dataset)]
    where = f"{analysis}/{dataset}"
    if metric in stats.SAMPLE_METRICS and samples.get(a.name) is not None and samples.get(b.name) is not None:
        correct_a, correct_b, labels = aligned_correctness(samples[a.name], samples[b.name], where)
        d = stats.paired_difference(metric, correct_a, correct_b, labels)
    else:
        d = stats.unpaired_difference(doc_a["metrics"][metric], doc_a.get("intervals", {}).get(metric),
                                      doc_b["metrics"][metric], doc_b.get("intervals", {}).get(metric))
    return {"a": a.name, "b": b.name, "delta": float(d.delta), "low": _number(d.low), "high": _number(d.high),
            "p_bootstrap": _number(d.p_bootstrap), "p_mcnemar": _number(d.p_mcnemar), "n": d.n, "paired": d.paired}


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
        samples = {e.name: e.samples(analysis, dataset) for e in present}
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
            diffs = [difference(a, b, analysis, dataset, metric, samples)
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
