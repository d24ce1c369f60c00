"""conf/ as Hydra composes it: the options of a config group (`available`), the suite file an override chooses and
its format (a suite is vlbench's format, not a Hydra defaults list), the composition itself (`compose_conf`) and each
dataset's key in the suite's `entries`. `vlbench.compose.compose` composes and checks all of it, as params.yaml."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

import yaml

from vlbench.params import ParamsError, check_renamed, check_renamed_overrides, conf_dir

SUITE_FORMAT = ("a suite maps each dataset to its input and lists the datasets of each analysis, e.g. `datasets: "
                "{shapes: vlbench/datasets/synthetic.py}` and `zeroshot: [shapes]`; the entry stays in "
                "conf/dataset/<name>.yaml (a suite changes it under `entries: {<name>: {...}}`); see conf/suite/demo.yaml")


def check_suite_format(suite: Any, where: str, global_package: bool = False) -> None:
    """A suite file as written, before composition: vlbench's format, not a Hydra defaults list. `dvc exp run -S
    suite=<name>` composes with Hydra before any stage runs, and a suite that pulls entries in with `defaults: -
    /dataset@datasets.<name>: <name>` puts whole entries where dvc.yaml expects an input path (DVC: "Cannot
    interpolate data of type 'dict'"); this check runs inside that composition (hydra_plugins/vlbench_suites.py) and
    in `compose`. `global_package`: the file starts `# @package _global_` (it sets other params too, the suite
    under `suite:`)."""
    if suite is None:
        return
    if not isinstance(suite, Mapping):
        raise ParamsError(f"{where}: a suite file is a mapping, got {type(suite).__name__}; {SUITE_FORMAT}")
    if "defaults" in suite:
        raise ParamsError(f"{where}: a suite does not pull entries in with a Hydra `defaults:` list (e.g. `- "
                          f"/dataset@datasets.x: x`); {SUITE_FORMAT}")
    check_renamed(suite, where)
    if global_package and isinstance(suite.get("suite"), Mapping):
        check_renamed(suite["suite"], where, "suite.")
    datasets = (suite.get("suite") or {}).get("datasets") if global_package else suite.get("datasets")
    bad = [name for name, value in (datasets or {}).items() if not isinstance(value, str)] \
        if isinstance(datasets, Mapping) else ["datasets"]
    if bad:
        raise ParamsError(f"{where}: datasets.{bad[0]} is not an input path (a suite does not hold entries); "
                          f"{SUITE_FORMAT}")


def with_every_entry(suite: Mapping[str, Any]) -> dict[str, Any]:
    """The suite's `entries` with a key for each of its datasets, in `datasets`' order: `{}` where the suite changes
    nothing of the entry. prepare@, texts@ and knowledge@ depend on their own dataset's `suite.entries.<name>`, a
    param DVC needs to exist, so that a change to one entry reruns that dataset's stages only (issue 40). Composition
    completes it (`compose`, and hydra_plugins/vlbench_suites.py as `dvc exp run` loads a suite file); a `{}` shows no
    `dvc exp show` column."""
    entries, datasets = suite.get("entries") or {}, suite.get("datasets") or {}
    return {**{name: entries.get(name, {}) for name in datasets},
            **{name: entry for name, entry in entries.items() if name not in datasets}}


GLOBAL_PACKAGE = re.compile(r"^#\s*@package\s+_global_\s*$", re.M)  # Hydra's package header of a file


def chosen_suite_file(overrides: list[str] | None, config_dir: str | Path | None = None) -> Path | None:
    """conf/suite/<name>.yaml of the last `suite=<name>` override, else of config.yaml's default suite."""
    conf = conf_dir(config_dir)
    names = [o.split("=", 1)[1] for o in overrides or [] if o.split("=", 1)[0].lstrip("+~") == "suite" and "=" in o]
    if not names:
        defaults = yaml.safe_load((conf / "config.yaml").read_text()).get("defaults") or []
        names = [d["suite"] for d in defaults if isinstance(d, Mapping) and isinstance(d.get("suite"), str)]
    path = conf / "suite" / f"{names[-1]}.yaml" if names else None
    return path if path is not None and path.is_file() else None



def available(group: str, config_dir: str | Path | None = None) -> list[str]:
    return sorted(p.stem for p in (conf_dir(config_dir) / group).glob("*.yaml"))


def compose_conf(overrides: list[str] | None = None, config_dir: str | Path | None = None,
                 section: str | None = None) -> Any:
    """conf/ composed by Hydra with `overrides` (the chosen suite file's format checked first) as plain data: all of
    it, or one `section` (only its interpolations resolved: a suite's datasets need no model resolver)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    check_renamed_overrides(overrides or [])
    suite_file = chosen_suite_file(overrides, config_dir)
    if suite_file is not None:
        text = suite_file.read_text()
        check_suite_format(yaml.safe_load(text), str(suite_file), GLOBAL_PACKAGE.search(text) is not None)
    try:
        with initialize_config_dir(config_dir=str(conf_dir(config_dir).resolve()), version_base=None):
            cfg = hydra_compose(config_name="config", overrides=overrides or [])
        return OmegaConf.to_container(cfg[section] if section else cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as err:
        lines = str(err).strip().splitlines() or [type(err).__name__]
        first = " ".join(lines[:2] if lines[1:2] and lines[1].startswith("To append") else lines[:1])  # Hydra's hint: `+`
        raise ParamsError(f"cannot compose conf/ with overrides {overrides or []}: {first}") from err
