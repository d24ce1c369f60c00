"""Negative captions for the specificity analysis: the vocabulary, the offline noun finder, the altered captions (on real
COCO captions when ../shared/reference/coco is present, on a self-made fixture in COCO's format otherwise), and the text
sets the texts stage writes."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path

import numpy as np
import pytest

from vlbench.knowledge import negatives as ng

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT.parent / "shared" / "reference" / "coco"
COCO_NAMES = [
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat", "traffic light",
    "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog", "horse", "sheep", "cow", "elephant",
    "bear", "zebra", "giraffe", "backpack", "umbrella", "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard",
    "sports ball", "kite", "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle",
    "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich", "orange", "broccoli",
    "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch", "potted plant", "bed", "dining table", "toilet",
    "tv", "laptop", "mouse", "remote", "keyboard", "cell phone", "microwave", "oven", "toaster", "sink",
    "refrigerator", "book", "clock", "vase", "scissors", "teddy bear", "hair drier", "toothbrush"]
# Self-made fixture in the format of COCO's captions file and of the image -> category ids table (category ids as COCO
# numbers them: 1 person, 18 dog, 62 chair, 67 dining table, 37 sports ball, 58 hot dog, 19 horse, 42 surfboard).
FIXTURE_CAPTIONS = {"annotations": [
    {"image_id": 1, "id": 1, "caption": "A man riding a wave on top of a surfboard."},
    {"image_id": 1, "id": 2, "caption": "A surfer rides a large wave in the ocean."},
    {"image_id": 2, "id": 3, "caption": "Two dogs playing with a ball in the grass."},
    {"image_id": 2, "id": 4, "caption": "A dog chases a ball across a field."},
    {"image_id": 3, "id": 5, "caption": "A hot dog with mustard on a plate next to a chair."},
    {"image_id": 3, "id": 6, "caption": "An orange chair beside a table with food."},
    {"image_id": 4, "id": 7, "caption": "People riding horses along the beach."},
]}
FIXTURE_LABELS = {"1": [1, 42], "2": [18, 37], "3": [58, 62, 67], "4": [1, 19]}


def coco_category_index() -> dict[int, int]:
    """COCO category id -> class index (the 80 ids in order, with COCO's gaps)."""
    ids = [i for i in range(1, 91) if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83)]
    return {cid: k for k, cid in enumerate(ids)}


@pytest.fixture(scope="module")
def coco():
    """(captions by image id, class indices by image id, where from)."""
    if (REFERENCE / "coco_mini/val2017_image_category_ids.json").is_file():
        captions = json.loads((REFERENCE / "captions_val2017.json").read_text())
        labels = json.loads((REFERENCE / "coco_mini/val2017_image_category_ids.json").read_text())
        origin = "reference"
    else:
        captions, labels, origin = FIXTURE_CAPTIONS, FIXTURE_LABELS, "fixture"
    by_image = collections.defaultdict(list)
    for a in captions["annotations"]:
        by_image[str(a["image_id"])].append(a["caption"])
    index = coco_category_index()
    return {i: by_image[i] for i in labels}, {i: sorted(index[c] for c in cs) for i, cs in labels.items()}, origin


@pytest.fixture(scope="module")
def coco_vocabulary():
    return ng.build_vocabulary([(i, n, []) for i, n in enumerate(COCO_NAMES)], ng.synonym_table("coco"), {})


@pytest.fixture(scope="module")
def finder(coco_vocabulary):
    return ng.NounFinder(coco_vocabulary, "all", "blank")


def _article_free(text: str) -> str:
    return re.sub(r"\b([Aa])n?(\s+)$", r"\1\2", text)


def one_replacement(a: ng.Alteration) -> bool:
    """The altered caption is the caption with one occurrence of `original` replaced by `replacement` (an article
    right before it may change between "a" and "an")."""
    for m in re.finditer(re.escape(a.original), a.caption):
        before, after = a.caption[:m.start()], a.caption[m.end():]
        prefix = a.text[:len(a.text) - len(after)]
        if (a.text.endswith(after) and prefix.endswith(a.replacement)
                and _article_free(prefix[:len(prefix) - len(a.replacement)]) == _article_free(before)):
            return True
    return False


def slot_texts(slots):
    return [(s.text, s.concept is not None, s.plural) for s in slots]


# --------------------------------------------------------------------------------------------------------------
# Vocabulary


@pytest.mark.parametrize("word, plural", [
    ("dog", "dogs"), ("bus", "buses"), ("box", "boxes"), ("sandwich", "sandwiches"), ("lady", "ladies"),
    ("toy", "toys"), ("knife", "knives"), ("person", "people"), ("policeman", "policemen"), ("human", "humans"),
    ("hot dog", "hot dogs"), ("teddy bear", "teddy bears"), ("sheep", "sheep"), ("Mouse", "mice")])
def test_pluralize(word, plural):
    assert ng.pluralize(word) == plural


def test_the_coco_table_names_every_category_once_and_no_phrase_twice(coco_vocabulary):
    assert set(ng.synonym_table("coco")) == set(COCO_NAMES)
    terms = [t for c in coco_vocabulary.concepts for t, _ in c.terms]
    assert len(terms) == len(set(terms))
    person = coco_vocabulary.concepts[0]
    assert (person.singular, person.plural) == ("person", "people")
    assert dict(person.terms)["men"] is True and dict(person.terms)["woman"] is False
    assert dict(coco_vocabulary.concepts[COCO_NAMES.index("sheep")].terms)["sheep"] is None  # its own plural


def test_a_phrase_naming_two_concepts_is_an_error():
    with pytest.raises(ng.SpecificityTextsError, match="'bat' names both class:0 and class:1"):
        ng.build_vocabulary([(0, "baseball bat", ["bat"]), (1, "bat", [])], {}, {})


def test_unknown_synonym_table_and_config_keys_are_named():
    with pytest.raises(ng.SpecificityTextsError, match="synonyms 'imagenet' is not one of"):
        ng.synonym_table("imagenet")
    with pytest.raises(ng.SpecificityTextsError, match=r"dataset 'd': unknown texts.specificity key\(s\) \['negatives'\]"):
        ng.check_config("d", {"negatives": 3})
    with pytest.raises(ng.SpecificityTextsError, match="texts.specificity.altered must be an integer >= 0; got -1"):
        ng.check_config("d", {"altered": -1})
    with pytest.raises(ng.SpecificityTextsError, match="texts.specificity.nouns must be one of"):
        ng.check_config("d", {"nouns": "some"})
    assert ng.check_config("d", None) == ng.DEFAULTS


def test_a_named_pipeline_must_be_installed_and_auto_prefers_a_trained_one(monkeypatch):
    import spacy.util

    monkeypatch.setattr(spacy.util, "get_installed_models", list)
    with pytest.raises(ng.SpecificityTextsError, match="'en_core_web_sm' is not installed .* never downloads"):
        ng.installed_pipeline("en_core_web_sm")
    assert ng.installed_pipeline("auto") is None
    monkeypatch.setattr(spacy.util, "get_installed_models", lambda: ["en_core_web_lg", "en_core_web_sm"])
    assert ng.installed_pipeline("auto") == "en_core_web_sm"
    assert ng.installed_pipeline("blank") is None


# --------------------------------------------------------------------------------------------------------------
# Finding nouns


def test_blank_pipeline_finds_category_terms_and_other_nouns(finder):
    assert finder.description.startswith("blank-en+lookup-lemmatizer+wordnet")
    got = finder.slots(["A man riding a wave on top of a surfboard.",
                        "Two hot dogs next to a dog on a dining table",
                        "A large white motorcycle parked near the building",
                        "A group of people sitting in a kitchen"])
    assert slot_texts(got[0]) == [("man", True, False), ("wave", False, False), ("surfboard", True, False)]
    assert slot_texts(got[1]) == [("hot dogs", True, True), ("dog", True, False), ("dining table", True, False)]
    assert got[1][0].concept == COCO_NAMES.index("hot dog") and got[1][1].concept == COCO_NAMES.index("dog")
    assert ("motorcycle", True, False) in slot_texts(got[2]) and ("building", False, False) in slot_texts(got[2])
    assert slot_texts(got[3]) == [("people", True, True), ("kitchen", False, False)]  # "group" is excluded


def test_vocabulary_mode_finds_only_vocabulary_terms_and_group_words():
    vocab = ng.build_vocabulary([(0, "circle", []), (1, "square", [])], {}, {"colour": ["red", "blue"]})
    finder = ng.NounFinder(vocab, "vocabulary", "blank")
    got = finder.slots(["two red circles and a blue square on the left", "a red polygon"])
    assert slot_texts(got[0]) == [("red", True, True), ("circles", True, True), ("blue", True, False),
                                  ("square", True, False)]
    assert slot_texts(got[1]) == [("red", True, False)]


# --------------------------------------------------------------------------------------------------------------
# Altering captions


def test_replacing_keeps_number_capitals_and_article_agreement(coco_vocabulary):
    elephant = coco_vocabulary.concepts[COCO_NAMES.index("elephant")]
    cake = coco_vocabulary.concepts[COCO_NAMES.index("cake")]
    assert ng.replace_slot("A dog on a bed.", ng.Slot(2, 5, "dog", 16, False), elephant) == ("An elephant on a bed.",
                                                                                           "elephant")
    assert ng.replace_slot("an apple and a cat", ng.Slot(3, 8, "apple", 47, False), cake)[0] == "a cake and a cat"
    assert ng.replace_slot("Two dogs play", ng.Slot(4, 8, "dogs", 16, True), elephant)[0] == "Two elephants play"
    assert ng.replace_slot("Dogs play", ng.Slot(0, 4, "Dogs", 16, True), cake)[0] == "Cakes play"
    assert ng.fill_prompt("a photo of a {c}.", "apple") == "a photo of an apple."
    assert ng.fill_prompt("a photo of {c}.", ng.join_names(["dog", "person", "sports ball"])) == \
        "a photo of dog, person and sports ball."


def test_altered_captions_on_coco_captions(coco, coco_vocabulary, finder):
    """Every altered caption is one of the image's captions with exactly one noun replaced by a category the image
    does not have; at most n per image, distinct, never a true caption; the same seed gives the same captions."""
    captions, labels, origin = coco
    assert len(captions) == (79 if origin == "reference" else 4)
    names = {c.singular: i for i, c in enumerate(coco_vocabulary.concepts)} | \
        {c.plural: i for i, c in enumerate(coco_vocabulary.concepts)}
    total = 0
    for image_id, caps in captions.items():
        slots = finder.slots(caps)
        present = ng.present_concepts(labels[image_id], slots, coco_vocabulary)
        assert {coco_vocabulary.of_class(c) for c in labels[image_id]} <= present
        alts = ng.sample_alterations(caps, slots, present, coco_vocabulary, 30, ng.image_rng(0, image_id))
        assert 0 < len(alts) <= 30 and len({a.text for a in alts}) == len(alts)
        for a in alts:
            assert a.caption in caps and a.text not in caps
            assert names[a.replacement.lower()] not in present
            assert one_replacement(a), a
        again = ng.sample_alterations(caps, slots, present, coco_vocabulary, 30, ng.image_rng(0, image_id))
        assert [a.text for a in again] == [a.text for a in alts]
        total += len(alts)
    assert total >= len(captions) * 20


def test_choices_are_uniform_and_a_different_seed_draws_others(coco_vocabulary, finder):
    caps = ["A dog on a bed."]
    slots = finder.slots(caps)
    present = ng.present_concepts([16, 59], slots, coco_vocabulary)
    every = ng.sample_alterations(caps, slots, present, coco_vocabulary, 1000, ng.image_rng(0, "x"))
    assert len(every) == 2 * 78  # dog or bed, each by one of the 78 categories not in the image
    first = [ng.sample_alterations(caps, slots, present, coco_vocabulary, 5, ng.image_rng(s, "x"))[0].text
             for s in range(40)]
    assert len(set(first)) > 30


def test_a_class_is_never_replaced_by_one_it_is_a_kind_of():
    """The demo's circle is an ellipse and its square a rectangle (WordNet): replacing "circle" by "ellipse" would be
    true."""
    from vlbench.datasets.synthetic import SHAPES
    from vlbench.wordnet import WordNetMissing

    try:
        hypernyms = ng.class_hypernyms([(i, s.wnid) for i, s in enumerate(SHAPES)])
    except WordNetMissing:
        pytest.skip("no WordNet here")
    names = [s.name for s in SHAPES]
    assert {names[i]: sorted(names[a] for a in above) for i, above in hypernyms.items() if above} == \
        {"circle": ["ellipse"], "square": ["rectangle"]}
    vocab = ng.build_vocabulary([(i, n, []) for i, n in enumerate(names)], {}, {}, hypernyms)
    finder = ng.NounFinder(vocab, "vocabulary", "blank")
    caps = ["a circle", "a small circle"]
    slots = finder.slots(caps)
    present = ng.present_concepts([0], slots, vocab)
    alts = ng.sample_alterations(caps, slots, present, vocab, 100, ng.image_rng(0, "c"))
    assert len(alts) == 2 * 10 and not any("ellipse" in a.text for a in alts)


# --------------------------------------------------------------------------------------------------------------
# Text sets


def test_text_sets_of_a_prepared_demo_dataset(tmp_path):
    from vlbench.datasets.synthetic import COLORS, build
    from vlbench.texts import read_text_set, write_text_sets

    meta = build("caps", {"source": "synthetic", "task": "captions", "seed": 0, "image_size": 16,
                          "splits": {"test": 40}}, tmp_path / "prepared")
    cfg = {"altered": 6, "nouns": "vocabulary", "classes_from": "labels_and_captions",
           "groups": {"colour": list(COLORS)}}
    sets = ng.specificity_text_sets(meta, tmp_path / "prepared", cfg)
    assert list(sets) == list(ng.SET_NAMES)
    single = sets["single_label_prompts"].to_pylist()
    assert [r["text"] for r in single[:2]] == ["a photo of a circle.", "a photo of an ellipse."]
    multi = sets["multi_label_prompts"].to_pylist()
    assert len(multi) == 40 and all(r["text"].startswith("a photo of ") for r in multi)
    assert any(len(r["classes"]) > 1 for r in multi) and all(r["classes"] == sorted(r["classes"]) for r in multi)
    altered = sets["altered_captions"].to_pylist()
    per_image = collections.Counter(r["sample_id"] for r in altered)
    assert set(per_image.values()) <= set(range(1, 7)) and len(per_image) == 40
    colour = {r["original"] for r in altered} & set(COLORS)
    assert colour and all(r["replacement"] in COLORS for r in altered if r["original"] in COLORS)
    assert all(r["noun_finder"].startswith("blank-en") for r in altered)
    versions = write_text_sets(tmp_path / "texts", "caps", sets)
    table, stamp = read_text_set(tmp_path / "texts/altered_captions.parquet")
    assert stamp["text_version"] == versions["altered_captions"] and table.num_rows == len(altered)
    again = ng.specificity_text_sets(meta, tmp_path / "prepared", cfg)
    assert again["altered_captions"].equals(sets["altered_captions"])


def test_a_dataset_without_captions_is_one_clear_error(tmp_path):
    from vlbench.datasets.synthetic import build

    meta = build("s", {"source": "synthetic", "task": "shapes", "seed": 0, "image_size": 16, "splits": {"test": 4}},
                 tmp_path)
    with pytest.raises(ng.SpecificityTextsError, match=r"has no `captions` column"):
        ng.specificity_text_sets(meta, tmp_path, {})


def test_images_rng_streams_are_independent_of_other_images():
    a = ng.image_rng(0, "test-000001").random(3)
    assert np.array_equal(a, ng.image_rng(0, "test-000001").random(3))
    assert not np.array_equal(a, ng.image_rng(1, "test-000001").random(3))
