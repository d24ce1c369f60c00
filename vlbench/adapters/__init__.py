"""Thin adapters over the private APIs of third-party libraries, one module per library: the only modules of vlbench
that use a library's private name (`_x`), where the library has no public API for what vlbench needs.

Each adapter has its test in tests/test_adapters.py, run against the installed library: it checks the private names
and signatures the adapter relies on and the adapter's result on the real thing, so that the library release that
changes them fails there, naming what moved; pyproject.toml bounds each such library below its next major release.
tests/test_imports.py fails on a private name of a library used anywhere else. The adapters import no vlbench module
(the ground floor, below every layer)."""
