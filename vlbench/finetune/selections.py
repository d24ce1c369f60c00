"""Which parameters of an open_clip model a fine-tuning method trains (FewTrans' VisualFT, TextFT, AllFT, LoRA, BitFit).

`prepare(model, selection, rank, alpha, generator)` freezes every parameter the selection does not train
(requires_grad False), inserts LoRA adapters where the selection asks for them, and returns the model with the number
of trainable parameters. Selections are data (`SELECTIONS`): a rule over parameter names plus, for LoRA, adapters.

Sources (docs/protocols.md, "Adapt: FewTrans episodes", "Fine-tuning methods"): FewTrans' code, Frankluox/FewTrans,
`architectures/classifier/prompt_tuning.py` (visualFT / textFT / allFT: every parameter of the tower(s) trains, the
logit scale never: `"scale" in name` is frozen in each mode), `architectures/backbone/clip_visualonly.py` (`bias`
mode: every visual parameter whose name holds "bias"; `lora_ViT`: rank 4 adapters on the query and value
projections of every visual attention block, A Kaiming-uniform, B zero, added unscaled: W x + B A x).

LoRA is a parametrization (`torch.nn.utils.parametrize`) of the projection weight, W -> W + (alpha / rank) B A on the
query and value rows, not peft: open_clip's ViT attention is `nn.MultiheadAttention` (or its own `Attention`) with one
fused `in_proj_weight` (3d x d) for query, key and value, and peft adapts such a module as a whole (its
MultiheadAttention layer, huggingface/peft#1324, puts one low-rank update on all of in_proj, keys included, and on
out_proj), so it cannot give the code's query-and-value-only adapters; the toy ResNet's attention pool (separate
q/k/v `nn.Linear`, called through `F.multi_head_attention_forward` with their weights) takes the same parametrization.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
import torch
from torch import nn
from torch.nn.utils import parametrize

from vlbench.finetune import FinetuneError


SCALE_PARAMETERS = ("logit_scale", "logit_bias")  # never trained (FewTrans freezes `"scale" in name` in every mode)
LORA_BLOCKS = (0, 2)  # of a fused (query, key, value) projection: the query and value rows (`lora_ViT`: proj_q, proj_v)
SEPARATE_PROJECTIONS = ("q_proj", "v_proj")  # the attention pool's own query and value nn.Linear (ModifiedResNet)


def tower(name: str) -> str:
    """`visual`, `scale` or `text` (every other parameter of a CLIP: token and positional embeddings, text
    transformer, ln_final, text_projection; CustomTextCLIP's `text.*`)."""
    if name.startswith("visual."):
        return "visual"
    return "scale" if name in SCALE_PARAMETERS else "text"


def is_bias(name: str) -> bool:
    """The code's `"bias" in name` on the visual model: biases of linear, convolution, attention (`in_proj_bias`) and
    normalisation layers (LayerNorm, BatchNorm)."""
    return "bias" in name.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class Selection:
    trains: Callable[[str], bool]  # which of the model's own parameters train
    lora: bool = False  # add LoRA adapters to the visual attention's query and value projections


SELECTIONS: dict[str, Selection] = {
    "visual": Selection(lambda n: tower(n) == "visual"),
    "text": Selection(lambda n: tower(n) == "text"),
    "all": Selection(lambda n: tower(n) != "scale"),
    "bitfit": Selection(lambda n: tower(n) == "visual" and is_bias(n)),
    "lora": Selection(lambda n: False, lora=True),
}


class LoraDelta(nn.Module):
    """A parametrization W -> W + scale * [B_i A_i on row block i] of a weight made of `blocks` equal row blocks
    (1 for a plain projection, 3 for a fused query/key/value one); blocks not in `adapted` are left as they are."""

    def __init__(self, weight: torch.Tensor, blocks: int, adapted: tuple[int, ...], rank: int, scale: float,
                 generator: torch.Generator | None):
        super().__init__()
        rows, cols = weight.shape[0] // blocks, weight.shape[1]
        self.blocks, self.adapted, self.scale = blocks, adapted, scale
        # nn.Linear's own init, as lora_ViT's reset_parameters, drawn on the CPU (where `generator` lives) and then
        # moved: the same A on every device
        a_init = [nn.init.kaiming_uniform_(torch.empty(rank, cols, dtype=weight.dtype), a=math.sqrt(5),
                                           generator=generator) for _ in adapted]
        self.a = nn.ParameterList(nn.Parameter(a.to(weight.device)) for a in a_init)
        self.b = nn.ParameterList(nn.Parameter(torch.zeros(rows, rank, device=weight.device, dtype=weight.dtype))
                                  for _ in adapted)

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        rows = weight.shape[0] // self.blocks
        zero = weight.new_zeros(rows, weight.shape[1])
        delta = {i: self.scale * (b @ a) for i, a, b in zip(self.adapted, self.a, self.b)}
        return weight + torch.cat([delta.get(i, zero) for i in range(self.blocks)])


def lora_targets(visual: nn.Module) -> list[tuple[nn.Module, str, int, tuple[int, ...]]]:
    """(module, weight name, row blocks, adapted blocks) of every query and value projection of the visual tower:
    fused `in_proj_weight`s (nn.MultiheadAttention, open_clip's Attention) and the attention pool's q_proj / v_proj."""
    out = []
    for module in visual.modules():
        fused = getattr(module, "in_proj_weight", None)
        if isinstance(fused, nn.Parameter) and fused.shape[0] == 3 * fused.shape[1]:
            out.append((module, "in_proj_weight", 3, LORA_BLOCKS))
        out += [(getattr(module, p), "weight", 1, (0,)) for p in SEPARATE_PROJECTIONS
                if isinstance(getattr(module, p, None), nn.Linear)]
    return out


def add_lora(model: nn.Module, rank: int, alpha: float, generator: torch.Generator | None = None) -> list[nn.Parameter]:
    """Parametrize every visual query and value projection with a rank-`rank` update scaled by alpha / rank; returns
    the adapters' parameters (A before B, target by target)."""
    targets = lora_targets(model.visual)
    if not targets:
        raise FinetuneError(f"finetune.fewtrans_episodic.lora: the visual tower of {type(model).__name__} has no attention "
                            "projection to adapt (no in_proj_weight, q_proj or v_proj)")
    params = []
    for module, name, blocks, adapted in targets:
        delta = LoraDelta(getattr(module, name), blocks, adapted, rank, alpha / rank, generator)
        parametrize.register_parametrization(module, name, delta)
        params += [*delta.a, *delta.b]
    return params


def prepare(model: nn.Module, selection: str, rank: int = 4, alpha: float = 4.0,
            generator: torch.Generator | None = None) -> tuple[nn.Module, int]:
    """(model, trainable parameter count): in place, every parameter outside `selection` frozen, adapters added and
    trainable for `lora`. The model's own frozen parameters keep their values bit for bit while it trains."""
    if selection not in SELECTIONS:
        raise FinetuneError(f"unknown fine-tuning selection {selection!r}; known: {sorted(SELECTIONS)}")
    rule = SELECTIONS[selection]
    for name, param in model.named_parameters():
        param.requires_grad_(rule.trains(name))
    if rule.lora:
        for param in add_lora(model, rank, alpha, generator):
            param.requires_grad_(True)
    return model, trainable_count(model)


def trainable_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def trainable_names(model: nn.Module) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]
