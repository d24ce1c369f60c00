"""How the embed stage turns a prepared image's bytes into the model's input: the decoders of `embed.decode`.

- `pil` (the default): `decode_rgb` (the whole image, Pillow, vlbench.datasets.images' mode rules), then the model's
  own transform. What open_clip, CLIP_benchmark and the papers do.
- `pil_draft`: the same, but a JPEG at least twice the size of the model's first Resize in each dimension is decoded
  at 1/2, 1/4 or 1/8 scale in the DCT domain (Pillow's `Image.draft`, libjpeg's scaled IDCT), never below that
  size, and the transform resizes from there. Faster for large photos; the pixels differ from `pil` wherever the
  scale is below 1 (docs/benchmarks.md, "Decoding options"), so it is not the default.
- `torchvision`: the batch's JPEGs are decoded by one `torchvision.io.decode_jpeg` call on a list, on the model's
  device (nvJPEG's batched decoder on CUDA, libjpeg-turbo on the CPU); the images of each decoded size are stacked and
  resized, cropped (the model's own Resize and CenterCrop, or the entry's squash, applied to tensors) and normalised
  there as one tensor, so no Python runs per image on the device's side. torch's bicubic kernel (a = -0.75) is not
  Pillow's (a = -0.5), so pixels differ from `pil`; nvJPEG's IDCT may differ from libjpeg-turbo's, so the fingerprint
  records the device type too (`decode_device`). What a device decoder would not decode as Pillow does (anything but
  a sequential 8-bit three-component JPEG: PNG and other formats, progressive, 12-bit, greyscale, CMYK, RGB-coded) is
  decoded by `decode_rgb` in the workers instead and joins the batch as a uint8 tensor; the stage's log counts them.

- `dali`: NVIDIA DALI (the optional `nvidia-dali-cuda130` wheel, extra `dali`): the batch's JPEGs fed to one DALI
  pipeline that decodes them (`fn.decoders.image`: "mixed", nvJPEG with the hardware JPEG engines where the GPU has
  them, on CUDA; libjpeg-turbo on the CPU), resizes them with the model's Resize translated to DALI (shorter side or
  squash, its interpolation, antialiased) and crops the centre; torch normalises. DALI's resampling and crop
  rounding are its own, so pixels differ from both `pil` and `torchvision`; the images a device decoder leaves to the
  CPU are decoded by Pillow and resized by torch, as for `torchvision`. A transform step DALI's translation does not
  know is refused by name.

Every decoder but `pil` changes the model's input: `embed.decode` is a param, the image features' fingerprint records
`decode`, and readers demand it, so features decoded one way are never read as another's.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

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
TENSOR_CROPS = ("BorderCrop",)  # vlbench.embed's crops that also crop a tensor
# JPEG start-of-frame markers: 0xC0 baseline and 0xC1 extended sequential (Huffman) are what device decoders take
SOF_MARKERS = {0xC0: None, 0xC1: None, 0xC2: "progressive", 0xC3: "lossless",
               **dict.fromkeys((0xC5, 0xC6, 0xC7), "hierarchical"),
               **dict.fromkeys((0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF), "arithmetic coding")}
STANDALONE_MARKERS = {0x01, *range(0xD0, 0xD9)}  # TEM, RSTn, SOI: no length field


class DecodeOptionError(VlbenchError):
    """An unknown `embed.decode`, or one the model's transform or the device cannot run."""


@dataclass(frozen=True)
class Decoder:
    """`worker`: what a DataLoader worker runs on an image's bytes; `finish`: what the model's device runs on the
    collated batch (a stacked tensor, or a list where `stack` is False)."""

    worker: Callable[[bytes], Any]
    finish: Callable[[Any], torch.Tensor]
    stack: bool
    counts: Counter = field(default_factory=Counter)  # a device decoder's: images per where (and why) decoded

    def log_line(self, dataset: str, split: str) -> str | None:
        """The stage's log line on the images a device decoder left to the CPU, by reason; None if none were."""
        cpu = {k.removeprefix("cpu: "): n for k, n in self.counts.items() if k.startswith("cpu: ")}
        if not cpu:
            return None
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(cpu.items()))
        return (f"embed {dataset}/{split}: {sum(cpu.values())} of {sum(self.counts.values())} images decoded on the "
                f"CPU by Pillow, not on the device ({reasons})")


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
        if isinstance(step, (Resize, CenterCrop)) or type(step).__name__ in TENSOR_CROPS:
            geometric.append(step)
        elif type(step).__name__ not in PASS_THROUGH and getattr(step, "__name__", "") not in PASS_THROUGH:
            unknown.append(type(step).__name__)
    if unknown:
        raise DecodeOptionError(f"model {model!r}: decode 'torchvision' cannot run the transform step(s) {unknown} "
                                f"on tensors; use embed.decode: pil")
    return geometric, steps[-1]


class Fallback(NamedTuple):
    """A device decoder's worker output for an image it leaves to the CPU: `decode_rgb`'s pixels (uint8 CHW) and why."""

    image: torch.Tensor
    reason: str


def device_refusal(data: bytes | None) -> str | None:
    """None where `data` is a JPEG that device decoders decode as Pillow does (sequential Huffman, SOF0 or SOF1, 8-bit,
    three components in YCbCr); else why not: 'not a JPEG', 'progressive', '12-bit', 'greyscale', 'CMYK', ... Reads
    the markers up to the frame header only."""
    if not data or data[:3] != JPEG_MAGIC:
        return "not a JPEG"
    i, rgb_coded = 2, False
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return "malformed JPEG"
        marker = data[i + 1]
        if marker == 0xFF or marker in STANDALONE_MARKERS:
            i += 1 if marker == 0xFF else 2
            continue
        length = int.from_bytes(data[i + 2:i + 4], "big")
        if marker == 0xEE and data[i + 4:i + 9] == b"Adobe" and length >= 12:
            rgb_coded = data[i + 15] == 0  # Adobe transform 0: components not in YCbCr
        if marker in SOF_MARKERS:
            if SOF_MARKERS[marker]:
                return SOF_MARKERS[marker]
            precision, components = data[i + 4], data[i + 9]
            if precision != 8:
                return f"{precision}-bit"
            if components != 3:
                return {1: "greyscale", 4: "CMYK"}.get(components, f"{components} components")
            return "RGB-coded (Adobe)" if rgb_coded else None
        if marker == 0xDA:
            break
        i += 2 + length
    return "malformed JPEG"


def encoded_or_decoded(data: bytes | None) -> torch.Tensor | Fallback:
    """A worker's part of a device decoder: a JPEG the device decodes as its bytes (a 1-D uint8 tensor), any other
    image decoded by `decode_rgb` (a uint8 CHW tensor) with the reason (`device_refusal`)."""
    reason = device_refusal(data)
    if reason is None:
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return Fallback(PILToTensor()(decode_rgb(data)), reason)


def device_decode(items: list[torch.Tensor | Fallback], device: torch.device) -> list[torch.Tensor]:
    """Decode the batch's JPEGs (1-D byte tensors) on `device` in one call; the images decoded on the CPU are moved
    there."""
    jpegs = [i for i, x in enumerate(items) if not isinstance(x, Fallback)]
    out = [x.image.to(device, non_blocking=True) if isinstance(x, Fallback) else x for x in items]
    if jpegs:
        try:
            decoded = decode_jpeg([items[i] for i in jpegs], mode=ImageReadMode.RGB, device=device)
        except RuntimeError as err:
            raise ImageDecodeError(f"torchvision.io.decode_jpeg on {device.type} failed on this batch: {err}") from err
        for i, image in zip(jpegs, decoded):
            out[i] = image
    return out


def by_size(images: list[torch.Tensor], steps: list[Callable]) -> list[torch.Tensor]:
    """`steps` applied to each image, once per distinct size on the stack of the images of that size (a batch of
    one size, the usual case, is one call per step); in the images' order."""
    out: list[torch.Tensor | None] = [None] * len(images)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, image in enumerate(images):
        groups.setdefault(tuple(image.shape), []).append(i)
    for indices in groups.values():
        batch = torch.stack([images[i] for i in indices])
        for step in steps:
            batch = step(batch)
        for i, image in zip(indices, batch.unbind(0)):
            out[i] = image
    return out


DALI_INTERPOLATION = {"bicubic": "INTERP_CUBIC", "bilinear": "INTERP_LINEAR", "nearest": "INTERP_NN"}


def dali_geometry(geometric: list[Callable], model: str = "?") -> list[tuple[str, dict]]:
    """The model's Resize and CenterCrop as DALI operators and their arguments: ("resize", {...}), ("crop", {...})."""
    from nvidia.dali import types

    ops = []
    for step in geometric:
        if isinstance(step, Resize) and step.max_size is None:
            size = list(step.size) if isinstance(step.size, (list, tuple)) else [step.size]
            if step.interpolation.value not in DALI_INTERPOLATION:
                break
            ops.append(("resize", {"size": size, "antialias": bool(step.antialias),
                                   "interp_type": getattr(types, DALI_INTERPOLATION[step.interpolation.value])}))
        elif isinstance(step, CenterCrop):
            ops.append(("crop", {"crop": tuple(step.size)}))
        else:
            break
    else:
        return ops
    raise DecodeOptionError(f"model {model!r}: decode 'dali' cannot run the transform step {step!r} in DALI; use "
                            f"embed.decode: torchvision or pil")


def torchvision_resized(h, w, size: list[int]):
    """(h, w) after torchvision's Resize(size), as DALI graph arithmetic on float64 (h, w): a squash to (h, w), or the
    shorter side to size[0] and the longer to int(size * long / short) (torchvision's _compute_resized_output_size)."""
    from nvidia.dali import math as dmath, fn, types

    if len(size) == 2:
        return float(size[0]), float(size[1])
    s = float(size[0])
    w_short = fn.cast(w <= h, dtype=types.FLOAT64)
    long = dmath.floor(s * dmath.max(h, w) / dmath.min(h, w))
    return (1 - w_short) * s + w_short * long, w_short * s + (1 - w_short) * long


def torchvision_crop_pos(side, crop: int):
    """DALI's relative crop position that gives torchvision's CenterCrop offset int(round((side - crop) / 2)) (halves
    to even); a quarter pixel past it, so that DALI's rounding of pos * (side - crop) lands on it."""
    from nvidia.dali import math as dmath, fn, types

    d = side - float(crop)
    half = dmath.floor(d / 2)
    odd = d - 2 * half  # 1 where (side - crop) / 2 ends in .5
    offset = half + odd * (half - 2 * dmath.floor(half / 2))
    return fn.cast(dmath.min((offset + 0.25) / dmath.max(d, 1.0), 1.0), dtype=types.FLOAT)


class DaliPipeline:
    """A DALI pipeline of the model's geometry on `device`, fed a batch of JPEG byte arrays: uint8 NCHW on `device`.
    Built at the first batch, rebuilt for a larger one."""

    def __init__(self, ops: list[tuple[str, dict]], device: torch.device):
        self.ops, self.device, self.pipe, self.capacity = ops, device, None, 0

    def build(self, batch_size: int) -> None:
        from nvidia.dali import fn, pipeline_def, types

        cuda = self.device.type == "cuda"
        threads = max(1, min(8, len(os.sched_getaffinity(0)) - 1))

        @pipeline_def(batch_size=batch_size, num_threads=threads, exec_async=False, exec_pipelined=False,
                      device_id=(self.device.index or 0) if cuda else None, prefetch_queue_depth=1)
        def pipeline():
            jpegs = fn.external_source(name="jpegs", dtype=types.UINT8)
            images = fn.decoders.image(jpegs, device="mixed" if cuda else "cpu", output_type=types.RGB)
            shape = fn.cast(fn.peek_image_shape(jpegs), dtype=types.FLOAT64)
            h, w = shape[0], shape[1]
            for op, args in self.ops:
                if op == "resize":
                    h, w = torchvision_resized(h, w, args["size"])
                    images = fn.resize(images, resize_x=fn.cast(w, dtype=types.FLOAT),
                                       resize_y=fn.cast(h, dtype=types.FLOAT),
                                       **{k: v for k, v in args.items() if k != "size"})
                else:
                    (ch, cw) = args["crop"]
                    images = fn.crop(images, crop=(ch, cw), crop_pos_y=torchvision_crop_pos(h, ch),
                                     crop_pos_x=torchvision_crop_pos(w, cw))
                    h, w = ch, cw
            return fn.transpose(images, perm=[2, 0, 1])

        self.pipe, self.capacity = pipeline(), batch_size
        self.pipe.build()

    def __call__(self, jpegs: list[torch.Tensor]) -> torch.Tensor:
        if len(jpegs) > self.capacity:
            self.build(len(jpegs))
        self.pipe.feed_input("jpegs", [x.numpy() for x in jpegs])
        (out,) = self.pipe.run()
        if self.device.type != "cuda":
            return torch.from_numpy(out.as_array())
        from nvidia.dali.plugin.pytorch import feed_ndarray

        dense = out.as_tensor()
        batch = torch.empty(dense.shape(), dtype=torch.uint8, device=self.device)
        feed_ndarray(dense, batch, cuda_stream=torch.cuda.current_stream(self.device))
        return batch


def dali_finish(preprocess: Callable, device: torch.device, model: str = "?",
                counts: Counter | None = None) -> Callable[[list], torch.Tensor]:
    geometric, normalize = tensor_steps(preprocess, model)
    run = DaliPipeline(dali_geometry(geometric, model), device)
    mean = torch.tensor(normalize.mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
    std = torch.tensor(normalize.std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
    counts = Counter() if counts is None else counts

    def finish(items: list[torch.Tensor | Fallback]) -> torch.Tensor:
        counts.update(f"cpu: {x.reason}" if isinstance(x, Fallback) else "device" for x in items)
        jpegs = [i for i, x in enumerate(items) if not isinstance(x, Fallback)]
        others = [i for i, x in enumerate(items) if isinstance(x, Fallback)]
        if not others:  # the usual batch: DALI's output is the batch
            return run(items).to(device).float().div_(255).sub_(mean).div_(std)
        out: list[torch.Tensor | None] = [None] * len(items)
        if jpegs:
            for i, image in zip(jpegs, run([items[i] for i in jpegs]).to(device).unbind(0)):
                out[i] = image
        if others:
            resized = by_size([items[i].image.to(device, non_blocking=True) for i in others], geometric)
            for i, image in zip(others, resized):
                out[i] = image
        return torch.stack(out).float().div_(255).sub_(mean).div_(std)

    return finish


def torchvision_finish(preprocess: Callable, device: torch.device, model: str = "?",
                       counts: Counter | None = None) -> Callable[[list], torch.Tensor]:
    geometric, normalize = tensor_steps(preprocess, model)
    mean = torch.tensor(normalize.mean, dtype=torch.float32, device=device).view(1, -1, 1, 1)
    std = torch.tensor(normalize.std, dtype=torch.float32, device=device).view(1, -1, 1, 1)
    counts = Counter() if counts is None else counts

    def finish(items: list[torch.Tensor | Fallback]) -> torch.Tensor:
        counts.update(f"cpu: {x.reason}" if isinstance(x, Fallback) else "device" for x in items)
        images = by_size(device_decode(items, device), geometric)
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
    counts: Counter = Counter()
    return Decoder(encoded_or_decoded, torchvision_finish(preprocess, device, model, counts), False, counts)


def dali_decoder(preprocess: Callable, device: torch.device, model: str, split: tuple[Callable, Callable]) -> Decoder:
    try:
        import nvidia.dali  # noqa: F401
    except ImportError as err:
        raise DecodeOptionError("embed.decode 'dali' needs NVIDIA DALI: pip install 'vlbench[dali]' "
                                f"(nvidia-dali-cuda130); {err}") from err
    counts: Counter = Counter()
    return Decoder(encoded_or_decoded, dali_finish(preprocess, device, model, counts), False, counts)


DECODERS: dict[str, Callable[..., Decoder]] = {
    "pil": pil_decoder,
    "pil_draft": pil_draft_decoder,
    "torchvision": torchvision_decoder,
    "dali": dali_decoder,
}
DEVICE_DECODERS = ("torchvision", "dali")  # decode on the model's device: the fingerprint records which


def decoder(name: str, preprocess: Callable, device: torch.device, model: str = "?",
            split: tuple[Callable, Callable] | None = None) -> Decoder:
    """The decoder `embed.decode` names, for the model's transform on `device`. `split`: (what workers run on a
    decoded image, what the device runs on the batch), `vlbench.embed.worker_preprocess`'s choice for the Pillow
    decoders (default: the whole transform in the workers); `torchvision` runs its own split."""
    if name not in DECODERS:
        raise DecodeOptionError(f"embed.decode {name!r} is not one of {sorted(DECODERS)} (params.yaml: embed.decode)")
    return DECODERS[name](preprocess, device, model, split or (preprocess, unchanged))


def decode_fingerprint(name: str, device: torch.device) -> dict[str, str]:
    """What image features record of their decoder: `decode` (which readers demand) and, for the device decoders
    (`torchvision`, `dali`), the device type that decoded (nvJPEG or libjpeg-turbo; readers do not demand it, as they
    do not demand precision)."""
    if name not in DECODERS:
        raise DecodeOptionError(f"embed.decode {name!r} is not one of {sorted(DECODERS)} (params.yaml: embed.decode)")
    return {"decode": name, **({"decode_device": device.type} if name in DEVICE_DECODERS else {})}
