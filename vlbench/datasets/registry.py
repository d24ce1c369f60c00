"""Dataset sources and the catalogue of registered datasets.

A dataset entry (conf/dataset/<name>.yaml) has `prepare` (a spec naming its `source`), `input` (what DVC
tracks for prepare) and `texts`. A source is a module with `build(name, spec, out_dir) -> DatasetMeta` and,
where its classes and split sizes are known without any download, `catalogue_row(name, spec) -> dict`
(classes, splits, metric, manual_download), and, where its leaf classes (WordNet ids, for the granularity hierarchy) are
known before `prepare`, `leaf_classes(name, spec, cache=, mirror=) -> (wnids, where they came from)`. Adding a source
means adding one line to `DATASET_SOURCES` (and, if it reads files the user provides, to `DATA_KEYS`).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vlbench.conf import compose_conf, with_every_entry
from vlbench.dataset_entries import dataset_entry, load_entry
from vlbench.datasets.canonical import DatasetError, DatasetMeta
from vlbench.params import ParamsError, check_suite, conf_dir
from vlbench.paths import prepared_dir

DATASET_SOURCES = {
    "synthetic": "vlbench.datasets.synthetic:build",
    "imagefolder": "vlbench.datasets.local:build_imagefolder",
    "manifest": "vlbench.datasets.local:build_manifest",
    # real datasets, downloaded and verified by vlbench/datasets/download.py
    "elevater": "vlbench.datasets.elevater_source:build",
    "imagenet": "vlbench.datasets.imagenet:build",
    "breeds": "vlbench.datasets.breeds:build",
    "tiered": "vlbench.datasets.tiered:build",
    "cifar": "vlbench.datasets.cifar:build",
    "coop": "vlbench.datasets.coop:build",
    "coco": "vlbench.datasets.coco:build",
    "karpathy": "vlbench.datasets.karpathy:build",  # Karpathy's caption splits (COCO 5k, Flickr30k 1k) for retrieval
    "vtab": "vlbench.datasets.vtab:build",  # TFDS-prepared TFRecord files, read without TensorFlow
    "fewtrans": "vlbench.datasets.fewtrans_source:build",
    "cub": "vlbench.datasets.cub:build",  # CUB-200-2011, FewTrans's held-out dataset for ImageNet-trained models
    "shift": "vlbench.datasets.shifts:build",  # ImageNetV2, ImageNet-R/A, ObjectNet (robustness suite)
    "compositional": "vlbench.datasets.compositional:build",  # SugarCrepe, Winoground, ARO, the demo's swaps
    "wds": "vlbench.datasets.wds:build",  # DataComp / CLIP_benchmark webdataset shards (suite datacomp)
    "winogavil": "vlbench.datasets.winogavil:build",  # WinoGAViL's Hugging Face Parquet files (suite datacomp)
    "hf_captions": "vlbench.datasets.hf_captions:build",  # DataComp's Flickr and MSCOCO, Hugging Face Parquet files
}
# FewTrans' base/novel class counts (the paper's App. B.1), data of the registry: its catalogue rows show them and the
# adapt analysis's FewTrans protocol reads them from here
FEWTRANS_SPLITS = Path(__file__).with_name("data") / "fewtrans_splits.json"
# Spec keys that name the user's files: they must lie inside the entry's `input`, which DVC hashes.
DATA_KEYS = {"imagefolder": ("root",), "manifest": ("path", "splits"), "vtab": ("root",)}


def _source(name: str, spec: Mapping[str, Any]) -> str:
    source = spec.get("source") if isinstance(spec, Mapping) else None
    if source not in DATASET_SOURCES:
        raise DatasetError(f"dataset {name!r}: unknown source {source!r}; "
                           f"known sources: {', '.join(sorted(DATASET_SOURCES))}")
    return source


def prepare_dataset(name: str, spec: Mapping[str, Any], out_dir: str | Path) -> DatasetMeta:
    module, func = DATASET_SOURCES[_source(name, spec)].split(":")
    return getattr(importlib.import_module(module), func)(name, dict(spec), Path(out_dir))


def data_paths(name: str, spec: Mapping[str, Any]) -> list[Path]:
    """The files and folders of the user's that `prepare` reads for this spec."""
    paths = []
    for key in DATA_KEYS.get(_source(name, spec), ()):
        value = spec.get(key)
        values = value.values() if isinstance(value, Mapping) else [value] if value is not None else []
        paths += [Path(str(v)) for v in values]
    return paths


def check_input(name: str, entry: Mapping[str, Any]) -> None:
    """Refuse an entry whose `input` does not cover the data prepare reads: DVC would not see it change."""
    tracked = Path(str(entry["input"])).resolve()
    for path in data_paths(name, entry["prepare"]):
        if not path.resolve().is_relative_to(tracked):
            raise ParamsError(
                f"dataset {name!r}: input {str(entry['input'])!r} does not contain {str(path)!r}, which prepare reads; "
                f"set `input:` to the data's folder (e.g. input: {str(path if path.is_dir() else path.parent)!r}) "
                f"so that DVC re-runs prepare when a file changes"
            )


def describe(name: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """One catalogue row: name, source, classes, splits with sizes, metric, manual download; from the entry,
    the source's class list where it is known without data, or the prepared classes.json when there is one."""
    spec = entry["prepare"]
    row = {"name": name, "source": _source(name, spec), "classes": None, "splits": {}, "metric": spec.get("metric"),
           "manual_download": False}
    module = importlib.import_module(DATASET_SOURCES[row["source"]].split(":")[0])
    if hasattr(module, "catalogue_row"):
        row.update(module.catalogue_row(name, dict(spec)))
    elif row["source"] == "manifest" and isinstance(spec.get("classnames"), list):
        row["classes"] = len(spec["classnames"])  # a manifest's list names every class (an ImageFolder mapping may not)
    classes_json = prepared_dir(name) / "classes.json"
    if classes_json.is_file():
        prepared = json.loads(classes_json.read_text())
        row.update(classes=prepared["num_classes"], splits=prepared["splits"])
    row["metric"] = declared_metric(name, entry) or "accuracy"
    row.update(base_novel(name))
    return row


def declared_metric(name: str, entry: Mapping[str, Any]) -> str | None:
    """The metric the entry declares for its dataset, its headline number (reports/headline.json, the page's matrix,
    the leaderboard; docs/protocols.md, "Headline numbers"): the source's, where it knows it without data
    (`catalogue_row`: DataComp's main metric of a wds task, mean recall@1 for its retrieval tasks), else the spec's
    `metric`, else the prepared data's (classes.json); None where none says."""
    spec = entry["prepare"]
    module = importlib.import_module(DATASET_SOURCES[_source(name, spec)].split(":")[0])
    found = module.catalogue_row(name, dict(spec)).get("metric") if hasattr(module, "catalogue_row") else None
    if found or spec.get("metric"):
        return found or spec["metric"]
    classes_json = prepared_dir(name) / "classes.json"
    return json.loads(classes_json.read_text()).get("metric") if classes_json.is_file() else None


def declared_metrics(names, config_dir: str | Path | None = None) -> dict[str, str]:
    """{name: `declared_metric`} of the names the registry (conf/dataset/<name>.yaml) has an entry for, as the entry
    file says (a suite's `entries` overrides aside); {} without a conf/ here."""
    try:
        folder = conf_dir(config_dir) / "dataset"
    except ParamsError:
        return {}
    out = {}
    for name in names:
        path = folder / f"{name}.yaml"
        if path.is_file():
            metric = declared_metric(name, load_entry(path))
            if metric:
                out[name] = metric
    return out


def leaf_classes(name: str, spec: Mapping[str, Any], cache: Path | None = None,
                 mirror: Path | None = None) -> tuple[list[str], str] | None:
    """(leaf wnids, where they came from) as the dataset's source lists them before `prepare`; None when the source
    knows its classes only from the prepared data."""
    module = importlib.import_module(DATASET_SOURCES[_source(name, spec)].split(":")[0])
    if not hasattr(module, "leaf_classes"):
        return None
    return module.leaf_classes(name, dict(spec), cache=cache, mirror=mirror)


def base_novel(name: str) -> dict[str, int]:
    """`base` and `novel` class counts of a dataset FewTrans' split table knows (the paper's App. B.1), else {}."""
    row = json.loads(FEWTRANS_SPLITS.read_text())["splits"].get(name)
    return {"base": row["base"], "novel": row["novel"]} if row else {}


def entries(suite: str | None = None, config_dir: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """{name: entry} of every registered dataset (conf/dataset/*.yaml), or of one suite."""
    from omegaconf import OmegaConf

    if suite is not None:  # the suite as composed (vlbench.compose checks the rest of params.yaml)
        chosen = compose_conf([f"suite={suite}"], config_dir, "suite")
        chosen["entries"] = with_every_entry(chosen)
        check_suite(chosen, config_dir)
        return {name: dataset_entry({"suite": chosen}, name, config_dir) for name in chosen["datasets"]}
    files = sorted((conf_dir(config_dir) / "dataset").glob("*.yaml"))
    return {f.stem: OmegaConf.to_container(OmegaConf.load(f), resolve=True) for f in files}


def catalogue(suite: str | None = None, config_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """Every registered dataset (conf/dataset/*.yaml), or those of one suite."""
    return [describe(name, entry) for name, entry in entries(suite, config_dir).items()]
