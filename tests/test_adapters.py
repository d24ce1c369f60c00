"""vlbench/adapters/: each adapter against the installed library. A test here fails on the library release that
moves or changes a private name an adapter uses (its signature, or what it returns on the real thing), naming it."""

from __future__ import annotations

import hashlib
import inspect
import pkgutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from dvc.repo import Repo
from dvc.stage.cache import StageCache, _can_hash
from packaging.requirements import Requirement

from vlbench import adapters
from vlbench.adapters import dvc as dvc_private
from vlbench.adapters import torch as torch_private

ROOT = Path(__file__).resolve().parent.parent


def requirements() -> list[Requirement]:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"] + sum(project["optional-dependencies"].values(), [])]


def test_each_adapted_library_is_bounded_below_its_next_major_and_the_constraints_pin_inside_the_bounds():
    """pyproject.toml bounds every library with an adapter (`<N`), and every version constraints.txt pins (what
    `make setup` installs) is allowed by every requirement on it, so `pip install -c constraints.txt` resolves."""
    adapted = {m.name for m in pkgutil.iter_modules(adapters.__path__)}
    assert adapted == {"dvc", "ray", "torch"}
    for req in requirements():
        if req.name in adapted:
            assert any(spec.operator == "<" for spec in req.specifier), f"{req}: no upper bound"
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    outside = [f"{req} excludes {pins[req.name]}" for req in requirements()
               if req.name in pins and not req.specifier.contains(pins[req.name])]
    assert not outside, outside


def upper_stage(out: str, **more) -> dict:
    """A stage writing in.txt upper-cased into `out`."""
    code = f"import pathlib; pathlib.Path('{out}').write_text(pathlib.Path('in.txt').read_text().upper())"
    return {"cmd": f'{sys.executable} -c "{code}"', "deps": ["in.txt"], "outs": [out], **more}


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_dvcs_run_cache_names_keep_the_signatures_the_adapter_calls():
    assert parameters(_can_hash) == ["stage"]
    assert parameters(StageCache._load) == ["self", "stage"]
    assert parameters(StageCache._create_stage) == ["self", "cache", "wdir"]


@pytest.fixture
def dvc_project(tmp_path):
    """A DVC project of one stage (in.txt upper-cased into out.txt) run for in.txt "a", then "b": its run cache holds
    both runs, dvc.lock the second."""
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    stages = {"upper": upper_stage("out.txt"), "always": upper_stage("always.txt", always_changed=True)}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}))
    for text in ("a\n", "b\n"):
        (tmp_path / "in.txt").write_text(text)
        subprocess.run([sys.executable, "-m", "dvc", "repro", "-q", "upper"], cwd=tmp_path, check=True)
    return tmp_path


def test_the_run_cache_entry_is_the_earlier_run_for_its_inputs_and_none_for_inputs_never_run(dvc_project,
                                                                                             monkeypatch):
    """Back to in.txt "a" (stale against dvc.lock): the entry is the first run, its output A's hash, in the cache.
    From the project's root, as `vlbench plan` runs (DVC builds the entry's stage from the relative "dvc.yaml")."""
    monkeypatch.chdir(dvc_project)
    (dvc_project / "in.txt").write_text("a\n")
    with Repo(str(dvc_project)) as repo:
        stages = {stage.name: stage for stage in repo.index.stages}
        entry = dvc_private.run_cache_entry(repo, stages["upper"])
        assert [out.def_path for out in entry.outs] == ["out.txt"]
        assert entry.outs[0].hash_info.value == hashlib.md5(b"A\n").hexdigest()
        assert entry.outs_cached() and entry.wdir == stages["upper"].wdir
        assert dvc_private.run_cache_entry(repo, stages["always"]) is None  # DVC cannot cache it
        (dvc_project / "in.txt").write_text("cc\n")  # another size: DVC's hash cache keys on size and mtime
        assert dvc_private.run_cache_entry(repo, stages["upper"]) is None  # never run with "cc"


def test_rays_record_of_the_last_ray_start_is_what_auto_stands_for(tmp_path, monkeypatch):
    """`ray start` records its GCS address with write_ray_address (in $RAY_TMPDIR/ray); the adapter reads it back,
    and embed_ray probes it before ray.init: with `auto`, a recorded cluster that is gone fails at once, naming it."""
    ray = pytest.importorskip("ray")
    from ray._private import services, utils
    from ray.scripts import scripts

    from vlbench import embed_ray
    from vlbench.adapters import ray as ray_private
    from vlbench.embed import EngineError

    assert parameters(services.find_bootstrap_address) == ["temp_dir"]
    assert "write_ray_address(" in inspect.getsource(scripts.start.callback), ray.__version__
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    (tmp_path / "ray").mkdir()
    assert ray_private.last_started_cluster() is None
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there once the socket is closed
    utils.write_ray_address(f"127.0.0.1:{port}")
    assert ray_private.last_started_cluster() == f"127.0.0.1:{port}"
    monkeypatch.setenv("VLBENCH_RAY_ADDRESS", "auto")
    with pytest.raises(EngineError, match=rf"^\$VLBENCH_RAY_ADDRESS=auto: no Ray cluster answers at 127.0.0.1:{port} "):
        embed_ray.ray_address()


def test_torchs_compile_check_is_dynamos_own():
    from torch._dynamo import utils

    assert parameters(utils.is_compile_supported) == ["device_type"]
    assert torch_private.is_compile_supported("cpu") == utils.is_compile_supported("cpu")
    assert torch_private.DYNAMO_UTILS == utils.__name__


def test_output_bytes_counts_every_tensor_each_operation_returns():
    """A product (one 3x5 float32 output: 60 bytes) and a split into five 2-element views (a tuple: 5 x 8 bytes)."""
    a, b, x = torch.ones(3, 4), torch.ones(4, 5), torch.arange(10, dtype=torch.float32)
    with torch_private.output_bytes() as recorded:
        a @ b
        torch.split(x, 2)
    assert (recorded.largest, recorded.total) == (60, 100)
