"""The canonical format's own checks: class keys, metric applicability, empty splits, image decodability, spec keys."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image

from vlbench.datasets.canonical import ClassInfo, DatasetError, DatasetMeta, image_problem, load_meta, write_dataset
from vlbench.datasets.spec import check_keys


def png() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def meta(n: int = 3, task: str = "single-label", metric: str = "accuracy", name: str = "d") -> DatasetMeta:
    return DatasetMeta(name=name, task=task, metric=metric, classes=[ClassInfo(i, f"c{i}") for i in range(n)])


def rows(n: int):
    return ({"sample_id": f"s{i}", "label": 0, "image": png()} for i in range(n))


# ------------------------------------------------------------------------------------------- ClassInfo.key


def test_class_key_is_written_beside_the_name_and_read_back(tmp_path):
    classes = [ClassInfo(0, "big dog", key="dog_big"), ClassInfo(1, "cat")]
    m = DatasetMeta(name="d", task="single-label", metric="accuracy", classes=classes)
    assert list(classes[0].to_json()) == ["index", "name", "key"]
    assert classes[1].to_json() == {"index": 1, "name": "cat"}  # no key: left out
    write_dataset(tmp_path / "out", m, {"test": rows(2)})
    on_disk = json.loads((tmp_path / "out" / "classes.json").read_text())["classes"]
    assert on_disk == [{"index": 0, "name": "big dog", "key": "dog_big"}, {"index": 1, "name": "cat"}]
    assert [c.key for c in load_meta(tmp_path / "out").classes] == ["dog_big", None]


# ---------------------------------------------------------------------------------- metric applicability


@pytest.mark.parametrize("n, task, metric", [
    (3, "single-label", "roc_auc"),
    (1, "single-label", "roc_auc"),
    (2, "multi-label", "roc_auc"),
    (3, "single-label", "map_11point"),
    (3, "captions", "map_11point"),
    (3, "multi-label", "accuracy"),
    (3, "multi-label", "mean_per_class"),
])
def test_metric_that_cannot_apply_is_refused(n, task, metric):
    with pytest.raises(DatasetError) as err:
        meta(n, task, metric, name="memes")
    msg = str(err.value)
    assert "'memes'" in msg and repr(metric) in msg and f"{n} class" in msg and task in msg


@pytest.mark.parametrize("n, task, metric", [
    (2, "single-label", "roc_auc"),
    (3, "single-label", "accuracy"),
    (3, "single-label", "mean_per_class"),
    (3, "captions", "accuracy"),
    (3, "multi-label", "map_11point"),
])
def test_metric_that_applies_is_accepted(n, task, metric):
    assert meta(n, task, metric).metric == metric


def test_roc_auc_message_says_binary_only():
    with pytest.raises(DatasetError, match=r"binary.*2 classes"):
        meta(3, "single-label", "roc_auc")


# ---------------------------------------------------------------------------------------------- empty splits


def test_empty_split_is_refused_naming_dataset_and_split(tmp_path):
    with pytest.raises(DatasetError, match=r"dataset 'd' split 'val': empty split"):
        write_dataset(tmp_path / "out", meta(), {"train": rows(2), "val": rows(0)})
    assert not (tmp_path / "out").exists()  # atomic: nothing half-written


def test_dataset_without_splits_is_refused(tmp_path):
    with pytest.raises(DatasetError, match=r"dataset 'd': no splits"):
        write_dataset(tmp_path / "out", meta(), {})
    assert not (tmp_path / "out").exists()


# -------------------------------------------------------------------------------------------- image_problem


def test_image_problem_detects_truncated_jpeg():
    buf = io.BytesIO()
    Image.fromarray(np.zeros((32, 32, 3), np.uint8) + 80).save(buf, "JPEG")
    data = buf.getvalue()
    assert image_problem(data) is None
    assert image_problem(data[:-30]) is not None  # passes PIL's verify(), fails decoding
    assert image_problem(b"not an image") is not None


# ---------------------------------------------------------------------------------------------- spec keys


def test_check_keys_names_dataset_source_unknown_and_allowed_keys():
    check_keys("ok", {"source": "x", "a": 1}, ("source", "a", "b"))
    with pytest.raises(DatasetError) as err:
        check_keys("pets", {"source": "imagefolder", "clasnames": [], "zzz": 1}, ("source", "classnames", "root"))
    msg = str(err.value)
    assert msg.startswith("dataset 'pets': unknown spec key(s) ['clasnames', 'zzz'] for source 'imagefolder'")
    assert "did you mean 'classnames'" in msg and "allowed keys: source, classnames, root" in msg
