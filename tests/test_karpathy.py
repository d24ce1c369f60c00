"""Karpathy's caption splits (`source: karpathy`): a miniature caption_datasets.zip (dataset_coco.json and
dataset_flickr30k.json in Karpathy's structure), val2014.zip and a flickr30k-images.tar.gz, served from 127.0.0.1 or
placed by hand, prepared, checked, and turned into the captions text sets retrieval reads."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.archives import real_spec, write_tgz, write_zip
from tests.http_server import serve
from tests.test_coco import jpeg
from vlbench.datasets import karpathy
from vlbench.datasets.canonical import DatasetError, load_meta
from vlbench.datasets.download import ManualDownloadError
from vlbench.datasets.registry import catalogue, describe, prepare_dataset
from vlbench.texts import build_text_sets

# COCO: Karpathy's test images are val2014 images; other splits mix train2014 and val2014 (restval).
COCO_IMAGES = [  # (cocoid, folder, split, captions)
    (391895, "val2014", "test", 5), (522418, "train2014", "train", 5), (184613, "val2014", "test", 6),
    (318219, "val2014", "restval", 5), (554625, "val2014", "val", 5), (397133, "val2014", "test", 7),
]


def coco_name(cocoid: int, folder: str) -> str:
    return f"COCO_{folder}_{cocoid:012d}.jpg"


def sentence(text: str, imgid: int, sentid: int) -> dict:
    tokens = [w.strip(".,").lower() for w in text.split()]
    return {"tokens": tokens, "raw": text, "imgid": imgid, "sentid": sentid}


def dataset_coco(images=COCO_IMAGES) -> dict:
    out, sentid = [], 0
    for imgid, (cocoid, folder, split, n) in enumerate(images):
        sentences = [sentence(f" A photo, number {k}, of image {cocoid}. " if k else f"A Dog of {cocoid}.", imgid,
                              sentid + k) for k in range(n)]
        out.append({"filepath": folder, "sentids": [s["sentid"] for s in sentences], "filename": coco_name(cocoid, folder),
                    "imgid": imgid, "split": split, "sentences": sentences, "cocoid": cocoid})
        sentid += n
    return {"images": out, "dataset": "coco"}


def dataset_flickr(ids=(1000092795, 10002456, 1000268201, 101669240), splits=("test", "train", "test", "val")) -> dict:
    images = [{"sentids": [5 * i + k for k in range(5)], "imgid": i, "split": split, "filename": f"{fid}.jpg",
               "sentences": [sentence(f"Flickr caption {k} of {fid}", i, 5 * i + k) for k in range(5)]}
              for i, (fid, split) in enumerate(zip(ids, splits))]
    return {"images": images, "dataset": "flickr30k"}


def write_splits(www: Path, coco: dict | None = None, flickr: dict | None = None) -> None:
    write_zip(www / "caption_datasets.zip", {
        "dataset_coco.json": json.dumps(coco or dataset_coco()).encode(),
        "dataset_flickr30k.json": json.dumps(flickr or dataset_flickr()).encode(),
        "dataset_flickr8k.json": b'{"images": [], "dataset": "flickr8k"}'})


def write_val2014(www: Path, images=COCO_IMAGES) -> dict[str, bytes]:
    data = {f"val2014/{coco_name(c, f)}": jpeg(c % 1000) for c, f, _, _ in images if f == "val2014"}
    write_zip(www / "val2014.zip", data)
    return data


def coco_spec(base_url: str, www: Path, size: int = 3) -> dict:
    """The real entry's spec pointed at the served miniature, with the miniature's checksum and size."""
    from tests.archives import sha256

    spec = copy.deepcopy(real_spec("coco-karpathy-5k"))
    spec["annotations"]["urls"] = [f"{base_url}/caption_datasets.zip"]
    spec["images"]["urls"] = [f"{base_url}/val2014.zip"]
    spec["images"]["sha256"] = sha256(www / "val2014.zip")
    spec["splits"] = {"test": size}
    return spec


@pytest.fixture
def www(dirs):
    return dirs[0]


def test_coco_karpathy_test_split_prepared_in_file_order_with_every_caption(www, dirs):
    write_splits(www)
    images = write_val2014(www)
    out = dirs[2]
    with serve(www) as base_url:
        meta = prepare_dataset("coco-karpathy-5k", coco_spec(base_url, www), out)
    assert (meta.task, meta.splits, [c.name for c in meta.classes]) == ("captions", {"test": 3}, ["image"])
    rows = pq.read_table(out / "splits" / "test.parquet").to_pylist()
    assert [r["sample_id"] for r in rows] == ["COCO_val2014_000000391895", "COCO_val2014_000000184613",
                                              "COCO_val2014_000000397133"]  # the file's order, test images only
    assert [len(r["captions"]) for r in rows] == [5, 6, 7]  # none dropped
    assert rows[0]["captions"][:2] == ["A Dog of 391895.", "A photo, number 1, of image 391895."]  # raw, stripped
    assert [r["karpathy_id"] for r in rows] == [0, 2, 5] and {r["label"] for r in rows} == {0}
    assert rows[1]["image"] == images["val2014/COCO_val2014_000000184613.jpg"]  # bytes as distributed
    prov = load_meta(out).provenance
    assert prov["karpathy_splits"] == {"restval": 1, "test": 3, "train": 1, "val": 1}
    assert prov["captions"] == 18 and prov["captions_per_image"] == {"5": 1, "6": 1, "7": 1}
    files = {f["file"]: f for f in prov["files"]}
    assert files["val2014.zip"]["verified"] is True and files["caption_datasets.zip"]["verified"] is False

    sets = build_text_sets(meta, out, real_spec_entry("coco-karpathy-5k")["texts"])
    assert sorted(sets) == ["captions", "captions_prompted", "prompts"]
    raw, prompted = sets["captions"].to_pylist(), sets["captions_prompted"].to_pylist()
    assert len(raw) == len(prompted) == 18
    assert prompted[0] == {"sample_id": "COCO_val2014_000000391895", "source": "caption",
                           "text": "a photo of A Dog of 391895."}
    assert [p["sample_id"] for p in prompted] == [r["sample_id"] for r in raw]


def test_flickr_images_are_a_manual_download_then_prepared(www, dirs, monkeypatch):
    write_splits(www)
    flickr = {f"flickr30k-images/{fid}.jpg": jpeg(i) for i, fid in enumerate((1000092795, 10002456, 1000268201,
                                                                              101669240))}
    spec = copy.deepcopy(real_spec("flickr30k-karpathy-1k"))
    spec["splits"] = {"test": 2}
    with serve(www) as base_url:
        spec["annotations"]["urls"] = [f"{base_url}/caption_datasets.zip"]
        with pytest.raises(ManualDownloadError, match="needs the file 'flickr30k-images.tar.gz'.*shannon.cs.illinois.edu"
                                                      ".*folder flickr30k-images/"):
            prepare_dataset("flickr30k-karpathy-1k", spec, dirs[2])
        write_tgz(dirs[1] / "flickr30k-images.tar.gz", flickr)  # placed by hand in the mirror folder
        meta = prepare_dataset("flickr30k-karpathy-1k", spec, dirs[2])
    rows = pq.read_table(dirs[2] / "splits" / "test.parquet").to_pylist()
    assert meta.splits == {"test": 2} and [r["sample_id"] for r in rows] == ["1000092795", "1000268201"]
    assert rows[1]["captions"] == [f"Flickr caption {k} of 1000268201" for k in range(5)]
    assert rows[1]["image"] == flickr["flickr30k-images/1000268201.jpg"]


def test_a_split_of_another_size_or_missing_is_named(www, dirs):
    write_splits(www)
    write_val2014(www)
    with serve(www) as base_url:
        with pytest.raises(DatasetError, match=r"dataset_coco.json lists 3 images in split 'test', expected 5000 .*"
                                               r"'restval': 1, 'test': 3"):
            prepare_dataset("coco-karpathy-5k", coco_spec(base_url, www, size=5000), dirs[2])
        spec = {**coco_spec(base_url, www), "karpathy_split": "testing", "splits": {"testing": 3}}
        with pytest.raises(DatasetError, match="has no image in split 'testing'; its splits: "):
            prepare_dataset("coco-karpathy-5k", spec, dirs[2])


def test_a_test_image_outside_the_image_archive_is_named(www, dirs):
    """A Karpathy test image in train2014 (not in val2014.zip) is reported with its folder and file."""
    images = [*COCO_IMAGES[:2], (999, "train2014", "test", 5)]
    write_splits(www, coco=dataset_coco(images))
    write_val2014(www)
    with serve(www) as base_url:
        with pytest.raises(DatasetError, match="1 image\\(s\\) of the split are not in val2014.zip: "
                                               "train2014/COCO_train2014_000000000999.jpg"):
            prepare_dataset("coco-karpathy-5k", coco_spec(base_url, www, size=2), dirs[2])


def test_bad_split_files_are_one_line_errors_and_forgotten(www, dirs):
    broken = dataset_coco()
    del broken["images"][2]["sentences"][0]["raw"]
    write_splits(www, coco=broken)
    write_val2014(www)
    with serve(www) as base_url:
        with pytest.raises(DatasetError, match=r"dataset_coco.json: image 'COCO_val2014_000000184613.jpg' \(imgid 2\)"
                                               r".*sentences\[0\] lacks \['raw'\].*caption_datasets.zip: "):
            prepare_dataset("coco-karpathy-5k", coco_spec(base_url, www), dirs[2])
        write_zip(www / "caption_datasets.zip", {"other.json": b"{}"})
        with pytest.raises(DatasetError, match="caption_datasets.zip has no member named 'dataset_coco.json'; its "
                                               "members: other.json"):
            prepare_dataset("coco-karpathy-5k", coco_spec(base_url, www), dirs[2])
    with pytest.raises(DatasetError, match="unknown spec key\\(s\\) \\['split'\\]"):
        karpathy.parse_spec("x", {**real_spec("coco-karpathy-5k"), "split": "test"})
    with pytest.raises(DatasetError, match="'image_folder' must be a relative folder"):
        karpathy.parse_spec("x", {**real_spec("coco-karpathy-5k"), "image_folder": "../x"})


def test_the_catalogue_lists_both_entries_without_downloading():
    rows = {r["name"]: r for r in catalogue()}
    coco = rows["coco-karpathy-5k"]
    assert (coco["source"], coco["classes"], coco["splits"], coco["manual_download"]) == ("karpathy", 1, {"test": 5000},
                                                                                          False)
    assert describe("flickr30k-karpathy-1k", real_spec_entry("flickr30k-karpathy-1k"))["manual_download"] is True
    assert rows["flickr30k-karpathy-1k"]["splits"] == {"test": 1000}


def real_spec_entry(name: str) -> dict:
    from omegaconf import OmegaConf

    from tests.archives import CONF

    return OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml"), resolve=True)


def test_caption_prompt_needs_a_placeholder_and_captions(tmp_path):
    from vlbench.texts import prompted_captions, text_table

    captions = text_table("sample_id", ["a", "a"], ["caption", "caption"], ["A dog.", "A cat."])
    assert prompted_captions("d", captions, "a photo of {c}").column("text").to_pylist() == [
        "a photo of A dog.", "a photo of A cat."]
    with pytest.raises(DatasetError, match="dataset 'd': texts.caption_prompt must be a text with a '\\{c\\}'"):
        prompted_captions("d", captions, "a photo of")
    with pytest.raises(DatasetError, match="texts.caption_prompt is set but the prepared dataset has no captions"):
        prompted_captions("d", None, "a photo of {c}")
