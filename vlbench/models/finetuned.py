"""Fine-tuned model entries (conf/model/<slug>.yaml with `finetune: {dataset, method}`): what makes their weights,
and the OmegaConf resolver `${vlbench.finetuned:}` that checks them when Hydra composes."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Mapping

from vlbench.errors import VlbenchError

FINETUNE_FINGERPRINT = "fingerprint.json"  # beside a fine-tuned checkpoint (vlbench.finetune.artifacts writes both)


class FinetunedModelError(VlbenchError):
    """A model config names a fine-tuned checkpoint that is missing, or whose fingerprint.json does not match it."""


def finetune_command(model: Mapping[str, Any]) -> str:
    """The command that makes a fine-tuned entry's checkpoint: the finetune run of its base model on its dataset with
    its method (`finetune: {dataset, method}`), plus the entry's `finetune.overrides` (what that dataset needs, e.g. a
    train split)."""
    spec = model["finetune"]
    overrides = [*([f"model={model['base']}"] if model.get("base") else []), f"suite.finetune=[{spec['dataset']}]",
                 f"finetune.method={spec['method']}", *spec.get("overrides", [])]
    return "dvc exp run " + " ".join(f"-S {shlex.quote(o)}" for o in overrides)


def missing_finetuned(model: Mapping[str, Any], root: Path | None = None) -> FinetunedModelError | None:
    """The error for a fine-tuned entry whose checkpoint or fingerprint.json is not there (paths relative to `root`,
    default the working directory), naming the file and the run that makes it; None when both are there."""
    checkpoint = Path(model["pretrained"])
    for path in (checkpoint, checkpoint.with_name(FINETUNE_FINGERPRINT)):
        if not (root / path if root and not path.is_absolute() else path).is_file():
            return FinetunedModelError(
                f"model {model.get('slug')!r} needs {path}, which is not there: it is made by fine-tuning "
                f"{model.get('base')!r} on {model['finetune']['dataset']!r} with {model['finetune']['method']}: "
                f"`{finetune_command(model)}`, then rerun this command")
    return None


def finetuned_weights(*, _parent_) -> str:
    """OmegaConf resolver `${vlbench.finetuned:}`, a fine-tuned entry's `weights_file`: the entry's `pretrained` path
    once its checkpoint and fingerprint are there, else the one-line FinetunedModelError naming the run that makes
    them. It runs when Hydra composes (`dvc exp run -S model=...`, `vlbench compose`), before DVC hashes the weights
    as a dependency (which would fail with a bare `No such file or directory`)."""
    from omegaconf import OmegaConf

    model = {k: OmegaConf.to_container(_parent_[k], resolve=True) if OmegaConf.is_config(_parent_[k]) else _parent_[k]
             for k in ("slug", "base", "pretrained", "finetune") if k in _parent_}
    cwd = Path.cwd()
    root = next((p for p in (cwd, *cwd.parents) if (p / "dvc.yaml").is_file()), cwd)
    error = missing_finetuned(model, root)
    if error is not None:
        raise error
    return str(model["pretrained"])


def register_resolvers() -> None:
    """Register `vlbench.finetuned` with OmegaConf (conf/model entries of fine-tuned models use it); idempotent."""
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("vlbench.finetuned", finetuned_weights, replace=True)
