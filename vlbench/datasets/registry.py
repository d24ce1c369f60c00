"""Dataset sources: each turns a dataset spec (a mapping from params) into the canonical format.

A spec names its `source`; the builder for that source gets `(name, spec, out_dir)` and returns the
written `DatasetMeta`. Adding a source means adding one line to `SOURCES`.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Mapping

from vlbench.datasets.canonical import DatasetError, DatasetMeta

SOURCES = {
    "synthetic": "vlbench.datasets.synthetic:build",
    "imagefolder": "vlbench.datasets.local:build_imagefolder",
    "manifest": "vlbench.datasets.local:build_manifest",
}


def prepare_dataset(name: str, spec: Mapping[str, Any], out_dir: str | Path) -> DatasetMeta:
    source = spec.get("source") if isinstance(spec, Mapping) else None
    if source not in SOURCES:
        raise DatasetError(
            f"dataset {name!r}: unknown source {source!r}; known sources: {', '.join(sorted(SOURCES))}"
        )
    module, func = SOURCES[source].split(":")
    return getattr(importlib.import_module(module), func)(name, dict(spec), Path(out_dir))
