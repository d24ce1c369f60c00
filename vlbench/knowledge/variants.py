"""Knowledge variants: what the knowledge stage writes for one dataset, one text set per variant.

| variant              | texts per class                                                    | class weight        |
|----------------------|--------------------------------------------------------------------|---------------------|
| (templates: `prompts` of the texts stage; not made here)                                  | renormalised mean   |
| `wordnet_path`       | ELEVATER: template + " ; c , <first 3 nodes of path_wn>"           | renormalised mean   |
| `wordnet_definition` | ELEVATER: template + " ; c , <def_wn>"                             | renormalised mean   |
| `wiktionary`         | ELEVATER: template + " ; c , <def_wiki>"                           | renormalised mean   |
| `gpt3`               | ELEVATER: template + " ; c , <gpt3 item>" for the first gpt3_items  | renormalised mean   |
| `wiktionary_gpt3`    | ELEVATER: both, `aggregation` and/then                             | renormalised mean   |
| `cupl`               | CuPL's sentences                                                   | renormalised mean   |
| `menon`              | Menon & Vondrick's "{c}, which has ..." descriptors                | mean of similarities|
| `wn30_path`          | as wordnet_path, from WordNet 3.0 by the class's wnid (this loader) | renormalised mean   |
| `wn30_definition`    | as wordnet_definition, from WordNet 3.0 by wnid                    | renormalised mean   |
| `llm_cupl`           | as cupl, from an LLM asked CuPL's questions (off by default)       | renormalised mean   |
| `llm_elevater_gpt3`  | as gpt3, from an LLM asked ELEVATER's GPT-3 prompt (off by default)| renormalised mean   |

The ELEVATER, CuPL and Menon variants read the dataset's knowledge vocabulary (`sources.vocabulary_for`), whose
files the download layer fetches (cache, local mirror, upstream, all verified by sha256); a variant whose files the
vocabulary lacks is skipped and the reason recorded. The `wn30_*` variants need no file: per class the synset of its
wnid, else of its name (then its aliases), recorded with the candidates (`wordnet_records`). Every set's stamp carries
`knowledge`: the variant, per source coverage counts (covered / empty / null / missing of the classes), how many
classes fell back to their templates alone, the files (name, sha256, upstream) and options, and how the zero-shot
analysis makes a class weight from its texts. docs/protocols.md, "Knowledge variants in the pipeline".

The `llm_*` variants work for any class list: their texts come from an OpenAI-compatible chat endpoint, through the
answer cache of `vlbench.knowledge.llm` (the knowledge stage's `data/llm/<dataset>.jsonl`); they are composed per class
index as the cupl and gpt3 variants compose the files' texts. Not in the default `knowledge.variants`, so nothing calls
an endpoint unless asked.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vlbench.params import ParamsError, defaults
from vlbench.knowledge.compose import (
    AGGREGATIONS,
    STYLES,
    TOKENIZERS,
    ComposedTexts,
    cupl_texts,
    elevater_texts,
    menon_texts,
)
from vlbench.knowledge.hierarchy import longest_paths, wordnet_graph
from vlbench.knowledge.llm import (
    AnswerCache,
    LLMError,
    LLMOptions,
    cache_record,
    generate,
    llm_options,
    plan_for,
    resolve_model,
    styles,
)
from vlbench.knowledge.sources import (
    KnowledgeError,
    KnowledgeFile,
    KnowledgeTable,
    entry_status,
    vocabulary_files,
    vocabulary_for,
)

WORDNET_FILE = "wordnet-3.0"  # the file name the wn30 tables carry (no alias table has it)
NORMALIZED_MEAN = "normalized_mean"  # class weight: mean of L2-normalised text embeddings, renormalised (CLIP)
MEAN_SIMILARITY = "mean_similarity"  # class score: mean of the cosine similarities to the texts (Menon & Vondrick)


@dataclass(frozen=True)
class Variant:
    title: str
    kind: str  # elevater, cupl, menon, wn30, llm
    external: str | None = None  # wiktionary, wordnet_definition, wordnet_path
    gpt3: bool = False
    weights: str = NORMALIZED_MEAN
    llm_style: str | None = None  # llm: the style of vlbench/knowledge/data/llm_styles.json

    @property
    def sources(self) -> tuple[str, ...]:
        """The knowledge sources (file tables) the variant needs; the wn30 variants need WordNet only, the llm ones
        an endpoint or their cached answers."""
        if self.kind in ("cupl", "menon"):
            return (self.kind,)
        if self.kind in ("wn30", "llm"):
            return ()
        return tuple(s for s in (self.external, "gpt3" if self.gpt3 else None) if s)


VARIANTS = {
    "wordnet_path": Variant("+WordNet path (ELEVATER)", "elevater", external="wordnet_path"),
    "wordnet_definition": Variant("+WordNet definition (ELEVATER)", "elevater", external="wordnet_definition"),
    "wiktionary": Variant("+Wiktionary (ELEVATER)", "elevater", external="wiktionary"),
    "gpt3": Variant("+GPT-3 (ELEVATER)", "elevater", gpt3=True),
    "wiktionary_gpt3": Variant("+Wiktionary and GPT-3 (ELEVATER)", "elevater", external="wiktionary", gpt3=True),
    "cupl": Variant("CuPL descriptions", "cupl"),
    "menon": Variant("Menon & Vondrick descriptors", "menon", weights=MEAN_SIMILARITY),
    "wn30_path": Variant("+WordNet 3.0 path by wnid", "wn30", external="wordnet_path"),
    "wn30_definition": Variant("+WordNet 3.0 definition by wnid", "wn30", external="wordnet_definition"),
    "llm_cupl": Variant("LLM descriptions, CuPL's questions", "llm", llm_style="cupl"),
    "llm_elevater_gpt3": Variant("+LLM knowledge, ELEVATER's GPT-3 prompt", "llm", gpt3=True,
                                 llm_style="elevater_gpt3"),
}
DEFAULT_VARIANTS = tuple(v for v, spec in VARIANTS.items() if spec.kind != "llm")  # nothing calls an endpoint unasked
OPTION_KEYS = ("variants", "gpt3_items", "style", "tokenizer", "aggregation", "llm")
_DEFAULTS = defaults("knowledge")  # conf/config.yaml and conf/settings/knowledge.yaml


@dataclass(frozen=True)
class KnowledgeOptions:
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    gpt3_items: int = _DEFAULTS["gpt3_items"]
    style: str = _DEFAULTS["style"]
    tokenizer: str = _DEFAULTS["tokenizer"]
    aggregation: str = _DEFAULTS["aggregation"]
    llm: LLMOptions = LLMOptions()

    def for_variant(self, variant: Variant) -> dict[str, Any]:
        """The options that shape this variant's texts (recorded in its stamp)."""
        used: dict[str, Any] = {}
        if variant.kind in ("elevater", "wn30") or variant.gpt3:
            used = {"style": self.style, "tokenizer": self.tokenizer if self.style == "elevater" else None}
        if variant.gpt3:
            used["gpt3_items"] = self.gpt3_items
        if variant.gpt3 and variant.external:
            used["aggregation"] = self.aggregation
        if variant.llm_style:
            used.update(self.llm.for_style(variant.llm_style))
        return {k: v for k, v in used.items() if v is not None}


def knowledge_options(cfg: Mapping[str, Any] | None) -> KnowledgeOptions:
    """The params' `knowledge` section, checked; every error names the key."""
    cfg = dict(cfg or {})
    unknown = sorted(set(cfg) - set(OPTION_KEYS))
    if unknown:
        raise ParamsError(f"params.yaml: unknown key(s) {unknown} under 'knowledge'; allowed: {', '.join(OPTION_KEYS)}")
    llm = llm_options(cfg.pop("llm", None))
    opts = KnowledgeOptions(**{k: v for k, v in cfg.items() if v is not None})
    variants = opts.variants
    if isinstance(variants, str) or not isinstance(variants, (list, tuple)):
        raise ParamsError(f"params.yaml: knowledge.variants must be a list of variant names, got {variants!r}")
    bad = [v for v in variants if v not in VARIANTS]
    if bad or len(set(variants)) != len(variants):
        raise ParamsError(f"params.yaml: knowledge.variants {list(variants)} has unknown or repeated names "
                          f"{bad or sorted({v for v in variants if list(variants).count(v) > 1})}; known: {', '.join(VARIANTS)}")
    if isinstance(opts.gpt3_items, bool) or not isinstance(opts.gpt3_items, int) or opts.gpt3_items < 1:
        raise ParamsError(f"params.yaml: knowledge.gpt3_items must be an integer >= 1, got {opts.gpt3_items!r}")
    for key, allowed in (("style", STYLES), ("tokenizer", TOKENIZERS), ("aggregation", AGGREGATIONS)):
        if getattr(opts, key) not in allowed:
            raise ParamsError(f"params.yaml: knowledge.{key} {getattr(opts, key)!r} is not one of {list(allowed)}")
    return KnowledgeOptions(tuple(variants), opts.gpt3_items, opts.style, opts.tokenizer, opts.aggregation, llm)


# ---------------------------------------------------------------------------------------------------- WordNet 3.0


def _lemma(name: str) -> str:
    return name.strip().replace(" ", "_")


def _choose_synset(wn, cls) -> tuple[Any, str, list[str]]:
    """(synset or None, how it was chosen, the candidates looked at) for one class: by wnid; else the first noun
    synset of its name (WordNet's most frequent sense), then of each alias in order."""
    from vlbench.wordnet import WnidError, synset_from_wnid

    if cls.wnid:
        try:
            return synset_from_wnid(wn, cls.wnid), "wnid", []
        except WnidError as err:
            raise KnowledgeError(f"class {cls.index} ({cls.name!r}): {err}") from None
    for how, name in [("name", cls.name)] + [(f"alias {a!r}", a) for a in cls.aliases]:
        candidates = wn.synsets(_lemma(name), pos="n")
        if candidates:
            return candidates[0], how, [s.name() for s in candidates]
    return None, "none", []


def wordnet_records(classes: Sequence, wn=None) -> list[dict[str, Any]]:
    """Per class (in order): the WordNet 3.0 synset chosen for it and what the knowledge texts use: `lemmas`,
    `definition`, `path` (first lemma names from the class's synset up to `entity`, along its longest hypernym path
    with the tie rule of `vlbench.knowledge.hierarchy`) and `path_wnids`; `chosen_by` is "wnid", "name", "alias '...'"
    or "none" (no synset: the wn30 variants give the class its templates alone)."""
    from vlbench.wordnet import load_wordnet, wnid_of

    wn = wn if wn is not None else load_wordnet()
    chosen = [_choose_synset(wn, c) for c in classes]
    wnids = sorted({wnid_of(s) for s, _, _ in chosen if s is not None})
    graph = wordnet_graph(wnids, wn)
    best = longest_paths(graph.parents, wnids)
    records = []
    for cls, (synset, how, candidates) in zip(classes, chosen):
        record = {"index": cls.index, "name": cls.name, "chosen_by": how, "candidates": candidates}
        if synset is not None:
            path = list(reversed(best[wnid_of(synset)].path))
            record.update(wnid=wnid_of(synset), synset=synset.name(), lemmas=list(synset.lemma_names()),
                          definition=synset.definition(), path=[graph.lemmas[w][0] for w in path], path_wnids=path)
        records.append(record)
    return records


# ---------------------------------------------------------------------------------------------------- composing


def _merge(into: ComposedTexts, part: ComposedTexts, index: int) -> None:
    for text_source, text in zip(part.sources, part.texts):
        into.add(index, text_source, text)
    for source, counts in part.counts.items():
        for status, n in counts.items():
            into.counts.setdefault(source, dict.fromkeys(counts, 0))[status] += n
    into.template_only += part.template_only
    into.items.update(part.items)


def wn30_texts(class_names: Sequence[str], records: Sequence[Mapping], source: str, templates: Sequence[str],
               options: KnowledgeOptions) -> ComposedTexts:
    """ELEVATER's composition with WordNet 3.0 knowledge looked up per class *index* (two classes with one name may
    have two synsets): a class without a synset is "missing" and keeps its templates alone."""
    field_name = "path" if source == "wordnet_path" else "definition"
    result = ComposedTexts()
    for index, (name, record) in enumerate(zip(class_names, records)):
        entries = {name: record[field_name]} if field_name in record else {}
        part = elevater_texts([name], templates, external=KnowledgeTable(source, WORDNET_FILE, entries),
                              style=options.style, tokenizer=options.tokenizer)
        _merge(result, part, index)
    return result


def compose_variant(variant: Variant, class_names: Sequence[str], templates: Sequence[str],
                    tables: Mapping[str, KnowledgeTable], records: Sequence[Mapping] | None,
                    options: KnowledgeOptions) -> ComposedTexts:
    if variant.kind == "wn30":
        return wn30_texts(class_names, records or [], variant.external, templates, options)
    if variant.kind == "cupl":
        return cupl_texts(class_names, tables["cupl"], templates)
    if variant.kind == "menon":
        return menon_texts(class_names, tables["menon"], templates)
    return elevater_texts(class_names, templates, external=tables.get(variant.external) if variant.external else None,
                          gpt3=tables["gpt3"] if variant.gpt3 else None, gpt3_items=options.gpt3_items,
                          aggregation=options.aggregation, style=options.style, tokenizer=options.tokenizer)


# ---------------------------------------------------------------------------------------------------- LLM answers


def _llm_cupl(name: str, texts: list[str], templates: Sequence[str], options: KnowledgeOptions) -> ComposedTexts:
    return cupl_texts([name], KnowledgeTable("cupl", "llm:cupl", {name: texts}), templates)


def _llm_gpt3(name: str, texts: list[str], templates: Sequence[str], options: KnowledgeOptions) -> ComposedTexts:
    return elevater_texts([name], templates, gpt3=KnowledgeTable("gpt3", "llm:elevater_gpt3", {name: texts}),
                          gpt3_items=options.gpt3_items, style=options.style, tokenizer=options.tokenizer)


LLM_TEXTS = {"cupl": _llm_cupl, "gpt3": _llm_gpt3}  # a style's `texts`: composed as that variant composes a file's


def llm_texts(style: str, class_names: Sequence[str], texts: Sequence[list[str]], templates: Sequence[str],
              options: KnowledgeOptions) -> ComposedTexts:
    """The generated texts composed per class *index* (two classes with one name keep their own answers)."""
    compose = LLM_TEXTS[styles()[style]["texts"]]
    result = ComposedTexts()
    for index, (name, class_texts) in enumerate(zip(class_names, texts)):
        _merge(result, compose(name, list(class_texts), templates, options), index)
    return result


def llm_contexts(dataset: str, table: KnowledgeTable | None, records) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """ELEVATER's in-context (concept, explanation) pairs and where they come from: the classes of the dataset's
    Wiktionary file that have a definition (the toolkit's `if k2v['def_wiki']`), else, for a dataset without one, the
    WordNet 3.0 definitions of its classes (`records()`: wordnet_records)."""
    if table is not None:
        pairs = [(name, value) for name, value in table.entries.items() if entry_status(value) == "covered"
                 and isinstance(value, str)]
        if pairs:
            return pairs, {"context": "wiktionary", "file": table.file}
    pairs = [(r["name"], r["definition"]) for r in records() if r.get("definition")]
    if not pairs:
        raise LLMError(f"dataset {dataset!r}: llm style elevater_gpt3 needs classes with a definition for its "
                       f"in-context examples, and neither a Wiktionary file nor WordNet 3.0 defines any of its classes")
    return pairs, {"context": "wordnet_definition", "file": WORDNET_FILE}


def llm_variant(dataset: str, variant: Variant, meta, templates: Sequence[str], tables: Mapping[str, KnowledgeTable],
                records, options: KnowledgeOptions, cache: AnswerCache | None) -> tuple[ComposedTexts, list[dict]]:
    """(texts, file records) of an llm variant: its requests answered from the cache, else by the endpoint."""
    if cache is None:
        raise LLMError(f"dataset {dataset!r}: knowledge variant {variant.llm_style!r} needs an LLM answer cache")
    spec = styles()[variant.llm_style]
    contexts, used = [], []
    if spec["prompts"] == "in_context":
        contexts, source = llm_contexts(dataset, tables.get(spec["context"]), records)
        used.append(source)
    plan = plan_for(variant.llm_style, resolve_model(options.llm), options.llm, contexts)
    texts = generate(plan, meta.class_names, cache)
    return llm_texts(variant.llm_style, meta.class_names, texts, templates, options), [cache_record(plan, cache), *used]


# ---------------------------------------------------------------------------------------------------- a dataset


@dataclass
class KnowledgeSets:
    """What the knowledge stage writes for one dataset: `sets` (variant -> text set table), `stamps` (variant ->
    stamp keys), `skipped` (variant -> why), `wordnet` (per-class records, when a wn30 variant was asked for) and the
    summary for data/knowledge/<dataset>/knowledge.json."""

    dataset: str
    vocabulary: str | None
    sets: dict[str, Any] = field(default_factory=dict)
    stamps: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    wordnet: list[dict[str, Any]] | None = None
    files: list[dict[str, str]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "vocabulary": self.vocabulary, "files": self.files,
                "variants": {v: s["knowledge"] for v, s in self.stamps.items()}, "skipped": self.skipped}


def load_tables(dataset: str, vocabulary: str | None, needed: set[str]) -> tuple[dict, dict[str, dict[str, str]]]:
    """({source: table}, {source: file record}) of the vocabulary's files that give a needed source, fetched through
    the download layer (cache, mirror folder, upstream; verified by sha256)."""
    tables: dict[str, KnowledgeTable] = {}
    records: dict[str, dict[str, str]] = {}
    for kfile in vocabulary_files(vocabulary) if vocabulary else []:
        if not needed & set(kfile.sources):
            continue
        path = kfile.fetch(dataset, progress=False)
        for source, table in kfile.parse(path).items():
            tables[source], records[source] = table, _file_record(kfile)
    return tables, records


def _file_record(kfile: KnowledgeFile) -> dict[str, str]:
    """Name, sha256 and upstream (never the URL or the local path: the stamp must not depend on the machine)."""
    return {"file": kfile.name, "sha256": kfile.resource.sha256, "upstream": kfile.upstream}


def build_knowledge(dataset: str, entry: Mapping[str, Any], meta, templates: Sequence[str],
                    options: KnowledgeOptions, wn=None, llm_cache: AnswerCache | None = None) -> KnowledgeSets:
    """Every asked-for variant that has its sources for this dataset, as text sets with their stamps; the llm
    variants answer from `llm_cache`, asking the environment's endpoint for what it lacks."""
    vocabulary = vocabulary_for(dataset, entry)
    wanted = [VARIANTS[v] for v in options.variants]
    contexts = {styles()[v.llm_style].get("context") for v in wanted if v.llm_style} - {None}
    tables, files = load_tables(dataset, vocabulary, {s for v in wanted for s in v.sources} | contexts)
    built = KnowledgeSets(dataset, vocabulary)
    names = meta.class_names
    if any(v.kind == "wn30" for v in wanted):
        built.wordnet = wordnet_records(meta.classes, wn)
    records = functools.cache(lambda: built.wordnet if built.wordnet is not None else wordnet_records(meta.classes, wn))
    for order, name in enumerate(options.variants):
        variant = VARIANTS[name]
        lacking = [s for s in variant.sources if s not in tables]
        if lacking:
            where = f"vocabulary {vocabulary!r}" if vocabulary else "no knowledge vocabulary (texts.knowledge)"
            built.skipped[name] = f"no {' or '.join(lacking)} file for {where}"
            continue
        if variant.kind == "llm":
            composed, used = llm_variant(dataset, variant, meta, templates, tables, records, options, llm_cache)
        else:
            composed = compose_variant(variant, names, templates, tables, built.wordnet, options)
            used = [files[s] for s in variant.sources]
        built.sets[name] = composed.table()
        if variant.kind == "wn30":
            used = [{"file": WORDNET_FILE, "upstream": "WordNet 3.0 through vlbench.wordnet"}]
        built.stamps[name] = {"knowledge": _stamp(name, order, variant, composed, len(names), used, options)}
    built.files = sorted({f["file"]: f for f in files.values()}.values(), key=lambda f: f["file"])
    return built


def _stamp(name: str, order: int, variant: Variant, composed: ComposedTexts, classes: int, used: list,
           options: KnowledgeOptions) -> dict[str, Any]:
    coverage = {source: {"classes": classes, **counts} for source, counts in composed.counts.items()}
    return {"variant": name, "title": variant.title, "order": order, "weights": variant.weights,
            "coverage": coverage, "template_only": composed.template_only, "items": dict(composed.items),
            "texts": len(composed.texts), "files": used, "options": options.for_variant(variant)}
