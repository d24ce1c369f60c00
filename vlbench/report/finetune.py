"""Report pieces of fine-tuning: each dataset's method chart (reports/finetune/<dataset>.svg, drawn by the finetune
stage: ELEVATER's validation over the search, NegCLIP's before/after) beside the analysis's bars."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vlbench.io import atomic_path
from vlbench.results import result_path


def method_charts(analysis: str, results: Mapping[str, Any], metrics: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """`<out_dir>/finetune_<dataset>.svg` per fine-tuned dataset: the stage's own chart, copied byte for byte."""
    written = []
    for dataset in results:
        target = Path(out_dir) / f"{analysis}_{dataset}.svg"
        with atomic_path(target) as tmp:
            tmp.write_bytes(result_path(analysis, dataset, ".svg").read_bytes())
        written.append(target)
    return written
