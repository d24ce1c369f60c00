"""What every stage does the same way: argument parsing basics and one-line errors."""

from __future__ import annotations

import argparse
import os
import sys


def parser(description: str, dataset: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    if dataset:
        p.add_argument("--dataset", required=True, help="dataset name, a key of suite.datasets (its entry: conf/dataset/<name>.yaml)")
    p.add_argument("--params", default="params.yaml")
    return p


def add_engine(p: argparse.ArgumentParser) -> None:
    """`--engine` of the embed stages: a runtime choice, never in dvc.yaml's cmd nor a param (the features are the
    same on every engine), so switching engines makes no stage stale; default $VLBENCH_ENGINE, else local."""
    p.add_argument("--engine", default=None,
                   help="local or ray: where to embed: this process (local) or a Ray cluster ($VLBENCH_RAY_ADDRESS, else a local "
                        "Ray); default $VLBENCH_ENGINE, else local (docs/cluster.md)")


def use_download_settings(params: dict) -> None:
    """`downloads.cache` / `downloads.mirror` from params, unless the environment already sets them."""
    settings = params.get("downloads") or {}
    for key, variable in (("cache", "VLBENCH_DOWNLOADS"), ("mirror", "VLBENCH_MIRROR")):
        if settings.get(key) and not os.environ.get(variable):
            os.environ[variable] = str(settings[key])


def run(main) -> None:
    """Run a stage's main; a user error prints one clear line instead of a traceback."""
    from vlbench.errors import VlbenchError

    try:
        main()
    except VlbenchError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
