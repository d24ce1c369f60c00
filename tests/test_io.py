"""atomic_dir / atomic_path under kills: the old output survives, and the next run clears what a killed run left.

Kills are real: a child Python process SIGKILLs itself at the critical point (inside the with-block, or inside the
rename/delete that follows it, by wrapping that one call)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from vlbench import io as vio
from vlbench.io import atomic_dir, atomic_path

ROOT = Path(__file__).resolve().parents[1]

CHILD_PRELUDE = """
import os, shutil, signal, sys
from pathlib import Path
import vlbench.io as vio
from vlbench.io import atomic_dir, atomic_path
out = Path(sys.argv[1])
def die(*_args, **_kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
"""


def run_child(body: str, out: Path, *, expect_kill: bool = True) -> subprocess.CompletedProcess:
    script = CHILD_PRELUDE + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", script, str(out)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    if expect_kill:
        assert proc.returncode == -signal.SIGKILL, proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
    return proc


def make_output(out: Path, text: str) -> None:
    out.mkdir(parents=True)
    (out / "a.txt").write_text(text)
    (out / "sub").mkdir()
    (out / "sub" / "b.txt").write_text(text * 2)


def assert_output(out: Path, text: str) -> None:
    assert (out / "a.txt").read_text() == text
    assert (out / "sub" / "b.txt").read_text() == text * 2


def siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name)


def rerun(out: Path, text: str) -> list[str]:
    """A normal run replacing `out`; returns the siblings seen inside the with-block (leftovers are gone by then)."""
    with atomic_dir(out) as tmp:
        seen = sorted(p.name for p in out.parent.iterdir() if p.name not in (out.name, tmp.name))
        (tmp / "a.txt").write_text(text)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.txt").write_text(text * 2)
    return seen


@pytest.fixture(params=["exchange", "rename-aside"])
def swap_mode(request, monkeypatch):
    """Run a test with the atomic swap (renameat2 RENAME_EXCHANGE) and with the portable fallback."""
    if request.param == "exchange":
        probe = Path(tempfile.mkdtemp())
        try:
            (probe / "x").mkdir()
            (probe / "y").mkdir()
            if not vio._exchange(probe / "x", probe / "y"):
                pytest.skip("this filesystem or OS has no RENAME_EXCHANGE")
        finally:
            vio.shutil.rmtree(probe)
        return "", request.param
    monkeypatch.setattr(vio, "_exchange", lambda a, b: False)
    return "vio._exchange = lambda a, b: False\n", request.param


def test_kill_inside_the_with_block_keeps_the_old_output_and_the_next_run_clears_the_leftover(tmp_path):
    out = tmp_path / "features"
    make_output(out, "old")
    run_child("""
        with atomic_dir(out) as tmp:
            (tmp / "a.txt").write_text("new")
            die()
    """, out)
    assert_output(out, "old")
    assert len(siblings(out)) == 1 and siblings(out)[0].startswith(".features.")  # what the kill left
    assert rerun(out, "new") == []
    assert_output(out, "new")
    assert siblings(out) == []


def test_kill_between_moving_the_old_aside_and_the_new_in_loses_nothing(tmp_path, monkeypatch):
    """Without an atomic swap there is a moment with no output; a kill there leaves the old one aside, intact,
    and the next run puts it back before it starts (so a failing next run still leaves the old output)."""
    out = tmp_path / "features"
    make_output(out, "old")
    run_child("""
        vio._exchange = lambda a, b: False
        def kill_on_moving_in(real):
            def move(src, dst):
                if str(src).endswith(".tmp"):  # the new output moving into place: the old one is out of the way
                    die()
                return real(src, dst)
            return move
        os.rename, os.replace = kill_on_moving_in(os.rename), kill_on_moving_in(os.replace)
        with atomic_dir(out) as tmp:
            (tmp / "a.txt").write_text("new")
    """, out)
    assert not out.exists()
    [aside] = [tmp_path / n for n in siblings(out) if n.endswith(".old")]
    assert_output(aside, "old")

    monkeypatch.setattr(vio, "_exchange", lambda a, b: False)
    with pytest.raises(RuntimeError, match="boom"):
        with atomic_dir(out):
            assert_output(out, "old")  # restored before the run's own work starts
            raise RuntimeError("boom")
    assert_output(out, "old")
    assert siblings(out) == []
    rerun(out, "new")
    assert_output(out, "new")
    assert siblings(out) == []


def test_kill_after_the_swap_leaves_the_new_output_and_the_next_run_deletes_the_old(tmp_path, swap_mode):
    prelude, mode = swap_mode
    out = tmp_path / "features"
    make_output(out, "old")
    run_child(prelude + textwrap.dedent("""
        shutil.rmtree = die  # the first delete after the swap is the old output's
        with atomic_dir(out) as tmp:
            (tmp / "a.txt").write_text("new")
            (tmp / "sub").mkdir()
            (tmp / "sub" / "b.txt").write_text("newnew")
    """), out)
    assert_output(out, "new")
    [left] = siblings(out)
    assert_output(tmp_path / left, "old")
    assert left.endswith(".tmp" if mode == "exchange" else ".old")
    assert rerun(out, "newer") == []
    assert_output(out, "newer")
    assert siblings(out) == []


def test_first_run_and_replacing_runs_leave_nothing_beside_the_output(tmp_path, swap_mode):
    out = tmp_path / "deep" / "features"
    rerun(out, "one")
    assert_output(out, "one")
    rerun(out, "two")
    assert_output(out, "two")
    assert siblings(out) == []


def test_an_error_in_the_with_block_keeps_the_old_output(tmp_path, swap_mode):
    out = tmp_path / "features"
    make_output(out, "old")
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as tmp:
            (tmp / "a.txt").write_text("new")
            raise RuntimeError("stage failed")
    assert_output(out, "old")
    assert siblings(out) == []


def test_a_failed_move_into_place_puts_the_old_output_back(tmp_path, monkeypatch):
    out = tmp_path / "features"
    make_output(out, "old")
    monkeypatch.setattr(vio, "_exchange", lambda a, b: False)
    real_rename = os.rename

    def rename(src, dst):
        if str(src).endswith(".tmp"):
            raise OSError("disk trouble")
        return real_rename(src, dst)

    monkeypatch.setattr(vio.os, "rename", rename)
    with pytest.raises(OSError, match="disk trouble"):
        with atomic_dir(out) as tmp:
            (tmp / "a.txt").write_text("new")
    assert_output(out, "old")
    assert siblings(out) == []


def test_cleanup_touches_only_this_outputs_stale_temporaries(tmp_path):
    out = tmp_path / "features"
    other = tmp_path / "features.v2"  # its temporaries start with ".features." too
    make_output(out, "old")
    make_output(other, "other")
    for target in (out, other):
        run_child("""
            with atomic_dir(out) as tmp:
                die()
        """, target)
    legacy = Path(tempfile.mkdtemp(prefix=".features.", suffix=".tmp", dir=tmp_path))  # as the old code named them
    unrelated = [tmp_path / ".features.json", tmp_path / "features.tmp", tmp_path / ".features.notes.tmp.txt"]
    for p in unrelated:
        p.write_text("keep")
    other_left = [n for n in siblings(other) if n.startswith(".features.v2.")]
    assert len(other_left) == 1

    rerun(out, "new")
    assert not legacy.exists()
    assert all(p.read_text() == "keep" for p in unrelated)
    assert [n for n in siblings(other) if n.startswith(".features.v2.")] == other_left
    assert sorted(siblings(out)) == sorted([other.name, *other_left, *(p.name for p in unrelated)])


def test_a_live_writers_temporary_is_not_deleted(tmp_path):
    """Only temporaries of dead processes are stale: a run still writing the same output keeps its folder."""
    out = tmp_path / "features"
    make_output(out, "old")
    script = CHILD_PRELUDE + textwrap.dedent("""
        import time
        with atomic_dir(out) as tmp:
            (tmp / "a.txt").write_text("slow")
            print(tmp.name, flush=True)
            sys.stdin.readline()
            die()
    """)
    child = subprocess.Popen([sys.executable, "-c", script, str(out)], cwd=ROOT, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        live = child.stdout.readline().strip()
        assert live.startswith(".features.")
        rerun(out, "new")
        assert (tmp_path / live / "a.txt").read_text() == "slow"
    finally:
        child.stdin.write("go\n")
        child.stdin.flush()
        child.wait(timeout=60)
    assert rerun(out, "newer") == []  # dead now: cleared
    assert siblings(out) == []


def test_atomic_path_keeps_the_old_file_on_a_kill_and_the_next_write_clears_the_temp_file(tmp_path):
    target = tmp_path / "reports" / "metrics.json"
    target.parent.mkdir()
    target.write_text("old")
    run_child("""
        with atomic_path(out) as tmp:
            tmp.write_text("new")
            die()
    """, target)
    assert target.read_text() == "old"
    assert len(siblings(target)) == 1
    neighbour = target.parent / "metrics.json.bak"
    neighbour.write_text("keep")
    with atomic_path(target) as tmp:
        tmp.write_text("new")
    assert target.read_text() == "new"
    assert siblings(target) == ["metrics.json.bak"]


def test_atomic_path_removes_its_temp_file_on_error(tmp_path):
    target = tmp_path / "x.json"
    with pytest.raises(ValueError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise ValueError
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------------------ permissions


@pytest.fixture(params=[0o022, 0o002, 0o077], ids=["umask022", "umask002", "umask077"])
def umask(request):
    """Run a test under a set umask (a shared checkout uses 002), restoring the caller's afterwards."""
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def modes(top: Path) -> dict[str, tuple[bool, int]]:
    """{relative path: (is a folder, permission bits)} of `top` and everything below it."""
    paths = [top, *sorted(top.rglob("*"))] if top.is_dir() else [top]
    return {str(p.relative_to(top.parent)): (p.is_dir(), p.stat().st_mode & 0o777) for p in paths}


def assert_umask_modes(written: dict[str, tuple[bool, int]], mask: int) -> None:
    want = {True: 0o777 & ~mask, False: 0o666 & ~mask}
    wrong = {name: oct(mode) for name, (is_dir, mode) in written.items() if mode != want[is_dir]}
    assert written and not wrong, f"umask {oct(mask)}: want files {oct(want[False])}, folders {oct(want[True])}: {wrong}"


def test_atomic_outputs_get_the_permissions_the_umask_gives(tmp_path, umask):
    vio.write_json(tmp_path / "reports" / "r.json", {"a": 1})
    with atomic_path(tmp_path / "reports" / "t.parquet") as tmp:
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"x": [1]}), tmp)
    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "a.txt").write_text("a")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.txt").write_text("b")
    with atomic_dir(tmp_path / "out") as tmp:  # replacing an existing folder (swap or rename aside)
        (tmp / "c.txt").write_text("c")
    for top in (tmp_path / "reports", tmp_path / "out"):
        assert_umask_modes(modes(top), umask)


def test_the_projects_writers_follow_the_umask(tmp_path, umask, toy_model_cfg, monkeypatch):
    """The issue's outputs: reports/*.json, data/prepared/<d>/, features/<model>/<d>/images/, reports/plots/."""
    import numpy as np
    from PIL import Image

    from vlbench.datasets.canonical import ClassInfo, DatasetMeta, write_dataset
    from vlbench.embed import embed_image_splits
    from vlbench.models.loading import load_model
    from vlbench.report.plots import write_plots
    from vlbench.results import write_metrics

    def png(k: int) -> bytes:
        buf = __import__("io").BytesIO()
        Image.fromarray(np.full((8, 8, 3), 40 * k, np.uint8)).save(buf, "PNG")
        return buf.getvalue()

    monkeypatch.chdir(tmp_path)
    meta = DatasetMeta(name="d", task="single-label", metric="accuracy", classes=[ClassInfo(0, "a"), ClassInfo(1, "b")])
    prepared = tmp_path / "data" / "prepared" / "d"
    write_dataset(prepared, meta, {"test": ({"sample_id": f"s{k}", "label": k % 2, "image": png(k)} for k in range(4))})
    features = tmp_path / "features" / "toy" / "d" / "images"
    embed_image_splits(load_model(toy_model_cfg, device="cpu"), prepared, features, num_workers=0, progress=False)
    write_metrics({"zeroshot": {"d": {"accuracy": 0.5}}}, {"model": "toy"}, {"zeroshot": {"d": {"accuracy": 0.5}}})
    write_plots({"zeroshot": {"d": {"accuracy": 0.5}}}, tmp_path / "reports" / "plots")
    for top in (prepared, features, tmp_path / "reports"):
        assert_umask_modes(modes(top), umask)
