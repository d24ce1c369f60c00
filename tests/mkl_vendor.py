"""The other CPU vendor's MKL, emulated: MKL picks its code paths by asking whether the CPU is an Intel one
(`mkl_serv_intel_cpu_true`, exported by torch's libtorch_cpu.so, which links MKL in). A library preloaded in front
of it that answers the other way makes MKL on an AMD CPU take the paths it takes on an Intel CPU of the same features
(with AVX-512: its AVX-512 kernels, where on AMD it takes AVX2 whatever MKL_ENABLE_INSTRUCTIONS says), and on an Intel
CPU the paths it takes on an AMD one. It changes what MKL computes outside conditional numerical reproducibility
(MKL_CBWR), which is what the portable settings rely on (tests/test_portable.py checks both)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = "int mkl_serv_intel_cpu_true(void) {{ return {answer}; }}\nint mkl_serv_intel_cpu(void) {{ return {answer}; }}\n"


def is_intel() -> bool:
    try:
        return "GenuineIntel" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@functools.cache
def other_vendor_preload() -> Path | None:
    """A shared library (built once per machine and answer, in the temporary folder) that answers MKL's vendor question
    the other way from this CPU; None without a C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    answer = 0 if is_intel() else 1
    library = Path(tempfile.gettempdir()) / f"vlbench-mkl-intel-cpu-{answer}-{os.getuid()}.so"
    if not library.exists():
        folder = Path(tempfile.mkdtemp(prefix="mkl-vendor-"))
        (folder / "vendor.c").write_text(SOURCE.format(answer=answer))
        subprocess.run([compiler, "-shared", "-fPIC", "-O2", "-o", str(folder / "vendor.so"), str(folder / "vendor.c")],
                       check=True, capture_output=True)
        os.replace(folder / "vendor.so", library)  # atomic: parallel test workers may build it at once
        shutil.rmtree(folder, ignore_errors=True)
    return library


def other_vendor_env() -> dict[str, str]:
    """The environment of a process whose MKL takes the other vendor's paths ({} without a C compiler)."""
    library = other_vendor_preload()
    return {"LD_PRELOAD": str(library)} if library else {}
