"""Portable arithmetic (vlbench.portable): a toy training under the stages' settings gives the same bytes whatever the
hardware would otherwise choose. Another CPU is emulated by what its libraries would pick there: MKL's instruction
set and vendor paths, the thread count, ATen's capability. Which of those choices change the weights without the settings depends on
the CPU (MKL on an AMD EPYC takes AVX2 either way), so the premise is checked on the machine at hand, not assumed."""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mkl_vendor import other_vendor_env
from vlbench import portable

ROOT = Path(__file__).resolve().parent.parent


def check(**env) -> dict:
    return _check(tuple(sorted(env.items())))


@functools.cache
def _check(env: tuple) -> dict:
    """The check in a process that starts without this (portable) test process's settings: with VLBENCH_PORTABLE=0 it
    runs the libraries' own choices, and a choice emulated there is the only setting it has."""
    inherited = {k: v for k, v in os.environ.items() if k not in portable.ENV}
    full = {**inherited, "PYTHONPATH": str(ROOT), **dict(env)}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks/portable_check.py"), "--steps", "4", "--batch", "32"],
                         env=full, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def has_avx512() -> bool:
    try:
        return " avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def emulated_choices() -> dict[str, dict[str, str]]:
    """What another CPU's libraries would pick, as settings of this machine's: MKL's instruction set (an Intel CPU with
    AVX-512 picks wider kernels than an AMD one, where MKL takes AVX2 either way), MKL's vendor (its paths for the
    other vendor's CPUs), the core count, and ATen's capability (the other one of AVX2 and AVX-512, where this CPU has
    both)."""
    choices = {"MKL's instruction set": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
               "the thread count": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}}
    if other_vendor_env():  # MKL's paths for the other CPU vendor (tests/mkl_vendor.py; needs a C compiler)
        choices["MKL's vendor"] = other_vendor_env()
    if has_avx512():
        choices["ATen's capability"] = {"ATEN_CPU_CAPABILITY": "avx2"}
    return choices


CHOICES = emulated_choices()


def test_stages_pin_every_library_before_it_loads():
    code = "import stages, os, torch; print(torch.backends.cpu.get_cpu_capability(), os.environ['MKL_CBWR'])"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["AVX2", "COMPATIBLE,STRICT"]


@pytest.fixture(scope="module")
def unportable() -> dict:
    return check(VLBENCH_PORTABLE="0")


@pytest.fixture(scope="module")
def portable_base() -> dict:
    base = check()
    assert base["portable"] and base["capability"] == "AVX2"
    return base


@pytest.mark.parametrize("choice", list(CHOICES))
def test_toy_training_is_the_same_whatever_the_hardware_would_choose(choice, portable_base):
    other = check(**CHOICES[choice])
    assert (other["weights"], other["features"], other["numpy_ops"]) == \
        (portable_base["weights"], portable_base["features"], portable_base["numpy_ops"])


def test_without_the_settings_a_hardware_choice_changes_the_weights(unportable):
    """The premise of the test above, checked on the machine at hand, not assumed: a choice this CPU's libraries make
    the same way either way (MKL on an AMD CPU takes AVX2 with or without MKL_ENABLE_INSTRUCTIONS) proves nothing
    here, so the test needs one that does (the thread count, on any machine with two cores or more)."""
    changed = [c for c in CHOICES if check(VLBENCH_PORTABLE="0", **CHOICES[c])["weights"] != unportable["weights"]]
    if not changed:
        pytest.skip(f"on this CPU ({unportable['cpu']}) no emulated choice ({', '.join(CHOICES)}) changes the "
                    f"libraries' code path: there is nothing for the portable settings to remove")
