"""COCO 2017 val (`source: coco`): a miniature val2017.zip, annotations_trainval2017.zip (instances and captions
in COCO's JSON structure) and a Localized Narratives jsonl, served from 127.0.0.1, prepared and checked."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from omegaconf import OmegaConf
from PIL import Image

from tests.archives import sha256, write_zip
from tests.http_server import serve
from vlbench.datasets import coco
from vlbench.datasets.canonical import DatasetError, load_meta
from vlbench.datasets.registry import catalogue, describe, prepare_dataset
from vlbench.texts import build_text_sets

CONF = Path(__file__).resolve().parents[1] / "conf" / "dataset"
REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "coco"
# A few real categories, deliberately not in id order (the prepared order is by id, with COCO's gaps).
CATEGORIES = [
    {"supercategory": "animal", "id": 18, "name": "dog"},
    {"supercategory": "person", "id": 1, "name": "person"},
    {"supercategory": "kitchen", "id": 44, "name": "bottle"},
    {"supercategory": "vehicle", "id": 2, "name": "bicycle"},
]
# image id -> category ids of its instances (785 has none)
INSTANCES = {139: [1, 44, 1, 1], 632: [18], 724: [2, 1], 785: [], 802: [44, 18]}
NARRATIVES = {139: ["In this image we can see people.", "  A living room with a television.  "],
              632: ["In this picture there is a dog."]}


def jpeg(seed: int, size: int = 10) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(buf, format="JPEG")
    return buf.getvalue()


def file_name(image_id: int) -> str:
    return f"{image_id:012d}.jpg"


def image_record(image_id: int) -> dict:
    return {"license": 4, "file_name": file_name(image_id), "coco_url": f"http://images.cocodataset.org/val2017/"
            f"{file_name(image_id)}", "height": 10, "width": 10, "date_captured": "2013-11-14 17:02:52",
            "flickr_url": "http://farm7.staticflickr.com/x.jpg", "id": image_id}


def instances_json(instances: dict[int, list[int]], categories: list[dict]) -> dict:
    anns, next_id = [], 1000
    for image_id, cats in instances.items():
        for cat in cats:
            next_id += 7
            anns.append({"segmentation": [[1.0, 1.0, 5.0, 1.0, 5.0, 5.0]], "area": 8.0, "iscrowd": 0,
                         "image_id": image_id, "bbox": [1.0, 1.0, 4.0, 4.0], "category_id": cat, "id": next_id})
    order = sorted(instances, key=lambda i: -i)  # the real file does not list images in id order
    return {"info": {"description": "COCO 2017 Dataset", "version": "1.0", "year": 2017},
            "licenses": [{"url": "http://creativecommons.org/licenses/by-nc-sa/2.0/", "id": 1, "name": "x"}],
            "images": [image_record(i) for i in order], "annotations": anns, "categories": categories}


def captions_json(image_ids, per_image: int = 5) -> dict:
    anns = [{"image_id": i, "id": 10 * i + k, "caption": f"Caption {k} of image {i}. "}
            for k in range(per_image) for i in image_ids]
    return {"info": {"description": "COCO 2017 Dataset"}, "licenses": [],
            "images": [image_record(i) for i in image_ids], "annotations": anns[::-1]}  # ids out of order


def narrative_line(image_id: int, annotator: int, text: str, dataset_id: str = "mscoco_val2017") -> str:
    return json.dumps({"dataset_id": dataset_id, "image_id": str(image_id), "annotator_id": annotator,
                       "caption": text, "timed_caption": [{"utterance": text.split()[0], "start_time": 0.0,
                                                           "end_time": 0.4}],
                       "traces": [[{"x": 0.1, "y": 0.2, "t": 0.0}]],
                       "voice_recording": f"coco_val/coco_val_{image_id}_{annotator}.ogg"})


def real_spec() -> dict:
    return OmegaConf.to_container(OmegaConf.load(CONF / "coco-2017-val.yaml"), resolve=True)["prepare"]


def make_coco(www: Path, instances: dict | None = None, captions: dict | None = None, narratives: list[str] | None = None,
              images: dict[int, bytes] | None = None, categories: list[dict] = CATEGORIES) -> dict:
    """The three upstream files in www/; returns the spec of our entry pointed at them (sha256 of the miniature)."""
    instances = instances if instances is not None else instances_json(INSTANCES, categories)
    ids = [im["id"] for im in instances["images"]]
    captions = captions if captions is not None else captions_json(ids)
    if narratives is None:
        narratives = [narrative_line(i, 90 + k, text) for i, texts in NARRATIVES.items() for k, text in enumerate(texts)]
    images = images if images is not None else {i: jpeg(i) for i in ids}
    write_zip(www / "val2017.zip", {f"val2017/{file_name(i)}": data for i, data in images.items()})
    write_zip(www / "annotations_trainval2017.zip", {
        "annotations/instances_val2017.json": json.dumps(instances).encode(),
        "annotations/captions_val2017.json": json.dumps(captions).encode(),
        "annotations/person_keypoints_val2017.json": b"{}",
    })
    (www / "coco_val_localized_narratives.jsonl").write_text("\n".join(narratives) + "\n\n")
    spec = real_spec()
    for key in ("images", "annotations", "narratives"):
        spec[key]["url"] = spec[key]["url"].rsplit("/", 1)[-1]  # made absolute by `served`
        if key != "narratives":
            spec[key]["sha256"] = sha256(www / spec[key]["file"])
    spec.update(splits={"val": len(ids)}, classes=len(instances["categories"]))
    return {"spec": spec, "images": images}


def served(spec: dict, base_url: str) -> dict:
    spec = copy.deepcopy(spec)
    for key in ("images", "annotations", "narratives"):
        spec[key]["url"] = f"{base_url}/{spec[key]['url']}"
    return spec


def rows(out: Path) -> list[dict]:
    return pq.read_table(out / "splits" / "val.parquet").to_pylist()


@pytest.fixture
def www(tmp_path, monkeypatch):
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "cache"))
    monkeypatch.delenv("VLBENCH_MIRROR", raising=False)
    (tmp_path / "www").mkdir()
    return tmp_path / "www"


def test_coco_val_prepared_with_labels_captions_and_narratives(www, tmp_path):
    mini = make_coco(www)
    out = tmp_path / "out"
    with serve(www) as base_url:
        meta = prepare_dataset("coco-2017-val", served(mini["spec"], base_url), out)
        assert base_url.requests["/val2017.zip"] == 1

    assert (meta.task, meta.metric, meta.splits) == ("multi-label", "map_11point", {"val": 5})
    assert [(c.index, c.name, c.key, c.group) for c in meta.classes] == [
        (0, "person", "1", "person"), (1, "bicycle", "2", "vehicle"), (2, "dog", "18", "animal"),
        (3, "bottle", "44", "kitchen")]
    table = rows(out)
    assert [r["sample_id"] for r in table] == ["000000000139", "000000000632", "000000000724", "000000000785",
                                               "000000000802"]  # image-id order
    assert [r["labels"] for r in table] == [[0, 3], [2], [0, 1], [], [2, 3]]  # sorted unique; none -> []
    assert [r["coco_id"] for r in table] == [139, 632, 724, 785, 802]
    assert table[0]["image"] == mini["images"][139]
    assert table[0]["captions"] == [f"Caption {k} of image 139." for k in range(5)]  # annotation-id order, stripped
    assert table[0]["narratives"] == ["In this image we can see people.", "A living room with a television."]
    assert table[1]["narratives"] == ["In this picture there is a dog."]
    assert table[3]["narratives"] == []

    saved = load_meta(out)
    assert saved.version == meta.version and saved.splits == {"val": 5}
    prov = saved.provenance
    files = {f["file"]: f for f in prov["files"]}
    assert files["val2017.zip"]["verified"] is True and files["annotations_trainval2017.zip"]["verified"] is True
    assert files["coco_val_localized_narratives.jsonl"]["verified"] is False  # nothing published to check it by
    assert files["val2017.zip"]["urls"] == [f"{base_url}/val2017.zip"]
    assert (prov["captions"], prov["narratives"]) == (25, 3)
    assert (prov["images_without_instances"], prov["images_without_narratives"]) == (1, 3)
    assert prov["counts"] == {"val": 5}


def test_captions_and_narratives_columns_feed_their_text_sets(www, tmp_path):
    """The texts stage makes `captions` and `narratives` sets from those columns: one row per text, owned by
    sample_id, next to the class prompts."""
    mini = make_coco(www)
    with serve(www) as base_url:
        meta = coco.build("coco-2017-val", served(mini["spec"], base_url), tmp_path / "out")
    sets = build_text_sets(meta, tmp_path / "out", {"templates": ["a photo of a {c}."]})
    assert sorted(sets) == ["captions", "narratives", "prompts"]
    texts = sets["captions"].to_pylist()
    assert len(texts) == 25
    assert texts[0] == {"sample_id": "000000000139", "source": "caption", "text": "Caption 0 of image 139."}
    assert set(sets["narratives"].column("source").to_pylist()) == {"narrative"}
    assert sets["prompts"].num_rows == len(meta.classes)


@pytest.mark.skipif(not (REFERENCE / "coco_mini" / "instances_val2017.json").exists(), reason="no shared reference")
def test_real_instances_and_captions_files(www, tmp_path):
    """The real COCO-MINI instances file (79 val2017 images, the 80 categories) and the real captions of those
    images: all 80 classes in id order, and labels equal the category ids of every image's annotations."""
    instances = json.loads((REFERENCE / "coco_mini" / "instances_val2017.json").read_text())
    captions = json.loads((REFERENCE / "captions_val2017.json").read_text())
    ids = {im["id"] for im in instances["images"]}
    captions = {**captions, "images": [im for im in captions["images"] if im["id"] in ids],
                "annotations": [a for a in captions["annotations"] if a["image_id"] in ids]}
    mini = make_coco(www, instances=instances, captions=captions, narratives=[narrative_line(min(ids), 1, "A cat.")],
                     categories=instances["categories"])
    with serve(www) as base_url:
        meta = coco.build("coco-2017-val", served(mini["spec"], base_url), tmp_path / "out")

    assert len(meta.classes) == 80 and meta.splits == {"val": len(ids)} == {"val": 79}
    assert (meta.classes[0].name, meta.classes[0].key, meta.classes[0].group) == ("person", "1", "person")
    assert (meta.classes[79].name, meta.classes[79].key, meta.classes[79].group) == ("toothbrush", "90", "indoor")
    keys = [int(c.key) for c in meta.classes]
    assert keys == sorted(keys) and 12 not in keys and 83 not in keys
    expected = json.loads((REFERENCE / "coco_mini" / "val2017_image_category_ids.json").read_text())
    for row in rows(tmp_path / "out"):
        assert [keys[i] for i in row["labels"]] == expected[str(row["coco_id"])]
        assert len(row["captions"]) == sum(1 for a in captions["annotations"] if a["image_id"] == row["coco_id"]) >= 5


def test_caption_of_an_image_outside_the_instances_file_is_refused(www, tmp_path):
    caps = captions_json(list(INSTANCES) + [999999])
    mini = make_coco(www, captions=caps)
    with serve(www) as base_url, pytest.raises(DatasetError) as err:
        coco.build("coco-2017-val", served(mini["spec"], base_url), tmp_path / "out")
    assert "annotations_trainval2017.zip!annotations/captions_val2017.json: caption" in str(err.value)
    assert "names image 999999, which is not in the instances file" in str(err.value)
    assert not (tmp_path / "out").exists()


def test_narratives_of_another_image_set_are_refused(www, tmp_path):
    lines = [narrative_line(139, 1, "A room."), narrative_line(139, 2, "A train photo.", "mscoco_train2017")]
    mini = make_coco(www, narratives=lines)
    with serve(www) as base_url, pytest.raises(DatasetError,
                                               match=r"coco_val_localized_narratives.jsonl line 2: dataset_id "
                                                     r"'mscoco_train2017', expected 'mscoco_val2017'"):
        coco.build("coco-2017-val", served(mini["spec"], base_url), tmp_path / "out")
    assert not (tmp_path / "cache" / "coco_val_localized_narratives.jsonl").exists()  # unverified: downloaded again
    mini = make_coco(www, narratives=[narrative_line(4242, 1, "Elsewhere.")])
    with serve(www) as base_url:
        with pytest.raises(DatasetError, match=r"line 1: image_id '4242' is not an image .*deleted from the download"):
            coco.build("coco-2017-val", served(mini["spec"], base_url), tmp_path / "out")
        assert base_url.requests["/coco_val_localized_narratives.jsonl"] == 1


def test_images_missing_from_the_zip_are_reported_at_once(www, tmp_path):
    images = {i: jpeg(i) for i in INSTANCES if i not in (632, 802)}
    mini = make_coco(www, images=images)
    with serve(www) as base_url, pytest.raises(DatasetError) as err:
        coco.build("coco-2017-val", served(mini["spec"], base_url), tmp_path / "out")
    assert "2 image(s) of the annotations are not in val2017.zip (val2017/): 000000000632.jpg, 000000000802.jpg" \
        in str(err.value)


def test_malformed_instances_name_the_file_and_key(www, tmp_path):
    instances = instances_json(INSTANCES, CATEGORIES)
    instances["annotations"][2]["category_id"] = 12  # one of COCO's unused ids
    mini = make_coco(www, instances=instances)
    with serve(www) as base_url, pytest.raises(DatasetError, match=r"instances_val2017.json: annotation \d+ names "
                                                                   r"category 12, which is not in 'categories'"):
        coco.build("coco-2017-val", served(mini["spec"], base_url), tmp_path / "out")
    instances = instances_json(INSTANCES, CATEGORIES)
    del instances["images"][0]["file_name"]
    mini = make_coco(www, instances=instances)
    with serve(www) as base_url, pytest.raises(DatasetError, match=r"images\[0\] lacks \['file_name'\]"):
        coco.build("coco-2017-val", served(mini["spec"], base_url), tmp_path / "out")


def test_image_count_must_match_the_spec(www, tmp_path):
    mini = make_coco(www)
    spec = {**mini["spec"], "splits": {"val": 5000}}
    with serve(www) as base_url, pytest.raises(DatasetError, match=r"lists 5 images, expected 5000"):
        coco.build("coco-2017-val", served(spec, base_url), tmp_path / "out")


def test_corrupt_image_refused_unless_skipped(www, tmp_path):
    images = {i: jpeg(i, size=48) for i in INSTANCES}
    images[724] = images[724][:-60]
    mini = make_coco(www, images=images)
    with serve(www) as base_url:
        spec = served(mini["spec"], base_url)
        with pytest.raises(DatasetError, match=r"1 corrupt or truncated image\(s\): '000000000724.jpg'"):
            coco.build("coco-2017-val", spec, tmp_path / "out")
        meta = coco.build("coco-2017-val", {**spec, "skip_corrupt": True}, tmp_path / "out")
    assert meta.splits == {"val": 4} and meta.provenance["skipped_corrupt"] == ["000000000724"]


def test_registry_entry_and_suite_without_download(tmp_path, monkeypatch):
    spec = real_spec()
    assert coco.catalogue_row("coco-2017-val", spec) == {
        "classes": 80, "splits": {"val": 5000}, "metric": "map_11point", "manual_download": False}
    for key in ("images", "annotations"):
        assert len(spec[key]["sha256"]) == 64
    entry = OmegaConf.to_container(OmegaConf.load(CONF / "coco-2017-val.yaml"), resolve=True)
    row = describe("coco-2017-val", entry)
    assert (row["source"], row["classes"], row["splits"], row["metric"]) == ("coco", 80, {"val": 5000}, "map_11point")
    conf = CONF.parent
    monkeypatch.chdir(tmp_path)
    rows_ = catalogue("coco", config_dir=conf)
    assert [(r["name"], r["classes"], r["splits"]) for r in rows_] == [("coco-2017-val", 80, {"val": 5000})]
    suite = OmegaConf.load(conf / "suite" / "coco.yaml")
    assert suite.slug == "coco" and list(suite.embed) == ["coco-2017-val"]


def test_spec_errors_name_the_dataset_and_key():
    spec = real_spec()
    with pytest.raises(DatasetError, match=r"dataset 'c': unknown spec key\(s\) \['image'\] for source 'coco'"):
        coco.parse_spec("c", {**spec, "image": {}})
    with pytest.raises(DatasetError, match=r"dataset 'c': metric 'accuracy': COCO's labels are multi-label"):
        coco.parse_spec("c", {**spec, "metric": "accuracy"})
    with pytest.raises(DatasetError, match=r"dataset 'c': 'narratives' must be a resource mapping"):
        coco.parse_spec("c", {**spec, "narratives": None})
    with pytest.raises(DatasetError, match=r"dataset 'c': 'splits' must name the one split"):
        coco.parse_spec("c", {**spec, "splits": {"val": 5000, "test": 1}})
