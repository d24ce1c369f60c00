"""Knowledge-augmented texts: ELEVATER's composition and fallbacks, the plain form, GPT-3 items, CuPL, Menon &
Vondrick, and the tokenizer measurement on ELEVATER's real files (when ../shared/reference is present)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from nltk.tokenize import NLTKWordTokenizer

from tests.test_knowledge_sources import REFERENCE, needs_reference
from vlbench.knowledge.compose import (
    ComposedTexts,
    abbreviation_breaks,
    cupl_texts,
    descriptor_sentence,
    elevater_texts,
    knowledge_string,
    knowledge_suffix,
    menon_texts,
    word_tokenize,
)
from vlbench.knowledge.sources import (
    KnowledgeError,
    KnowledgeTable,
    parse_elevater_external,
    parse_elevater_gpt3,
)

TEMPLATES = ["a photo of a {c}.", "art of the {c}."]
CLASSES = ["cat", "dog", "eel", "owl"]  # covered, empty, null, missing (in WIKI below)
WIKI = KnowledgeTable("wiktionary", "w.tsv", {"cat": "A small domesticated carnivorous mammal.", "dog": "", "eel": None})
GPT3 = KnowledgeTable("gpt3", "g.tsv", {"cat": [" Cats purr.", " Cats hunt mice."], "dog": [" Dogs bark."],
                                        "eel": [" Eels swim."], "owl": [" Owls hoot.", " Owls (Strigiformes) fly."]})


def texts_per_class(result: ComposedTexts) -> Mapping[int, list[str]]:
    """{class_index: [texts]} of composed rows, in row order."""
    grouped: dict[int, list[str]] = {}
    for index, text in zip(result.class_index, result.texts):
        grouped.setdefault(index, []).append(text)
    return grouped


def tokenization_audit(knowledge_strings: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """For (classname, knowledge) pairs, what the tokenizer choice changes in ELEVATER's knowledge string:
    `texts`; `multi_sentence`: strings that sentence splitting changes (Treebank on the whole line differs from
    per-sentence); `abbreviation_risk`: strings with a sentence end after an abbreviation-like token, the only
    places where the untrained and NLTK's trained Punkt can disagree; `risk_tokens`: those tokens, counted."""
    words = NLTKWordTokenizer()  # the Treebank-style tokenizer on the whole line
    audit = {"texts": 0, "multi_sentence": 0, "abbreviation_risk": 0, "risk_tokens": Counter()}
    for classname, knowledge in knowledge_strings:
        text = f" ; {classname} , {knowledge}"
        audit["texts"] += 1
        audit["multi_sentence"] += words.tokenize(text) != word_tokenize(text)
        risky = abbreviation_breaks(text)
        audit["abbreviation_risk"] += bool(risky)
        audit["risk_tokens"].update(risky)
    return audit


def by_class(result):
    return texts_per_class(result)


def test_the_knowledge_string_is_tokenized_as_elevater_does():
    assert knowledge_suffix("cat", "A small domesticated carnivorous mammal.") == (
        " ; cat , A small domesticated carnivorous mammal .")
    assert knowledge_suffix("cat", 'The "house" cat (Felis catus) isn\'t wild.') == (
        " ; cat , The `` house '' cat ( Felis catus ) is n't wild .")
    # sentence by sentence: each sentence's final period is split off, as NLTK's word_tokenize does
    assert knowledge_suffix("cat", "Has fur. Likes milk.") == " ; cat , Has fur . Likes milk ."
    assert knowledge_suffix("cat", "") == " ; cat ,"
    assert knowledge_suffix("cat", None) == ""


def test_external_knowledge_and_its_three_fallbacks():
    result = elevater_texts(CLASSES, TEMPLATES, external=WIKI)
    texts = by_class(result)
    assert texts[0] == ["a photo of a cat. ; cat , A small domesticated carnivorous mammal .",
                        "art of the cat. ; cat , A small domesticated carnivorous mammal ."]
    assert texts[1] == ["a photo of a dog. ; dog ,", "art of the dog. ; dog ,"]  # empty: still " ; {c} ,"
    assert texts[2] == ["a photo of a eel.", "art of the eel."]  # null: the template alone
    assert texts[3] == ["a photo of a owl.", "art of the owl."]  # missing: the template alone
    assert result.counts == {"wiktionary": {"covered": 1, "empty": 1, "null": 1, "missing": 1}}
    assert result.template_only == 2 and result.items == {"wiktionary": 2}  # eel (null) and owl (missing)
    assert result.sources == ["wiktionary"] * 4 + ["template"] * 4


def test_external_and_gpt3_items_knowledge_major():
    result = elevater_texts(CLASSES, TEMPLATES, external=WIKI, gpt3=GPT3, gpt3_items=2)
    texts = by_class(result)
    assert texts[0] == [
        "a photo of a cat. ; cat , A small domesticated carnivorous mammal .",
        "art of the cat. ; cat , A small domesticated carnivorous mammal .",
        "a photo of a cat. ; cat , Cats purr .", "art of the cat. ; cat , Cats purr .",
        "a photo of a cat. ; cat , Cats hunt mice .", "art of the cat. ; cat , Cats hunt mice ."]
    assert len(texts[1]) == 4  # empty wiki + its one GPT-3 item
    # null wiki still contributes the templates alone (the code's "" knowledge), next to the GPT-3 texts
    assert texts[2] == ["a photo of a eel.", "art of the eel.", "a photo of a eel. ; eel , Eels swim .",
                        "art of the eel. ; eel , Eels swim ."]
    # a class the external file lacks contributes nothing: GPT-3 texts only
    assert texts[3] == ["a photo of a owl. ; owl , Owls hoot .", "art of the owl. ; owl , Owls hoot .",
                        "a photo of a owl. ; owl , Owls ( Strigiformes ) fly .",
                        "art of the owl. ; owl , Owls ( Strigiformes ) fly ."]
    assert result.counts["gpt3"] == {"covered": 4, "empty": 0, "null": 0, "missing": 0}
    assert result.items == {"wiktionary": 2, "gpt3": 6} and result.template_only == 0


def test_gpt3_item_count_is_a_parameter():
    for items, expected in ((1, [1, 1, 1, 1]), (2, [2, 1, 1, 2]), (5, [2, 1, 1, 2])):
        texts = by_class(elevater_texts(CLASSES, TEMPLATES, gpt3=GPT3, gpt3_items=items))
        assert [len(texts[i]) // len(TEMPLATES) for i in range(4)] == expected


def test_wiki_then_gpt3_uses_gpt3_only_where_the_external_file_lacks_the_class():
    texts = by_class(elevater_texts(CLASSES, TEMPLATES, external=WIKI, gpt3=GPT3, aggregation="then"))
    assert texts[2] == ["a photo of a eel.", "art of the eel."]  # null counts as present: no GPT-3
    assert texts[3] == ["a photo of a owl. ; owl , Owls hoot .", "art of the owl. ; owl , Owls hoot ."]


def test_templates_only_and_the_plain_form():
    result = elevater_texts(["cat"], TEMPLATES)
    assert result.texts == ["a photo of a cat.", "art of the cat."] and result.counts == {}
    plain = by_class(elevater_texts(CLASSES, TEMPLATES[:1], external=WIKI, style="plain"))
    assert plain[0] == ["a photo of a cat. ; A small domesticated carnivorous mammal."]
    assert plain[1] == ["a photo of a dog."] and plain[2] == ["a photo of a eel."]


def test_wordnet_path_is_its_first_three_nodes():
    path = KnowledgeTable("wordnet_path", "w.tsv", {"cat": ["cat", "feline", "carnivore", "placental"], "dog": ""})
    assert knowledge_string("wordnet_path", ["cat", "feline", "carnivore", "placental"]) == "cat feline carnivore"
    assert knowledge_string("wordnet_path", ["physical_entity"]) == "physical_entity"
    assert by_class(elevater_texts(["cat", "dog"], TEMPLATES[:1], external=path)) == {
        0: ["a photo of a cat. ; cat , cat feline carnivore"], 1: ["a photo of a dog. ; dog ,"]}


def test_classes_are_found_through_the_rules():
    table = KnowledgeTable("wiktionary", "w.tsv", {"F-16A/B": "A fighter jet."})
    assert elevater_texts(["F-16A-B"], TEMPLATES[:1], external=table).texts == [
        "a photo of a F-16A-B. ; F-16A-B , A fighter jet ."]


def test_the_table_is_a_text_set():
    table = elevater_texts(CLASSES, TEMPLATES, external=WIKI).table()
    assert table.column_names == ["class_index", "source", "text"]
    assert table.column("class_index").to_pylist() == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("kwargs, message", [
    ({"aggregation": "or"}, r"aggregation='or' is not one of and, then"),
    ({"style": "fancy"}, r"style='fancy' is not one of elevater, plain"),
    ({"tokenizer": "spacy"}, r"tokenizer='spacy' is not one of punkt-untrained, nltk"),
    ({"external": GPT3}, r"external knowledge must be one of wiktionary, wordnet_definition, wordnet_path"),
    ({"gpt3": GPT3, "gpt3_items": 0}, r"gpt3_items >= 1"),
])
def test_wrong_options_are_refused(kwargs, message):
    with pytest.raises(KnowledgeError, match=message):
        elevater_texts(CLASSES, TEMPLATES, **kwargs)
    with pytest.raises(KnowledgeError, match=r"templates must be a non-empty list of strings with a '\{c\}'"):
        elevater_texts(CLASSES, ["a photo."])


def test_nltk_tokenizer_needs_punkt_data():
    try:
        import nltk

        nltk.data.find("tokenizers/punkt_tab/english/")
    except LookupError:
        with pytest.raises(KnowledgeError, match=r"needs NLTK's punkt_tab data .* use tokenizer 'punkt-untrained'"):
            word_tokenize("A cat.", "nltk")
    else:
        assert word_tokenize("Has fur. Likes milk.", "nltk") == word_tokenize("Has fur. Likes milk.")


def test_abbreviations_are_where_the_untrained_sentence_splitter_may_differ():
    assert abbreviation_breaks(" ; cat , Dr. Smith owns one.") == ["Dr."]
    assert abbreviation_breaks(" ; city , In the U.S. It is big.") == ["U.S."]
    assert abbreviation_breaks(" ; cat , Has fur. Likes milk.") == []
    audit = tokenization_audit([("cat", "Has fur. Likes milk."), ("cat", "Dr. Smith owns one."), ("cat", "A pet.")])
    assert {k: audit[k] for k in ("texts", "multi_sentence", "abbreviation_risk")} == {
        "texts": 3, "multi_sentence": 2, "abbreviation_risk": 1}


# ---------------------------------------------------------------------------------------------------- CuPL, Menon


def test_cupl_sentences_replace_the_templates():
    table = KnowledgeTable("cupl", "c.json", {"cat": ["\nA cat sits.", "  ", "Cats purr. "], "dog": []})
    result = cupl_texts(["cat", "dog", "owl"], table, TEMPLATES[:1])
    assert by_class(result) == {0: ["A cat sits.", "Cats purr."], 1: ["a photo of a dog."], 2: ["a photo of a owl."]}
    assert result.counts == {"cupl": {"covered": 1, "empty": 1, "null": 0, "missing": 1}} and result.template_only == 2
    both = cupl_texts(["cat"], table, TEMPLATES[:1], with_templates=True)
    assert both.texts == ["a photo of a cat.", "A cat sits.", "Cats purr."]
    assert both.sources == ["template", "cupl", "cupl"]


def test_menon_descriptor_sentences_follow_their_rules():
    assert [descriptor_sentence(d) for d in ("a long tail", "antennae", "has fur", "often green", "typically small",
                                             "may bite", "can fly", "used for hunting", "four legs", "")] == [
        "which is a long tail", "which is antennae", "which has fur", "which often green", "which typically small",
        "which may bite", "which can fly", "which is used for hunting", "which has four legs", "which has "]


def test_menon_texts_use_the_files_class_name():
    table = KnowledgeTable("menon", "descriptors_imagenet.json", {"eft": ["four legs", "a long tail"],
                                                                  "apple_pie": []})
    result = menon_texts(["newt", "apple pie", "owl"], table, TEMPLATES[:1])
    assert by_class(result) == {0: ["eft, which has four legs", "eft, which is a long tail"],
                                1: ["apple pie, which has "], 2: ["a photo of a owl."]}
    assert result.counts["menon"] == {"covered": 1, "empty": 1, "null": 0, "missing": 1}


# ---------------------------------------------------------------------------------------------------- real files


@needs_reference
def test_tokenizer_measurement_on_elevater_files():
    """The numbers docs/protocols.md ("Knowledge") reports: every knowledge string ELEVATER could compose from its
    21 released files (each non-null external value of each source, each GPT-3 item)."""
    base = REFERENCE / "elevater" / "knowledge"
    pairs = []
    for path in sorted((base / "external").glob("*.tsv")):
        for source, table in parse_elevater_external(path).items():
            pairs += [(n, knowledge_string(source, v)) for n, v in table.entries.items() if v is not None]
    for path in sorted((base / "gpt3").glob("*.tsv")):
        pairs += [(n, item) for n, items in parse_elevater_gpt3(path).entries.items() for item in items or []]
    audit = tokenization_audit(pairs)
    assert (audit["texts"], audit["multi_sentence"], audit["abbreviation_risk"]) == (16890, 1845, 93)
    assert audit["risk_tokens"].most_common(3) == [("St.", 34), ("D.C.", 11), ("esp.", 11)]


@needs_reference
def test_every_real_entry_composes():
    """Each of the 21 datasets, each external source with 5 GPT-3 items: every class gets its texts, by name."""
    base = REFERENCE / "elevater" / "knowledge"
    for path in sorted((base / "external").glob("*.tsv")):
        tables = parse_elevater_external(path)
        gpt3 = parse_elevater_gpt3(base / "gpt3" / f"GPT3_{path.name.removesuffix('_knowledge.tsv')}.tsv")
        classes = list(tables["wiktionary"].entries)
        for source in ("wiktionary", "wordnet_definition", "wordnet_path"):
            result = elevater_texts(classes, TEMPLATES, external=tables[source], gpt3=gpt3, gpt3_items=5)
            assert result.counts[source]["missing"] == result.counts["gpt3"]["missing"] == 0, path.name
            expected = sum(len(TEMPLATES) * (1 + len(gpt3.entries[c][:5])) for c in classes)
            assert len(result.texts) == expected, (path.name, source)
