"""Knowledge-augmented class texts: ELEVATER's composition rules, CuPL sentences, Menon & Vondrick descriptors.

ELEVATER (its toolkit's `extract_text_features`, read at commit 00d0af7), per class and per knowledge string k:

    text = template.format(classname) + ' ' + ' '.join(word_tokenize(f' ; {classname} , {k}'))

for every template, knowledge-major (all templates of the first string, then of the next). Its fallbacks:
- an empty string ("", or WordNet's "" path) still appends " ; {classname} ,";
- null (the code's `''` for None) gives the template alone (the code appends a single space, which CLIP's
  tokenizer drops; we write the template without it);
- a class absent from the file contributes nothing, so with no other knowledge the class gets its templates alone.
One external source at a time (Wiktionary definition, WordNet definition, WordNet path = its first three nodes
joined by spaces), plus GPT-3 items: the first `gpt3_items` (default 1) of the class's list, each one its own
knowledge string. `aggregation="and"` (ELEVATER's default WIKI_AND_GPT3) uses both; `"then"` (WIKI_THEN_GPT3)
uses GPT-3 only for a class the external file lacks. `style="plain"` writes the paper's Table 7 form
`"{prompt} ; {knowledge}"` instead (no class name, no tokenisation; empty knowledge gives the template alone).

`word_tokenize` is NLTK's: Punkt sentence splitting, then the Treebank-style `NLTKWordTokenizer` per sentence.
Punkt's English model is data that no package registry here provides, so the default tokenizer,
"punkt-untrained", splits sentences with an untrained `PunktSentenceTokenizer` (no abbreviation list); it can
differ from the trained model only after an abbreviation inside a knowledge string (docs/protocols.md,
"Knowledge", has the measurement on ELEVATER's files). `tokenizer="nltk"` uses NLTK's own `word_tokenize` and
needs the `punkt_tab` data installed.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vlbench.knowledge.sources import (
    EXTERNAL_FIELDS,
    STATUSES,
    KnowledgeError,
    KnowledgeTable,
    entry_status,
    lookup,
)
from vlbench.texts import text_table

STYLES = ("elevater", "plain")
AGGREGATIONS = ("and", "then")  # ELEVATER's KNOWLEDGE.AGGREGATION.MEHTOD: WIKI_AND_GPT3 (default), WIKI_THEN_GPT3
TOKENIZERS = ("punkt-untrained", "nltk")
WORDNET_PATH_NODES = 3
DEFAULT_GPT3_ITEMS = 1


# ---------------------------------------------------------------------------------------------------- tokenizer


@functools.cache
def _untrained():
    from nltk.tokenize import NLTKWordTokenizer
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    return PunktSentenceTokenizer(), NLTKWordTokenizer()


def _nltk_word_tokenize(text: str) -> list[str]:
    from nltk.tokenize import word_tokenize as nltk_word_tokenize

    try:
        return nltk_word_tokenize(text)
    except LookupError:
        raise KnowledgeError(
            "knowledge tokenizer 'nltk' needs NLTK's punkt_tab data (python -m nltk.downloader punkt_tab), which is "
            "not installed; use tokenizer 'punkt-untrained', which needs no data"
        ) from None


def word_tokenize(text: str, tokenizer: str = "punkt-untrained") -> list[str]:
    """NLTK's word tokenisation: sentences first, then the Treebank-style tokenizer per sentence."""
    if tokenizer == "nltk":
        return _nltk_word_tokenize(text)
    if tokenizer != "punkt-untrained":
        raise KnowledgeError(f"unknown knowledge tokenizer {tokenizer!r}; known: {', '.join(TOKENIZERS)}")
    sentences, words = _untrained()
    return [token for sentence in sentences.tokenize(text) for token in words.tokenize(sentence)]


# Tokens after which a trained Punkt model may see no sentence end where the untrained one sees one: a period
# inside the token (an acronym, "D.C.", "e.g."), one letter ("J."), or one of these abbreviations.
ABBREVIATIONS = frozenset({
    "approx", "ave", "ca", "cf", "co", "conv", "corp", "dr", "esp", "etc", "fig", "ft", "gen", "inc", "is", "jr", "lb",
    "ltd", "mr", "mrs", "ms", "mt", "no", "oz", "sp", "spp", "sr", "st", "subg", "syn", "var", "vs",
})


def abbreviation_breaks(text: str) -> list[str]:
    """The tokens after which the untrained Punkt model ends a sentence inside `text` and a trained one might not
    (see ABBREVIATIONS); where this is empty, the default tokenizer gives what NLTK's word_tokenize gives."""
    sentences, _ = _untrained()
    spans = list(sentences.span_tokenize(text))
    found = []
    for start, end in spans[:-1]:
        last = text[start:end].split()[-1]
        word = last.rstrip(".").lstrip("(\"'").lower()
        if last.endswith(".") and ("." in word or len(word) == 1 or word in ABBREVIATIONS):
            found.append(last)
    return found


# ---------------------------------------------------------------------------------------------------- ELEVATER


def knowledge_string(source: str, value: Any) -> str | None:
    """The knowledge string ELEVATER appends for one file value: None for null; WordNet's path becomes its first
    three nodes joined by spaces ("" where WordNet has no path)."""
    if value is None:
        return None
    if source == "wordnet_path" and isinstance(value, list):
        return " ".join(value[:WORDNET_PATH_NODES])
    return value


def knowledge_suffix(classname: str, knowledge: str | None, style: str = "elevater",
                     tokenizer: str = "punkt-untrained") -> str:
    """What is appended to a filled template for one knowledge string (None: nothing, the null fallback)."""
    if knowledge is None:
        return ""
    if style == "elevater":
        return " " + " ".join(word_tokenize(f" ; {classname} , {knowledge}", tokenizer))
    if style == "plain":
        return f" ; {knowledge.strip()}" if knowledge.strip() else ""
    raise KnowledgeError(f"unknown knowledge style {style!r}; known: {', '.join(STYLES)}")


@dataclass
class ComposedTexts:
    """Class texts as text-set rows (class_index, source, text), with what happened per knowledge source:
    `counts[source]` = {covered, empty, null, missing} over the classes, `template_only` = classes that got their
    templates alone, `items` = knowledge strings used per source."""

    class_index: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    template_only: int = 0
    items: Counter = field(default_factory=Counter)

    def add(self, index: int, source: str, text: str) -> None:
        self.class_index.append(index)
        self.sources.append(source)
        self.texts.append(text)

    def count(self, source: str, status: str) -> None:
        self.counts.setdefault(source, dict.fromkeys(STATUSES, 0))[status] += 1

    def table(self):
        """The rows as a text set table (vlbench.texts)."""
        return text_table("class_index", self.class_index, self.sources, self.texts)

    def report(self) -> dict[str, Any]:
        return {"counts": self.counts, "template_only": self.template_only, "items": dict(self.items)}


def _check_templates(templates: Sequence[str]) -> list[str]:
    if (isinstance(templates, (str, bytes)) or not templates
            or not all(isinstance(t, str) and "{c}" in t for t in templates)):
        raise KnowledgeError(f"knowledge templates must be a non-empty list of strings with a '{{c}}' placeholder, "
                             f"got {templates!r:.120}")
    return list(templates)


def _check_choice(name: str, value: Any, allowed: Sequence) -> None:
    if value not in allowed:
        raise KnowledgeError(f"knowledge option {name}={value!r} is not one of {', '.join(map(str, allowed))}")


def _status_lookup(class_names, table: KnowledgeTable | None, result: ComposedTexts) -> list:
    """Per class (the file's name for it or None, value), counting each status; all None without a table."""
    if table is None:
        return [(None, None)] * len(class_names)
    rows = []
    for match, value in lookup(class_names, table):
        result.count(table.source, entry_status(value) if match.name is not None else "missing")
        rows.append((match.name, value))
    return rows


def elevater_texts(
    class_names: Sequence[str],
    templates: Sequence[str],
    *,
    external: KnowledgeTable | None = None,
    gpt3: KnowledgeTable | None = None,
    gpt3_items: int = DEFAULT_GPT3_ITEMS,
    aggregation: str = "and",
    style: str = "elevater",
    tokenizer: str = "punkt-untrained",
) -> ComposedTexts:
    """Every template x knowledge text of every class, by ELEVATER's rules (module docstring). `external` is one
    table of ELEVATER's external file (wiktionary, wordnet_definition or wordnet_path), `gpt3` its GPT-3 table;
    with neither, the texts are the templates alone."""
    templates = _check_templates(templates)
    _check_choice("aggregation", aggregation, AGGREGATIONS)
    _check_choice("style", style, STYLES)
    _check_choice("tokenizer", tokenizer, TOKENIZERS)
    if external is not None and external.source not in EXTERNAL_FIELDS:
        raise KnowledgeError(f"external knowledge must be one of {', '.join(EXTERNAL_FIELDS)}, got {external.source!r}")
    if gpt3 is not None and (gpt3.source != "gpt3" or not isinstance(gpt3_items, int) or gpt3_items < 1):
        raise KnowledgeError(f"gpt3 knowledge needs the gpt3 table and gpt3_items >= 1, got {gpt3.source!r}, "
                             f"{gpt3_items!r}")
    result = ComposedTexts()
    external_rows = _status_lookup(class_names, external, result)
    gpt3_rows = _status_lookup(class_names, gpt3, result)
    for index, name in enumerate(class_names):
        items = []  # (source, knowledge string or None)
        found, value = external_rows[index]
        if found is not None:
            items.append((external.source, knowledge_string(external.source, value)))
        found, value = gpt3_rows[index]
        if found is not None and value and (aggregation == "and" or not items):
            items += [("gpt3", text) for text in value[:gpt3_items]]
        _add_class(result, index, name, templates, items, style, tokenizer)
    return result


def _fill(template: str, name: str) -> str:
    return template.replace("{c}", name)


def _add_class(result: ComposedTexts, index: int, name: str, templates: list[str], items: list, style: str,
               tokenizer: str) -> None:
    if not items:
        result.template_only += 1
        for template in templates:
            result.add(index, "template", _fill(template, name))
        return
    suffixes = [knowledge_suffix(name, knowledge, style, tokenizer) for _, knowledge in items]
    result.template_only += not any(suffixes)  # only null knowledge (or, plain style, empty): the templates alone
    for (source, knowledge), suffix in zip(items, suffixes):
        result.items[source] += knowledge is not None
        for template in templates:
            result.add(index, source if suffix else "template", _fill(template, name) + suffix)


# ---------------------------------------------------------------------------------------------------- CuPL, Menon


def cupl_texts(class_names: Sequence[str], table: KnowledgeTable, templates: Sequence[str], *,
               with_templates: bool = False) -> ComposedTexts:
    """CuPL (its `zeroshot_classifier_gpt`): a class's texts are its generated sentences as they are (white space
    at the ends stripped: CLIP's tokenizer strips it too); `with_templates` adds the filled templates first (CuPL's
    "both"). A class without sentences (missing or empty) gets its templates alone."""
    templates = _check_templates(templates)
    result = ComposedTexts()
    for index, (name, (found, value)) in enumerate(zip(class_names, _status_lookup(class_names, table, result))):
        sentences = [s.strip() for s in (value or []) if s.strip()]
        if not sentences:
            _add_class(result, index, name, templates, [], "plain", "punkt-untrained")
            continue
        if with_templates:
            for template in templates:
                result.add(index, "template", _fill(template, name))
        for sentence in sentences:
            result.add(index, "cupl", sentence)
        result.items["cupl"] += len(sentences)
    return result


def descriptor_sentence(descriptor: str) -> str:
    """Menon & Vondrick's `make_descriptor_sentence`, rule for rule: a descriptor starting with the letter "a"
    (any word: "antennae" too) -> "which is ...", with has/often/typically/may/can -> "which ...", with "used" ->
    "which is ...", else "which has ..."."""
    if descriptor.startswith("a"):
        return f"which is {descriptor}"
    if descriptor.startswith(("has", "often", "typically", "may", "can")):
        return f"which {descriptor}"
    if descriptor.startswith("used"):
        return f"which is {descriptor}"
    return f"which has {descriptor}"


def menon_texts(class_names: Sequence[str], table: KnowledgeTable, templates: Sequence[str]) -> ComposedTexts:
    """Menon & Vondrick (their `load_gpt_descriptions` with the released settings: name prepended, ", " between,
    descriptors made sentences): per descriptor "{name}, {descriptor_sentence}", where name is the descriptor
    file's class name with "_" read as " " (their `wordify`); a class with an empty list gets their one text
    "{name}, which has " ; a class the file lacks gets its templates alone."""
    templates = _check_templates(templates)
    result = ComposedTexts()
    for index, (name, (found, value)) in enumerate(zip(class_names, _status_lookup(class_names, table, result))):
        if found is None:
            _add_class(result, index, name, templates, [], "plain", "punkt-untrained")
            continue
        label = found.replace("_", " ")
        for descriptor in value or [""]:
            result.add(index, "menon", f"{label}, {descriptor_sentence(descriptor)}")
        result.items["menon"] += len(value or [])
    return result


