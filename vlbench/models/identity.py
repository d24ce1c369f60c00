"""What features must have been made with, read from params alone (no torch, no model loaded).

A stage that reads features demands the model the params name: slug, architecture, pretrained tag or path,
and for a local checkpoint the sha256 of that file, so features embedded with other weights are refused
even when a stage is run by hand outside DVC. A published tag (`openai`, `laion2b_s34b_b79k`) names
immutable weights, so the tag itself identifies them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from vlbench.io import sha256_file

CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")


def is_local_checkpoint(pretrained: str) -> bool:
    """A path (has a separator, a checkpoint suffix, or names an existing file) rather than an open_clip tag."""
    return "/" in pretrained or os.sep in pretrained or pretrained.endswith(CHECKPOINT_SUFFIXES) or Path(pretrained).is_file()


def model_identity(model: Mapping[str, Any]) -> dict[str, Any]:
    """The fingerprint keys a reader demands of features for the model config `model` (params' `model`)."""
    pretrained = str(model["pretrained"])
    identity = {"model": model["slug"], "arch": model["arch"], "pretrained": pretrained}
    if is_local_checkpoint(pretrained) and Path(pretrained).is_file():
        identity["weights_sha256"] = sha256_file(pretrained)
    return identity
