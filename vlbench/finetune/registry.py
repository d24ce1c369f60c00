"""The fine-tuning methods (`FINETUNE_METHODS`: name -> `FinetuneMethod`), which `finetune.method` names; the
finetune stage's params and outputs derive from them (`SECTIONS`, `TABLES`). A method module imports the package
(`FinetuneError`), never this registry, which imports it by name only when it runs (`method`): one method's
dependencies never load another's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from vlbench.finetune import FinetuneError


@dataclass(frozen=True)
class FinetuneMethod:
    entry: str  # "module:function"
    sections: tuple[str, ...]  # params sections it reads besides finetune and seed
    tables: tuple[str, ...]  # the tables of TABLES it fills (the others are written empty)

    @property
    def module(self) -> str:
        return self.entry.partition(":")[0]


FINETUNE_METHODS: dict[str, FinetuneMethod] = {
    # ELEVATER full fine-tuning with the linear probe's search (adapt.elevater's search, splits and epochs)
    "elevater_full": FinetuneMethod("vlbench.finetune.elevater_full:run", ("adapt",), ("search",)),
    # NegCLIP: altered captions (and neighbour images) as hard negatives; evaluated with specificity and zero-shot
    "negclip": FinetuneMethod("vlbench.finetune.negclip:run", ("specificity", "zeroshot"), ("comparison", "train_log")),
    # FewTrans's VisualFT/TextFT/AllFT/LoRA/BitFit on adapt.fewtrans's episodes
    "fewtrans_episodic": FinetuneMethod("vlbench.finetune.fewtrans_episodic:run", ("adapt",), ("episodes",)),
}
# Every method's result is one JSON and these outputs beside it (dvc.yaml declares them all): reports/finetune/<dataset>
# .<table>.parquet, empty where the method has no such table, and reports/finetune/<dataset>.svg, the method's chart.
TABLES = tuple(dict.fromkeys(t for m in FINETUNE_METHODS.values() for t in m.tables))
# the stage's params: any method's
SECTIONS = tuple(dict.fromkeys(s for m in FINETUNE_METHODS.values() for s in m.sections))


def method(name: str) -> Callable:
    """The function of method `name` (imported on demand: one method's dependencies never load another's)."""
    if name not in FINETUNE_METHODS:
        raise FinetuneError(f"params.yaml: finetune.method {name!r} is not one of {', '.join(FINETUNE_METHODS)}")
    module, _, function = FINETUNE_METHODS[name].entry.partition(":")
    return getattr(importlib.import_module(module), function)
