"""A suite's dataset entries: conf/dataset/<name>.yaml with the suite's `entries.<name>` overrides (`dataset_entry`),
checked against the suite's datasets and inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml

from vlbench.params import ParamsError, check_name, conf_dir, get

DATASET_KEYS = ("prepare", "input", "texts")


def load_entry(path: Path, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A registry entry file (conf/dataset/<name>.yaml) with a suite's overrides merged in, interpolations resolved."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        entry = OmegaConf.merge(OmegaConf.load(path), OmegaConf.create(dict(overrides or {})))
        return OmegaConf.to_container(entry, resolve=True)
    except (OmegaConfBaseException, yaml.YAMLError) as err:
        raise ParamsError(f"{path}: not a valid dataset entry ({str(err).strip().splitlines()[0]})") from err


def check_suite_dataset(params: Mapping[str, Any], name: str) -> str:
    """`name` if it is a dataset of the suite (a key of suite.datasets); an error listing them otherwise."""
    check_name("dataset", name)
    datasets = get(params, "suite.datasets", Mapping)
    if name not in datasets:
        slug = get(params, "suite", Mapping).get("slug")
        raise ParamsError(f"params.yaml: unknown dataset {name!r} in suite {slug!r}; known: {sorted(datasets)}")
    return name


def dataset_entry(params: Mapping[str, Any], name: str, config_dir: str | Path | None = None) -> dict[str, Any]:
    """The registry entry of dataset `name` of the suite: conf/dataset/<name>.yaml (a file dependency of the stages
    that read it) with the suite's `entries.<name>` overrides: {prepare: spec, input: path, texts: {...}}.

    params.yaml names only the datasets and their inputs (`suite.datasets: {name: input}`), so that the registry
    entries' leaves are not params (`dvc exp show` would list each as a column)."""
    slug = get(params, "suite", Mapping).get("slug")
    datasets = get(params, "suite.datasets", Mapping)
    check_suite_dataset(params, name)
    path = conf_dir(config_dir) / "dataset" / f"{name}.yaml"
    if not path.is_file():
        raise ParamsError(f"suite {slug!r}: dataset {name!r} has no registry entry {str(path)!r}; add one (README, "
                          f"'Your own data') or remove it from the suite")
    entry = load_entry(path, (params["suite"].get("entries") or {}).get(name))
    missing = [k for k in DATASET_KEYS if k not in entry]
    if missing:
        raise ParamsError(f"{path}: dataset {name!r} lacks key(s) {missing}; an entry has {list(DATASET_KEYS)} (see conf/dataset/)")
    if str(entry["input"]) != str(datasets[name]):
        raise ParamsError(f"suite {slug!r}: datasets.{name} is {datasets[name]!r} but {str(path)!r} has input "
                          f"{entry['input']!r}; the suite names each dataset's input (what DVC hashes for prepare@{name}): "
                          f"set `{name}: {entry['input']}` under the suite's datasets")
    return entry


def dataset_spec(params: Mapping[str, Any], name: str) -> dict[str, Any]:
    """What `prepare` builds from: the entry's `prepare` mapping (source + source-specific keys)."""
    spec = dataset_entry(params, name)["prepare"]
    if not isinstance(spec, Mapping):
        raise ParamsError(f"conf/dataset/{name}.yaml: key 'prepare' must be a mapping, got {spec!r}")
    return dict(spec)
