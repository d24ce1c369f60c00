"""CoOp's split files (`source: coop`): miniature split_zhou_*.json files and image archives in the upstream layouts,
served from 127.0.0.1 or placed in the local mirror folder, prepared and checked."""

from __future__ import annotations

import copy
import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf
from PIL import Image

from tests.archives import md5, real_spec, write_tgz, write_zip
from tests.http_server import serve
from vlbench.datasets import coop
from vlbench.datasets.canonical import DatasetError, load_meta
from vlbench.datasets.download import ManualDownloadError
from vlbench.datasets.registry import describe, prepare_dataset

CONF = Path(__file__).resolve().parents[1] / "conf" / "dataset"
# CoOp's published statistics (CoOp paper, dataset table): classes, train, val, test.
COOP_TABLE = {
    "coop-caltech101": (100, 4128, 1649, 2465),
    "coop-sun397": (397, 15880, 3970, 19850),
    "coop-flowers102": (102, 4093, 1633, 2463),
    "coop-pets": (37, 2944, 736, 3669),
    "coop-cars": (196, 6509, 1635, 8041),
}


def jpeg(seed: int, size: int = 10) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def read_split(out: Path, split: str) -> list[dict]:
    return pq.read_table(out / "splits" / f"{split}.parquet").to_pylist()


# ------------------------------------------------------------------------------------- Flowers102 layout

FLOWER_NAMES = ["pink primrose", "hard-leaved pocket orchid", "canterbury bells"]


def flowers_split() -> dict:
    """12 images image_00001..12.jpg, label = (k - 1) % 3; test listed in a shuffled order."""
    def entry(k):
        return [f"image_{k:05d}.jpg", (k - 1) % 3, FLOWER_NAMES[(k - 1) % 3]]
    return {"train": [entry(k) for k in (1, 2, 3, 4, 5, 6)], "val": [entry(k) for k in (7, 8, 9)],
            "test": [entry(k) for k in (12, 10, 11)]}


def flowers_files(www: Path, mirror: Path, split: dict | None = None, images: dict | None = None) -> dict:
    """102flowers.tgz (jpg/image_NNNNN.jpg) served, split_zhou_OxfordFlowers.json in the mirror; the spec of our
    real entry with the URL, md5 and sizes of the miniature."""
    split = split if split is not None else flowers_split()
    images = images if images is not None else {f"jpg/image_{k:05d}.jpg": jpeg(k) for k in range(1, 13)}
    archive = write_tgz(www / "102flowers.tgz", images)
    (mirror / "split_zhou_OxfordFlowers.json").write_text(json.dumps(split))
    spec = real_spec("coop-flowers102")
    spec["images"][0].update(md5=md5(archive))
    spec.update(classes=len({e[1] for entries in split.values() for e in entries}) or None,
                splits={s: max(1, len(v)) for s, v in split.items()})
    return {"spec": spec, "images": images, "archive": archive}


def served(spec: dict, base_url: str) -> dict:
    spec = copy.deepcopy(spec)
    for archive in spec["images"]:
        if "url" in archive:
            archive["url"] = f"{base_url}/{archive['file']}"
    return spec


def test_flowers_layout_prepared_from_served_archive_and_mirrored_split(dirs):
    www, mirror, out = dirs
    mini = flowers_files(www, mirror)
    with serve(www) as base_url:
        meta = prepare_dataset("coop-flowers102", served(mini["spec"], base_url), out)
        assert base_url.requests["/102flowers.tgz"] == 1

    assert [c.name for c in meta.classes] == FLOWER_NAMES
    assert meta.splits == {"train": 6, "val": 3, "test": 3}
    assert (meta.task, meta.metric) == ("single-label", "accuracy")
    test = read_split(out, "test")
    assert [r["sample_id"] for r in test] == ["image_00012.jpg", "image_00010.jpg", "image_00011.jpg"]  # file order
    assert [r["label"] for r in test] == [2, 0, 1]
    assert test[0]["image"] == mini["images"]["jpg/image_00012.jpg"]  # bytes as distributed
    assert [r["label"] for r in read_split(out, "train")] == [0, 1, 2, 0, 1, 2]

    saved = load_meta(out)
    assert saved.splits == meta.splits and saved.version == meta.version
    files = {f["file"]: f for f in saved.provenance["files"]}
    assert files["102flowers.tgz"]["verified"] is True
    assert files["102flowers.tgz"]["md5"] == md5(mini["archive"])
    assert files["split_zhou_OxfordFlowers.json"]["verified"] is False  # CoOp publishes no checksum
    assert files["split_zhou_OxfordFlowers.json"]["sha256"] == hashlib.sha256(
        (mirror / "split_zhou_OxfordFlowers.json").read_bytes()).hexdigest()
    assert saved.provenance["counts"] == {"train": 6, "val": 3, "test": 3}
    assert "split_zhou_OxfordFlowers.json" in saved.provenance["upstream"]


def test_missing_split_file_says_which_file_where_from_and_where_to_put_it(dirs, tmp_path):
    www, mirror, out = dirs
    mini = flowers_files(www, mirror)
    (mirror / "split_zhou_OxfordFlowers.json").unlink()
    with serve(www) as base_url:
        with pytest.raises(ManualDownloadError) as err:
            coop.build("coop-flowers102", served(mini["spec"], base_url), out)
        assert base_url.requests["/102flowers.tgz"] == 0  # the manual file is asked for before any big download
    message = str(err.value)
    assert "split_zhou_OxfordFlowers.json" in message
    assert "https://drive.google.com/file/d/1Pp0sRXzZFZq15zVOzKjKBu4A9i01nozT" in message
    assert str((tmp_path / "cache" / "split_zhou_OxfordFlowers.json").resolve()) in message
    assert str(mirror.resolve()) in message
    assert not out.exists()


def test_split_file_with_a_label_named_twice_is_refused(dirs):
    www, mirror, out = dirs
    split = flowers_split()
    split["test"][1] = ["image_00010.jpg", 0, "daffodil"]  # label 0 is "pink primrose" elsewhere
    mini = flowers_files(www, mirror, split=split)
    with serve(www) as base_url, pytest.raises(DatasetError) as err:
        coop.build("coop-flowers102", served(mini["spec"], base_url), out)
    message = str(err.value)
    assert "split_zhou_OxfordFlowers.json" in message and "split 'test' entry 1" in message
    assert "'daffodil'" in message and "'pink primrose'" in message and "split 'train' entry 0" in message
    assert not out.exists()


def test_split_file_with_a_class_under_two_labels_or_a_gap_is_refused(dirs, tmp_path):
    www, mirror, _ = dirs
    split = flowers_split()
    split["val"][0] = ["image_00007.jpg", 3, "pink primrose"]
    spec = flowers_files(www, mirror, split=split)["spec"]
    with pytest.raises(DatasetError, match=r"split 'val' entry 0: class 'pink primrose' has label 3, but split 'train' entry 0 gives it label 0"):
        coop.read_split_file("d", mirror / "split_zhou_OxfordFlowers.json", list(spec["splits"]))

    gap = {"train": [["a.jpg", 0, "x"], ["b.jpg", 2, "z"]], "val": [], "test": []}
    path = tmp_path / "gap.json"
    path.write_text(json.dumps(gap))
    with pytest.raises(DatasetError, match=r"gap.json: labels must be 0\.\.2 without gaps; no image has label\(s\) \[1\]"):
        coop.read_split_file("d", path, ["train", "val", "test"])


@pytest.mark.parametrize("bad, expected", [
    ({"train": [["../../etc/passwd", 0, "x"]], "val": [], "test": []}, r"image path '\.\./\.\./etc/passwd' must be relative"),
    ({"train": [["/abs.jpg", 0, "x"]], "val": [], "test": []}, r"image path '/abs.jpg' must be relative"),
    ({"train": [["a.jpg", "0", "x"]], "val": [], "test": []}, r"entry 0: expected \[image path, integer label, class name\]"),
    ({"train": [["a.jpg", 0]], "val": [], "test": []}, r"entry 0: expected \[image path, integer label, class name\]"),
    ({"train": [["a.jpg", 0, "x"]], "val": [["a.jpg", 0, "x"]], "test": []}, r"'a.jpg' is already in split 'train'"),
    ({"train": [], "test": []}, r"expected a JSON object with the splits \['train', 'val', 'test'\]"),
])
def test_malformed_split_files_are_refused(tmp_path, bad, expected):
    path = tmp_path / "split_zhou_X.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(DatasetError, match=expected):
        coop.read_split_file("d", path, ["train", "val", "test"])


def test_split_sizes_must_match_coops_published_ones(dirs):
    www, mirror, out = dirs
    mini = flowers_files(www, mirror)
    spec = mini["spec"]
    spec["splits"]["test"] = 2463
    with serve(www) as base_url, pytest.raises(DatasetError) as err:
        coop.build("coop-flowers102", served(spec, base_url), out)
    assert "split 'test' has 3 images but CoOp's split has 2463" in str(err.value)
    assert "split_zhou_OxfordFlowers.json" in str(err.value)


def test_images_missing_from_the_archive_are_all_reported_before_writing(dirs):
    www, mirror, out = dirs
    images = {f"jpg/image_{k:05d}.jpg": jpeg(k) for k in range(1, 11)}  # 11 and 12 absent
    mini = flowers_files(www, mirror, images=images)
    with serve(www) as base_url, pytest.raises(DatasetError) as err:
        coop.build("coop-flowers102", served(mini["spec"], base_url), out)
    message = str(err.value)
    assert "2 image(s) listed in split_zhou_OxfordFlowers.json are not in the extracted archive(s)" in message
    assert "'image_00012.jpg', 'image_00011.jpg'" in message
    assert not out.exists()


def test_archive_without_the_image_folder_names_what_it_has(dirs):
    www, mirror, out = dirs
    images = {f"flowers/image_{k:05d}.jpg": jpeg(k) for k in range(1, 13)}
    mini = flowers_files(www, mirror, images=images)
    with serve(www) as base_url, pytest.raises(DatasetError, match=r"has no folder 'jpg' \(spec 'root'\).*top level: flowers"):
        coop.build("coop-flowers102", served(mini["spec"], base_url), out)


def test_corrupt_image_refused_unless_skipped(dirs):
    www, mirror, out = dirs
    images = {f"jpg/image_{k:05d}.jpg": jpeg(k, size=48) for k in range(1, 13)}
    images["jpg/image_00008.jpg"] = images["jpg/image_00008.jpg"][:-60]
    mini = flowers_files(www, mirror, images=images)
    with serve(www) as base_url:
        spec = served(mini["spec"], base_url)
        with pytest.raises(DatasetError, match=r"split 'val': 1 corrupt or truncated image\(s\): 'image_00008.jpg'"):
            coop.build("coop-flowers102", spec, out)
        meta = coop.build("coop-flowers102", {**spec, "skip_corrupt": True}, out)
    assert meta.splits == {"train": 6, "val": 2, "test": 3}
    assert meta.provenance["skipped_corrupt"] == ["image_00008.jpg"]


# ------------------------------------------------------------------------------------- other layouts


def test_caltech_layout_reads_the_tarball_inside_the_zip(dirs):
    """caltech-101.zip holds caltech-101/101_ObjectCategories.tar.gz; CoOp's paths are relative to
    101_ObjectCategories/ and keep the folder names (Faces) while the class names are CoOp's (face)."""
    www, mirror, out = dirs
    inner = {f"101_ObjectCategories/{folder}/image_{k:04d}.jpg": jpeg(10 * i + k)
             for i, folder in enumerate(["Faces", "accordion", "BACKGROUND_Google", "Faces_easy"]) for k in (1, 2, 3)}
    inner_tgz = write_tgz(www / "tmp" / "101_ObjectCategories.tar.gz", inner)
    archive = write_zip(www / "caltech-101.zip", {
        "caltech-101/101_ObjectCategories.tar.gz": inner_tgz.read_bytes(),
        "caltech-101/Annotations.tar": b"not used",
    })
    split = {"train": [["Faces/image_0001.jpg", 0, "face"], ["accordion/image_0001.jpg", 1, "accordion"]],
             "val": [["Faces/image_0002.jpg", 0, "face"], ["accordion/image_0002.jpg", 1, "accordion"]],
             "test": [["accordion/image_0003.jpg", 1, "accordion"], ["Faces/image_0003.jpg", 0, "face"]]}
    (mirror / "split_zhou_Caltech101.json").write_text(json.dumps(split))
    spec = real_spec("coop-caltech101")
    spec["images"][0]["md5"] = md5(archive)
    spec.update(classes=2, splits={"train": 2, "val": 2, "test": 2})
    with serve(www) as base_url:
        meta = coop.build("coop-caltech101", served(spec, base_url), out)
    assert [c.name for c in meta.classes] == ["face", "accordion"]
    test = read_split(out, "test")
    assert [(r["sample_id"], r["label"]) for r in test] == [("accordion/image_0003.jpg", 1), ("Faces/image_0003.jpg", 0)]
    assert test[1]["image"] == inner["101_ObjectCategories/Faces/image_0003.jpg"]
    assert meta.provenance["image_roots"] == ["caltech-101.zip!caltech-101/101_ObjectCategories.tar.gz:101_ObjectCategories"]


def test_pets_names_show_underscores_as_spaces_and_keep_the_raw_name_as_key(dirs):
    www, mirror, out = dirs
    images = {f"images/{b}_{k}.jpg": jpeg(k + 7 * i) for i, b in enumerate(["american_bulldog", "Abyssinian"])
              for k in (1, 2, 3)}
    archive = write_tgz(www / "images.tar.gz", {**images, "images/readme.mat": b"x"})
    split = {"train": [["Abyssinian_1.jpg", 0, "abyssinian"], ["american_bulldog_1.jpg", 1, "american_bulldog"]],
             "val": [["Abyssinian_2.jpg", 0, "abyssinian"]],
             "test": [["american_bulldog_3.jpg", 1, "american_bulldog"], ["Abyssinian_3.jpg", 0, "abyssinian"]]}
    (mirror / "split_zhou_OxfordPets.json").write_text(json.dumps(split))
    spec = real_spec("coop-pets")
    spec["images"][0]["md5"] = md5(archive)
    spec.update(classes=2, splits={"train": 2, "val": 1, "test": 2})
    with serve(www) as base_url:
        meta = coop.build("coop-pets", served(spec, base_url), out)
    assert [(c.name, c.key) for c in meta.classes] == [("abyssinian", None), ("american bulldog", "american_bulldog")]
    classes_json = json.loads((out / "classes.json").read_text())["classes"]
    assert classes_json[1] == {"index": 1, "name": "american bulldog", "key": "american_bulldog"}


def test_cars_layout_from_two_manual_archives_in_the_mirror(dirs):
    """Stanford Cars: both archives are manual (the host is gone); paths cars_train/... and cars_test/... resolve
    in whichever extracted archive has them, and the same file name in both folders stays two samples."""
    _, mirror, out = dirs
    train = write_tgz(mirror / "cars_train.tgz", {f"cars_train/{k:05d}.jpg": jpeg(k) for k in (1, 2, 3)})
    test = write_tgz(mirror / "cars_test.tgz", {f"cars_test/{k:05d}.jpg": jpeg(100 + k) for k in (1, 2)})
    names = ["2012 Tesla Model S Sedan", "2012 BMW M3 Coupe"]
    split = {"train": [["cars_train/00001.jpg", 0, names[0]], ["cars_train/00002.jpg", 1, names[1]]],
             "val": [["cars_train/00003.jpg", 1, names[1]]],
             "test": [["cars_test/00001.jpg", 0, names[0]], ["cars_test/00002.jpg", 1, names[1]]]}
    (mirror / "split_zhou_StanfordCars.json").write_text(json.dumps(split))
    spec = real_spec("coop-cars")
    spec["images"][0]["md5"], spec["images"][1]["md5"] = md5(train), md5(test)
    spec.update(classes=2, splits={"train": 2, "val": 1, "test": 2})
    meta = coop.build("coop-cars", spec, out)
    assert [c.name for c in meta.classes] == names
    rows = read_split(out, "test")
    assert [r["sample_id"] for r in rows] == ["cars_test/00001.jpg", "cars_test/00002.jpg"]
    assert rows[0]["image"] == jpeg(101)
    assert read_split(out, "train")[0]["image"] == jpeg(1)


def test_missing_manual_cars_archive_names_the_file_its_checksum_and_the_gone_host(dirs):
    _, mirror, out = dirs
    (mirror / "split_zhou_StanfordCars.json").write_text(json.dumps(
        {"train": [["cars_train/00001.jpg", 0, "a"]], "val": [["cars_train/00002.jpg", 0, "a"]],
         "test": [["cars_test/00001.jpg", 0, "a"]]}))
    spec = real_spec("coop-cars")
    spec.update(classes=1, splits={"train": 1, "val": 1, "test": 1})
    with pytest.raises(ManualDownloadError) as err:
        coop.build("coop-cars", spec, out)
    message = str(err.value)
    assert "'cars_train.tgz'" in message and "065e5b463ae28d29e77c1b4b166cfe61" in message
    assert "ai.stanford.edu/~jkrause/car196/cars_train.tgz" in message and str(mirror.resolve()) in message


# ------------------------------------------------------------------------------------- the registry entries


@pytest.mark.parametrize("entry", sorted(COOP_TABLE))
def test_catalogue_rows_give_coops_published_numbers_without_download(entry, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no prepared classes.json can be found: the numbers come from the spec
    classes, train, val, test = COOP_TABLE[entry]
    row = coop.catalogue_row(entry, real_spec(entry))
    assert row == {"classes": classes, "splits": {"train": train, "val": val, "test": test}, "metric": "accuracy",
                   "manual_download": True}
    entry_yaml = OmegaConf.to_container(OmegaConf.load(CONF / f"{entry}.yaml"), resolve=True)
    described = describe(entry, entry_yaml)
    assert (described["source"], described["classes"], described["splits"]) == ("coop", classes, row["splits"])
    assert described["manual_download"] is True
    assert entry_yaml["input"] == "vlbench/datasets/coop.py"
    assert entry_yaml["texts"]["templates"] and all("{c}" in t for t in entry_yaml["texts"]["templates"])


def test_flowers_test_split_differs_from_elevaters():
    """The openness paper's Flowers102 is CoOp's split, not ELEVATER's: the two entries must not be confused."""
    assert real_spec("coop-flowers102")["splits"]["test"] == 2463
    elevater = CONF / "oxford-flower-102.yaml"
    if elevater.exists():
        assert "6,149" in elevater.read_text() and OmegaConf.load(elevater)["prepare"]["source"] == "elevater"


def test_spec_errors_name_the_dataset_and_key():
    spec = real_spec("coop-pets")
    with pytest.raises(DatasetError, match=r"dataset 'p': unknown spec key\(s\) \['split'\] for source 'coop'"):
        coop.parse_spec("p", {**spec, "split": "x"})
    with pytest.raises(DatasetError, match=r"dataset 'p': metric 'map_11point' is not one of"):
        coop.parse_spec("p", {**spec, "metric": "map_11point"})
    with pytest.raises(DatasetError, match=r"dataset 'p': images\[0\]\.root must be a relative path"):
        coop.parse_spec("p", {**spec, "images": [{**spec["images"][0], "root": "../x"}]})
    with pytest.raises(DatasetError, match=r"dataset 'p': 'splits' must map each split"):
        coop.parse_spec("p", {**spec, "splits": None})
