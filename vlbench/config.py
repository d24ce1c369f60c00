"""Reading params.yaml (composed from conf/ by Hydra) and the fixed layout of the pipeline's files."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml

from vlbench.errors import VlbenchError

PARAMS_FILE = Path("params.yaml")
PREPARED = Path("data/prepared")
MODELS = Path("data/models")
FEATURES = Path("features")
REPORTS = Path("reports")


class ParamsError(VlbenchError):
    """params.yaml is missing, malformed, or lacks a key a stage needs; the message names the key."""


def load_params(path: str | Path = PARAMS_FILE) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ParamsError(f"{path}: not found; run from the repository root (or `dvc exp run`, which writes it)")
    try:
        params = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML ({err})") from err
    if not isinstance(params, dict):
        raise ParamsError(f"{path}: expected a mapping at the top level")
    return params


def get(params: Mapping[str, Any], dotted: str, kind: type | tuple[type, ...] | None = None) -> Any:
    """params['a']['b'] for 'a.b', with an error naming the key when it is absent or of the wrong type."""
    node: Any = params
    for i, part in enumerate(dotted.split(".")):
        if not isinstance(node, Mapping) or part not in node:
            known = sorted(node) if isinstance(node, Mapping) else []
            raise ParamsError(f"params.yaml: key {dotted!r} not found (no {part!r} under {'.'.join(dotted.split('.')[:i]) or 'top level'}; known: {known})")
        node = node[part]
    if kind is not None and not isinstance(node, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ParamsError(f"params.yaml: key {dotted!r} must be a {names}, got {type(node).__name__} {node!r}")
    return node


def dataset_spec(params: Mapping[str, Any], name: str) -> dict[str, Any]:
    datasets = get(params, "suite.datasets", Mapping)
    if name not in datasets:
        raise ParamsError(f"params.yaml: unknown dataset {name!r} in suite {params['suite'].get('slug')!r}; known: {sorted(datasets)}")
    return dict(get(params, f"suite.datasets.{name}", Mapping))


def prepared_dir(dataset: str) -> Path:
    return PREPARED / dataset


def features_dir(model_slug: str, dataset: str) -> Path:
    return FEATURES / model_slug / dataset


def report_path(analysis: str, dataset: str, suffix: str = ".json") -> Path:
    return REPORTS / analysis / f"{dataset}{suffix}"


def conf_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "conf"


def compose(overrides: list[str] | None = None, config_dir: str | Path | None = None) -> dict[str, Any]:
    """Compose conf/ exactly as `dvc exp run -S group=option` does and return a plain dict."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(Path(config_dir or conf_dir()).resolve()), version_base=None):
        cfg = hydra_compose(config_name="config", overrides=overrides or [])
    return OmegaConf.to_container(cfg, resolve=True)


def available(group: str, config_dir: str | Path | None = None) -> list[str]:
    return sorted(p.stem for p in (Path(config_dir or conf_dir()) / group).glob("*.yaml"))
