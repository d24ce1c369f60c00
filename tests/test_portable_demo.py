"""Portable arithmetic on the whole pipeline (issue 44): the miniature demo under another CPU's emulated choices gives
the same bytes in every file every stage writes, not only a toy training's weights (tests/test_portable.py).

A copy of this repository with a miniature suite that runs every stage that computes a number (prepare, texts,
knowledge, pretrain on 3 steps, train_plot, embed_images / embed_texts / embed_knowledge, repe, code, every
analysis of the demo: zeroshot, linear_probe, specificity, compositionality, retrieval, granularity, adapt with
ELEVATER's Random-2P and Language-1P heads and FewTrans, extensibility, extensibility_sets, robustness; and report)
is reproduced with `dvc repro` under the machine's own settings, then copied and reproduced again with `dvc repro
--force` under the emulated choices, once with all of them combined (the cost of one more demo run). Every output
that dvc.lock records is compared by its hash; the first stage whose output differs is named with its first
differing file (and, for Parquet, whether the decoded columns differ or only the file's bytes).

What is emulated, and how it reaches the stage processes (`python -m stages.<stage>` calls portable.apply(), which
overwrites the variables of portable.ENV):
- survives apply(): MKL's instruction set (`MKL_ENABLE_INSTRUCTIONS=AVX2`, what MKL picks on an AMD CPU; apply()
  pins MKL by MKL_CBWR instead), MKL's vendor (a preloaded answer to MKL's "is this an Intel CPU?", the other
  vendor's: tests/mkl_vendor.py; on an AMD EPYC with AVX-512 MKL then takes its Intel AVX-512 paths), and the core
  count: the stages run on one core (`taskset`, where this process may
  use two or more), which decides ELEVATER's worker processes (adapt's map_runs), the image loader's workers and the
  thread pools that size themselves from the cores (Polars, Arrow) — a 1-core machine beside a 2-core CI one;
- overwritten by apply(): the thread count (`OMP_NUM_THREADS`, `MKL_NUM_THREADS`, `OPENBLAS_NUM_THREADS` = 1) and,
  where this CPU has AVX-512, ATen's capability (`ATEN_CPU_CAPABILITY=avx2`, this CPU's own choice being AVX-512):
  both runs then compute with the pinned values, so these check that every stage process pins its libraries
  before they load (a stage that computed before apply() would see the emulated value in one run and this CPU's
  own in the other). The base run starts with none of portable.ENV's variables set, whatever this process holds.
Not emulated (no setting of this machine can make it pick what another CPU picks): oneDNN's cache-size-dependent
blocking, OpenBLAS's core detection, numpy's and FAISS's CPU-feature dispatch, instruction sets this CPU lacks (a
machine without AVX-512 cannot emulate one with it); apply() pins each of these to its AVX2 path, and the toy check
(benchmarks/portable_check.py) is the one to run on a real machine of the other type. Left out of the suite:
the opt-in fine-tuning stages (finetune@, heldout@: not in the demo) and share_images@ (it copies features).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.pipeline_repo import MINIATURE, dataset_entry, make_repo, replace_lines, run, synthetic_entry, write_suite
from tests.test_portable import CHOICES
from vlbench import portable

DVC = (sys.executable, "-m", "dvc")

# the demo's analyses at miniature sizes: every stage kind of the demo once, on the smallest datasets that run it
SUITE = {
    "slug": "emulation",
    "datasets": {"shapes": dataset_entry("shapes", splits={"train": 48, "val": 24, "test": 36}),
                 "colors": dataset_entry("colors", splits={"train": 18, "test": 18}),
                 "hierarchy": dataset_entry("hierarchy", splits={"test": 30}),
                 "captions": dataset_entry("captions", splits={"test": 24}),
                 "corpus": dataset_entry("corpus", splits={"train": 96}),
                 "compositional": dataset_entry("compositional", size=12),
                 "shapes_outline": synthetic_entry("shapes_outline", {"test": 24}, ["a {c}."])},
    "embed": ["shapes", "colors", "hierarchy", "captions", "corpus", "compositional"],
    "embed_images": ["shapes", "colors", "hierarchy", "captions", "corpus", "compositional", "shapes_outline"],
    "zeroshot": ["shapes", "hierarchy"],
    "linear_probe": ["shapes"],
    "knowledge": ["shapes"],
    "specificity": ["captions"],
    "compositionality": ["compositional"],
    "retrieval": ["captions"],
    "granularity": ["hierarchy"],
    "repe": ["shapes"],
    "adapt": ["shapes"],
    "extensibility": ["shapes"],
    "extensibility_sets": {"shapes-colors": ["shapes", "colors"]},
    "robustness": ["shapes_outline"],
}
# test_readme_flows' miniature settings, with Language-1P's search (issue 44's case) beside Random-2P
SETTINGS = {"conf/config.yaml": {**MINIATURE["conf/config.yaml"], "suite: smoke\n": "suite: emulation\n"},
            "conf/settings/adapt.yaml": {**MINIATURE["conf/settings/adapt.yaml"],
                                         "  heads: [random_2p, language_2p, language_1p]":
                                             "  heads: [random_2p, language_1p]"}}
# the stage kinds (dvc.yaml's stage names) that compute a number: a demo build without one of them checks too little
COMPUTING_STAGES = {"prepare", "texts", "knowledge", "pretrain", "train_plot", "embed_images", "embed_texts",
                    "embed_knowledge", "repe", "extensibility_sets", "code", "zeroshot", "linear_probe",
                    "specificity", "compositionality", "retrieval", "granularity", "adapt", "extensibility",
                    "robustness", "report"}


def emulated_env() -> dict[str, str]:
    """Every choice of tests/test_portable.py at once (they set different variables)."""
    combined: dict[str, str] = {}
    for choice in CHOICES.values():
        combined |= choice
    return combined


def one_core() -> list[str]:
    """A command prefix that runs on one of the cores this process may use (nothing where it has only one)."""
    cores = sorted(os.sched_getaffinity(0))
    return ["taskset", "-c", str(cores[0])] if len(cores) > 1 and shutil.which("taskset") else []


def unset_portable() -> list[str]:
    """`env -u` for every variable apply() or an emulated choice sets: a run starts from this machine's defaults."""
    return ["env", *(a for name in sorted(set(portable.ENV) | set(emulated_env())) for a in ("-u", name))]


def emulated(*command: str) -> list[str]:
    return [*unset_portable(), *(f"{k}={v}" for k, v in emulated_env().items()), *one_core(), *command]


def miniature_demo(dest: Path) -> Path:
    """A copy of this repository with SUITE and SETTINGS, reproduced under this machine's own settings."""
    repo = make_repo(dest)
    write_suite(repo, SUITE)
    replace_lines(repo, SETTINGS)
    run(repo, sys.executable, "-m", "vlbench.cli", "compose")
    run(repo, *unset_portable(), *DVC, "repro")
    return repo


# The demo build the emulated run is compared with: swap in a shared session fixture of the same suite here.
@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    return miniature_demo(tmp_path_factory.mktemp("portable-demo") / "repo")


@pytest.fixture(scope="module")
def emulated_demo(demo, tmp_path_factory) -> Path:
    """A copy of `demo` with every stage run again under the emulated choices (not restored from DVC's run cache)."""
    copy = tmp_path_factory.mktemp("portable-demo-emulated") / "repo"
    shutil.copytree(demo, copy, symlinks=True)
    out = run(copy, *emulated(*DVC, "repro", "--force", "--no-run-cache")).stdout
    ran, stages = out.count("Running stage '"), len(lock_outs(demo))
    assert ran == stages, f"{ran} stages ran under the emulated choices, of {stages}"
    return copy


def lock_outs(repo: Path) -> dict[str, dict[str, str]]:
    """{stage: {output path: its hash}} from dvc.lock, in dvc.lock's order, for the stages of the pipeline (the
    copy's dvc.lock also keeps the demo's entries of stages this suite does not have)."""
    pipeline = set(run(repo, *DVC, "stage", "list", "--name-only").stdout.split())
    stages = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    return {stage: {o["path"]: o.get("md5") for o in entry.get("outs", [])}
            for stage, entry in stages.items() if stage in pipeline}


def files_of(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def first_difference(root: Path, other_root: Path, path: str) -> str:
    """The first file of an output (a file or a folder) whose bytes differ, and for Parquet what differs decoded."""
    base, other = root / path, other_root / path
    for file in files_of(base):
        name = file.relative_to(root)
        twin = other / file.relative_to(base) if base.is_dir() else other
        if not twin.is_file():
            return f"{name} is not written under the emulated choices"
        if file.read_bytes() == twin.read_bytes():
            continue
        if file.suffix != ".parquet":
            return str(name)
        a, b = pq.read_table(file), pq.read_table(twin)
        columns = [c for c in a.column_names if c not in b.column_names or not a.column(c).equals(b.column(c))]
        return f"{name} (decoded columns differ: {columns})" if columns else f"{name} (same columns, other bytes)"
    written = {other / f.relative_to(base) for f in files_of(base)}
    extra = sorted(set(files_of(other)) - written) if other.is_dir() else []
    if extra:
        return f"{extra[0].relative_to(other_root)} is written only under the emulated choices"
    return f"{path} (its files match; its hash differs)"


def test_the_emulation_reaches_the_stage_processes():
    """What a stage process sees under `emulated(...)`: the choices apply() leaves alone stay, the others are pinned."""
    code = ("import json, os, stages; print(json.dumps([os.environ.get('MKL_ENABLE_INSTRUCTIONS'), "
            "len(os.sched_getaffinity(0)), {k: os.environ[k] for k in stages.portable.ENV}]))")
    root = Path(__file__).resolve().parent.parent
    out = run(root, *emulated(sys.executable, "-c", code), env={"PYTHONPATH": str(root)}).stdout
    mkl, cores, pinned = json.loads(out)
    assert mkl == emulated_env()["MKL_ENABLE_INSTRUCTIONS"]
    assert cores == 1 or not one_core()
    assert pinned == portable.ENV


def test_every_stage_writes_the_same_bytes_under_another_cpus_choices(demo, emulated_demo):
    base, other = lock_outs(demo), lock_outs(emulated_demo)
    missing = COMPUTING_STAGES - {stage.split("@")[0] for stage in base}
    assert not missing, f"the demo build runs no {', '.join(sorted(missing))} stage: it would check too little"
    assert list(base) == list(other)
    differing = [(stage, path) for stage, outs in base.items() for path, digest in outs.items()
                 if other[stage].get(path) != digest]
    if differing:
        stage, path = differing[0]
        where = first_difference(demo, emulated_demo, path)
        pytest.fail(f"{stage} writes other bytes under the emulated choices ({', '.join(emulated_env())}"
                    f"{', one core' if one_core() else ''}): {where}; {len(differing)} outputs differ in all, "
                    f"in {len({s for s, _ in differing})} stages")
