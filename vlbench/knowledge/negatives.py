"""Texts for the specificity analysis (Xu et al.): label prompts and altered captions (docs/protocols.md, "Specificity").

A dataset entry asks for them with `texts.specificity` (keys in `DEFAULTS`); the texts stage then writes three more
text sets beside `prompts` and `captions`, which embed_texts embeds like any other:

- `single_label_prompts` (owner `class_index`): one prompt per class, "a photo of a dog.";
- `multi_label_prompts` (owner `sample_id`): one prompt per image naming all its classes, "a photo of dog, person and
  ball.", with the image's class indices in a `classes` column (the analysis reads an image's classes from there);
- `altered_captions` (owner `sample_id`, source `negative`): up to `altered` of the image's own captions, each with one
  noun replaced by a noun that is not in the image; `caption`, `original` and `replacement` columns say what changed.

Nouns are found offline. A PhraseMatcher finds the vocabulary's terms: class names, their plurals, aliases and
synonyms (COCO's in `data/coco_nouns.json`) and configured word groups (the demo's colours). With `nouns: all`, other
nouns are found too: by a trained spaCy pipeline's tagger when one is installed (never downloaded), else by a blank
English pipeline with spaCy's lookup lemmatizer (`spacy-lookups-data`) and WordNet (`WordNetNouns`).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from vlbench.datasets.canonical import iter_batches, split_path
from vlbench.errors import VlbenchError

DEFAULTS: dict[str, Any] = {
    "single_label": "a photo of a {c}.",   # the paper's single-label prompt
    "multi_label": "a photo of {c}.",      # {c}: the image's class names, "dog, person and ball"
    "altered": 100,                        # altered captions per image (at most)
    "seed": 0,
    "nouns": "all",                        # all: any noun; vocabulary: the vocabulary's terms only
    "classes_from": "labels",              # labels | labels_and_captions (also the classes its captions name)
    "synonyms": None,                      # a synonym table of SYNONYM_TABLES (e.g. coco), or null
    "groups": {},                          # further word groups, each replaced within itself: {colour: [red, ...]}
    "pipeline": "auto",                    # auto (a trained pipeline if installed, else blank) | blank | a name
}
NOUN_MODES = ("all", "vocabulary")
CLASSES_FROM = ("labels", "labels_and_captions")
SYNONYM_TABLES = {"coco": "coco_nouns.json"}
TRAINED_PIPELINES = ("en_core_web_sm", "en_core_web_md", "en_core_web_lg", "en_core_web_trf")
SET_NAMES = ("single_label_prompts", "multi_label_prompts", "altered_captions")
CLASS_KIND = "class"

IRREGULAR_PLURALS = {"person": "people", "man": "men", "woman": "women", "child": "children", "mouse": "mice",
                     "knife": "knives", "sheep": "sheep", "calf": "calves", "ox": "oxen", "goose": "geese",
                     "foot": "feet", "tooth": "teeth", "leaf": "leaves", "shelf": "shelves", "scissors": "scissors",
                     "skis": "skis", "broccoli": "broccoli", "fish": "fish", "deer": "deer", "luggage": "luggage",
                     "cattle": "cattle", "human": "humans"}


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Words that spaCy tags as nouns but that name no thing in the picture: replacing them gives no caption of another scene.
EXCLUDED_NOUNS = _words(
    "picture photo photograph image view scene shot close closeup group couple bunch lot lots pair number variety "
    "kind kinds type sort piece pieces side front back middle top bottom left right center centre edge corner "
    "background foreground distance day night time while way something thing things area today tonight "
    "yesterday item items stuff types sorts lots")
DETERMINERS = _words(
    "a an the this that these those some several many few multiple various another other each every his her their "
    "its my our your one two three four five six seven eight nine ten")
PLURAL_CUES = _words("these those some several many few multiple various two three four five six seven eight nine ten both")


class SpecificityTextsError(VlbenchError):
    """A dataset's `texts.specificity` settings or data cannot make the specificity text sets."""


# ---------------------------------------------------------------------------------------------------------------------
# Vocabulary


def pluralize(phrase: str) -> str:
    """The plural of a noun phrase: its last word made plural (irregular table, then English spelling rules)."""
    *head, last = phrase.split(" ")
    lower = last.lower()
    if lower in IRREGULAR_PLURALS:
        plural = IRREGULAR_PLURALS[lower]
    elif lower.endswith("man"):
        plural = last[:-3] + "men"
    elif lower.endswith(("s", "x", "z", "ch", "sh")):
        plural = last + "es"
    elif lower.endswith("y") and len(lower) > 1 and lower[-2] not in "aeiou":
        plural = last[:-1] + "ies"
    else:
        plural = last + "s"
    return " ".join(head + [plural])


@dataclass(frozen=True)
class Concept:
    """Something a caption may name: a class, or a word of a configured group (a colour)."""

    key: str                 # "class:<index>" or "<group>:<word>"
    kind: str                # CLASS_KIND or the group's name; a noun is replaced by a concept of its kind
    singular: str            # written when this concept replaces a singular noun
    plural: str              # ... a plural one
    terms: tuple[tuple[str, bool | None], ...]  # (lower-case phrase, plural?) found in captions; None: either
    class_index: int | None = None


@dataclass(frozen=True)
class Vocabulary:
    concepts: tuple[Concept, ...]
    implies: Mapping[int, frozenset[int]] = field(default_factory=dict)  # concept -> the concepts it is a kind of

    def of_class(self, class_index: int) -> int:
        return next(i for i, c in enumerate(self.concepts) if c.class_index == class_index)

    def kind_members(self, kind: str) -> np.ndarray:
        return np.array([i for i, c in enumerate(self.concepts) if c.kind == kind], dtype=np.int64)


def _terms(singular: str, plural: str, words: Iterable[str]) -> tuple[tuple[str, bool | None], ...]:
    """Every phrase that names a concept, with its number: the replacement forms and each word with its plural."""
    number: dict[str, set[bool]] = {}
    for word in [singular, *words]:
        number.setdefault(word.lower(), set()).add(False)
        number.setdefault(pluralize(word).lower(), set()).add(True)
    number.setdefault(plural.lower(), set()).add(True)
    return tuple((t, next(iter(n)) if len(n) == 1 else None) for t, n in number.items())


def class_concept(index: int, name: str, words: Sequence[str], replace: Sequence[str] | None = None) -> Concept:
    singular, plural = replace or (name, pluralize(name))
    return Concept(f"{CLASS_KIND}:{index}", CLASS_KIND, singular, plural, _terms(singular, plural, [name, *words]),
                   class_index=index)


def group_concepts(kind: str, words: Sequence[str]) -> list[Concept]:
    """Words replaced only by words of their own group (colours by colours); each is its own plural."""
    return [Concept(f"{kind}:{w}", kind, w, w, ((w.lower(), None),)) for w in words]


def synonym_table(name: str | None) -> dict[str, dict[str, Any]]:
    if name is None:
        return {}
    if name not in SYNONYM_TABLES:
        raise SpecificityTextsError(f"texts.specificity.synonyms {name!r} is not one of {sorted(SYNONYM_TABLES)}")
    text = resources.files("vlbench.knowledge.data").joinpath(SYNONYM_TABLES[name]).read_text(encoding="utf-8")
    return json.loads(text)["classes"]


def build_vocabulary(classes: Sequence[tuple[int, str, Sequence[str]]], synonyms: Mapping[str, Mapping[str, Any]],
                     groups: Mapping[str, Sequence[str]],
                     hypernyms: Mapping[int, Iterable[int]] | None = None) -> Vocabulary:
    """Concepts for (index, name, aliases) classes, the synonym table's entries (by class name), and word groups;
    `hypernyms` {class: classes it is a kind of} (a circle is an ellipse: an image of a circle has an ellipse too).
    A phrase that would name two concepts is an error (the vocabulary must say what a word means)."""
    concepts = []
    for index, name, aliases in classes:
        entry = synonyms.get(name, {})
        concepts.append(class_concept(index, name, [*aliases, *entry.get("synonyms", [])], entry.get("replace")))
    for kind, words in groups.items():
        concepts += group_concepts(kind, words)
    owner: dict[str, str] = {}
    for concept in concepts:
        for term, _ in concept.terms:
            if owner.setdefault(term, concept.key) != concept.key:
                raise SpecificityTextsError(f"specificity vocabulary: {term!r} names both {owner[term]} and {concept.key}")
    concept_of = {c.class_index: i for i, c in enumerate(concepts) if c.class_index is not None}
    implies = {concept_of[c]: frozenset(concept_of[a] for a in above if a in concept_of)
               for c, above in (hypernyms or {}).items() if c in concept_of}
    return Vocabulary(tuple(concepts), implies)


def class_hypernyms(classes: Sequence[tuple[int, str | None]], wordnet=None) -> dict[int, set[int]]:
    """{class: the other classes whose WordNet synset is one of its hypernyms}, over the classes that have a wnid."""
    with_wnid = [(i, w) for i, w in classes if w]
    if not with_wnid:
        return {}
    from vlbench.wordnet import (
        hypernym_closure,
        load_wordnet,
        synset_from_wnid,
        wnid_of,
    )

    wn = wordnet or load_wordnet()
    index = {w: i for i, w in with_wnid}
    return {i: {index[wnid_of(a)] for a in hypernym_closure(synset_from_wnid(wn, w)) if wnid_of(a) in index}
            for i, w in with_wnid}


# ---------------------------------------------------------------------------------------------------------------------
# Finding nouns


@dataclass(frozen=True)
class Slot:
    """A replaceable noun (or group word) in a caption: characters [start, end), its concept if the vocabulary knows it."""

    start: int
    end: int
    text: str
    concept: int | None
    plural: bool


def installed_pipeline(name: str) -> str | None:
    """The trained spaCy pipeline to use: `auto` picks the first installed of TRAINED_PIPELINES, `blank` none."""
    import spacy.util

    installed = set(spacy.util.get_installed_models())
    if name == "blank":
        return None
    if name == "auto":
        return next((p for p in TRAINED_PIPELINES if p in installed), None)
    if name not in installed:
        raise SpecificityTextsError(f"texts.specificity.pipeline {name!r} is not installed (installed: "
                                    f"{sorted(installed) or 'none'}); vlbench never downloads one: install it "
                                    f"with pip, or use 'auto' or 'blank'")
    return name


def load_pipeline(name: str):
    """(nlp, description): a trained pipeline (tagger and lemmatizer only), or a blank English one with spaCy's lookup
    lemmatizer, whose tables come from the installed `spacy-lookups-data` package."""
    import spacy

    trained = installed_pipeline(name)
    if trained:
        nlp = spacy.load(trained, exclude=["parser", "ner", "senter"])
        return nlp, f"{trained}-{nlp.meta.get('version', '?')}"
    nlp = spacy.blank("en")
    nlp.add_pipe("lemmatizer", config={"mode": "lookup"})
    try:
        nlp.initialize()
    except (ValueError, OSError) as err:
        raise SpecificityTextsError(f"spaCy's lookup lemmatizer needs the `spacy-lookups-data` package "
                                    f"(pip install spacy-lookups-data): {err}") from None
    return nlp, f"blank-en+lookup-lemmatizer+wordnet (spacy {spacy.__version__})"


class WordNetNouns:
    """Noun detection without a tagger: a word is a noun when WordNet's sense-tagged counts favour its noun senses, or
    when it ends a run of noun or adjective words that a determiner opens ("a large white motorcycle parked")."""

    def __init__(self, wordnet=None):
        if wordnet is None:
            from vlbench.wordnet import load_wordnet

            wordnet = load_wordnet()
        self.wn = wordnet
        self._cache: dict[tuple[str, str], bool] = {}

    def _count(self, word: str, pos: str) -> int:
        """Tagged-corpus count of `word`'s senses as `pos` (-1 when WordNet has no such form)."""
        base = self.wn.morphy(word, pos)
        if base is None:
            return -1
        return sum(lemma.count() for s in self.wn.synsets(base, pos) for lemma in s.lemmas() if lemma.name().lower() == base)

    def _senses(self, word: str, pos: str) -> int:
        base = self.wn.morphy(word, pos)
        return 0 if base is None else len(self.wn.synsets(base, pos))

    def mostly_noun(self, word: str, lemma: str) -> bool:
        """The word's noun senses are counted at least as often as its senses of any other part of speech (the word's
        own or its lemma's: "riding" counts as "ride" the verb); with no counts on either side, by number of senses."""
        key = (word, "mostly")
        if key not in self._cache:
            noun = self._count(word, "n")
            other = max(self._count(w, p) for w in (word, lemma) for p in "var")
            if noun < 0:
                self._cache[key] = False
            elif noun > 0 or other > 0:
                self._cache[key] = noun >= other
            else:
                self._cache[key] = self._senses(word, "n") >= max(self._senses(w, p) for w in (word, lemma) for p in "var")
        return self._cache[key]

    def can_be(self, word: str, pos: str) -> bool:
        key = (word, pos)
        if key not in self._cache:
            self._cache[key] = self.wn.morphy(word, pos) is not None
        return self._cache[key]

    def plural(self, word: str) -> bool:
        base = self.wn.morphy(word, "n")
        return base is not None and base != word

    def nouns(self, doc, blocked: set[int]) -> list[int]:
        """Token indices of the nouns of a doc (tokens in `blocked` are taken by vocabulary matches)."""
        found = {i for i, t in enumerate(doc) if self._candidate(t, blocked) and self.mostly_noun(t.lower_, t.lemma_.lower())}
        return sorted(found | set(self._run_heads(doc, blocked)))

    @staticmethod
    def _candidate(token, blocked: set[int]) -> bool:
        return (token.i not in blocked and token.is_alpha and len(token) > 1 and not token.is_stop
                and token.lower_ not in EXCLUDED_NOUNS)

    def _run_heads(self, doc, blocked: set[int]) -> Iterator[int]:
        """The last noun word of each run of noun/adjective words after a determiner; a verb form in -ing or -ed ends
        a run unless it opens it ("a man riding" -> man; "a building" -> building)."""
        for i, token in enumerate(doc[:-1]):
            if token.lower_ in DETERMINERS:
                head = self._run_head(doc, i + 1, blocked)
                if head is not None:
                    yield head

    def _run_head(self, doc, start: int, blocked: set[int]) -> int | None:
        head = None
        for j in range(start, len(doc)):
            t = doc[j]
            if j in blocked or t.lower_ in EXCLUDED_NOUNS:
                return None  # the run ends in a vocabulary term or an excluded noun: that is its head
            if not self._candidate(t, blocked) or j > start and t.lower_.endswith(("ing", "ed")):
                break
            if self.can_be(t.lower_, "n"):
                head = j
            elif not self.can_be(t.lower_, "a"):
                break
        return head


class NounFinder:
    """Replaceable slots of captions: vocabulary terms (longest match wins) and, with `nouns: all`, other nouns."""

    def __init__(self, vocabulary: Vocabulary, nouns: str = "all", pipeline: str = "auto", wordnet=None):
        from spacy.matcher import PhraseMatcher

        self.vocabulary = vocabulary
        self.nlp, self.description = load_pipeline(pipeline)
        self.trained = self.nlp.has_pipe("tagger")
        self.matcher = PhraseMatcher(self.nlp.vocab, attr="LOWER")
        for index, concept in enumerate(vocabulary.concepts):
            for term, plural in concept.terms:
                self.matcher.add(f"{index}:{plural}", [self.nlp.make_doc(term)])
        self.wordnet = WordNetNouns(wordnet) if nouns == "all" and not self.trained else None
        self.all_nouns = nouns == "all"

    def slots(self, texts: Sequence[str], batch_size: int = 256) -> list[list[Slot]]:
        return [self._doc_slots(doc) for doc in self.nlp.pipe(texts, batch_size=batch_size)]

    def _doc_slots(self, doc) -> list[Slot]:
        from spacy.util import filter_spans

        spans = []
        for match_id, start, end in self.matcher(doc):
            span = doc[start:end]
            span.label_ = self.nlp.vocab.strings[match_id]
            spans.append(span)
        slots = []
        for span in filter_spans(spans):  # longest first: "hot dog" is not a dog
            concept, number = span.label_.split(":")
            plural = {"True": True, "False": False}.get(number)
            slots.append(Slot(span.start_char, span.end_char, span.text, int(concept),
                              plural if plural is not None else _plural_from_context(doc, span.start)))
        if self.all_nouns:
            blocked = {i for s in slots for i in _token_range(doc, s)}
            slots += [self._noun_slot(doc[i]) for i in self._nouns(doc, blocked)]
        return sorted(slots, key=lambda s: s.start)

    def _nouns(self, doc, blocked: set[int]) -> list[int]:
        if self.trained:
            return [t.i for t in doc if t.pos_ == "NOUN" and WordNetNouns._candidate(t, blocked)]
        return self.wordnet.nouns(doc, blocked)

    def _noun_slot(self, token) -> Slot:
        if self.trained:
            plural = token.tag_ in ("NNS", "NNPS") or token.morph.get("Number") == ["Plur"]
        else:
            plural = self.wordnet.plural(token.lower_)
        return Slot(token.idx, token.idx + len(token.text), token.text, None, plural)


def _token_range(doc, slot: Slot) -> range:
    span = doc.char_span(slot.start, slot.end)
    return range(span.start, span.end)


def _plural_from_context(doc, start: int) -> bool:
    """Number of a word that is its own plural ("sheep", a colour): plural after a number or quantity word."""
    return start > 0 and doc[start - 1].lower_ in PLURAL_CUES


# ---------------------------------------------------------------------------------------------------------------------
# Altering captions


@dataclass(frozen=True)
class Alteration:
    caption: str        # the true caption
    text: str           # the altered caption
    original: str       # the words replaced
    replacement: str    # the words written instead


def article_for(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def replace_slot(caption: str, slot: Slot, concept: Concept) -> tuple[str, str]:
    """(altered caption, replacement): the slot's words replaced by the concept in the slot's number, its capital kept
    and an article right before it ("a"/"an") made to agree."""
    word = concept.plural if slot.plural else concept.singular
    if slot.text[:1].isupper():
        word = word[:1].upper() + word[1:]
    before = caption[:slot.start]
    stripped = before.rstrip()
    last = stripped.rsplit(" ", 1)[-1] if stripped else ""
    if last.lower() in ("a", "an") and len(stripped) < len(before):
        article = article_for(word)
        article = article.capitalize() if last[:1].isupper() else article
        before = stripped[:len(stripped) - len(last)] + article + before[len(stripped):]
    return before + word + caption[slot.end:], word


def allowed_replacements(slot: Slot, present: set[int], vocabulary: Vocabulary) -> np.ndarray:
    """Concepts that may replace a slot: of its kind (a noun the vocabulary does not know is replaced by a class), not in
    the image, not the slot's own."""
    kind = vocabulary.concepts[slot.concept].kind if slot.concept is not None else CLASS_KIND
    members = vocabulary.kind_members(kind)
    keep = ~np.isin(members, sorted(present | ({slot.concept} if slot.concept is not None else set())))
    return members[keep]


def image_rng(seed: int, sample_id: str) -> np.random.Generator:
    """One random stream per (seed, image): an image's negatives do not depend on the other images."""
    return np.random.default_rng([seed, zlib.crc32(sample_id.encode())])


def sample_alterations(captions: Sequence[str], slots: Sequence[Sequence[Slot]], present: set[int],
                       vocabulary: Vocabulary, n: int, rng: np.random.Generator) -> list[Alteration]:
    """Up to `n` distinct altered captions, drawn uniformly without replacement from every (caption, slot, replacement)
    choice; none equals a true caption."""
    choices = [(c, slot, allowed_replacements(slot, present, vocabulary))
               for c, caption_slots in enumerate(slots) for slot in caption_slots]
    sizes = np.array([len(a) for _, _, a in choices], dtype=np.int64)
    total = int(sizes.sum())
    if total == 0:
        return []
    ends = np.cumsum(sizes)
    picks = rng.choice(total, size=min(n, total), replace=False)
    truths = {c.strip().lower() for c in captions}
    out: dict[str, Alteration] = {}
    for pick in picks.tolist():
        k = int(np.searchsorted(ends, pick, side="right"))
        c, slot, allowed = choices[k]
        concept = vocabulary.concepts[int(allowed[pick - (ends[k] - sizes[k])])]
        text, word = replace_slot(captions[c], slot, concept)
        if text.strip().lower() not in truths:
            out.setdefault(text, Alteration(captions[c], text, slot.text, word))
    return list(out.values())


def present_concepts(classes: Iterable[int], slots: Iterable[Iterable[Slot]], vocabulary: Vocabulary) -> set[int]:
    """What is in the image: its classes, everything its captions name, and what those are kinds of."""
    present = {vocabulary.of_class(c) for c in classes}
    present |= {s.concept for caption in slots for s in caption if s.concept is not None}
    return present.union(*(vocabulary.implies.get(c, ()) for c in present))


# ---------------------------------------------------------------------------------------------------------------------
# Text sets


def check_config(dataset: str, cfg: Mapping[str, Any] | None) -> dict[str, Any]:
    """`texts.specificity` with defaults filled in; errors name the dataset and the key."""
    cfg = dict(cfg or {})
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise SpecificityTextsError(f"dataset {dataset!r}: unknown texts.specificity key(s) {unknown}; "
                                    f"allowed: {', '.join(DEFAULTS)}")
    out = {**DEFAULTS, **cfg}
    checks = {
        "single_label": isinstance(out["single_label"], str) and "{c}" in out["single_label"],
        "multi_label": isinstance(out["multi_label"], str) and "{c}" in out["multi_label"],
        "altered": isinstance(out["altered"], int) and not isinstance(out["altered"], bool) and out["altered"] >= 0,
        "seed": isinstance(out["seed"], int) and not isinstance(out["seed"], bool),
        "nouns": out["nouns"] in NOUN_MODES,
        "classes_from": out["classes_from"] in CLASSES_FROM,
        "groups": isinstance(out["groups"], Mapping) and all(
            isinstance(w, list) and all(isinstance(x, str) and x for x in w) for w in out["groups"].values()),
        "pipeline": isinstance(out["pipeline"], str),
    }
    expected = {"single_label": "a string with '{c}'", "multi_label": "a string with '{c}'",
                "altered": "an integer >= 0", "seed": "an integer", "nouns": f"one of {list(NOUN_MODES)}",
                "classes_from": f"one of {list(CLASSES_FROM)}", "groups": "a mapping of group name to a list of words",
                "pipeline": "auto, blank or an installed spaCy pipeline's name"}
    for key, ok in checks.items():
        if not ok:
            raise SpecificityTextsError(f"dataset {dataset!r}: texts.specificity.{key} must be {expected[key]}; "
                                        f"got {out[key]!r}")
    return out


def fill_prompt(template: str, names: str) -> str:
    """The template with {c} filled; "a {c}" becomes "an ..." before a vowel."""
    text = template.replace("{c}", names)
    at = template.index("{c}")
    if template[:at].endswith(" a ") or template[:at] == "a ":
        article_at = at - 2
        text = text[:article_at] + article_for(names) + text[article_at + 1:]
    return text


def join_names(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


@dataclass
class Sample:
    sample_id: str
    labels: list[int]
    captions: list[str]


def read_samples(meta, dataset_dir: Path) -> list[Sample]:
    """Every sample of every split: its labels (a single label as a list of one) and captions."""
    import pyarrow.parquet as pq

    samples = []
    for split in meta.splits:
        path = split_path(dataset_dir, split)
        if "captions" not in pq.read_schema(path).names:
            raise SpecificityTextsError(f"{path}: dataset {meta.name!r} has no `captions` column; the specificity "
                                        f"texts need true captions")
        for batch in iter_batches(path, columns=["sample_id", meta.label_column, "captions"]):
            for sid, label, caps in zip(*(batch.column(c).to_pylist() for c in ("sample_id", meta.label_column, "captions"))):
                labels = label if isinstance(label, list) else [] if label is None else [label]
                samples.append(Sample(sid, sorted(set(labels)), list(caps or [])))
    return samples


def dataset_vocabulary(meta, cfg: Mapping[str, Any], wordnet=None) -> Vocabulary:
    classes = [(c.index, c.name, list(c.aliases)) for c in meta.classes]
    hypernyms = class_hypernyms([(c.index, c.wnid) for c in meta.classes], wordnet)
    return build_vocabulary(classes, synonym_table(cfg["synonyms"]), cfg["groups"], hypernyms)


def image_classes(sample: Sample, slots: Sequence[Sequence[Slot]], vocabulary: Vocabulary, classes_from: str) -> list[int]:
    if classes_from == "labels":
        return sample.labels
    named = {vocabulary.concepts[s.concept].class_index for caption in slots for s in caption if s.concept is not None}
    return sorted(set(sample.labels) | (named - {None}))


def specificity_text_sets(meta, dataset_dir: Path, cfg: Mapping[str, Any] | None, wordnet=None) -> dict[str, pa.Table]:
    """The three specificity text sets of one prepared dataset (see the module docstring)."""
    cfg = check_config(meta.name, cfg)
    samples = read_samples(meta, Path(dataset_dir))
    vocabulary = dataset_vocabulary(meta, cfg, wordnet)
    finder = NounFinder(vocabulary, cfg["nouns"], cfg["pipeline"], wordnet=wordnet)
    flat = finder.slots([c for s in samples for c in s.captions])
    starts = np.cumsum([0] + [len(s.captions) for s in samples])
    multi, altered = [], []
    for k, sample in enumerate(samples):
        slots = flat[starts[k]:starts[k + 1]]
        classes = image_classes(sample, slots, vocabulary, cfg["classes_from"])
        if classes:
            names = join_names([meta.classes[c].name for c in classes])
            multi.append((sample.sample_id, fill_prompt(cfg["multi_label"], names), classes))
        present = present_concepts(classes, slots, vocabulary)
        for alt in sample_alterations(sample.captions, slots, present, vocabulary, cfg["altered"],
                                      image_rng(cfg["seed"], sample.sample_id)):
            altered.append((sample.sample_id, alt))
    return {
        "single_label_prompts": single_label_table(meta, cfg["single_label"]),
        "multi_label_prompts": multi_label_table(multi),
        "altered_captions": altered_table(altered, finder.description),
    }


def single_label_table(meta, template: str) -> pa.Table:
    return pa.table({"class_index": pa.array([c.index for c in meta.classes], pa.int64()),
                     "source": pa.array(["single_label"] * len(meta.classes), pa.string()),
                     "text": pa.array([fill_prompt(template, c.name) for c in meta.classes], pa.string())})


def multi_label_table(rows: list[tuple[str, str, list[int]]]) -> pa.Table:
    return pa.table({"sample_id": pa.array([r[0] for r in rows], pa.string()),
                     "source": pa.array(["multi_label"] * len(rows), pa.string()),
                     "text": pa.array([r[1] for r in rows], pa.string()),
                     "classes": pa.array([r[2] for r in rows], pa.list_(pa.int64()))})


def altered_table(rows: list[tuple[str, Alteration]], noun_finder: str) -> pa.Table:
    return pa.table({"sample_id": pa.array([r[0] for r in rows], pa.string()),
                     "source": pa.array(["negative"] * len(rows), pa.string()),
                     "text": pa.array([r[1].text for r in rows], pa.string()),
                     "caption": pa.array([r[1].caption for r in rows], pa.string()),
                     "original": pa.array([r[1].original for r in rows], pa.string()),
                     "replacement": pa.array([r[1].replacement for r in rows], pa.string()),
                     "noun_finder": pa.array([noun_finder] * len(rows), pa.string())})
