"""Compositionality: SugarCrepe, Winoground and ARO miniatures in their upstream formats through prepare and the texts
stage, ARO's perturbations on fixed sentences, and each benchmark's metric recomputed here by plain loops."""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from tests.archives import write_zip
from vlbench.analyses import compositionality as comp
from vlbench.datasets import perturbations as pt
from vlbench.datasets.canonical import ClassInfo, DatasetError, DatasetMeta, load_meta, split_path
from vlbench.datasets.compositional import BENCHMARKS as READERS
from vlbench.datasets.compositional import SUGARCREPE
from vlbench.datasets.download import ChecksumError, ManualDownloadError
from vlbench.datasets.registry import catalogue, prepare_dataset
from vlbench.texts import build_text_sets

ROOT = Path(__file__).resolve().parents[1]


def png(seed: int, size=(12, 10)) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(out, format="PNG")
    return out.getvalue()


def rows(out: Path) -> list[dict]:
    meta = load_meta(out)
    return pq.read_table(split_path(out, next(iter(meta.splits)))).to_pylist()


def spec_of(name: str) -> dict:
    return yaml.safe_load((ROOT / "conf/dataset" / f"{name}.yaml").read_text())["prepare"]


# --------------------------------------------------------------------------------------------------------------
# ARO's perturbations on fixed sentences

TOKENS = ["a", "small", "brown", "dog", "chases", "the", "red", "ball", "on", "green", "grass"]
TAGS = ["DT", "JJ", "JJ", "NN", "VBZ", "DT", "JJ", "NN", "IN", "JJ", "NN"]


def test_pre_caption_is_blips_normalisation():
    assert pt.pre_caption("A Man (riding) a horse!!  On the beach.") == "a man riding a horse on the beach"
    assert pt.pre_caption("one two three four", max_words=2) == "one two"
    assert pt.pre_caption("  x;y:z~  ") == "x y z"


def test_trigrams_cut_consecutive_groups_of_three():
    assert pt.trigrams(list("abcdefg")) == [["a", "b", "c"], ["d", "e", "f"], ["g"]]
    assert pt.trigrams(list("abc")) == [["a", "b", "c"]] and pt.trigrams([]) == []


def test_shuffle_nouns_and_adj_moves_nouns_among_nouns_and_adjectives_among_adjectives():
    rng = np.random.default_rng(7)
    out = pt.shuffle_nouns_and_adj(TOKENS, TAGS, rng).split(" ")
    # a second way: draw the two permutations with the same generator and apply them by hand
    ref = np.random.default_rng(7)
    nouns, adjs = [3, 7, 10], [1, 2, 6, 9]
    expect = list(TOKENS)
    for pos in (nouns, adjs):
        perm = ref.permutation(len(pos))
        values = [TOKENS[i] for i in pos]
        for p, j in zip(pos, perm):
            expect[p] = values[j]
    assert out == expect
    for i, tag in enumerate(TAGS):
        if tag not in ("NN", "JJ"):
            assert out[i] == TOKENS[i]
    assert sorted(out[i] for i in nouns) == ["ball", "dog", "grass"]


def test_shuffle_allbut_nouns_and_adj_keeps_nouns_and_adjectives_in_place():
    out = pt.shuffle_allbut_nouns_and_adj(TOKENS, TAGS, np.random.default_rng(3)).split(" ")
    others = [i for i, t in enumerate(TAGS) if t not in ("NN", "JJ")]
    assert [out[i] for i in range(len(TOKENS)) if i not in others] == [TOKENS[i] for i in range(len(TOKENS))
                                                                        if i not in others]
    assert sorted(out[i] for i in others) == sorted(TOKENS[i] for i in others)


def test_trigram_shuffles_on_a_fixed_sentence():
    words = "a man rides a horse on the beach .".split()
    within = pt.shuffle_within_trigrams(words, np.random.default_rng(1)).split(" ")
    groups = [words[0:3], words[3:6], words[6:9]]
    assert [sorted(within[i:i + 3]) for i in (0, 3, 6)] == [sorted(g) for g in groups]
    across = pt.shuffle_trigrams(words, np.random.default_rng(1)).split(" ")
    ref = np.random.default_rng(1).permutation(3)
    assert across == [w for j in ref for w in groups[j]]


def test_a_caption_gets_the_same_options_every_time_and_others_for_another_key(monkeypatch):
    monkeypatch.setattr(pt, "load_tagger", lambda name: fixed_tagger)  # en_core_web_sm is not installable offline
    p = pt.Perturber("en_core_web_sm", seed=0)
    text = "A small brown dog chases the red ball on green grass."
    first, again = p.options(text, "k/0"), p.options(text, "k/0")
    assert first == again and len(first) == 5
    assert first[0] == "a small brown dog chases the red ball on green grass"
    assert all(sorted(o.split()) == sorted(first[0].split()) for o in first[1:3])
    assert any(p.options(text, f"k/{i}") != first for i in range(1, 6))


def fixed_tagger(text: str):
    """Penn tags for the fixed sentences of these tests (what en_core_web_sm gives them), spaCy-style tokens."""
    tokens = re.findall(r"\w+|[^\w\s]", text)
    table = dict(zip([t.lower() for t in TOKENS], TAGS)) | {"man": "NN", "rides": "VBZ", "horse": "NN",
                                                            "beach": "NN", ".": "."}
    return tokens, [table.get(t.lower(), "XX") for t in tokens]


def test_the_tagger_is_required_and_named():
    with pytest.raises(DatasetError, match="en_core_web_sm.*not installed"):
        pt.load_tagger("en_core_web_sm")


# --------------------------------------------------------------------------------------------------------------
# Miniatures through prepare


def test_sugarcrepe_miniature_one_row_per_image_with_every_category(dirs):
    _, mirror, out = dirs
    files = {"000000000001.jpg": png(1), "000000000002.jpg": png(2)}
    write_zip(mirror / "val2017.zip", {f"val2017/{k}": v for k, v in files.items()})
    spec = spec_of("sugarcrepe")
    spec["files"]["images"].pop("sha256")
    for category in SUGARCREPE:
        data = {"0": {"filename": "000000000001.jpg", "caption": f"{category} true", "negative_caption": "neg a"},
                "5": {"filename": "000000000002.jpg", "caption": "true b", "negative_caption": f"{category} neg"}}
        (mirror / f"sugarcrepe_{category}.json").write_text(json.dumps(data))
    meta = prepare_dataset("sugarcrepe", spec, out / "sc")
    got = rows(out / "sc")
    assert [r["sample_id"] for r in got] == ["000000000001", "000000000002"]
    assert got[0]["image"] == files["000000000001.jpg"]  # as distributed
    assert len(got[0]["candidates"]) == 14 and meta.provenance["items"] == 14
    first = got[0]["candidates"][:2]
    assert first == [{"item": "add_obj/0", "category": "add_obj", "source": "positive", "index": 0,
                      "text": "add_obj true"},
                     {"item": "add_obj/0", "category": "add_obj", "source": "negative", "index": 1, "text": "neg a"}]
    texts = build_text_sets(meta, out / "sc", {})["candidates"]
    assert texts.num_rows == 28 and set(texts.column_names) >= {"sample_id", "source", "text", "item", "category"}


def test_a_missing_sugarcrepe_image_is_named(dirs):
    _, mirror, out = dirs
    write_zip(mirror / "val2017.zip", {"val2017/000000000001.jpg": png(1)})
    spec = spec_of("sugarcrepe")
    spec["files"]["images"].pop("sha256")
    for category in SUGARCREPE:
        (mirror / f"sugarcrepe_{category}.json").write_text(json.dumps(
            {"0": {"filename": "000000000009.jpg", "caption": "x", "negative_caption": "y"}}))
    with pytest.raises(DatasetError, match="000000000009.jpg"):
        prepare_dataset("sugarcrepe", spec, out / "sc")


def write_winoground(mirror: Path, examples: list[dict]) -> None:
    (mirror / "winoground_examples.jsonl").write_text("".join(json.dumps(e) + "\n" for e in examples))
    write_zip(mirror / "winoground_images.zip",
              {f"images/{e[f'image_{k}']}.png": png(10 * e["id"] + k) for e in examples for k in (0, 1)})


def winoground_examples(n: int) -> list[dict]:
    tags = ["Object", "Relation", "Both"]
    return [{"id": i, "image_0": f"ex_{i}_img_0", "image_1": f"ex_{i}_img_1", "caption_0": f"c0 of {i}",
             "caption_1": f"c1 of {i}", "tag": "x", "secondary_tag": "", "num_main_preds": 1,
             "collapsed_tag": tags[i % 3]} for i in range(n)]


def test_winoground_miniature_two_rows_per_example(dirs):
    _, mirror, out = dirs
    write_winoground(mirror, winoground_examples(3))
    with pytest.raises(DatasetError, match="winoground_examples.jsonl, winoground_images.zip give 6 images, expected 800"):
        prepare_dataset("winoground", spec_of("winoground"), out / "wg")
    meta = prepare_dataset("winoground", {**spec_of("winoground"), "size": 6}, out / "wg")
    got = rows(out / "wg")
    assert [r["sample_id"] for r in got] == ["ex_0_img_0", "ex_0_img_1", "ex_1_img_0", "ex_1_img_1", "ex_2_img_0",
                                             "ex_2_img_1"]
    assert [c["source"] for c in got[1]["candidates"]] == ["negative", "positive"]
    assert [c["text"] for c in got[1]["candidates"]] == ["c0 of 0", "c1 of 0"]
    assert meta.class_names == ["Both", "Object", "Relation"]


def test_winoground_is_a_manual_download_naming_its_files(dirs):
    _, _, out = dirs
    with pytest.raises(ManualDownloadError, match="winoground_examples.jsonl"):
        prepare_dataset("winoground", spec_of("winoground"), out / "wg")
    row = [r for r in catalogue() if r["name"] == "winoground"][0]
    assert row["manual_download"] is True and row["source"] == "compositional"


def test_aro_vg_relation_stores_the_bounding_box_crop(dirs):
    _, mirror, out = dirs
    full = png(5, size=(40, 30))
    write_zip(mirror / "vgr_vga_images.zip", {"images/2315375.jpg": full})
    items = [{"image_id": "2315375", "relation_name": "on", "bbox_x": 3, "bbox_y": 4, "bbox_w": 20, "bbox_h": 15,
              "true_caption": "the cup is on the table", "false_caption": "the table is on the cup",
              "image_path": "2315375.jpg"},
             {"image_id": "2315375", "relation_name": "holding", "bbox_x": 3, "bbox_y": 4, "bbox_w": 20, "bbox_h": 15,
              "true_caption": "the man is holding the cup", "false_caption": "the cup is holding the man",
              "image_path": "2315375.jpg"},
             {"image_id": "2315375", "relation_name": "on", "bbox_x": 0, "bbox_y": 0, "bbox_w": 10, "bbox_h": 10,
              "true_caption": "a b", "false_caption": "b a", "image_path": "2315375.jpg"}]
    (mirror / "visual_genome_relation.json").write_text(json.dumps(items))
    prepare_dataset("aro-vg-relation", spec_of("aro-vg-relation"), out / "vgr")
    got = rows(out / "vgr")
    assert len(got) == 2  # two distinct boxes
    crop = Image.open(io.BytesIO(got[0]["image"]))
    expect = Image.open(io.BytesIO(full)).convert("RGB").crop((3, 4, 23, 19))
    assert crop.format == "PNG" and crop.size == (20, 15)
    assert np.array_equal(np.asarray(crop), np.asarray(expect))
    assert [(c["item"], c["index"], c["source"]) for c in got[0]["candidates"]] == [
        ("0", 0, "negative"), ("0", 1, "positive"), ("1", 0, "negative"), ("1", 1, "positive")]


def test_aro_vg_attribution_needs_two_attributes(dirs):
    _, mirror, out = dirs
    write_zip(mirror / "vgr_vga_images.zip", {"images/1.jpg": png(1)})
    item = {"image_id": "1", "attributes": ["white"], "bbox_x": 0, "bbox_y": 0, "bbox_w": 5, "bbox_h": 5,
            "true_caption": "a", "false_caption": "b", "image_path": "1.jpg"}
    (mirror / "visual_genome_attribution.json").write_text(json.dumps([item]))
    with pytest.raises(DatasetError, match="visual_genome_attribution.json item 0.*two attributes"):
        prepare_dataset("aro-vg-attribution", spec_of("aro-vg-attribution"), out / "vga")


def miniature_coco_order_spec(mirror: Path) -> dict:
    """aro-coco-order's entry with its val2014.zip pinned to the miniature's sha256 (the real one pins COCO's)."""
    spec = spec_of("aro-coco-order")
    spec["files"]["images"]["sha256"] = hashlib.sha256((mirror / "val2014.zip").read_bytes()).hexdigest()
    return {**spec, "size": 1}


def test_aro_coco_order_miniature_has_the_caption_and_four_perturbations(dirs, monkeypatch):
    _, mirror, out = dirs
    monkeypatch.setattr(pt, "load_tagger", lambda name: fixed_tagger)
    write_zip(mirror / "val2014.zip", {"val2014/COCO_val2014_000000000042.jpg": png(42)})
    ann = [{"image": "val2014/COCO_val2014_000000000042.jpg",
            "caption": ["A small brown dog chases the red ball on green grass.", "A man rides a horse on the beach."]}]
    (mirror / "coco_karpathy_test.json").write_text(json.dumps(ann))
    prepare_dataset("aro-coco-order", miniature_coco_order_spec(mirror), out / "co")
    got = rows(out / "co")
    assert len(got) == 1 and got[0]["sample_id"] == "COCO_val2014_000000000042"
    cands = got[0]["candidates"]
    assert len(cands) == 10 and [c["index"] for c in cands[:5]] == [0, 1, 2, 3, 4]
    assert cands[0] == {"item": "COCO_val2014_000000000042/0", "category": "order", "source": "positive",
                        "index": 0, "text": "a small brown dog chases the red ball on green grass"}
    assert all(sorted(c["text"].split()) == sorted(cands[0]["text"].split()) for c in cands[1:5])
    again = prepare_dataset("aro-coco-order", miniature_coco_order_spec(mirror), out / "co2")
    assert rows(out / "co2")[0]["candidates"] == cands and again.version == load_meta(out / "co").version


COCO_VAL2014_SHA256 = "fe9be816052049c34717e077d9e34aa60814a55679f804cd043e3cbee3b9fde0"  # images.cocodataset.org's


def test_coco_val2014_is_pinned_to_cocos_own_file_by_both_entries_that_cache_it():
    """Issue 30: coco-karpathy-5k pinned another mirror's copy (the official download always failed verification) and
    aro-coco-order cached the same file name unchecked."""
    retrieval = yaml.safe_load((ROOT / "conf/dataset/coco-karpathy-5k.yaml").read_text())["prepare"]["images"]
    order = spec_of("aro-coco-order")["files"]["images"]
    assert retrieval["file"] == order["file"] == "val2014.zip"
    assert retrieval["sha256"] == order["sha256"] == COCO_VAL2014_SHA256
    assert all(url.startswith("http://images.cocodataset.org/") for url in [*retrieval["urls"], order["url"]])


def test_aro_coco_order_refuses_a_val2014_zip_that_is_not_cocos(dirs):
    _, mirror, out = dirs
    write_zip(mirror / "val2014.zip", {"val2014/COCO_val2014_000000000042.jpg": png(42)})
    (mirror / "coco_karpathy_test.json").write_text("[]")
    with pytest.raises(ChecksumError, match=f"val2014.zip.*{COCO_VAL2014_SHA256}"):
        prepare_dataset("aro-coco-order", {**spec_of("aro-coco-order"), "size": 1}, out / "co")


def test_demo_set_has_swapped_and_replaced_captions(tmp_path):
    meta = prepare_dataset("compositional", {**spec_of("compositional"), "size": 20}, tmp_path / "demo")
    got = rows(tmp_path / "demo")
    assert len(got) == 20 and meta.class_names == ["swap_att", "replace_att", "replace_obj"]
    for r in got:
        cands = {(c["category"], c["source"]): c["text"] for c in r["candidates"]}
        true, swapped = cands[("swap_att", "positive")], cands[("swap_att", "negative")]
        assert sorted(true.split()) == sorted(swapped.split()) and true != swapped
        assert cands[("replace_att", "negative")] != true and cands[("replace_obj", "negative")] != true


# --------------------------------------------------------------------------------------------------------------
# Metrics, recomputed by plain loops


class FakeInputs:
    """What `run` reads: the dataset's meta, the image features of its split, the candidates' text features."""

    def __init__(self, tmp: Path, benchmark: str, image_ids, image_emb, candidates: list[dict], text_emb):
        self.meta = DatasetMeta("d", "captions", "accuracy", [ClassInfo(0, "c")], splits={"test": len(image_ids)},
                                provenance={"benchmark": benchmark})
        self.texts_dir = tmp
        self._images = SimpleNamespace(table=pa.table({"sample_id": image_ids}), embeddings=image_emb)
        self._texts = SimpleNamespace(table=pa.Table.from_pylist(candidates), embeddings=text_emb)

    def images(self, split):
        return self._images

    def texts(self, name):
        assert name == "candidates"
        return self._texts


def random_world(rng, n_images: int, items: list[tuple[str, str, int, list[int], int]]):
    """Images and candidates: items (item, category, image, [indices], positive index) with random embeddings."""
    d = 16
    img = rng.standard_normal((n_images, d)).astype(np.float32)
    cands = []
    for item, category, image, indices, pos in items:
        cands += [{"sample_id": f"i{image}", "item": item, "category": category, "index": k,
                   "source": "positive" if k == pos else "negative", "text": f"{item}:{k}"} for k in indices]
    txt = rng.standard_normal((len(cands), d)).astype(np.float32)
    return [f"i{k}" for k in range(n_images)], img, cands, txt


def cos(a, b):
    return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))


def test_sugarcrepe_accuracy_per_category_and_mean(tmp_path):
    rng = np.random.default_rng(0)
    items = [(f"{c}/{i}", c, i % 5, [0, 1], 0) for c in ("add_obj", "swap_att") for i in range(30)]
    ids, img, cands, txt = random_world(rng, 5, items)
    result = comp.run(FakeInputs(tmp_path, "sugarcrepe", ids, img, cands, txt), {}, 0)
    score = {(c["item"], c["index"]): cos(img[ids.index(c["sample_id"])], t) for c, t in zip(cands, txt)}
    expect = {}
    for c in ("add_obj", "swap_att"):
        right = [score[(f"{c}/{i}", 0)] > score[(f"{c}/{i}", 1)] for i in range(30)]
        expect[c] = sum(right) / 30
    assert result.metrics["add_obj"] == pytest.approx(expect["add_obj"])
    assert result.metrics["swap_att"] == pytest.approx(expect["swap_att"])
    assert result.metrics["mean"] == pytest.approx((expect["add_obj"] + expect["swap_att"]) / 2)
    assert result.tables["trials"].num_rows == 60
    interval = result.intervals["mean"]
    assert interval["low"] <= result.metrics["mean"] <= interval["high"] < 1 and interval["method"] == "bootstrap"


def test_ties_are_wrong_for_sugarcrepe_and_follow_argmax_for_aro(tmp_path):
    img = np.ones((1, 4), np.float32)
    txt = np.ones((3, 4), np.float32)
    base = {"sample_id": "i0", "category": "order", "text": "t"}
    cands = [{**base, "item": "a", "index": 0, "source": "positive"}, {**base, "item": "a", "index": 1,
                                                                         "source": "negative"}]
    assert comp.run(FakeInputs(tmp_path, "sugarcrepe", ["i0"], img, [{**c, "category": "add_obj"} for c in cands],
                               txt[:2]), {}, 0).metrics["add_obj"] == 0.0
    assert comp.run(FakeInputs(tmp_path, "aro-coco-order", ["i0"], img, cands, txt[:2]), {}, 0
                    ).metrics["precision_at_1"] == 1.0
    vg = [{**c, "category": "on", "index": 1 - c["index"]} for c in cands]  # ARO VG: the true caption is index 1
    assert comp.run(FakeInputs(tmp_path, "aro-vg-relation", ["i0"], img, vg, txt[:2]), {"aro_symmetric": "keep"}, 0
                    ).metrics["accuracy"] == 0.0


def test_aro_vg_macro_accuracy_leaves_out_symmetric_relations_and_small_attribute_pairs(tmp_path):
    rng = np.random.default_rng(1)
    relations = {"on": 40, "behind": 30, "next to": 20}  # "next to" is in ARO's symmetric list
    items = [(f"{r}{i}", r, i % 7, [0, 1], 1) for r, n in relations.items() for i in range(n)]
    ids, img, cands, txt = random_world(rng, 7, items)
    score = {(c["item"], c["index"]): cos(img[ids.index(c["sample_id"])], t) for c, t in zip(cands, txt)}
    acc = {r: np.mean([score[(f"{r}{i}", 1)] > score[(f"{r}{i}", 0)] for i in range(n)]) for r, n in relations.items()}
    allc = np.mean([score[(it, 1)] > score[(it, 0)] for it, *_ in items])
    got = comp.run(FakeInputs(tmp_path, "aro-vg-relation", ids, img, cands, txt), {}, 0)
    assert got.metrics["macro_accuracy"] == pytest.approx((acc["on"] + acc["behind"]) / 2)
    assert got.metrics["accuracy"] == pytest.approx(allc)
    kept = comp.run(FakeInputs(tmp_path, "aro-vg-relation", ids, img, cands, txt), {"aro_symmetric": "keep"}, 0)
    assert kept.metrics["macro_accuracy"] == pytest.approx(np.mean(list(acc.values())))
    assert got.intervals["macro_accuracy"]["low"] <= got.metrics["macro_accuracy"] <= got.intervals["macro_accuracy"]["high"]
    attr = comp.run(FakeInputs(tmp_path, "aro-vg-attribution", ids, img, cands, txt), {}, 0)
    assert attr.metrics["macro_accuracy"] == pytest.approx((acc["on"] + acc["behind"]) / 2)  # 20 < 25 items
    assert comp.run(FakeInputs(tmp_path, "aro-vg-attribution", ids, img, cands, txt), {"aro_min_items": 35}, 0
                    ).metrics["macro_accuracy"] == pytest.approx(acc["on"])


def test_aro_order_precision_at_1_over_five_options(tmp_path):
    rng = np.random.default_rng(2)
    items = [(f"im{i % 4}/{i}", "order", i % 4, [0, 1, 2, 3, 4], 0) for i in range(50)]
    ids, img, cands, txt = random_world(rng, 4, items)
    score = {(c["item"], c["index"]): cos(img[ids.index(c["sample_id"])], t) for c, t in zip(cands, txt)}
    expect = np.mean([int(np.argmax([score[(it, k)] for k in range(5)]) == 0) for it, *_ in items])
    got = comp.run(FakeInputs(tmp_path, "aro-coco-order", ids, img, cands, txt), {}, 0)
    assert got.metrics == {"precision_at_1": pytest.approx(expect)}
    assert set(got.intervals) == {"precision_at_1"}


def test_winoground_text_image_and_group_scores(tmp_path):
    rng = np.random.default_rng(3)
    n, d = 40, 8
    img = rng.standard_normal((2 * n, d)).astype(np.float32)
    cap = rng.standard_normal((2 * n, d)).astype(np.float32)
    ids = [f"ex_{e}_img_{k}" for e in range(n) for k in (0, 1)]
    cands, txt = [], []
    for e in range(n):
        for k in (0, 1):
            for j in (0, 1):
                cands.append({"sample_id": f"ex_{e}_img_{k}", "item": str(e), "category": "Object" if e % 2 else "Both",
                              "index": j, "source": "positive" if j == k else "negative", "text": f"c{j} of {e}"})
                txt.append(cap[2 * e + j])
    got = comp.run(FakeInputs(tmp_path, "winoground", ids, img, cands, np.array(txt)), {}, 0)
    text = image = group = 0
    for e in range(n):
        s = {(j, k): cos(cap[2 * e + j], img[2 * e + k]) for j in (0, 1) for k in (0, 1)}
        t = s[0, 0] > s[1, 0] and s[1, 1] > s[0, 1]
        i = s[0, 0] > s[0, 1] and s[1, 1] > s[1, 0]
        text, image, group = text + t, image + i, group + (t and i)
    assert got.metrics == {"text": pytest.approx(text / n), "image": pytest.approx(image / n),
                           "group": pytest.approx(group / n)}
    assert set(got.details["categories"]) == {"Object", "Both"} and got.counts["items"] == n
    assert got.intervals["group"]["low"] <= group / n <= got.intervals["group"]["high"]


def test_an_item_without_exactly_one_positive_is_named(tmp_path):
    base = {"sample_id": "i0", "category": "add_obj", "text": "t", "item": "add_obj/7"}
    cands = [{**base, "index": 0, "source": "negative"}, {**base, "index": 1, "source": "negative"}]
    with pytest.raises(comp.CompositionalityError, match="add_obj/7.*i0.*0 positive"):
        comp.run(FakeInputs(tmp_path, "sugarcrepe", ["i0"], np.ones((1, 2)), cands, np.ones((2, 2))), {}, 0)
    with pytest.raises(comp.CompositionalityError, match="aro_symmetric"):
        comp.run(FakeInputs(tmp_path, "sugarcrepe", ["i0"], np.ones((1, 2)), cands, np.ones((2, 2))),
                 {"aro_symmetric": "drop"}, 0)


def test_the_analysis_starts_without_torch():
    code = "import sys, vlbench.analyses.compositionality; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_every_benchmark_is_registered_with_a_metric():
    assert set(READERS) == set(comp.BENCHMARKS) == set(comp.HEADLINE)
    names = {r["name"] for r in catalogue()}
    assert {"sugarcrepe", "winoground", "aro-vg-relation", "aro-vg-attribution", "aro-coco-order",
            "aro-flickr-order", "compositional"} <= names



def test_argmax_rule_agrees_with_numpy_argmax_under_many_ties():
    rng = np.random.default_rng(4)
    n, k = 500, 5
    options = rng.integers(0, 3, size=(n, k)).astype(np.float64)  # few values: ties everywhere
    pos = rng.integers(0, k, size=n)
    neg_index = np.array([[j for j in range(k) if j != p] for p in pos])
    t = comp.Trials(item=np.arange(n).astype(str).astype(object), category=np.full(n, "c", dtype=object),
                    sample_id=np.full(n, "i", dtype=object), pos_score=options[np.arange(n), pos], pos_index=pos,
                    neg_scores=np.take_along_axis(options, neg_index, axis=1), neg_index=neg_index)
    assert np.array_equal(comp.argmax_first(t), np.argmax(options, axis=1) == pos)
    strict = [all(options[i, pos[i]] > options[i, j] for j in range(k) if j != pos[i]) for i in range(n)]
    assert np.array_equal(comp.strict(t), strict)


def test_aro_vg_files_are_manual_downloads_named_with_their_drive_ids(dirs):
    _, _, out = dirs
    with pytest.raises(ManualDownloadError, match="visual_genome_relation.json.*1kX2iCHEv0CADL8dSO1nMdW-V0NqIAiP3"):
        prepare_dataset("aro-vg-relation", spec_of("aro-vg-relation"), out / "vgr")
