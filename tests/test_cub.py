"""CUB-200-2011 (`source: cub`) on a miniature CUB_200_2011.tgz in the official layout, served from 127.0.0.1:
download and checksum, class names, splits by train_test_split.txt, labels by image_class_labels.txt."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from PIL import Image

from tests.archives import real_spec, sha256, write_tgz
from tests.http_server import serve
from vlbench.cli import main as cli
from vlbench.datasets import cub
from vlbench.datasets.canonical import DatasetError
from vlbench.datasets.download import ChecksumError
from vlbench.datasets.registry import describe, prepare_dataset

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ["001.Black_footed_Albatross", "002.Laysan_Albatross", "003.Sooty_Albatross"]
# (image id, class id, train flag): ids interleave classes and splits as the real listing does
IMAGES = [(1, 1, 1), (2, 1, 0), (3, 1, 1), (4, 2, 0), (5, 2, 1), (6, 3, 0), (7, 3, 0), (8, 3, 1)]


def _jpeg(shade: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 4), (shade, 0, 0)).save(out, "JPEG")
    return out.getvalue()


def make_cub(www: Path, drop: str | None = None) -> Path:
    paths = {i: f"{FOLDERS[c - 1]}/{FOLDERS[c - 1].split('.')[1]}_{i:04d}.jpg" for i, c, _ in IMAGES}
    root = "CUB_200_2011/"
    members = {root + "images/" + paths[i]: _jpeg(10 * i) for i, _, _ in IMAGES if paths[i] != drop}
    members[root + "classes.txt"] = "".join(f"{k} {f}\n" for k, f in enumerate(FOLDERS, 1)).encode()
    members[root + "images.txt"] = "".join(f"{i} {paths[i]}\n" for i, _, _ in IMAGES).encode()
    members[root + "image_class_labels.txt"] = "".join(f"{i} {c}\n" for i, c, _ in IMAGES).encode()
    members[root + "train_test_split.txt"] = "".join(f"{i} {t}\n" for i, _, t in IMAGES).encode()
    members["attributes.txt"] = b"1 has_bill_shape::curved\n"
    return write_tgz(www / "CUB_200_2011.tgz", members)


def spec(base: str, archive: Path, **override) -> dict:
    return {"source": "cub", "files": {"archive": {"file": archive.name, "url": f"{base}/{archive.name}",
                                                   "sha256": sha256(archive), **override}}}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "downloads"))
    monkeypatch.delenv("VLBENCH_MIRROR", raising=False)
    return tmp_path / "downloads"


def test_entry_catalogue_and_official_checksum(monkeypatch):
    monkeypatch.chdir(ROOT)
    listed = json.loads(CliRunner().invoke(cli, ["datasets", "--json"]).output)
    assert next(r for r in listed if r["name"] == "cub") == {
        "name": "cub", "source": "cub", "classes": 200, "splits": {"train": 5994, "test": 5794}, "metric": "accuracy",
        "manual_download": False, "base": 160, "novel": 40}  # FewTrans' CUB split (fewtrans_splits.json)
    row = describe("cub", {"prepare": real_spec("cub")})
    assert (row["source"], row["classes"], row["splits"]) == ("cub", 200, {"train": 5994, "test": 5794})
    assert row["manual_download"] is False
    assert cub.ARCHIVE["sha256"] == "0c685df5597a8b24909f6a7c9db6d11e008733779a671760afef78feb49bf081"


def test_miniature_archive_prepared(tmp_path, cache):
    www = tmp_path / "www"
    archive = make_cub(www)
    out = tmp_path / "prepared" / "cub"
    with serve(www) as base:
        meta = prepare_dataset("cub", spec(base, archive), out)
    assert meta.splits == {"train": 4, "test": 4}
    classes = json.loads((out / "classes.json").read_text())["classes"]
    assert [c["name"] for c in classes] == ["Black footed Albatross", "Laysan Albatross", "Sooty Albatross"]
    assert [c["key"] for c in classes] == FOLDERS
    rows = {s: pq.read_table(out / "splits" / f"{s}.parquet").to_pylist() for s in ("train", "test")}
    for split, flag in (("train", 1), ("test", 0)):
        got = {(r["sample_id"].split("/")[0], r["label"]) for r in rows[split]}
        assert got == {(FOLDERS[c - 1], c - 1) for _, c, t in IMAGES if t == flag}
    assert rows["train"][0]["sample_id"] == "001.Black_footed_Albatross/Black_footed_Albatross_0001.jpg"
    assert rows["train"][0]["image"] == _jpeg(10)


def test_wrong_checksum_is_one_error_naming_the_file(tmp_path, cache):
    www = tmp_path / "www"
    archive = make_cub(www)
    out = tmp_path / "prepared" / "cub"
    with serve(www) as base, pytest.raises(ChecksumError, match="CUB_200_2011.tgz"):
        prepare_dataset("cub", spec(base, archive, sha256="0" * 64), out)
    assert not out.exists()


def test_listed_image_missing_from_archive_is_named(tmp_path, cache):
    www = tmp_path / "www"
    archive = make_cub(www, drop="003.Sooty_Albatross/Sooty_Albatross_0007.jpg")
    with serve(www) as base, pytest.raises(DatasetError, match="holds 3 of the 4 test images"):
        prepare_dataset("cub", spec(base, archive), tmp_path / "prepared" / "cub")
