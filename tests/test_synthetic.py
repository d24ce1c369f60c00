import io
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from vlbench.datasets import synthetic as S
from vlbench.datasets.canonical import DatasetError, load_meta
from vlbench.datasets.registry import prepare_dataset

SPLITS = {"train": 40, "test": 30}


def spec(task, **kw):
    return {"source": "synthetic", "task": task, "seed": 0, "image_size": 32, "splits": dict(SPLITS), **kw}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every task built once, small."""
    root = tmp_path_factory.mktemp("synthetic")
    out = {}
    for task in S.TASKS:
        meta = S.build(f"demo-{task}", spec(task), root / task)
        tables = {split: pq.read_table(root / task / "splits" / f"{split}.parquet") for split in SPLITS}
        out[task] = (meta, tables, root / task)
    return out


@pytest.fixture(scope="module")
def wn(tmp_path_factory):
    from vlbench.wordnet import WordNetMissing, load_wordnet
    try:
        return load_wordnet(download=False, cache_dir=tmp_path_factory.mktemp("wncache"))
    except WordNetMissing as err:
        pytest.skip(f"no WordNet on this machine: {err}")


def rows(built, task, split="train"):
    return built[task][1][split].to_pylist()


def test_determinism(tmp_path, built):
    S.build("demo-shapes", spec("shapes"), tmp_path / "again")
    first = built["shapes"][2]
    for name in ["classes.json", "splits/train.parquet", "splits/test.parquet"]:
        assert (tmp_path / "again" / name).read_bytes() == (first / name).read_bytes(), name


def test_seed_changes_data(tmp_path, built):
    S.build("demo-shapes", spec("shapes", seed=1), tmp_path / "other")
    assert (tmp_path / "other" / "splits" / "train.parquet").read_bytes() != (built["shapes"][2] / "splits" / "train.parquet").read_bytes()


def test_splits_and_tasks_disjoint(built):
    seen = {}
    for task in S.TASKS:
        for split in SPLITS:
            for image in built[task][1][split].column("image").to_pylist():
                assert image not in seen, f"{task}/{split} repeats an image of {seen.get(image)}"
                seen[image] = (task, split)


def test_meta_and_provenance(built):
    meta = load_meta(built["shapes"][2])
    assert meta.splits == SPLITS and meta.metric == "accuracy" and meta.task == "single-label"
    assert meta.class_names == S.shape_names() and all(c.wnid for c in meta.classes)
    prov = json.loads((built["shapes"][2] / "classes.json").read_text())["provenance"]
    assert prov["generator"] == S.GENERATOR and prov["seed"] == 0 and prov["spec"]["task"] == "shapes"
    assert "vlbench_version" in prov
    assert len(S.SHAPES) >= 10 and len(S.COLORS) >= 8


def test_images_are_png_of_requested_size(tmp_path, built):
    image = Image.open(io.BytesIO(rows(built, "shapes")[0]["image"]))
    assert image.format == "PNG" and image.size == (32, 32) and image.mode == "RGB"
    S.build("big", spec("shapes", image_size=48, splits={"test": 2}), tmp_path / "big")
    image = Image.open(io.BytesIO(pq.read_table(tmp_path / "big" / "splits" / "test.parquet")["image"][0].as_py()))
    assert image.size == (48, 48)


def _dominant_color(png: bytes) -> str:
    """The palette colour nearest to the pixels furthest from the background."""
    a = np.asarray(Image.open(io.BytesIO(png)), dtype=float)
    border = np.concatenate([a[0], a[-1], a[:, 0], a[:, -1]])
    pixels = a.reshape(-1, 3)
    far = pixels[np.argsort(np.linalg.norm(pixels - np.median(border, 0), axis=1))[-12:]]
    palette = np.array(list(S.COLORS.values()), dtype=float)
    return list(S.COLORS)[int(np.argmin(np.linalg.norm(palette - np.median(far, 0), axis=1)))]


def test_colors_match_pixels(built):
    names = built["colors"][0].class_names
    for row in rows(built, "colors") + rows(built, "colors", "test"):
        assert names[row["label"]] == row["color"]
        assert _dominant_color(row["image"]) == row["color"], row["sample_id"]


def test_single_object_labels(built):
    for task, key in [("shapes", "shape"), ("position", "position")]:
        names = built[task][0].class_names
        for row in rows(built, task):
            assert names[row["label"]] == row[key] and row["count"] == 1 and len(row["objects"]) == 1
            assert row["caption"].endswith(S.POSITIONS[row["position"]])
    meta = built["shape_color"][0]
    assert len(meta.classes) == len(S.SHAPES) * len(S.COLORS)
    for row in rows(built, "shape_color"):
        cls = meta.classes[row["label"]]
        assert cls.name == f"{row['color']} {row['shape']}" and cls.group == row["shape"]


def test_count(built):
    meta = built["count"][0]
    assert meta.class_names == ["one", "two", "three", "four"]
    counts = set()
    for row in rows(built, "count"):
        assert row["label"] == row["count"] - 1 == len(row["objects"]) - 1
        assert len({(o["shape"], o["color"]) for o in row["objects"]}) == 1
        assert len({o["position"] for o in row["objects"]}) == row["count"]
        counts.add(row["count"])
    assert counts == {1, 2, 3, 4}


def test_hierarchy_labels_include_ancestors(built):
    meta = built["hierarchy"][0]
    assert meta.multi_label and meta.metric == "map_11point"
    names = meta.class_names
    assert names[: len(S.SHAPES)] == S.shape_names()
    assert {"polygon", "plane figure", "quadrilateral", "figure"} <= set(names)
    assert all(c.wnid for c in meta.classes)
    for row in rows(built, "hierarchy"):
        labels = {names[i] for i in row["labels"]}
        shapes = {o["shape"] for o in row["objects"]}
        assert shapes <= labels and labels - shapes
        if "square" in shapes:
            assert {"rectangle", "parallelogram", "quadrilateral", "polygon", "plane figure"} <= labels
        if shapes == {"crescent"}:
            assert labels == {"crescent", "curve", "line"}


def test_caption_tasks(built):
    meta, tables, _ = built["captions"]
    assert meta.task == "captions"
    for row in tables["train"].to_pylist():
        assert len(row["captions"]) >= 3 and S.shape_names()[row["label"]] == row["shape"]
        assert row["captions"][0].split()[-1].rstrip("s") in {o["shape"] for o in row["objects"]}
    corpus = rows(built, "corpus") + rows(built, "corpus", "test")
    assert all(len(r["captions"]) == 1 for r in corpus)
    named = sum(r["color"] in r["captions"][0] and r["shape"] in r["captions"][0] for r in corpus)
    assert named >= 0.6 * len(corpus)


def test_caption_grammar():
    red_circle_left = S.Obj("circle", "red", "small", "left")
    assert [S.caption([red_circle_left], level) for level in range(4)] == [
        "a circle", "a red circle", "a small red circle", "a small red circle on the left"]
    stars = [S.Obj("star", "blue", "small", p) for p in ("left", "right")]
    assert S.caption(stars, 1) == "two blue stars"
    assert S.caption(stars + [S.Obj("square", "green", "small", "top")], 1) == "two blue stars and a green square"
    assert S.caption([S.Obj("ellipse", "orange", "large", "center")], 1) == "an orange ellipse"
    assert S.caption([red_circle_left], 1, nouns={"circle": "plane figure"}) == "a red plane figure"


def test_registry_builds_synthetic(tmp_path):
    meta = prepare_dataset("via-registry", spec("colors", splits={"val": 3}), tmp_path / "d")
    assert meta.splits == {"val": 3} and len(meta.classes) == len(S.COLORS)


@pytest.mark.parametrize("bad, key", [
    ({"task": "nope"}, "task"),
    ({"task": None}, "task"),
    ({"splits": None}, "splits"),
    ({"splits": {"train": -1}}, "splits"),
    ({"splits": {"train": 0}}, "splits"),
    ({"splits": {"train": "ten"}}, "splits"),
    ({"image_size": 4}, "image_size"),
    ({"seed": "x"}, "seed"),
    ({"templates": ["a {c}."]}, "templates"),  # prompts are text sets (texts@), not data
    ({"image_sise": 64}, "image_sise"),
    ({"preprocess": "crop"}, "preprocess"),
])
def test_bad_spec(tmp_path, bad, key):
    s = {**spec("shapes"), **bad}
    s = {k: v for k, v in s.items() if not (k in ("task", "splits") and v is None)}
    with pytest.raises(DatasetError, match=rf"'my-data'.*'{key}'"):
        S.build("my-data", s, tmp_path / "x")
    assert not (tmp_path / "x").exists()


def test_preprocess_goes_into_classes_json_and_the_version(tmp_path):
    """VTAB-grouped demo entries set `preprocess: squash` (docs/protocols.md "Adapt: VTAB-1k"): the same images, another
    version; the default leaves the spec and classes.json as they were."""
    plain = S.build("d", spec("count", splits={"test": 4}), tmp_path / "plain")
    squash = S.build("d", spec("count", splits={"test": 4}, preprocess="squash"), tmp_path / "squash")
    assert plain.preprocess == "default" and squash.preprocess == "squash" and plain.version != squash.version
    assert "preprocess" not in (tmp_path / "plain" / "classes.json").read_text()
    assert json.loads((tmp_path / "squash" / "classes.json").read_text())["preprocess"] == "squash"
    assert "preprocess" not in S.parse_spec("d", spec("count"))


def test_empty_split_is_refused_at_parse_naming_dataset_and_split(tmp_path):
    with pytest.raises(DatasetError, match=r"dataset 'my-data': spec key 'splits' has 'test': 0; .*positive"):
        S.parse_spec("my-data", spec("shapes", splits={"train": 3, "test": 0}))


def test_unknown_key_uses_the_shared_spec_check():
    with pytest.raises(DatasetError, match=r"unknown spec key\(s\) \['image_sise'\] for source 'synthetic'.*did you mean 'image_size'"):
        S.parse_spec("my-data", spec("shapes", image_sise=64))


def test_shapes_are_wordnet_shapes(wn):
    from vlbench.wordnet import synset_from_wnid
    for shape in S.SHAPES:
        synset = synset_from_wnid(wn, shape.wnid)
        assert synset.name() == shape.synset and synset.lexname() == "noun.shape"
        assert shape.name in synset.lemma_names()


def test_hierarchy_table_matches_wordnet(wn):
    from vlbench.wordnet import wnid_of
    for name, (word, wnid, parents) in S.CONCEPTS.items():
        synset = wn.synset(name)
        assert wnid_of(synset) == wnid and word.replace(" ", "_") in synset.lemma_names()
        assert set(parents) == {p.name() for p in synset.hypernyms()} - {S.HIERARCHY_ROOT}
    for shape in S.SHAPES:
        closure = set()
        frontier = [wn.synset(shape.synset)]
        while frontier:
            s = frontier.pop()
            for p in s.hypernyms():
                if p.name() != S.HIERARCHY_ROOT and p.name() not in closure:
                    closure.add(p.name())
                    frontier.append(p)
        assert set(S.ancestors(shape.synset)) == closure
