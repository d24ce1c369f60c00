"""open_clip's results table as DataComp's 38 tasks: which vlbench number each column is, and where a run sits on it.

`TASKS` is the one table of the mapping (column of open_clip's `docs/openclip_results.csv` -> DataComp's task key
in its `tasklist.yml` -> vlbench entry `wds-<key with '/' as '-'>` -> the analysis and metric key under which a
`datacomp` run reports the task's main metric in reports/metrics.json). The reference tool
(tools/openclip_reference.py), the comparison of the average (vlbench.reference.verdicts) and the placement below
read it; nothing else lists the 38.

`place` puts a run's numbers among the published models of the table (vlbench/reference/openclip_population.json,
every row of the CSV, written by the same tool): rank 1 is the best; a published value equal to ours does not rank
above us. docs/protocols.md, "Reference numbers and verdicts".
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vlbench.errors import VlbenchError

AVERAGE = "Average perf. on 38 datasets"
SUITE = "datacomp"
POPULATION_FILE = Path(__file__).with_name("openclip_population.json")

# DataComp's main_metric (tasklist.yml; acc1 where it names none) -> vlbench's metric key in a datacomp run (the
# names of the wds branch's vlbench.metrics and tools/datacomp_conf.py)
MAIN_METRICS = {"acc1": "accuracy", "mean_per_class_recall": "mean_per_class", "mean_recall@1": "mean_recall_at_1",
                "jaccard_score_10-12": "winogavil_jaccard", "F1-macro_all": "f1_macro",
                "acc_worst_region": "worst_group_accuracy", "acc_top5_wg": "worst_group_top5",
                "acc_wg": "worst_group_accuracy"}
# metrics a result does not hold as such but as the mean of two of its numbers (the retrieval analysis reports
# i2t_r1 and t2i_r1; DataComp's mean_recall@1 is their mean, eval_utils/retr_eval.py)
DERIVED = {"mean_recall_at_1": ("i2t_r1", "t2i_r1")}
# entries the wds source names short (tools/datacomp_conf.py `slug`)
SHORT = {"retrieval/flickr_1k_test_image_text_retrieval": "flickr30k",
         "retrieval/mscoco_2014_5k_test_image_text_retrieval": "mscoco", "misc/winogavil": "winogavil"}

# (open_clip column, DataComp task key, DataComp main_metric, vlbench analysis), in the CSV's column order
_TASKS = (
    ("ImageNet 1k", "imagenet1k", "acc1", "zeroshot"),
    ("Caltech-101", "vtab/caltech101", "mean_per_class_recall", "zeroshot"),
    ("CIFAR-10", "cifar10", "acc1", "zeroshot"),
    ("CIFAR-100", "vtab/cifar100", "acc1", "zeroshot"),
    ("CLEVR Counts", "vtab/clevr_count_all", "acc1", "zeroshot"),
    ("CLEVR Distance", "vtab/clevr_closest_object_distance", "acc1", "zeroshot"),
    ("Country211", "country211", "acc1", "zeroshot"),
    ("Describable Textures", "vtab/dtd", "acc1", "zeroshot"),
    ("EuroSAT", "vtab/eurosat", "acc1", "zeroshot"),
    ("FGVC Aircraft", "fgvc_aircraft", "mean_per_class_recall", "zeroshot"),
    ("Food-101", "food101", "acc1", "zeroshot"),
    ("GTSRB", "gtsrb", "acc1", "zeroshot"),
    ("ImageNet Sketch", "imagenet_sketch", "acc1", "zeroshot"),
    ("ImageNet v2", "imagenetv2", "acc1", "zeroshot"),
    ("ImageNet-A", "imagenet-a", "acc1", "zeroshot"),
    ("ImageNet-O", "imagenet-o", "acc1", "zeroshot"),
    ("ImageNet-R", "imagenet-r", "acc1", "zeroshot"),
    ("KITTI Vehicle Distance", "vtab/kitti_closest_vehicle_distance", "acc1", "zeroshot"),
    ("MNIST", "mnist", "acc1", "zeroshot"),
    ("ObjectNet", "objectnet", "acc1", "zeroshot"),
    ("Oxford Flowers-102", "vtab/flowers", "mean_per_class_recall", "zeroshot"),
    ("Oxford-IIIT Pet", "vtab/pets", "mean_per_class_recall", "zeroshot"),
    ("Pascal VOC 2007", "voc2007", "acc1", "zeroshot"),
    ("PatchCamelyon", "vtab/pcam", "acc1", "zeroshot"),
    ("Rendered SST2", "renderedsst2", "acc1", "zeroshot"),
    ("RESISC45", "vtab/resisc45", "acc1", "zeroshot"),
    ("Stanford Cars", "cars", "acc1", "zeroshot"),
    ("STL-10", "stl10", "acc1", "zeroshot"),
    ("SUN397", "sun397", "acc1", "zeroshot"),
    ("SVHN", "vtab/svhn", "acc1", "zeroshot"),
    ("Flickr", "retrieval/flickr_1k_test_image_text_retrieval", "mean_recall@1", "retrieval"),
    ("MSCOCO", "retrieval/mscoco_2014_5k_test_image_text_retrieval", "mean_recall@1", "retrieval"),
    ("WinoGAViL", "misc/winogavil", "jaccard_score_10-12", "zeroshot"),
    ("iWildCam", "wilds/iwildcam", "F1-macro_all", "zeroshot"),
    ("Camelyon17", "wilds/camelyon17", "acc1", "zeroshot"),
    ("FMoW", "wilds/fmow", "acc_worst_region", "zeroshot"),
    ("Dollar Street", "fairness/dollar_street", "acc_top5_wg", "zeroshot"),
    ("GeoDE", "fairness/geode", "acc_wg", "zeroshot"),
)


def entry_name(task_key: str) -> str:
    """vlbench's entry for a DataComp task key: `wds-` and the key with '/' as '-' and 'fairness/' dropped
    (vtab/cifar100 -> wds-vtab-cifar100, fairness/geode -> wds-geode), the retrieval and misc tasks short (`SHORT`)."""
    return "wds-" + SHORT.get(task_key, task_key.removeprefix("fairness/").replace("/", "-"))


def cell_value(values: Mapping[str, Any], metric: str) -> float | None:
    """The metric's number in one result's metrics (a `DERIVED` one: the mean of its parts), or None."""
    parts = DERIVED.get(metric, (metric,)) if metric not in values else (metric,)
    found = [values.get(p) for p in parts]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in found):
        return None
    return float(sum(found)) / len(found)


# column -> {"task", "entry", "analysis", "metric", "main_metric"}
TASKS: dict[str, dict[str, str]] = {
    column: {"task": key, "entry": entry_name(key), "analysis": analysis, "metric": MAIN_METRICS[main],
             "main_metric": main}
    for column, key, main, analysis in _TASKS}
assert len(TASKS) == 38


class PlacementError(VlbenchError):
    """Numbers that cannot be placed on the published table (a missing task, a non-number)."""


def run_numbers(metrics: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]] | None = None
                ) -> dict[str, dict[str, float | None]]:
    """{column: {"value", "low", "high"}} of the tasks a run has (reports/metrics.json's shape; intervals from each
    result's `intervals` where `results` holds them), plus the average when all 38 are there (its interval:
    `average_interval`)."""
    results = results or {}
    out: dict[str, dict[str, float | None]] = {}
    for column, t in TASKS.items():
        value = cell_value((metrics.get(t["analysis"]) or {}).get(t["entry"]) or {}, t["metric"])
        if value is not None:
            intervals = ((results.get(t["analysis"]) or {}).get(t["entry"]) or {}).get("intervals") or {}
            out[column] = {"value": value, **cell_interval(intervals, t["metric"])}
    if len(out) == len(TASKS):
        out[AVERAGE] = average_interval(out)
    return out


def cell_interval(intervals: Mapping[str, Any], metric: str) -> dict[str, float | None]:
    """{"low", "high"} of a cell from its result's `intervals`; a `DERIVED` metric without its own: the mean of its
    parts' ends (the widest the mean's interval can be, reached when the parts move together); None without one."""
    parts = (metric,) if metric in intervals else DERIVED.get(metric, (metric,))
    found = [intervals.get(p) or {} for p in parts]
    if any(f.get("low") is None or f.get("high") is None for f in found):
        return {"low": None, "high": None}
    return {"low": sum(f["low"] for f in found) / len(found), "high": sum(f["high"] for f in found) / len(found)}


def average_interval(cells: Mapping[str, Mapping[str, float | None]]) -> dict[str, float | None]:
    """DataComp's average (the plain mean of the 38 main metrics, its aggregate_scores.py) and an interval for it:
    the tasks are independent test sets, so the half-widths combine as sqrt(sum h_i^2) / 38 (h_i: half of each
    task's interval width); without an interval for every task, none."""
    values = [cells[c]["value"] for c in TASKS]
    mean = sum(values) / len(values)
    widths = [(cells[c].get("high"), cells[c].get("low")) for c in TASKS]
    if any(h is None or lo is None for h, lo in widths):
        return {"value": mean, "low": None, "high": None}
    half = math.sqrt(sum(((h - lo) / 2) ** 2 for h, lo in widths)) / len(values)
    return {"value": mean, "low": mean - half, "high": mean + half}


def load_population(path: Path = POPULATION_FILE) -> dict[str, Any]:
    """The published table: {"source", "columns", "models": [{"name", "pretrained", "values": {column: value}}]}."""
    return json.loads(Path(path).read_text())


def rank(value: float, published: list[float]) -> int:
    """1 + how many published values are strictly above `value` (a tie does not rank above it)."""
    return 1 + sum(p > value for p in published)


def standing(rank_: int, of: int) -> str:
    """A rank in words: "7 of 121", or "below all 121" for a value under every published one (rank of + 1)."""
    return f"below all {of}" if rank_ > of else f"{rank_} of {of}"


def place(numbers: Mapping[str, Mapping[str, float | None]], population: Mapping[str, Any] | None = None
          ) -> dict[str, dict[str, Any]]:
    """{column: {"value", "low", "high", "rank", "rank_best", "rank_worst", "of", "standing"}} for each column of
    `numbers` (`run_numbers`): the rank of the value among the published models (1 = best; of = how many, 121; of + 1
    below them all), the ranks its interval spans (best: the rank of the interval's high end, worst: of its low end;
    None without an interval) and the rank in words (`standing`). Higher is better in every column of the table."""
    population = population or load_population()
    out = {}
    for column, cell in numbers.items():
        published = [float(m["values"][column]) for m in population["models"] if m["values"].get(column) is not None]
        if column not in population["columns"] or not published:
            raise PlacementError(f"{column!r} is not a column of open_clip's results table "
                                 f"({POPULATION_FILE.name}); columns: {', '.join(population['columns'])}")
        value = cell.get("value")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise PlacementError(f"{column!r}: value {value!r} is not a finite number")
        low, high = cell.get("low"), cell.get("high")
        out[column] = {"value": float(value), "low": low, "high": high, "rank": rank(value, published),
                       "rank_best": rank(high, published) if high is not None else None,
                       "rank_worst": rank(low, published) if low is not None else None, "of": len(published),
                       "standing": standing(rank(value, published), len(published))}
    return out
