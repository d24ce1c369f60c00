"""The image tower's last projection, and the image features before it ("pre-projection features").

ELEVATER's Language-1P head (the toolkit's `MERGE_ENCODER_AND_HEAD_PROJ`) trains on what the image tower computes
before its projection into the joint space, with the projection merged into the head. Two open_clip towers have one:

- `VisionTransformer`: `pooled @ visual.proj` (no bias). The pre-projection feature is `pooled`, i.e. what the tower
  returns with `proj` set to None (for CLIP's ViTs the ln_post'ed class token), exactly what the toolkit trains on
  after it sets `backbone.visual.proj = None`.
- `ModifiedResNet`: the attention pool's output projection `attnpool.c_proj` (weight and bias) is applied inside
  `F.multi_head_attention_forward`. The pre-projection feature is the attention output before it, computed by the same
  forward with `c_proj` swapped for an identity map (exact: x * 1 + 0). The toolkit has no 1P head for these (OpenAI's
  ModifiedResNet has no `visual.proj`); here the affine map is merged as a whole (see docs/protocols.md).

Any other tower (timm, Hugging Face, attentional poolers without `proj`) is refused with a `ProjectionError`.
`PreProjectionEncoder(model)(images)` returns [projected | pre-projection] side by side; the projected part is the
tower's own last operation on the pre-projection part, so it equals `model.encode_image(images)`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from vlbench.errors import VlbenchError

KINDS = ("visual.proj", "visual.attnpool.c_proj")
_MHA_SIGNATURE = inspect.signature(F.multi_head_attention_forward)


class ProjectionError(VlbenchError):
    """The model's image tower has no projection that pre-projection features can be taken before."""


@dataclass
class VisualProjection:
    """projected = pre @ weight.T + bias, torch.nn.Linear's layout: weight [d_out, d_pre], bias [d_out]."""

    weight: np.ndarray
    bias: np.ndarray
    kind: str  # one of KINDS: where the projection sits in the tower

    @property
    def dims(self) -> tuple[int, int]:
        """(d_pre, d_out)."""
        return self.weight.shape[1], self.weight.shape[0]


def _tower_kind(model: torch.nn.Module, name: str) -> str:
    from open_clip.modified_resnet import ModifiedResNet
    from open_clip.transformer import VisionTransformer

    visual = getattr(model, "visual", None)
    if isinstance(visual, VisionTransformer) and isinstance(getattr(visual, "proj", None), torch.Tensor):
        return KINDS[0]
    if isinstance(visual, ModifiedResNet):
        return KINDS[1]
    raise ProjectionError(
        f"model {name!r}: pre-projection image features are defined for open_clip's VisionTransformer with a "
        f"`proj` and ModifiedResNet (attnpool.c_proj); its image tower is {type(visual).__name__}"
        f"{' without proj' if isinstance(visual, VisionTransformer) else ''}. Set embed.pre_projection: false "
        f"(and leave language_1p out of adapt.elevater.heads)")


def visual_projection(model: torch.nn.Module, name: str = "?") -> VisualProjection:
    """The tower's projection as float32 arrays; `name` (the model's slug) goes into errors."""
    kind = _tower_kind(model, name)
    if kind == KINDS[0]:
        proj = model.visual.proj.detach().float().cpu().numpy()  # [d_pre, d_out]: pooled @ proj
        return VisualProjection(np.ascontiguousarray(proj.T), np.zeros(proj.shape[1], np.float32), kind)
    linear = model.visual.attnpool.c_proj
    bias = linear.bias if linear.bias is not None else torch.zeros(linear.out_features)
    return VisualProjection(linear.weight.detach().float().cpu().numpy(), bias.detach().float().cpu().numpy(), kind)


class PreProjectionEncoder:
    """`encoder(images)` -> [n, d_out + d_pre]: the projected embedding (as `encode_image` gives it) and, after it, the
    pre-projection features. The model is changed only for the duration of a call (its projection taken out)."""

    def __init__(self, model: torch.nn.Module, name: str = "?"):
        self.model, self.name, self.kind = model, name, _tower_kind(model, name)

    @property
    def projection(self) -> VisualProjection:
        return visual_projection(self.model, self.name)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if self.kind == KINDS[0]:
            return self._vit(images)
        split = _SplitOutProjection(self.model.visual.attnpool.c_proj)
        with split:
            projected = self.model.encode_image(images)
        if split.pre is None:
            raise ProjectionError(f"model {self.name!r}: its ModifiedResNet's attention pool did not call "
                                  "F.multi_head_attention_forward with attnpool.c_proj: this open_clip version is not "
                                  "supported for pre-projection features; set embed.pre_projection: false")
        return torch.cat([projected.float(), split.pre.float()], dim=1)

    def _vit(self, images: torch.Tensor) -> torch.Tensor:
        visual = self.model.visual
        proj, visual.proj = visual.proj, None
        try:
            pre = self.model.encode_image(images)
        finally:
            visual.proj = proj
        return torch.cat([(pre @ proj).float(), pre.float()], dim=1)  # the tower's own `pooled @ self.proj`


class _SplitOutProjection(TorchFunctionMode):
    """While active, the attention pool's `F.multi_head_attention_forward` (the call whose out-projection is `linear`)
    runs with an identity out-projection (exact: x * 1 + 0), keeps the class token's output as `pre`, and applies
    `linear` afterwards to every token as torch does ([tokens * batch, d] in one product), so the tower's output is
    unchanged bit for bit."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.linear, self.pre = linear, None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.multi_head_attention_forward:
            return func(*args, **kwargs)
        named = _MHA_SIGNATURE.bind(*args, **kwargs).arguments  # handle_torch_function passes most of them by position
        weight = self.linear.weight
        if named["out_proj_weight"] is not weight:
            return func(*args, **kwargs)
        eye = torch.eye(weight.shape[1], dtype=weight.dtype, device=weight.device)
        out, attn = func(**{**named, "out_proj_weight": eye, "out_proj_bias": torch.zeros_like(eye[0])})
        tokens, batch, dim = out.shape
        self.pre = out[0]
        projected = F.linear(out.reshape(tokens * batch, dim), weight, self.linear.bias)
        return projected.view(tokens, batch, -1), attn
