"""embed.decode (vlbench/decoding.py): Pillow's DCT-scaled JPEG decoding and torchvision's device decoding are
options that change pixels, are recorded in the features' fingerprint and are demanded by readers."""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from tests.conftest import png
from vlbench.analyses.base import Inputs
from vlbench.datasets.canonical import ClassInfo, DatasetMeta, split_schema, write_dataset, write_split
from vlbench.datasets.images import decode_rgb
from vlbench.decoding import (
    DecodeOptionError,
    by_size,
    decode_rgb_draft,
    decoder,
    device_refusal,
    first_resize,
    tensor_steps,
)
from vlbench.embed import embed_image_splits, embed_images
from vlbench.features import StaleFeaturesError, read_fingerprint
from vlbench.models.identity import model_identity
from vlbench.models.loading import load_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def loaded(toy_model_cfg):
    return load_model(toy_model_cfg, device="cpu")


def photo(size: tuple[int, int], seed: int = 0, quality: int = 90) -> bytes:
    """A smooth image with edges (as photos have: blocks of colour and gradients), as a JPEG of `size` (w, h)."""
    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w]
    pixels = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), ((xx // 7 + yy // 5) % 2) * 200],
                      axis=-1).astype(np.uint8)
    pixels[rng.integers(0, h, 3)] = 255
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def draft_scale(image_size: tuple[int, int], target: tuple[int, int]) -> int:
    """The DCT scale Pillow's `draft` picks for a JPEG of `image_size` (w, h) asked for at least `target` (w, h):
    the largest of 8, 4, 2, 1 that both sides divide into at least their target (JpegImagePlugin.draft)."""
    ratio = min(image_size[0] // target[0], image_size[1] // target[1])
    return next((s for s in (8, 4, 2) if ratio >= s), 1)



@pytest.mark.parametrize("size, target", [((640, 480), (224, 224)), ((1000, 300), (224, 224)), ((256, 256), (32, 32)),
                                          ((257, 130), (32, 32)), ((100, 80), (224, 224)), ((448, 448), (224, 224))])
def test_draft_decodes_at_the_scale_pillow_picks_and_never_below_the_target(size, target):
    img = decode_rgb_draft(photo(size), target)
    scale = draft_scale(size, target)
    assert img.size == (math.ceil(size[0] / scale), math.ceil(size[1] / scale))
    assert img.size[0] >= min(target[0], size[0]) and img.size[1] >= min(target[1], size[1])
    assert img.mode == "RGB"


def test_draft_is_pillows_full_decode_where_the_image_is_under_twice_the_target():
    data = photo((400, 300))  # 300 // 224 = 1: no DCT scaling
    assert np.array_equal(np.asarray(decode_rgb_draft(data, (224, 224))), np.asarray(decode_rgb(data)))
    png_data = png((10, 200, 30), size=512)  # not a JPEG: decoded whole whatever its size
    assert np.array_equal(np.asarray(decode_rgb_draft(png_data, (32, 32))), np.asarray(decode_rgb(png_data)))


def test_first_resize_reads_the_models_resize(loaded):
    assert first_resize(loaded.preprocess) == (32, 32)
    with pytest.raises(DecodeOptionError, match="needs a Resize"):
        first_resize(lambda x: x, "m")


def model_inputs(loaded, name: str, images: list[bytes]) -> torch.Tensor:
    dec = decoder(name, loaded.preprocess, CPU, "toy")
    items = [dec.worker(data) for data in images]
    return dec.finish(torch.stack(items) if dec.stack else items)


def test_torchvision_decodes_jpegs_as_pillow_does_and_differs_only_by_the_resize_kernel(loaded):
    images = [photo((300, 200), seed=1), png((40, 90, 200), size=48, seed=2), photo((64, 64), seed=3)]
    pil = model_inputs(loaded, "pil", images)
    tv = model_inputs(loaded, "torchvision", images)
    assert tv.shape == pil.shape and tv.dtype == torch.float32
    # libjpeg-turbo in torchvision and in Pillow: the same RGB pixels before any resize
    data = images[0]
    decoded = torch.from_numpy(np.asarray(decode_rgb(data)).copy()).permute(2, 0, 1)
    from torchvision.io import ImageReadMode, decode_jpeg

    assert torch.equal(decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB), decoded)
    # after the resize: torch's antialiased bicubic is not Pillow's, so the inputs differ, by little
    diff = (tv - pil).abs()
    assert diff.max() > 0
    assert diff.mean() < 0.1  # in normalised units (about 7 grey levels / 255 / std); measured values in docs


def test_torchvision_runs_only_transforms_it_can_apply_to_tensors(loaded):
    geometric, normalize = tensor_steps(loaded.preprocess)
    assert [type(s).__name__ for s in geometric] == ["Resize", "CenterCrop"]
    from torchvision.transforms import ColorJitter, Compose, Normalize

    with pytest.raises(DecodeOptionError, match="ColorJitter"):
        tensor_steps(Compose([ColorJitter(), Normalize([0.5] * 3, [0.5] * 3)]), "m")


def test_an_unknown_decoder_is_refused_naming_the_param(loaded):
    with pytest.raises(DecodeOptionError,
                       match=r"embed.decode 'nvdali' is not one of \['dali', 'pil', 'pil_draft', 'torchvision'\]"):
        decoder("nvdali", loaded.preprocess, CPU)


def write_photos(out_dir, n: int = 12) -> DatasetMeta:
    rows = [{"sample_id": f"p{k:02d}", "label": k % 3,
             "image": photo((160 + 8 * k, 128), seed=k) if k % 4 else png((20 * k, 90, 200), size=64, seed=k)}
            for k in range(n)]
    meta = DatasetMeta(name="photos", task="single-label", metric="accuracy",
                       classes=[ClassInfo(i, name) for i, name in enumerate(["red", "green", "blue"])])
    return write_dataset(out_dir, meta, {"test": iter(rows)})


try:
    import nvidia.dali  # noqa: F401

    HAS_DALI = True
except ImportError:
    HAS_DALI = False
dali = pytest.mark.skipif(not HAS_DALI, reason="needs NVIDIA DALI (pip install 'vlbench[dali]')")


@pytest.mark.parametrize("name", ["pil_draft", "torchvision", pytest.param("dali", marks=dali)])
def test_each_decoder_gives_features_that_say_so_and_that_a_pil_reader_refuses(loaded, toy_model_cfg, tmp_path, name):
    meta = write_photos(tmp_path / "prepared")
    embed_image_splits(loaded, tmp_path / "prepared", tmp_path / "pil" / "images", num_workers=0, progress=False)
    embed_image_splits(loaded, tmp_path / "prepared", tmp_path / name / "images", num_workers=2, progress=False,
                       decode=name)
    found = read_fingerprint(tmp_path / name / "images" / "test.parquet")
    assert found["decode"] == name and read_fingerprint(tmp_path / "pil" / "images" / "test.parquet")["decode"] == "pil"
    assert found.get("decode_device") == ("cpu" if name in ("torchvision", "dali") else None)

    identity = model_identity(toy_model_cfg)
    assert Inputs(meta, identity, tmp_path / name, tmp_path / "texts", decode=name).images("test").embeddings.shape[0] == 12
    with pytest.raises(StaleFeaturesError, match=f"decode: file has '{name}', expected 'pil'"):
        Inputs(meta, identity, tmp_path / name, tmp_path / "texts", decode="pil").images("test")
    pil = pq.read_table(tmp_path / "pil" / "images" / "test.parquet").column("embedding").to_numpy()
    other = pq.read_table(tmp_path / name / "images" / "test.parquet").column("embedding").to_numpy()
    assert not all(np.array_equal(a, b) for a, b in zip(pil, other))  # 160-248 px JPEGs for a 32 px model: pixels change


def test_draft_features_equal_pil_features_when_no_jpeg_is_twice_the_models_input(loaded, tmp_path):
    path = tmp_path / "small.parquet"
    rows = [{"sample_id": f"s{k}", "label": 0, "image": photo((40 + k, 36 + k), seed=k)} for k in range(6)]
    write_split(path, iter(rows), split_schema(False))
    pil, _ = embed_images(loaded, path, "small", "test", num_workers=0, progress=False)
    draft, _ = embed_images(loaded, path, "small", "test", num_workers=0, progress=False, decode="pil_draft")
    assert np.array_equal(pil, draft)


def encoded(pixels: np.ndarray, mode: str | None = None, **save) -> bytes:
    buf = io.BytesIO()
    image = Image.fromarray(pixels)
    (image.convert(mode) if mode else image).save(buf, format=save.pop("format", "JPEG"), **save)
    return buf.getvalue()


def odd_images() -> dict[str, bytes]:
    """One image of each kind a device decoder leaves to the CPU, and a baseline JPEG it takes."""
    pixels = np.asarray(Image.open(io.BytesIO(photo((120, 90), seed=5))))
    return {"baseline": photo((120, 90), seed=5), "progressive": encoded(pixels, progressive=True),
            "greyscale": encoded(pixels, "L"), "CMYK": encoded(pixels, "CMYK"),
            "not a JPEG": encoded(pixels, format="PNG")}


def test_device_refusal_names_what_is_not_a_sequential_8_bit_ycbcr_jpeg():
    for kind, data in odd_images().items():
        assert device_refusal(data) == (None if kind == "baseline" else kind), kind
    assert device_refusal(None) == "not a JPEG"
    assert device_refusal(photo((64, 64))[:40]) == "malformed JPEG"  # cut before the frame header


def test_resizing_the_images_of_one_size_as_a_stack_gives_each_images_pixels(loaded):
    geometric, _ = tensor_steps(loaded.preprocess)
    images = [torch.from_numpy(np.asarray(decode_rgb(photo(size, seed=k))).copy()).permute(2, 0, 1)
              for k, size in enumerate([(300, 200), (120, 90), (300, 200), (300, 200), (64, 80)])]
    alone = []
    for image in images:
        for step in geometric:
            image = step(image)
        alone.append(image)
    stacked = by_size(images, geometric)
    assert all(torch.equal(a, b) for a, b in zip(alone, stacked))


@pytest.mark.parametrize("name", ["torchvision", pytest.param("dali", marks=dali)])
def test_a_device_decoder_in_the_embed_stage_counts_what_it_left_to_the_cpu(loaded, tmp_path, capsys, name):
    kinds = odd_images()
    rows = [{"sample_id": f"{kind}{k}", "label": k % 3, "image": data}
            for k in range(2) for kind, data in kinds.items()]
    meta = DatasetMeta(name="odd", task="single-label", metric="accuracy",
                       classes=[ClassInfo(i, name) for i, name in enumerate(["a", "b", "c"])])
    write_dataset(tmp_path / "prepared", meta, {"test": iter(rows)})
    capsys.readouterr()
    embed_image_splits(loaded, tmp_path / "prepared", tmp_path / "tv" / "images", num_workers=2, batch_size=4,
                       progress=False, decode=name)
    assert ("embed odd/test: 8 of 10 images decoded on the CPU by Pillow, not on the device "
            "(CMYK 2, greyscale 2, not a JPEG 2, progressive 2)") in capsys.readouterr().err
    embed_image_splits(loaded, tmp_path / "prepared", tmp_path / "pil" / "images", num_workers=0, progress=False)
    assert "decoded on the CPU" not in capsys.readouterr().err  # pil: nothing to count
    tv, pil = (pq.read_table(tmp_path / name / "images" / "test.parquet") for name in ("tv", "pil"))
    assert read_fingerprint(tmp_path / "tv" / "images" / "test.parquet")["decode"] == name
    a, b = (np.stack(t.column("embedding").to_numpy(zero_copy_only=False)) for t in (tv, pil))
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert tv.column("sample_id").to_pylist() == pil.column("sample_id").to_pylist()
    assert cos.min() > 0.99 and not np.array_equal(a, b)  # the fallback's pixels are Pillow's, resized by torch


def test_bf16_weights_are_recorded_and_change_bits_by_little(loaded, tmp_path):
    write_photos(tmp_path / "prepared")
    embed_image_splits(loaded, tmp_path / "prepared", tmp_path / "fp32" / "images", num_workers=0, progress=False)
    embed_image_splits(loaded, tmp_path / "prepared", tmp_path / "bf16" / "images", num_workers=0, progress=False,
                       bf16_weights=True)
    assert "image_weights" not in read_fingerprint(tmp_path / "fp32" / "images" / "test.parquet")  # default: as before
    assert read_fingerprint(tmp_path / "bf16" / "images" / "test.parquet")["image_weights"] == "bf16"
    assert next(loaded.model.visual.parameters()).dtype == torch.float32  # the caller's model is left in fp32
    a, b = (np.stack(pq.read_table(tmp_path / name / "images" / "test.parquet").column("embedding")
                     .to_numpy(zero_copy_only=False)) for name in ("fp32", "bf16"))
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert not np.array_equal(a, b) and cos.min() > 0.99


@dali
@pytest.mark.parametrize("squash", [False, True])
def test_dali_on_the_cpu_gives_torchvisions_sizes_crops_and_nearly_its_pixels(loaded, squash):
    """DALI's pipeline reproduces torchvision's Resize output size and CenterCrop offset (rounding included: a size
    off by one pixel shifts the crop and shows as tens of grey levels on these striped images); the resampling
    differs by under a grey level on average."""
    from vlbench.embed import squash_preprocess

    preprocess = squash_preprocess(loaded.preprocess) if squash else loaded.preprocess
    images = [photo(size, seed=k) for k, size in enumerate([(300, 200), (641, 427), (200, 333), (97, 120), (64, 64)])]
    runs = {}
    for name in ("torchvision", "dali"):
        dec = decoder(name, preprocess, CPU, "toy")
        dec.finish([dec.worker(data) for data in images[:2]])  # then a larger batch: DALI's pipeline is rebuilt
        runs[name] = dec.finish([dec.worker(data) for data in images])
    std = torch.tensor(preprocess.transforms[-1].std).view(1, -1, 1, 1)
    grey = ((runs["dali"] - runs["torchvision"]) * std * 255).abs()
    assert runs["dali"].shape == runs["torchvision"].shape
    assert grey.mean(dim=(1, 2, 3)).max() < 1.0 and grey.max() <= 8


def test_the_stage_reads_bf16_weights_from_the_settings_and_refuses_a_non_boolean(monkeypatch):
    from stages.embed_images import bf16_weights
    from vlbench.params import ParamsError, load_params

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    assert bf16_weights(load_params()) is False  # conf/settings/embed.yaml's default, in this checkout
    assert bf16_weights({"embed": {"bf16_weights": True, "decode": "pil"}}) is True
    assert bf16_weights({"embed": {"decode": "pil"}}) is False  # a project without conf/settings/embed.yaml
    with pytest.raises(ParamsError, match="key 'embed.bf16_weights' must be a bool, got str 'yes'"):
        bf16_weights({"embed": {"bf16_weights": "yes"}})
