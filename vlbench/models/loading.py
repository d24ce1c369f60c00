"""Load a model described by a model config (a `conf/model/<slug>.yaml`, as composed into params.yaml).

`pretrained` is either an open_clip tag (`openai`, `laion2b_s34b_b79k`, ...) or a path to a local
checkpoint. Tags resolve to a file in the weights cache; without network a missing file fails at once with
a message naming the model, the cache and the fix, instead of open_clip's minutes of retries. An `hf-hub:org/repo`
architecture carries its own weights (its repo's open_clip_config.json and checkpoint; `pretrained: hf-hub`).

What the entry fixes besides the weights (docs/protocols.md, "Model registry: preprocessing, text, logits"):
`preprocess` (size, mode, mean, std, interpolation, resize_mode, fill_color), `text` (context_length, clean: open_clip's
text cleaning, `canonicalize` and `lower` lower-case) and `logits` (`softmax`: CLIP's scale * cos; `sigmoid`:
SigLIP's sigmoid(scale * cos + bias)). Where given they override open_clip's defaults for the tag, and the model as
built must then have exactly them (else ModelError); the fingerprint records what was built (`model_preprocess`,
`text`, `logits`, `logit_scale`, `logit_bias`) and readers demand what the entry says (`identity.model_identity`).
"""

from __future__ import annotations

import difflib
import json
import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from vlbench import __version__
from vlbench.errors import VlbenchError
from vlbench.io import sha256_file
from vlbench.models import register_local_configs
from vlbench.models.identity import (
    CLEANS,
    HF_HUB_PREFIX,
    HUB_WEIGHTS,
    LOGITS,
    PREPROCESS_KEYS,
    TEXT_KEYS,
    finetune_identity,
    hub_repo,
    is_local_checkpoint,
    normalize_preprocess,
)

PRECISIONS = ("fp32", "amp_bf16", "amp_fp16")
REQUIRED_KEYS = ("slug", "arch", "pretrained")
HF_HOST = ("huggingface.co", 443)
HUB_CONFIG = "open_clip_config.json"  # an hf-hub repo's model_cfg and preprocess_cfg
# entry preprocess key -> create_model_and_transforms' argument (size and mode are the architecture's: checked only)
PREPROCESS_ARGS = {"mean": "image_mean", "std": "image_std", "interpolation": "image_interpolation",
                   "resize_mode": "image_resize_mode"}


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
    validate_declared(cfg)
    if hub_repo(cfg["arch"]) is not None:
        if hub_repo(cfg["arch"]).count("/") != 1:
            raise ModelError(f"model {cfg['slug']!r}: arch {cfg['arch']!r} must name a hub repo as {HF_HUB_PREFIX}org/name")
        if cfg["pretrained"] != HUB_WEIGHTS:
            raise ModelError(f"model {cfg['slug']!r}: arch {cfg['arch']!r} carries its repo's weights: set "
                             f"model.pretrained to {HUB_WEIGHTS!r} (got {cfg['pretrained']!r})")
        return {**cfg, "precision": precision}
    register_local_configs()
    import open_clip

    if cfg["arch"] not in open_clip.list_models():
        close = difflib.get_close_matches(cfg["arch"], open_clip.list_models(), n=5, cutoff=0.5)
        raise ModelError(f"model {cfg['slug']!r}: unknown open_clip architecture {cfg['arch']!r}; close matches: {close}")
    return {**cfg, "precision": precision}


def validate_declared(cfg: Mapping[str, Any]) -> None:
    """The entry's optional `preprocess`, `text` and `logits`: known keys and values (one line naming the key)."""
    for key, known in (("preprocess", PREPROCESS_KEYS), ("text", TEXT_KEYS)):
        value = cfg.get(key)
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise ModelError(f"model {cfg['slug']!r}: model.{key} must be a mapping, got {value!r}")
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ModelError(f"model {cfg['slug']!r}: unknown key(s) model.{key}.{unknown[0]} (known: {list(known)})")
    text = cfg.get("text") or {}
    if "clean" in text and text["clean"] not in CLEANS:
        raise ModelError(f"model {cfg['slug']!r}: model.text.clean {text['clean']!r} is not one of {list(CLEANS)}")
    if "context_length" in text and not (isinstance(text["context_length"], int) and text["context_length"] > 0):
        raise ModelError(f"model {cfg['slug']!r}: model.text.context_length must be a positive integer, "
                         f"got {text['context_length']!r}")
    if cfg.get("logits") is not None and cfg["logits"] not in LOGITS:
        raise ModelError(f"model {cfg['slug']!r}: model.logits {cfg['logits']!r} is not one of {list(LOGITS)}")


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
    wanted = {**pretrained_cfg, **(cfg.get("preprocess") or {})}  # the entry's preprocessing overrides the tag's
    kwargs = {arg: wanted[key] for key, arg in PREPROCESS_ARGS.items() if wanted.get(key) is not None}
    # an hf-hub arch loads its repo (cached by resolve_weights); a tag or path loads the resolved file
    source = {"pretrained": None, "cache_dir": cache_dir} if hub_repo(cfg["arch"]) else {"pretrained": str(weights)}
    with hub_offline(not hub_needed(cfg) or offline()):
        try:
            model, _, preprocess = open_clip.create_model_and_transforms(cfg["arch"], device=device, **source, **kwargs)
        except (RuntimeError, AssertionError, KeyError) as err:  # open_clip asserts on some shape mismatches
            raise ModelError(f"model {cfg['slug']!r}: checkpoint {weights} does not fit architecture {cfg['arch']!r}: {err}") from err
        tokenizer = build_tokenizer(cfg, cache_dir)
    model.eval()
    precision = effective_precision(cfg["precision"], device)
    dtype = autocast_dtype(cfg["precision"], device)
    built = {"model_preprocess": describe_preprocess(model), "text": describe_tokenizer(tokenizer),
             **describe_logits(model)}
    check_declared(cfg, built, model)
    fingerprint = {
        "model": cfg["slug"],
        "arch": cfg["arch"],
        "pretrained": cfg["pretrained"],
        "weights_sha256": sha256_file(weights),
        "preprocess": built["model_preprocess"],
        "precision": precision,
        "vlbench_version": __version__,
        **built,
        **finetune_identity(cfg),
    }
    return LoadedModel(model, preprocess, tokenizer, fingerprint, device, dtype)


def build_tokenizer(cfg: Mapping[str, Any], cache_dir: str | None = None) -> Callable:
    """open_clip's tokenizer for the arch, with the entry's `text.context_length` and `text.clean` where given. A
    tokenizer that lives on the Hugging Face hub (SigLIP's) and is not in the cache fails with a ModelError."""
    import open_clip

    text = cfg.get("text") or {}
    options = {"clean": text["clean"]} if "clean" in text else {}
    try:
        return open_clip.get_tokenizer(cfg["arch"], context_length=text.get("context_length"), cache_dir=cache_dir,
                                       **options)
    except (OSError, ValueError) as err:  # transformers: files neither cached nor downloadable (ValueError: no
        # tokenizer file next to a cached config.json)
        raise ModelError(f"model {cfg['slug']!r} ({cfg['arch']}): its Hugging Face tokenizer is not in the cache "
                         f"{cache_dir or hub_cache()} and cannot be downloaded: {str(err).splitlines()[0]}") from err


def describe_preprocess(model: torch.nn.Module) -> dict[str, Any]:
    return normalize_preprocess(getattr(model.visual, "preprocess_cfg", {}) or {})


def describe_tokenizer(tokenizer: Callable) -> dict[str, Any]:
    """{"context_length", "clean"}: the tokens' length and open_clip's text cleaning (`canonicalize`: lower-cased,
    punctuation removed; `lower`: lower-cased; `whitespace`: as written), read off the tokenizer that was built."""
    from open_clip.tokenizer import get_clean_fn

    names = {get_clean_fn(name): name for name in CLEANS}
    return {"context_length": int(tokenizer.context_length), "clean": names.get(getattr(tokenizer, "clean_fn", None))}


def describe_logits(model: torch.nn.Module) -> dict[str, Any]:
    """{"logits": "sigmoid" with the model's `logit_bias`, else "softmax"; "logit_scale": exp of its learned scale,
    "logit_bias": the bias or None}: how the model turns cosines into scores (SigLIP: sigmoid(scale * cos + bias))."""
    scale, bias = getattr(model, "logit_scale", None), getattr(model, "logit_bias", None)
    return {"logits": "softmax" if bias is None else "sigmoid",
            "logit_scale": float(scale.detach().float().exp().item()) if isinstance(scale, torch.Tensor) else None,
            "logit_bias": float(bias.detach().float().item()) if isinstance(bias, torch.Tensor) else None}


def check_declared(cfg: Mapping[str, Any], built: Mapping[str, Any], model: torch.nn.Module) -> None:
    """The model as built has what the entry declares (`preprocess`, `text`, `logits`), else one ModelError."""
    declared = flat_declaration(normalize_preprocess(cfg.get("preprocess") or {}), cfg.get("text") or {},
                                cfg.get("logits"))
    found = flat_declaration(built["model_preprocess"], built["text"], built["logits"])
    diffs = [(key, value, found.get(key)) for key, value in declared.items() if found.get(key) != value]
    if diffs:
        raise ModelError(f"model {cfg['slug']!r} ({cfg['arch']} / {cfg['pretrained']}): the model open_clip builds does "
                         f"not have what the entry says: " + "; ".join(f"model.{k} is {v!r}, built {b!r}" for k, v, b in diffs))
    length = getattr(model, "context_length", None)
    if length is not None and built["text"]["context_length"] > length:
        raise ModelError(f"model {cfg['slug']!r}: model.text.context_length {built['text']['context_length']} exceeds "
                         f"the text tower's {length} positions")


def flat_declaration(preprocess: Mapping[str, Any], text: Mapping[str, Any], logits: str | None) -> dict[str, Any]:
    """{"preprocess.<key>", "text.<key>", "logits": value}: an entry's declaration or a built model's, comparable."""
    return {**{f"preprocess.{k}": v for k, v in preprocess.items()}, **{f"text.{k}": v for k, v in text.items()},
            **({"logits": logits} if logits else {})}


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

    repo = hub_repo(cfg["arch"])
    if repo is not None:
        return resolve_hub(cfg, repo, cache_dir)
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
    if offline():
        raise ModelError(
            f"model {cfg['slug']!r} ({cfg['arch']} / {pretrained}): weights are not in the cache "
            f"{weights_cache_location(pcfg, cache_dir)} and there is no network. Fix: run once on a machine with "
            f"internet (the weights are cached there; copy the cache over), or set model.pretrained to a local "
            f"checkpoint path."
        )
    return Path(open_clip.download_pretrained(pcfg, cache_dir=cache_dir)), pcfg


def resolve_hub(cfg: Mapping[str, Any], repo: str, cache_dir: str | None = None) -> tuple[Path, dict]:
    """(weights file, the repo's preprocess_cfg) of an `hf-hub:` arch: its open_clip_config.json and checkpoint from
    the cache, downloaded first when missing and the network is there; offline and missing: a ModelError at once."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    pcfg = {"hf_hub": f"{repo}/"}
    config = try_to_load_from_cache(repo, HUB_CONFIG, cache_dir=cache_dir)
    weights = find_cached_weights(pcfg, cache_dir)
    if not (isinstance(config, str) and weights):
        if offline():
            raise ModelError(
                f"model {cfg['slug']!r} ({cfg['arch']}): its {HUB_CONFIG} and weights are not in the cache "
                f"{weights_cache_location(pcfg, cache_dir)} and there is no network. Fix: run once on a machine with "
                f"internet (the repo is cached there; copy the cache over), or set model.arch to an open_clip "
                f"architecture and model.pretrained to a local checkpoint path.")
        import open_clip

        config = hf_hub_download(repo, HUB_CONFIG, cache_dir=cache_dir)
        weights = Path(open_clip.download_pretrained(pcfg, cache_dir=cache_dir))
    preprocess = json.loads(Path(config).read_text()).get("preprocess_cfg", {})
    return weights, dict(preprocess)


def hub_needed(cfg: Mapping[str, Any]) -> bool:
    """Whether loading may consult the Hugging Face hub: an hf-hub arch or a published tag (its tokenizer may live
    there too, as SigLIP's do). A local checkpoint loads in offline mode: a hub tokenizer comes from the cache."""
    return hub_repo(cfg["arch"]) is not None or not is_local_checkpoint(str(cfg["pretrained"]))


def offline() -> bool:
    return os.environ.get("VLBENCH_OFFLINE") == "1" or not network_reachable()


@contextmanager
def hub_offline(enabled: bool):
    """huggingface_hub (and transformers through it) in offline mode while `enabled`: files come from the cache at
    once instead of after minutes of retried requests (HF_HUB_OFFLINE is read at import; its constant at call time)."""
    from huggingface_hub import constants

    before = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = before or enabled
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = before


def hub_cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


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
