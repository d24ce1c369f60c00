"""Portable CPU arithmetic: the settings under which a stage gives the same bytes on every x86-64 CPU with AVX2.

Each numeric library picks its kernels from the CPU it runs on (AVX-512 or AVX2, Intel or AMD, cache sizes), and
kernels of different widths add in different orders, so the same toy training gave other weights on an AMD EPYC
than on an Intel Xeon. Every stage process (`python -m stages.<stage>`) calls `apply()` before torch, numpy or
FAISS load (stages/__init__.py), which pins each library to one code path that every such CPU has:

- torch's own kernels (ATen): the AVX2 build (`ATEN_CPU_CAPABILITY`);
- MKL, torch's BLAS: conditional numerical reproducibility in its COMPATIBLE branch, the only one Intel guarantees
  on Intel and non-Intel CPUs alike, strict (results independent of alignment and thread count);
- oneDNN, torch's convolutions: its AVX2 kernels (`ONEDNN_MAX_CPU_ISA`);
- OpenBLAS (numpy, scipy, scikit-learn): its Haswell kernels; numpy's own loops: no AVX-512 dispatch;
- FAISS: its AVX2 kernels (`use_portable_faiss`, when FAISS is imported); Arrow's compute kernels: AVX2.

Thread counts are fixed too (`THREADS`): a parallel reduction splits by thread, and so do OpenBLAS's products.
The guarantee and its limits (ARM, GPUs, CPUs without AVX2) are in the README. `VLBENCH_PORTABLE=0` turns it off for
speed, on a CPU-only run of a real model, at the price of bytes that differ between CPU types.
"""

from __future__ import annotations

import os
import sys

ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE,STRICT",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",
    "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR",
    "FAISS_OPT_LEVEL": "avx2",  # FAISS builds with one library per level; newer ones dispatch at run time (below)
    "ARROW_USER_SIMD_LEVEL": "AVX2",
}
THREADS = 2  # CI's and the development machines' core count
# a parallel reduction splits by thread, and OpenBLAS's products change with the thread count: torch, MKL and
# OpenBLAS run THREADS threads in every stage, whatever the core count (BLAS calls that ask for 1 still get 1)
ENV |= {name: str(THREADS) for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
_LOADED_TOO_EARLY = ("torch", "numpy", "faiss", "pyarrow", "scipy")
# How long an idle OpenMP thread spins at a barrier before it sleeps (libgomp's default: 300,000 spins): beside another
# job the spinning starves the thread that has work and toy training runs 12x slower; 10,000 keeps 96% of the quiet
# speed and 4.5x the loaded one, and changes no number (docs/benchmarks.md, "Threads under load"). Every stage process
# sets it, whoever started it (make, `dvc exp run` typed in a shell, a Ray worker), unless the user set it already.
THREAD_WAIT = {"GOMP_SPINCOUNT": "10000"}


def enabled() -> bool:
    return os.environ.get("VLBENCH_PORTABLE", "1") != "0"


def apply() -> bool:
    """Pin every numeric library to its portable code path (a no-op with VLBENCH_PORTABLE=0). The libraries read these
    variables once, when they load: True if none of them was loaded before (a stage process, `python -m stages.x`),
    False where one was (a stage module imported into a running test), whose kernels then stay its own choice.
    The threads' wait (`THREAD_WAIT`, the user's value first) is set whether or not the arithmetic is pinned."""
    for name, value in THREAD_WAIT.items():
        os.environ.setdefault(name, value)
    if not enabled():
        return False
    os.environ.update(ENV)
    return not any(m in sys.modules for m in _LOADED_TOO_EARLY)


def use_portable_faiss(faiss) -> None:
    """FAISS's run-time dispatch (1.12 and later) to its AVX2 kernels, like its AVX2 library in older builds."""
    if enabled() and hasattr(faiss, "SIMDConfig") and faiss.SIMDConfig.is_simd_level_available(faiss.SIMDLevel_AVX2):
        faiss.SIMDConfig.set_level(faiss.SIMDLevel_AVX2)
