"""Fine-tuning (issue 23): the one place where images pass through a model again after `embed`.

One stage, `finetune@<dataset>` (stages/finetune.py), runs the method that `finetune.method` names. Methods are data:
`METHODS` maps a name to "module:function"; each function takes a `vlbench.finetune.common.Job` and returns a
`vlbench.finetune.common.Outcome` (the fine-tuned weights, which parameters trained, metrics, tables, a chart). The
stage writes the weights with their fingerprint (`vlbench.finetune.artifacts`) and the result JSON; the weights are
then a model like any other (`conf/model/<slug>.yaml` with `base` and `finetune` keys; docs/protocols.md,
"Fine-tuning"). torch is imported only by the method modules, never here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from vlbench.errors import VlbenchError

METHODS: dict[str, str] = {
    "elevater_full": "vlbench.finetune.elevater:run",     # ELEVATER full fine-tuning with the linear probe's search
    "negclip": "vlbench.finetune.negclip:run",            # NegCLIP: altered captions (and neighbour images) as hard negatives
    "fewtrans_episodic": "vlbench.finetune.fewtrans:run",  # FewTrans's VisualFT/TextFT/AllFT/LoRA/BitFit on adapt's episodes
}
# Every method's result is one JSON and these outputs beside it (dvc.yaml declares them all): reports/finetune/<dataset>
# .<table>.parquet, empty where the method has no such table, and reports/finetune/<dataset>.svg, the method's chart.
TABLES = ("search", "comparison", "train_log", "episodes")


class FinetuneError(VlbenchError):
    """Bad fine-tuning params or inputs; the message names the key, file or dataset."""


def method(name: str) -> Callable:
    """The function of method `name` (imported on demand: one method's dependencies never load another's)."""
    if name not in METHODS:
        raise FinetuneError(f"params.yaml: finetune.method {name!r} is not one of {', '.join(METHODS)}")
    module, _, function = METHODS[name].partition(":")
    return getattr(importlib.import_module(module), function)
