"""Encoded image bytes to 8-bit RGB: the one rule for every image vlbench embeds or trains on (`decode_rgb`), and
the check that `prepare` runs on every image of every source (`checked_rows`) (docs/datasets.md, "Image decoding").
Apart from `canonical.py` so that the stages that only read prepared data do not depend on how images decode.

- 8-bit modes (1, L, P, RGB, CMYK, YCbCr, LAB, HSV, RGBX): Pillow's `convert("RGB")`, as open_clip, torchvision's
  ImageFolder and CLIP_benchmark do; an RGB image comes out byte for byte as that call gives it.
- 16-bit greyscale (I;16 and its byte orders): the full 16-bit range to 8 bits, round(v / 257).
- 32-bit integer (I): Pillow's mode for the 16-bit sources it widens (16-bit PGM/PPM, signed 16-bit TIFF), so read
  on the same 16-bit scale; values outside 0..65535 have no scale to read them on and are refused.
- 32-bit float (F): read as 0..1 (the float convention of scikit-image and torchvision), round(v * 255); values
  outside 0..1, or not finite, are refused (Pillow's own float scale is 0..255: such an image is refused, never
  saturated).
- Transparency (an alpha band, or a transparent palette entry or colour key): composited on white,
  round(c·a/255 + 255·(1 − a/255)); opaque pixels keep their colour exactly.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterable, Iterator, Mapping

import numpy as np
from PIL import Image, ImageFile, UnidentifiedImageError

from vlbench.datasets.canonical import DatasetError
from vlbench.errors import VlbenchError

MAX_16 = 65535
MAX_CORRUPT_SHOWN = 20  # corrupt images named in one error; the rest are counted


class ImageDecodeError(VlbenchError):
    """Encoded bytes that cannot become an 8-bit RGB image; the message says why (callers name the file)."""


class LenientPillowError(VlbenchError):
    """Pillow is set, in this process, to accept truncated images: the image check would not see them."""


def decode_rgb(data: bytes | None) -> Image.Image:
    """Decode `data` whole and convert it to 8-bit RGB by the module's rules; raises ImageDecodeError (or
    Pillow's OSError/SyntaxError for a damaged file)."""
    with open_image(data) as img:
        return to_rgb(img)


def open_image(data: bytes | None) -> Image.Image:
    """Pillow's lazy open of `data`, with a readable message for no bytes and for bytes of no known format."""
    if data is None:
        raise ImageDecodeError("no image bytes")
    if not data:
        raise ImageDecodeError("empty file (0 bytes)")
    try:
        return Image.open(io.BytesIO(data))
    except UnidentifiedImageError as err:
        raise ImageDecodeError(f"not an image format Pillow reads ({len(data)} bytes, starting {data[:8]!r})") from err


def to_rgb(img: Image.Image) -> Image.Image:
    """Load `img` and convert it to 8-bit RGB by the module's rules."""
    img.load()
    if _transparent(img):
        return _on_white(img)
    return CONVERTERS.get(img.mode, _pillow_rgb)(img)


def checked_rows(name: str, split: str, rows: Iterable[dict], skip: bool, provenance: dict,
                 fix: str = "replace them", where: Mapping[str, str] | None = None) -> Iterator[dict]:
    """Rows whose `image` passes `image_problem`, as every source streams them into `write_dataset`.

    With `skip` a corrupt image is left out and its sample_id listed in provenance["skipped_corrupt"]; without it
    every corrupt image of the split is named (by `where[sample_id]`, its file, where given) in one error at the
    end, which says how to `fix` it (nothing is written: the dataset folder is atomic). provenance["counts"][split]
    gets the number of rows kept.
    """
    try:
        _require_strict_pillow()
    except LenientPillowError as err:
        raise DatasetError(f"dataset {name!r} split {split!r}: {err}") from err
    skipped = provenance.setdefault("skipped_corrupt", [])
    corrupt: list[str] = []
    count = 0
    for row in rows:
        problem = image_problem(row["image"])
        if problem:
            corrupt.append(f"{(where or {}).get(row['sample_id'], row['sample_id'])!r} ({problem})")
            skipped.append(row["sample_id"])
            continue
        count += 1
        yield row
    if corrupt and not skip:
        shown = "; ".join(corrupt[:MAX_CORRUPT_SHOWN])
        more = f"; and {len(corrupt) - MAX_CORRUPT_SHOWN} more" if len(corrupt) > MAX_CORRUPT_SHOWN else ""
        raise DatasetError(f"dataset {name!r} split {split!r}: {len(corrupt)} corrupt or truncated image(s): "
                           f"{shown}{more}; {fix}, or set skip_corrupt: true")
    if count == 0 and corrupt:
        raise DatasetError(f"dataset {name!r} split {split!r}: empty split, every image was corrupt and skipped")
    provenance.setdefault("counts", {})[split] = count


def image_problem(data: bytes | None) -> str | None:
    """Why these encoded bytes are not an image the embed stage can use, or None (`check_image`)."""
    try:
        check_image(data)
    except ImageDecodeError as err:
        return str(err)
    except LenientPillowError:
        raise
    except Exception as err:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError, ...
        return f"{type(err).__name__}: {err}"
    return None


def check_image(data: bytes | None) -> None:
    """Raise unless `data` is a whole, undamaged image that `decode_rgb` converts.

    `verify()` checks the container (PNG CRCs, headers). A JPEG is then decoded by `jpeg_damage`, which fails on
    truncated or damaged scans that Pillow decodes without a word; its modes (L, RGB, CMYK) always convert. Any
    other image is decoded whole (a truncated one raises) and converted by the mode rules, so an image the embed
    stage would refuse is refused here, naming its file.
    """
    _require_strict_pillow()
    with open_image(data) as img:
        img.verify()
    with open_image(data) as img:
        if img.format in ("JPEG", "MPO"):
            damage = jpeg_damage(data)
            if damage:
                raise ImageDecodeError(damage)
            return
        to_rgb(img)


def _require_strict_pillow() -> None:
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise LenientPillowError(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is True in this process (set by code it imported), so truncated "
            "images would load without an error; leave it False when preparing data")


# libjpeg warnings about metadata or about bytes between header segments: the pixels are unaffected.
_HEADER_MARKERS = frozenset([*range(0xE0, 0xF0), 0xFE, 0xDB, 0xDD,
                             *(m for m in range(0xC0, 0xD0) if m not in (0xC4, 0xC8, 0xCC))])
_HARMLESS = ("bad ICC marker", "Unknown Adobe color transform code", "unknown JFIF revision number")
_EXTRANEOUS = re.compile(r"extraneous bytes before marker 0x([0-9a-fA-F]{2})")
_DECODE_AS = {"Gray": "GRAY", "CMYK": "CMYK", "YCCK": "CMYK"}  # libjpeg converts only between these and RGB


def jpeg_damage(data: bytes) -> str | None:
    """Why libjpeg finds this JPEG's data damaged, or None.

    Pillow's decoder silences libjpeg's warnings ("Corrupt JPEG data: ...") and fills what it cannot decode with
    grey (Pillow issue 9106: no strict mode); simplejpeg's strict decode (libjpeg-turbo too) raises them. A warning
    about metadata or about padding between header segments is ignored: those pixels decode exactly.
    """
    import simplejpeg

    try:
        colorspace = simplejpeg.decode_jpeg_header(data, strict=False)[2]
        # min_height/min_width 1: decoded at 1/8 scale, which still reads and Huffman-decodes every byte of the scans
        simplejpeg.decode_jpeg(data, colorspace=_DECODE_AS.get(colorspace, "RGB"), min_height=1, min_width=1,
                               strict=True)
    except ValueError as err:
        message = str(err)
        extraneous = _EXTRANEOUS.search(message)
        if any(h in message for h in _HARMLESS) or (extraneous and int(extraneous[1], 16) in _HEADER_MARKERS):
            return None
        return f"damaged JPEG data: {message}"
    return None


# ---------------------------------------------------------------------------------------------- conversions


def _pillow_rgb(img: Image.Image) -> Image.Image:
    try:
        return img.convert("RGB")
    except ValueError as err:
        raise ImageDecodeError(f"mode {img.mode!r}: Pillow cannot convert it to RGB ({err})") from err


def _grey(values: np.ndarray) -> Image.Image:
    v = values.astype(np.uint8)
    return Image.fromarray(np.stack([v, v, v], axis=-1))


def _from_16_bit(img: Image.Image) -> Image.Image:
    return _grey((np.asarray(img).astype(np.uint32) + 128) // 257)  # round(v / 257): 257·k -> k exactly


def _from_int32(img: Image.Image) -> Image.Image:
    values = np.asarray(img).astype(np.int64)
    lo, hi = (int(values.min()), int(values.max())) if values.size else (0, 0)
    if lo < 0 or hi > MAX_16:
        raise ImageDecodeError(
            f"mode 'I' (32-bit integer) values {lo}..{hi} are outside 0..{MAX_16}, the 16-bit range such images are "
            f"scaled from; save it as an 8-bit or 16-bit PNG")
    return _grey((values + 128) // 257)


def _from_float(img: Image.Image) -> Image.Image:
    values = np.asarray(img).astype(np.float64)
    if not np.isfinite(values).all():
        raise ImageDecodeError("mode 'F' (32-bit float) has NaN or infinite values; save it as an 8-bit or 16-bit PNG")
    lo, hi = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if lo < 0 or hi > 1:
        raise ImageDecodeError(
            f"mode 'F' (32-bit float) values {lo:g}..{hi:g} are outside 0..1, the range float images are read on; "
            f"scale it to 0..1 or save it as an 8-bit or 16-bit PNG")
    return _grey(np.floor(values * 255 + 0.5))


def _transparent(img: Image.Image) -> bool:
    bands = img.getbands()
    return "A" in bands or "a" in bands or (img.mode in ("1", "L", "P", "RGB") and "transparency" in img.info)


def _on_white(img: Image.Image) -> Image.Image:
    rgba = np.asarray(img.convert("RGBA")).astype(np.uint32)
    colour, alpha = rgba[..., :3], rgba[..., 3:]
    return Image.fromarray(((colour * alpha + 255 * (255 - alpha) + 127) // 255).astype(np.uint8))


CONVERTERS: dict[str, Callable[[Image.Image], Image.Image]] = {
    "I;16": _from_16_bit, "I;16L": _from_16_bit, "I;16B": _from_16_bit, "I;16N": _from_16_bit,
    "I": _from_int32,
    "F": _from_float,
}
