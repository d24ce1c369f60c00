"""`vlbench compare REV REV ...`: the result files of git revisions or DVC experiments side by side, with the paired
significance of every difference (docs/protocols.md, "Intervals and paired tests").

Each revision is read through DVC (`dvc.api.DVCFileSystem(repo, rev)`), never checked out: result JSONs from git,
per-sample tables from the DVC cache or the remote. A revision is anything git resolves (HEAD~1, a branch, a tag, a
commit) or an experiment name as `dvc exp show` gives it.

A difference is paired where the analysis declares a per-sample table for the metric (its `ANALYSES` row,
`vlbench.analyses.SampleTable`: the table, the unit that pairs runs, the statistic) and the revisions kept it: the
units are resampled jointly for every revision that kept it (`vlbench.stats`, "Many systems on the same units"), so
each pairwise difference is a paired bootstrap (McNemar's exact test where a unit's outcome is 0/1, a paired
t-interval over episodes or seeds) and each replicate can be ranked (the leaderboard, `vlbench.leaderboard`). The
p-values are adjusted over the whole comparison (Holm, Benjamini-Hochberg or none) before a winner is called. A
difference that cannot be paired says why in `unpaired_reason` and is tested only with `unpaired` (a normal
approximation from the two intervals). Two revisions whose tables hold different units (another split, another
dataset version) are refused, naming the table. docs/protocols.md, "Paired comparisons".
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from fnmatch import fnmatchcase
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vlbench import stats
from vlbench.analyses import ANALYSES, SampleTable
from vlbench.analyses.zeroshot import softmax
from vlbench.errors import VlbenchError
from vlbench.io import atomic_path
from vlbench import metrics as metric_functions
from vlbench.leaderboard import build
from vlbench.metrics import CONVENTIONS, multilabel_indicator, topk_correct
from vlbench.report.html import render_comparison

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
    model: dict[str, Any] = field(default_factory=dict)  # its reports/model.json, where the report stage wrote one
    unavailable: list[str] = field(default_factory=list)  # per-sample tables in neither the cache nor the remote
    _tables: dict[tuple, tuple[Any, str]] = field(default_factory=dict, repr=False)

    def table(self, analysis: str, dataset: str, declared: SampleTable, columns: Sequence[str],
              optional: Sequence[str] = ()) -> tuple[Any, str]:
        """(the `columns` of reports/<analysis>/<dataset>.<table>.parquet, and those of `optional` it has, as a pyarrow
        table, "") or (None, why not): the revision has no such file, neither the DVC cache nor the remote holds it
        (also listed in `unavailable`), or it lacks a column the statistic needs."""
        path = f"{REPORTS}/{analysis}/{dataset}.{declared.name}.parquet"
        wanted = (path, tuple(columns), tuple(optional))
        if wanted not in self._tables:
            self._tables[wanted] = self._read(path, list(columns), list(optional))
        return self._tables[wanted]

    def _read(self, path: str, columns: list[str], optional: list[str]) -> tuple[Any, str]:
        import pyarrow.parquet as pq
        from dvc.exceptions import DvcException

        if self.fs is None or not self.fs.exists(path):
            return None, f"{self.name} has no {path}"
        if path in self.unavailable:
            return None, f"{self.name}'s {path} is in neither the DVC cache nor the remote (dvc pull)"
        try:
            with self.fs.open(path, "rb") as f:
                found = pq.read_schema(f).names
                missing = [c for c in columns if c not in found]
                if missing:
                    return None, f"{self.name}'s {path} lacks the column(s) {missing} its analysis declares"
                f.seek(0)
                return pq.read_table(f, columns=list(dict.fromkeys(
                    [*columns, *(c for c in optional if c in found)]))), ""
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
    model = json.loads(fs.read_text(f"/{REPORTS}/model.json")) if fs.exists(f"/{REPORTS}/model.json") else {}
    return Experiment(rev, commit, results, fs, model=model if isinstance(model, dict) else {})


# ------------------------------------------------------------------------------------------------- comparing


def declared_tables(analysis: str, metric: str) -> tuple[list[SampleTable], str]:
    """The per-sample tables `analysis` (its ANALYSES row) declares for `metric`, in its order, or ([], why there is
    none)."""
    declared = ANALYSES[analysis].tables if analysis in ANALYSES else ()
    found = [t for t in declared if any(fnmatchcase(metric, p) for p in t.metrics)]
    return found, "" if found else f"{analysis} declares no per-sample table for {metric!r}"


def select_fields(declared: SampleTable, metric: str) -> dict[str, str] | None:
    """The fields of `declared.select` in the metric key ("{positive}_vs_{negative}" on "captions_vs_random":
    {"positive": "captions", "negative": "random"}), {} without a template, None where the key does not fit it."""
    if not declared.select:
        return {}
    parts = re.split(r"\{(\w+)\}", declared.select)
    pattern = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>.+?)" for i, p in enumerate(parts))
    found = re.fullmatch(pattern, metric)
    return found.groupdict() if found else None


@dataclass
class Paired:
    """The paired statistic of one row over the experiments that kept its table (`names`, in the order given)."""

    names: list[str]
    estimator: Any
    unit: str


def _strings(table, columns: Sequence[str]) -> np.ndarray:
    """One string per row naming it by `columns` (joined with an unprintable separator)."""
    import pyarrow.compute as pc

    parts = [pc.cast(table.column(c), "string") for c in columns]
    joined = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, "\x1f")
    return np.asarray(joined.to_numpy(zero_copy_only=False), dtype=object)


def _align(tables: list, declared: SampleTable, names: list[str], where: str) -> list:
    """The tables with their rows in the first one's order (by the declared key); refuses tables whose rows or labels
    differ (another split or dataset version), naming the table and the runs."""
    first = tables[0]
    ids = _strings(first, declared.key)
    if len(set(ids)) != ids.size:
        raise CompareError(f"{where}: {names[0]}'s rows repeat a {'/'.join(declared.key)}: a paired test needs each "
                           f"{declared.unit} once")
    out = [first]
    order_first = np.argsort(ids, kind="stable")
    for name, table in zip(names[1:], tables[1:]):
        if table.select(declared.key).equals(first.select(declared.key)):
            out.append(table)
            continue
        other = _strings(table, declared.key)
        order = np.argsort(other, kind="stable")
        same = other.size == ids.size and np.array_equal(other[order], ids[order_first])
        if not same:
            only = sorted(map(str, set(ids) ^ set(other)))[:3]
            raise CompareError(f"{where}: {names[0]} and {name} scored different {declared.unit}s "
                               f"({'/'.join(declared.key)} differ: {ids.size} against {other.size}, e.g. "
                               f"{[o.replace(chr(31), '/') for o in only]}); a paired test needs the same test set")
        position = np.empty(ids.size, np.int64)
        position[order_first] = order
        out.append(table.take(position))
    if declared.label and declared.label in first.column_names:
        labels = first.column(declared.label)
        for name, table in zip(names[1:], out[1:]):
            if not table.column(declared.label).equals(labels):
                raise CompareError(f"{where}: {names[0]} and {name} label the same {declared.unit}s differently "
                                   f"(another dataset version)")
    return out


def _column(table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False)


def _correct(table, declared: SampleTable) -> np.ndarray:
    if declared.correct:
        return _column(table, declared.correct).astype(bool)
    return _column(table, declared.predicted) == _column(table, declared.label)


def _per_unit(correct: np.ndarray, labels, measure: str) -> float:
    if measure == "accuracy":
        return float(correct.mean())
    return float(np.mean([correct[labels == c].mean() for c in np.unique(labels)]))


def _estimators(declared: SampleTable, tables: list, fields: Mapping[str, str], measure: str | None,
                reported: np.ndarray):
    """[(measure, estimator)] candidates for the statistic on the aligned tables (one per experiment)."""
    first = tables[0]
    if declared.statistic == "mean":
        value = np.stack([_column(t, declared.value.format(**fields)).astype(np.float64) for t in tables])
        if declared.at_most:
            value = (value <= int(fields[declared.at_most])).astype(np.float64)
        if declared.cluster is None:
            return [("mean", stats.Ratio(value))]
        _, cluster = np.unique(_column(first, declared.cluster).astype(str), return_inverse=True)
        size = np.bincount(cluster)
        hits = np.stack([np.bincount(cluster, weights=v, minlength=size.size) for v in value])
        return [("mean", stats.Ratio(hits, size))]
    if declared.statistic == "scores":
        return _score_estimators(tables, declared, measure, reported)
    if declared.statistic == "t" and declared.per is None:
        value = np.stack([_column(t, declared.value.format(**fields)) for t in tables])
        if any(v is None for v in value.ravel()):
            return []
        return [("mean", stats.UnitMeans(value.astype(np.float64)))]
    measures = [measure] if measure else ["accuracy", "mean_per_class"]
    correct = np.stack([_correct(t, declared) for t in tables])
    labels = _column(first, declared.label) if declared.label and declared.label in first.column_names else None
    if declared.statistic == "median":
        runs = _column(first, declared.per)  # each run's rows in one order of the other key columns
        order = np.lexsort((_strings(first, [k for k in declared.key if k != declared.per]), runs))
        k = np.unique(runs).size
        return [("accuracy", stats.MedianOfRuns(correct[:, order].reshape(len(tables), k, -1)))]
    if declared.statistic == "t":
        units = _column(first, declared.per)
        ids = np.unique(units)
        return [(m, stats.UnitMeans(np.array([[_per_unit(c[units == u], None if labels is None else labels[units == u],
                                                          m) for u in ids] for c in correct])))
                for m in measures if m == "accuracy" or labels is not None]
    out = []
    for m in measures:
        if m == "accuracy":
            out.append((m, stats.Ratio(correct.astype(np.float64))))
        elif m == "mean_per_class" and labels is not None:
            out.append((m, stats.PerClass(correct, labels)))
        elif m == "worst_group_accuracy":
            out.append((m, stats.PerClass(correct, _column(first, declared.groups).astype(str), "min")))
    return out


def _score_estimators(tables: list, declared: SampleTable, metric: str, reported: np.ndarray):
    """A whole-set metric recomputed from each run's scores: the scores as kept under each convention, or their
    row-wise softmax in float32 under ELEVATER's (`zeroshot.scoring: elevater`), for each run the first that gives its
    result file's number (two runs may have scored differently; they are still resampled together)."""
    scores = [np.stack(_column(t, declared.scores)) for t in tables]
    raw = tables[0].column(declared.label).to_pylist()
    if metric in stats.GROUP_TOPK:
        labels = np.asarray(raw, dtype=np.int64)
        correct = np.stack([topk_correct(s, labels, stats.GROUP_TOPK[metric]) for s in scores])
        return [(metric, stats.PerClass(correct, _column(tables[0], declared.groups).astype(str), "min"))]
    labels = (multilabel_indicator(raw, scores[0].shape[1]) if raw and isinstance(raw[0], list)
              else np.asarray(raw, dtype=np.int64))
    chosen = []
    for s, want in zip(scores, reported):
        candidates = [*((s, c) for c in CONVENTIONS), (softmax(s), "elevater")]
        found = next(((x, c) for x, c in candidates
                      if abs(metric_functions.compute(metric, x, labels, c) - want) <= SCORES_REPRODUCE), None)
        if found is None:
            return []
        chosen.append(found)
    return [(metric, stats.WholeSet(metric, [x for x, _ in chosen], labels, [c for _, c in chosen]))]


REPRODUCES = 1e-6  # the paired numbers must give each result file's number to within this
SCORES_REPRODUCE = 1e-4  # ... and those recomputed from float32 scores (logits) to within this


def row_statistic(experiments: Sequence[Experiment], analysis: str, dataset: str,
                  metric: str) -> tuple[Paired | None, dict[str, str]]:
    """(the paired statistic over the experiments that kept a declared table, {experiment: why it is not paired}) for
    one metric, from the first declared table that pairs it; refuses (CompareError) tables whose units differ
    between runs."""
    names = [e.name for e in experiments]
    tables, reason = declared_tables(analysis, metric)
    reasons: dict[str, str] = dict.fromkeys(names, reason)
    for declared in tables:
        paired, reasons = _pair_on(declared, experiments, analysis, dataset, metric)
        if paired is not None:
            return paired, reasons
    return None, reasons


def _pair_on(declared: SampleTable, experiments: Sequence[Experiment], analysis: str, dataset: str,
             metric: str) -> tuple[Paired | None, dict[str, str]]:
    names = [e.name for e in experiments]
    fields = select_fields(declared, metric)
    if declared.statistic is None:
        return None, dict.fromkeys(names, f"{analysis}'s {declared.name} table (unit: {declared.unit}): "
                                          f"{declared.unpaired}")
    if fields is None:
        return None, dict.fromkeys(names, f"{metric!r} is not a key of the form {declared.select!r}")
    measure = declared.measure or (metric if metric in (*stats.SAMPLE_METRICS, "worst_group_accuracy")
                                   or declared.statistic == "scores" else None)
    where = f"{REPORTS}/{analysis}/{dataset}.{declared.name}.parquet"
    read = {e.name: e.table(analysis, dataset, declared, declared.columns(fields, measure), list(fields))
            for e in experiments}
    reasons = {n: why for n, (table, why) in read.items() if table is None}
    have = [n for n in names if n not in reasons]
    if len(have) < 2:
        return None, {n: reasons.get(n) or f"only {n} kept {where}" for n in names}
    tables = []
    for n in have:
        table = read[n][0]
        for f, text in fields.items():
            if f in table.column_names:
                table = table.filter(_column(table, f).astype(str) == text)
        if table.num_rows == 0:
            return None, dict.fromkeys(names, f"{where} has no rows for {metric!r} ({fields})")
        tables.append(table)
    tables = _align(tables, declared, have, where)
    reported = np.array([float(e.results[(analysis, dataset)]["metrics"][metric]) for e in experiments
                         if e.name in have])
    found = []
    for m, estimator in _estimators(declared, tables, fields, measure, reported):
        if estimator.t_test and estimator.units < 2:
            return None, dict.fromkeys(names, f"{where}: one {declared.unit} only; a paired t-interval needs two")
        point = estimator.point()
        if np.allclose(point, reported, rtol=0, atol=REPRODUCES if declared.statistic != "scores" else SCORES_REPRODUCE):
            return Paired(have, estimator, declared.unit), reasons
        found.append(f"{m}: {np.round(point, 6).tolist()}")
    return None, dict.fromkeys(names, f"{where} does not reproduce {metric!r} ({np.round(reported, 6).tolist()} in "
                                      f"the result files; the table gives {'; '.join(found) or 'no number'})")


def _number(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _entry(a: str, b: str, delta: float, d: stats.Difference | None, unit: str | None, test: str | None,
           p: float | None, reason: str | None) -> dict[str, Any]:
    return {"a": a, "b": b, "delta": float(delta), "low": _number(d.low) if d else None,
            "high": _number(d.high) if d else None,
            "p_bootstrap": _number(d.p_bootstrap) if d and test in ("bootstrap", "mcnemar", "normal") else None,
            "p_mcnemar": _number(d.p_mcnemar) if d else None, "n": d.n if d else 0, "paired": bool(d and d.paired),
            "unit": unit, "unpaired_reason": reason, "test": test, "p": _number(p), "p_adjusted": None,
            "identical": bool(d and d.identical)}


def _paired_entries(paired: Paired, resamples: int) -> tuple[dict[tuple[str, str], dict[str, Any]], np.ndarray]:
    point, diffs, reps = stats.pairwise_differences(paired.estimator, resamples)
    out = {}
    for (i, j), d in diffs.items():
        if paired.estimator.t_test:
            test, p = "t", d.p_bootstrap
            d = stats.Difference(d.delta, d.low, d.high, float("nan"), None, d.n, True, d.identical)
        elif d.p_mcnemar is not None:
            test, p = "mcnemar", d.p_mcnemar
        else:
            test, p = "bootstrap", stats.bootstrap_se_p(d.delta, reps[:, j] - reps[:, i])
        out[paired.names[i], paired.names[j]] = _entry(paired.names[i], paired.names[j], d.delta, d, paired.unit,
                                                       test, p, None)
    return out, reps


def differences(have: Sequence[Experiment], analysis: str, dataset: str, metric: str, unpaired: bool = False,
                resamples: int = stats.RESAMPLES) -> tuple[list[dict[str, Any]], Paired | None, np.ndarray | None]:
    """Every pair's entry of a row's `differences` (b - a, in the order given), the paired statistic and its joint
    replicates (R, experiments paired) where there is one. A pair without a paired test gets its reason and, only
    with `unpaired`, the normal approximation from the two intervals."""
    paired, reasons = row_statistic(have, analysis, dataset, metric)
    entries, reps = _paired_entries(paired, resamples) if paired else ({}, None)
    out = []
    for i, a in enumerate(have):
        for b in have[i + 1:]:
            if (a.name, b.name) in entries:
                out.append(entries[a.name, b.name])
                continue
            doc_a, doc_b = a.results[(analysis, dataset)], b.results[(analysis, dataset)]
            va, vb = float(doc_a["metrics"][metric]), float(doc_b["metrics"][metric])
            reason = reasons.get(a.name) or reasons.get(b.name) or "not paired"
            if unpaired:
                d = stats.unpaired_difference(va, doc_a.get("intervals", {}).get(metric),
                                              vb, doc_b.get("intervals", {}).get(metric))
                out.append(_entry(a.name, b.name, vb - va, d, None, "normal", d.p_bootstrap, reason))
            else:
                out.append(_entry(a.name, b.name, vb - va, None, None, None, None,
                                  reason + " (vlbench compare --unpaired compares it from the two intervals)"))
    return out, paired, reps


def correct_rows(rows: Sequence[dict[str, Any]], method: str = "holm") -> tuple[int, int]:
    """Adjust every difference's `p` over the comparison's family (`stats.adjust_p`), in place: every tested difference
    except those of identical per-sample results (`identical`: no discordant unit, p = 1, no test can reject them;
    their `p_adjusted` is their `p`). (the number of tests in the family, the number of identical ones left out)."""
    entries = [d for r in rows for d in r["differences"] if d["p"] is not None]
    family = [d for d in entries if not d.get("identical")]
    p = np.array([d["p"] for d in family], dtype=np.float64)
    for d, q in zip(family, stats.adjust_p(p, method)):
        d["p_adjusted"] = _number(float(q))
    for d in entries:
        if d.get("identical"):
            d["p_adjusted"] = d["p"]
    return int(np.isfinite(p).sum()), len(entries) - len(family)


def winner(names: Sequence[str], differences: Sequence[Mapping[str, Any]], alpha: float = ALPHA) -> str | None:
    """The experiment better (higher) than every other with an adjusted p below `alpha`, else None."""
    for name in names:
        beats = 0
        for d in differences:
            if name not in (d["a"], d["b"]) or d.get("p_adjusted") is None or d["p_adjusted"] >= alpha:
                continue
            beats += (d["delta"] > 0) == (d["b"] == name)
        if beats == len(names) - 1 and len(names) > 1:
            return name
    return None


def compare(experiments: Sequence[Experiment], correction: str = "holm", unpaired: bool = False,
            leaderboard: bool | None = None, resamples: int = stats.RESAMPLES) -> dict[str, Any]:
    """The comparison as `vlbench compare --json` prints it (README, "Intervals and comparisons"): every row's values
    and pairwise differences, p-values adjusted over all of them (`correction`), each row's winner; with
    `leaderboard` (default: more than two experiments) the leaderboard (vlbench.leaderboard)."""
    if correction not in stats.CORRECTIONS:
        raise CompareError(f"--correction {correction!r}: one of {', '.join(stats.CORRECTIONS)}")
    keys = sorted({k for e in experiments for k in e.results})
    rows, replicates = [], {}
    for analysis, dataset in keys:
        present = [e for e in experiments if (analysis, dataset) in e.results]
        metrics = sorted({m for e in present for m, v in e.results[(analysis, dataset)]["metrics"].items()
                          if isinstance(v, (int, float)) and not isinstance(v, bool)})
        for metric in metrics:
            have = [e for e in present if isinstance(e.results[(analysis, dataset)]["metrics"].get(metric),
                                                     (int, float))]
            values = {}
            for e in have:
                doc = e.results[(analysis, dataset)]
                interval = doc.get("intervals", {}).get(metric) or {}
                values[e.name] = {"value": float(doc["metrics"][metric]), "low": interval.get("low"),
                                  "high": interval.get("high")}
            diffs, paired, reps = differences(have, analysis, dataset, metric, unpaired, resamples)
            if paired is not None:
                replicates[(analysis, dataset, metric)] = (paired.names, reps)
            rows.append({"analysis": analysis, "dataset": dataset, "metric": metric, "values": values,
                         "differences": diffs, "winner": None})
    tests, identical = correct_rows(rows, correction)
    for row in rows:
        row["winner"] = winner(list(row["values"]), row["differences"])
    data = {"experiments": [{"name": e.name, "rev": e.rev} for e in experiments], "rows": rows,
            "correction": {"method": correction, "alpha": ALPHA, "tests": tests, "unpaired": unpaired,
                           "identical_left_out": identical}}
    if leaderboard or (leaderboard is None and len(experiments) > 2):
        data["leaderboard"] = build(experiments, rows, replicates, data["correction"])
    return data


# ---------------------------------------------------------------------------------------------------- output


def _value(v: Mapping[str, Any] | None) -> str:
    if v is None:
        return "-"
    if v["low"] is None:
        return f"{v['value']:.4f}"
    return f"{v['value']:.4f} [{v['low']:.4f}, {v['high']:.4f}]"


def _significance(d: Mapping[str, Any]) -> str:
    p, adjusted = d.get("p"), d.get("p_adjusted")
    if p is None:
        return f"{d['b']}-{d['a']} {d['delta']:+.4f} (not tested: unpaired)"
    if d.get("identical"):
        return f"{d['b']}-{d['a']} {d['delta']:+.4f} p={p:.3g} identical, not in the family ({d['test']})"
    shown = f"p={p:.3g} adj={adjusted:.3g}" + ("*" if adjusted is not None and adjusted < ALPHA else "")
    return f"{d['b']}-{d['a']} {d['delta']:+.4f} {shown} ({d['test']})" + ("" if d["paired"] else " (unpaired)")


def correction_text(correction: Mapping[str, Any]) -> str:
    """What the adjusted p-values were adjusted over: the method, the family's size and the identical comparisons left
    out of it (docs/protocols.md, "Paired comparisons")."""
    method = {"holm": "Holm", "bh": "Benjamini-Hochberg", "none": "no correction"}.get(correction.get("method"),
                                                                                      "no correction")
    left_out = correction.get("identical_left_out") or 0
    return (f"p adjusted: {method} over {correction.get('tests', 0)} tests"
            + (f"; {left_out} comparison(s) of identical per-sample results left out of the family (no discordant "
               f"unit: p = 1, they cannot reject)" if left_out else ""))


def format_table(data: Mapping[str, Any]) -> str:
    """One line per analysis x dataset x metric: each experiment's value [interval], each difference with its raw and
    adjusted p (* where the adjusted one is below ALPHA) and its test, the winner."""
    names = [e["name"] for e in data["experiments"]]
    head = ["analysis/dataset/metric", *names, "differences", "winner"]
    lines = [[f"{r['analysis']}/{r['dataset']}/{r['metric']}", *(_value(r["values"].get(n)) for n in names),
              "; ".join(_significance(d) for d in r["differences"]), r["winner"] or "-"] for r in data["rows"]]
    widths = [max(len(str(row[i])) for row in [head, *lines]) for i in range(len(head))]
    table = "\n".join("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [head, *lines])
    return table + "\n" + correction_text(data.get("correction") or {})


def write_page(data: Mapping[str, Any], out: Path) -> Path:
    """<out>/index.html by vlbench.report.html.render_comparison, atomically."""
    path = Path(out) / "index.html"
    with atomic_path(path) as tmp:
        Path(tmp).write_text(render_comparison(dict(data)), encoding="utf-8")
    return path
