"""Fine-tuning (issue 23): the one place where images pass through a model again after `embed`.

One stage, `finetune@<dataset>` (stages/finetune.py), runs the method that `finetune.method` names. Methods are data:
`METHODS` maps a name to a `Method`: its "module:function", the params sections it reads besides `finetune` and
`seed` (the stage's params and its resume key are derived from them) and the tables it fills. Each function takes a `vlbench.finetune.common.Job` and returns a
`vlbench.finetune.common.Outcome` (the fine-tuned weights, which parameters trained, metrics, tables, a chart). The
stage writes the weights with their fingerprint (`vlbench.finetune.artifacts`) and the result JSON; the weights are
then a model like any other (`conf/model/<slug>.yaml` with `base` and `finetune` keys; docs/protocols.md,
"Fine-tuning"). torch is imported only by the method modules, never here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from vlbench.errors import VlbenchError


@dataclass(frozen=True)
class Method:
    entry: str  # "module:function"
    sections: tuple[str, ...]  # params sections it reads besides finetune and seed
    tables: tuple[str, ...]  # the tables of TABLES it fills (the others are written empty)

    @property
    def module(self) -> str:
        return self.entry.partition(":")[0]


METHODS: dict[str, Method] = {
    # ELEVATER full fine-tuning with the linear probe's search (adapt.elevater's search, splits and epochs)
    "elevater_full": Method("vlbench.finetune.elevater:run", ("adapt",), ("search",)),
    # NegCLIP: altered captions (and neighbour images) as hard negatives; evaluated with specificity and zero-shot
    "negclip": Method("vlbench.finetune.negclip:run", ("specificity", "zeroshot"), ("comparison", "train_log")),
    # FewTrans's VisualFT/TextFT/AllFT/LoRA/BitFit on adapt.fewtrans's episodes
    "fewtrans_episodic": Method("vlbench.finetune.fewtrans:run", ("adapt",), ("episodes",)),
}
# Every method's result is one JSON and these outputs beside it (dvc.yaml declares them all): reports/finetune/<dataset>
# .<table>.parquet, empty where the method has no such table, and reports/finetune/<dataset>.svg, the method's chart.
TABLES = tuple(dict.fromkeys(t for m in METHODS.values() for t in m.tables))
SECTIONS = tuple(dict.fromkeys(s for m in METHODS.values() for s in m.sections))  # the stage's params: any method's


class FinetuneError(VlbenchError):
    """Bad fine-tuning params or inputs; the message names the key, file or dataset."""


def method(name: str) -> Callable:
    """The function of method `name` (imported on demand: one method's dependencies never load another's)."""
    if name not in METHODS:
        raise FinetuneError(f"params.yaml: finetune.method {name!r} is not one of {', '.join(METHODS)}")
    module, _, function = METHODS[name].entry.partition(":")
    return getattr(importlib.import_module(module), function)
