"""The pages people read: reports/index.html (one experiment) and the comparison page of `vlbench compare`.

Both are static and offline: one file, a style block of its own (and, on a comparison with a leaderboard, an inline
script that sorts its table by the clicked column), every chart an inline SVG (the
report's own files under reports/plots), nothing fetched from anywhere, so a page opens from the file system and from
a DVC remote's copy alike. They are built from result files only (no model, no torch) and are a pure function of
their inputs: the same results give the same bytes. Every string that reaches the page goes through `html.escape`.

Intervals come from each result's top-level `intervals` ({metric: {low, high, level, method, resamples?, seed?}});
a metric without one shows without one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from html import escape
from pathlib import Path
from typing import Any

from vlbench.analyses import ANALYSES
from vlbench.reference.datacomp import AVERAGE, TASKS, place, run_numbers

STYLE = """
body { font-family: "DejaVu Sans", "Liberation Sans", Arial, sans-serif; margin: 2em auto; max-width: 1200px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0 1em; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.interval { color: #555; font-size: .9em; } .muted { color: #666; }
.winner { background: #e3f4e8; font-weight: bold; }
.reproduced { color: #1b7a3a; } .off { color: #a11d1d; font-weight: bold; }
figure { margin: 1em 0; overflow-x: auto; } figure svg { max-width: none; }
code, pre { background: #f6f6f6; padding: .1em .3em; } pre { padding: .6em; overflow-x: auto; }
nav { font-size: .9em; margin: -.5em 0 1em; }
.matrix-wrap { overflow-x: auto; }
table.matrix { table-layout: auto; }
table.matrix th { font-size: .85em; text-align: center; vertical-align: bottom; padding: .25em .3em; }
table.matrix th.dataset, table.matrix td.dataset { text-align: left; white-space: nowrap; vertical-align: middle; }
table.matrix td.cell { text-align: center; vertical-align: middle; padding: .2em .3em; }
table.matrix td.empty { background: #fafafa; }
.cell .value { font-variant-numeric: tabular-nums; font-weight: bold; }
.cell .metric, th .metric { font-size: .8em; color: #666; font-weight: normal; display: block; }
.cell .note, .cell .verdict { font-size: .75em; display: block; }
svg.ci { display: block; margin: .15em auto; overflow: visible; }
svg.ci .ci-track { fill: #d9d9d9; } svg.ci .ci-range { fill: #6baed6; } svg.ci .ci-value { fill: #08306b; }
details.numbers { margin: .4em 0; } details.numbers > summary { cursor: pointer; font-size: 1.1em; padding: .2em 0; }
details.numbers > p { margin: .3em 0 0 1.2em; }
details.numbers > table { margin-left: 1.2em; }
"""


def _e(x: Any) -> str:
    return escape(str(x), quote=True)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def number(x: Any, digits: int = 4) -> str:
    """A value as the pages print it: 4 decimals, `n/a` for a missing or non-finite number, text escaped as is."""
    if _is_number(x):
        return f"{x:.{digits}f}" if math.isfinite(x) else "n/a"
    return "n/a" if x is None else _e(x)


def interval_how(interval: Mapping[str, Any] | None) -> str:
    """How an interval was made (`95% bootstrap, 1000 resamples, seed 0`), unescaped; '' without one."""
    if not interval:
        return ""
    how = [f"{round(100 * float(interval.get('level', 0.95)))}% {interval.get('method', '')}".strip()]
    how += [f"{interval['resamples']} resamples"] if interval.get("resamples") is not None else []
    how += [f"seed {interval['seed']}"] if interval.get("seed") is not None else []
    return ", ".join(how)


def _page(title: str, body: list[str]) -> str:
    return "\n".join(["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
                      f"<title>{_e(title)}</title>", f"<style>{STYLE}</style>", "</head>", "<body>",
                      f"<h1>{_e(title)}</h1>", *body, "</body>", "</html>", ""])


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """`head` escaped here; each cell of `rows` is HTML already (its text escaped by the caller), `<td>` included."""
    return "\n".join(["<table>", "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>",
                      *("<tr>" + "".join(r) + "</tr>" for r in rows), "</table>"])


def _td(text: str, cls: str = "") -> str:
    return f'<td class="{_e(cls)}">{text}</td>' if cls else f"<td>{text}</td>"


# ---------------------------------------------------------------------------------------------------------
# reports/index.html


def headline_rows(metrics: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]]
                  ) -> list[tuple[str, str, str, Any, dict[str, Any] | None]]:
    """[(analysis, dataset, metric, value, interval or None)]: per analysis of `metrics` and dataset, the keys that
    match its table entry's `headline` patterns, in pattern order; `mean` rows (adapt) have no result, no interval."""
    rows = []
    for analysis, per_dataset in metrics.items():
        patterns = ANALYSES[analysis].headline if analysis in ANALYSES else ("*",)
        for dataset, values in per_dataset.items():
            intervals = ((results.get(analysis) or {}).get(dataset) or {}).get("intervals") or {}
            keys = list(dict.fromkeys(k for p in patterns for k in values if fnmatchcase(k, p)))
            rows += [(analysis, dataset, k, values[k], intervals.get(k)) for k in keys]
    return rows


def _model_section(model: Mapping[str, Any]) -> list[str]:
    rows = [[_td(_e(k)), _td(f"<code>{_e(v)}</code>")] for k, v in model.items()]
    return ["<h2 id=\"model\">The model</h2>",
            "<p>The fingerprint every result below was computed with (reports/model.json).</p>",
            _table(["key", "value"], rows)]


def _columns(metrics: Mapping[str, Any]) -> list[str]:
    """The analyses of `metrics` in the order of the ANALYSES table; analyses the table does not know after them."""
    return [a for a in ANALYSES if metrics.get(a)] + [a for a in metrics if a not in ANALYSES and metrics[a]]


def main_metric(analysis: str, values: Mapping[str, Any], declared: str | None = None) -> str | None:
    """The metric that stands for `analysis` on a dataset (`Analysis.main_metric`, what reports/headline.json holds:
    the metric the dataset's entry declares, `declared`, where the analysis reports it); for an analysis the table
    does not know, its first number."""

    if analysis in ANALYSES:
        return ANALYSES[analysis].main_metric(values, declared)
    return next((k for k, v in values.items() if _is_number(v)), None)


def _ends(interval: Mapping[str, Any] | None) -> tuple[float, float] | None:
    """(low, high) of an interval whose ends are finite numbers, else None."""
    if not interval:
        return None
    low, high = interval.get("low"), interval.get("high")
    if not (_is_number(low) and _is_number(high) and math.isfinite(low) and math.isfinite(high)):
        return None
    return float(low), float(high)


BAR_WIDTH, BAR_HEIGHT, BAR_PAD = 80, 14, 3  # px: the interval bar of a matrix cell, on a 0..1 scale


def interval_bar(value: Any, interval: Mapping[str, Any] | None) -> str:
    """An inline SVG: the 0..1 scale as a thin track (widened to hold a number or interval outside it), the 95%
    interval as a bar, the number as a dark tick; its `<title>` says what it shows. '' for a missing number."""
    if not _is_number(value) or not math.isfinite(value):
        return ""
    ends = _ends(interval)
    lo = min(0.0, value, *(ends or ()))
    hi = max(1.0, value, *(ends or ()))
    span = BAR_WIDTH - 2 * BAR_PAD

    def x(v: float) -> float:
        return BAR_PAD + (v - lo) / (hi - lo) * span

    marks = [f'<rect class="ci-track" x="{BAR_PAD}" y="{BAR_HEIGHT / 2 - 0.5:g}" width="{span}" height="1"/>']
    marks += [f'<rect class="ci-track" x="{x(t) - 0.5:.2f}" y="{BAR_HEIGHT / 2 - 3:g}" width="1" height="6"/>'
              for t in (0.0, 0.5, 1.0)]
    if ends:
        left, right = x(ends[0]), x(ends[1])
        marks.append(f'<rect class="ci-range" x="{left:.2f}" y="3" width="{max(right - left, 1.5):.2f}" '
                     f'height="{BAR_HEIGHT - 6}"/>')
        what = f"95% interval {number(ends[0])}\u2013{number(ends[1])} ({interval_how(interval)})"
    else:
        what = "no interval"
    marks.append(f'<rect class="ci-value" x="{x(value) - 0.75:.2f}" y="0" width="1.5" height="{BAR_HEIGHT}"/>')
    scale = "" if (lo, hi) == (0.0, 1.0) else f", scale {number(lo)} to {number(hi)}"
    return (f'<svg class="ci" width="{BAR_WIDTH}" height="{BAR_HEIGHT}" viewBox="0 0 {BAR_WIDTH} {BAR_HEIGHT}" '
            f'role="img" aria-label="{_e(what + scale)}"><title>{_e(what + scale)}</title>'
            + "".join(marks) + "</svg>")


def _verdicts(reference: Mapping[str, Any]) -> dict[tuple[str, str, str], list[Mapping[str, Any]]]:
    """{(analysis, dataset, metric key): [comparison]} of reports/reference.json."""
    found: dict[tuple[str, str, str], list[Mapping[str, Any]]] = {}
    for c in (reference.get("comparisons") or []) if reference.get("applies") else []:
        found.setdefault((c["analysis"], c["dataset"], c.get("key") or c["metric"]), []).append(c)
    return found


def matrix_rows(metrics: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The datasets of the matrix, one row each: in order of first appearance over the analyses (table order); rows
    without a result file of their own (adapt's `mean`, a summary over datasets) last."""
    order = list(dict.fromkeys(d for a in _columns(metrics) for d in metrics[a]))
    summary = {d for d in order if not any(d in (results.get(a) or {}) for a in metrics)}
    return [d for d in order if d not in summary] + [d for d in order if d in summary]


def _breakable(name: str) -> str:
    """`name` escaped, a line break allowed after each / (a metric key in a narrow column)."""
    return _e(name).replace("/", "/<wbr>")


def _matrix_cell(analysis: str, dataset: str, key: str | None, common: str | None, metrics: Mapping[str, Any],
                 results: Mapping[str, Any], notes: Mapping[tuple, list[str]],
                 verdicts: Mapping[tuple, list[Mapping[str, Any]]]) -> str:
    """A cell: the number, its interval bar, its metric where it is not the column's, notes and verdicts."""
    if key is None:
        return f'<td class="empty" data-analysis="{_e(analysis)}" data-dataset="{_e(dataset)}"></td>'
    value = metrics[analysis][dataset][key]
    interval = (((results.get(analysis) or {}).get(dataset) or {}).get("intervals") or {}).get(key)
    marks = "".join(f'<span class="verdict {_e(c["verdict"])}" title="{_e(_source(c) + ": " + c.get("message", ""))}">'
                    f'{_e(c["verdict"])} ({_e(c["source"]["paper"])})</span>'
                    for c in verdicts.get((analysis, dataset, key), []))
    note = "; ".join(notes.get((analysis, dataset, key), []))
    ends = _ends(interval)
    data = f' data-low="{ends[0]!r}" data-high="{ends[1]!r}"' if ends else ""
    return (f'<td class="cell" data-analysis="{_e(analysis)}" data-dataset="{_e(dataset)}" data-metric="{_e(key)}" '
            f'data-value="{_e(repr(value))}"{data}><span class="value">{number(value)}</span>'
            + interval_bar(value, interval)
            + (f'<span class="metric">{_breakable(key)}</span>' if key != common else "")
            + (f'<span class="note">{_e(note)}</span>' if note else "") + marks + "</td>")


def _matrix_section(metrics: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]],
                    reference: Mapping[str, Any], declared: Mapping[str, str]) -> list[str]:
    """Datasets x analyses: each cell the analysis's main number (reports/headline.json), its interval as a bar, the
    reference verdict where one exists; an empty cell where the analysis did not run on the dataset. A column's
    most common metric is named in its head, any other in its cell."""
    from collections import Counter


    columns, datasets = _columns(metrics), matrix_rows(metrics, results)
    keys = {(a, d): main_metric(a, metrics[a][d], declared.get(d)) if metrics[a].get(d) else None
            for a in columns for d in datasets}
    common = {a: next(iter(Counter(k for (a2, _), k in keys.items() if a2 == a and k).most_common(1)), (None,))[0]
              for a in columns}
    notes, _ = text_notes(headline_rows(metrics, results))
    verdicts = _verdicts(reference)
    head = "".join(f'<th data-analysis="{_e(a)}" title="{_e(ANALYSES[a].title if a in ANALYSES else a)}">'
                   f'<a href="#{_e(a)}">{_e(a)}</a>'
                   + (f'<span class="metric">{_breakable(common[a])}</span>' if common[a] else "") + "</th>"
                   for a in columns)
    rows = [f'<tr><td class="dataset">{_e(d)}</td>'
            + "".join(_matrix_cell(a, d, keys[a, d], common[a], metrics, results, notes, verdicts) for a in columns)
            + "</tr>" for d in datasets]
    summary = ", ".join(f"{n} {v}" for v, n in (reference.get("summary") or {}).items()) \
        if reference.get("applies") else ""
    return ['<h2 id="overview">At a glance</h2>',
            "<p>Each cell: the analysis&#x27;s main number on the dataset (reports/headline.json; its metric under the "
            "column&#x27;s name, or in the cell where it differs), the 95% interval as a bar on the 0&ndash;1 scale "
            "(the dark tick is the number; no bar: no interval), and the verdict against the papers where a "
            "published number exists" + (f" ({_e(summary)})" if summary else "")
            + ". An empty cell: the analysis did not run on that dataset. Every number, with its interval, is in "
            "the tables below.</p>",
            '<div class="matrix-wrap"><table class="matrix">',
            f'<tr><th class="dataset">dataset</th>{head}</tr>', *rows, "</table></div>"]


def _numbers_table(rows: list[tuple[str, str, str, Any, Any]], notes: Mapping[tuple, list[str]],
                   with_method: bool) -> str:
    """dataset, metric, value, interval (low-high, how in its title), how again where `with_method`, and a note
    column where a row has one (a text value: beside the number it qualifies, or in its own row's note)."""
    body = []
    for a, d, m, v, i in rows:
        ends = _ends(i)
        span = f"{number(ends[0])}&ndash;{number(ends[1])}" if ends else ""
        how = f' title="{_e(interval_how(i))}"' if ends else ""
        text = "" if _is_number(v) or v is None else str(v)
        cells = [_td(_e(d)), _td(_e(m)), _td(number(v) if not text else "", "num"),
                 f'<td class="num"{how}>{span}</td>']
        cells += [_td(_e(interval_how(i)) if ends else "", "muted")] if with_method else []
        body.append((cells, "; ".join(notes.get((a, d, m), [])) or text))
    with_notes = any(note for _, note in body)
    head = ["dataset", "metric", "value", "95% interval", *(["interval from"] if with_method else []),
            *(["note"] if with_notes else [])]
    return _table(head, [cells + ([_td(_e(note), "note")] if with_notes else []) for cells, note in body])


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _headline_section(metrics: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Every headline number, one folded section per analysis (the first open): dataset, metric, value, interval."""

    found = headline_rows(metrics, results)
    notes, folded = text_notes(found)
    out = ["<h2 id=\"headline\">All headline numbers</h2>",
           "<p>Every analysis on every dataset (reports/metrics.json), with its 95% interval where the result has "
           "one (its <code>intervals</code>: <em>bootstrap</em> resamples the test samples, <em>seeds</em> spans the "
           "protocol&#x27;s seeds, <em>episodes</em> its few-shot episodes); a text value (which variant) is a note on "
           "the numbers it qualifies. All other numbers are in reports/&lt;analysis&gt;/&lt;dataset&gt;.json.</p>"]
    for n, analysis in enumerate(_columns(metrics)):
        rows = [r for r in found if r[0] == analysis and r[:3] not in folded]
        if not rows:
            continue
        hows = list(dict.fromkeys(interval_how(r[4]) for r in rows if _ends(r[4])))
        datasets = len({r[1] for r in rows})
        title = ANALYSES[analysis].title if analysis in ANALYSES else analysis
        method = (f"Intervals: {_e(hows[0])}." if len(hows) == 1
                  else "No number here has an interval." if not hows else "")
        out += [f'<details class="numbers" id="numbers-{_e(analysis)}"{" open" if n == 0 else ""}>',
                f'<summary><strong>{_e(analysis)}</strong>: {_e(title)} <span class="muted">'
                f'({_count(len(rows), "number")}, {_count(datasets, "dataset")})</span></summary>',
                f'<p class="muted">{method}</p>' if method else "",
                _numbers_table(rows, notes, with_method=len(hows) > 1), "</details>"]
    return [line for line in out if line]


def text_notes(rows: list[tuple[str, str, str, Any, Any]]) -> tuple[dict[tuple, list[str]], set[tuple]]:
    """Text values (zeroshot's `knowledge_best_variant`: which variant) go to the note column, never the number
    column: onto the rows of the same analysis and dataset whose metric shares their stem (`knowledge_best_*`), as
    "variant: repe"; a text value without such a row keeps its own row (value column empty). Returns ({row key:
    notes}, the keys of the text rows folded into others)."""
    notes: dict[tuple, list[str]] = {}
    folded: set[tuple] = set()
    for a, d, m, v, _ in rows:
        if _is_number(v) or v is None:
            continue
        stem, _, what = m.rpartition("_")
        targets = [(a, d, k) for a2, d2, k, v2, _ in rows if (a2, d2) == (a, d) and k != m and stem
                   and k.startswith(f"{stem}_") and (_is_number(v2) or v2 is None)]
        for key in targets:
            notes.setdefault(key, []).append(f"{what}: {v}")
        if targets:
            folded.add((a, d, m))
    return notes, folded


def _source(c: Mapping[str, Any]) -> str:
    return f"{c['source']['paper']}, {c['source']['table']}, {c['source'].get('row', '')}"


def _reference_section(reference: Mapping[str, Any]) -> list[str]:
    head = ["<h2 id=\"reference\">Against the papers</h2>"]
    if not reference.get("applies"):
        return head + [f"<p>No reference applies to this run: {_e(reference.get('reason', ''))}</p>"]
    summary = ", ".join(f"{n} {v}" for v, n in (reference.get("summary") or {}).items())
    rows = [[_td(_e(c["analysis"])), _td(_e(c["dataset"])), _td(_e(c.get("key") or c["metric"])),
             _td(number(c["ours"]), "num"), _td(number(c["theirs"]), "num"), _td(number(c["difference"]), "num"),
             _td(number(c["tolerance"]), "num"), _td(_e(c["verdict"]), c["verdict"]), _td(_e(c["message"])),
             _td(_e(_source(c)))]
            for c in reference.get("comparisons") or []]
    return head + [f"<p>{_e(summary)} (reports/reference.json; tolerances: docs/protocols.md, \"Reference numbers "
                   "and verdicts\").</p>",
                   _table(["analysis", "dataset", "number", "ours", "published", "difference", "tolerance",
                           "verdict", "in words", "source"], rows)]


def _placement_rank_text(cell: Mapping[str, Any]) -> str:
    if cell.get("rank_best") is None:
        return '<span class="muted">none</span>'
    return f"{_e(cell['rank_best'])}&ndash;{_e(cell['rank_worst'])}"


def _placement_section(metrics: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Where the run's DataComp tasks and their average rank among open_clip's published models; nothing when the
    run has none of the 38 (vlbench.reference.datacomp)."""
    numbers = run_numbers(metrics, results)
    if not numbers:
        return []
    placed = place(numbers)
    order = [c for c in (AVERAGE, *TASKS) if c in placed]
    rows = [[_td(_e(c)), _td(_e(TASKS[c]["entry"] if c in TASKS else "the 38 tasks' mean")),
             _td(_e(TASKS[c]["metric"] if c in TASKS else "mean of main metrics")),
             _td(number(placed[c]["value"]), "num"),
             _td(f"[{number(placed[c]['low'])}, {number(placed[c]['high'])}]" if placed[c]["low"] is not None
                 else '<span class="muted">none</span>', "interval"),
             _td(_e(placed[c]["standing"]), "num"),
             _td(_placement_rank_text(placed[c]), "num")]
            for c in order]
    lacking = "" if AVERAGE in placed else (f" The average is placed when all 38 tasks ran ({len(order)} here).")
    return ["<h2 id=\"placement\">On open_clip's table</h2>",
            "<p>Where each DataComp task of this run and their average rank among the models of open_clip's "
            "published results table (rank 1 = best; a published value equal to ours does not rank above it; the "
            "rank interval is the ranks of the interval's ends; the average's interval combines the tasks' as "
            "independent test sets). The published models include this model's own row where it has one (its "
            "verdicts are above)." + _e(lacking) + "</p>",
            _table(["column", "dataset", "metric", "ours", "95% interval", "rank", "rank interval"], rows)]


_XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*\?>\s*")
_ID = re.compile(r'\bid="([^"]+)"')


def inline_svg(svg: str, scope: str) -> str:
    """`svg` for a page that holds several: the XML declaration dropped, every id (and each `#id` reference to it)
    prefixed with `scope`, since charts rendered separately reuse the same ids (clip1, gradient_1)."""
    svg = _XML_DECLARATION.sub("", svg)
    ids = sorted(set(_ID.findall(svg)), key=len, reverse=True)
    if not ids:
        return svg.strip()
    pattern = re.compile(r'(id="|#)(' + "|".join(map(re.escape, ids)) + r')(?=["\)])')
    return pattern.sub(lambda m: f"{m.group(1)}{scope}-{m.group(2)}", svg).strip()


def _analysis_section(analysis: str, charts: Sequence[Path]) -> list[str]:
    entry = ANALYSES.get(analysis)
    title, explain = (entry.title, entry.explain) if entry else (analysis, "")
    out = [f'<h2 id="{_e(analysis)}">{_e(title)}</h2>', f"<p>{_e(explain)}</p>" if explain else ""]
    for path in charts:
        scope = re.sub(r"[^A-Za-z0-9_-]", "-", Path(path).stem)
        out += [f'<figure id="chart-{_e(scope)}">', inline_svg(Path(path).read_text(encoding="utf-8"), scope),
                f"<figcaption class=\"muted\">reports/plots/{_e(Path(path).name)}</figcaption>", "</figure>"]
    return [line for line in out if line]


def _reproduce_section(run: Mapping[str, Any]) -> list[str]:
    model, suite = run.get("model"), run.get("suite")
    command = f"dvc exp run -S model={model} -S suite={suite}" if model and suite else "dvc repro"
    lines = ["git checkout $(git log -1 --format=%H -- reports/index.html)  # the commit that holds this page",
             "make setup", command]
    return ["<h2 id=\"reproduce\">Reproduce</h2>",
            "<p>Built by the <code>report</code> stage from result files only. The commit that holds this page holds "
            "the code, params and <code>dvc.lock</code> that made it (the page does not name it: a page naming its own "
            "commit would change at every commit and could not be rerun byte for byte). To make these numbers "
            "again:</p>",
            "<pre>" + _e("\n".join(lines)) + "</pre>"]


def _nav(metrics: Mapping[str, Any]) -> list[str]:
    links = [("overview", "at a glance"), ("headline", "all numbers"), ("model", "the model"),
             ("reference", "against the papers"), *((a, a) for a in metrics), ("reproduce", "reproduce")]
    return ["<nav>" + " &middot; ".join(f'<a href="#{_e(i)}">{_e(t)}</a>' for i, t in links) + "</nav>"]


def index_page(*, model: Mapping[str, Any], metrics: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]],
               reference: Mapping[str, Any], charts: Mapping[str, Sequence[Path]], run: Mapping[str, Any],
               declared: Mapping[str, str] | None = None) -> str:
    """reports/index.html: first the matrix (datasets x analyses, each cell the main number, its interval as a bar,
    the reference verdict), then every headline number folded by analysis, the model, the reference comparison, each
    analysis's charts with what its numbers mean, and how to reproduce it (`run`: {"model", "suite"}); `declared`:
    {dataset: the metric its entry declares}, the matrix's number where the analysis reports it."""
    body = (_nav(metrics) + _matrix_section(metrics, results, reference, declared or {})
            + _headline_section(metrics, results)
            + _model_section(model) + _reference_section(reference) + _placement_section(metrics, results))
    for analysis in metrics:
        body += _analysis_section(analysis, charts.get(analysis) or [])
    body += _reproduce_section(run)
    return _page(f"vlbench report: {model.get('model') or 'no model'}", body)


# ---------------------------------------------------------------------------------------------------------
# the comparison page (`vlbench compare`)


TEST_NAMES = {"mcnemar": "McNemar", "bootstrap": "bootstrap SE", "t": "paired t", "normal": "normal"}


def _difference_text(d: Mapping[str, Any]) -> str:
    """b - a with its interval and p-values: the test's raw p and its p adjusted over the comparison (paired: McNemar's
    exact test, the bootstrap, or a t-test over episodes or seeds), or, only with --unpaired, from the two
    intervals; untested where the runs cannot be paired or their per-sample results are identical."""
    if d.get("p") is None:
        p = ['<span class="muted">not tested</span>']
    elif d.get("paired"):
        test = TEST_NAMES.get(d.get("test"), d.get("test") or "")
        p = [f"p<sub>{_e(test)}</sub> = {number(d.get('p'))}",
             '<span class="muted">identical per-sample results: not in the correction\'s family</span>'
             if d.get("identical") else f"adjusted {number(d.get('p_adjusted'))}"]
        p += ([f"p<sub>percentile bootstrap</sub> = {number(d.get('p_bootstrap'))}"]
              if d.get("p_bootstrap") is not None and d.get("test") != "mcnemar" else [])
        unit = f" {_e(d['unit'])}s" if d.get("unit") else ""
        p += [f"n = {_e(d['n'])}{unit}, paired"] if d.get("n") is not None else ["paired"]
    else:
        p = [f"p = {number(d.get('p'))}, adjusted {number(d.get('p_adjusted'))}, unpaired (from the two intervals)"]
    if not d.get("paired") and d.get("unpaired_reason"):
        p += [f'<span class="muted">{_e(d["unpaired_reason"])}</span>']
    return (f"{_e(d['b'])} &minus; {_e(d['a'])}: {number(d.get('delta'))} "
            f"<span class=\"interval\">[{number(d.get('low'))}, {number(d.get('high'))}]</span>, " + ", ".join(p))


def comparison_rows(data: Mapping[str, Any]) -> list[list[str]]:
    names = [x["name"] for x in data.get("experiments") or []]
    rows = []
    for row in data.get("rows") or []:
        cells = [_td(_e(row["analysis"])), _td(_e(row["dataset"])), _td(_e(row["metric"]))]
        for name in names:
            v = (row.get("values") or {}).get(name)
            text = "n/a" if v is None else number(v.get("value")) + (
                f' <span class="interval">[{number(v["low"])}, {number(v["high"])}]</span>'
                if v.get("low") is not None and v.get("high") is not None else "")
            cells.append(_td(text, "num winner" if row.get("winner") == name else "num"))
        diffs = "<br>".join(_difference_text(d) for d in row.get("differences") or [])
        cells += [_td(diffs or '<span class="muted">none</span>'), _td(_e(row.get("winner") or "none"))]
        rows.append(cells)
    return rows


LEADERBOARD_STYLE = """<style>
table.sortable th { cursor: pointer; } tr.published td { background: #f7f7f7; color: #444; }
th[data-dir="desc"]::after { content: " \\25BC"; } th[data-dir="asc"]::after { content: " \\25B2"; }
</style>"""
SORT_SCRIPT = """<script>
// click a header of the leaderboard to sort its rows by that column (again: the other way); empty cells last
document.querySelectorAll('table.sortable').forEach(table => {
  table.querySelectorAll('th').forEach((th, col) => th.addEventListener('click', () => {
    const body = table.tBodies[0], rows = [...body.rows];
    const down = th.dataset.dir !== 'desc';
    table.querySelectorAll('th').forEach(h => delete h.dataset.dir);
    th.dataset.dir = down ? 'desc' : 'asc';
    const key = r => r.cells[col].dataset.sort;
    rows.sort((a, b) => {
      const x = key(a), y = key(b);
      if (x === undefined || x === '') return 1;
      if (y === undefined || y === '') return -1;
      const nx = Number(x), ny = Number(y);
      const c = (isNaN(nx) || isNaN(ny)) ? x.localeCompare(y) : nx - ny;
      return down ? -c : c;
    });
    rows.forEach(r => body.appendChild(r));
  }));
});
</script>"""


def _leaderboard_rank_text(cell: Mapping[str, Any]) -> str:
    text = f"#{_e(cell['rank'])}"
    if cell.get("rank_low") is not None:
        text += f" ({_e(cell['rank_low'])}&ndash;{_e(cell['rank_high'])})"
    return f'<span class="rank">{text}</span>'


def leaderboard_cell(cell: Mapping[str, Any] | None) -> str:
    """A `<td>` of the leaderboard: the value, its interval, its rank and rank interval, the verdict where a published
    number exists; `data-sort` holds the value for sorting."""
    if not cell:
        return '<td class="num" data-sort=""><span class="muted">n/a</span></td>'
    text = number(cell.get("value"))
    if cell.get("low") is not None and cell.get("high") is not None:
        text += f' <span class="interval">[{number(cell["low"])}, {number(cell["high"])}]</span>'
    if cell.get("rank") is not None:
        text += " " + _leaderboard_rank_text(cell)
    if cell.get("verdict"):
        text += (f' <span class="{_e(cell["verdict"])}" title="published {number(cell.get("published"))}, '
                 f'tolerance {number(cell.get("tolerance"))}">{_e(cell["verdict"])}</span>')
    value = cell.get("value")
    sort = f"{value:.12g}" if _is_number(value) and math.isfinite(value) else ""
    return f'<td class="num" data-sort="{sort}">{text}</td>'


def render_leaderboard(board: Mapping[str, Any]) -> str:
    """The leaderboard section: a table sortable by any column (click its header), one row per experiment and one
    per published model, each cell with its interval, rank (and rank interval) and verdict."""
    columns = board.get("columns") or []
    head = "".join(f'<th title="{_e(c["id"])}">{_e(c["analysis"])}<br>{_e(c["dataset"])}<br>'
                   f'<span class="muted">{_e(c["metric"])}</span></th>' for c in columns)
    rows = []
    for r in board.get("rows") or []:
        cells = "".join(leaderboard_cell(r["cells"].get(c["id"])) for c in columns)
        rows.append(f'<tr class="experiment"><td data-sort="{_e(r["experiment"])}"><strong>{_e(r["experiment"])}'
                    f'</strong></td><td data-sort="{_e(r.get("model") or "")}">{_e(r.get("model") or "n/a")}</td>'
                    f"{cells}</tr>")
    for p in board.get("published") or []:
        cells = "".join(leaderboard_cell(p["values"].get(c["id"])) for c in columns)
        rows.append(f'<tr class="published"><td data-sort="{_e(p["model_name"])}">published: {_e(p["model_name"])}'
                    f'<br><span class="muted">{_e(p["paper"])}, {_e(p["table"])}</span></td>'
                    f'<td data-sort="{_e(p.get("model") or "")}">{_e(p.get("model") or "n/a")}</td>{cells}</tr>')
    return "\n".join([
        '<h2 id="leaderboard">Leaderboard</h2>',
        f'<p>{_e(board.get("method", ""))}. Published rows (grey) come from vlbench\'s reference tables; '
        "a cell's verdict compares it with its model's published number. Click a header to sort.</p>",
        '<table class="sortable leaderboard">',
        f"<thead><tr><th>experiment</th><th>model</th>{head}</tr></thead>",
        "<tbody>", *rows, "</tbody>", "</table>",
        *(f'<p class="note">{_e(c["id"])}: {_e(c["note"])}</p>' for c in columns if c.get("note"))])


def render_comparison(data: Mapping[str, Any]) -> str:
    """The comparison page: the leaderboard where `data` has one, then one row per analysis x dataset x metric, a
    column per experiment (value and interval), each difference with its p-values, the winner highlighted. `data`:
    {"experiments": [{"name", "rev"}], "rows": [{"analysis", "dataset", "metric", "values": {name: {"value", "low",
    "high"}}, "differences": [{"a", "b", "delta", "low", "high", "p_bootstrap", "p_mcnemar", "n", "paired", "unit",
    "unpaired_reason", "test", "p", "p_adjusted"}], "winner": name | None}], "correction"?, "leaderboard"?}."""
    experiments = data.get("experiments") or []
    listing = "".join(f"<li><strong>{_e(x['name'])}</strong>: <code>{_e(x.get('rev', ''))}</code></li>"
                      for x in experiments)
    head = ["analysis", "dataset", "metric", *(x["name"] for x in experiments), "differences (95% interval)",
            "winner"]
    correction = data.get("correction") or {}
    method = {"holm": "Holm's step-down", "bh": "Benjamini-Hochberg", "none": "no"}.get(correction.get("method"),
                                                                                        "no")
    body = [f"<ul>{listing}</ul>"]
    if data.get("leaderboard"):
        body += [render_leaderboard(data["leaderboard"]), "<h2>Every number</h2>"]
    body += [
        "<p>Each value with its 95% interval; each difference (b &minus; a) with its paired test's p-value (McNemar's "
        "exact test for accuracies, the paired bootstrap, or a paired t-test over episodes or seeds) and the p-value "
        f"adjusted by {_e(method)} correction over the comparison's {_e(correction.get('tests', 'n/a'))} tests"
        + (f" ({_e(correction['identical_left_out'])} comparisons of identical per-sample results left out: no "
           f"discordant sample, they cannot reject)" if correction.get("identical_left_out") else "") + "; a "
        "difference that cannot be paired is tested only with --unpaired (from the two intervals); the winner "
        "(better than every other experiment at adjusted p &lt; 0.05) is highlighted.</p>",
        _table(head, comparison_rows(data))]
    page = _page("vlbench compare: " + ", ".join(str(x["name"]) for x in experiments), body)
    if not data.get("leaderboard"):
        return page
    return page.replace("</head>", LEADERBOARD_STYLE + "\n</head>").replace("</body>", SORT_SCRIPT + "\n</body>")
