"""The README and docs/ as a reader meets them: every link leads somewhere, and the demo table is the committed results'."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    """GitHub's id of a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {anchor(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_names_a_file_and_heading_that_exist(page):
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.relative_to(ROOT)}: link to {target}: no such file"
        if fragment and linked.suffix == ".md":
            assert fragment in anchors(linked), f"{page.relative_to(ROOT)}: link to {target}: no such heading"


def test_every_docs_page_is_reachable_from_the_readme():
    """The README's "Where the rest is" names every page of docs/, so nothing moved out of it is lost to a reader."""
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in LINK.findall((ROOT / "README.md").read_text())}
    assert [p.name for p in PAGES[1:] if p.resolve() not in linked] == []


def cell(text: str) -> tuple[float, tuple[float, float] | None, int]:
    """'66.3% (63.3-69.1)' -> (66.3, (63.3, 69.1), 1 decimal); '0.421 mAP (0.416-0.436)' -> (0.421, (...), 3)."""
    found = re.fullmatch(r"([\d.]+)(%| mAP)?(?: \(([\d.]+)-([\d.]+)\))?", text.strip())
    assert found, f"README demo table: cannot read {text!r}"
    value, _, low, high = found.groups()
    decimals = len(value.partition(".")[2])
    return float(value), (float(low), float(high)) if low else None, decimals


def test_the_readme_demo_table_is_the_committed_results():
    """Each number of the README's demo table (chance, zero-shot, linear probe, their 95% intervals) is the one in
    reports/<analysis>/<dataset>.json, rounded as printed; a value printed without an interval has a zero-width one."""
    lines = (ROOT / "README.md").read_text().split("| dataset (classes) | chance | zero-shot | linear probe |")[1]
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines.strip().splitlines()[1:]))
    assert len(rows) == 6
    for row in rows:
        name, chance, *scores = [c.strip() for c in row.strip("|").split("|")]
        dataset = name.split()[0]
        for analysis, text in zip(("zeroshot", "linear_probe"), scores):
            if not text:
                assert not (ROOT / f"reports/{analysis}/{dataset}.json").exists(), (analysis, dataset)
                continue
            result = json.loads((ROOT / f"reports/{analysis}/{dataset}.json").read_text())
            metric = "accuracy" if "%" in text else "map_11point"
            scale = 100 if "%" in text else 1
            value, interval, decimals = cell(text)
            assert round(result["metrics"][metric] * scale, decimals) == value, (analysis, dataset)
            low, high = (round(result["intervals"][metric][k] * scale, decimals) for k in ("low", "high"))
            assert (low, high) == (interval or (value, value)), (analysis, dataset)
        if chance:
            classes = json.loads((ROOT / f"reports/zeroshot/{dataset}.json").read_text())["counts"]["classes"]
            assert f"{100 / classes:.1f}%" == chance and f"({classes}" in name, dataset
