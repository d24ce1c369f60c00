"""Fine-tuning (issue 23): the one place where images pass through a model again after `embed`.

One stage, `finetune@<dataset>` (stages/finetune.py), runs the method that `finetune.method` names. Methods are data:
`vlbench.finetune.registry.FINETUNE_METHODS` maps a name to a `FinetuneMethod`: its "module:function", the params
sections it reads besides `finetune` and `seed` (the stage's params and its resume key are derived from them) and the
tables it fills. Each function takes a `vlbench.finetune.training.Job` and returns a
`vlbench.finetune.training.Outcome` (the fine-tuned weights, which parameters trained, metrics, tables, a chart). The
stage writes the weights with their fingerprint (`vlbench.finetune.artifacts`) and the result JSON; the weights are
then a model like any other
(`conf/model/<slug>.yaml` with `base` and `finetune` keys; docs/protocols.md, "Fine-tuning"). This package module holds
only what every method module imports (`FinetuneError`): the registry, which names the method modules, sits beside
them, so no method module imports the module that names it. torch is imported only by the method modules.
"""

from __future__ import annotations

from vlbench.errors import VlbenchError


class FinetuneError(VlbenchError):
    """Bad fine-tuning params or inputs; the message names the key, file or dataset."""
