"""FewTrans's datasets (`source: fewtrans`): miniatures in each upstream layout, served from 127.0.0.1 or placed in
the mirror, prepared with our real entries' specs; classes, their order, names and pools checked against FewTrans'
rules (Frankluox/FewTrans data/dataset_spec.py, prepare_datasets.py) computed here from the miniature's files."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from tests.archives import md5, real_spec, write_tgz, write_zip
from tests.http_server import serve
from vlbench.analyses.adapt.fewtrans import class_pools, class_split, split_table
from vlbench.datasets import fewtrans_source as fewtrans
from vlbench.datasets.canonical import DatasetError, load_meta
from vlbench.datasets.download import ChecksumError, ManualDownloadError
from vlbench.datasets.registry import catalogue, prepare_dataset

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf" / "dataset"
NAMES = json.loads((ROOT / "vlbench" / "datasets" / "data" / "fewtrans_names.json").read_text())
SUITE = ["imagenet-sketch", "fewtrans-dtd", "fewtrans-cifar100", "fewtrans-flowers", "ucf101", "eurosat", "quickdraw",
         "fungi", "plant-disease", "fgvc-aircraft"]
# The paper's App. B.1: classes, base, novel.
PAPER = {"imagenet-sketch": (1000, 712, 288), "fewtrans-dtd": (47, 37, 10), "fewtrans-cifar100": (100, 80, 20),
         "fewtrans-flowers": (102, 82, 20), "ucf101": (101, 81, 20), "eurosat": (10, 6, 4), "quickdraw": (345, 276, 69),
         "fungi": (1394, 1115, 279), "plant-disease": (38, 30, 8), "fgvc-aircraft": (100, 80, 20)}
IMG_EXT = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def png(seed: int, size: int = 6) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def rows(out: Path) -> list[dict]:
    return pq.read_table(out / "splits" / "test.parquet").to_pylist()


def code_listing(root: Path) -> tuple[list[str], dict[str, list[str]]]:
    """What FewTrans' folder specs compute on an extracted tree: sorted(os.listdir(root)) and, per class, the sorted
    paths of its image files (is_image_file)."""
    classes = sorted(os.listdir(root))
    pools = {c: sorted(os.path.join(root, c, f) for f in os.listdir(os.path.join(root, c))
                       if f.lower().endswith(IMG_EXT)) for c in classes}
    return classes, {c: [os.path.relpath(p, root) for p in ps] for c, ps in pools.items()}


def served(spec: dict, base_url: str, **checksums: str) -> dict:
    """The spec with every URL file on the local server and its md5 replaced by the miniature's."""
    spec = copy.deepcopy(spec)
    for role, res in spec["files"].items():
        if "url" in res:
            res["url"] = f"{base_url}/{res['file']}"
        if role in checksums:
            res.pop("sha256", None)
            res["md5"] = checksums[role]
    return spec


# ------------------------------------------------------------------------------------------------ folders


def eurosat_members() -> dict[str, bytes]:
    """EuroSAT.zip's layout (2750/<Class>/<Class>_<n>.jpg) with names whose string order differs from numeric order,
    plus a non-image file the code's is_image_file skips."""
    members, seed = {}, 0
    for cls in ["SeaLake", "AnnualCrop", "Forest", "River", "HerbaceousVegetation", "Highway", "Industrial", "Pasture",
                "PermanentCrop", "Residential"]:
        for n in (10, 2, 1):
            members[f"2750/{cls}/{cls}_{n}.jpg"] = png(seed)
            seed += 1
    members["2750/Forest/readme.txt"] = b"not an image"
    return members


def test_eurosat_classes_names_pools_and_base_novel_as_the_code_lists_them(dirs):
    www, _, out = dirs
    members = eurosat_members()
    archive = write_zip(www / "EuroSAT.zip", members)
    with serve(www) as base_url:
        meta = prepare_dataset("eurosat", served(real_spec("eurosat") | {"images": 30}, base_url, archive=md5(archive)), out)
        assert base_url.requests["/EuroSAT.zip"] == 1

    tree = Path(f"{os.environ['VLBENCH_DOWNLOADS']}/EuroSAT.zip.d/2750")
    classes, pools = code_listing(tree)
    assert [c.key for c in meta.classes] == classes == sorted(classes)
    assert classes[:3] == ["AnnualCrop", "Forest", "HerbaceousVegetation"]
    assert [c.name for c in meta.classes] == [NAMES["tables"]["eurosat"][c] for c in classes]
    assert meta.classes[0].name == "Annual Crop Land" and meta.classes[9].name == "Sea or Lake"
    got = rows(out)
    assert [r["sample_id"] for r in got] == [p for c in classes for p in pools[c]]
    assert [r["sample_id"] for r in got][:3] == ["AnnualCrop/AnnualCrop_1.jpg", "AnnualCrop/AnnualCrop_10.jpg",
                                                 "AnnualCrop/AnnualCrop_2.jpg"]  # string order, as sorted() gives
    assert [r["label"] for r in got] == [i for i, c in enumerate(classes) for _ in pools[c]]
    assert all(r["image"] == members[f"2750/{r['sample_id']}"] for r in got)  # bytes as distributed
    assert meta.splits == {"test": 30}
    saved = load_meta(out)
    assert saved.provenance["files"]["archive"]["verified"] is True

    # base/novel: the code's gen_rand_split_inds over its sorted class list, base kept in draw order
    code_base = [classes[i] for i in np.random.RandomState(22).choice(10, 6, replace=False)]
    base, novel = class_split(10, split_table()["eurosat"]["novel"])
    assert [meta.classes[i].key for i in base] == code_base
    assert sorted(meta.classes[i].key for i in novel) == sorted(set(classes) - set(code_base))

    # what the code's sampler sees, class id by class id (base in draw order, then novel), is what the adapt analysis
    # samples from: class_pools over the prepared rows, in the same order
    code_novel = [classes[i] for i in np.setdiff1d(np.arange(10), np.random.RandomState(22).choice(10, 6, replace=False))]
    code_images_per_class = [pools[c] for c in code_base + code_novel]
    ids = np.array([r["sample_id"] for r in got])
    ours = class_pools(np.array([r["label"] for r in got]), 10)
    assert [ids[ours[c]].tolist() for c in np.concatenate([base, novel])] == code_images_per_class


def test_dtd_folder_names_and_wrong_checksum_refused(dirs):
    www, _, out = dirs
    names = ["zigzagged", "banded", "Blotchy", "cracked"]  # upper case sorts first, as sorted() does
    members = {f"dtd/images/{c}/{c}_{k:04d}.jpg": png(i * 10 + k) for i, c in enumerate(names) for k in (3, 1)}
    members["dtd/images/banded/.directory"] = b"x"
    members["dtd/labels/labels_joint_anno.txt"] = b"ignored"
    archive = write_tgz(www / "dtd-r1.0.1.tar.gz", members)
    spec = real_spec("fewtrans-dtd") | {"classes": 4, "images": 8}
    with serve(www) as base_url:
        with pytest.raises(ChecksumError, match=r"dtd-r1.0.1.tar.gz.*md5"):
            prepare_dataset("fewtrans-dtd", served(spec, base_url, archive="0" * 32), out)
        assert not out.exists()
        meta = prepare_dataset("fewtrans-dtd", served(spec, base_url, archive=md5(archive)), out)
    assert [c.name for c in meta.classes] == ["Blotchy", "banded", "cracked", "zigzagged"]
    assert [r["sample_id"] for r in rows(out)][:2] == ["Blotchy/Blotchy_0001.jpg", "Blotchy/Blotchy_0003.jpg"]


def test_wrong_class_or_image_count_is_refused(dirs):
    www, _, out = dirs
    archive = write_zip(www / "EuroSAT.zip", eurosat_members())
    with serve(www) as base_url, pytest.raises(DatasetError, match=r"the files hold 30 images, FewTrans' dataset has 27000"):
        prepare_dataset("eurosat", served(real_spec("eurosat"), base_url, archive=md5(archive)), out)
    assert not out.exists()


def test_macosx_and_hidden_folders_are_not_classes_and_an_empty_class_folder_is_refused(dirs):
    """Without the entry's counts (a user's own FewTrans-style archive) nothing else would notice."""
    www, _, out = dirs
    members = eurosat_members()
    members |= {"2750/__MACOSX/Forest/._Forest_1.jpg": png(99), "2750/.thumbs/t.jpg": png(98)}
    spec = real_spec("eurosat") | {"classes": None, "images": None}
    archive = write_zip(www / "EuroSAT.zip", members)
    with serve(www) as base_url:
        meta = prepare_dataset("eurosat", served(spec, base_url, archive=md5(archive)), out)
    assert len(meta.classes) == 10 and "__MACOSX" not in [c.name for c in meta.classes] and len(rows(out)) == 30
    members["2750/Unlabelled/notes.txt"] = b"no image here"
    archive = write_zip(www / "EuroSAT.zip", members)
    with serve(www) as base_url, pytest.raises(DatasetError, match=r"dataset 'eurosat': class folder\(s\) "
                                                                 r"\['Unlabelled'\] under .*2750 hold no image file "
                                                                 r"\(1 of 11\)"):
        prepare_dataset("eurosat", served(spec, base_url, archive=md5(archive)), tmp_out := out.with_name("o2"))
    assert not tmp_out.exists()


def test_quickdraw_and_ucf_names_replace_underscores(dirs):
    keys = ["The_Eiffel_Tower", "aircraft_carrier", "t-shirt", "Apply_Eye_Makeup"]
    infos = fewtrans.class_names("q", "underscores", keys)
    assert [c.name for c in infos] == ["The Eiffel Tower", "aircraft carrier", "t-shirt", "Apply Eye Makeup"]
    assert [c.key for c in infos] == ["The_Eiffel_Tower", "aircraft_carrier", None, "Apply_Eye_Makeup"]


def test_plant_disease_names_every_folder_and_refuses_an_unknown_one():
    keys = sorted(NAMES["tables"]["plant_disease"])
    infos = fewtrans.class_names("p", "plant_disease", keys)
    assert len(infos) == 38
    # Python's sort puts upper case first: the code's class order
    assert keys.index("Cherry_(including_sour)___Powdery_mildew") < keys.index("Cherry_(including_sour)___healthy")
    assert infos[keys.index("Tomato___Spider_mites Two-spotted_spider_mite")].name == "tomato leaf with (twospotted) spider mites"
    with pytest.raises(DatasetError, match=r"\['Banana___healthy'\] have no name .* table 'plant_disease'"):
        fewtrans.class_names("p", "plant_disease", keys + ["Banana___healthy"])


def test_imagenet_sketch_names_are_clip_names_in_wnid_order_with_wnids():
    from vlbench.datasets.imagenet import clip_classnames

    keys = [f"n{i:08d}" for i in range(1000)]
    infos = fewtrans.class_names("s", "imagenet", keys)
    assert [c.name for c in infos] == list(clip_classnames()) and [c.wnid for c in infos] == keys
    with pytest.raises(DatasetError, match=r"expected 1000 class folders named by ImageNet wnids, found 2"):
        fewtrans.class_names("s", "imagenet", keys[:2])


@pytest.mark.parametrize("change, expected", [
    ({"layout": "tfrecords"}, r"layout 'tfrecords' is not one of \['folders', 'flowers', 'fungi', 'aircraft', 'cifar'\]"),
    ({"files": {"images": {"file": "a.zip", "url": "http://x/a.zip"}}}, r"'files' must give exactly the roles \['archive'\]"),
    ({"converter_resize": True}, r"\['converter_resize'\] apply to layout 'cifar' only, not 'folders'"),
    ({"rooot": "x"}, r"unknown spec key\(s\) \['rooot'\].*did you mean 'root'"),
])
def test_bad_specs_are_refused_naming_the_key(change, expected):
    with pytest.raises(DatasetError, match=expected):
        fewtrans.catalogue_row("eurosat", real_spec("eurosat") | change)


def test_an_archive_without_the_root_folder_names_its_top_level(dirs):
    www, _, out = dirs
    archive = write_zip(www / "EuroSAT.zip", {"EuroSAT_RGB/Forest/Forest_1.jpg": png(1)})
    with serve(www) as base_url, pytest.raises(DatasetError, match=r"has no folder '2750' \(spec 'root'\); its top level: \['EuroSAT_RGB'\]"):
        prepare_dataset("eurosat", served(real_spec("eurosat"), base_url, archive=md5(archive)), out)


# ------------------------------------------------------------------------------------------------ manual files


@pytest.mark.parametrize("entry, archive, link", [
    ("ucf101", "UCF-101-midframes.zip", "https://drive.google.com/file/d/10Jqome3vtUA2keJkNanAiFpgbyC9Hc2O"),
    ("plant-disease", "plant-disease.zip", "https://www.kaggle.com/datasets/saroz014/plant-disease"),
])
def test_manual_archive_message_names_the_file_the_link_and_where_to_put_it(dirs, entry, archive, link):
    _, mirror, out = dirs
    with pytest.raises(ManualDownloadError) as err:
        prepare_dataset(entry, real_spec(entry), out)
    message = str(err.value)
    assert repr(archive) in message and link in message and str(mirror.resolve()) in message
    assert not out.exists()


def test_two_manual_files_are_named_in_one_message(dirs):
    _, _, out = dirs
    spec = real_spec("fewtrans-flowers")
    for res in spec["files"].values():
        res.pop("url")
        res["manual"] = "the Oxford VGG page"
    with pytest.raises(ManualDownloadError) as err:
        prepare_dataset("fewtrans-flowers", spec, out)
    assert "2 files must be downloaded by hand" in str(err.value)
    assert "'102flowers.tgz'" in str(err.value) and "'imagelabels.mat'" in str(err.value)


# ------------------------------------------------------------------------------------------------ other layouts


def test_flowers_label_order_meta_dataset_names_and_image_number_pools(dirs):
    from scipy.io import savemat

    www, _, out = dirs
    labels = [3, 1, 102, 1, 3, 2, 102]  # image i+1 has labels[i]
    members = {f"jpg/image_{i + 1:05d}.jpg": png(i) for i in range(len(labels))}
    images = write_tgz(www / "102flowers.tgz", members)
    buf = io.BytesIO()
    savemat(buf, {"labels": np.array([labels])})
    (www / "imagelabels.mat").write_bytes(buf.getvalue())
    sums = {"images": md5(images), "labels": hashlib.md5(buf.getvalue()).hexdigest()}
    with serve(www) as base_url:
        meta = prepare_dataset("fewtrans-flowers", served(real_spec("fewtrans-flowers") | {"images": 7}, base_url, **sums), out)
    assert [c.name for c in meta.classes][:3] == ["pink primrose", "hard-leaved pocket orchid", "canterbury bells"]
    assert meta.classes[101].name == "blackberry lily" and meta.classes[59].name == "pink-yellow dahlia?"
    got = rows(out)
    assert [(r["label"], r["sample_id"]) for r in got] == [
        (0, "jpg/image_00002.jpg"), (0, "jpg/image_00004.jpg"), (1, "jpg/image_00006.jpg"),
        (2, "jpg/image_00001.jpg"), (2, "jpg/image_00005.jpg"), (101, "jpg/image_00003.jpg"),
        (101, "jpg/image_00007.jpg")]


def test_fungi_category_order_repeated_names_and_train_then_val_pools(dirs):
    www, _, out = dirs
    cats = [{"id": 2, "name": "Amanita muscaria"}, {"id": 0, "name": "Boletus edulis"}, {"id": 1, "name": "Amanita muscaria"}]
    train = {"categories": cats, "images": [{"id": 10, "file_name": "images/b/z.JPG"}, {"id": 11, "file_name": "images/a/y.JPG"},
                                            {"id": 12, "file_name": "images/c/a.JPG"}],
             "annotations": [{"image_id": 10, "category_id": 0}, {"image_id": 11, "category_id": 2},
                             {"image_id": 12, "category_id": 0}]}
    val = {"categories": cats, "images": [{"id": 20, "file_name": "images/b/a.JPG"}, {"id": 21, "file_name": "images/d/q.JPG"}],
           "annotations": [{"image_id": 20, "category_id": 0}, {"image_id": 21, "category_id": 1}]}
    members = {img["file_name"]: png(img["id"]) for img in train["images"] + val["images"]}
    images = write_tgz(www / "fungi_train_val.tgz", members)
    notes = write_tgz(www / "train_val_annotations.tgz",
                      {"train.json": json.dumps(train).encode(), "val.json": json.dumps(val).encode()})
    spec = real_spec("fungi") | {"classes": 3, "images": 5}
    with serve(www) as base_url:
        meta = prepare_dataset("fungi", served(spec, base_url, images=md5(images), annotations=md5(notes)), out)
    assert [(c.name, c.key) for c in meta.classes] == [("Boletus edulis", "0000.Boletus edulis"),
                                                      ("Amanita muscaria", "0001.Amanita muscaria"),
                                                      ("Amanita muscaria", "0002.Amanita muscaria")]
    assert [(r["label"], r["sample_id"]) for r in rows(out)] == [
        (0, "images/b/z.JPG"), (0, "images/c/a.JPG"), (0, "images/b/a.JPG"),  # train's order, then val's: not sorted
        (1, "images/d/q.JPG"), (2, "images/a/y.JPG")]


AIRCRAFT_VARIANTS = ["A300B4", "F/A-18", "Falcon 2000", "F-16A/B", "747-400"]


def aircraft_archive(www: Path) -> Path:
    """fgvc-aircraft-2013b/data: variants.txt, images_variant_{trainval,test}.txt, images/<id>.jpg."""
    ids = {v: [f"{1000 + 10 * k + j:07d}" for j in (2, 0, 1)] for k, v in enumerate(AIRCRAFT_VARIANTS)}
    trainval = [f"{ids[v][0]} {v}" for v in AIRCRAFT_VARIANTS] + [f"{ids[v][1]} {v}" for v in AIRCRAFT_VARIANTS]
    test = [f"{ids[v][2]} {v}" for v in AIRCRAFT_VARIANTS]
    base = "fgvc-aircraft-2013b/data/"
    members = {base + "variants.txt": ("\n".join(AIRCRAFT_VARIANTS) + "\n").encode(),
               base + "images_variant_trainval.txt": ("\n".join(trainval) + "\n").encode(),
               base + "images_variant_test.txt": ("\n".join(test) + "\n").encode()}
    members |= {f"{base}images/{i}.jpg": png(int(i)) for v in AIRCRAFT_VARIANTS for i in ids[v]}
    return write_tgz(www / "fgvc-aircraft-2013b.tar.gz", members)


@pytest.mark.parametrize("mode", ["paper", "code"])
def test_aircraft_variants_sorted_all_images_sorted_by_id(dirs, mode):
    www, _, out = dirs
    archive = aircraft_archive(www)
    spec = real_spec("fgvc-aircraft") | {"classes": 5, "images": 15 if mode == "paper" else 9, "variant_folders": mode}
    with serve(www) as base_url:
        meta = prepare_dataset("fgvc-aircraft", served(spec, base_url), out)
    got = rows(out)
    # no checksum is published: the download is kept, its sha256 recorded as unverified
    recorded = load_meta(out).provenance["files"]["archive"]
    assert recorded["verified"] is False and recorded["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    if mode == "paper":
        assert [c.name for c in meta.classes] == sorted(AIRCRAFT_VARIANTS) == ["747-400", "A300B4", "F-16A/B", "F/A-18",
                                                                               "Falcon 2000"]
        assert [r["sample_id"] for r in got if r["label"] == 0] == [
            "data/images/0001040.jpg", "data/images/0001041.jpg", "data/images/0001042.jpg"]
        return
    # the code's converter: os.makedirs("<dst>/F/A-18") makes folder "F" (holding "A-18/"), listed as a class
    # whose own folder has no image file; the same for "F-16A/B"
    made = Path(out.parent / "made")
    for v in AIRCRAFT_VARIANTS:
        (made / v).mkdir(parents=True, exist_ok=True)
        (made / v / "file_000001.png").write_bytes(b"x")
    classes, pools = code_listing(made)
    assert [c.name for c in meta.classes] == classes == ["747-400", "A300B4", "F", "F-16A", "Falcon 2000"]
    counts = np.bincount([r["label"] for r in got], minlength=5).tolist()
    assert counts == [3 if pools[c] else 0 for c in classes] == [3, 3, 0, 0, 3]
    assert [c.key for c in meta.classes] == [None, None, "F/A-18", "F-16A/B", None]


def cifar_archive(www: Path) -> tuple[Path, dict]:
    """cifar-100-python/{meta,test} pickles with 3 fine classes (the distributed files are Python 2 pickles whose
    str keys and names load as str with encoding latin1, as these do)."""
    names = ["apple", "maple_tree", "aquarium_fish"]  # the code sorts the folder names
    rng = np.random.default_rng(0)
    data = rng.integers(0, 255, (6, 3072), dtype=np.uint8)
    test = {"data": data, "fine_labels": [1, 0, 1, 2, 0, 1],
            "filenames": ["m_s_000002.png", "a_s_000010.png", "m_s_000001.png", "q_s_000001.png",
                          "a_s_000009.png", "m_s_000002.png"]}  # the last replaces the first (same file name)
    meta = {"fine_label_names": names, "coarse_label_names": ["x"]}
    archive = write_tgz(www / "cifar-100-python.tar.gz", {"cifar-100-python/meta": pickle.dumps(meta, protocol=2),
                                                          "cifar-100-python/test": pickle.dumps(test, protocol=2)})
    return archive, test


def test_cifar_test_batch_sorted_folders_and_file_names(dirs):
    www, _, out = dirs
    archive, test = cifar_archive(www)
    spec = real_spec("fewtrans-cifar100") | {"classes": 3, "images": 5}
    spec["files"]["archive"]["md5"] = md5(archive)
    with serve(www) as base_url:
        meta = prepare_dataset("fewtrans-cifar100", served(spec, base_url), out)
    assert [c.name for c in meta.classes] == ["apple", "aquarium_fish", "maple_tree"]  # folder names as the code names them
    got = rows(out)
    assert [(r["label"], r["sample_id"]) for r in got] == [
        (0, "apple/a_s_000009.png"), (0, "apple/a_s_000010.png"), (1, "aquarium_fish/q_s_000001.png"),
        (2, "maple_tree/m_s_000001.png"), (2, "maple_tree/m_s_000002.png")]
    pixels = np.asarray(Image.open(io.BytesIO(got[4]["image"])).convert("RGB"))
    original = test["data"][5].reshape(3, 32, 32).transpose(1, 2, 0)
    assert np.array_equal(pixels, original)  # the later duplicate, lossless
    assert load_meta(out).preprocess == "default"

    # the code's converter: 84 x 84 LANCZOS, and the code's test transform
    spec.update(converter_resize=True, preprocess="fewtrans")
    with serve(www) as base_url:
        meta = prepare_dataset("fewtrans-cifar100", served(spec, base_url), out.with_name("code"))
    image = Image.open(io.BytesIO(rows(out.with_name("code"))[4]["image"]))
    assert image.size == (84, 84) and meta.preprocess == "fewtrans"
    assert np.array_equal(np.asarray(image.convert("RGB")),
                          np.asarray(Image.fromarray(original).resize((84, 84), resample=Image.LANCZOS)))


# ------------------------------------------------------------------------------------------------ catalogue


def test_suite_catalogue_lists_the_ten_datasets_with_base_and_novel_without_download(tmp_path, monkeypatch):
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "cache"))
    listed = {row["name"]: row for row in catalogue("fewtrans")}
    assert list(listed) == SUITE
    for name, (classes, base, novel) in PAPER.items():
        row = listed[name]
        assert (row["classes"], row["base"], row["novel"], row["source"], row["metric"]) == (
            classes, base, novel, "fewtrans", "accuracy")
    assert {n for n, r in listed.items() if r["manual_download"]} == {"ucf101", "plant-disease"}
    assert listed["quickdraw"]["splits"] == {"test": 172500} and listed["fungi"]["splits"] == {"test": 89760}
    assert listed["plant-disease"]["splits"] == {}  # its image count is not known without the files
    assert not (tmp_path / "cache").exists()


REFERENCE = ROOT.parent / "shared" / "reference" / "breeds" / "modified" / "dataset_class_info.json"


@pytest.mark.skipif(not REFERENCE.exists(), reason="needs ImageNet's 1,000 wnids from ../shared/reference (BREEDS)")
def test_imagenet_sketch_split_under_the_suite_params_is_meta_datasets_712_288():
    """The suite's adapt params on ImageNet-Sketch's classes as the source names them: carnivore's 158 and device's 130
    classes (Meta-Dataset's ILSVRC validation and test splits) are novel."""
    from vlbench.analyses.adapt.fewtrans import episode_classes, settings
    from vlbench.compose import compose
    from vlbench.datasets.canonical import DatasetMeta
    from vlbench.params import effective

    wnids = sorted(row[1] for row in json.loads(REFERENCE.read_text()))
    meta = DatasetMeta("imagenet-sketch", "single-label", "accuracy", fewtrans.class_names("imagenet-sketch", "imagenet", wnids))
    base, novel, graph = episode_classes(meta, settings(effective(compose(["suite=fewtrans"]))["adapt"]["fewtrans"]))
    assert (len(base), len(novel)) == (712, 288)
    roots = {n.wnid: len(n.classes) for n in graph.novel_nodes if n.wnid in ("n02075296", "n03183080")}
    assert roots == {"n02075296": 158, "n03183080": 130}


def test_cli_json_catalogue(tmp_path):
    env = {**os.environ, "VLBENCH_DOWNLOADS": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "vlbench.cli", "datasets", "--suite", "fewtrans", "--json"],
                          cwd=ROOT, capture_output=True, text=True, env=env, check=True)
    listed = json.loads(done.stdout)
    assert [(r["name"], r["classes"], r["base"], r["novel"]) for r in listed] == [
        (n, *PAPER[n]) for n in SUITE]
