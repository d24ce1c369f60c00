"""scripts/apt-install (the Makefile's WordNet, .ci/run's Chromium): another package manager run holding Debian's locks
makes it wait, not fail. Runs apt-get for real against a private root (APT_CONFIG: its own package lists, dpkg status
and a local file repository), so the machine's own apt state is neither read nor locked."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "apt-install"
PROBE = "vlbench-lock-probe"  # a package the private dpkg status says is installed: `install` locks, changes nothing

pytestmark = pytest.mark.skipif(shutil.which("apt-get") is None or os.geteuid() != 0,
                                reason="needs Debian's apt-get, run as root (as the Makefile's install is)")

HOLD = """import fcntl, os, sys, time
fds = [os.open(p, os.O_RDWR | os.O_CREAT, 0o640) for p in sys.argv[2:]]
for fd in fds:
    fcntl.lockf(fd, fcntl.LOCK_EX)  # the lock apt takes (fcntl F_SETLK)
print("held", flush=True)
time.sleep(float(sys.argv[1]))
"""


@pytest.fixture
def apt_root(tmp_path) -> dict:
    """The environment of an apt whose lists, dpkg status, cache and sources are all under tmp_path."""
    (tmp_path / "state/lists/partial").mkdir(parents=True)
    (tmp_path / "cache/archives/partial").mkdir(parents=True)
    (tmp_path / "dpkg").mkdir()
    (tmp_path / "sources.d").mkdir()
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo/Packages").write_text("")
    (tmp_path / "dpkg/status").write_text(
        f"Package: {PROBE}\nStatus: install ok installed\nPriority: optional\nSection: misc\nMaintainer: x <x@x>\n"
        "Architecture: all\nVersion: 1\nDescription: probe\n\n")
    (tmp_path / "sources.list").write_text(f"deb [trusted=yes] file:{tmp_path}/repo ./\n")
    (tmp_path / "apt.conf").write_text(
        f'Dir::State "{tmp_path}/state";\nDir::State::status "{tmp_path}/dpkg/status";\n'
        f'Dir::Cache "{tmp_path}/cache";\n'
        f'Dir::Etc::sourcelist "{tmp_path}/sources.list";\nDir::Etc::sourceparts "{tmp_path}/sources.d";\n')
    return {**os.environ, "APT_CONFIG": str(tmp_path / "apt.conf")}


def hold(seconds: float, *locks: Path) -> subprocess.Popen:
    """Another package manager run: holds `locks` for `seconds` (returns once they are held)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(seconds), *map(str, locks)], stdout=subprocess.PIPE,
                              text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def apt_install(env: dict, **extra) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), PROBE], env={**env, **extra}, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("lock", ["state/lists/lock", "dpkg/lock-frontend"], ids=["update's lists", "dpkg's frontend"])
def test_a_held_lock_is_waited_for_where_plain_apt_get_fails(apt_root, tmp_path, lock):
    command = ["update"] if lock.startswith("state") else ["install", "-y", PROBE]
    holder = hold(60, tmp_path / lock)
    plain = subprocess.run(["apt-get", "-qq", *command], env=apt_root, capture_output=True, text=True)
    holder.kill()
    holder.wait()
    assert plain.returncode != 0 and "Could not get lock" in plain.stderr  # what `make` met before

    holder = hold(3, tmp_path / lock)
    done = apt_install(apt_root)
    assert holder.poll() == 0, "apt-install returned while the lock was still held"
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("lock", ["state/lists/lock", "dpkg/lock-frontend"], ids=["update's lists", "dpkg's frontend"])
def test_it_gives_up_with_apts_message_after_the_timeout(apt_root, tmp_path, lock):
    holder = hold(60, tmp_path / lock)
    try:
        done = apt_install(apt_root, APT_LOCK_TIMEOUT="1")
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode != 0
    assert f"lock {tmp_path / lock}" in done.stderr or f"lock ({tmp_path / lock})" in done.stderr, done.stderr
