"""ELEVATER's 20 datasets: the data file (classes, order, templates, sizes, metrics), the catalogue without any
download, label pairing, and preparation of miniature distributions in ELEVATER's exact formats (iris index +
labels.txt + zips, multi-label VOC, COCO-format KITTI) served from 127.0.0.1."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from tests.http_server import serve
from vlbench.datasets import elevater_source as elevater
from vlbench.datasets.canonical import DatasetError, load_meta
from vlbench.datasets.download import ChecksumError

ROOT = Path(__file__).resolve().parents[1]
KNOWLEDGE = ROOT.parent / "shared/reference/elevater/knowledge/external"
TOOLKIT_GIT = Path("/work/.mirror/Computer-Vision-in-the-Wild+Elevater_Toolkit_IC/repo")

# name: (classes, train, test, metric) -- ELEVATER's vision_datasets.json and resources/datasets/*.yaml
EXPECTED = {
    "hateful-memes": (2, 8500, 500, "roc_auc"),
    "patch-camelyon": (2, 262144, 32768, "accuracy"),
    "rendered-sst2": (2, 6920, 1821, "accuracy"),
    "kitti-distance": (4, 6347, 711, "accuracy"),
    "fer-2013": (7, 28709, 3589, "accuracy"),
    "cifar-10": (10, 50000, 10000, "accuracy"),
    "eurosat_clip": (10, 5000, 5000, "accuracy"),
    "mnist": (10, 60000, 10000, "accuracy"),
    "voc-2007-classification": (20, 2501, 4952, "map_11point"),
    "oxford-iiit-pets": (37, 3680, 3669, "mean_per_class"),
    "gtsrb": (43, 26640, 12630, "accuracy"),
    "resisc45_clip": (45, 3150, 25200, "accuracy"),
    "dtd": (47, 1880, 1880, "accuracy"),
    "cifar-100": (100, 50000, 10000, "accuracy"),
    "fgvc-aircraft-2013b-variants102": (100, 3334, 3333, "mean_per_class"),
    "food-101": (101, 75750, 25250, "accuracy"),
    "caltech-101": (102, 3060, 6084, "mean_per_class"),
    "oxford-flower-102": (102, 1020, 6149, "mean_per_class"),
    "stanford-cars": (196, 8144, 8041, "accuracy"),
    "country211": (211, 31650, 21100, "accuracy"),
}


# ------------------------------------------------------------------------------------------- the data file


def test_twenty_datasets_with_1151_classes_sizes_and_metrics():
    data = elevater.load_data()
    assert elevater.dataset_names() == list(EXPECTED)
    assert sum(len(elevater.classes(n)) for n in EXPECTED) == 1151
    for name, (n_classes, train, test, metric) in EXPECTED.items():
        entry = data[name]
        assert len(entry["classes"]) == n_classes, name
        assert (entry["splits"]["train"]["num_images"], entry["splits"]["test"]["num_images"]) == (train, test), name
        assert entry["metric"] == metric, name
        assert entry["task"] == ("multi-label" if name == "voc-2007-classification" else "single-label"), name
        assert entry["preprocess"] == ("squash" if name == "kitti-distance" else "default"), name
    assert data["_source"]["commit"] == "00d0af78559d5f3d800ae4668210e6bd1f2f84b9"
    assert data["_source"]["licence"].startswith("MIT")
    assert data["_source"]["storage"].startswith("https://cvinthewildeus.blob.core.windows.net/datasets?sp=r&")


def test_class_names_and_order_are_elevaters():
    assert elevater.classes("cifar-100")[:3] == ["chimpanzee", "trout", "skunk"]
    assert elevater.classes("caltech-101")[:6] == ["accordion", "airplane", "anchor", "ant", "background", "barrel"]
    assert elevater.classes("caltech-101")[37:39] == ["centered face", "off-center face"]
    assert elevater.classes("country211")[:3] == ["Andorra", "United Arab Emirates", "Afghanistan"]
    assert elevater.classes("kitti-distance")[0] == "a photo i took of a car on my left or right side."
    # FER-2013 classes are lists of synonyms upstream: the first is the name (as ELEVATER uses it), the rest aliases
    assert elevater.classes("fer-2013") == ["angry", "disgusted", "fearful", "happy", "neutral", "sad", "surprised"]
    assert elevater.load_data()["fer-2013"]["aliases"]["surprised"] == ["shocked", "spooked"]
    imagenet = elevater.load_data()["imagenet-1k"]
    assert len(imagenet["classes"]) == 1000 and imagenet["classes"][0] == "tench" and len(imagenet["templates"]) == 80


def test_templates_are_elevaters_with_vlbench_placeholder():
    assert elevater.templates("patch-camelyon") == ["this is a photo of {c}"]
    assert elevater.templates("hateful-memes") == ["a {c}."]
    assert elevater.templates("kitti-distance") == ["{c}"]
    assert len(elevater.templates("resisc45_clip")) == 18
    assert elevater.templates("resisc45_clip")[0] == "satellite imagery of {c}."
    assert elevater.templates("cifar-10") == elevater.templates("cifar-100")  # ELEVATER's template_map does this
    for name in [*EXPECTED, "imagenet-1k"]:
        assert all(t.count("{c}") == 1 and "{}" not in t for t in elevater.templates(name)), name


def test_registry_entries_carry_the_data_files_templates_and_settings():
    for name in EXPECTED:
        entry = yaml.safe_load((ROOT / "conf/dataset" / f"{name}.yaml").read_text())
        assert entry["prepare"]["source"] == "elevater"
        assert entry["input"] == "vlbench/datasets/data/elevater.json"
        assert entry["texts"]["templates"] == elevater.templates(name), name
        assert entry["prepare"].get("preprocess", "default") == ("squash" if name == "kitti-distance" else "default")
    from vlbench.compose import compose

    composed = compose(["suite=elevater"])
    suite = composed["suite"]
    assert suite["slug"] == "elevater"
    assert suite["embed"] == suite["zeroshot"] == suite["adapt"] == list(EXPECTED)
    assert list(suite["datasets"]) == list(EXPECTED)
    # ELEVATER's protocol for both analyses: softmax scores for zero-shot, linear probing alone for adapt
    assert composed["zeroshot"]["scoring"] == "elevater" and composed["adapt"]["protocols"] == ["elevater"]


def test_conf_files_are_what_the_tool_writes():
    proc = subprocess.run([sys.executable, "tools/elevater_data.py", "conf", "--check"], check=False, cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(not TOOLKIT_GIT.is_dir(), reason="ELEVATER toolkit snapshot not present")
def test_data_file_is_what_the_tool_makes_from_the_toolkit(tmp_path):
    out = tmp_path / "elevater.json"
    proc = subprocess.run([sys.executable, "tools/elevater_data.py", "data", "--git", str(TOOLKIT_GIT), "--out", str(out)],
                          check=False, cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == elevater.DATA_FILE.read_bytes()


@pytest.mark.skipif(not KNOWLEDGE.is_dir(), reason="ELEVATER knowledge files not present in ../shared/reference")
@pytest.mark.parametrize("name", [*EXPECTED, "imagenet-1k"])
def test_class_sets_match_elevaters_knowledge_files(name):
    entries = json.loads((KNOWLEDGE / f"{name}_knowledge.tsv").read_text(encoding="utf-8"))
    assert {e["classname"] for e in entries} == set(elevater.classes(name))


# ------------------------------------------------------------------------------------------- catalogue


def test_catalogue_lists_the_suite_without_any_download(tmp_path):
    env = {**os.environ, "VLBENCH_DOWNLOADS": str(tmp_path / "cache")}
    env.pop("VLBENCH_MIRROR", None)
    proc = subprocess.run([sys.executable, "-m", "vlbench.cli", "datasets", "--suite", "elevater", "--json"],
                          check=False, cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = {row["name"]: row for row in json.loads(proc.stdout)}
    assert list(rows) == list(EXPECTED)
    for name, (n_classes, train, test, metric) in EXPECTED.items():
        assert rows[name]["source"] == "elevater"
        assert (rows[name]["classes"], rows[name]["splits"], rows[name]["metric"]) == (
            n_classes, {"train": train, "test": test}, metric), name
        assert rows[name]["manual_download"] is (name == "hateful-memes"), name  # its licence needs a person
    assert sum(r["classes"] for r in rows.values()) == 1151
    assert not (tmp_path / "cache").exists()


def test_catalogue_row_follows_the_spec():
    row = elevater.catalogue_row("voc", {"source": "elevater", "dataset": "voc-2007-classification",
                                         "splits": {"train": "train", "val": "val", "test": "test"}})
    assert row == {"classes": 20, "splits": {"train": 2501, "val": 2510, "test": 4952}, "metric": "map_11point",
                   "manual_download": False}


@pytest.mark.parametrize("spec, message", [
    ({"source": "elevater", "split": {}}, "did you mean 'splits'"),
    ({"source": "elevater", "dataset": "cifar10"}, "is not one of ELEVATER's datasets"),
    ({"source": "elevater", "splits": {"train": "valid"}}, "ELEVATER has no split 'valid'"),
    ({"source": "elevater", "checksums": {"train.tar": "0" * 64}}, "not files of this dataset"),
    ({"source": "elevater", "label_match": "fuzzy"}, "'label_match' must be one of"),
    ({"source": "elevater", "base_urls": ["ftp://x/"]}, r"is not an http\(s\) or file URL"),
])
def test_bad_specs_are_refused(spec, message):
    with pytest.raises(DatasetError, match=message):
        elevater.catalogue_row("cifar-10", spec)


def test_file_urls_keep_the_sas_query_string():
    base = "https://acct.blob.core.windows.net/datasets?sp=r&sig=Ab%2Fc%3D"
    assert elevater.file_url(base, "classification/cifar_10_20211007", "train.zip") == (
        "https://acct.blob.core.windows.net/datasets/classification/cifar_10_20211007/train.zip?sp=r&sig=Ab%2Fc%3D")
    assert elevater.file_url("http://127.0.0.1:8000/mirror/", "classification/x", "labels.txt") == (
        "http://127.0.0.1:8000/mirror/classification/x/labels.txt")


# ------------------------------------------------------------------------------------------- label pairing


@pytest.mark.parametrize("name", list(EXPECTED))
def test_names_pair_one_to_one_for_every_dataset(name):
    """Provable offline: no two classes share a normalised name (aliases included), every alias points at a class,
    and a labelmap holding the class names in any order (underscored, upper-cased) is remapped to them exactly."""
    entry = elevater.load_data()[name]
    names, alternatives = entry["classes"], entry.get("aliases", {})
    elevater.class_keys(name, names, alternatives)
    elevater.alias_targets(name, names, elevater.ALIASES.get(name, {}))
    order = list(reversed(range(len(names))))
    labelmap = [names[i].replace(" ", "_").upper() for i in order]
    pairing = elevater.pair_labels(name, labelmap, names, alternatives, elevater.ALIASES.get(name, {}), "name")
    assert pairing.how == "name" and pairing.to_class == order


def test_upstream_label_names_pair_through_the_alias_table():
    names = elevater.classes("eurosat_clip")
    folders = ["AnnualCrop", "Forest", "HerbaceousVegetation", "Highway", "Industrial", "Pasture", "PermanentCrop",
               "Residential", "River", "SeaLake"]
    pairing = elevater.pair_labels("eurosat_clip", folders[::-1], names, {}, elevater.ALIASES["eurosat_clip"], "name")
    assert pairing.to_class == list(range(10))[::-1]
    fer = ["angry", "disgust", "fear", "happy", "sad", "surprise", "neutral"]  # FER-2013's own order
    pairing = elevater.pair_labels("fer-2013", fer, elevater.classes("fer-2013"), {}, elevater.ALIASES["fer-2013"], "name")
    assert pairing.to_class == [0, 1, 2, 3, 5, 6, 4]


def test_labelmaps_that_do_not_name_the_classes_pair_by_position_unless_a_name_contradicts():
    names = ["apple", "pear", "plum"]
    pairing = elevater.pair_labels("fruit", ["0", "1", "2"], names, {}, {}, "auto")
    assert (pairing.how, pairing.to_class, pairing.matched) == ("position", [0, 1, 2], 0)
    pairing = elevater.pair_labels("fruit", ["apple", "x", "plum"], names, {}, {}, "auto")
    assert (pairing.how, pairing.matched) == ("position", 2)
    with pytest.raises(DatasetError, match=r"pairs neither by name nor by position.*line 0 'plum' is class 2"):
        elevater.pair_labels("fruit", ["plum", "x", "apple"], names, {}, {}, "auto")
    with pytest.raises(DatasetError, match=r"label_match: name.*without a class: \['x'\].*without a labelmap name: \['pear'\]"):
        elevater.pair_labels("fruit", ["apple", "x", "plum"], names, {}, {}, "name")


@pytest.mark.parametrize("labelmap, message", [
    (["apple", "Apple", "plum"], r"repeats names, not one-to-one: \['apple' / 'Apple'\]"),
    (["apple", "pear"], r"has 2 names but ELEVATER's class list has 3"),
    (["apple", "pear", "plum", "fig"], r"has 4 names.*without a class: \['fig'\]"),
    (["apple", "poire", "plum"], None),  # the alias 'poire' -> 'pear' makes this a name pairing
    (["apple", "poire", "pear"], r"pair with the same class, not one-to-one: \{'pear': \['poire', 'pear'\]\}"),
])
def test_non_bijective_labelmaps_are_refused(labelmap, message):
    names = ["apple", "pear", "plum"]
    if message is None:
        assert elevater.pair_labels("fruit", labelmap, names, {}, {"poire": "pear"}).how == "name"
        return
    with pytest.raises(DatasetError, match=message):
        elevater.pair_labels("fruit", labelmap, names, {}, {"poire": "pear"})


# ------------------------------------------------------------------------------------------- miniatures


def png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), ((seed * 37) % 256, (seed * 91) % 256, (seed * 53) % 256)).save(buf, format="PNG")
    return buf.getvalue()


def write_zip(path: Path, members: dict[str, bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


def container(tmp_path: Path, name: str) -> Path:
    """The miniature's folder `<served root>/datasets/<root_folder>/`, as on ELEVATER's blob container."""
    folder = tmp_path / "www" / "datasets" / elevater.load_data()[name]["root_folder"]
    folder.mkdir(parents=True)
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "cache"))
    monkeypatch.delenv("VLBENCH_MIRROR", raising=False)
    monkeypatch.setenv("VLBENCH_DOWNLOAD_ATTEMPTS", "1")
    return tmp_path / "cache"


def split_table(out: Path, split: str):
    return pq.read_table(out / "splits" / f"{split}.parquet")


CIFAR_TRAIN = [(5, 3), (2, 9), (7, 0), (0, 3), (9, 5)]  # (image number, labelmap line), in index order
CIFAR_TEST = [(11, 1), (10, 8), (12, 9)]


def cifar10_miniature(tmp_path: Path, labelmap: list[str] | None = None) -> Path:
    """ELEVATER's cifar-10 layout: labels.txt (here in reverse class order, upper case), train.txt -> train.zip,
    test.txt -> val.zip, lines `<zip>@<member> <label>`."""
    folder = container(tmp_path, "cifar-10")
    names = elevater.classes("cifar-10")
    labels = labelmap if labelmap is not None else [n.upper() for n in reversed(names)]
    (folder / "labels.txt").write_text("\n".join(labels) + "\n\n")
    for index, zip_name, rows in (("train.txt", "train.zip", CIFAR_TRAIN), ("test.txt", "val.zip", CIFAR_TEST)):
        (folder / index).write_text("".join(f"{zip_name}@images/{k:05d}.png {y}\n" for k, y in rows))
        write_zip(folder / zip_name, {f"images/{k:05d}.png": png(k) for k, _ in rows})
    return folder


def test_iris_miniature_is_prepared_with_labels_remapped_by_name(tmp_path, cache):
    cifar10_miniature(tmp_path)
    out = tmp_path / "prepared"
    with serve(tmp_path / "www") as base:
        spec = {"source": "elevater", "base_urls": [f"{base}/datasets?sp=r&sig=test%3D"]}
        meta = elevater.build("cifar-10", spec, out)
    names = elevater.classes("cifar-10")
    written = load_meta(out)
    assert written.class_names == names  # ELEVATER's order, not the labelmap's
    assert [c.key for c in written.classes][:2] == ["AIRPLANE", "AUTOMOBILE"]
    assert written.splits == {"train": 5, "test": 3} and written.metric == "accuracy"
    train = split_table(out, "train").to_pylist()
    assert [r["sample_id"] for r in train] == [f"train.zip@images/{k:05d}.png" for k, _ in CIFAR_TRAIN]  # index order
    assert [r["label"] for r in train] == [9 - y for _, y in CIFAR_TRAIN]  # labelmap line y is class 9 - y
    assert [r["image"] for r in train] == [png(k) for k, _ in CIFAR_TRAIN]  # bytes as distributed
    assert [r["sample_id"] for r in split_table(out, "test").to_pylist()] == [
        f"val.zip@images/{k:05d}.png" for k, _ in CIFAR_TEST]
    prov = written.provenance
    assert prov["dataset"] == "cifar-10" and prov["upstream"]["commit"] == "00d0af78559d5f3d800ae4668210e6bd1f2f84b9"
    assert prov["upstream_version"] == {"root_folder": "classification/cifar_10_20211007", "version": 1}
    assert prov["counts"] == {"train": 5, "test": 3}
    assert prov["labels"]["train"]["pairing"] == "name" and prov["labels"]["train"]["names_matched"] == 10
    files = {f["elevater_file"].rsplit("/", 1)[1]: f for f in prov["files"]}
    assert sorted(files) == ["labels.txt", "test.txt", "train.txt", "train.zip", "val.zip"]
    folder = tmp_path / "www/datasets/classification/cifar_10_20211007"
    for file, record in files.items():
        assert record["file"] == f"elevater-cifar_10_20211007-{file}"
        assert record["urls"] == [f"{base}/datasets/classification/cifar_10_20211007/{file}?sp=r&sig=test%3D"]
        assert record["verified"] is False
        assert record["sha256"] == hashlib.sha256((folder / file).read_bytes()).hexdigest()
    assert base.requests["/datasets/classification/cifar_10_20211007/train.zip"] == 1
    assert (cache / "elevater-cifar_10_20211007-train.zip").is_file()
    assert meta.version == written.version


def test_a_second_run_uses_the_cache_and_checksums_verify(tmp_path, cache):
    folder = cifar10_miniature(tmp_path)
    sha = {f: hashlib.sha256((folder / f).read_bytes()).hexdigest() for f in ("labels.txt", "train.zip")}
    with serve(tmp_path / "www") as base:
        spec = {"source": "elevater", "base_urls": [f"{base}/datasets"], "checksums": sha}
        first = elevater.build("cifar-10", spec, tmp_path / "a")
        second = elevater.build("cifar-10", spec, tmp_path / "b")
        assert max(base.requests.values()) == 1
    assert first.version == second.version
    verified = {f["elevater_file"].rsplit("/", 1)[1]: f["verified"] for f in load_meta(tmp_path / "b").provenance["files"]}
    assert verified == {"labels.txt": True, "train.zip": True, "train.txt": False, "test.txt": False, "val.zip": False}


def test_a_wrong_checksum_is_refused(tmp_path, cache):
    cifar10_miniature(tmp_path)
    with serve(tmp_path / "www") as base:
        spec = {"source": "elevater", "base_urls": [f"{base}/datasets"], "checksums": {"labels.txt": "0" * 64}}
        with pytest.raises(ChecksumError, match="elevater-cifar_10_20211007-labels.txt"):
            elevater.build("cifar-10", spec, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_labelmap_that_is_not_one_to_one_is_refused(tmp_path, cache):
    names = elevater.classes("cifar-10")
    cifar10_miniature(tmp_path, labelmap=[*names[:9], "Airplane"])
    with serve(tmp_path / "www") as base, pytest.raises(DatasetError, match=r"'cifar-10'.*repeats.*'airplane' / 'Airplane'"):
        elevater.build("cifar-10", {"source": "elevater", "base_urls": [f"{base}/datasets"]}, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def voc_miniature(tmp_path: Path) -> None:
    """ELEVATER's VOC layout: labels.txt in class order, multi-label lines `<zip>@<member> 8,14`; the val index
    reads train.zip, as upstream."""
    folder = container(tmp_path, "voc-2007-classification")
    (folder / "labels.txt").write_text("\n".join(elevater.classes("voc-2007-classification")) + "\n")
    rows = {"train_ic.txt": ("train.zip", [(5, "8,14"), (7, "6")]), "val_ic.txt": ("train.zip", [(9, "14,11,7")]),
            "test_ic.txt": ("test.zip", [(1, "0"), (4, "19,18"), (2, "14")])}
    members: dict[str, dict[str, bytes]] = {"train.zip": {}, "test.zip": {}}
    for index, (zip_name, lines) in rows.items():
        (folder / index).write_text("".join(f"{zip_name}@JPEGImages/{k:06d}.jpg {y}\n" for k, y in lines))
        for k, _ in lines:
            buf = io.BytesIO()
            Image.new("RGB", (8, 6), (k * 20, 10, 200)).save(buf, format="JPEG")
            members[zip_name][f"JPEGImages/{k:06d}.jpg"] = buf.getvalue()
    for zip_name, content in members.items():
        write_zip(folder / zip_name, content)


def test_multi_label_miniature_keeps_every_label(tmp_path, cache):
    voc_miniature(tmp_path)
    out = tmp_path / "prepared"
    with serve(tmp_path / "www") as base:
        spec = {"source": "elevater", "dataset": "voc-2007-classification", "base_urls": [f"{base}/datasets"],
                "splits": {"train": "train", "val": "val", "test": "test"}}
        elevater.build("voc", spec, out)
    meta = load_meta(out)
    assert (meta.task, meta.metric, meta.splits) == ("multi-label", "map_11point", {"train": 2, "val": 1, "test": 3})
    assert split_table(out, "train").to_pylist()[0]["labels"] == [8, 14]
    assert split_table(out, "val").column("labels").to_pylist() == [[14, 11, 7]]
    assert split_table(out, "val").column("sample_id").to_pylist() == ["train.zip@JPEGImages/000009.jpg"]
    assert split_table(out, "test").column("labels").to_pylist() == [[0], [19, 18], [14]]
    assert meta.provenance["split_map"] == {"train": "train", "val": "val", "test": "test"}


KITTI_CATEGORIES = ["near", "nearby", "far", "none"]  # not ELEVATER's names: paired by position


def kitti_miniature(tmp_path: Path) -> None:
    """ELEVATER's COCO layout: train_meta.json / test_meta.json with images (file_name, zip_file), annotations
    and categories; image ids out of order in the file (vision_datasets sorts them by id)."""
    folder = container(tmp_path, "kitti-distance")
    for index, zip_name, ids in (("train_meta.json", "train_images.zip", [3, 1, 2]),
                                 ("test_meta.json", "test_images.zip", [7, 6])):
        coco = {
            "images": [{"id": i, "file_name": f"img/{i:04d}.png", "zip_file": zip_name, "width": 8, "height": 8}
                       for i in ids],
            "annotations": [{"id": 10 + i, "image_id": i, "category_id": 1 + i % 4} for i in ids],
            "categories": [{"id": 4 - k, "name": KITTI_CATEGORIES[3 - k]} for k in range(4)],  # listed id 4..1
        }
        (folder / index).write_text(json.dumps(coco))
        write_zip(folder / zip_name, {f"img/{i:04d}.png": png(i) for i in ids})


def test_coco_format_miniature_in_image_id_order_squashed(tmp_path, cache, capsys):
    kitti_miniature(tmp_path)
    out = tmp_path / "prepared"
    with serve(tmp_path / "www") as base:
        elevater.build("kitti-distance", {"source": "elevater", "base_urls": [f"{base}/datasets"],
                                          "preprocess": "squash"}, out)
    meta = load_meta(out)
    assert meta.preprocess == "squash"
    assert json.loads((out / "classes.json").read_text())["preprocess"] == "squash"
    assert meta.class_names == elevater.classes("kitti-distance")
    assert [c.key for c in meta.classes] == KITTI_CATEGORIES
    train = split_table(out, "train").to_pylist()
    assert [r["sample_id"] for r in train] == [f"train_images.zip@img/{i:04d}.png" for i in (1, 2, 3)]
    assert [r["label"] for r in train] == [i % 4 for i in (1, 2, 3)]  # category id c is line c - 1
    assert meta.provenance["labels"]["test"] == {"pairing": "position", "names_matched": 0, "labelmap": KITTI_CATEGORIES}
    assert "paired by position, as ELEVATER's toolkit does" in capsys.readouterr().err


def test_index_and_archive_faults_name_the_file_and_line(tmp_path, cache, monkeypatch):
    folder = cifar10_miniature(tmp_path)
    with serve(tmp_path / "www") as base:
        spec = {"source": "elevater", "base_urls": [f"{base}/datasets"]}
        (folder / "train.txt").write_text("train.zip@images/00005.png 3\ntrain.zip@images/00002.png nine\n")
        with pytest.raises(DatasetError, match=r"'train.txt' line 2: expected .*'train.zip@images/00002.png nine'"):
            elevater.build("cifar-10", spec, tmp_path / "out")
    for name, line, message in [
        ("c2", "train.zip@images/00005.png 10", r"line 1: image .* has label 10, but the labelmap has 10 names"),
        ("c3", "train.zip@images/00005.png 3,4", r"line 1: image .* has 2 labels \[3, 4\]; this dataset is single-label"),
        ("c4", "train.zip@images/99999.png 3", r"line 1: 'images/99999.png' is not in 'train.zip'"),
        ("c5", "train.zip@../images/00005.png 3", r"line 1: archive .*train.zip: member '../images/00005.png' has a '..' component"),
        ("c6", "test.zip@images/00005.png 3", r"is in 'test.zip', which is not among the split's files \['train.zip'\]"),
    ]:
        (folder / "train.txt").write_text(line + "\n")
        with serve(tmp_path / "www") as base:  # a fresh cache name per case: the cached index is not re-read
            monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / name))
            spec = {"source": "elevater", "base_urls": [f"{base}/datasets"]}
            with pytest.raises(DatasetError, match=message):
                elevater.build("cifar-10", spec, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_corrupt_images_are_reported_or_skipped(tmp_path, cache):
    folder = cifar10_miniature(tmp_path)
    write_zip(folder / "train.zip", {f"images/{k:05d}.png": png(k)[: 30 if k == 2 else None] for k, _ in CIFAR_TRAIN})
    with serve(tmp_path / "www") as base:
        spec = {"source": "elevater", "base_urls": [f"{base}/datasets"]}
        with pytest.raises(DatasetError, match=r"1 corrupt or truncated image\(s\): 'train.zip@images/00002.png'"):
            elevater.build("cifar-10", spec, tmp_path / "out")
        meta = elevater.build("cifar-10", {**spec, "skip_corrupt": True}, tmp_path / "out")
    assert meta.splits == {"train": 4, "test": 3}
    assert meta.provenance["skipped_corrupt"] == ["train.zip@images/00002.png"]


def test_a_corrupt_zip_is_named_and_forgotten(tmp_path, cache):
    folder = cifar10_miniature(tmp_path)
    (folder / "val.zip").write_bytes(b"PK\x03\x04 not really a zip")
    spec = {"source": "elevater"}
    with serve(tmp_path / "www") as base, pytest.raises(DatasetError, match=r"'val.zip' .* is corrupt, not a readable zip.*deleted"):
        elevater.build("cifar-10", {**spec, "base_urls": [f"{base}/datasets"]}, tmp_path / "out")
    assert not (cache / "elevater-cifar_10_20211007-val.zip").exists()


def test_a_zip_member_that_is_a_link_is_refused(tmp_path, cache):
    folder = cifar10_miniature(tmp_path)
    link = zipfile.ZipInfo("images/00005.png")
    link.create_system, link.external_attr = 3, (0o120777 << 16)  # a symbolic link made on Unix
    with zipfile.ZipFile(folder / "train.zip", "w") as zf:
        zf.writestr(link, "/etc/passwd")
    spec = {"source": "elevater"}
    with serve(tmp_path / "www") as base, pytest.raises(DatasetError, match=r"'images/00005.png' in 'train.zip' is not a regular"):
        elevater.build("cifar-10", {**spec, "base_urls": [f"{base}/datasets"]}, tmp_path / "out")


def test_hateful_memes_asks_for_its_files_by_hand(tmp_path, monkeypatch):
    """Its licence must be accepted by a person: no download is attempted; the message names the cached file
    name to use, the licence, ELEVATER's URL of the file and where to put it."""
    from vlbench.datasets.download import ManualDownloadError

    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "cache"))
    monkeypatch.delenv("VLBENCH_MIRROR", raising=False)
    spec = yaml.safe_load((ROOT / "conf" / "dataset" / "hateful-memes.yaml").read_text())["prepare"]
    assert elevater.catalogue_row("hateful-memes", spec)["manual_download"] is True
    with pytest.raises(ManualDownloadError) as err:
        elevater.build("hateful-memes", spec, tmp_path / "out")
    message = str(err.value)
    files = elevater.dataset_files(elevater.load_data()["hateful-memes"])  # every file at once: one trip to the website
    assert message.startswith(f"{len(files)} files must be downloaded by hand")
    assert "elevater-hateful_memes_20211014-" in message
    assert "hatefulmemeschallenge.com" in message and "cvinthewildeus.blob.core.windows.net" in message
    assert str(tmp_path / "cache") in message
    assert not (tmp_path / "out").exists()
