"""vlbench.embed: every corrupt image of a split reported at once; CPU workers run the whole transform; squash preprocessing."""

from __future__ import annotations

import io
import re

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from tests.conftest import png
from vlbench.datasets.canonical import (
    ClassInfo,
    DatasetMeta,
    load_meta,
    split_schema,
    write_dataset,
    write_split,
)
from vlbench.embed import (
    CorruptImageError,
    PreprocessError,
    embed_image_splits,
    embed_images,
    model_for_dataset,
    split_preprocess,
    squash_preprocess,
    worker_preprocess,
)
from vlbench.features import read_fingerprint
from vlbench.models.loading import load_model


@pytest.fixture(scope="module")
def loaded(toy_model_cfg):
    return load_model(toy_model_cfg, device="cpu")


def jpeg(seed: int, size: tuple[int, int]) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = (rng.random((size[1], size[0], 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def write_images(path, n: int, corrupt=(), rows_per_group: int = 4):
    """`n` images of mixed formats and sizes (so resize and crop do work), in row groups of `rows_per_group`;
    the rows in `corrupt` get truncated bytes, or no bytes at all for odd rows."""
    def rows():
        for k in range(n):
            data = png((40 * (k % 6), 90, 200), size=32, seed=k) if k % 2 else jpeg(k, (48 + k, 36))
            if k in corrupt:
                data = data[:30] if k % 2 == 0 else None
            yield {"sample_id": f"img-{k:03d}", "label": k % 3, "image": data}

    path.parent.mkdir(parents=True, exist_ok=True)
    write_split(path, rows(), split_schema(False), rows_per_group=rows_per_group)
    return path


@pytest.mark.parametrize("workers", [0, 2])
def test_every_corrupt_image_of_the_split_is_reported_in_one_error(loaded, tmp_path, workers):
    path = write_images(tmp_path / "test.parquet", 14, corrupt={1, 6, 13})
    with pytest.raises(CorruptImageError) as info:
        embed_images(loaded, path, "shapes", "test", batch_size=3, num_workers=workers, progress=False)
    msg = str(info.value)
    assert msg.startswith("dataset 'shapes' split 'test': 3 images cannot be decoded")
    assert re.findall(r"'img-\d+'", msg) == ["'img-001'", "'img-006'", "'img-013'"]  # all of them, in row order
    assert "skip_corrupt" in msg


def test_a_single_corrupt_image_is_named_with_its_dataset_split_and_sample(loaded, tmp_path):
    path = write_images(tmp_path / "train.parquet", 6, corrupt={4})
    with pytest.raises(CorruptImageError, match=r"dataset 'shapes' split 'train' sample 'img-004': cannot decode image"):
        embed_images(loaded, path, "shapes", "train", batch_size=4, num_workers=0, progress=False)


def test_a_long_list_of_corrupt_images_is_cut_at_twenty_with_the_total(loaded, tmp_path):
    corrupt = set(range(3, 33))
    path = write_images(tmp_path / "test.parquet", 36, corrupt=corrupt, rows_per_group=8)
    with pytest.raises(CorruptImageError) as info:
        embed_images(loaded, path, "big", "test", batch_size=8, num_workers=2, progress=False)
    msg = str(info.value)
    assert "30 images cannot be decoded" in msg
    assert re.findall(r"'img-\d+'", msg) == [f"'img-{k:03d}'" for k in range(3, 23)]
    assert "and 10 more" in msg


def test_once_an_image_is_corrupt_the_model_no_longer_runs(loaded, tmp_path, monkeypatch):
    """Without skip_corrupt the split fails anyway: the rest is only decoded, to find every corrupt file."""
    path = write_images(tmp_path / "test.parquet", 12, corrupt={0, 9})
    calls = []
    real = loaded.model.encode_image
    monkeypatch.setattr(loaded.model, "encode_image", lambda x: calls.append(len(x)) or real(x))
    with pytest.raises(CorruptImageError, match="2 images"):
        embed_images(loaded, path, "shapes", "test", batch_size=4, num_workers=0, progress=False)
    assert calls == []


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_corrupt_returns_the_kept_rows_and_the_same_embeddings_for_them(loaded, tmp_path, workers):
    clean = write_images(tmp_path / "clean.parquet", 14)
    broken = write_images(tmp_path / "broken.parquet", 14, corrupt={1, 6, 13})
    ref, ref_rows = embed_images(loaded, clean, "shapes", "test", batch_size=5, num_workers=0, progress=False)
    emb, rows = embed_images(loaded, broken, "shapes", "test", batch_size=5, num_workers=workers,
                             skip_corrupt=True, progress=False)
    assert ref_rows.tolist() == list(range(14))
    assert rows.tolist() == [k for k in range(14) if k not in {1, 6, 13}]
    np.testing.assert_allclose(emb, ref[rows], rtol=1e-5, atol=1e-6)


def test_all_images_corrupt_with_skip_corrupt_is_still_an_error(loaded, tmp_path):
    path = write_images(tmp_path / "test.parquet", 3, corrupt={0, 1, 2})
    with pytest.raises(CorruptImageError, match=r"dataset 'shapes' split 'test': no image could be decoded"):
        embed_images(loaded, path, "shapes", "test", num_workers=0, skip_corrupt=True, progress=False)


def test_cpu_workers_run_the_whole_transform_and_accelerators_get_uint8(loaded):
    image = Image.open(io.BytesIO(jpeg(0, (50, 40)))).convert("RGB")
    cpu_decode, cpu_finish = worker_preprocess(loaded.preprocess, torch.device("cpu"))
    cuda_decode, cuda_finish = worker_preprocess(loaded.preprocess, torch.device("cuda"))
    assert cpu_decode is loaded.preprocess and cpu_decode(image).dtype == torch.float32
    assert cuda_decode(image).dtype == torch.uint8
    batch = torch.stack([cpu_decode(image)])
    assert cpu_finish(batch) is batch
    assert torch.equal(cuda_finish(torch.stack([cuda_decode(image)])), batch)


def test_the_uint8_path_and_the_whole_transform_give_bitwise_equal_inputs(loaded):
    """`finish(decode(x))` and `preprocess(x)` run the same fp32 operations in the same order: equal bit for bit."""
    decode, finish = split_preprocess(loaded.preprocess)
    images = [Image.open(io.BytesIO(jpeg(k, (30 + 7 * k, 64 - 5 * k)))).convert("RGB") for k in range(6)]
    split_batch = finish(torch.stack([decode(im) for im in images]))
    whole_batch = torch.stack([loaded.preprocess(im) for im in images])
    assert split_batch.dtype == whole_batch.dtype == torch.float32
    assert torch.equal(split_batch, whole_batch)


@pytest.mark.parametrize("workers", [0, 2])
def test_cpu_embeddings_are_identical_whether_workers_normalise_or_not(loaded, tmp_path, workers):
    path = write_images(tmp_path / "test.parquet", 13)
    whole, rows_a = embed_images(loaded, path, "shapes", "test", batch_size=4, num_workers=workers,
                                 normalise_in_workers=True, progress=False)
    split, rows_b = embed_images(loaded, path, "shapes", "test", batch_size=4, num_workers=workers,
                                 normalise_in_workers=False, progress=False)
    default, _ = embed_images(loaded, path, "shapes", "test", batch_size=4, num_workers=workers, progress=False)
    assert rows_a.tolist() == rows_b.tolist() == list(range(13))
    assert np.array_equal(whole, split)
    assert np.array_equal(default, whole)
    assert whole.dtype == np.float32 and pq.ParquetFile(path).metadata.num_rows == len(whole)


# ---------------------------------------------------------------- preprocess: squash (ELEVATER's KITTI distance)


def striped(width: int, height: int) -> Image.Image:
    """Blue, with a red stripe along the left eighth: a centre crop of a wide image cuts the stripe off."""
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    pixels[:, :, 2] = 255
    pixels[:, : width // 8] = (255, 0, 0)
    return Image.fromarray(pixels)


def test_squash_replaces_resize_and_centre_crop_by_one_resize_to_the_crop_size(loaded):
    squash = squash_preprocess(loaded.preprocess)
    steps, original = squash.transforms, loaded.preprocess.transforms
    resize = steps[0]
    assert type(resize).__name__ == "Resize" and tuple(resize.size) == (32, 32)
    assert resize.interpolation == original[0].interpolation and resize.antialias == original[0].antialias
    assert steps[1:] == original[2:]  # RGB, ToTensor, Normalize kept
    assert squash(striped(96, 32)).shape == loaded.preprocess(striped(96, 32)).shape == (3, 32, 32)


def test_squash_keeps_the_whole_image_where_the_centre_crop_cuts(loaded):
    wide = striped(128, 32)
    squashed, cropped = squash_preprocess(loaded.preprocess)(wide), loaded.preprocess(wide)
    mean, std = np.array(loaded.fingerprint["preprocess"]["mean"]), np.array(loaded.fingerprint["preprocess"]["std"])
    red = torch.tensor((np.array([1.0, 0.0, 0.0]) - mean) / std, dtype=torch.float32)
    assert torch.allclose(squashed[:, 16, 0], red, atol=0.05)  # the stripe is the left 4 of 32 columns
    assert not torch.allclose(cropped[:, 16, 0], red, atol=0.5)  # the crop kept only the blue middle
    square = striped(64, 64)  # a square image: nothing to crop, both give the same input
    assert torch.equal(squash_preprocess(loaded.preprocess)(square), loaded.preprocess(square))


def test_squash_keeps_the_uint8_path_for_accelerators_bit_for_bit(loaded):
    squash = squash_preprocess(loaded.preprocess)
    decode, finish = split_preprocess(squash)
    images = [striped(40 + 9 * k, 30) for k in range(4)]
    assert decode(images[0]).dtype == torch.uint8
    assert torch.equal(finish(torch.stack([decode(im) for im in images])), torch.stack([squash(im) for im in images]))


def test_a_model_transform_without_resize_and_centre_crop_cannot_be_squashed():
    with pytest.raises(PreprocessError, match=r"model 'odd': cannot squash images: its preprocess has no Resize followed by CenterCrop"):
        squash_preprocess(lambda img: img, "odd")


def write_wide_dataset(out_dir, preprocess: str):
    """Four wide JPEGs (non-square, so squash and crop differ) in one split, with the given preprocess."""
    meta = DatasetMeta(name="kitti", task="single-label", metric="accuracy",
                       classes=[ClassInfo(0, "near"), ClassInfo(1, "far")], preprocess=preprocess)
    rows = ({"sample_id": f"img-{k}", "label": k % 2, "image": jpeg(k, (120 + 10 * k, 36))} for k in range(4))
    return write_dataset(out_dir, meta, {"test": rows})


def test_squash_dataset_gets_other_features_a_version_and_a_fingerprint_saying_so(loaded, tmp_path):
    default_meta = write_wide_dataset(tmp_path / "prepared" / "default", "default")
    squash_meta = write_wide_dataset(tmp_path / "prepared" / "squash", "squash")
    assert load_meta(tmp_path / "prepared" / "squash").preprocess == "squash"
    assert squash_meta.version != default_meta.version  # same images and labels, other model input
    # the splits folder (embed_images' DVC dependency) differs too, so flipping preprocess re-embeds
    assert (tmp_path / "prepared" / "squash" / "splits" / "preprocess.txt").read_text() == "squash\n"
    assert not (tmp_path / "prepared" / "default" / "splits" / "preprocess.txt").exists()
    for name in ("default", "squash"):
        embed_image_splits(loaded, tmp_path / "prepared" / name, tmp_path / "features" / name, num_workers=0, progress=False)
    fingerprints = {name: read_fingerprint(tmp_path / "features" / name / "test.parquet") for name in ("default", "squash")}
    assert fingerprints["default"]["preprocess"] == loaded.fingerprint["preprocess"]
    assert fingerprints["default"]["preprocess"]["resize_mode"] == "shortest"
    assert fingerprints["squash"]["preprocess"] == {**loaded.fingerprint["preprocess"], "resize_mode": "squash"}
    default_emb = pq.read_table(tmp_path / "features" / "default" / "test.parquet").column("embedding").to_pylist()
    squash_emb = pq.read_table(tmp_path / "features" / "squash" / "test.parquet").column("embedding").to_pylist()
    assert not np.allclose(default_emb, squash_emb, atol=1e-4)
    expected, _ = embed_images(model_for_dataset(loaded, squash_meta), tmp_path / "prepared" / "squash" / "splits" / "test.parquet",
                               "kitti", "test", num_workers=0, progress=False)
    np.testing.assert_array_equal(np.array(squash_emb, dtype=np.float32), expected)


def test_default_datasets_are_embedded_exactly_as_before(loaded, tmp_path):
    """`preprocess: default` leaves the model, its transform and its fingerprint untouched, and classes.json
    has no `preprocess` key: existing prepared data, versions and features stay byte-identical."""
    meta = write_wide_dataset(tmp_path / "prepared" / "default", "default")
    assert model_for_dataset(loaded, meta) is loaded
    assert "preprocess" not in (tmp_path / "prepared" / "default" / "classes.json").read_text()
    embed_image_splits(loaded, tmp_path / "prepared" / "default", tmp_path / "features", num_workers=0, progress=False)
    assert read_fingerprint(tmp_path / "features" / "test.parquet") == {
        **loaded.fingerprint, "dataset": "kitti", "dataset_version": meta.version,
        "logit_scale": float(loaded.model.logit_scale.detach().exp()),  # the model's, for heads that start from it
        "decode": "pil"}  # embed.decode's default (vlbench/decoding.py)
    expected, _ = embed_images(loaded, tmp_path / "prepared" / "default" / "splits" / "test.parquet", "kitti", "test",
                               num_workers=0, progress=False)
    got = pq.read_table(tmp_path / "features" / "test.parquet").column("embedding").to_pylist()
    np.testing.assert_array_equal(np.array(got, dtype=np.float32), expected)


def test_an_unknown_preprocess_is_refused_naming_the_dataset():
    from vlbench.datasets.canonical import DatasetError

    with pytest.raises(DatasetError, match=r"dataset 'kitti': preprocess 'crop' is not one of \('default', 'squash', 'fewtrans', 'objectnet'\)"):
        DatasetMeta(name="kitti", task="single-label", metric="accuracy", classes=[ClassInfo(0, "a")], preprocess="crop")


def test_fewtrans_preprocess_is_the_codes_bilinear_squash_with_imagenet_statistics(loaded, tmp_path):
    """FewTrans' test transform: Resize([s, s]) bilinear (no crop), Normalize with ImageNet's mean and std."""
    from torchvision.transforms import InterpolationMode, Normalize
    from torchvision.transforms import functional as F

    from vlbench.embed import IMAGENET_MEAN, IMAGENET_STD

    meta = write_wide_dataset(tmp_path / "prepared" / "fewtrans", "fewtrans")
    model = model_for_dataset(loaded, meta)
    steps = model.preprocess.transforms
    assert steps[0].interpolation == InterpolationMode.BILINEAR and tuple(steps[0].size) == (32, 32)
    assert isinstance(steps[-1], Normalize) and tuple(steps[-1].mean) == IMAGENET_MEAN
    wide = striped(128, 32)
    by_hand = F.normalize(F.to_tensor(F.resize(wide, [32, 32], InterpolationMode.BILINEAR, antialias=True)),
                          IMAGENET_MEAN, IMAGENET_STD)
    assert torch.allclose(model.preprocess(wide), by_hand, atol=1e-6)
    assert model.fingerprint["preprocess"] == {**loaded.fingerprint["preprocess"], "resize_mode": "squash",
                                               "interpolation": "bilinear", "mean": list(IMAGENET_MEAN),
                                               "std": list(IMAGENET_STD)}
    squash = write_wide_dataset(tmp_path / "prepared" / "squash", "squash")
    assert len({meta.version, squash.version}) == 2
    decode, finish = split_preprocess(model.preprocess)
    assert torch.equal(finish(decode(wide)[None])[0], model.preprocess(wide))  # the uint8 path for accelerators
