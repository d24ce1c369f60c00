"""What the plan's estimates time on: a model's architecture at random initialisation (no weights, no network), the
device's synchronisation and its name. `vlbench.plan` (embedding) and `vlbench.finetune.passes` (fine-tuning steps)
both measure with them."""

from __future__ import annotations

import logging
from typing import Any, Mapping

from vlbench.models.identity import hub_repo


def build_image_model(model_cfg: Mapping[str, Any], device):
    """The model's architecture at random initialisation and its preprocessing: a forward pass costs the same whatever
    the weights' values, so the warm-up needs no weights file and no network."""
    import open_clip

    from vlbench.models.loading import ModelError, hub_offline, offline, validate_model_config

    cfg = validate_model_config(model_cfg)
    logging.disable(logging.WARNING)  # open_clip warns that the model is "initialized randomly": here that is the point
    try:  # an hf-hub arch reads its open_clip_config.json (from the cache when offline), never its weights
        with hub_offline(hub_repo(cfg["arch"]) is None or offline()):
            model, _, preprocess = open_clip.create_model_and_transforms(cfg["arch"], pretrained=None,
                                                                         load_weights=False, device=device)
    except RuntimeError as err:
        raise ModelError(f"model {cfg['slug']!r}: cannot build {cfg['arch']!r} for the estimate ({err}); "
                         "plan with --no-warmup") from err
    finally:
        logging.disable(logging.NOTSET)
    return model.eval(), preprocess, cfg["precision"]


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def describe_device(device) -> str:
    import torch

    return f"cuda ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "cpu"
