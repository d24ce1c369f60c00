"""vlbench.embed.embed_images: every corrupt image of a split reported at once; CPU workers run the whole transform."""

from __future__ import annotations

import io
import re

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from tests.conftest import png
from vlbench.datasets.canonical import split_schema, write_split
from vlbench.embed import CorruptImageError, embed_images, split_preprocess, worker_preprocess
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
