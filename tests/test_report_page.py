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
    """The loop over the table is the behaviour the committed reports came from: same files, same bytes (each
    dataset's headline the metric its entry declares, as the stage reads them)."""
    from vlbench.report.aggregate import declared_metrics, write_report

    declared = declared_metrics(yaml.safe_load((ROOT / "params.yaml").read_text()))
    copy_results(tmp_path)
    monkeypatch.chdir(tmp_path)
    write_report(report_datasets_from_params(), RUN, declared)
    for name in ("metrics.json", "headline.json", "model.json", "reference.json"):
        assert (tmp_path / "reports" / name).read_bytes() == (COMMITTED / name).read_bytes(), name
    ours = sorted(p.name for p in (tmp_path / "reports" / "plots").iterdir())
    assert ours == sorted(p.name for p in (COMMITTED / "plots").glob("*.svg"))
    for name in ours:
        assert (tmp_path / "reports" / "plots" / name).read_bytes() == (COMMITTED / "plots" / name).read_bytes(), name
    page = (tmp_path / "reports" / "index.html").read_bytes()
    write_report(report_datasets_from_params(), RUN)  # a rerun writes the same page
    assert (tmp_path / "reports" / "index.html").read_bytes() == page


class Tables(HTMLParser):
    """Every table row's cell texts (what a reader sees: an inline SVG's `<title>` left out), every attribute, the
    figures' ids, and per row where it is (`meta`: the enclosing `<details>` id and table class, each cell's
    attributes and the text of each classed `<span>` in it)."""

    VOID = {"wbr", "br", "img", "meta", "link", "hr", "input"}

    def __init__(self, page: str):
        super().__init__()
        self.rows: list[list[str]] = []
        self.attrs: list[tuple[str, str, str]] = []
        self.cell: list[str] | None = None
        self.cell_classes: list[list[str]] = []
        self.meta: list[dict] = []
        self.tags: set[str] = set()
        self.details: list[str] = []
        self.table: list[str] = []
        self.span: str | None = None
        self.in_title = False
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.attrs += [(tag, k, v or "") for k, v in attrs]
        a = dict(attrs)
        if tag == "details":
            self.details.append(a.get("id") or "")
        if tag == "table":
            self.table.append(a.get("class") or "")
        if tag == "tr":
            self.rows.append([])
            self.cell_classes.append([])
            self.meta.append({"details": self.details[-1] if self.details else None,
                              "table": self.table[-1] if self.table else None, "cells": []})
        if tag in ("td", "th"):
            self.cell = []
            self.cell_classes[-1].append(a.get("class") or "")
            self.meta[-1]["cells"].append({"tag": tag, "attrs": {k: v or "" for k, v in attrs}, "spans": {}})
        if tag == "span" and self.cell is not None and a.get("class"):
            self.span = a["class"]
        self.in_title = self.in_title or (tag == "title" and self.cell is not None)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(" ".join("".join(self.cell).split()))
            self.cell = None
        if tag == "details" and self.details:
            self.details.pop()
        if tag == "table" and self.table:
            self.table.pop()
        if tag == "span":
            self.span = None
        if tag == "title":
            self.in_title = False

    def handle_data(self, data):
        if self.cell is not None and not self.in_title:
            self.cell.append(data)
            if self.span:
                spans = self.meta[-1]["cells"][-1]["spans"]
                spans.setdefault(self.span, []).append(data.strip())


def number_tables(page: Tables) -> dict[tuple[str, str, str], dict[str, dict]]:
    """{(analysis, dataset, metric): {column head: {"text", "attrs"}}} of the folded tables (`details` numbers-<a>)."""
    found, head = {}, None
    for row, meta in zip(page.rows, page.meta):
        if not (meta["details"] or "").startswith("numbers-"):
            continue
        if all(c["tag"] == "th" for c in meta["cells"]):
            head = row
            continue
        cells = {h: {"text": t, "attrs": c["attrs"]} for h, t, c in zip(head, row, meta["cells"])}
        found[(meta["details"].removeprefix("numbers-"), row[0], row[1])] = cells
    return found


def matrix(page: Tables) -> tuple[list[str], dict[str, dict[str, dict]]]:
    """(the matrix's column analyses, {dataset: {analysis: cell}}), each cell {"class", "attrs", "spans", "text"}."""
    rows = [(r, m) for r, m in zip(page.rows, page.meta) if m["table"] == "matrix"]
    columns = [c["attrs"]["data-analysis"] for c in rows[0][1]["cells"][1:]]
    out = {}
    for texts, meta in rows[1:]:
        dataset = texts[0]
        assert dataset not in out, f"two matrix rows for {dataset}"
        out[dataset] = {c["attrs"]["data-analysis"]: {"class": c["attrs"].get("class", ""), "attrs": c["attrs"],
                                                      "spans": c["spans"], "text": t}
                        for c, t in zip(meta["cells"][1:], texts[1:])}
    return columns, out


def test_every_headline_number_and_interval_is_on_the_page(built):
    """The folded tables below the matrix: every headline number, its interval as low-high (how it was made in the
    cell's title and, said once per analysis or in a column where an analysis mixes methods, on the page)."""
    page = Tables((built / "index.html").read_text())
    metrics = json.loads((COMMITTED / "metrics.json").read_text())
    rows = number_tables(page)
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
                             and k.startswith(f"{stem}_") and f"{what}: {value}" in cells["note"]["text"]]
                    assert noted and (analysis, dataset, key) not in rows, (analysis, dataset, key)
                    continue
                shown = rows[(analysis, dataset, key)]["value"]["text"]
                assert shown == (f"{value:.4f}" if isinstance(value, float) else str(value)), (analysis, dataset, key)
    # adapt: the full-data and 5-shot probes, VTAB and FewTrans, the mean over datasets included
    assert rows[("adapt", "mean", "vtab/mean")]["value"]["text"] == f"{metrics['adapt']['mean']['vtab/mean']:.4f}"
    assert ("adapt", "shapes", "elevater/language_2p/20/last") not in rows
    assert ("granularity", "hierarchy", "freq_gap_r") not in rows
    text = (built / "index.html").read_text()
    for (analysis, dataset), intervals in INTERVALS.items():
        for key, i in intervals.items():
            cell = rows[(analysis, dataset, key)]["95% interval"]
            assert cell["text"] == f"{i['low']:.4f}\u2013{i['high']:.4f}", cell
            how = f"95% {i['method']}" + (f", {i['resamples']} resamples, seed {i['seed']}" if "resamples" in i else "")
            assert cell["attrs"]["title"] == how
            # said on the page: adapt mixes two methods (a column), the others have one (a line under the summary)
            shown = rows[(analysis, dataset, key)].get("interval from", {}).get("text")
            assert shown == how if analysis == "adapt" else f"Intervals: {how}." in text
    assert rows[("zeroshot", "colors", "accuracy")]["95% interval"]["text"] == ""
    assert "interval from" not in rows[("zeroshot", "shapes", "accuracy")]
    assert "note" not in rows[("linear_probe", "shapes", "accuracy")]  # a note column only where there are notes


def test_the_numbers_are_folded_by_analysis(built):
    """One `<details>` per analysis that ran, in the table's order, the first open; each holds that analysis's rows."""
    from vlbench.analyses import ANALYSES

    text = (built / "index.html").read_text()
    metrics = json.loads((COMMITTED / "metrics.json").read_text())
    folds = re.findall(r'<details class="numbers" id="numbers-([^"]+)"( open)?>\s*<summary>(.*?)</summary>', text, re.S)
    assert [f[0] for f in folds] == [a for a in ANALYSES if a in metrics]
    assert [bool(f[1]) for f in folds] == [True] + [False] * (len(folds) - 1)
    assert all(f"<strong>{f[0]}</strong>: {ANALYSES[f[0]].title}" in f[2] for f in folds)
    rows = number_tables(Tables(text))
    assert {a for a, _, _ in rows} == set(metrics)
    assert text.index('id="overview"') < text.index('id="headline"') < text.index('id="model"')


def test_the_number_column_holds_numbers_only(built):
    page = Tables((built / "index.html").read_text())
    numbers = [cell for row, classes in zip(page.rows, page.cell_classes) for cell, cls in zip(row, classes)
               if "num" in cls.split()]
    numbers += [v for meta in page.meta for c in meta["cells"] for v in c["spans"].get("value", [])]
    number_or_interval = r"(-?\d+(\.\d+)?|n/a)(\u2013(-?\d+(\.\d+)?|n/a))?|"
    assert len(numbers) > 150 and all(re.fullmatch(number_or_interval, cell) for cell in numbers), \
        [c for c in numbers if not re.fullmatch(number_or_interval, c)]
    rows = number_tables(page)
    assert rows[("zeroshot", "shapes", "knowledge_best_accuracy")]["note"]["text"] == "variant: repe"
    assert rows[("zeroshot", "hierarchy", "knowledge_best_map_11point")]["note"]["text"] == "variant: wn30_path"
    # the text values of metrics.json are nowhere in a number column or a matrix cell's number
    metrics = json.loads((COMMITTED / "metrics.json").read_text())
    texts = {v for per in metrics.values() for values in per.values() for v in values.values() if isinstance(v, str)}
    assert texts and not texts & set(numbers)


def test_a_text_value_without_its_numbers_keeps_its_row_out_of_the_number_column():
    from vlbench.report.html import index_page

    page = Tables(index_page(model={"model": "m"}, metrics={"zeroshot": {"d": {"accuracy": 0.5,
                                                                             "knowledge_best_variant": "repe"}}},
                             results={}, reference={"applies": False, "reason": "x"}, charts={}, run={}))
    row = number_tables(page)[("zeroshot", "d", "knowledge_best_variant")]
    assert row["value"]["text"] == "" and row["note"]["text"] == "repe"
    columns, cells = matrix(page)
    assert columns == ["zeroshot"] and cells["d"]["zeroshot"]["spans"]["value"] == ["0.5000"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """The report stage's outputs from the committed results exactly as they are (their own intervals)."""
    import os

    from vlbench.report.aggregate import write_report

    root = tmp_path_factory.mktemp("demo")
    copy_results(root)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        write_report(report_datasets_from_params(), RUN)
    finally:
        os.chdir(cwd)
    return root / "reports"


def test_the_page_opens_on_the_matrix_of_main_numbers(demo):
    """Datasets x analyses: one row per dataset, a column per analysis that ran (table order), a cell where the
    analysis ran on the dataset holding reports/headline.json's number (printed and exact) and its interval; the
    other cells empty."""
    from vlbench.analyses import ANALYSES
    from vlbench.report.aggregate import headline_numbers

    headline = json.loads((demo / "headline.json").read_text())
    assert headline == headline_numbers(json.loads((COMMITTED / "metrics.json").read_text()))
    if (COMMITTED / "headline.json").is_file():
        assert headline == json.loads((COMMITTED / "headline.json").read_text())
    text = (demo / "index.html").read_text()
    assert text.index('<table class="matrix">') < text.index("<table>")  # the first table on the page
    columns, cells = matrix(Tables(text))
    assert columns == [a for a in ANALYSES if a in headline]
    datasets = list(dict.fromkeys(d for a in columns for d in headline[a]))
    assert sorted(cells) == sorted(datasets) and len(cells) == len(datasets) == 11
    assert list(cells)[-1] == "mean"  # adapt's mean over datasets: a summary row, last
    for dataset, row in cells.items():
        assert list(row) == columns
        for analysis, cell in row.items():
            if dataset not in headline[analysis]:
                assert cell["class"] == "empty" and cell["text"] == "", (dataset, analysis)
                continue
            (key, value), = headline[analysis][dataset].items()
            assert cell["class"] == "cell" and cell["attrs"]["data-metric"] == key, (dataset, analysis)
            assert float(cell["attrs"]["data-value"]) == value and cell["spans"]["value"] == [f"{value:.4f}"]
            interval = (json.loads((COMMITTED / analysis / f"{dataset}.json").read_text()).get("intervals") or {}
                        ).get(key) if dataset != "mean" else None
            if interval:
                assert (float(cell["attrs"]["data-low"]), float(cell["attrs"]["data-high"])) == \
                    (interval["low"], interval["high"])
            else:
                assert "data-low" not in cell["attrs"]
    bars = [c for row in cells.values() for c in row.values() if "data-low" in c["attrs"]]
    assert len(bars) == 17  # zeroshot 6, linear_probe 4, compositionality, retrieval, adapt 4, robustness
    # a cell names its metric where it is not its column's (zeroshot's mAP on the hierarchy, granularity's two-level)
    assert cells["hierarchy"]["zeroshot"]["spans"]["metric"] == ["map_11point"]
    assert "metric" not in cells["shapes"]["zeroshot"]["spans"]
    assert cells["shape_color"]["granularity"]["spans"]["metric"] == ["twolevel_fine_top1"]


def test_an_interval_bar_is_drawn_to_scale():
    from vlbench.report.html import BAR_PAD, BAR_WIDTH, interval_bar

    def rects(svg):
        return {m[0]: (float(m[1]), float(m[2])) for m in re.findall(r'class="(ci-range|ci-value)" x="([-\d.]+)" '
                                                                     r'y="[\d.]+" width="([\d.]+)"', svg)}

    span = BAR_WIDTH - 2 * BAR_PAD
    bar = rects(interval_bar(0.5, {"low": 0.25, "high": 0.75, "method": "bootstrap", "resamples": 10, "seed": 0}))
    assert bar["ci-range"] == pytest.approx((BAR_PAD + span / 4, span / 2), abs=0.01)
    assert bar["ci-value"][0] + bar["ci-value"][1] / 2 == pytest.approx(BAR_PAD + span / 2, abs=0.01)
    # a number outside 0..1 widens the scale; every mark stays inside the drawing
    svg = interval_bar(-0.2, {"low": -0.3, "high": 0.1})
    for x, w in rects(svg).values():
        assert 0 <= x and x + w <= BAR_WIDTH
    assert "scale -0.3000 to 1.0000" in svg
    assert "ci-range" not in interval_bar(0.5, None) and interval_bar(float("nan"), None) == ""
    assert "ci-range" not in interval_bar(0.5, {"low": None, "high": 0.6})


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


def text_extents(svg: str) -> tuple[float, list[tuple[str, float, float, bool]]]:
    """(the drawing's width, [(text, left, right, turned)] of every line of text in it: axis labels and titles,
    legends, headers, marks), from the nested translations and `text_width`; `turned`: under a rotation (its width
    runs vertically, not checked here)."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(svg)
    found = []

    def walk(node, x: float, turned: bool) -> None:
        transform = node.get("transform", "")
        move = re.match(r"\s*translate\(([-\d.e]+)", transform)
        x += float(move[1]) if move else 0.0
        turned = turned or "rotate" in transform
        if node.tag.endswith("text"):
            size, bold = float(node.get("font-size", "11px").rstrip("px")), node.get("font-weight") == "bold"
            anchor = node.get("text-anchor", "start")
            for line in [node.text or "", *(c.text or "" for c in node if c.tag.endswith("tspan"))]:
                if line.strip():
                    width = text_width(line, size, bold)
                    left = x - width if anchor == "end" else x - width / 2 if anchor == "middle" else x
                    found.append((line, left, left + width, turned))
            return
        for child in node:
            walk(child, x, turned)

    walk(root, 0.0, False)
    return float(root.get("width")), found


def cut_texts(svg: str) -> list[tuple[str, int, int]]:
    """The texts of a chart that Vega shortened (an ellipsis) or that reach past the drawing's left or right edge."""
    width, texts = text_extents(svg)
    assert texts
    return [(t, round(a), round(b)) for t, a, b, turned in texts
            if "\u2026" in t or (not turned and (a < -0.5 or b > width + 0.5))]


@pytest.mark.parametrize("chart", sorted(p.name for p in (COMMITTED / "plots").glob("*.svg")))
def test_no_chart_label_is_cut(built, chart):
    """Every text of every chart the page inlines (axis labels and titles, legends, panel headers, marks) whole and
    inside the drawing."""
    assert cut_texts((built / "plots" / chart).read_text()) == []


LONG = "diabetic_retinopathy_detection-btgraham-300-"  # a long dataset name (VTAB's is 44 characters)


@pytest.fixture(scope="module")
def long_names(tmp_path_factory) -> Path:
    """The report from the committed results with long names: every dataset `LONG + name`, every extensibility group
    `large_man-made_outdoor_things_<group>` (a CIFAR-100 superclass): Vega cuts an axis label at 180 px and a legend
    label at 160 px (the drops chart's groups, the bars' datasets, the robustness legend)."""
    import os

    from vlbench.report.aggregate import write_report
    from vlbench.results import read_result

    root = tmp_path_factory.mktemp("long")
    copy_results(root)
    datasets = report_datasets_from_params()
    renamed = {a: [f"{LONG}{d}" for d in ds] for a, ds in datasets.items()}
    cwd = os.getcwd()
    os.chdir(root)
    try:
        for analysis, names in datasets.items():
            for name in names:
                doc = read_result(analysis, name)
                for variant in ((doc.get("details") or {}).get("variants") or {}).values():
                    for group in variant.get("groups") or [] if analysis == "extensibility" else []:
                        group["group"] = f"large_man-made_outdoor_things_{group['group']}"
                path = Path("reports") / analysis / f"{LONG}{name}.json"
                path.write_text(json.dumps(doc))
        write_report(renamed, RUN)
    finally:
        os.chdir(cwd)
    return root / "reports"


def test_long_names_are_not_cut(long_names):
    svgs = {p.name: p.read_text() for p in (long_names / "plots").glob("*.svg")}
    assert len(svgs) == len(list((COMMITTED / "plots").glob("*.svg")))
    assert "large_man-made_outdoor_things_" in svgs["extensibility_drops.svg"] and LONG in svgs["robustness.svg"]
    assert {name: cut_texts(svg) for name, svg in svgs.items()} == {name: [] for name in svgs}
    if CHROMIUM is not None:  # and as a browser draws them, on the page
        with tempfile.TemporaryDirectory() as tmp:
            seen, requests = render(long_names / "index.html", Path(tmp))
        assert len(seen["boxes"]) == len(svgs) and [b["cut"] for b in seen["boxes"]] == [[]] * len(svgs)
        assert [r for r in requests if not r.startswith("file:")] == []


def test_the_page_has_its_sections_and_every_chart_inline(built):
    text = (built / "index.html").read_text()
    page = Tables(text)
    from vlbench.analyses import ANALYSES

    ran = [a for a in ANALYSES if a in json.loads((COMMITTED / "metrics.json").read_text())]  # not fine-tuning
    assert len(ran) == len(ANALYSES) - 1
    for section in ("overview", "headline", "model", "reference", "reproduce", *ran):
        assert f'id="{section}"' in text, section
    model = json.loads((COMMITTED / "model.json").read_text())
    assert ["weights_sha256", model["weights_sha256"]] in page.rows
    assert "No reference applies to this run: no published number for model &#x27;toy&#x27;" in text
    assert "dvc exp run -S model=toy -S suite=demo" in text and "git log -1 --format=%H -- reports/index.html" in text
    figures = {v.removeprefix("chart-") for t, k, v in page.attrs if t == "figure" and k == "id"}
    assert figures == {p.stem for p in (COMMITTED / "plots").glob("*.svg")}
    assert text.count("<svg ") == len(figures) + text.count('<svg class="ci"')
    for entry in (ANALYSES[a] for a in ran):  # each analysis's explanation, from its table entry
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
    page = index_page(model={"model": evil, "arch": "a&b"},
                      metrics={"zeroshot": {"d": {"accuracy": 0.5}}, evil: {evil: {evil: 0.25, "note": evil}}},
                      results={}, reference={"applies": False, "reason": evil}, charts={},
                      run={"model": evil, "suite": "demo"})
    assert "<script" not in page and "a&amp;b" in page and page.count("&lt;script&gt;") >= 10
    columns, cells = matrix(Tables(page))
    assert columns == ["zeroshot", evil] and cells[evil][evil]["attrs"]["data-metric"] == evil


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
const inside = (b, r) => b.left >= r.left - 0.5 && b.right <= r.right + 0.5 && b.top >= r.top - 0.5
  && b.bottom <= r.bottom + 0.5;
const boxes = [...document.querySelectorAll('figure')].map(f => {
  const svg = f.querySelector('svg'), r = svg.getBoundingClientRect();
  const marks = [...svg.querySelectorAll('path, rect, text, line, circle')].filter(m => {
    const b = m.getBBox(); return b.width > 0 || b.height > 0; });
  const texts = [...svg.querySelectorAll('text')].filter(t => t.textContent.trim());
  const cut = texts.filter(t => t.textContent.includes('\\u2026') || !inside(t.getBoundingClientRect(), r))
    .map(t => t.textContent);
  return {id: f.id, width: r.width, height: r.height, marks: marks.length, texts: texts.length, cut}; });
const cells = document.querySelectorAll('td').length;
const winners = [...document.querySelectorAll('td.winner')].map(td => getComputedStyle(td).backgroundColor);
const matrix = [...document.querySelectorAll('table.matrix td.cell')].map(td => {
  const r = td.getBoundingClientRect(), svg = td.querySelector('svg.ci');
  const parts = svg ? [svg, ...svg.querySelectorAll('rect')] : [];
  const range = svg && svg.querySelector('.ci-range');
  return {analysis: td.dataset.analysis, dataset: td.dataset.dataset, width: r.width, height: r.height,
          bar: !!svg, range: range ? range.getBoundingClientRect().width : null,
          outside: parts.filter(p => !inside(p.getBoundingClientRect(), r)).length}; });
const folds = [...document.querySelectorAll('details.numbers')].map(d => ({id: d.id, open: d.open,
  shown: d.querySelector('table').checkVisibility()}));
const out = document.createElement('pre'); out.id = 'vlbench-probe';
out.textContent = JSON.stringify({boxes, cells, winners, matrix, folds}); document.body.appendChild(out);
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
def test_chromium_draws_every_chart_and_fetches_nothing(demo):
    """The demo's page from its own results: every chart drawn with no text cut or past its drawing, every matrix
    cell drawn with its interval bar inside it, the folded tables closed but the first, no request leaving the file
    system."""
    from vlbench.report.html import render_comparison

    headline = json.loads((demo / "headline.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        seen, requests = render(demo / "index.html", work)
        assert [r for r in requests if not r.startswith("file:")] == []
        expected = {f"chart-{p.stem}" for p in (demo / "plots").glob("*.svg")}
        assert {b["id"] for b in seen["boxes"]} == expected and len(expected) >= 10
        for box in seen["boxes"]:
            assert box["width"] > 100 and box["height"] > 100 and box["marks"] > 10 and box["texts"] > 5, box
            assert box["cut"] == [], box
        assert seen["cells"] > 100 and seen["winners"] == []
        drawn = {(c["analysis"], c["dataset"]): c for c in seen["matrix"]}
        assert set(drawn) == {(a, d) for a, per in headline.items() for d in per}
        for cell in drawn.values():
            assert cell["width"] > 40 and cell["height"] > 20 and cell["bar"] and cell["outside"] == 0, cell
        assert sum(c["range"] is not None for c in drawn.values()) == 17
        assert drawn[("linear_probe", "position")]["range"] > 1  # 0.384-0.443 of a 74 px scale: 4 px
        assert [f["open"] for f in seen["folds"]] == [True] + [False] * (len(headline) - 1)
        assert [f["shown"] for f in seen["folds"]] == [True] + [False] * (len(headline) - 1)

        (work / "compare").mkdir()
        (work / "compare" / "compare.html").write_text(render_comparison(COMPARISON))
        seen, requests = render(work / "compare" / "compare.html", work / "compare")
        assert requests == [] and seen == {"boxes": [], "cells": 3 * 7, "winners": ["rgb(227, 244, 232)"],
                                           "matrix": [], "folds": []}

        # the probe does see a label past its drawing and one Vega shortened
        (work / "cut").mkdir()
        (work / "cut" / "cut.html").write_text(
            '<html><body><figure id="chart-cut"><svg width="200" height="150"><rect width="150" height="120"/>'
            + "".join(f'<text x="{x}" y="{y}">{t}</text>' for x, y, t in [
                (10, 20, "whole"), (150, 40, "past the right edge"), (10, 60, "shortened\u2026"), (10, 80, "a"),
                (10, 100, "b"), (10, 120, "c"), (10, 140, "d")]) + "</svg></figure></body></html>")
        seen, _ = render(work / "cut" / "cut.html", work / "cut")
        assert seen["boxes"][0]["cut"] == ["past the right edge", "shortened\u2026"]

        # the same check does see a page that fetches: an image from elsewhere
        (work / "leak").mkdir()
        (work / "leak" / "leak.html").write_text('<html><body><img src="http://example.invalid/x.png"></body></html>')
        _, requests = render(work / "leak" / "leak.html", work / "leak")
        assert requests == ["http://example.invalid/x.png"]


def test_every_analysis_has_its_page_text_and_charts_and_the_registry_names_only_analyses():
    """The report draws what vlbench.report.registry gives each analysis of the table: a misspelt analysis name there
    (which would silently fall back to the bar chart) or a chart of the wrong signature fails here, not in a repro."""
    import inspect

    from vlbench.analyses import ANALYSES
    from vlbench.report.registry import CHARTS, SUMMARIES, charts_of

    assert set(CHARTS) <= set(ANALYSES) and set(SUMMARIES) <= set(ANALYSES)
    for entry in ANALYSES.values():
        assert entry.explain and entry.headline and charts_of(entry.name), entry.name
        for chart in charts_of(entry.name):
            assert list(inspect.signature(chart).parameters) == ["analysis", "results", "metrics", "out_dir"], chart
    for summary in SUMMARIES.values():
        assert list(inspect.signature(summary).parameters) == ["metrics", "results"]


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
    # the matrix: each cell with the verdicts of its number, as many as reports/reference.json has for it
    columns, cells = matrix(page)
    assert columns == ["zeroshot"] and list(cells) == ["cifar-10", "cifar-100"]
    for dataset, row in cells.items():
        verdicts = [f"{c['verdict']} ({c['source']['paper']})" for c in reference["comparisons"]
                    if (c["analysis"], c["dataset"], c.get("key") or c["metric"]) == ("zeroshot", dataset, "accuracy")]
        assert verdicts and row["zeroshot"]["spans"]["verdict reproduced" if dataset == "cifar-10" else "verdict off"]
        shown = [v for cls, texts in row["zeroshot"]["spans"].items() if cls.startswith("verdict ") for v in texts]
        assert sorted(shown) == sorted(verdicts), dataset
    assert "reproduced" in cells["cifar-10"]["zeroshot"]["text"] and "off" in cells["cifar-100"]["zeroshot"]["text"]
