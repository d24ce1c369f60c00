"""tools/vtab_data.py on miniature upstream files: which list each task takes, SUN397 put in TFDS's order."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import vtab_data  # noqa: E402

CLIP_MD = """# Prompts

## CIFAR100

```bash
classes = [
    'apple',
    "aquarium fish",
]
```

## DescribableTextures

```bash
classes = [
    'banded',
]
```

## RESISC45

```bash
classes = [
    'airplane',
]
```

## SUN397

```bash
classes = [
    'abbey',
    'jail cell',
    'jail indoor',
    'apse indoor',
]
```
"""
SUN_LABELS = "/a/abbey\n/a/apse/indoor\n/j/jail/indoor\n/j/jail_cell\n"


def miniature(tmp_path: Path) -> list[str]:
    cb = tmp_path / "cb"
    cb.mkdir()
    keys = {key for kind, key, _ in vtab_data.SOURCES.values() if kind == "cb"}
    (cb / "en_classnames.json").write_text(json.dumps({k: [f"{k} 0", f"{k} 1"] for k in keys}))
    templates = {t: [f"{t}: {{c}}"] for _, _, t in vtab_data.SOURCES.values()}
    (cb / "en_zeroshot_classification_templates.json").write_text(json.dumps(templates))
    (tmp_path / "prompts.md").write_text(CLIP_MD)
    (tmp_path / "sun397_labels.txt").write_text(SUN_LABELS)
    return ["--clip-benchmark", str(cb), "--clip-prompts", str(tmp_path / "prompts.md"),
            "--sun397-labels", str(tmp_path / "sun397_labels.txt"), "--out", str(tmp_path / "vtab.json")]


def test_tool_takes_each_tasks_list_from_its_source(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "tools" / "vtab_data.py"), *miniature(tmp_path)], check=True)
    tasks = json.loads((tmp_path / "vtab.json").read_text())["tasks"]
    assert set(tasks) == set(vtab_data.SOURCES)
    assert tasks["dmlab"]["classes"] == ["dmlab 0", "dmlab 1"]
    assert tasks["caltech101"]["classes"] == ["caltech101_vtab 0", "caltech101_vtab 1"]
    assert tasks["cifar100"]["classes"] == ["apple", "aquarium fish"]
    assert tasks["sun397"]["classes"] == ["abbey", "apse indoor", "jail indoor", "jail cell"]
    assert tasks["smallnorb_elevation"]["classes"] == [str(i) for i in range(9)]
    assert tasks["kitti_distance"]["templates"] == ["kitti_closest_vehicle_distance: {c}"]
    assert "CLIP paper" in tasks["sun397"]["class_source"] and "TFDS" in tasks["sun397"]["class_source"]


def test_dsprites_note_says_clip_benchmarks_tasks_are_32_and_40_way_not_vtabs_16(tmp_path):
    """Issue 30: the note said CLIP_benchmark's builder shows these 16 classes; it builds 32- and 40-way tasks."""
    subprocess.run([sys.executable, str(ROOT / "tools" / "vtab_data.py"), *miniature(tmp_path)], check=True)
    built = json.loads((tmp_path / "vtab.json").read_text())["tasks"]
    committed = json.loads((ROOT / "vlbench/datasets/data/vtab.json").read_text())["tasks"]
    for task in ("dsprites_location", "dsprites_orientation"):
        note = built[task]["class_source"]
        assert committed[task]["class_source"] == note and len(committed[task]["classes"]) == 16
        assert "32-way" in note and "40-way" in note and "not comparable" in note
    assert "CLIP_benchmark's vtab builder shows" in built["smallnorb_azimuth"]["class_source"]  # true there


def test_tool_refuses_sun397_names_that_do_not_pair(tmp_path):
    args = miniature(tmp_path)
    (tmp_path / "sun397_labels.txt").write_text(SUN_LABELS + "/y/youth_hostel\n")
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "vtab_data.py"), *args], capture_output=True, text=True)
    assert proc.returncode != 0 and "SUN397" in proc.stderr
