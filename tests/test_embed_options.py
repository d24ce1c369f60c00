"""Embed-stage options that change speed, never features (issue 35): `overlap` (the next batch queued on the device
before the previous one's embeddings are waited for). CUDA tests are skipped where there is no CUDA device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.test_embed_images import write_images
from vlbench.datasets.canonical import split_path
from vlbench.embed import OVERLAP_VARIABLE, embed_images
from vlbench.models.loading import load_model

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def loaded(toy_model_cfg):
    return load_model(toy_model_cfg, device="cpu")


@pytest.mark.parametrize("workers", [0, 2])
def test_overlap_gives_the_same_rows_and_embeddings(loaded, tmp_path, workers):
    path = write_images(tmp_path / "test.parquet", 13)
    plain, rows_a = embed_images(loaded, path, "shapes", "test", batch_size=4, num_workers=workers, progress=False)
    queued, rows_b = embed_images(loaded, path, "shapes", "test", batch_size=4, num_workers=workers, progress=False,
                                  overlap=True)
    assert rows_a.tolist() == rows_b.tolist() == list(range(13))
    assert np.array_equal(plain, queued)


def test_overlap_keeps_the_rows_of_a_split_with_corrupt_images_skipped(loaded, tmp_path):
    path = write_images(tmp_path / "test.parquet", 11, corrupt=(2, 7))
    plain, rows_a = embed_images(loaded, path, "shapes", "test", batch_size=3, num_workers=0, progress=False,
                                 skip_corrupt=True)
    queued, rows_b = embed_images(loaded, path, "shapes", "test", batch_size=3, num_workers=0, progress=False,
                                  skip_corrupt=True, overlap=True)
    assert rows_b.tolist() == rows_a.tolist() == [0, 1, 3, 4, 5, 6, 8, 9, 10]
    assert np.array_equal(plain, queued)


def test_the_environment_variable_turns_overlap_on(loaded, tmp_path, monkeypatch):
    import vlbench.embed as embed

    path = write_images(tmp_path / "test.parquet", 5)
    calls = []
    real = embed.launch_batch
    monkeypatch.setattr(embed, "launch_batch", lambda *a: calls.append(1) or real(*a))
    embed_images(loaded, path, "shapes", "test", batch_size=2, num_workers=0, progress=False)
    assert calls == []
    monkeypatch.setenv(OVERLAP_VARIABLE, "1")
    embed_images(loaded, path, "shapes", "test", batch_size=2, num_workers=0, progress=False)
    assert len(calls) == 3


@cuda
@pytest.mark.parametrize("decode", ["pil", "torchvision"])
def test_overlap_on_cuda_gives_bitwise_the_same_features(toy_model_cfg, tmp_path, decode):
    from tests.test_decoding import write_photos

    write_photos(tmp_path / "prepared")
    gpu = load_model(toy_model_cfg, device="cuda")
    path = split_path(tmp_path / "prepared", "test")
    plain, rows_a = embed_images(gpu, path, "photos", "test", batch_size=3, num_workers=2, progress=False, decode=decode)
    queued, rows_b = embed_images(gpu, path, "photos", "test", batch_size=3, num_workers=2, progress=False,
                                  decode=decode, overlap=True)
    assert rows_a.tolist() == rows_b.tolist()
    assert np.array_equal(plain, queued)


def test_overlap_is_on_by_default_for_a_device_decoder_and_the_variable_decides(loaded, tmp_path, monkeypatch):
    import vlbench.embed as embed
    from vlbench.errors import VlbenchError

    path = write_images(tmp_path / "test.parquet", 5)
    calls = []
    real = embed.launch_batch
    monkeypatch.setattr(embed, "launch_batch", lambda *a: calls.append(1) or real(*a))
    monkeypatch.delenv(OVERLAP_VARIABLE, raising=False)
    embed_images(loaded, path, "shapes", "test", batch_size=2, num_workers=0, progress=False, decode="torchvision")
    assert len(calls) == 3  # torchvision: on (measured faster with it on the H200; docs/benchmarks.md)
    monkeypatch.setenv(OVERLAP_VARIABLE, "0")
    embed_images(loaded, path, "shapes", "test", batch_size=2, num_workers=0, progress=False, decode="torchvision")
    assert len(calls) == 3
    monkeypatch.setenv(OVERLAP_VARIABLE, "yes")
    with pytest.raises(VlbenchError, match=r"\$VLBENCH_EMBED_OVERLAP must be 1 \(on\) or 0 \(off\), got 'yes'"):
        embed_images(loaded, path, "shapes", "test", batch_size=2, num_workers=0, progress=False)


@cuda
def test_torchvision_on_cuda_decodes_in_batches_and_agrees_with_pil(toy_model_cfg, tmp_path, capsys):
    """nvJPEG's batched decode and the resize on the device: the PNGs fall back (counted), every embedding within
    the decoders' tolerance of pil's on the same device (docs/protocols.md "Image decoding")."""
    from tests.test_decoding import write_photos

    write_photos(tmp_path / "prepared")
    gpu = load_model(toy_model_cfg, device="cuda")
    path = split_path(tmp_path / "prepared", "test")
    pil, _ = embed_images(gpu, path, "photos", "test", batch_size=4, num_workers=2, progress=False)
    capsys.readouterr()
    tv, _ = embed_images(gpu, path, "photos", "test", batch_size=4, num_workers=2, progress=False, decode="torchvision")
    assert "embed photos/test: 3 of 12 images decoded on the CPU by Pillow, not on the device (not a JPEG 3)" \
        in capsys.readouterr().err
    cos = (pil * tv).sum(1) / np.linalg.norm(pil, axis=1) / np.linalg.norm(tv, axis=1)
    assert cos.min() > 0.99
