#!/usr/bin/env python3
"""Look at the report's SVG charts the way a person offline would: headless Chromium, one PNG per SVG.

Usage:
    .venv/bin/python scripts/check_plots.py [SOURCE] [PNG_DIR]

SOURCE is a directory of SVGs (default reports/plots) or a metrics.json, in which case the charts are
first made from it with vlbench.report.plots.write_plots into PNG_DIR. PNGs go to PNG_DIR (default: a
new temporary directory, printed). Then open the PNGs and read them: every dataset named, no label
overlapping another or cut off.

Installs nothing. Needs Debian's Chromium (as root: `apt-get update && apt-get install -y chromium`);
exits 2 with that hint when no chromium is on PATH. Chromium runs with no network features and a
throwaway profile, so a chart that needs the internet to draw comes out blank and fails the check.
Exit status: 0 all PNGs drawn, 1 some SVG rendered blank or failed, 2 no chromium / no SVGs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WINDOW = (900, 600)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        if path := shutil.which(name):
            return path
    return None


def svg_size(svg: Path) -> tuple[int, int]:
    """The width and height attributes of the root element (vl-convert writes both in px)."""
    head = svg.read_text(encoding="utf-8")[:2000]
    m = re.search(r'<svg\b[^>]*\bwidth="([\d.]+)"[^>]*\bheight="([\d.]+)"', head)
    return (int(float(m.group(1))), int(float(m.group(2)))) if m else WINDOW


def screenshot(chromium: str, svg: Path, png: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """Render `svg` in headless Chromium into `png` (window at least 900x600, larger for a larger chart)."""
    w, h = svg_size(svg)
    width, height = max(WINDOW[0], w + 20), max(WINDOW[1], h + 20)
    png.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        cmd = [chromium, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
               f"--window-size={width},{height}", svg.resolve().as_uri()]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def ink_fraction(png: Path) -> float:
    """Share of pixels that are not (near) white; 0.0 for a blank page."""
    from PIL import Image

    with Image.open(png) as img:
        gray = img.convert("L")
        hist = gray.histogram()
        return sum(hist[:240]) / (gray.width * gray.height)


def main(argv: list[str]) -> int:
    source = Path(argv[0]) if argv else ROOT / "reports" / "plots"
    png_dir = Path(argv[1]) if len(argv) > 1 else Path(tempfile.mkdtemp(prefix="vlbench-plots-"))
    png_dir.mkdir(parents=True, exist_ok=True)

    chromium = find_chromium()
    if chromium is None:
        print("no chromium on PATH; install Debian's: apt-get update && apt-get install -y chromium",
              file=sys.stderr)
        return 2

    if source.is_file():                      # a metrics.json: make the charts first
        sys.path.insert(0, str(ROOT))
        from vlbench.report.plots import write_plots

        written = write_plots(json.loads(source.read_text()), png_dir)
        svgs = [p for p in written if p.suffix == ".svg"]
    else:
        svgs = sorted(source.glob("*.svg"))
    if not svgs:
        print(f"no SVG in {source}", file=sys.stderr)
        return 2

    failed = 0
    for svg in svgs:
        png = png_dir / f"{svg.stem}.png"
        result = screenshot(chromium, svg, png)
        if result.returncode != 0 or not png.exists():
            print(f"FAIL {svg}: chromium exit {result.returncode}\n{result.stderr[-2000:]}", file=sys.stderr)
            failed += 1
            continue
        ink = ink_fraction(png)
        status = "ok  " if ink > 0.01 else "BLANK"
        failed += status != "ok  "
        print(f"{status} {svg} -> {png} ({ink:.1%} of pixels drawn)")
    print(f"PNGs in {png_dir}; open them and check every label is readable")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
