import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from tests.conftest import make_dataset
from vlbench.datasets.canonical import load_meta
from vlbench.embed import CorruptImageError, embed_image_splits, embed_text_sets, split_preprocess
from vlbench.features import MissingFeaturesError, StaleFeaturesError, read_features
from vlbench.models.loading import load_model


@pytest.fixture(scope="module")
def loaded(toy_model_cfg):
    return load_model(toy_model_cfg, device="cpu")


def test_embed_writes_every_split_with_fingerprint(loaded, tiny_dataset, tmp_path):
    out = tmp_path / "features" / "tiny" / "images"
    summary = embed_image_splits(loaded, tiny_dataset, out, batch_size=5, num_workers=0, progress=False)
    meta = load_meta(tiny_dataset)
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet"]
    assert summary["splits"]["train"]["images"] == 12
    feats = read_features(out / "train.parquet", {"model": "toy-random", "dataset_version": meta.version})
    source = pq.read_table(tiny_dataset / "splits" / "train.parquet", columns=["sample_id", "label"])
    assert feats.table.column("sample_id").to_pylist() == source.column("sample_id").to_pylist()
    assert feats.table.column("label").to_pylist() == source.column("label").to_pylist()
    assert feats.embeddings.shape == (12, loaded.model.text_projection.shape[1])
    assert feats.fingerprint["weights_sha256"] == loaded.fingerprint["weights_sha256"]


def test_text_sets_embed_apart_with_their_own_fingerprint(loaded, tiny_texts, tmp_path):
    from vlbench.texts import read_text_set

    out = tmp_path / "features" / "tiny" / "text"
    assert embed_text_sets(loaded, tiny_texts, out) == {"prompts": 6}
    _, stamp = read_text_set(tiny_texts / "prompts.parquet")
    text = read_features(out / "prompts.parquet", {"model": "toy-random", **stamp})
    assert text.fingerprint["text_set"] == "prompts" and len(text.fingerprint["text_version"]) == 16
    assert text.table.column_names == ["class_index", "source", "text"]
    assert text.table.column("text").to_pylist()[:2] == ["a red square.", "a photo of something red."]
    with torch.inference_mode():
        expected = loaded.model.encode_text(loaded.tokenizer(["a red square."])).numpy()[0]
    np.testing.assert_allclose(text.embeddings[0], expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(StaleFeaturesError, match="text_version"):
        read_features(out / "prompts.parquet", {**stamp, "text_version": "0123456789abcdef"})


def test_embeddings_match_the_model_and_do_not_depend_on_workers_or_batch(loaded, tiny_dataset, tmp_path):
    a = tmp_path / "a"
    b = tmp_path / "b"
    embed_image_splits(loaded, tiny_dataset, a, batch_size=5, num_workers=0, progress=False)
    embed_image_splits(loaded, tiny_dataset, b, batch_size=4, num_workers=2, progress=False)
    fa = read_features(a / "test.parquet", {})
    fb = read_features(b / "test.parquet", {})
    assert fa.table.column("sample_id").to_pylist() == fb.table.column("sample_id").to_pylist()
    np.testing.assert_allclose(fa.embeddings, fb.embeddings, rtol=1e-4, atol=1e-5)
    # the same image through the model by hand gives the stored row
    import io

    from PIL import Image
    first = pq.read_table(tiny_dataset / "splits" / "test.parquet").slice(0, 1).to_pylist()[0]
    with torch.inference_mode():
        x = loaded.preprocess(Image.open(io.BytesIO(first["image"])).convert("RGB"))[None]
        expected = loaded.model.encode_image(x).numpy()[0]
    np.testing.assert_allclose(fa.embeddings[0], expected, rtol=1e-4, atol=1e-5)


def test_reader_refuses_features_of_another_model_or_data_version(loaded, tiny_dataset, tmp_path):
    out = tmp_path / "features"
    embed_image_splits(loaded, tiny_dataset, out, num_workers=0, progress=False)
    with pytest.raises(StaleFeaturesError, match=r"model: file has 'toy-random', expected 'vitb16'"):
        read_features(out / "test.parquet", {"model": "vitb16"})
    with pytest.raises(StaleFeaturesError, match="dataset_version"):
        read_features(out / "test.parquet", {"dataset_version": "0123456789abcdef"})
    with pytest.raises(MissingFeaturesError, match="run the embed stages"):
        read_features(out / "val.parquet", {})


def test_regenerated_data_changes_the_version(tmp_path):
    a = make_dataset(tmp_path / "a", per_class=2)
    b = make_dataset(tmp_path / "b", per_class=3)
    c = make_dataset(tmp_path / "c", per_class=2)
    assert a.version != b.version and a.version == c.version


def test_corrupt_image_names_dataset_split_and_sample_and_leaves_no_output(loaded, tmp_path):
    data = tmp_path / "prepared" / "bad"
    make_dataset(data, name="bad", corrupt={"test": "test/004"})
    out = tmp_path / "features" / "bad"
    with pytest.raises(CorruptImageError, match=r"dataset 'bad' split 'test' sample 'test/004'"):
        embed_image_splits(loaded, data, out, num_workers=0, progress=False)
    assert not out.exists()
    assert list(out.parent.iterdir()) == []  # no temporary directory left behind either


def test_corrupt_image_error_crosses_dataloader_workers(loaded, tmp_path):
    data = tmp_path / "bad"
    make_dataset(data, name="bad", corrupt={"train": "train/001"})
    with pytest.raises(Exception, match=r"sample 'train/001'"):
        embed_image_splits(loaded, data, tmp_path / "out", num_workers=2, progress=False)


def test_skip_corrupt_records_the_skipped_ids(loaded, tmp_path):
    data = tmp_path / "bad"
    make_dataset(data, name="bad", corrupt={"test": "test/004"})
    out = tmp_path / "out"
    summary = embed_image_splits(loaded, data, out, num_workers=0, skip_corrupt=True, progress=False)
    assert summary["splits"]["test"]["skipped_corrupt"] == ["test/004"]
    feats = read_features(out / "test.parquet", {})
    assert "test/004" not in feats.table.column("sample_id").to_pylist()
    assert feats.table.num_rows == 11
    meta = pq.read_schema(out / "test.parquet").metadata
    assert json.loads(meta[b"vlbench.skipped_corrupt"]) == ["test/004"]


def test_existing_features_survive_a_failed_rerun(loaded, tmp_path):
    good = tmp_path / "good"
    make_dataset(good, name="x")
    out = tmp_path / "features"
    embed_image_splits(loaded, good, out, num_workers=0, progress=False)
    before = (out / "test.parquet").read_bytes()
    bad = tmp_path / "bad"
    make_dataset(bad, name="x", corrupt={"test": "test/000"})
    with pytest.raises(CorruptImageError):
        embed_image_splits(loaded, bad, out, num_workers=0, progress=False)
    assert (out / "test.parquet").read_bytes() == before


def test_workers_stop_at_uint8_and_the_device_finishes_with_identical_pixels(loaded, tiny_dataset):
    import io

    from PIL import Image
    decode, finish = split_preprocess(loaded.preprocess)
    image = Image.open(io.BytesIO(pq.read_table(tiny_dataset / "splits" / "test.parquet").column("image")[0].as_py())).convert("RGB")
    assert decode(image).dtype == torch.uint8
    assert torch.equal(finish(decode(image)[None])[0], loaded.preprocess(image))


def test_a_transform_of_another_shape_runs_whole_in_the_workers():
    transform = lambda img: torch.zeros(3, 2, 2)  # noqa: E731
    decode, finish = split_preprocess(transform)
    assert decode is transform
    batch = torch.ones(1, 3, 2, 2)
    assert finish(batch) is batch
