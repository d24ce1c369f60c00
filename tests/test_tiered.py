"""tieredImageNet over ImageNet's validation images: split CSVs served from 127.0.0.1 and verified, miniature ImageNet
files in a mirror, categories named from real WordNet; the real split files when the shared reference is present."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.http_server import serve
from tests.test_imagenet import fake_wnids, files_spec, make_imagenet, trust_devkit
from vlbench.datasets import imagenet, tiered
from vlbench.datasets.canonical import DatasetError
from vlbench.datasets.registry import describe, prepare_dataset
from vlbench.wordnet import load_wordnet, wnid_of

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "tiered_imagenet"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "downloads"))
    monkeypatch.setenv("VLBENCH_MIRROR", str(tmp_path / "mirror"))


def real_categories(n: int = tiered.CATEGORIES) -> list[str]:
    """n real WordNet noun ids (animal and artifact kinds) to stand for tieredImageNet's categories."""
    wn = load_wordnet()
    roots = [wn.synset("dog.n.01"), wn.synset("bird.n.01"), wn.synset("vehicle.n.01")]
    found = [wnid_of(s) for root in roots for s in root.hyponyms()]
    return sorted(dict.fromkeys(found))[:n]


def write_split_files(www: Path, classes: list[str], categories: list[str]) -> dict[str, dict]:
    """train/val/test CSVs over `classes` (class k in category k % 34), and their spec entries for `base`."""
    www.mkdir(parents=True, exist_ok=True)
    parts = {"train": classes[:351], "val": classes[351:448], "test": classes[448:]}
    for split, members in parts.items():
        rows = [f"{c},{categories[classes.index(c) % len(categories)]}" for c in members]
        (www / f"{split}.csv").write_text("\n".join(rows) + "\n")
    return parts


def split_spec(www: Path, base: str) -> dict:
    return {f"split_{s}": {**tiered.SPLIT_FILES[f"split_{s}"], "url": f"{base}/{s}.csv",
                           "sha256": hashlib.sha256((www / f"{s}.csv").read_bytes()).hexdigest()}
            for s in tiered.SPLIT_SHA256}


def test_catalogue_row_needs_no_download():
    row = describe("tiered-imagenet", {"prepare": {"source": "tiered"}, "input": "vlbench/datasets/tiered.py"})
    assert (row["classes"], row["splits"], row["manual_download"]) == (608, {"test": 30_400}, True)


def test_prepared_with_categories_as_groups(tmp_path, cache, monkeypatch):
    wnids = fake_wnids()
    classes = wnids[-tiered.CLASSES:]  # the last 608 of the 1000, in standard order
    categories = real_categories()
    parts = write_split_files(tmp_path / "www", classes, categories)
    index = {w: i for i, w in enumerate(wnids)}
    images = [index[classes[0]], 1, index[classes[500]], index[classes[33]], 3]  # 1 and 3 are not tiered classes
    mini = make_imagenet(tmp_path / "mirror", images, wnids=wnids)
    trust_devkit(monkeypatch, mini["devkit"])
    out = tmp_path / "prepared" / "tiered-imagenet"
    with serve(tmp_path / "www") as base:
        meta = prepare_dataset("tiered-imagenet", {"source": "tiered", "files": {**split_spec(tmp_path / "www", base),
                                                                               **files_spec(mini)}}, out)
    saved = json.loads((out / "classes.json").read_text())
    assert len(saved["classes"]) == 608 and [c["wnid"] for c in saved["classes"]] == classes
    wn = load_wordnet()
    from vlbench.wordnet import synset_from_wnid

    first = synset_from_wnid(wn, categories[0]).lemma_names()[0].replace("_", " ")
    assert saved["classes"][0]["group"] == first and saved["classes"][34]["group"] == first  # 0 and 34 share a category
    assert len({c["group"] for c in saved["classes"]}) == 34
    assert saved["classes"][0]["name"] == imagenet.clip_classnames()[index[classes[0]]]
    rows = pq.read_table(out / "splits" / "test.parquet").to_pylist()
    assert meta.splits == {"test": 3}
    rows = sorted(rows, key=lambda r: r["sample_id"])  # tar order
    assert [(r["sample_id"], r["label"], r["tiered_split"]) for r in rows] == [
        ("ILSVRC2012_val_00000001.JPEG", 0, "train"), ("ILSVRC2012_val_00000003.JPEG", 500, "test"),
        ("ILSVRC2012_val_00000004.JPEG", 33, "train")]
    assert rows[0]["category"] == 0 and rows[2]["category"] == 33
    assert len(parts["test"]) == 160 and saved["provenance"]["files"]["split_train"]["verified"] is True


def test_split_files_with_a_class_listed_twice_are_refused(tmp_path):
    for split in ("train", "val", "test"):
        (tmp_path / f"{split}.csv").write_text("n00000001,n00000002\n")
    paths = {f"split_{s}": tmp_path / f"{s}.csv" for s in ("train", "val", "test")}
    with pytest.raises(DatasetError, match=r"val.csv line 1: class n00000001 is listed twice"):
        tiered.read_split_files("tiered-imagenet", paths)


@pytest.mark.skipif(not (REFERENCE / "train.csv").exists(), reason="no shared reference")
def test_real_split_files_give_608_classes_in_34_named_categories():
    category_of = tiered.read_split_files("tiered-imagenet", {f"split_{s}": REFERENCE / f"{s}.csv"
                                                              for s in ("train", "val", "test")})
    categories = sorted({c for c, _ in category_of.values()})
    assert (len(category_of), len(categories)) == (608, 34)
    for s, sha in tiered.SPLIT_SHA256.items():
        assert hashlib.sha256((REFERENCE / f"{s}.csv").read_bytes()).hexdigest() == sha
    names = tiered.category_names("tiered-imagenet", categories)
    assert len(set(names.values())) == 34 and not any("(" in n for n in names.values())
