"""Vocabularies as text sets: adversarial candidate words and named prompt sets (made by the texts stage), and how
a candidate word relates to a dataset's classes in WordNet (read by the extensibility analysis).

A dataset entry asks for them under `texts` (`stages/texts.py` calls `vocabulary_text_sets`):

- `vocabulary: {source: wordnet, lexnames: [noun.shape], templates: [...]}` or `{source: list, words: [...]}` -> text
  set `vocabulary`: every candidate word filled into every template (default "a photo of a {c}.", the authors'
  single prompt for adversarial vocabulary mining), owner `key` = the word, `source` = `vocabulary`. WordNet
  candidates are the distinct lemma names of the noun synsets (of the given lexicographer files, default all
  nouns), underscores read as spaces, in sorted order.
- `prompt_sets: {single: [...], ensemble: <source>}` -> text sets `prompts_single`, `prompts_ensemble` (class
  prompts, like `prompts`, under other templates). A value is a list of templates with `{c}` or a named source:
  `templates` (the entry's own `templates`), `elevater:<dataset>` (that dataset's templates in ELEVATER's data file
  `vlbench/datasets/data/elevater.json`, e.g. CIFAR-100's 18), `openclip:simple_imagenet` (the 7 ImageNet templates
  of CLIP's prompt-engineering notebook, as open_clip ships them) or `openclip:openai_imagenet` (its 80).

Relations (`related_words`): a candidate is flagged when it names a class (`class_name`: a class's name or alias),
a synonym (a lemma of a class's synset), a `hypernym` (a lemma of any synset reached from a class's synset by
hypernyms, instance hypernyms and member holonyms: broader concepts and the taxa that contain it, e.g. "equine",
"Equidae" for horse) or a `hyponym` (a lemma below it: hyponyms and instance hyponyms, e.g. "stallion"). A class
with a `wnid` uses that synset; one without uses every noun sense of its name (so a homonym can be flagged too).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from vlbench.datasets.canonical import DatasetError, DatasetMeta
from vlbench.params import check_name
from vlbench.texts import check_templates, entry_templates, prompts, resolve_templates, text_table

VOCABULARY_SET = "vocabulary"
PROMPT_SET_PREFIX = "prompts_"
DEFAULT_TEMPLATES = ["a photo of a {c}."]
VOCABULARY_SOURCES = ("wordnet", "list")
VOCABULARY_KEYS = ("source", "lexnames", "words", "templates")
RELATIONS = ("class_name", "synonym", "hypernym", "hyponym")  # priority order: a word gets the first that applies


def vocabulary_text_sets(meta: DatasetMeta, cfg: Mapping[str, Any], wn=None) -> dict[str, pa.Table]:
    """The text sets the entry's `texts` params (`cfg`) ask for: `prompts_<name>` per `prompt_sets` entry and
    `vocabulary` (`wn`: a WordNet reader for WordNet candidates, default `load_wordnet()`)."""
    sets: dict[str, pa.Table] = {}
    if cfg.get("prompt_sets") is not None:
        sets.update(prompt_sets(meta, cfg))
    if cfg.get("vocabulary") is not None:
        sets[VOCABULARY_SET] = vocabulary_set(meta.name, cfg["vocabulary"], wn)
    return sets


# --------------------------------------------------------------------------------------------------
# prompt sets


def prompt_sets(meta: DatasetMeta, cfg: Mapping[str, Any]) -> dict[str, pa.Table]:
    spec = cfg["prompt_sets"]
    if not isinstance(spec, Mapping) or not spec:
        raise DatasetError(f"dataset {meta.name!r}: texts.prompt_sets must map set names to templates or a source; "
                           f"got {spec!r}")
    own = entry_templates(meta.name, cfg)
    out = {}
    for name, source in spec.items():
        set_name = check_name("text set", f"{PROMPT_SET_PREFIX}{name}")
        out[set_name] = prompts(meta, resolve_templates(meta.name, f"texts.prompt_sets.{name}", source, own))
    return out


# --------------------------------------------------------------------------------------------------
# candidate vocabularies


def vocabulary_set(dataset: str, spec: Any, wn=None) -> pa.Table:
    """The `vocabulary` text set of one entry's `texts.vocabulary` spec."""
    if not isinstance(spec, Mapping) or spec.get("source") not in VOCABULARY_SOURCES:
        raise DatasetError(f"dataset {dataset!r}: texts.vocabulary must be a mapping with source one of {list(VOCABULARY_SOURCES)}; "
                           f"got {spec!r}")
    unknown = sorted(set(spec) - set(VOCABULARY_KEYS))
    if unknown:
        raise DatasetError(f"dataset {dataset!r}: unknown texts.vocabulary key(s) {unknown}; allowed: {list(VOCABULARY_KEYS)}")
    templates = check_templates(dataset, spec.get("templates", DEFAULT_TEMPLATES))
    words = _wordnet_candidates(dataset, spec, wn) if spec["source"] == "wordnet" else _listed_words(dataset, spec)
    rows = [(w, t.replace("{c}", w)) for w in words for t in templates]
    return text_table("key", [w for w, _ in rows], ["vocabulary"] * len(rows), [t for _, t in rows])


def _listed_words(dataset: str, spec: Mapping[str, Any]) -> list[str]:
    words = spec.get("words")
    if not isinstance(words, list) or not words or not all(isinstance(w, str) and w.strip() for w in words):
        raise DatasetError(f"dataset {dataset!r}: texts.vocabulary.words must be a non-empty list of words; got {words!r}")
    return list(dict.fromkeys(w.strip() for w in words))


def _wordnet_candidates(dataset: str, spec: Mapping[str, Any], wn=None) -> list[str]:
    from vlbench.wordnet import LEXNAMES, load_wordnet

    lexnames = spec.get("lexnames")
    if lexnames is not None:
        bad = [x for x in lexnames or [None] if x not in LEXNAMES or not str(x).startswith("noun.")]
        if not isinstance(lexnames, list) or bad:
            raise DatasetError(f"dataset {dataset!r}: texts.vocabulary.lexnames must be a list of WordNet noun "
                               f"lexicographer files (e.g. noun.shape); not {bad or lexnames!r}")
    return wordnet_nouns(wn or load_wordnet(), lexnames)


def wordnet_nouns(wn, lexnames: Sequence[str] | None = None) -> list[str]:
    """Distinct lemma names of WordNet's noun synsets (of `lexnames`, default all), '_' read as ' ', sorted.

    Read straight from data.noun (offset, lexicographer file number, type, word count in hex, then word / lex_id
    pairs): walking `all_synsets` builds 82,115 Synset objects and takes 40 s here."""
    from vlbench.wordnet import LEXNAMES

    wanted = None if lexnames is None else {LEXNAMES.index(x) for x in lexnames}
    words: set[str] = set()
    with wn.open("data.noun") as stream:
        for line in stream:
            if line.startswith(" "):
                continue  # the licence header
            fields = line.split(" ", 4 + 2 * 255)
            if wanted is not None and int(fields[1]) not in wanted:
                continue
            count = int(fields[3], 16)
            words.update(fields[4 + 2 * k].replace("_", " ") for k in range(count))
    return sorted(words)


# --------------------------------------------------------------------------------------------------
# relations to the classes


def normalize_word(word: str) -> str:
    """Case-folded, '_' and '-' read as spaces, runs of spaces as one."""
    return re.sub(r"\s+", " ", re.sub(r"[_\-]", " ", str(word))).strip().casefold()


def _class_synsets(cls, wn) -> list:
    from vlbench.wordnet import WnidError, synset_from_wnid

    if cls.wnid:
        try:
            return [synset_from_wnid(wn, cls.wnid)]
        except WnidError:
            pass
    return wn.synsets(cls.name.replace(" ", "_"), pos="n")


def _closure(synsets: list, step) -> set:
    seen, todo = set(), list(synsets)
    while todo:
        for nxt in step(todo.pop()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _broader(s) -> list:
    return s.hypernyms() + s.instance_hypernyms() + s.member_holonyms()


def _narrower(s) -> list:
    return s.hyponyms() + s.instance_hyponyms()


def relation_table(meta: DatasetMeta, wn) -> dict[str, tuple[str, str]]:
    """{normalised word: (relation, class name)}: every word related to some class, with its first relation in
    `RELATIONS` order (the first class, in class order, on ties)."""
    table: dict[str, tuple[str, str]] = {}
    levels: dict[str, list[tuple[str, str]]] = {r: [] for r in RELATIONS}
    for cls in meta.classes:
        levels["class_name"] += [(w, cls.name) for w in [cls.name, *cls.aliases]]
        synsets = _class_synsets(cls, wn)
        for relation, found in (("synonym", set(synsets)), ("hypernym", _closure(synsets, _broader)),
                                ("hyponym", _closure(synsets, _narrower))):
            levels[relation] += [(lemma, cls.name) for s in found for lemma in s.lemma_names()]
    for relation in RELATIONS:
        for word, name in levels[relation]:
            table.setdefault(normalize_word(word), (relation, name))
    return table


def related_words(meta: DatasetMeta, words: Sequence[str], wn=None) -> list[tuple[str, str] | None]:
    """Per candidate word, (relation, class name) if it names or is related to a class (module docstring), else
    None (`wn`: a WordNet reader, default `load_wordnet()`)."""
    from vlbench.wordnet import load_wordnet

    table = relation_table(meta, wn or load_wordnet())
    return [table.get(normalize_word(w)) for w in words]
