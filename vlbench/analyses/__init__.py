"""The table of analyses. Stages, the report and the config tests read it; nothing else lists analyses.

Each analysis is one module here with `run(inputs: Inputs, cfg: Mapping, seed: int) -> Result`: cached
features in (through `Inputs`, which checks every fingerprint), metrics and tables out. An analysis never
loads a model and does not import torch at start-up. Adding one touches: its module, its entry below,
its dvc.yaml block, its config section (conf/config.yaml: `<name>:` and `suite.<name>: []`), its tests.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from vlbench.errors import VlbenchError


@dataclass(frozen=True)
class Analysis:
    name: str
    module: str
    title: str


ANALYSES = {a.name: a for a in (
    Analysis("zeroshot", "vlbench.analyses.zeroshot", "Zero-shot classification (CLIP prompt ensembles)"),
    Analysis("linear_probe", "vlbench.analyses.linear_probe", "Linear probe (CLIP-paper logistic regression)"),
    Analysis("specificity", "vlbench.analyses.specificity", "Specificity (true vs subtly wrong texts: mAP per cell)"),
    Analysis("granularity", "vlbench.analyses.granularity", "Granularity (WordNet levels: direct vs propagated mAP)"),
    Analysis("adapt", "vlbench.analyses.adapt", "Adaptation (ELEVATER linear probing, VTAB-1k, FewTrans episodes)"),
    Analysis("extensibility", "vlbench.analyses.extensibility",
             "Extensibility and stability under vocabulary expansion (Acc-C / Acc-E / Acc-S)"),
)}


class UnknownAnalysisError(VlbenchError):
    """An analysis name that is not in the table."""


def analysis(name: str) -> Analysis:
    if name not in ANALYSES:
        raise UnknownAnalysisError(f"unknown analysis {name!r}; known analyses: {', '.join(ANALYSES)}")
    return ANALYSES[name]


def load(name: str) -> ModuleType:
    return importlib.import_module(analysis(name).module)
