"""Per-analysis CSV + offline SVG charts of reports/metrics.json (vlbench.report.plots)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from vlbench.report.plots import write_plots

ROOT = Path(__file__).resolve().parents[1]
SVG_NS = "{http://www.w3.org/2000/svg}"

# the shape of reports/metrics.json, model fingerprint and a stray scalar included
METRICS = {
    "zeroshot": {
        "shapes": {"accuracy": 0.768},
        "colors": {"accuracy": 1.0},
        "shape_color": {"accuracy": 0.751},
        "count": {"accuracy": 0.944},
        "position": {"accuracy": 0.136},
        "hierarchy": {"map_11point": 0.44767489490114354},
    },
    "linear_probe": {
        "shapes": {"accuracy": 0.824},
        "colors": {"accuracy": 0.998},
        "count": {"accuracy": 0.991},
        "position": {"accuracy": 0.358},
    },
    "model": {"model": "toy", "arch": "vlbench-toy", "precision": "fp32"},
    "schema": 1,
}
EXPECTED_LABELS = {
    "zeroshot": ["accuracy 0.768", "accuracy 1.000", "accuracy 0.751", "accuracy 0.944", "accuracy 0.136",
                 "map_11point 0.448"],
    "linear_probe": ["accuracy 0.824", "accuracy 0.998", "accuracy 0.991", "accuracy 0.358"],
}


def svg_texts(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG_NS}svg"
    return ["".join(t.itertext()) for t in root.iter(f"{SVG_NS}text")]


def test_one_svg_per_analysis(tmp_path):
    written = write_plots(METRICS, tmp_path)
    assert written == [tmp_path / n for n in ("zeroshot.svg", "linear_probe.svg")]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in written)  # no temp files left


def test_svg_names_every_dataset_and_value(tmp_path):
    write_plots(METRICS, tmp_path)
    for analysis, per_dataset in METRICS.items():
        if analysis not in EXPECTED_LABELS:
            continue
        texts = svg_texts(tmp_path / f"{analysis}.svg")
        assert analysis in texts                                     # the title
        for dataset in per_dataset:
            assert texts.count(dataset) == 1, (dataset, texts)      # y-axis label, once
        for label in EXPECTED_LABELS[analysis]:
            assert label in texts, (label, texts)
        assert {"0.0", "0.5", "1.0"} - set(texts) == {"0.5"}         # the 0..1 axis (ticks every 0.2)
        # another analysis' datasets do not leak in
        others = {d for a, pd in METRICS.items() if a in EXPECTED_LABELS and a != analysis for d in pd}
        assert not (others - set(per_dataset)) & set(texts)


def test_svg_is_self_contained(tmp_path):
    """Nothing to fetch: no scripts, no external references, so it draws offline."""
    write_plots(METRICS, tmp_path)
    for svg in tmp_path.glob("*.svg"):
        root = ET.parse(svg).getroot()
        tags = {el.tag.removeprefix(SVG_NS) for el in root.iter()}
        assert not tags & {"script", "foreignObject", "image", "use"}, tags
        for el in root.iter():
            for key, value in el.attrib.items():
                if key.endswith("href") or key == "src":
                    assert not value.startswith(("http:", "https:", "//")), (svg, key, value)
        assert "@import" not in svg.read_text()
        assert 200 < float(root.get("width")) < 1200 and 50 < float(root.get("height")) < 1200


def test_rerun_is_byte_identical(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    written = write_plots(METRICS, first)
    before = {p.name: p.read_bytes() for p in written}
    write_plots(METRICS, second)
    write_plots(METRICS, first)                                      # over its own output
    assert {p.name: p.read_bytes() for p in first.iterdir()} == before
    assert {p.name: p.read_bytes() for p in second.iterdir()} == before
    # and in a fresh interpreter (no state carried between renders)
    third = tmp_path / "c"
    code = ("import json, sys; from pathlib import Path; from vlbench.report.plots import write_plots; "
            "write_plots(json.loads(sys.argv[1]), Path(sys.argv[2]))")
    import json

    subprocess.run([sys.executable, "-c", code, json.dumps(METRICS), str(third)], check=True, cwd=ROOT)
    assert {p.name: p.read_bytes() for p in third.iterdir()} == before


def test_changed_value_changes_only_its_analysis(tmp_path):
    write_plots(METRICS, tmp_path / "a")
    changed = {**METRICS, "linear_probe": {**METRICS["linear_probe"], "position": {"accuracy": 0.4}}}
    write_plots(changed, tmp_path / "b")
    same = {n for n in ("zeroshot.svg", "linear_probe.svg")
            if (tmp_path / "a" / n).read_bytes() == (tmp_path / "b" / n).read_bytes()}
    assert same == {"zeroshot.svg"}
    assert "accuracy 0.400" in svg_texts(tmp_path / "b" / "linear_probe.svg")


def test_any_analysis_name_and_odd_values(tmp_path):
    """Nothing analysis-specific: a new analysis, several metrics per dataset, n/a and out-of-range values."""
    metrics = {
        "adapt": {
            "vtab_dtd": {"accuracy": 0.42, "mean_per_class": 0.4, "note": "not a number"},
            "weird": {"accuracy": float("nan"), "roc_auc": 1.3},
        },
        "empty": {},
        "version": "0.1.0",
    }
    written = write_plots(metrics, tmp_path)
    assert [p.name for p in written] == ["adapt.svg"]
    texts = svg_texts(tmp_path / "adapt.svg")
    for label in ("vtab_dtd", "weird", "accuracy 0.420", "mean_per_class 0.400", "accuracy n/a", "roc_auc 1.300"):
        assert label in texts
    assert not any("note" in t for t in texts)


def test_unusable_analysis_name_is_refused(tmp_path):
    with pytest.raises(ValueError, match="file name"):
        write_plots({"../escape": {"d": {"accuracy": 0.5}}}, tmp_path)
    assert not any(tmp_path.parent.glob("escape*"))


CHROMIUM = next((c for c in ("chromium", "chromium-browser", "google-chrome") if shutil.which(c)), None)


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install -y chromium)")
def test_chromium_draws_the_charts_offline(tmp_path):
    """scripts/check_plots.py: headless Chromium, no network, renders each SVG to a non-blank PNG."""
    import json

    from PIL import Image

    metrics_file = tmp_path / "metrics.json"
    metrics_file.write_text(json.dumps(METRICS))
    out = tmp_path / "png"
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_plots.py"), str(metrics_file), str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for analysis, per_dataset in METRICS.items():
        if analysis not in EXPECTED_LABELS:
            continue
        with Image.open(out / f"{analysis}.png") as img:
            rgb = img.convert("RGB")
            assert rgb.size[0] >= 900 and rgb.size[1] >= 600
            # the bars are drawn: pixels of the chart's bar colour (dark2's first, #1b9e77), row after row
            pixels = rgb.load()
            bar_rows = {y for y in range(rgb.size[1]) for x in range(0, rgb.size[0], 4)
                        if pixels[x, y] == (0x1B, 0x9E, 0x77)}
        assert len(bar_rows) > 10 * len(per_dataset) / 2, (analysis, len(bar_rows))


def test_vega_counter_ids_are_renumbered_per_document():
    """Vega's clip/gradient ids come from process-wide counters; the SVG must not depend on them."""
    from vlbench.report.plots import _renumber_ids

    svg = ('<clipPath id="clip3"/><g clip-path="url(#clip3)"/><clipPath id="clip13"/>'
           '<g clip-path="url(#clip13)"/><linearGradient id="gradient_7"/><rect fill="url(#gradient_7)"/>')
    assert _renumber_ids(svg) == ('<clipPath id="clip1"/><g clip-path="url(#clip1)"/><clipPath id="clip2"/>'
                                  '<g clip-path="url(#clip2)"/><linearGradient id="gradient_1"/>'
                                  '<rect fill="url(#gradient_1)"/>')


def test_a_chart_depends_on_its_own_analysis_only(tmp_path):
    """A new metric or dataset in another analysis must not rewrite this analysis' files (no DVC churn)."""
    write_plots(METRICS, tmp_path / "a")
    grown = {**METRICS, "adapt": {"vtab_dtd": {"mean_per_class": 0.3, "roc_auc": 0.7}}}
    write_plots(grown, tmp_path / "b")
    for name in ("zeroshot.svg", "linear_probe.svg"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_the_training_log_becomes_a_static_svg_line_of_its_losses(tmp_path):
    """train_plot@<toy>: what `dvc plots show` shows of pretraining is this image, never a CDN-loaded template."""
    from vlbench.report.plots import write_train_log_plot

    log = tmp_path / "train_log.csv"
    log.write_text("step,loss,lr\n0,4.158000,0.0001\n1,3.900000,0.0002\n2,2.500000,0.0002\n3,1.250000,0.0001\n")
    svg = write_train_log_plot("toy", log, tmp_path / "a" / "train_log.svg").read_text()
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG_NS}svg" and not list(root.iter(f"{SVG_NS}script"))
    assert not [v for e in root.iter() for k, v in e.attrib.items() if k.endswith("href") and "//" in v]
    texts = [t.text for t in root.iter(f"{SVG_NS}text")]
    assert "pretrain toy: training loss" in texts and "step" in texts and "loss" in texts
    paths = [p.get("d") for p in root.iter(f"{SVG_NS}path") if p.get("d", "").count("L") == 3]  # the 4-point line
    assert len(paths) == 1
    assert write_train_log_plot("toy", log, tmp_path / "b" / "train_log.svg").read_text() == svg
    log.write_text(log.read_text().replace("2.500000", "3.000000"))
    assert write_train_log_plot("toy", log, tmp_path / "c" / "train_log.svg").read_text() != svg
