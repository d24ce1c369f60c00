"""One thin module per DVC stage. Importing the package pins the numeric libraries to portable kernels before any of
them loads (vlbench.portable), so every stage gives the same bytes on every x86-64 CPU with AVX2."""

from vlbench import portable

portable.apply()
