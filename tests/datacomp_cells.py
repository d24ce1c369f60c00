"""DataComp's cell of a task from its result file: the test helper that builds the 38 cells of a DataComp row from
the demo's and the tests' results (the pipeline compares the average through vlbench.reference.datacomp)."""

from __future__ import annotations

from collections.abc import Mapping

from vlbench.datasets import hf_captions, winogavil
from vlbench.datasets.canonical import DatasetError
from vlbench.datasets.wds import RETRIEVAL_METRIC, parse_spec
from vlbench.metrics import mean_recall_at_1


def datacomp_cell(name: str, spec: Mapping, result_metrics: Mapping[str, float]) -> tuple[str, float]:
    """(DataComp's display name of the task, its main metric) from the `metrics` of the entry's result file: the
    zero-shot result's `metric` for a classification task, `metrics.mean_recall_at_1` of the retrieval result's
    `i2t_r1` and `t2i_r1` for a retrieval task (the wds source's, or Flickr's and MSCOCO's `source: hf_captions`), the
    zero-shot result's `winogavil_jaccard` for WinoGAViL (`source: winogavil`). The 38 cells are what `metrics.datacomp_average` takes."""
    if spec.get("source") == "winogavil":
        winogavil.parse_spec(name, spec)  # the spec's own checks
        kind, metric, objectives = "classification", winogavil.METRIC, None
    elif spec.get("source") == "hf_captions":
        hf_captions.parse_spec(name, spec)
        kind, metric, objectives = "retrieval", RETRIEVAL_METRIC, None
    else:
        cfg = parse_spec(name, spec)
        kind, metric, objectives = cfg.kind, cfg.metric, cfg.objectives
    task = (spec.get("datacomp") or {}).get("name", spec.get("task"))
    if objectives:  # FairFace, UTKFace: no main metric, not in the average
        raise DatasetError(f"dataset {name!r}: {task} is a DataComp fairness extra, not one of the cells of its "
                           f"average")
    try:
        if kind == "retrieval":
            return task, mean_recall_at_1(result_metrics["i2t_r1"], result_metrics["t2i_r1"])
        return task, float(result_metrics[metric])
    except KeyError as err:
        analysis = "retrieval" if kind == "retrieval" else "zeroshot"
        raise DatasetError(f"dataset {name!r}: its result has no {err.args[0]!r} (metrics: {sorted(result_metrics)}); "
                           f"is it the {analysis} result of this entry?") from None
