"""Portable arithmetic (vlbench.portable): a toy training under the stages' settings gives the same bytes whatever the
hardware would otherwise choose. Another CPU is emulated by what its libraries would pick there: MKL's instruction
set, the thread count, ATen's capability; without the settings those choices change the weights (on a CPU with
AVX-512, where there is a choice to make)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def check(**env) -> dict:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/portable_check.py"), "--steps", "4", "--batch", "32"],
                         env=full, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def has_avx512() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def test_stages_pin_every_library_before_it_loads():
    code = "import stages, os, torch; print(torch.backends.cpu.get_cpu_capability(), os.environ['MKL_CBWR'])"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["AVX2", "COMPATIBLE,STRICT"]


def test_toy_training_is_the_same_whatever_the_hardware_would_choose():
    base = check()
    assert base["portable"] and base["capability"] == "AVX2"
    for emulated in ({"MKL_ENABLE_INSTRUCTIONS": "AVX2"}, {"OMP_NUM_THREADS": "1"}, {"ATEN_CPU_CAPABILITY": "avx512"}):
        other = check(**emulated)
        assert (other["weights"], other["features"], other["numpy_ops"]) == \
            (base["weights"], base["features"], base["numpy_ops"]), emulated


@pytest.mark.skipif(not has_avx512(), reason="on a CPU without AVX-512 the libraries have no wider kernels to choose")
def test_without_the_settings_the_hardware_choice_changes_the_weights():
    assert check(VLBENCH_PORTABLE="0")["weights"] != check(VLBENCH_PORTABLE="0", MKL_ENABLE_INSTRUCTIONS="AVX2")["weights"]
