"""Local datasets: `imagefolder` and `manifest` sources on miniature data made here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from PIL import Image

from vlbench.datasets import images as image_checks
from vlbench.datasets import local
from vlbench.datasets.canonical import DatasetError, load_meta
from vlbench.datasets.local import (
    IMG_EXTENSIONS,
    build_imagefolder,
    build_manifest,
)
from vlbench.datasets.registry import prepare_dataset


def make_image(path: Path, seed: int, fmt: str | None = None, size: int = 12) -> bytes:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(path, format=fmt)
    return path.read_bytes()


def truncated_jpeg(path: Path, seed: int = 99) -> Path:
    data = make_image(path, seed, "JPEG", size=48)
    path.write_bytes(data[: len(data) - 40])
    return path


def read_split(out: Path, split: str) -> list[dict]:
    return pq.read_table(out / "splits" / f"{split}.parquet").to_pylist()


@pytest.fixture
def folder(tmp_path) -> Path:
    """root/{train,val}/{cat,dog_big,eel}/..., with a nested folder, an upper-case extension and a non-image."""
    root = tmp_path / "pets"
    seed = 0
    for split in ("train", "val"):
        for cls in ("dog_big", "cat", "eel"):
            for j, ext in enumerate((".png", ".jpg")):
                seed += 1
                make_image(root / split / cls / f"img{j}{ext}", seed)
        make_image(root / split / "cat" / "nested" / "deep.PNG", seed + 100, "PNG")
        (root / split / "cat" / "notes.txt").write_text("not an image")
    return root


# ----------------------------------------------------------------------------------------- imagefolder


def test_imagefolder_labels_ids_and_bytes(folder, tmp_path):
    out = tmp_path / "out"
    meta = build_imagefolder("pets", {"source": "imagefolder", "root": str(folder),
                                      "splits": {"train": "train", "test": "val"}}, out)
    assert meta.class_names == ["cat", "dog big", "eel"]
    assert meta.metric == "accuracy"
    assert meta.splits == {"train": 7, "test": 7}
    rows = read_split(out, "test")
    assert [r["sample_id"] for r in rows] == [
        "val/cat/img0.png", "val/cat/img1.jpg", "val/cat/nested/deep.PNG",
        "val/dog_big/img0.png", "val/dog_big/img1.jpg", "val/eel/img0.png", "val/eel/img1.jpg",
    ]
    assert [r["label"] for r in rows] == [0, 0, 0, 1, 1, 2, 2]
    for r in rows + read_split(out, "train"):
        assert r["image"] == (folder / r["sample_id"]).read_bytes()  # stored as distributed
    on_disk = load_meta(out)
    assert on_disk.version == meta.version and on_disk.class_names == meta.class_names
    prov = on_disk.provenance
    assert prov["source"] == "imagefolder" and prov["root"] == str(folder.resolve())
    assert prov["counts"] == {"train": 7, "test": 7} and prov["skipped_corrupt"] == []
    assert prov["class_folders"] == ["cat", "dog_big", "eel"]
    classes = json.loads((out / "classes.json").read_text())["classes"]
    assert [(c["key"], c["name"]) for c in classes] == [("cat", "cat"), ("dog_big", "dog big"), ("eel", "eel")]


def test_imagefolder_matches_torchvision(folder, tmp_path):
    datasets = pytest.importorskip("torchvision.datasets")
    from torchvision.datasets.folder import IMG_EXTENSIONS as TV_EXTENSIONS

    assert tuple(IMG_EXTENSIONS) == tuple(TV_EXTENSIONS)
    out = tmp_path / "out"
    meta = build_imagefolder("pets", {"source": "imagefolder", "root": folder,
                                      "splits": {"train": "train", "test": "val"}}, out)
    for split, sub in (("train", "train"), ("test", "val")):
        tv = datasets.ImageFolder(str(folder / sub))
        folders = meta.provenance["class_folders"]
        assert {f: i for i, f in enumerate(folders)} == tv.class_to_idx
        rows = read_split(out, split)
        assert [(str(folder / r["sample_id"]), r["label"]) for r in rows] == [(str(Path(p)), y) for p, y in tv.samples]


def test_imagefolder_flat_split_is_default(folder, tmp_path):
    root = folder / "train"
    explicit = build_imagefolder("flat", {"source": "imagefolder", "root": root, "splits": {"test": "."}}, tmp_path / "a")
    default = build_imagefolder("flat", {"source": "imagefolder", "root": root}, tmp_path / "b")
    assert explicit.splits == default.splits == {"test": 7}
    rows = read_split(tmp_path / "a", "test")
    assert rows[0]["sample_id"] == "cat/img0.png" and rows[-1]["sample_id"] == "eel/img1.jpg"
    assert [r["sample_id"] for r in rows] == [r["sample_id"] for r in read_split(tmp_path / "b", "test")]


def test_imagefolder_classnames_and_wnids(folder, tmp_path):
    spec = {"source": "imagefolder", "root": folder / "val",
            "classnames": {"eel": "eel fish", "cat": "kitty", "dog_big": "big dog"},  # any order: matched by folder
            "metric": "mean_per_class",
            "wnids": {"dog_big": "n02084071", "cat": "n02121808"}}
    meta = build_imagefolder("pets", spec, tmp_path / "a")
    assert meta.class_names == ["kitty", "big dog", "eel fish"]
    assert [c.key for c in meta.classes] == ["cat", "dog_big", "eel"]
    assert [c.wnid for c in meta.classes] == ["n02121808", "n02084071", None] and meta.metric == "mean_per_class"
    assert [c.key for c in load_meta(tmp_path / "a").classes] == ["cat", "dog_big", "eel"]
    # A mapping renames some folders; the rest default to the folder name with spaces.
    spec = {"source": "imagefolder", "root": folder / "val", "classnames": {"eel": "moray eel"}}
    assert build_imagefolder("pets", spec, tmp_path / "b").class_names == ["cat", "dog big", "moray eel"]


def test_imagefolder_via_registry(folder, tmp_path):
    meta = prepare_dataset("pets", {"source": "imagefolder", "root": str(folder / "val")}, tmp_path / "out")
    assert meta.splits == {"test": 7} and (tmp_path / "out" / "classes.json").exists()


def test_imagefolder_classnames_list_is_refused(folder, tmp_path):
    """A list would be matched by position to the sorted folders: ["dog", "cat", "eel"] would mislabel two classes."""
    spec = {"source": "imagefolder", "root": folder / "val", "classnames": ["big dog", "kitty", "eel fish"]}
    with pytest.raises(DatasetError) as err:
        build_imagefolder("pets", spec, tmp_path / "out")
    msg = str(err.value)
    assert "dataset 'pets'" in msg and "'classnames'" in msg and "list" in msg
    assert "cat, dog_big, eel" in msg  # the sorted folder order
    assert "{cat: ..., dog_big: ..., eel: ...}" in msg  # the mapping form to use
    with pytest.raises(DatasetError, match=r"'wnids'.*mapping"):
        build_imagefolder("pets", {**spec, "classnames": None, "wnids": ["n1", "n2", "n3"]}, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_imagefolder_classnames_errors(folder, tmp_path):
    spec = {"source": "imagefolder", "root": folder / "val"}
    spec["classnames"] = {"cta": "typo"}
    with pytest.raises(DatasetError, match=r"'classnames' names \['cta'\]"):
        build_imagefolder("pets", spec, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_imagefolder_splits_must_share_classes(folder, tmp_path):
    (folder / "val" / "eel").rename(folder / "val" / "ell")
    spec = {"source": "imagefolder", "root": folder, "splits": {"train": "train", "test": "val"}}
    with pytest.raises(DatasetError) as err:
        build_imagefolder("pets", spec, tmp_path / "out")
    msg = str(err.value)
    assert "'pets'" in msg and "split 'test'" in msg and "missing ['eel']" in msg and "extra ['ell']" in msg


def test_imagefolder_missing_root_and_split(tmp_path, folder):
    with pytest.raises(DatasetError, match=r"dataset 'pets': root '.*nowhere' is not a directory"):
        build_imagefolder("pets", {"source": "imagefolder", "root": tmp_path / "nowhere"}, tmp_path / "out")
    with pytest.raises(DatasetError, match=r"split 'test'.*valid.*does not exist"):
        build_imagefolder("pets", {"source": "imagefolder", "root": folder, "splits": {"test": "valid"}},
                          tmp_path / "out")
    with pytest.raises(DatasetError, match=r"'root' must be a path"):
        build_imagefolder("pets", {"source": "imagefolder"}, tmp_path / "out")


def test_imagefolder_empty_split(tmp_path, folder):
    for cls in ("a", "b"):
        (tmp_path / "empty" / "val" / cls).mkdir(parents=True)
        (tmp_path / "empty" / "val" / cls / "readme.txt").write_text("x")
    with pytest.raises(DatasetError, match=r"split 'test': empty split"):
        build_imagefolder("e", {"source": "imagefolder", "root": tmp_path / "empty" / "val"}, tmp_path / "out")
    (tmp_path / "none").mkdir()
    with pytest.raises(DatasetError, match=r"no class folders"):
        build_imagefolder("e", {"source": "imagefolder", "root": tmp_path / "none"}, tmp_path / "out")


def test_unknown_spec_key_lists_allowed(folder, tmp_path):
    with pytest.raises(DatasetError) as err:
        build_imagefolder("pets", {"source": "imagefolder", "root": folder, "class_names": []}, tmp_path / "out")
    assert "'pets'" in str(err.value) and "class_names" in str(err.value) and "classnames" in str(err.value)
    with pytest.raises(DatasetError, match=r"unknown spec key.*'root'.*allowed keys:.*image_column"):
        build_manifest("m", {"source": "manifest", "path": "x.csv", "root": "y"}, tmp_path / "out")


def test_bad_metric_and_templates_are_not_data(folder, tmp_path):
    spec = {"source": "imagefolder", "root": folder / "val"}
    with pytest.raises(DatasetError, match="metric 'f1'"):
        build_imagefolder("pets", {**spec, "metric": "f1"}, tmp_path / "out")
    with pytest.raises(DatasetError, match=r"unknown spec key.*'templates'"):  # prompts are text sets now
        build_imagefolder("pets", {**spec, "templates": ["a photo of a {c}."]}, tmp_path / "out")


def test_image_check_is_the_canonical_one():
    assert local.checked_rows is image_checks.checked_rows  # one check, used by every source


def test_imagefolder_corrupt_image(folder, tmp_path):
    bad = truncated_jpeg(folder / "val" / "dog_big" / "broken.jpg")
    spec = {"source": "imagefolder", "root": folder, "splits": {"train": "train", "test": "val"}}
    with pytest.raises(DatasetError) as err:
        build_imagefolder("pets", spec, tmp_path / "out")
    msg = str(err.value)
    assert "'pets'" in msg and "split 'test'" in msg and str(bad) in msg
    assert not (tmp_path / "out").exists()  # atomic: nothing half-written

    meta = build_imagefolder("pets", {**spec, "skip_corrupt": True}, tmp_path / "out")
    assert meta.splits == {"train": 7, "test": 7}
    assert "val/dog_big/broken.jpg" not in {r["sample_id"] for r in read_split(tmp_path / "out", "test")}
    prov = json.loads((tmp_path / "out" / "classes.json").read_text())["provenance"]
    assert prov["skipped_corrupt"] == ["val/dog_big/broken.jpg"]
    assert prov["counts"] == {"train": 7, "test": 7}


# -------------------------------------------------------------------------------------------- manifest


@pytest.fixture
def images(tmp_path) -> Path:
    """data/img/{0..5}.{png,jpg} and one image outside the manifest folder."""
    base = tmp_path / "data"
    for i in range(6):
        make_image(base / "img" / f"{i}.{'png' if i % 2 else 'jpg'}", i)
    make_image(tmp_path / "elsewhere" / "far.png", 42)
    return base


def test_manifest_csv_string_labels_split_column(images, tmp_path):
    far = tmp_path / "elsewhere" / "far.png"
    inside = images / "img" / "5.png"
    (images / "m.csv").write_text(
        "path,label,split\n"
        "img/0.jpg,zebra,train\n"
        "./img/1.png,ant,train\n"
        f"{far},zebra,test\n"
        f"{inside},ant,test\n"
        "img/2.jpg,sea_lion,train\n"
    )
    out = tmp_path / "out"
    meta = build_manifest("m", {"source": "manifest", "path": str(images / "m.csv"), "split_column": "split",
                                "allow_outside_root": True}, out)
    assert meta.class_names == ["ant", "sea lion", "zebra"]  # sorted unique labels
    assert [c.key for c in meta.classes] == ["ant", "sea_lion", "zebra"]  # the label as written, beside its name
    assert meta.splits == {"test": 2, "train": 3}
    train, test = read_split(out, "train"), read_split(out, "test")
    assert [(r["sample_id"], r["label"]) for r in train] == [("img/0.jpg", 2), ("img/1.png", 0), ("img/2.jpg", 1)]
    assert [(r["sample_id"], r["label"]) for r in test] == [(far.as_posix(), 2), ("img/5.png", 0)]
    assert train[1]["image"] == (images / "img" / "1.png").read_bytes()
    assert test[0]["image"] == far.read_bytes()
    prov = load_meta(out).provenance
    assert prov["source"] == "manifest" and prov["manifest"] == str((images / "m.csv").resolve())
    import hashlib
    assert prov["sha256"] == hashlib.sha256((images / "m.csv").read_bytes()).hexdigest()
    assert prov["counts"] == {"test": 2, "train": 3} and prov["class_labels"] == ["ant", "sea_lion", "zebra"]


def test_manifest_parquet_int_labels_single_split(images, tmp_path):
    pl.DataFrame({"file": [f"img/{i}.{'png' if i % 2 else 'jpg'}" for i in range(4)],
                  "y": [1, 0, 1, 2]}).write_parquet(images / "m.parquet")
    spec = {"source": "manifest", "path": images / "m.parquet", "image_column": "file", "label_column": "y",
            "classnames": ["cat", "dog", "eel"], "wnids": {0: "n1"}}
    meta = build_manifest("m", spec, tmp_path / "out")
    assert meta.class_names == ["cat", "dog", "eel"] and meta.splits == {"test": 4}
    assert [c.wnid for c in meta.classes] == ["n1", None, None]
    assert [c.key for c in meta.classes] == [None, None, None]  # integer labels: the index is the key
    rows = read_split(tmp_path / "out", "test")
    assert [r["label"] for r in rows] == [1, 0, 1, 2]
    assert [r["sample_id"] for r in rows] == ["img/0.jpg", "img/1.png", "img/2.jpg", "img/3.png"]
    assert all(r["image"] == (images / r["sample_id"]).read_bytes() for r in rows)

    with pytest.raises(DatasetError, match=r"integer labels need 'classnames'"):
        build_manifest("m", {k: v for k, v in spec.items() if k != "classnames"}, tmp_path / "o2")
    with pytest.raises(DatasetError, match=r"m\.parquet' row 3: label 2 is not in classnames \(labels must be 0\.\.1\)"):
        build_manifest("m", {**spec, "classnames": ["cat", "dog"], "wnids": None}, tmp_path / "o2")


def test_manifest_split_files_and_classnames(images, tmp_path):
    (images / "train.csv").write_text("path,label\nimg/0.jpg,b\nimg/1.png,a\n")
    (images / "test.tsv").write_text("path\tlabel\nimg/2.jpg\ta\n")
    spec = {"source": "manifest", "splits": {"train": str(images / "train.csv"), "test": str(images / "test.tsv")},
            "classnames": ["b", "a", "c"]}
    meta = build_manifest("m", spec, tmp_path / "out")
    assert meta.class_names == ["b", "a", "c"] and meta.splits == {"train": 2, "test": 1}
    assert [r["label"] for r in read_split(tmp_path / "out", "train")] == [0, 1]
    prov = load_meta(tmp_path / "out").provenance
    assert set(prov["manifest"]) == {"train", "test"} and len(prov["sha256"]["test"]) == 64

    with pytest.raises(DatasetError, match=r"train\.csv' row 0: label 'b' is not in classnames"):
        build_manifest("m", {**spec, "classnames": ["a", "c"]}, tmp_path / "o2")
    with pytest.raises(DatasetError, match=r"'classnames' names \['z'\] which are not labels"):
        build_manifest("m", {**spec, "classnames": {"z": "zed"}}, tmp_path / "o2")
    with pytest.raises(DatasetError, match=r"'classnames' lists the label\(s\) \['a'\] more than once"):
        build_manifest("m", {**spec, "classnames": ["a", "b", "a"]}, tmp_path / "o2")
    renamed = build_manifest("m", {**spec, "classnames": {"a": "apple"}}, tmp_path / "o3")
    assert renamed.class_names == ["apple", "b"]


def test_manifest_missing_file_and_columns(images, tmp_path):
    with pytest.raises(DatasetError, match=r"dataset 'm': manifest file '.*nope\.csv' does not exist"):
        build_manifest("m", {"source": "manifest", "path": images / "nope.csv"}, tmp_path / "out")
    (images / "m.csv").write_text("image,cls\nimg/0.jpg,a\n")
    with pytest.raises(DatasetError) as err:
        build_manifest("m", {"source": "manifest", "path": images / "m.csv", "label_column": "cls"}, tmp_path / "out")
    msg = str(err.value)
    assert "m.csv" in msg and "['path']" in msg and "['image', 'cls']" in msg
    pl.DataFrame({"image": ["img/0.jpg"], "cls": ["a"]}).write_parquet(images / "m.parquet")
    with pytest.raises(DatasetError, match=r"m\.parquet' has no column\(s\) \['path', 'label'\]; its columns are \['image', 'cls'\]"):
        build_manifest("m", {"source": "manifest", "path": images / "m.parquet"}, tmp_path / "out")
    with pytest.raises(DatasetError, match=r"has no column\(s\) \['split'\]"):
        build_manifest("m", {"source": "manifest", "path": images / "m.csv", "image_column": "image",
                             "label_column": "cls", "split_column": "split"}, tmp_path / "out")
    with pytest.raises(DatasetError, match="exactly one of 'path'"):
        build_manifest("m", {"source": "manifest"}, tmp_path / "out")


def test_manifest_missing_image_empty_and_nulls(images, tmp_path):
    (images / "m.csv").write_text("path,label\nimg/0.jpg,a\nimg/missing.png,b\n")
    with pytest.raises(DatasetError, match=r"split 'test': manifest '.*m\.csv' row 1: image file '.*missing\.png' does not exist"):
        build_manifest("m", {"source": "manifest", "path": images / "m.csv"}, tmp_path / "out")
    (images / "empty.csv").write_text("path,label\n")
    with pytest.raises(DatasetError, match=r"split 'test': empty split, manifest '.*empty\.csv'"):
        build_manifest("m", {"source": "manifest", "path": images / "empty.csv"}, tmp_path / "out")
    (images / "null.csv").write_text("path,label\nimg/0.jpg,a\nimg/1.png,\n")
    with pytest.raises(DatasetError, match=r"null\.csv' row 1: column 'label' is empty"):
        build_manifest("m", {"source": "manifest", "path": images / "null.csv"}, tmp_path / "out")


def test_manifest_corrupt_image(images, tmp_path):
    truncated_jpeg(images / "img" / "bad.jpg")
    (images / "m.csv").write_text("path,label\nimg/0.jpg,a\nimg/bad.jpg,b\nimg/1.png,b\n")
    spec = {"source": "manifest", "path": images / "m.csv"}
    with pytest.raises(DatasetError) as err:
        build_manifest("m", spec, tmp_path / "out")
    assert "'m'" in str(err.value) and "split 'test'" in str(err.value) and "bad.jpg" in str(err.value)
    meta = build_manifest("m", {**spec, "skip_corrupt": True}, tmp_path / "out")
    assert meta.splits == {"test": 2}
    assert [r["sample_id"] for r in read_split(tmp_path / "out", "test")] == ["img/0.jpg", "img/1.png"]
    assert load_meta(tmp_path / "out").provenance["skipped_corrupt"] == ["img/bad.jpg"]


def test_metric_that_cannot_apply_is_refused_at_prepare(folder, tmp_path):
    spec = {"source": "imagefolder", "root": folder / "val", "metric": "roc_auc"}
    with pytest.raises(DatasetError) as err:
        build_imagefolder("pets", spec, tmp_path / "out")
    assert all(part in str(err.value) for part in ("dataset 'pets'", "'roc_auc'", "3 classes", "single-label"))
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------- paths and links


def test_manifest_paths_leaving_its_folder_are_refused(images, tmp_path):
    far = tmp_path / "elsewhere" / "far.png"
    (images / "img" / "link.png").symlink_to(far)  # inside by name, outside once resolved
    for n, written in enumerate([str(far), "../elsewhere/far.png", "img/link.png"]):
        (images / "m.csv").write_text(f"path,label\nimg/0.jpg,a\n{written},b\n")
        spec = {"source": "manifest", "path": images / "m.csv"}
        with pytest.raises(DatasetError) as err:
            build_manifest("m", spec, tmp_path / f"out{n}")
        msg = str(err.value)
        assert "dataset 'm'" in msg and "m.csv' row 1" in msg and repr(written) in msg and str(far) in msg
        assert "outside" in msg and "allow_outside_root: true" in msg
        assert not (tmp_path / f"out{n}").exists()
        meta = build_manifest("m", {**spec, "allow_outside_root": True}, tmp_path / f"out{n}")
        assert meta.splits == {"test": 2}
        assert read_split(tmp_path / f"out{n}", "test")[1]["image"] == far.read_bytes()


def test_manifest_relative_paths_resolve_against_its_folder(images, tmp_path, monkeypatch):
    (images / "m.csv").write_text("path,label\nimg/0.jpg,a\n")
    monkeypatch.chdir(tmp_path)  # not the manifest's folder
    build_manifest("m", {"source": "manifest", "path": images / "m.csv"}, tmp_path / "out")
    assert read_split(tmp_path / "out", "test")[0]["image"] == (images / "img" / "0.jpg").read_bytes()


def test_allow_outside_root_must_be_a_boolean(images, tmp_path):
    (images / "m.csv").write_text("path,label\nimg/0.jpg,a\n")
    with pytest.raises(DatasetError, match=r"dataset 'm': 'allow_outside_root' must be true or false, got 'yes'"):
        build_manifest("m", {"source": "manifest", "path": images / "m.csv", "allow_outside_root": "yes"},
                       tmp_path / "out")


def assert_folder_link_refused(err: pytest.ExceptionInfo, link: Path, where: str = "dataset 'pets' split 'test'") -> None:
    msg = str(err.value)
    assert msg.startswith(f"{where}: folder link {str(link)!r}") and "DVC" in msg
    assert all(fix in msg for fix in ("copy", "bind mount", "point root at the real folder")), msg


def test_imagefolder_folder_link_inside_root_is_refused(folder, tmp_path):
    """The issue's case (`ln -s ../../extra <root>/test/<class>/inlink`): DVC does not follow folder links when it
    hashes `input`, so the link's images were prepared (13 instead of 12) while `dvc status` said up to date."""
    make_image(folder / "extra" / "x.png", 77)
    link = folder / "val" / "eel" / "inlink"
    link.symlink_to("../../extra", target_is_directory=True)
    spec = {"source": "imagefolder", "root": folder, "splits": {"test": "val"}}
    for allow in (False, True):
        with pytest.raises(DatasetError) as err:
            build_imagefolder("pets", {**spec, "allow_outside_root": allow}, tmp_path / "out")
        assert_folder_link_refused(err, link)
        assert str(folder / "extra") in str(err.value)
    assert not (tmp_path / "out").exists()


def test_imagefolder_link_loop_is_refused(tmp_path):
    """A link to an ancestor once turned 12 images into hundreds of mislabelled samples; the walk never enters it."""
    root = tmp_path / "loop"
    for c in range(3):
        for j in range(4):
            make_image(root / f"c{c}" / f"{j}.png", 10 * c + j)
    (root / "c1" / "again").symlink_to(root, target_is_directory=True)
    for allow in (False, True):
        with pytest.raises(DatasetError) as err:
            build_imagefolder("loop", {"source": "imagefolder", "root": root, "allow_outside_root": allow},
                              tmp_path / "out")
        assert_folder_link_refused(err, root / "c1" / "again", "dataset 'loop' split 'test'")
    assert not (tmp_path / "out").exists()


def test_imagefolder_class_and_split_folder_links_are_refused(folder, tmp_path):
    real = tmp_path / "real_fish"
    (folder / "val" / "eel").rename(real)
    (folder / "val" / "eel").symlink_to(real, target_is_directory=True)
    with pytest.raises(DatasetError) as err:
        build_imagefolder("pets", {"source": "imagefolder", "root": folder / "val", "allow_outside_root": True},
                          tmp_path / "out")
    assert_folder_link_refused(err, folder / "val" / "eel")
    (folder / "val" / "eel").unlink()
    real.rename(folder / "val" / "eel")
    (folder / "test").symlink_to(folder / "val", target_is_directory=True)  # a split folder that is a link
    with pytest.raises(DatasetError) as err:
        build_imagefolder("pets", {"source": "imagefolder", "root": folder, "splits": {"test": "test"}},
                          tmp_path / "out")
    assert_folder_link_refused(err, folder / "test")


def test_imagefolder_root_that_is_a_link_and_file_links_are_followed(folder, tmp_path):
    """DVC follows a linked `input` folder and hashes a linked file's content: both stay visible to `dvc status`."""
    (folder / "val" / "eel" / "same.png").symlink_to(folder / "val" / "cat" / "img0.png")
    (tmp_path / "linked").symlink_to(folder / "val", target_is_directory=True)
    meta = build_imagefolder("pets", {"source": "imagefolder", "root": tmp_path / "linked"}, tmp_path / "out")
    rows = {r["sample_id"]: r for r in read_split(tmp_path / "out", "test")}
    assert meta.splits == {"test": 8} and rows["eel/same.png"]["image"] == (folder / "val/cat/img0.png").read_bytes()


def test_imagefolder_file_links_leaving_root_are_refused_unless_allowed(folder, tmp_path):
    outside = tmp_path / "elsewhere"
    make_image(outside / "y.png", 79)
    link = folder / "val" / "cat" / "y.png"
    link.symlink_to(outside / "y.png")
    spec = {"source": "imagefolder", "root": folder / "val"}
    with pytest.raises(DatasetError) as err:
        build_imagefolder("pets", spec, tmp_path / "out")
    msg = str(err.value)
    assert "dataset 'pets' split 'test'" in msg and str(link) in msg and str(outside / "y.png") in msg
    assert "outside the root" in msg and "allow_outside_root: true" in msg
    meta = build_imagefolder("pets", {**spec, "allow_outside_root": True}, tmp_path / "out")
    assert meta.splits["test"] == 8 and meta.provenance["allow_outside_root"] is True


def test_imagefolder_split_folder_leaving_root_is_refused(folder, tmp_path):
    spec = {"source": "imagefolder", "root": folder / "val", "splits": {"test": "../train"}}
    with pytest.raises(DatasetError, match=r"split 'test': folder '.*train' is outside the root"):
        build_imagefolder("pets", spec, tmp_path / "out")
    assert build_imagefolder("pets", {**spec, "allow_outside_root": True}, tmp_path / "out").splits == {"test": 7}


def test_every_corrupt_image_of_a_split_is_reported_in_one_error(folder, tmp_path):
    bad = [truncated_jpeg(folder / "val" / "cat" / f"broken{i}.jpg") for i in range(3)]
    (folder / "val" / "eel" / "garbage.png").write_bytes(b"not a png at all")
    bad.append(folder / "val" / "eel" / "garbage.png")
    spec = {"source": "imagefolder", "root": folder, "splits": {"train": "train", "test": "val"}}
    with pytest.raises(DatasetError, match=r"split 'test': 4 corrupt or truncated image\(s\)") as err:
        build_imagefolder("pets", spec, tmp_path / "out")
    assert all(str(p) in str(err.value) for p in bad) and len(str(err.value).splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_a_long_list_of_corrupt_images_is_cut_and_counted(folder, tmp_path):
    for i in range(25):
        (folder / "val" / "cat" / f"bad{i:02d}.png").write_bytes(b"x")
    spec = {"source": "imagefolder", "root": folder, "splits": {"train": "train", "test": "val"}}
    with pytest.raises(DatasetError, match=r"25 corrupt .*; and 5 more; fix or remove them"):
        build_imagefolder("pets", spec, tmp_path / "out")
