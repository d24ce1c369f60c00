"""params.yaml as `dvc exp run` writes it: `vlbench compose` gives the same bytes (DVC's own Hydra composition is the
reference), so the committed file carries no comment that a run would drop."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from dvc.utils.hydra import compose_and_dump

from vlbench.cli import main

ROOT = Path(__file__).resolve().parents[1]


def dvc_params(tmp_path: Path, overrides: list[str]) -> str:
    out = tmp_path / "dvc-params.yaml"
    compose_and_dump(out, str(ROOT / "conf"), None, "config", str(tmp_path), overrides)
    return out.read_text()


def test_the_committed_params_yaml_is_what_dvc_exp_run_writes(tmp_path):
    assert (ROOT / "params.yaml").read_text() == dvc_params(tmp_path, [])


@pytest.mark.parametrize("overrides", [[], ["model=toy-wide", "suite=retrieval"]])
def test_vlbench_compose_writes_dvcs_bytes(tmp_path, monkeypatch, overrides):
    monkeypatch.chdir(ROOT)
    ours = tmp_path / "ours.yaml"
    result = CliRunner().invoke(main, ["compose", "-o", str(ours), *overrides])
    assert result.exit_code == 0, result.output
    assert ours.read_text() == dvc_params(tmp_path, overrides)
