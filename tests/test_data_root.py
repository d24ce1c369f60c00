"""`vlbench data-root`: the link data/own of the project run in (also from a sub-folder), no self-referencing link,
and a dangling link reported with its target."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from vlbench.cli import main
from vlbench.data_root import check_data_root
from vlbench.params import ParamsError


@pytest.fixture
def project(tmp_path, monkeypatch):
    root = tmp_path / "project"
    (root / "stages").mkdir(parents=True)
    (root / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "mydata").mkdir()
    monkeypatch.chdir(root)
    return root


def data_root(*args):
    return CliRunner().invoke(main, ["data-root", *args])


def test_run_from_a_sub_folder_the_link_is_the_projects(project, monkeypatch):
    monkeypatch.chdir(project / "stages")
    result = data_root("../../mydata")
    assert result.exit_code == 0, result.output
    assert os.readlink(project / "data/own") == str(project.parent / "mydata")
    assert not (project / "stages/data").exists()


@pytest.mark.parametrize("target", [".", "data", "./data/../data"])
def test_a_root_that_would_hold_the_link_is_refused(project, target):
    (project / "data").mkdir()
    result = data_root(target)
    assert result.exit_code == 1
    assert f"data root '{project.resolve()}" in result.output and "would hold the link" in result.output
    assert f"{project.resolve() / 'data/own'}' itself (a loop)" in result.output
    assert not os.path.lexists(project / "data/own")


def test_a_dangling_link_is_reported_with_its_target(project):
    assert data_root(str(project.parent / "mydata")).exit_code == 0
    (project.parent / "mydata").rename(project.parent / "moved")
    with pytest.raises(ParamsError, match=rf"dataset 'pets' reads 'data/own/pets' but 'data/own' points at "
                                          rf"'{project.parent / 'mydata'}', which does not exist"):
        check_data_root("data/own/pets", "pets")
