"""What features must have been made with, read from params alone (no torch, no model loaded).

A stage that reads features demands the model the params name: slug, architecture, pretrained tag or path,
and for a local checkpoint the sha256 of that file, so features embedded with other weights are refused
even when a stage is run by hand outside DVC. A published tag (`openai`, `laion2b_s34b_b79k`) names
immutable weights, so the tag itself identifies them. What the model's registry entry declares about preprocessing
(`preprocess`), text handling (`text`) and scoring (`logits`) is demanded too, so that features made with another
resize, interpolation, normalisation, token length or text cleaning are refused (docs/protocols.md, "Model registry:
preprocessing, text, logits").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from vlbench.io import sha256_file
from vlbench.models.finetuned import FINETUNE_FINGERPRINT, FinetunedModelError, missing_finetuned

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")
HF_HUB_PREFIX = "hf-hub:"  # open_clip's schema: the arch is a hub repo with open_clip_config.json and weights
HUB_WEIGHTS = "hf-hub"  # model.pretrained of an hf-hub arch: the repo's own weights
PREPROCESS_KEYS = ("size", "mode", "mean", "std", "interpolation", "resize_mode", "fill_color")  # open_clip PreprocessCfg
TEXT_KEYS = ("context_length", "clean")
CLEANS = ("canonicalize", "lower", "whitespace")  # open_clip's text cleaning; the first two lower-case
LOGITS = ("softmax", "sigmoid")  # CLIP: softmax over scale * cos; SigLIP: sigmoid(scale * cos + bias) per pair
# entry key -> the fingerprint key whose value must contain it
DECLARED = {"preprocess": "model_preprocess", "text": "text", "logits": "logits"}


def hub_repo(arch: str) -> str | None:
    """`org/name` of an `hf-hub:org/name` arch, else None."""
    return arch[len(HF_HUB_PREFIX):] if arch.startswith(HF_HUB_PREFIX) else None


def normalize_preprocess(pp: Mapping[str, Any]) -> dict[str, Any]:
    """open_clip's preprocess cfg as JSON compares it: tuples as lists, an int size as [size, size]."""
    out = {k: list(v) if isinstance(v, tuple) else v for k, v in pp.items()}
    if isinstance(out.get("size"), int):
        out["size"] = [out["size"], out["size"]]
    return out



def is_local_checkpoint(pretrained: str) -> bool:
    """A path (has a separator, a checkpoint suffix, or names an existing file) rather than an open_clip tag."""
    return "/" in pretrained or os.sep in pretrained or pretrained.endswith(CHECKPOINT_SUFFIXES) or Path(pretrained).is_file()


def model_identity(model: Mapping[str, Any]) -> dict[str, Any]:
    """The fingerprint keys a reader demands of features for the model config `model` (params' `model`)."""
    pretrained = str(model["pretrained"])
    identity = {"model": model["slug"], "arch": model["arch"], "pretrained": pretrained}
    if is_local_checkpoint(pretrained) and Path(pretrained).is_file():
        identity["weights_sha256"] = sha256_file(pretrained)
    declared = {**model, "preprocess": normalize_preprocess(model.get("preprocess") or {})}
    identity.update({field: declared[key] for key, field in DECLARED.items() if declared.get(key)})
    return {**identity, **finetune_identity(model)}


def finetuned_fingerprint(checkpoint: str | Path) -> dict[str, Any]:
    """fingerprint.json beside a fine-tuned checkpoint (both there: `missing_finetuned`), checked against the
    checkpoint's sha256."""
    path = Path(checkpoint).with_name(FINETUNE_FINGERPRINT)
    doc = json.loads(path.read_text())
    if Path(checkpoint).is_file() and sha256_file(checkpoint) != doc.get("weights_sha256"):
        raise FinetunedModelError(f"{path}: its weights_sha256 is not the sha256 of {checkpoint}; re-run the finetune "
                                  f"stage that wrote it")
    return doc


def finetune_identity(model: Mapping[str, Any]) -> dict[str, Any]:
    """{"finetune": id of the fine-tuned weights' fingerprint} for a model config with a `finetune` key, {} otherwise:
    features of a fine-tuned model carry the id, and a reader that asks for the base model (no such key, other
    weights) never takes them, nor the reverse."""
    if not model.get("finetune"):
        return {}
    missing = missing_finetuned(model)
    if missing is not None:
        raise missing
    doc = finetuned_fingerprint(model["pretrained"])
    if model.get("base") and doc["base"]["model"] != model["base"]:
        raise FinetunedModelError(f"model {model.get('slug')!r}: base {model['base']!r}, but {model['pretrained']} was "
                                  f"fine-tuned from {doc['base']['model']!r} (its fingerprint.json)")
    return {"finetune": doc["id"]}
