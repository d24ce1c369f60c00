"""The leaderboard page of `vlbench compare` (issue 33) in headless Chromium, from the file system: every cell drawn,
a click on a header sorts the rows by that column (a second click the other way), and no request leaves the page.
The page is written by `vlbench.compare_runs.write_page` from a comparison of constructed runs."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from tests.test_compare_pairing import leaderboard_runs
from tests.test_report_page import CHROMIUM, render

PROBE = """<script>
const table = document.querySelector('table.leaderboard');
const heads = [...table.querySelectorAll('thead th')];
const rows = () => [...table.tBodies[0].rows];
const order = () => rows().map(r => r.cells[0].dataset.sort);
const cells = rows().flatMap(r => [...r.cells]);
const drawn = cells.filter(c => { const b = c.getBoundingClientRect();
  return b.width > 0 && b.height > 0 && c.textContent.trim() !== ''; }).length;
const column = heads.findIndex(h => h.title === 'zeroshot/imagenet-1k/accuracy');
const before = order();
heads[column].click(); const down = order();
const values = rows().map(r => r.cells[column].dataset.sort);
heads[column].click(); const up = order();
heads[0].click(); const byName = order();
const out = document.createElement('pre'); out.id = 'vlbench-probe';
out.textContent = JSON.stringify({rows: rows().length, columns: heads.length, cells: cells.length, drawn, before,
                                  down, values, up, byName, arrow: getComputedStyle(heads[0], '::after').content});
document.body.appendChild(out);
</script>"""


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install -y chromium)")
def test_the_leaderboard_page_draws_every_cell_sorts_by_any_column_and_fetches_nothing(tmp_path):
    from vlbench.compare_runs import compare, write_page

    accuracies = {"exp-a": 0.40, "exp-b": 0.70, "exp-c": 0.55, "exp-d": 0.62}
    runs, _ = leaderboard_runs(tmp_path / "runs", accuracies)
    data = compare(runs)
    page = write_page(data, tmp_path / "page")
    board = data["leaderboard"]
    published = len(board["published"])
    with tempfile.TemporaryDirectory() as tmp:
        seen, requests = render(page, Path(tmp), PROBE)
    assert requests == []
    assert seen["rows"] == 4 + published and seen["columns"] == 2 + len(board["columns"])
    assert seen["cells"] == seen["rows"] * seen["columns"] == seen["drawn"]  # every cell drawn, none empty
    assert seen["before"][:4] == ["exp-a", "exp-b", "exp-c", "exp-d"]
    ours = [name for name in seen["down"] if name in accuracies]
    assert ours == ["exp-b", "exp-d", "exp-c", "exp-a"]  # by imagenet-1k accuracy, highest first
    values = [float(v) for v in seen["values"] if v != ""]
    assert values == sorted(values, reverse=True) and len(values) == seen["rows"]  # published rows sorted with them
    assert [name for name in seen["up"] if name in accuracies] == ["exp-a", "exp-c", "exp-d", "exp-b"]
    assert [n for n in seen["byName"] if n in accuracies] == ["exp-d", "exp-c", "exp-b", "exp-a"]  # by name
    assert seen["arrow"] == '" ▼"'
