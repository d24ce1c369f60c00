"""CIFAR-10 / CIFAR-100 (`source: cifar`) on miniature archives in the official python-pickle format, served
from 127.0.0.1: download, md5, torchvision's parser, class order, superclasses, PNG images, provenance."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from tests.archives import write_tgz
from tests.http_server import serve
from vlbench.datasets import cifar
from vlbench.datasets.canonical import DatasetError
from vlbench.datasets.download import ChecksumError
from vlbench.datasets.registry import describe, prepare_dataset

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
# Facts of CIFAR-100 (meta file order and spelling; coarse label of each fine label).
CIFAR100_FINE = [
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle", "bottle", "bowl",
    "boy", "bridge", "bus", "butterfly", "camel", "can", "castle", "caterpillar", "cattle", "chair",
    "chimpanzee", "clock", "cloud", "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur", "dolphin",
    "elephant", "flatfish", "forest", "fox", "girl", "hamster", "house", "kangaroo", "keyboard", "lamp",
    "lawn_mower", "leopard", "lion", "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain",
    "mouse", "mushroom", "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear", "pickup_truck",
    "pine_tree", "plain", "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray", "road", "rocket",
    "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake", "spider", "squirrel",
    "streetcar", "sunflower", "sweet_pepper", "table", "tank", "telephone", "television", "tiger", "tractor",
    "train", "trout", "tulip", "turtle", "wardrobe", "whale", "willow_tree", "wolf", "woman", "worm",
]
CIFAR100_COARSE = [
    "aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables",
    "household_electrical_devices", "household_furniture", "insects", "large_carnivores",
    "large_man-made_outdoor_things", "large_natural_outdoor_scenes", "large_omnivores_and_herbivores",
    "medium_mammals", "non-insect_invertebrates", "people", "reptiles", "small_mammals", "trees", "vehicles_1",
    "vehicles_2",
]
FINE_TO_COARSE = [
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11, 6, 11, 5, 10, 7, 6, 13, 15, 3, 15, 0, 11, 1, 10,
    12, 14, 16, 9, 11, 5, 5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17, 10, 3, 2, 12, 12,
    16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13, 16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17,
    8, 14, 13,
]
REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "cifar100" / "cifar100_coarse_to_fine.json"


def _pickle(obj) -> bytes:
    return pickle.dumps(obj, protocol=2)  # the official files are Python 2 pickles


def _pixels(rng, n: int) -> np.ndarray:
    """n images as the official rows: 3072 uint8, the red plane, then green, then blue (32x32 each)."""
    return rng.integers(0, 256, (n, 3072), dtype=np.uint8)



def make_cifar10(www: Path, per_batch: int = 4, test: int = 6) -> dict:
    """cifar-10-python.tar.gz: data_batch_1..5, test_batch, batches.meta (the official member names)."""
    rng = np.random.default_rng(0)
    members, batches = {}, {}
    for name, n in [*((f"data_batch_{k}", per_batch) for k in range(1, 6)), ("test_batch", test)]:
        labels = [int(x) for x in rng.integers(0, 10, n)]
        batches[name] = {"batch_label": f"{name} of 5", "labels": labels, "data": _pixels(rng, n),
                         "filenames": [f"img_{name}_{i}.png" for i in range(n)]}
        members[f"cifar-10-batches-py/{name}"] = _pickle(batches[name])
    members["cifar-10-batches-py/batches.meta"] = _pickle(
        {"num_cases_per_batch": 10000, "label_names": CIFAR10_NAMES, "num_vis": 3072})
    members["cifar-10-batches-py/readme.html"] = b"<html></html>"
    archive = write_tgz(www / "cifar-10-python.tar.gz", members)
    return {"archive": archive, "batches": batches, "members": members}


def make_cifar100(www: Path, per_class_train: int = 2, per_class_test: int = 1) -> dict:
    """cifar-100-python.tar.gz: train, test, meta; every fine class appears in both splits."""
    rng = np.random.default_rng(1)
    members, batches = {}, {}
    for name, per_class in (("train", per_class_train), ("test", per_class_test)):
        fine = [int(x) for x in rng.permutation(np.repeat(np.arange(100), per_class))]
        batches[name] = {"filenames": [f"{name}_{i}.png" for i in range(len(fine))], "batch_label": f"{name} batch",
                         "fine_labels": fine, "coarse_labels": [FINE_TO_COARSE[f] for f in fine],
                         "data": _pixels(rng, len(fine))}
        members[f"cifar-100-python/{name}"] = _pickle(batches[name])
    members["cifar-100-python/meta"] = _pickle(
        {"fine_label_names": CIFAR100_FINE, "coarse_label_names": CIFAR100_COARSE})
    archive = write_tgz(www / "cifar-100-python.tar.gz", members)
    return {"archive": archive, "batches": batches, "members": members}


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def trust_miniature(monkeypatch, variant: str, members: dict[str, bytes]) -> None:
    """torchvision checks every batch file against the official md5s; point it at the miniature's instead."""
    import torchvision.datasets

    cls = getattr(torchvision.datasets, cifar.VARIANTS[variant].torchvision_class)
    digest = {m.split("/", 1)[1]: md5(data) for m, data in members.items()}
    monkeypatch.setattr(cls, "train_list", [[f, digest[f]] for f, _ in cls.train_list])
    monkeypatch.setattr(cls, "test_list", [[f, digest[f]] for f, _ in cls.test_list])
    monkeypatch.setattr(cls, "meta", {**cls.meta, "md5": digest[cls.meta["filename"]]})


def spec(variant: str, base: str, archive: Path, **override) -> dict:
    files = {"archive": {"file": archive.name, "url": f"{base}/{archive.name}",
                         "md5": md5(archive.read_bytes()), **override}}
    return {"source": "cifar", "variant": variant, "files": files}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "downloads"))
    monkeypatch.delenv("VLBENCH_MIRROR", raising=False)
    return tmp_path / "downloads"


def read(out: Path, split: str) -> list[dict]:
    return pq.read_table(out / "splits" / f"{split}.parquet").to_pylist()


def decode(png: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(png)) as im:
        assert im.format == "PNG" and im.mode == "RGB" and im.size == (32, 32)
        return np.asarray(im)


def official_hwc(row: np.ndarray) -> np.ndarray:
    return row.reshape(3, 32, 32).transpose(1, 2, 0)


def test_catalogue_rows_need_no_download(tmp_path):
    for variant, classes in (("cifar10", 10), ("cifar100", 100)):
        row = describe(variant + "-x", {"prepare": {"source": "cifar", "variant": variant}})
        assert row["classes"] == classes
        assert row["splits"] == {"train": 50_000, "test": 10_000}
        assert row["metric"] == "accuracy" and row["manual_download"] is False
    assert cifar.VARIANTS["cifar10"].archive["md5"] == "c58f30108f718f92721af3b95e74349a"
    assert cifar.VARIANTS["cifar100"].archive["md5"] == "eb9058c3a382ffc7106e4002c42a8d85"


def test_official_md5s_are_torchvisions():
    import torchvision.datasets as tvd

    for variant in cifar.VARIANTS.values():
        cls = getattr(tvd, variant.torchvision_class)
        assert (cls.filename, cls.tgz_md5, cls.url) == (variant.archive["file"], variant.archive["md5"],
                                                         variant.archive["url"])


def test_cifar10_downloaded_parsed_and_stored_as_lossless_png(tmp_path, cache, monkeypatch):
    www = tmp_path / "www"
    www.mkdir()
    mini = make_cifar10(www)
    trust_miniature(monkeypatch, "cifar10", mini["members"])
    out = tmp_path / "prepared" / "cifar10"
    with serve(www) as base:
        meta = prepare_dataset("cifar10", spec("cifar10", base, mini["archive"]), out)
        assert base.requests["/cifar-10-python.tar.gz"] == 1

    assert meta.splits == {"train": 20, "test": 6}
    classes = json.loads((out / "classes.json").read_text())
    assert [c["name"] for c in classes["classes"]] == CIFAR10_NAMES
    assert classes["metric"] == "accuracy" and classes["task"] == "single-label"
    assert all("group" not in c for c in classes["classes"])

    train = read(out, "train")
    expected_labels = [y for k in range(1, 6) for y in mini["batches"][f"data_batch_{k}"]["labels"]]
    assert [r["label"] for r in train] == expected_labels  # official order: batch 1..5, then position
    assert [r["sample_id"] for r in train[:2]] == ["train/00000", "train/00001"]
    pixels = np.concatenate([mini["batches"][f"data_batch_{k}"]["data"] for k in range(1, 6)])
    for row, official in zip(train, pixels):
        assert np.array_equal(decode(row["image"]), official_hwc(official))
    test = read(out, "test")
    assert [r["label"] for r in test] == mini["batches"]["test_batch"]["labels"]
    assert np.array_equal(decode(test[5]["image"]), official_hwc(mini["batches"]["test_batch"]["data"][5]))

    files = classes["provenance"]["files"]["archive"]
    assert files["file"] == "cifar-10-python.tar.gz" and files["md5"] == md5(mini["archive"].read_bytes())
    assert files["sha256"] == hashlib.sha256(mini["archive"].read_bytes()).hexdigest() and files["verified"]
    assert classes["provenance"]["variant"] == "cifar10" and classes["splits"] == {"train": 20, "test": 6}


def test_cifar100_superclasses_as_groups_and_coarse_label_column(tmp_path, cache, monkeypatch):
    www = tmp_path / "www"
    www.mkdir()
    mini = make_cifar100(www)
    trust_miniature(monkeypatch, "cifar100", mini["members"])
    out = tmp_path / "prepared" / "cifar100"
    with serve(www) as base:
        meta = prepare_dataset("cifar100", spec("cifar100", base, mini["archive"]), out)

    assert meta.splits == {"train": 200, "test": 100}
    classes = json.loads((out / "classes.json").read_text())["classes"]
    assert len(classes) == 100
    assert [c["key"] for c in classes] == CIFAR100_FINE  # official label order and spelling
    assert classes[0] == {"index": 0, "name": "apple", "key": "apple", "group": "fruit_and_vegetables"}
    maple = classes[CIFAR100_FINE.index("maple_tree")]
    assert (maple["name"], maple["group"]) == ("maple tree", "trees")
    assert classes[CIFAR100_FINE.index("beaver")]["group"] == "aquatic_mammals"
    groups = {}
    for c in classes:
        groups.setdefault(c["group"], []).append(c["index"])
    assert sorted(groups) == sorted(CIFAR100_COARSE)
    assert all(len(members) == 5 for members in groups.values())

    for split in ("train", "test"):
        rows = read(out, split)
        batch = mini["batches"][split]
        assert [r["label"] for r in rows] == batch["fine_labels"]
        assert [r["coarse_label"] for r in rows] == batch["coarse_labels"]
        assert all(CIFAR100_COARSE[r["coarse_label"]] == classes[r["label"]]["group"] for r in rows)
    assert json.loads((out / "classes.json").read_text())["provenance"]["superclasses"] == CIFAR100_COARSE


@pytest.mark.skipif(not REFERENCE.is_file(), reason="shared reference copy of the CIFAR-100 superclasses absent")
def test_the_miniature_superclass_facts_match_the_reference():
    ref = json.loads(REFERENCE.read_text())
    assert ref["fine_label_names"] == CIFAR100_FINE and ref["coarse_label_names"] == CIFAR100_COARSE
    assert ref["fine_to_coarse_index"] == FINE_TO_COARSE


def test_wrong_archive_checksum_is_refused_and_nothing_is_prepared(tmp_path, cache):
    www = tmp_path / "www"
    www.mkdir()
    mini = make_cifar10(www)
    out = tmp_path / "prepared" / "cifar10"
    with serve(www) as base, pytest.raises(ChecksumError, match="cifar-10-python.tar.gz"):
        prepare_dataset("cifar10", spec("cifar10", base, mini["archive"], md5="0" * 32), out)
    assert not out.exists()


def test_torchvision_member_checksums_still_apply(tmp_path, cache):
    """Without the test's md5 patch, torchvision refuses the miniature's batch files: a clear DatasetError."""
    www = tmp_path / "www"
    www.mkdir()
    mini = make_cifar10(www)
    with serve(www) as base, pytest.raises(DatasetError, match=r"torchvision's CIFAR10 cannot read .*cifar-10-batches-py"):
        prepare_dataset("cifar10", spec("cifar10", base, mini["archive"]), tmp_path / "out")


def test_spec_errors_name_the_key():
    with pytest.raises(DatasetError, match="'variant' must be one of cifar10, cifar100, got 'cifar1000'"):
        cifar.catalogue_row("c", {"source": "cifar", "variant": "cifar1000"})
    with pytest.raises(DatasetError, match=r"unknown spec key\(s\) \['varient'\].*did you mean 'variant'"):
        cifar.catalogue_row("c", {"source": "cifar", "varient": "cifar10"})
    with pytest.raises(DatasetError, match=r"unknown file role\(s\) \['tarball'\]"):
        cifar.build("c", {"source": "cifar", "variant": "cifar10", "files": {"tarball": {}}}, Path("unused"))
