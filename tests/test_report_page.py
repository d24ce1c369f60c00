"""The report stage as one loop over the ANALYSES table, and the pages people read (reports/index.html, the
comparison page): the committed reports are what the code writes from the committed results; every headline number
and interval is on the page; strings are escaped; nothing is fetched from anywhere; headless Chromium draws it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "reports"
RUN = {"model": "toy", "suite": "demo"}
# intervals as the uncertainty branch writes them (its contract): result JSON, top-level `intervals`
INTERVALS = {
    ("zeroshot", "shapes"): {"accuracy": {"low": 0.7412, "high": 0.7934, "level": 0.95, "method": "bootstrap",
                                          "resamples": 1000, "seed": 0}},
    ("linear_probe", "colors"): {"accuracy": {"low": 0.9951, "high": 1.0, "level": 0.95, "method": "bootstrap",
                                              "resamples": 2000, "seed": 7}},
    ("adapt", "shapes"): {"elevater/language_2p/full/last": {"low": 0.7711, "high": 0.7949, "level": 0.95,
                                                             "method": "seeds_logit_t"},
                          "fewtrans/base/linear": {"low": 0.6101, "high": 0.6421, "level": 0.95,
                                                   "method": "episodes"}},
}


def report_datasets_from_params() -> dict[str, list[str]]:
    from vlbench.report.aggregate import report_datasets

    return report_datasets(yaml.safe_load((ROOT / "params.yaml").read_text()))


def copy_results(dest: Path) -> None:
    """The committed result files (reports/<analysis>/*.json) only: what the report stage reads."""
    for path in COMMITTED.glob("*/*.json"):
        if path.parent.name != "plots":
            (dest / "reports" / path.parent.name).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / "reports" / path.parent.name / path.name)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The report stage's outputs, from the committed results plus intervals, in a temporary checkout."""
    import os

    from vlbench.report.aggregate import write_report

    root = tmp_path_factory.mktemp("built")
    copy_results(root)
    for path in (root / "reports").glob("*/*.json"):  # exactly the intervals above, whatever the committed ones
        doc = json.loads(path.read_text())
        doc.pop("intervals", None)
        intervals = INTERVALS.get((path.parent.name, path.stem))
        path.write_text(json.dumps({**doc, **({"intervals": intervals} if intervals else {})}, indent=2))
    cwd = os.getcwd()
    os.chdir(root)
    try:
        write_report(report_datasets_from_params(), RUN)
    finally:
        os.chdir(cwd)
    return root / "reports"


def test_report_rewrites_the_committed_reports_byte_for_byte(tmp_path, monkeypatch):
    """The loop over the table is the behaviour the committed reports came from: same files, same bytes."""
    from vlbench.report.aggregate import write_report

    copy_results(tmp_path)
    monkeypatch.chdir(tmp_path)
    write_report(report_datasets_from_params(), RUN)
    for name in ("metrics.json", "model.json", "reference.json"):
        assert (tmp_path / "reports" / name).read_bytes() == (COMMITTED / name).read_bytes(), name
    ours = sorted(p.name for p in (tmp_path / "reports" / "plots").iterdir())
    assert ours == sorted(p.name for p in (COMMITTED / "plots").glob("*.svg"))
    for name in ours:
        assert (tmp_path / "reports" / "plots" / name).read_bytes() == (COMMITTED / "plots" / name).read_bytes(), name
    page = (tmp_path / "reports" / "index.html").read_bytes()
    write_report(report_datasets_from_params(), RUN)  # a rerun writes the same page
    assert (tmp_path / "reports" / "index.html").read_bytes() == page


class Tables(HTMLParser):
    """Every table row's cell texts, every attribute, and the figures' ids, of an HTML page."""

    def __init__(self, page: str):
        super().__init__()
        self.rows: list[list[str]] = []
        self.attrs: list[tuple[str, str, str]] = []
        self.cell: list[str] | None = None
        self.cell_classes: list[list[str]] = []
        self.tags: set[str] = set()
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]
        if tag == "tr":
            self.rows.append([])
            self.cell_classes.append([])
        if tag in ("td", "th"):
            self.cell = []
            self.cell_classes[-1].append(dict(attrs).get("class") or "")

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(" ".join("".join(self.cell).split()))
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def test_every_headline_number_and_interval_is_on_the_page(built):
    page = Tables((built / "index.html").read_text())
    metrics = json.loads((COMMITTED / "metrics.json").read_text())
    rows = {(r[0], r[1], r[2]): r[3:] for r in page.rows if len(r) == 6}
    expected_keys = {  # each analysis's headline as its entry promises, spelled out here
        "zeroshot": {"accuracy", "map_11point", "knowledge_best_accuracy", "knowledge_best_map_11point",
                     "knowledge_best_variant"},
        "linear_probe": {"accuracy"}, "specificity": None, "extensibility": None,
        "retrieval": {f"{d}_r{k}" for d in ("i2t", "t2i") for k in (1, 5, 10)},
        "granularity": {"leaf_map", "coarse_map_direct", "coarse_map_child", "coarse_map_leaf", "twolevel_fine_top1",
                        "twolevel_coarse_direct_top1", "twolevel_coarse_from_fine_top1",
                        "twolevel_coarse_mean_children_top1"}}
    for analysis, per_dataset in metrics.items():
        for dataset, values in per_dataset.items():
            for key, value in values.items():
                wanted = expected_keys.get(analysis, set())
                if wanted is not None and key not in wanted:
                    continue
                if isinstance(value, str):  # a text value is a note on its numbers' rows, never in the number column
                    stem, _, what = key.rpartition("_")
                    noted = [k for (a, d, k), cells in rows.items() if (a, d) == (analysis, dataset)
                             and k.startswith(f"{stem}_") and f"{what}: {value}" in cells[2]]
                    assert noted and (analysis, dataset, key) not in rows, (analysis, dataset, key)
                    continue
                shown = rows[(analysis, dataset, key)][0]
                assert shown == (f"{value:.4f}" if isinstance(value, float) else str(value)), (analysis, dataset, key)
    # adapt: the full-data and 5-shot probes, VTAB and FewTrans, the mean over datasets included
    assert rows[("adapt", "mean", "vtab/mean")][0] == f"{metrics['adapt']['mean']['vtab/mean']:.4f}"
    assert ("adapt", "shapes", "elevater/language_2p/20/last") not in rows
    assert ("granularity", "hierarchy", "freq_gap_r") not in rows
    for (analysis, dataset), intervals in INTERVALS.items():
        for key, i in intervals.items():
            text = rows[(analysis, dataset, key)][1]
            assert text.startswith(f"[{i['low']:.4f}, {i['high']:.4f}] 95% {i['method']}"), text
            assert text.endswith(f"{i['resamples']} resamples, seed {i['seed']}" if "resamples" in i else i["method"])
    assert rows[("zeroshot", "colors", "accuracy")][1] == "none"


def test_the_number_column_holds_numbers_only(built):
    page = Tables((built / "index.html").read_text())
    numbers = [cell for row, classes in zip(page.rows, page.cell_classes) for cell, cls in zip(row, classes)
               if "num" in cls.split()]
    assert numbers and all(re.fullmatch(r"-?\d+(\.\d+)?|n/a", cell) for cell in numbers), \
        [c for c in numbers if not re.fullmatch(r"-?\d+(\.\d+)?|n/a", c)]
    rows = {(r[0], r[1], r[2]): r for r in page.rows if len(r) == 6}
    assert rows[("zeroshot", "shapes", "knowledge_best_accuracy")][5] == "variant: repe"


DEJAVU = {False: Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"),
          True: Path("/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf")}


def text_width(text: str, size: float, bold: bool) -> float:
    """The width DejaVu Sans (the charts' first font) draws `text` with, measured with the font file where the machine
    has it; else at 0.55 em a character (0.6 bold), an over-estimate (a narrow 'l' or '/' is 0.3 em)."""
    from PIL import ImageFont

    if DEJAVU[bold].is_file():
        return ImageFont.truetype(str(DEJAVU[bold]), size).getlength(text)
    return len(text) * (0.6 if bold else 0.55) * size


def mark_text_extents(svg: str) -> tuple[float, float, list[tuple[str, float, float]]]:
    """(the plot area's left edge, the drawing's width, [(text, left, right)] of every text mark: the labels drawn on
    or beside the bars, not the axes'), from the nested translations and `text_width`."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(svg)
    found = []

    def walk(node, x: float, in_mark: bool) -> None:
        move = re.search(r"translate\(([-\d.e]+)", node.get("transform", ""))
        x += float(move[1]) if move else 0.0
        in_mark = in_mark or {"mark-text", "role-mark"} <= set(node.get("class", "").split())
        if in_mark and node.tag.endswith("text") and (node.text or "").strip():
            width = text_width(node.text, float(node.get("font-size", "12px").rstrip("px")),
                               node.get("font-weight") == "bold")
            anchor = node.get("text-anchor", "start")
            left = x - width if anchor == "end" else x - width / 2 if anchor == "middle" else x
            found.append((node.text, left, left + width))
        for child in node:
            walk(child, x, in_mark)

    walk(root, 0.0, False)
    view = next(g for g in root.iter() if g.tag.endswith("g") and "translate" in g.get("transform", ""))
    origin = float(re.search(r"translate\(([-\d.e]+)", view.get("transform"))[1])
    return origin, float(root.get("width")), found


@pytest.mark.parametrize("chart", ["adapt.svg", "zeroshot.svg", "linear_probe.svg", "retrieval.svg"])
def test_no_bar_label_is_cut_at_an_edge(built, chart):
    """A label too long for its bar goes after it (the chart grows to the right); none starts left of the plot area
    (where the adapt chart cut 'elevater/language_2p_knowledge/5/last 0.523') or ends past the drawing."""
    origin, width, texts = mark_text_extents((built / "plots" / chart).read_text())
    assert texts
    cut = [(t, round(a), round(b)) for t, a, b in texts if a < origin or b > width]
    assert not cut, (origin, width, cut[:3])


def test_the_page_has_its_sections_and_every_chart_inline(built):
    text = (built / "index.html").read_text()
    page = Tables(text)
    from vlbench.analyses import ANALYSES

    for section in ("model", "headline", "reference", "reproduce", *ANALYSES):
        assert f'id="{section}"' in text, section
    model = json.loads((COMMITTED / "model.json").read_text())
    assert ["weights_sha256", model["weights_sha256"]] in page.rows
    assert "No reference applies to this run: no published number for model &#x27;toy&#x27;" in text
    assert "dvc exp run -S model=toy -S suite=demo" in text and "git log -1 --format=%H -- reports/index.html" in text
    figures = {v.removeprefix("chart-") for t, k, v in page.attrs if t == "figure" and k == "id"}
    assert figures == {p.stem for p in (COMMITTED / "plots").glob("*.svg")}
    assert text.count("<svg ") == len(figures)
    for entry in ANALYSES.values():  # each analysis's explanation, from its table entry
        assert entry.explain.split(";")[0].replace("'", "&#x27;") in text
    # ids stay unique although every chart was rendered on its own (clip1, gradient_1 ...)
    ids = [v for _, k, v in page.attrs if k == "id"]
    assert len(ids) == len(set(ids))


def external(page: Tables, text: str) -> list[str]:
    """What a page would fetch: src/href attributes that are not in-page anchors or data, scripts, imports."""
    found = [f"{k}={v}" for _, k, v in page.attrs
             if k in ("src", "href", "xlink:href", "srcset", "action", "data") and not v.startswith("#")]
    found += [t for t in ("script", "link", "iframe", "img", "object", "embed") if t in page.tags]
    found += re.findall(r"url\((?!#)[^)]*\)|@import", text)
    return found


def test_nothing_on_the_pages_is_fetched(built):
    from vlbench.report.html import render_comparison

    for text in ((built / "index.html").read_text(), render_comparison(COMPARISON)):
        page = Tables(text)
        assert external(page, text) == []
        attrs_with_urls = [v for _, k, v in page.attrs if k != "xmlns" and k != "xmlns:xlink"
                           and ("http" in v or "//" in v)]
        assert attrs_with_urls == []


def test_the_check_for_fetched_things_finds_them():
    probe = '<img src="http://x.invalid/a.png"><a href="//cdn.invalid/x"></a><style>@import "a.css"</style>'
    assert external(Tables(probe), probe) == ["src=http://x.invalid/a.png", "href=//cdn.invalid/x", "img",
                                              "@import"]


COMPARISON = {
    "experiments": [{"name": "base", "rev": "HEAD~1"}, {"name": "exp-<b>&", "rev": "refs/exps/ab/cd"}],
    "rows": [
        {"analysis": "zeroshot", "dataset": "shapes", "metric": "accuracy",
         "values": {"base": {"value": 0.768, "low": 0.741, "high": 0.793},
                    "exp-<b>&": {"value": 0.801, "low": 0.776, "high": 0.825}},
         "differences": [{"a": "base", "b": "exp-<b>&", "delta": 0.033, "low": 0.011, "high": 0.055,
                          "p_bootstrap": 0.0042, "p_mcnemar": 0.0061, "n": 1000, "paired": True,
                          "test": "mcnemar", "p": 0.0061, "p_adjusted": 0.0122}],
         "winner": "exp-<b>&"},
        {"analysis": "granularity", "dataset": "hierarchy", "metric": "leaf_map",
         "values": {"base": {"value": 0.3859, "low": None, "high": None}, "exp-<b>&": {"value": 0.3901}},
         "differences": [{"a": "base", "b": "exp-<b>&", "delta": 0.0042, "low": -0.01, "high": 0.019,
                          "p_bootstrap": 0.47, "p_mcnemar": None, "n": 400, "paired": True,
                          "test": "bootstrap", "p": 0.46, "p_adjusted": 0.46}],
         "winner": None},
        {"analysis": "adapt", "dataset": "shapes", "metric": "vtab/median",  # no per-sample results: unpaired
         "values": {"base": {"value": 0.4, "low": 0.38, "high": 0.42}},
         "differences": [{"a": "base", "b": "exp-<b>&", "delta": -0.01, "low": None, "high": None,
                          "p_bootstrap": None, "p_mcnemar": None, "n": 0, "paired": False, "test": None, "p": None,
                          "p_adjusted": None, "unpaired_reason": "adapt declares no <table>"}],
         "winner": None},
    ],
}


def test_comparison_page_rows_intervals_p_values_and_winner():
    from vlbench.report.html import render_comparison

    text = render_comparison(COMPARISON)
    page = Tables(text)
    assert page.rows[0] == ["analysis", "dataset", "metric", "base", "exp-<b>&", "differences (95% interval)",
                            "winner"]
    first, second, third = page.rows[1:4]
    assert first[:5] == ["zeroshot", "shapes", "accuracy", "0.7680 [0.7410, 0.7930]", "0.8010 [0.7760, 0.8250]"]
    assert first[5] == ("exp-<b>& − base: 0.0330 [0.0110, 0.0550], pMcNemar = 0.0061, adjusted 0.0122, "
                        "n = 1000, paired")
    assert first[6] == "exp-<b>&" and page.cell_classes[1][4] == "num winner" and page.cell_classes[1][3] == "num"
    assert second[3:5] == ["0.3859", "0.3901"] and "McNemar" not in second[5] and second[6] == "none"
    assert second[5] == ("exp-<b>& − base: 0.0042 [-0.0100, 0.0190], pbootstrap SE = 0.4600, adjusted 0.4600, "
                         "ppercentile bootstrap = 0.4700, n = 400, paired")
    assert third[5] == "exp-<b>& − base: -0.0100 [n/a, n/a], not tested, adapt declares no <table>"
    assert third[3:5] == ["0.4000 [0.3800, 0.4200]", "n/a"]
    assert "winner" not in " ".join(page.cell_classes[2])
    assert "HEAD~1" in text and "refs/exps/ab/cd" in text


def test_every_string_is_escaped():
    from vlbench.report.html import index_page, render_comparison

    evil = '<script>alert("x")</script>'
    text = render_comparison({"experiments": [{"name": evil, "rev": evil}], "rows": [
        {"analysis": evil, "dataset": "d", "metric": evil, "values": {evil: {"value": evil}}, "differences": [],
         "winner": evil}]})
    assert "<script" not in text and text.count("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;") >= 5
    page = index_page(model={"model": evil, "arch": "a&b"}, metrics={"zeroshot": {"d": {"accuracy": 0.5}}},
                      results={}, reference={"applies": False, "reason": evil}, charts={},
                      run={"model": evil, "suite": "demo"})
    assert "<script" not in page and "a&amp;b" in page and page.count("&lt;script&gt;") >= 4


def test_inline_svgs_get_their_own_ids():
    from vlbench.report.html import inline_svg

    svg = ('<?xml version="1.0"?>\n<svg><clipPath id="clip1"/><g clip-path="url(#clip1)"/>'
           '<linearGradient id="gradient_1"/><rect fill="url(#gradient_1)"/><a href="#clip1"/></svg>')
    assert inline_svg(svg, "zeroshot") == (
        '<svg><clipPath id="zeroshot-clip1"/><g clip-path="url(#zeroshot-clip1)"/>'
        '<linearGradient id="zeroshot-gradient_1"/><rect fill="url(#zeroshot-gradient_1)"/>'
        '<a href="#zeroshot-clip1"/></svg>')


# ---------------------------------------------------------------------------------------------------------
# a real browser: Debian's headless Chromium renders the pages from the file system

CHROMIUM = next((shutil.which(c) for c in ("chromium", "chromium-browser") if shutil.which(c)), None)
PROBE = """<script>
const boxes = [...document.querySelectorAll('figure')].map(f => {
  const svg = f.querySelector('svg'), r = svg.getBoundingClientRect();
  const marks = [...svg.querySelectorAll('path, rect, text, line, circle')].filter(m => {
    const b = m.getBBox(); return b.width > 0 || b.height > 0; });
  return {id: f.id, width: r.width, height: r.height, marks: marks.length}; });
const cells = document.querySelectorAll('td').length;
const winners = [...document.querySelectorAll('td.winner')].map(td => getComputedStyle(td).backgroundColor);
const out = document.createElement('pre'); out.id = 'vlbench-probe';
out.textContent = JSON.stringify({boxes, cells, winners}); document.body.appendChild(out);
</script>"""


def render(page: Path, workdir: Path, probe: str = PROBE) -> tuple[dict, list[str]]:
    """Chromium opens a copy of `page` (the probe script added at its end) from the file system: (what the probe
    measured, the URLs of the requests the page made). A page's requests are told from the browser's own (update
    checks) by their network isolation key, the page's file:// origin; host resolution is off, so none leaves."""
    probed = workdir / page.name
    probed.write_text(page.read_text().replace("</body>", probe + "\n</body>"))
    net = workdir / "net.json"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync",
           "--disable-background-networking", "--disable-component-update", f"--user-data-dir={workdir / 'profile'}",
           "--host-resolver-rules=MAP * ~NOTFOUND", f"--log-net-log={net}", "--window-size=1300,900",
           "--virtual-time-budget=5000", "--dump-dom", probed.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="vlbench-probe">(.*?)</pre>', done.stdout, re.S)
    assert found, f"chromium did not render {page}: exit {done.returncode}\n{done.stderr[-2000:]}"
    log = json.loads(net.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    requests = [e["params"]["url"] for e in log["events"] if e["type"] == start
                and "file://" in str(e["params"].get("network_isolation_key", ""))]
    import html

    return json.loads(html.unescape(found.group(1))), requests


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install -y chromium)")
def test_chromium_draws_every_chart_and_fetches_nothing(built):
    from vlbench.report.html import render_comparison

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        seen, requests = render(built / "index.html", work)
        assert [r for r in requests if not r.startswith("file:")] == []
        expected = {f"chart-{p.stem}" for p in (built / "plots").glob("*.svg")}
        assert {b["id"] for b in seen["boxes"]} == expected and len(expected) >= 10
        for box in seen["boxes"]:
            assert box["width"] > 100 and box["height"] > 100 and box["marks"] > 10, box
        assert seen["cells"] > 100 and seen["winners"] == []

        (work / "compare").mkdir()
        (work / "compare" / "compare.html").write_text(render_comparison(COMPARISON))
        seen, requests = render(work / "compare" / "compare.html", work / "compare")
        assert requests == [] and seen == {"boxes": [], "cells": 3 * 7, "winners": ["rgb(227, 244, 232)"]}

        # the same check does see a page that fetches: an image from elsewhere
        (work / "leak").mkdir()
        (work / "leak" / "leak.html").write_text('<html><body><img src="http://example.invalid/x.png"></body></html>')
        _, requests = render(work / "leak" / "leak.html", work / "leak")
        assert requests == ["http://example.invalid/x.png"]


def test_every_table_entry_names_charts_and_a_summary_that_exist():
    """The report calls what the ANALYSES table names: a misspelt "module:function" fails here, not in a repro."""
    import inspect

    from vlbench.analyses import ANALYSES
    from vlbench.report.aggregate import _function

    for entry in ANALYSES.values():
        assert entry.explain and entry.headline and entry.charts, entry.name
        for chart in entry.charts:
            assert list(inspect.signature(_function(chart)).parameters) == ["analysis", "results", "metrics",
                                                                             "out_dir"], chart
        if entry.summary:
            assert list(inspect.signature(_function(entry.summary)).parameters) == ["metrics", "results"]


def test_the_page_gives_each_reference_verdict(tmp_path, monkeypatch):
    """A run with published numbers (CLIP ViT-B/32 on CIFAR, ELEVATER Table 15: 89.8 and 65.2): reproduced, or off
    by how much, one row per comparison in reports/reference.json."""
    from vlbench.report.aggregate import write_report
    from vlbench.results import Result, write_result

    monkeypatch.chdir(tmp_path)
    for dataset, value in {"cifar-10": 0.9, "cifar-100": 0.5}.items():
        write_result("zeroshot", dataset, Result({"accuracy": value}, {"samples": 10},
                                                 {"scoring": "elevater", "split": "test"}),
                     {"model": "vitb32", "precision": "fp32"})
    write_report({"zeroshot": ["cifar-10", "cifar-100"]}, {"model": "vitb32", "suite": "elevater"})
    reference = json.loads((tmp_path / "reports" / "reference.json").read_text())
    page = Tables((tmp_path / "reports" / "index.html").read_text())
    shown = [r for r in page.rows if len(r) == 10 and r[0] == "zeroshot"]
    assert len(shown) == len(reference["comparisons"]) >= 2
    table15 = {r[1]: r for r in shown if r[9].startswith("elevater, Table 15,")}
    tolerance = next(c["tolerance"] for c in reference["comparisons"]
                     if c["dataset"] == "cifar-10" and c["source"]["table"] == "Table 15")
    assert table15["cifar-10"][3:8] == ["0.9000", "0.8980", "0.0020", f"{tolerance:.4f}", "reproduced"]
    assert table15["cifar-100"][7] == "off" and table15["cifar-100"][8].startswith("off by -15.20 points")
