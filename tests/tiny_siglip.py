"""A tiny SigLIP-shaped open_clip model written as a Hugging Face hub repo in a local cache (no network).

The repo is what `hf-hub:timm/ViT-B-16-SigLIP` holds, in miniature: `open_clip_config.json` (a `model_cfg` with
`init_logit_bias`, a custom text tower without causal mask pooled at its last token, `hf_tokenizer_name` and
`tokenizer_kwargs.clean: canonicalize`; a `preprocess_cfg` that squashes with bicubic interpolation and mean/std
0.5), the weights (`open_clip_pytorch_model.bin`, with a logit scale and bias set to values no initialisation gives),
a timm-style `config.json` (transformers' AutoTokenizer reads a repo's config.json first), and a word-level
tokenizer built here with `tokenizers` (`tokenizer.json` + `tokenizer_config.json`, read by AutoTokenizer as
SigLIP's are). The cache layout is huggingface_hub's: models--org--name/refs/main
holds the revision, snapshots/<revision>/ the files.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import torch

REVISION = "0" * 40
WORDS = ["a", "photo", "of", "the", "red", "blue", "green", "circle", "square", "triangle", "big", "small", "dog",
         "cat", "car", "bird"]
LOGIT_SCALE = 112.5  # exp of the stored log scale; SigLIP B/16's is about 117
LOGIT_BIAS = -12.25  # SigLIP B/16's is about -12.9

MODEL_CFG = {
    "embed_dim": 32,
    "init_logit_bias": -10,
    "init_logit_scale": math.log(10),
    "custom_text": True,
    "vision_cfg": {"image_size": 32, "patch_size": 8, "width": 32, "layers": 1, "head_width": 16},
    "text_cfg": {
        "context_length": 16,
        "vocab_size": len(WORDS) + 3,
        "hf_tokenizer_name": "",  # set to the repo id by write_repo
        "tokenizer_kwargs": {"clean": "canonicalize"},
        "width": 32,
        "heads": 2,
        "layers": 1,
        "no_causal_mask": True,
        "proj_bias": True,
        "pool_type": "last",
        "norm_kwargs": {"eps": 1e-6},
    },
}
PREPROCESS_CFG = {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "interpolation": "bicubic",
                  "resize_mode": "squash"}


def write_tokenizer(folder: Path) -> None:
    """A word-level tokenizer: <pad> 0, </s> 1, <unk> 2, then WORDS; every text ends with </s> (T5/SigLIP style)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 64}))


def write_repo(cache: Path, repo: str = "vlbench/tiny-siglip", *, preprocess_cfg: dict | None = None,
               weights: bool = True, seed: int = 0) -> Path:
    """Write the repo `repo` into the hub cache `cache`; return its snapshot folder."""
    import open_clip

    cfg = copy.deepcopy(MODEL_CFG)
    cfg["text_cfg"]["hf_tokenizer_name"] = repo
    root = Path(cache) / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(REVISION)
    config = {"model_cfg": cfg, "preprocess_cfg": PREPROCESS_CFG if preprocess_cfg is None else preprocess_cfg}
    (snapshot / "open_clip_config.json").write_text(json.dumps(config, indent=1))
    (snapshot / "config.json").write_text(json.dumps({"architecture": "vlbench_tiny_siglip", "num_classes": 0}))
    write_tokenizer(snapshot)
    if weights:
        torch.manual_seed(seed)
        model = open_clip.create_model(f"local-dir:{snapshot}")
        with torch.no_grad():
            model.logit_scale.fill_(math.log(LOGIT_SCALE))
            model.logit_bias.fill_(LOGIT_BIAS)
        torch.save(model.state_dict(), snapshot / "open_clip_pytorch_model.bin")
    return snapshot
