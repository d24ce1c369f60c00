"""Fine-tuned models as files: `data/finetuned/<dataset>/<method>/checkpoint.pt` (the whole open_clip state_dict, so it
loads as a local checkpoint of the base architecture) and `fingerprint.json` beside it.

The fingerprint says what made the weights: the base model (slug, arch, pretrained, weights sha256), the method, its
hyper-parameters, the prepared data's version (and the text sets' where the method reads texts), the seed, and the
trained parameter count; `id` is the sha256 of those (canonical JSON), `weights_sha256` the checkpoint's. A model
config that names the checkpoint (`conf/model/<slug>.yaml` with `finetune: {...}`) carries `id` into every feature
file it makes (`vlbench.models.identity.model_identity`), so features of a fine-tuned model are never read as the base
model's, nor the reverse. No torch here: the writer gets the checkpoint's bytes from the caller.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from vlbench import __version__
from vlbench.io import atomic_path, sha256_file, write_json
from vlbench.params import check_name

FINETUNED = Path("data/finetuned")
CHECKPOINT, FINGERPRINT = "checkpoint.pt", "fingerprint.json"


def finetuned_dir(dataset: str, method: str) -> Path:
    return FINETUNED / check_name("dataset", dataset) / check_name("method", method)


def fingerprint_id(doc: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(dict(doc), sort_keys=True, default=str).encode()).hexdigest()


def make_fingerprint(base: Mapping[str, Any], method: str, hyper: Mapping[str, Any], dataset: str,
                     data_version: Mapping[str, Any], seed: int, trainable: int) -> dict[str, Any]:
    """The fingerprint of a fine-tuned model, `id` included (not yet the weights' hash)."""
    doc = {"base": {k: base.get(k) for k in ("model", "arch", "pretrained", "weights_sha256")},
           "method": method, "hyper": dict(hyper), "dataset": dataset, "data_version": dict(data_version),
           "seed": int(seed), "trainable_parameters": int(trainable), "vlbench_version": __version__}
    return {"id": fingerprint_id(doc), **doc}


def write_finetuned(out_dir: Path, save: Callable[[Path], None] | None, fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """`save(path)` writes the checkpoint (atomically here), then fingerprint.json with the checkpoint's sha256. A method
    that leaves no single model (episodic fine-tuning trains one per episode) passes `save=None`: the folder then holds
    fingerprint.json alone, with `weights_sha256` null, and no model entry can name it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CHECKPOINT).unlink(missing_ok=True)
    if save is not None:
        with atomic_path(out_dir / CHECKPOINT) as tmp:
            save(tmp)
    doc = {**fingerprint, "weights_sha256": sha256_file(out_dir / CHECKPOINT) if save is not None else None}
    write_json(out_dir / FINGERPRINT, doc)
    return doc
