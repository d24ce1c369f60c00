"""The first run (`make repro` on a fresh clone): where the time goes, per stage family, stage work vs DVC's own.

Clones the repository (`--repo`, default this checkout's committed HEAD) into `--workdir` and runs `dvc repro` there
with the given virtual environment (`--venv`; the install is timed separately: `--setup` runs `make setup` in the clone
first and times it). A `python` shim first on PATH runs each stage under /usr/bin/time, so that every stage's wall and
CPU (user + sys) seconds are logged; `dvc repro`'s own total minus the stages' is DVC's overhead (start-up, hashing,
rewriting dvc.lock after each stage). The machine's load average is sampled every 10 s: on a shared machine compare
CPU seconds, not wall. Prints a Markdown table and writes the raw log beside it (`<workdir>.stages.log`).

    python benchmarks/first_run.py --workdir /tmp/first-run --venv /work/main/.venv
    python benchmarks/first_run.py --workdir /tmp/first-run --setup    # install included (the clone's own .venv)
    python benchmarks/first_run.py --table /tmp/first-run               # the table of an earlier run again

`--reuse STAGE ... --from /work/main` copies those stages' outputs from an earlier run and commits them to the clone's
DVC cache (`dvc commit`: they match dvc.lock, so DVC skips the stages; outputs missing from the cache would make DVC
run them) to time the other stages without running those. pretrain@toy needs no `--reuse` since issue 41: its
checkpoint comes with the clone, and DVC skips it. The model stages' start-up alone: benchmarks/startup.py.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

SHIM = """#!/bin/bash
start=$(date +%s.%N)
/usr/bin/time -o "$FIRST_RUN_LOG.t.$$" -f "%e %U %S" "$FIRST_RUN_PYTHON" "$@"
rc=$?
echo "$start $(date +%s.%N) $(cat "$FIRST_RUN_LOG.t.$$") $rc $*" >> "$FIRST_RUN_LOG"
rm -f "$FIRST_RUN_LOG.t.$$"
exit $rc
"""


def family(args: list[str]) -> str:
    """`-m stages.analysis --analysis adapt ...` -> adapt; `-m stages.embed_images ...` -> embed_images."""
    module = args[1].split(".", 1)[1] if args[:1] == ["-m"] else args[0]
    if module == "analysis" and "--analysis" in args:
        return args[args.index("--analysis") + 1]
    return module


def table(prefix: Path) -> str:
    rows = [line.split() for line in Path(f"{prefix}.stages.log").read_text().splitlines()]
    families: dict[str, list[float]] = collections.OrderedDict()
    gaps, previous_end = [], None
    for r in rows:
        start, end, user, system = float(r[0]), float(r[1]), float(r[3]), float(r[4])
        f = families.setdefault(family(r[6:]), [0, 0.0, 0.0])
        f[0] += 1
        f[1] += end - start
        f[2] += user + system
        if previous_end is not None:
            gaps.append(start - previous_end)
        previous_end = end
    total = Path(f"{prefix}.total").read_text().split()
    wall, cpu = float(total[0]), float(total[1]) + float(total[2])
    loads = [float(line.split()[1]) for line in Path(f"{prefix}.load.log").read_text().splitlines() if line.strip()]
    lines = ["| stage family | stages | wall s | CPU s |", "|---|---|---|---|"]
    for name, (n, w, c) in families.items():
        lines.append(f"| {name} | {n} | {w:.1f} | {c:.1f} |")
    n, w, c = (sum(v[i] for v in families.values()) for i in range(3))
    lines.append(f"| all stages | {int(n)} | {w:.1f} | {c:.1f} |")
    lines.append(f"| DVC itself (start-up, hashing, dvc.lock after each stage) | | {wall - w:.1f} | {cpu - c:.1f} |")
    lines.append(f"| `dvc repro` | | {wall:.1f} | {cpu:.1f} |")
    if gaps:
        lines.append(f"\nmedian gap between two stages {sorted(gaps)[len(gaps) // 2]:.2f} s; "
                     f"load average (1 min) median {sorted(loads)[len(loads) // 2]:.1f}, max {max(loads):.1f}")
    setup = Path(f"{prefix}.setup")
    if setup.is_file():
        s = setup.read_text().split()
        lines.append(f"`make setup`: {float(s[0]):.1f} s wall, {float(s[1]) + float(s[2]):.1f} s CPU")
    return "\n".join(lines)


def sample_load(path: Path, stop: threading.Event) -> None:
    with open(path, "w") as f:
        while not stop.is_set():
            f.write(f"{time.time():.0f} {os.getloadavg()[0]:.2f}\n")
            f.flush()
            stop.wait(10)


def timed(cmd: list[str], cwd: Path, env: dict, out: Path, log: Path) -> None:
    """Run `cmd` under /usr/bin/time; its wall, user and sys seconds go to `out`, its output to `log`."""
    with open(log, "w") as f:
        rc = subprocess.call(["/usr/bin/time", "-o", str(out), "-f", "%e %U %S", *cmd], cwd=cwd, env=env,
                             stdout=f, stderr=subprocess.STDOUT)
    if rc:
        sys.exit(f"{' '.join(cmd)} failed ({rc}); see {log}")


def reuse(work: Path, source: Path, stages: list[str], venv: Path, env: dict) -> None:
    """Copy `stages`' outputs (dvc.lock's paths) from `source` into the clone and commit them to its DVC cache."""
    lock = yaml.safe_load((work / "dvc.lock").read_text())["stages"]
    for stage in stages:
        for out in lock[stage].get("outs", []):
            src, dst = source / out["path"], work / out["path"]
            dst.parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if src.is_dir() else shutil.copy2)(src, dst)
    subprocess.run([str(venv / "bin" / "dvc"), "commit", "-f", "-q", *stages], cwd=work, env=env, check=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, help="the clone to make (must not exist)")
    p.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]))
    p.add_argument("--venv", type=Path, help="an installed environment to use (default: the clone's .venv)")
    p.add_argument("--setup", action="store_true", help="run and time `make setup` in the clone first")
    p.add_argument("--table", type=Path, help="only print the table of an earlier run in this workdir")
    p.add_argument("--reuse", nargs="*", default=[], help="stages whose outputs to copy from --from instead of running")
    p.add_argument("--from", dest="source", type=Path, help="the checkout that holds the --reuse stages' outputs")
    args = p.parse_args()
    if args.table:
        print(table(args.table))
        return
    work = args.workdir.resolve()
    subprocess.run(["git", "clone", "-q", args.repo, str(work)], check=True)
    venv = (args.venv or work / ".venv").resolve()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    stop = threading.Event()
    threading.Thread(target=sample_load, args=(Path(f"{work}.load.log"), stop), daemon=True).start()
    if args.setup:
        timed(["make", "setup"], work, env, Path(f"{work}.setup"), Path(f"{work}.setup.log"))
    shim_dir = Path(f"{work}.shim")
    shim_dir.mkdir()
    shim = shim_dir / "python"
    shim.write_text(SHIM)
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    if args.reuse:
        reuse(work, args.source, args.reuse, venv, env)
    log = Path(f"{work}.stages.log")
    log.unlink(missing_ok=True)
    env |= {"PATH": f"{shim_dir}:{venv}/bin:{env['PATH']}", "FIRST_RUN_LOG": str(log),
            "FIRST_RUN_PYTHON": str(venv / "bin" / "python"), "GOMP_SPINCOUNT": env.get("GOMP_SPINCOUNT", "10000")}
    if args.venv:  # an editable install elsewhere: the clone's own code first
        env["PYTHONPATH"] = str(work)
    timed([str(venv / "bin" / "dvc"), "repro"], work, env, Path(f"{work}.total"), Path(f"{work}.dvc.log"))
    stop.set()
    shutil.rmtree(shim_dir)
    print(table(work))


if __name__ == "__main__":
    main()
