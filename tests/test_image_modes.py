"""vlbench.datasets.images: every Pillow mode a user can bring becomes 8-bit RGB by a stated rule (docs/datasets.md,
"Image decoding"); expected pixels are computed here from the rule, never read back from the code under test."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from tests.conftest import png
from vlbench.datasets.canonical import split_schema, write_split
from vlbench.embed import embed_images
from vlbench.datasets.images import ImageDecodeError, decode_rgb, image_problem, to_rgb
from vlbench.models.loading import load_model


def encode(img: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def rgb(data: bytes) -> np.ndarray:
    out = decode_rgb(data)
    assert out.mode == "RGB"
    return np.asarray(out)


def grey(values) -> np.ndarray:
    """The RGB image of 8-bit grey values: each value in all three channels."""
    v = np.asarray(values, dtype=np.uint8)
    return np.stack([v, v, v], axis=-1)


def on_white(colour: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Straight alpha composited on white, in floating point: c·a/255 + 255·(1 − a/255), rounded."""
    c, a = colour.astype(float), alpha.astype(float)[..., None]
    return np.round(c * a / 255 + 255 * (1 - a / 255)).astype(np.uint8)


SIXTEEN = np.array([[0, 1000, 20000], [32896, 65535, 128]], np.uint16)
SIXTEEN_AS_8 = grey([[0, 4, 78], [128, 255, 0]])  # round(v / 257): 1000 -> 3.89 -> 4, 20000 -> 77.82 -> 78


# ------------------------------------------------------------------------------------------------ 16-bit


def test_the_issue_example_a_16_bit_png_is_scaled_by_its_full_range_not_saturated():
    data = encode(Image.fromarray(np.array([[1000, 20000, 65535]], np.uint16)), "PNG")
    assert Image.open(io.BytesIO(data)).mode == "I;16"
    assert np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).min() == 255  # what convert("RGB") did: white
    assert np.array_equal(rgb(data), grey([[4, 78, 255]]))


@pytest.mark.parametrize("dtype, fmt, opened", [
    ("<u2", "PNG", "I;16"),
    ("<u2", "TIFF", "I;16"),
    (">u2", "TIFF", "I;16B"),
])
def test_16_bit_greyscale_files_in_either_byte_order(dtype, fmt, opened):
    data = encode(Image.fromarray(SIXTEEN.astype(dtype)), fmt)
    assert Image.open(io.BytesIO(data)).mode == opened
    assert np.array_equal(rgb(data), SIXTEEN_AS_8)


@pytest.mark.parametrize("mode", ["I;16", "I;16L", "I;16B", "I;16N"])
def test_every_16_bit_mode_pillow_has(mode):
    order = ">" if mode == "I;16B" else "<" if mode in ("I;16", "I;16L") else "="
    img = Image.frombytes(mode, (3, 2), SIXTEEN.astype(f"{order}u2").tobytes())
    assert np.array_equal(np.asarray(to_rgb(img)), SIXTEEN_AS_8)


def test_a_16_bit_pgm_which_pillow_opens_as_32_bit_I_is_scaled_by_16_bits():
    """Pillow widens a PGM with maxval > 255 to mode I on the 0..65535 scale: mode I is read on that scale."""
    data = b"P5\n3 1\n1000\n" + np.array([0, 500, 1000], ">u2").tobytes()
    assert Image.open(io.BytesIO(data)).mode == "I"
    assert np.array_equal(rgb(data), grey([[0, 128, 255]]))  # 500/1000 -> 32768 (Pillow) -> 127.5 -> 128


def test_32_bit_integer_tiff_within_the_16_bit_range():
    data = encode(Image.fromarray(SIXTEEN.astype(np.int32)), "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "I"
    assert np.array_equal(rgb(data), SIXTEEN_AS_8)


@pytest.mark.parametrize("values", [[[-5, 0, 7]], [[0, 70000, 3]]])
def test_32_bit_integer_outside_the_16_bit_range_is_refused_with_the_mode_and_range(values):
    data = encode(Image.fromarray(np.array(values, np.int32)), "TIFF")
    lo, hi = np.min(values), np.max(values)
    with pytest.raises(ImageDecodeError, match=rf"mode 'I' .*values {lo}\.\.{hi} .*outside 0\.\.65535"):
        decode_rgb(data)
    assert f"{lo}..{hi}" in image_problem(data)  # refused by prepare's check too, which names the file


# ------------------------------------------------------------------------------------------------- float


def test_float_images_are_read_on_0_to_1():
    values = np.array([[0.0, 0.2, 0.5], [1.0, 0.998, 0.001]], np.float32)
    data = encode(Image.fromarray(values), "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "F"
    assert np.array_equal(rgb(data), grey([[0, 51, 128], [255, 254, 0]]))  # 0.5·255 = 127.5 -> 128


@pytest.mark.parametrize("values, shown", [
    ([[0.0, 2.0, 255.0]], "0..255"),  # Pillow's own F scale (L.convert("F")) is 0..255: refused, not saturated
    ([[-0.5, 0.5, 1.0]], "-0.5..1"),
    ([[0.0, np.nan, 1.0]], "NaN"),
])
def test_float_images_outside_0_to_1_or_not_finite_are_refused(values, shown):
    data = encode(Image.fromarray(np.array(values, np.float32)), "TIFF")
    with pytest.raises(ImageDecodeError, match=r"mode 'F'") as err:
        decode_rgb(data)
    assert shown in str(err.value)


# ------------------------------------------------------------------------------------------------ 8-bit


def test_bilevel_and_greyscale():
    bits = np.array([[True, False, True]])
    assert np.array_equal(rgb(encode(Image.fromarray(bits), "PNG")), grey([[255, 0, 255]]))
    assert Image.open(io.BytesIO(encode(Image.fromarray(bits), "PNG"))).mode == "1"
    levels = np.array([[0, 17, 200, 255]], np.uint8)
    assert np.array_equal(rgb(encode(Image.fromarray(levels), "PNG")), grey(levels))


def palette_image(indices: np.ndarray, colours: list[tuple[int, int, int]]) -> Image.Image:
    img = Image.fromarray(indices.astype(np.uint8)).convert("P")
    img.putpalette([v for c in colours for v in c])
    return img


COLOURS = [(255, 0, 0), (0, 128, 255), (10, 20, 30)]
INDICES = np.array([[0, 1, 2], [2, 1, 0]])


def test_palette_colours():
    data = encode(palette_image(INDICES, COLOURS), "PNG")
    assert Image.open(io.BytesIO(data)).mode == "P"
    assert np.array_equal(rgb(data), np.array(COLOURS, np.uint8)[INDICES])


def test_a_palette_entry_marked_transparent_becomes_white():
    data = encode(palette_image(INDICES, COLOURS), "PNG", transparency=1)
    expected = np.array(COLOURS, np.uint8)[INDICES]
    expected[INDICES == 1] = 255
    assert np.array_equal(rgb(data), expected)


def test_palette_with_alpha():
    img = palette_image(INDICES, COLOURS).convert("PA")
    alpha = np.array([[255, 128, 0], [64, 255, 200]], np.uint8)
    img.putalpha(Image.fromarray(alpha))
    data = encode(img, "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "PA"
    assert np.array_equal(rgb(data), on_white(np.array(COLOURS, np.uint8)[INDICES], alpha))


def test_greyscale_with_alpha_is_composited_on_white():
    level = np.array([[200, 200, 0, 90]], np.uint8)
    alpha = np.array([[255, 128, 0, 77]], np.uint8)
    data = encode(Image.fromarray(np.stack([level, alpha], -1), "LA"), "PNG")
    assert Image.open(io.BytesIO(data)).mode == "LA"
    expected = on_white(grey(level), alpha)
    assert expected[0, 1, 0] == 227 and expected[0, 2, 0] == 255  # 200·128/255 + 127 = 227.4; a = 0: white
    assert np.array_equal(rgb(data), expected)


def test_rgba_is_composited_on_white_and_opaque_pixels_keep_their_colour():
    colour = np.array([[[255, 0, 0], [0, 0, 0], [12, 34, 56], [0, 0, 0]]], np.uint8)
    alpha = np.array([[255, 255, 100, 0]], np.uint8)
    data = encode(Image.fromarray(np.concatenate([colour, alpha[..., None]], -1)), "PNG")
    out = rgb(data)
    assert out[0, 0].tolist() == [255, 0, 0] and out[0, 1].tolist() == [0, 0, 0]  # opaque: unchanged
    assert out[0, 3].tolist() == [255, 255, 255]  # fully transparent black: white, not black
    assert np.array_equal(out, on_white(colour, alpha))


def test_an_rgb_png_with_a_transparent_colour_key():
    colour = np.array([[[0, 0, 0], [9, 9, 9], [0, 0, 0]]], np.uint8)
    out = rgb(encode(Image.fromarray(colour), "PNG", transparency=(0, 0, 0)))
    assert out.tolist() == [[[255, 255, 255], [9, 9, 9], [255, 255, 255]]]


def test_cmyk_uses_pillows_conversion():
    """R = (255 − C)(255 − K)/255 (and so on): the naive conversion, no ICC profile, as convert("RGB") gives."""
    cmyk = np.array([[[0, 0, 0, 0], [255, 0, 0, 0], [0, 0, 0, 255], [0, 55, 155, 0]]], np.uint8)
    for fmt in ("TIFF", "JPEG"):
        data = encode(Image.fromarray(cmyk, "CMYK"), fmt, **({"quality": 100} if fmt == "JPEG" else {}))
        assert Image.open(io.BytesIO(data)).mode == "CMYK"
        expected = [[[255, 255, 255], [0, 255, 255], [0, 0, 0], [255, 200, 100]]]
        tolerance = 0 if fmt == "TIFF" else 3  # JPEG is lossy
        assert np.abs(rgb(data).astype(int) - expected).max() <= tolerance, fmt


def test_ycbcr_tiff_by_the_jfif_equations():
    ycc = np.array([[[128, 128, 128], [255, 128, 128], [100, 90, 200], [0, 128, 128]]], np.uint8)
    data = encode(Image.fromarray(ycc, "YCbCr"), "TIFF")
    assert Image.open(io.BytesIO(data)).mode == "YCbCr"
    y, cb, cr = (ycc[..., i].astype(float) for i in range(3))
    expected = np.stack([y + 1.402 * (cr - 128), y - 0.344136 * (cb - 128) - 0.714136 * (cr - 128),
                         y + 1.772 * (cb - 128)], -1).round().clip(0, 255)
    assert np.abs(rgb(data).astype(int) - expected).max() <= 1  # Pillow's fixed-point arithmetic


def test_rgb_images_are_exactly_what_convert_rgb_gives():
    """The demo's images are RGB PNGs: their pixels, and so the demo's features, do not move."""
    pixels = (np.random.default_rng(3).random((17, 23, 3)) * 255).astype(np.uint8)
    for data in (png((40, 90, 200), size=32, seed=5), encode(Image.fromarray(pixels), "PNG"),
                 encode(Image.fromarray(pixels), "JPEG", quality=80), encode(Image.fromarray(pixels), "WEBP")):
        with Image.open(io.BytesIO(data)) as img:
            assert img.mode == "RGB"
            assert decode_rgb(data).tobytes() == img.convert("RGB").tobytes()


def test_empty_and_unreadable_bytes_say_so():
    with pytest.raises(ImageDecodeError, match=r"^empty file \(0 bytes\)$"):
        decode_rgb(b"")
    with pytest.raises(ImageDecodeError, match=r"^no image bytes$"):
        decode_rgb(None)
    with pytest.raises(ImageDecodeError, match=r"not an image format Pillow reads .*b'hello wo'") as err:
        decode_rgb(b"hello world, no image here")
    assert "BytesIO" not in str(err.value)


# ------------------------------------------------------------------------------------------ the embed path


@pytest.fixture(scope="module")
def loaded(toy_model_cfg):
    return load_model(toy_model_cfg, device="cpu")


def test_embedding_a_16_bit_image_equals_embedding_its_8_bit_scaling(loaded, tmp_path):
    """The embed stage decodes with `decode_rgb`: a 16-bit image and its 8-bit greyscale equivalent give the
    same features (before the fix the 16-bit one was embedded as a white square)."""
    ramp = (np.arange(48 * 40).reshape(40, 48) * 34).astype(np.uint16)  # 0..65246
    as_8 = ((ramp.astype(np.uint32) + 128) // 257).astype(np.uint8)
    images = [encode(Image.fromarray(ramp), "PNG"), encode(Image.fromarray(as_8), "PNG"),
              encode(Image.fromarray(np.full((40, 48), 255, np.uint8)), "PNG")]
    path = tmp_path / "test.parquet"
    rows = ({"sample_id": f"s{i}", "label": 0, "image": data} for i, data in enumerate(images))
    write_split(path, rows, split_schema(False))
    emb, kept = embed_images(loaded, path, "xray", "test", batch_size=3, num_workers=0, progress=False)
    assert kept.tolist() == [0, 1, 2]
    np.testing.assert_allclose(emb[0], emb[1], rtol=1e-5, atol=1e-6)  # one batch: rows may differ in the last bit
    assert not np.allclose(emb[0], emb[2], atol=1e-3)
    expected = loaded.preprocess(Image.fromarray(as_8).convert("RGB"))
    with torch.inference_mode():
        direct = loaded.model.encode_image(expected[None]).numpy()[0]
    np.testing.assert_allclose(emb[1], direct, rtol=1e-5, atol=1e-6)
