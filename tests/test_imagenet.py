"""ImageNet-1k validation (`source: imagenet`) on a miniature devkit (data/meta.mat with the struct fields
torchvision reads, the validation ground truth) and a val tar of tiny JPEGs, placed in a local mirror folder
as a user would: standard class order, CLIP names, labels, streaming, corrupt images, the manual-download message."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from vlbench.datasets import imagenet
from vlbench.datasets.canonical import DatasetError
from vlbench.datasets.download import ManualDownloadError
from vlbench.datasets.registry import describe, prepare_dataset

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "breeds" / "modified" / "dataset_class_info.json"
SYNSET_FIELDS = ("ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children", "wordnet_height",
                 "num_train_images")


def fake_wnids(n: int = 1000, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"n{x:08d}" for x in sorted(rng.choice(10**8, n, replace=False))]


def jpeg(seed: int, size: int = 16) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(buffer, format="JPEG")
    return buffer.getvalue()


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def meta_mat(wnids: list[str], lemmas: dict[str, str], ilsvrc_ids: dict[str, int]) -> bytes:
    """data/meta.mat as the devkit has it: a struct array `synsets` (1000 leaves, then inner synsets)."""
    import scipy.io

    synsets = np.zeros((len(wnids) + 2, 1), dtype=[(f, object) for f in SYNSET_FIELDS])
    for wnid in wnids:
        k = ilsvrc_ids[wnid]
        synsets[k - 1, 0] = (k, wnid, lemmas[wnid], f"gloss of {wnid}", 0, np.zeros((1, 0)), 0, 1300)
    n = len(wnids)
    synsets[n, 0] = (n + 1, "n00001740", "entity", "the root", 2, np.array([[n + 2, 1]]), 19, 0)
    synsets[n + 1, 0] = (n + 2, "n00021939", "artifact, artefact", "made", n - 1, np.arange(2, n + 1)[None], 18, 0)
    buffer = io.BytesIO()
    scipy.io.savemat(buffer, {"synsets": synsets})
    return buffer.getvalue()


def make_imagenet(folder: Path, images: list[int], wnids: list[str] | None = None, lemmas: dict | None = None,
                  corrupt: set[int] = frozenset(), leave_out: set[int] = frozenset(), seed: int = 0) -> dict:
    """ILSVRC2012_devkit_t12.tar.gz and ILSVRC2012_img_val.tar in `folder`. `images[k]` is the standard class
    index of ILSVRC2012_val_<k+1>.JPEG. ILSVRC2012_IDs are a shuffle of the standard order (as upstream, where
    ID 1 is n02119789, not the first wnid), so labels are right only if they go through the wnids."""
    folder.mkdir(parents=True, exist_ok=True)
    wnids = wnids or fake_wnids()
    lemmas = lemmas or {w: f"thing {i}, alias {i}" for i, w in enumerate(wnids)}
    order = np.random.default_rng(seed).permutation(len(wnids))
    ilsvrc_ids = {wnids[j]: k + 1 for k, j in enumerate(order)}
    truth = "".join(f"{ilsvrc_ids[wnids[c]]}\n" for c in images)
    devkit = folder / "ILSVRC2012_devkit_t12.tar.gz"
    with tarfile.open(devkit, "w:gz") as tar:
        add_member(tar, "ILSVRC2012_devkit_t12/data/meta.mat", meta_mat(wnids, lemmas, ilsvrc_ids))
        add_member(tar, "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt", truth.encode())
        add_member(tar, "ILSVRC2012_devkit_t12/readme.txt", b"devkit readme\n")
    val = folder / "ILSVRC2012_img_val.tar"
    stored = {}
    with tarfile.open(val, "w") as tar:
        for k in reversed(range(len(images))):  # not in name order: labels must come from the number
            if k in leave_out:
                continue
            data = jpeg(k)
            stored[f"ILSVRC2012_val_{k + 1:08d}.JPEG"] = data = data[: len(data) // 2] if k in corrupt else data
            add_member(tar, f"ILSVRC2012_val_{k + 1:08d}.JPEG", data)
    return {"devkit": devkit, "val": val, "wnids": wnids, "images": stored}


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def trust_devkit(monkeypatch, devkit: Path) -> None:
    """torchvision's devkit parser checks the official md5; point it at the miniature's."""
    import torchvision.datasets.imagenet as tv_imagenet

    monkeypatch.setitem(tv_imagenet.ARCHIVE_META, "devkit", (devkit.name, md5(devkit)))


def files_spec(mini: dict) -> dict:
    """The miniature files' checksums in place of the official ones (same names and instructions)."""
    return {role: {**imagenet.FILES[role], "md5": md5(mini[key])}
            for role, key in (("devkit", "devkit"), ("val_images", "val"))}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "downloads"))
    monkeypatch.setenv("VLBENCH_MIRROR", str(tmp_path / "mirror"))
    (tmp_path / "mirror").mkdir()
    return tmp_path / "downloads"


def read(out: Path, split: str = "test") -> list[dict]:
    return pq.read_table(out / "splits" / f"{split}.parquet").to_pylist()


IMAGES = [0, 999, 5, 5, 657, 744, 0, 300, 999, 12, 1, 2]  # standard class index of val images 1..12


def test_catalogue_row_needs_no_download():
    row = describe("imagenet-1k", {"prepare": {"source": "imagenet"}})
    assert (row["classes"], row["splits"], row["metric"], row["manual_download"]) == (1000, {"test": 50_000}, "accuracy", True)


def test_official_md5s_are_torchvisions():
    from torchvision.datasets.imagenet import ARCHIVE_META

    assert ARCHIVE_META["val"] == (imagenet.FILES["val_images"]["file"], imagenet.FILES["val_images"]["md5"])
    assert ARCHIVE_META["devkit"] == (imagenet.FILES["devkit"]["file"], imagenet.FILES["devkit"]["md5"])
    assert imagenet.FILES["val_images"]["md5"] == "29b22e2961454d5413ddabcf34fc5622"
    assert imagenet.FILES["devkit"]["md5"] == "fa75699e90414af021442c21a62c3abf"


def test_prepare_from_the_mirror_folder(tmp_path, cache, monkeypatch):
    mini = make_imagenet(tmp_path / "mirror", IMAGES)
    trust_devkit(monkeypatch, mini["devkit"])
    out = tmp_path / "prepared" / "imagenet-1k"
    meta = prepare_dataset("imagenet-1k", {"source": "imagenet", "files": files_spec(mini)}, out)

    assert meta.splits == {"test": 12}
    saved = json.loads((out / "classes.json").read_text())
    classes = saved["classes"]
    assert len(classes) == 1000 and saved["metric"] == "accuracy"
    assert [c["wnid"] for c in classes] == sorted(mini["wnids"])  # standard order: sorted wnids
    names = imagenet.clip_classnames()
    assert [c["name"] for c in classes] == list(names)
    assert classes[0]["name"] == "tench" and classes[657]["name"] == classes[744]["name"] == "missile"
    assert classes[3]["aliases"] == ["thing 3", "alias 3"]

    rows = read(out)
    by_id = {r["sample_id"]: r for r in rows}
    assert sorted(by_id) == [f"ILSVRC2012_val_{k:08d}.JPEG" for k in range(1, 13)]
    for k, cls in enumerate(IMAGES, 1):
        row = by_id[f"ILSVRC2012_val_{k:08d}.JPEG"]
        assert row["label"] == cls
        assert row["image"] == mini["images"][row["sample_id"]]  # the JPEG bytes as distributed
    assert [r["sample_id"] for r in rows][:2] == ["ILSVRC2012_val_00000012.JPEG", "ILSVRC2012_val_00000011.JPEG"]

    prov = saved["provenance"]
    assert prov["files"]["devkit"]["md5"] == md5(mini["devkit"]) and prov["files"]["devkit"]["verified"]
    assert prov["files"]["val_images"]["file"] == "ILSVRC2012_img_val.tar"
    assert prov["files"]["val_images"]["sha256"] == hashlib.sha256(mini["val"].read_bytes()).hexdigest()
    assert "ILSVRC2012" in prov["upstream"] and prov["skipped_corrupt"] == []


def test_missing_manual_files_say_where_to_get_them_and_where_to_put_them(tmp_path, cache):
    with pytest.raises(ManualDownloadError) as err:
        prepare_dataset("imagenet-1k", {"source": "imagenet"}, tmp_path / "out")
    message = str(err.value)
    assert message.startswith("2 files must be downloaded by hand")
    for filename, checksum in (("ILSVRC2012_devkit_t12.tar.gz", "fa75699e90414af021442c21a62c3abf"),
                               ("ILSVRC2012_img_val.tar", "29b22e2961454d5413ddabcf34fc5622")):
        assert filename in message and checksum in message
    assert "https://image-net.org/challenges/LSVRC/2012/2012-downloads.php" in message
    assert "'Validation images (all tasks)'" in message and "'Development kit (Task 1 & 2)'" in message
    assert str(cache.resolve() / "ILSVRC2012_img_val.tar") in message
    assert str((tmp_path / "mirror").resolve()) in message
    assert not (tmp_path / "out").exists()


def test_one_missing_file_is_named_alone(tmp_path, cache, monkeypatch):
    mini = make_imagenet(tmp_path / "elsewhere", IMAGES)
    (tmp_path / "mirror" / mini["devkit"].name).write_bytes(mini["devkit"].read_bytes())
    with pytest.raises(ManualDownloadError, match=r"needs the file 'ILSVRC2012_img_val.tar'") as err:
        prepare_dataset("imagenet-1k", {"source": "imagenet", "files": files_spec(mini)}, tmp_path / "out")
    assert "ILSVRC2012_devkit_t12" not in str(err.value)


def test_corrupt_images_are_named_or_skipped(tmp_path, cache, monkeypatch):
    mini = make_imagenet(tmp_path / "mirror", IMAGES, corrupt={2})
    trust_devkit(monkeypatch, mini["devkit"])
    spec = {"source": "imagenet", "files": files_spec(mini)}
    out = tmp_path / "prepared" / "imagenet-1k"
    with pytest.raises(DatasetError, match=r"split 'test': 1 corrupt or truncated image\(s\): 'ILSVRC2012_val_00000003.JPEG'"):
        prepare_dataset("imagenet-1k", spec, out)
    assert not out.exists()
    meta = prepare_dataset("imagenet-1k", {**spec, "skip_corrupt": True}, out)
    assert meta.splits == {"test": 11}
    assert meta.provenance["skipped_corrupt"] == ["ILSVRC2012_val_00000003.JPEG"]


def test_an_incomplete_val_tar_is_refused(tmp_path, cache, monkeypatch):
    mini = make_imagenet(tmp_path / "mirror", IMAGES, leave_out={4})
    trust_devkit(monkeypatch, mini["devkit"])
    with pytest.raises(DatasetError, match=r"lacks 1 of the 12 validation images .*ILSVRC2012_val_00000005.JPEG"):
        prepare_dataset("imagenet-1k", {"source": "imagenet", "files": files_spec(mini)}, tmp_path / "out")


def test_torchvision_still_checks_the_official_devkit_md5(tmp_path, cache):
    """Without the test's patch, torchvision's parser refuses a devkit that is not the official file."""
    mini = make_imagenet(tmp_path / "mirror", IMAGES)
    with pytest.raises(DatasetError, match=r"torchvision cannot parse the ImageNet devkit .*fa75699e90414af021442c21a62c3abf"):
        prepare_dataset("imagenet-1k", {"source": "imagenet", "files": files_spec(mini)}, tmp_path / "out")


@pytest.mark.skipif(not REFERENCE.is_file(), reason="shared reference copy of the ImageNet class list absent")
def test_real_wnids_get_their_clip_names(tmp_path, cache, monkeypatch):
    info = json.loads(REFERENCE.read_text())
    wnids = [w for _, w, _ in info]
    mini = make_imagenet(tmp_path / "mirror", [0, 207, 281, 948], wnids=wnids, lemmas={w: n for _, w, n in info})
    trust_devkit(monkeypatch, mini["devkit"])
    out = tmp_path / "prepared" / "imagenet-1k"
    prepare_dataset("imagenet-1k", {"source": "imagenet", "files": files_spec(mini)}, out)
    classes = json.loads((out / "classes.json").read_text())["classes"]
    assert (classes[0]["wnid"], classes[0]["name"], classes[0]["aliases"]) == ("n01440764", "tench", ["Tinca tinca"])
    assert (classes[207]["wnid"], classes[207]["name"]) == ("n02099601", "Golden Retriever")
    assert (classes[948]["wnid"], classes[948]["name"]) == ("n07742313", "Granny Smith apple")
    assert [r["label"] for r in sorted(read(out), key=lambda r: r["sample_id"])] == [0, 207, 281, 948]


CLIP_BENCHMARK = REFERENCE.parents[2] / "clip_benchmark" / "en_classnames.json"


@pytest.mark.skipif(not CLIP_BENCHMARK.is_file(), reason="shared reference copy of clip_benchmark's class names absent")
def test_open_clip_names_are_clip_benchmarks():
    assert list(imagenet.clip_classnames()) == json.loads(CLIP_BENCHMARK.read_text())["imagenet1k"]
