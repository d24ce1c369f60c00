"""Bring-your-own data under real DVC: the user's folder and manifest are dependencies of `prepare`."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import COLORS, png
from tests.pipeline_repo import add_all, make_repo, run

DVC = (sys.executable, "-m", "dvc")

PETS = """prepare:
  source: imagefolder
  root: data/own/pets
  splits: {train: train, test: test}
  skip_corrupt: true
input: ${.prepare.root}
texts: {templates: ['a photo of a {c}.']}
"""
XRAY = """input: data/own/xray
prepare:
  source: manifest
  path: ${..input}/manifest.csv
  split_column: split
  classnames: [red, green]
texts: {templates: ['an x-ray of {c}.']}
"""
SUITE = """datasets: {pets: data/own/pets, xray: data/own/xray}
slug: byo
embed: [pets]
zeroshot: [pets]
"""


def status(repo: Path) -> set[str]:
    return set(json.loads(run(repo, *DVC, "status", "--json").stdout))


def own_data(root: Path) -> tuple[Path, Path]:
    """An ImageFolder tree (one corrupt image) and a manifest folder under the data root `root`."""
    pets = root / "pets"
    for split in ("train", "test"):
        for label, (name, rgb) in enumerate(list(COLORS.items())[:2]):
            (pets / split / name).mkdir(parents=True)
            for k in range(2):
                (pets / split / name / f"{k}.png").write_bytes(png(rgb, seed=k + 10 * label))
    (pets / "train" / "red" / "broken.png").write_bytes(png(COLORS["red"])[:60])
    xray = root / "xray"
    (xray / "img").mkdir(parents=True)
    lines = ["path,label,split"]
    for k in range(4):
        (xray / "img" / f"{k}.png").write_bytes(png(list(COLORS.values())[k % 2], seed=100 + k))
        lines.append(f"img/{k}.png,{k % 2},{'train' if k < 2 else 'test'}")
    (xray / "manifest.csv").write_text("\n".join(lines) + "\n")
    return pets, xray


@pytest.fixture(scope="module")
def byo(tmp_path_factory):
    base = tmp_path_factory.mktemp("byo")
    pets, xray = own_data(base / "data")
    repo = make_repo(base / "repo")
    (repo / "conf/dataset/pets.yaml").write_text(PETS)
    (repo / "conf/dataset/xray.yaml").write_text(XRAY)
    (repo / "conf/suite/byo.yaml").write_text(SUITE)
    run(repo, sys.executable, "-m", "vlbench.cli", "data-root", str(base / "data"))
    run(repo, sys.executable, "-m", "vlbench.cli", "compose", "suite=byo")
    run(repo, *DVC, "repro")
    assert status(repo) == set()
    add_all(repo)
    run(repo, "git", "commit", "-qm", "byo results")
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
    repo, _, _ = byo
    params = tmp_path / "params.yaml"
    run(repo, sys.executable, "-m", "vlbench.cli", "compose", "suite=byo", "suite.datasets.pets=data/own/xray",
        "+suite.entries.pets.input=data/own/xray", "-o", str(params))
    proc = run(repo, sys.executable, "-m", "stages.prepare", "--dataset", "pets", "--params", str(params), check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not contain 'data/own/pets'" in lines[0] and "set `input:`" in lines[0]


def test_an_input_outside_the_project_is_refused_at_compose(byo, tmp_path):
    repo, pets, _ = byo
    proc = run(repo, sys.executable, "-m", "vlbench.cli", "compose", "suite=byo", f"suite.datasets.pets={pets}",
               "-o", str(tmp_path / "params.yaml"), check=False)
    assert proc.returncode != 0 and "a path outside the project" in proc.stderr and "vlbench data-root" in proc.stderr


def test_a_second_clone_with_its_data_elsewhere_sees_the_same_lock_and_nothing_changed(byo, tmp_path):
    """dvc.lock names data/own/<...>, never where the data lives: a teammate links their own copy and is clean."""
    repo, _, _ = byo
    add_all(repo)
    run(repo, "git", "commit", "-q", "--allow-empty", "-m", "results after the earlier tests' changes")
    lock = (repo / "dvc.lock").read_text()
    assert str(repo.parent) not in lock and "path: data/own/pets" in lock and "path: data/own/xray" in lock
    clone = tmp_path / "clone"
    run(tmp_path, "git", "clone", "-q", str(repo), str(clone))
    elsewhere = tmp_path / "somewhere" / "else"
    shutil.copytree(repo / "data/own", elsewhere, symlinks=False)  # the same files at another path
    proc = run(clone, *DVC, "status", check=False)
    assert "data/own/pets" in proc.stdout  # before linking: the data is missing, not silently something else
    proc = run(clone, sys.executable, "-m", "stages.prepare", "--dataset", "pets", check=False)
    assert proc.returncode == 2 and "run `vlbench data-root /path/to/your/data`" in proc.stderr
    run(clone, sys.executable, "-m", "vlbench.cli", "data-root", str(elsewhere))
    run(clone, *DVC, "cache", "dir", "--local", str(repo / ".dvc/cache"))  # as `dvc pull` from a shared remote would
    run(clone, *DVC, "checkout")
    assert status(clone) == set()
    assert (clone / "dvc.lock").read_text() == lock
    run(clone, *DVC, "repro")  # nothing to run
    assert (clone / "dvc.lock").read_text() == lock and run(clone, "git", "status", "--porcelain").stdout == ""


def test_dvc_exp_run_with_a_misspelled_suite_key_fails_at_its_first_stage(tmp_path):
    """DVC composes params.yaml itself for `dvc exp run -S`: the stages' own check of it stops the run."""
    repo = make_repo(tmp_path / "repo")
    (repo / "conf/suite/typo.yaml").write_text("datasets: {shapes: vlbench/datasets/synthetic.py}\nslug: typo\n"
                                               "embed: [shapes]\nzershot: [shapes]\n")
    add_all(repo)
    run(repo, "git", "commit", "-qm", "typo suite")
    proc = run(repo, *DVC, "exp", "run", "-S", "suite=typo", check=False)
    assert proc.returncode != 0
    assert "unknown key 'zershot'; did you mean 'zeroshot'?" in proc.stdout + proc.stderr
    assert not (repo / "data/prepared/shapes").exists()  # nothing ran before the check



def test_a_folder_link_inside_the_root_fails_prepare_naming_the_link(byo):
    """The issue's case: DVC does not follow a folder link when it hashes `input`, so after
    `ln -s ../../extra <root>/test/<class>/inlink` `dvc status` still says up to date; prepare must not quietly add
    the linked images (13 test images instead of 12), it refuses the link with the fix."""
    repo, pets, _ = byo
    extra = pets / "extra"
    extra.mkdir()
    (extra / "5.png").write_bytes(png(COLORS["green"], seed=55))
    link = pets / "test" / "green" / "inlink"
    link.symlink_to("../../extra", target_is_directory=True)
    try:
        proc = run(repo, *DVC, "repro", "-f", "-s", "prepare@pets", check=False)
        assert proc.returncode != 0
        out = proc.stderr + proc.stdout  # the link as prepare reaches it, through the data root's link data/own
        assert "folder link '" in out and "data/own/pets/test/green/inlink'" in out and "bind mount" in out
    finally:
        link.unlink()
        (extra / "5.png").unlink()
        extra.rmdir()
    run(repo, *DVC, "checkout", "prepare@pets")  # DVC removed the stage's outputs before running it
    assert status(repo) == set()
