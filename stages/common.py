"""What every stage does the same way: argument parsing basics, params, model identity, result files."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Mapping

from vlbench import __version__
from vlbench.config import get
from vlbench.io import write_json


def parser(description: str, dataset: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    if dataset:
        p.add_argument("--dataset", required=True, help="dataset name, a key of suite.datasets")
    p.add_argument("--params", default="params.yaml")
    return p


def model_identity(params: Mapping[str, Any]) -> dict[str, Any]:
    """What a reader demands of features: the model named in params (weights hash checked by DVC deps)."""
    return {"model": get(params, "model.slug", str), "arch": get(params, "model.arch", str),
            "pretrained": str(get(params, "model.pretrained"))}


def write_result(path, analysis: str, dataset: str, fingerprint: Mapping, used_params: Mapping, metrics: Mapping, counts: Mapping) -> None:
    write_json(path, {
        "analysis": analysis, "dataset": dataset, "metrics": dict(metrics), "counts": dict(counts),
        "params": dict(used_params), "fingerprint": dict(fingerprint), "vlbench_version": __version__,
    })


def run(main) -> None:
    """Run a stage's main; known errors print one clear line instead of a traceback."""
    from vlbench.errors import USER_ERRORS

    try:
        main()
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
