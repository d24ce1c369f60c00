"""`compose`: conf/ composed exactly as `dvc exp run -S group=option` does, as params.yaml, and everything about it
checked before anything runs: the suite's format and keys, every key, each dataset's entry, the text sets the
analyses need."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vlbench.analyses.text_sets import check_text_sets
from vlbench.conf import compose_conf, with_every_entry
from vlbench.dataset_entries import dataset_entry
from vlbench.models.finetuned import register_resolvers
from vlbench.params import check_known_keys, check_suite, conf_dir, effective


def compose(overrides: list[str] | None = None, config_dir: str | Path | None = None) -> dict[str, Any]:
    """Compose conf/ exactly as `dvc exp run -S group=option` does and return a plain dict: params.yaml's content,
    whose settings sections hold only what conf/config.yaml keeps, the suite sets and the overrides add (the settings
    the stages read: `effective(compose(...))`)."""
    register_resolvers()  # conf/model entries of fine-tuned models check their weights (`${vlbench.finetuned:}`)
    params = compose_conf(overrides, config_dir)
    params["suite"]["entries"] = with_every_entry(params["suite"])
    check_suite(params["suite"], config_dir)
    check_known_keys(params, conf_dir(config_dir))
    for name in params["suite"]["datasets"]:
        dataset_entry(params, name, config_dir)  # each entry exists and names the suite's input
    check_text_sets(effective(params, conf_dir(config_dir)), config_dir)
    return params
