"""Load a model described by a model config (a `conf/model/<slug>.yaml`, as composed into params.yaml).

`pretrained` is either an open_clip tag (`openai`, `laion2b_s34b_b79k`, ...) or a path to a local
checkpoint. Tags resolve to a file in the weights cache; without network a missing file fails at once with
a message naming the model, the cache and the fix, instead of open_clip's minutes of retries.
"""

from __future__ import annotations

import difflib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from vlbench import __version__
from vlbench.errors import VlbenchError
from vlbench.io import sha256_file
from vlbench.models import register_local_configs
from vlbench.models.identity import finetune_identity, is_local_checkpoint

PRECISIONS = ("fp32", "amp_bf16", "amp_fp16")
REQUIRED_KEYS = ("slug", "arch", "pretrained")
HF_HOST = ("huggingface.co", 443)


class ModelError(VlbenchError):
    """A model config is malformed, names an unknown architecture or tag, or its weights are missing."""


@dataclass
class LoadedModel:
    model: torch.nn.Module
    preprocess: Callable
    tokenizer: Callable
    fingerprint: dict[str, Any]
    device: torch.device
    autocast_dtype: torch.dtype | None  # None: fp32

    def autocast(self):
        if self.autocast_dtype is None:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)


def validate_model_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(cfg, Mapping):
        raise ModelError(f"params key 'model' must be a mapping, got {type(cfg).__name__}")
    missing = [k for k in REQUIRED_KEYS if not cfg.get(k)]
    if missing:
        raise ModelError(f"model config {cfg.get('slug', '?')!r} lacks key(s) {missing} (params.yaml: model.*)")
    precision = cfg.get("precision", "amp_bf16")
    if precision not in PRECISIONS:
        raise ModelError(f"model {cfg['slug']!r}: precision {precision!r} is not one of {PRECISIONS}")
    register_local_configs()
    import open_clip

    if cfg["arch"] not in open_clip.list_models():
        close = difflib.get_close_matches(cfg["arch"], open_clip.list_models(), n=5, cutoff=0.5)
        raise ModelError(f"model {cfg['slug']!r}: unknown open_clip architecture {cfg['arch']!r}; close matches: {close}")
    return {**cfg, "precision": precision}


def pick_device(requested: str | None = None) -> torch.device:
    return torch.device(requested or ("cuda" if torch.cuda.is_available() else "cpu"))


def effective_precision(precision: str, device: torch.device) -> str:
    """Autocast only on CUDA: CPU runs in fp32 whatever the config asks for."""
    return precision if device.type == "cuda" else "fp32"


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype a model config's precision gives on `device` (None: fp32, no autocast)."""
    return {"fp32": None, "amp_bf16": torch.bfloat16, "amp_fp16": torch.float16}[effective_precision(precision, device)]


def load_model(cfg: Mapping[str, Any], device: str | torch.device | None = None, cache_dir: str | None = None) -> LoadedModel:
    cfg = validate_model_config(cfg)
    device = pick_device(str(device) if device else None)
    import open_clip

    weights, pretrained_cfg = resolve_weights(cfg, cache_dir)
    kwargs = {}
    if pretrained_cfg:
        kwargs = dict(image_mean=pretrained_cfg.get("mean"), image_std=pretrained_cfg.get("std"),
                      image_interpolation=pretrained_cfg.get("interpolation"),
                      image_resize_mode=pretrained_cfg.get("resize_mode"))
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
    try:
        model, _, preprocess = open_clip.create_model_and_transforms(cfg["arch"], pretrained=str(weights), device=device, **kwargs)
    except (RuntimeError, AssertionError, KeyError) as err:  # open_clip asserts on some shape mismatches
        raise ModelError(f"model {cfg['slug']!r}: checkpoint {weights} does not fit architecture {cfg['arch']!r}: {err}") from err
    model.eval()
    precision = effective_precision(cfg["precision"], device)
    dtype = autocast_dtype(cfg["precision"], device)
    fingerprint = {
        "model": cfg["slug"],
        "arch": cfg["arch"],
        "pretrained": cfg["pretrained"],
        "weights_sha256": sha256_file(weights),
        "preprocess": describe_preprocess(model),
        "precision": precision,
        "vlbench_version": __version__,
        **finetune_identity(cfg),
    }
    return LoadedModel(model, preprocess, open_clip.get_tokenizer(cfg["arch"]), fingerprint, device, dtype)


def describe_preprocess(model: torch.nn.Module) -> dict[str, Any]:
    pp = dict(getattr(model.visual, "preprocess_cfg", {}) or {})
    return {k: list(v) if isinstance(v, tuple) else v for k, v in pp.items()}


def resolve_weights(cfg: Mapping[str, Any], cache_dir: str | None = None) -> tuple[Path, dict]:
    """Return (path to the weights file, open_clip pretrained cfg or {} for local checkpoints)."""
    pretrained = str(cfg["pretrained"])
    if is_local_checkpoint(pretrained):
        path = Path(pretrained)
        if not path.is_file():
            raise ModelError(
                f"model {cfg['slug']!r}: checkpoint {path} not found"
                + ("; it is made by the pretrain stage: run `dvc repro`" if cfg.get("pretrain") else "")
            )
        return path, {}
    import open_clip

    pcfg = open_clip.get_pretrained_cfg(cfg["arch"], pretrained)
    if not pcfg:
        tags = open_clip.list_pretrained_tags_by_model(cfg["arch"])
        raise ModelError(
            f"model {cfg['slug']!r}: pretrained {pretrained!r} is no such file (checked {str(Path(pretrained).resolve())!r}) "
            f"and no pretrained tag of {cfg['arch']!r} (known tags: {tags}); for a checkpoint give its path"
        )
    cached = find_cached_weights(pcfg, cache_dir)
    if cached:
        return cached, pcfg
    if os.environ.get("VLBENCH_OFFLINE") == "1" or not network_reachable():
        raise ModelError(
            f"model {cfg['slug']!r} ({cfg['arch']} / {pretrained}): weights are not in the cache "
            f"{weights_cache_location(pcfg, cache_dir)} and there is no network. Fix: run once on a machine with "
            f"internet (the weights are cached there; copy the cache over), or set model.pretrained to a local "
            f"checkpoint path."
        )
    return Path(open_clip.download_pretrained(pcfg, cache_dir=cache_dir)), pcfg


def _hf_candidates(pcfg: Mapping) -> tuple[str, list[str]]:
    model_id, filename = os.path.split(pcfg["hf_hub"])
    filename = filename or "open_clip_pytorch_model.bin"
    safe = filename.replace("open_clip_pytorch_model.bin", "open_clip_model.safetensors")
    return model_id, list(dict.fromkeys([safe, filename]))


def find_cached_weights(pcfg: Mapping, cache_dir: str | None = None) -> Path | None:
    if pcfg.get("file"):
        return Path(pcfg["file"]) if Path(pcfg["file"]).is_file() else None
    if pcfg.get("hf_hub"):
        from huggingface_hub import try_to_load_from_cache

        model_id, names = _hf_candidates(pcfg)
        for name in names:
            hit = try_to_load_from_cache(model_id, name, cache_dir=cache_dir)
            if isinstance(hit, str):
                return Path(hit)
    if pcfg.get("url"):
        path = Path(cache_dir or Path.home() / ".cache" / "clip") / os.path.basename(pcfg["url"])
        if path.is_file():
            return path
    return None


def weights_cache_location(pcfg: Mapping, cache_dir: str | None = None) -> str:
    if pcfg.get("hf_hub"):
        from huggingface_hub import constants

        model_id, names = _hf_candidates(pcfg)
        return f"{cache_dir or constants.HF_HUB_CACHE} (Hugging Face repo {model_id}, file {names[-1]})"
    return str(Path(cache_dir or Path.home() / ".cache" / "clip") / os.path.basename(pcfg.get("url", "")))


def network_reachable(host: tuple[str, int] = HF_HOST, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection(host, timeout=timeout):
            return True
    except OSError:
        return False
