"""One thin module per DVC stage. Importing the package pins the numeric libraries to portable kernels before any of
them loads (vlbench.portable), so every stage gives the same bytes on every x86-64 CPU with AVX2."""

import sys

from vlbench import portable

# a stage process (`python -m stages.<stage>`), which runs one model at most, rather than a process that imported a
# stage module after its libraries (a test): model stages then import their libraries for that model alone
# (stages.model_libraries.import_model_libraries)
STAGE_PROCESS = not any(m in sys.modules for m in ("torch", "open_clip"))
portable.apply()
