"""How the embed stage turns a prepared image's bytes into the model's input: the decoders of `embed.decode`.

- `pil` (the default): `decode_rgb` (the whole image, Pillow, vlbench.datasets.images' mode rules), then the model's
  own transform. What open_clip, CLIP_benchmark and the papers do.
- `pil_draft`: the same, but a JPEG at least twice the size of the model's first Resize in each dimension is decoded
  at 1/2, 1/4 or 1/8 scale in the DCT domain (Pillow's `Image.draft`, libjpeg's scaled IDCT), never below that
  size, and the transform resizes from there. Faster for large photos; the pixels differ from `pil` wherever the
  scale is below 1 (docs/benchmarks.md, "Decoding options"), so it is not the default.
- `torchvision`: JPEGs are decoded by `torchvision.io.decode_jpeg` on the model's device (nvJPEG on CUDA,
  libjpeg-turbo on the CPU) in batches, then resized, cropped and normalised there by the model's own Resize and
  CenterCrop applied to tensors (other formats are decoded by Pillow in the workers and join the batch as uint8
  tensors). torch's bicubic kernel (a = -0.75) is not Pillow's (a = -0.5), so pixels differ from `pil`; nvJPEG's IDCT
  may differ from libjpeg-turbo's, so the fingerprint records the device type too (`decode_device`).

Every decoder but `pil` changes the model's input: `embed.decode` is a param, the image features' fingerprint records
`decode`, and readers demand it, so features decoded one way are never read as another's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.transforms import CenterCrop, Normalize, PILToTensor, Resize

from vlbench.datasets.images import ImageDecodeError, decode_rgb, open_image, to_rgb
from vlbench.errors import VlbenchError

DEFAULT_DECODE = "pil"
JPEG_FORMATS = ("JPEG", "MPO")
JPEG_MAGIC = b"\xff\xd8\xff"
PASS_THROUGH = ("MaybeConvertMode", "_convert_to_rgb", "ToTensor", "MaybeToTensor")  # no-ops on an RGB uint8 tensor


class DecodeOptionError(VlbenchError):
    """An unknown `embed.decode`, or one the model's transform or the device cannot run."""


@dataclass(frozen=True)
class Decoder:
    """`worker`: what a DataLoader worker runs on an image's bytes; `finish`: what the model's device runs on the
    collated batch (a stacked tensor, or a list where `stack` is False)."""

    worker: Callable[[bytes], Any]
    finish: Callable[[Any], torch.Tensor]
    stack: bool


# ------------------------------------------------------------------------------------------------ pil_draft


def first_resize(preprocess: Callable, model: str = "?") -> tuple[int, int]:
    """The (width, height) the model's first Resize brings an image to at least: (s, s) for a shortest-side resize
    to s (a bound on both sides), (w, h) for a squash to (h, w)."""
    for step in getattr(preprocess, "transforms", []):
        if isinstance(step, Resize):
            size = list(step.size) if isinstance(step.size, (list, tuple)) else [step.size]
            return (size[0], size[0]) if len(size) == 1 else (size[1], size[0])
    raise DecodeOptionError(f"model {model!r}: decode 'pil_draft' needs a Resize in the model's transform "
                            f"(steps: {[type(s).__name__ for s in getattr(preprocess, 'transforms', [])]})")


def draft_scale(image_size: tuple[int, int], target: tuple[int, int]) -> int:
    """The DCT scale Pillow's `draft` picks for a JPEG of `image_size` (w, h) asked for at least `target` (w, h):
    the largest of 8, 4, 2, 1 that both sides divide into at least their target (JpegImagePlugin.draft)."""
    ratio = min(image_size[0] // target[0], image_size[1] // target[1])
    return next((s for s in (8, 4, 2) if ratio >= s), 1)


def decode_rgb_draft(data: bytes | None, target: tuple[int, int]) -> Image.Image:
    """`decode_rgb`, with a JPEG decoded at the smallest DCT scale that keeps both sides at least `target` (w, h)."""
    with open_image(data) as img:
        if img.format in JPEG_FORMATS:
            img.draft(img.mode, target)
        return to_rgb(img)


# ---------------------------------------------------------------------------------------------- torchvision


def tensor_steps(preprocess: Callable, model: str = "?") -> tuple[list[torch.nn.Module], Normalize]:
    """The model's transform as steps that run on a uint8 CHW tensor (its Resize and CenterCrop, which torchvision
    applies to tensors with torch's kernels) and its final Normalize."""
    steps = list(getattr(preprocess, "transforms", []))
    if not steps or not isinstance(steps[-1], Normalize):
        raise DecodeOptionError(f"model {model!r}: decode 'torchvision' needs a transform that ends in Normalize")
    geometric, unknown = [], []
    for step in steps[:-1]:
        if isinstance(step, (Resize, CenterCrop)):
            geometric.append(step)
        elif type(step).__name__ not in PASS_THROUGH and getattr(step, "__name__", "") not in PASS_THROUGH:
            unknown.append(type(step).__name__)
    if unknown:
        raise DecodeOptionError(f"model {model!r}: decode 'torchvision' cannot run the transform step(s) {unknown} "
                                f"on tensors; use embed.decode: pil")
    return geometric, steps[-1]


def encoded_or_decoded(data: bytes | None) -> torch.Tensor:
    """A worker's part of `torchvision`: a JPEG's bytes as a 1-D uint8 tensor (decoded on the device), any other
    image decoded by `decode_rgb` to a uint8 CHW tensor."""
    if data and data[:3] == JPEG_MAGIC:
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return PILToTensor()(decode_rgb(data))


def device_decode(items: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Decode the batch's JPEGs (1-D byte tensors) on `device` in one call; decoded images are moved there."""
    jpegs = [i for i, x in enumerate(items) if x.ndim == 1]
    out = [x.to(device) for x in items]
    if jpegs:
        try:
            decoded = decode_jpeg([items[i] for i in jpegs], mode=ImageReadMode.RGB, device=device)
        except RuntimeError as err:
            raise ImageDecodeError(f"torchvision.io.decode_jpeg on {device.type} failed on this batch: {err}") from err
        for i, image in zip(jpegs, decoded):
            out[i] = image
    return out


def torchvision_finish(preprocess: Callable, device: torch.device, model: str = "?") -> Callable[[list], torch.Tensor]:
    geometric, normalize = tensor_steps(preprocess, model)
    mean = torch.tensor(normalize.mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
    std = torch.tensor(normalize.std, dtype=torch.float32, device=device).view(1, -1, 1, 1)

    def finish(items: list[torch.Tensor]) -> torch.Tensor:
        images = []
        for image in device_decode(items, device):
            for step in geometric:
                image = step(image)
            images.append(image)
        return torch.stack(images).float().div_(255).sub_(mean).div_(std)

    return finish


# ------------------------------------------------------------------------------------------------- the table


def unchanged(batch: torch.Tensor) -> torch.Tensor:
    return batch


def _pil_worker(transform: Callable, data: bytes | None) -> Any:
    return transform(decode_rgb(data))


def _draft_worker(transform: Callable, target: tuple[int, int], data: bytes | None) -> Any:
    return transform(decode_rgb_draft(data, target))


def pil_decoder(preprocess: Callable, device: torch.device, model: str, split: tuple[Callable, Callable]) -> Decoder:
    transform, finish = split
    return Decoder(partial(_pil_worker, transform), finish, True)


def pil_draft_decoder(preprocess: Callable, device: torch.device, model: str, split: tuple[Callable, Callable]) -> Decoder:
    transform, finish = split
    return Decoder(partial(_draft_worker, transform, first_resize(preprocess, model)), finish, True)


def torchvision_decoder(preprocess: Callable, device: torch.device, model: str, split: tuple[Callable, Callable]) -> Decoder:
    return Decoder(encoded_or_decoded, torchvision_finish(preprocess, device, model), False)


DECODERS: dict[str, Callable[..., Decoder]] = {
    "pil": pil_decoder,
    "pil_draft": pil_draft_decoder,
    "torchvision": torchvision_decoder,
}


def decoder(name: str, preprocess: Callable, device: torch.device, model: str = "?",
            split: tuple[Callable, Callable] | None = None) -> Decoder:
    """The decoder `embed.decode` names, for the model's transform on `device`. `split`: (what workers run on a
    decoded image, what the device runs on the batch), `vlbench.embed.worker_preprocess`'s choice for the Pillow
    decoders (default: the whole transform in the workers); `torchvision` runs its own split."""
    if name not in DECODERS:
        raise DecodeOptionError(f"embed.decode {name!r} is not one of {sorted(DECODERS)} (params.yaml: embed.decode)")
    return DECODERS[name](preprocess, device, model, split or (preprocess, unchanged))


def decode_fingerprint(name: str, device: torch.device) -> dict[str, str]:
    """What image features record of their decoder: `decode` (which readers demand) and, for `torchvision`, the
    device type that decoded (nvJPEG or libjpeg-turbo; readers do not demand it, as they do not demand precision)."""
    if name not in DECODERS:
        raise DecodeOptionError(f"embed.decode {name!r} is not one of {sorted(DECODERS)} (params.yaml: embed.decode)")
    return {"decode": name, **({"decode_device": device.type} if name == "torchvision" else {})}
