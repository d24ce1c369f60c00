"""Bring-your-own data under real DVC: the user's folder and manifest are dependencies of `prepare`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import COLORS, png
from tests.pipeline_repo import make_repo, run

DVC = (sys.executable, "-m", "dvc")

PETS = """prepare:
  source: imagefolder
  root: {root}
  splits: {{train: train, test: test}}
  skip_corrupt: true
input: ${{.prepare.root}}
texts: {{templates: ['a photo of a {{c}}.']}}
"""
XRAY = """input: {folder}
prepare:
  source: manifest
  path: ${{..input}}/manifest.csv
  split_column: split
  classnames: [red, green]
texts: {{templates: ['an x-ray of {{c}}.']}}
"""
SUITE = """defaults:
  - /dataset@datasets.pets: pets
  - /dataset@datasets.xray: xray
  - _self_
slug: byo
embed: [pets]
zeroshot: [pets]
"""


def status(repo: Path) -> set[str]:
    return set(json.loads(run(repo, *DVC, "status", "--json").stdout))


@pytest.fixture(scope="module")
def byo(tmp_path_factory):
    base = tmp_path_factory.mktemp("byo")
    pets = base / "pets"
    for split in ("train", "test"):
        for label, (name, rgb) in enumerate(list(COLORS.items())[:2]):
            (pets / split / name).mkdir(parents=True)
            for k in range(2):
                (pets / split / name / f"{k}.png").write_bytes(png(rgb, seed=k + 10 * label))
    (pets / "train" / "red" / "broken.png").write_bytes(png(COLORS["red"])[:60])
    xray = base / "xray"
    (xray / "img").mkdir(parents=True)
    lines = ["path,label,split"]
    for k in range(4):
        (xray / "img" / f"{k}.png").write_bytes(png(list(COLORS.values())[k % 2], seed=100 + k))
        lines.append(f"img/{k}.png,{k % 2},{'train' if k < 2 else 'test'}")
    (xray / "manifest.csv").write_text("\n".join(lines) + "\n")
    repo = make_repo(base / "repo")
    (repo / "conf/dataset/pets.yaml").write_text(PETS.format(root=pets))
    (repo / "conf/dataset/xray.yaml").write_text(XRAY.format(folder=xray))
    (repo / "conf/suite/byo.yaml").write_text(SUITE)
    run(repo, sys.executable, "-m", "vlbench.cli", "compose", "suite=byo")
    run(repo, *DVC, "repro")
    assert status(repo) == set()
    return repo, pets, xray


def test_skipped_corrupt_images_are_counted_in_the_results(byo):
    repo, _, _ = byo
    classes = json.loads((repo / "data/prepared/pets/classes.json").read_text())
    assert classes["provenance"]["skipped_corrupt"] == ["train/red/broken.png"]
    result = json.loads((repo / "reports/zeroshot/pets.json").read_text())
    assert result["counts"]["skipped_corrupt"] == 1 and result["counts"]["samples"] == 4
    assert [c["key"] for c in classes["classes"]] == ["green", "red"]


def test_a_changed_image_makes_prepare_of_its_dataset_stale(byo):
    repo, pets, _ = byo
    image = pets / "train" / "red" / "0.png"
    image.write_bytes(png(COLORS["blue"], seed=7))
    assert status(repo) == {"prepare@pets"}
    run(repo, *DVC, "repro")
    assert status(repo) == set()


def test_an_added_or_removed_image_makes_prepare_stale(byo):
    repo, pets, _ = byo
    extra = pets / "test" / "green" / "9.png"
    extra.write_bytes(png(COLORS["green"], seed=9))
    assert status(repo) == {"prepare@pets"}
    extra.unlink()
    assert status(repo) == set()  # back to what was prepared
    (pets / "test" / "green" / "1.png").unlink()
    assert status(repo) == {"prepare@pets"}
    run(repo, *DVC, "repro")
    classes = json.loads((repo / "data/prepared/pets/classes.json").read_text())
    assert classes["splits"] == {"train": 4, "test": 3}


def test_a_changed_manifest_or_named_image_makes_prepare_stale(byo):
    repo, _, xray = byo
    (xray / "img" / "3.png").write_bytes(png(COLORS["blue"], seed=3))
    assert status(repo) == {"prepare@xray"}
    run(repo, *DVC, "repro")
    manifest = xray / "manifest.csv"
    manifest.write_text(manifest.read_text().replace("img/3.png,1,test", "img/3.png,0,test"))
    assert status(repo) == {"prepare@xray"}
    run(repo, *DVC, "repro")
    assert status(repo) == set()


def test_an_input_that_does_not_cover_the_data_is_refused(byo, tmp_path):
    repo, pets, _ = byo
    params = tmp_path / "params.yaml"
    run(repo, sys.executable, "-m", "vlbench.cli", "compose", "suite=byo", f"suite.datasets.pets.input={tmp_path}",
        "-o", str(params))
    proc = run(repo, sys.executable, "-m", "stages.prepare", "--dataset", "pets", "--params", str(params), check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"does not contain {str(pets)!r}" in lines[0] and "set `input:`" in lines[0]


def test_dvc_exp_run_with_a_misspelled_suite_key_fails_at_its_first_stage(tmp_path):
    """DVC composes params.yaml itself for `dvc exp run -S`: the stages' own check of it stops the run."""
    repo = make_repo(tmp_path / "repo")
    (repo / "conf/suite/typo.yaml").write_text(SUITE.replace("zeroshot:", "zershot:").replace(
        "  - /dataset@datasets.xray: xray\n", "").replace("/dataset@datasets.pets: pets", "/dataset@datasets.shapes: shapes")
        .replace("[pets]", "[shapes]"))
    run(repo, "git", "add", "-A")
    run(repo, "git", "commit", "-qm", "typo suite")
    proc = run(repo, *DVC, "exp", "run", "-S", "suite=typo", check=False)
    assert proc.returncode != 0
    assert "unknown key 'zershot'; did you mean 'zeroshot'?" in proc.stdout + proc.stderr
    assert not (repo / "data/prepared/shapes").exists()  # nothing ran before the check
