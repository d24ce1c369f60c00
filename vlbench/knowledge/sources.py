"""Knowledge sources: ELEVATER's released knowledge, CuPL descriptions, Menon & Vondrick descriptors.

Every file is downloaded at run time from its upstream repository at a fixed commit and verified by sha256
(`data/resources.json`), through the download layer (`vlbench.datasets.download`: cache, local mirror folder).
Parsed, a file gives one `KnowledgeTable` per knowledge source, keyed by class name as the file spells it:

| file (family)                                | sources it gives                                   | value per class        |
|----------------------------------------------|----------------------------------------------------|------------------------|
| ELEVATER `external/<d>_knowledge.tsv`        | `wiktionary` (def_wiki), `wordnet_definition`      | str or null            |
|   one JSON list of {classname, def_wiki,     |   (def_wn), `wordnet_path` (path_wn)               | list of nodes, "" when |
|   path_wn, def_wn}                           |                                                    |   WordNet has none     |
| ELEVATER `gpt3/GPT3_<d>.tsv`: one JSON list  | `gpt3`                                             | list of str            |
|   of {classname, gpt3: [...]}                |                                                    |                        |
| CuPL `<name>_prompts_base.json`, and         | `cupl`                                             | list of sentences      |
|   CLIP_benchmark's `cupl_prompts.json`       |                                                    |                        |
|   ({"imagenet1k": {...}})                    |                                                    |                        |
| Menon & Vondrick `descriptors_<d>.json`      | `menon`                                            | list of descriptors    |

An entry is *covered* (a usable, non-blank value), *empty* ("" or a list without a non-blank item), *null*
(JSON null) or, for a class the file lacks, *missing*. Classes are looked up by name, never by position: by the
exact name, then the file's alias table (`data/aliases.json`, hand-checked pairs), then the rules of
`ALIAS_RULES` (each applied to both names; a match must be unique). `data/vocabularies.json` says which files
describe which class vocabulary and which registered datasets use which vocabulary.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlbench.datasets.canonical import DatasetError
from vlbench.datasets.download import (
    Resource,
    cache_dir,
    fetch,
    mirror_candidates,
    mirror_dir,
)
from vlbench.io import sha256_file

DATA_DIR = Path(__file__).parent / "data"
RAW_URL = "https://raw.githubusercontent.com/{repo}/{commit}/{folder}/{file}"
LOCAL_UPSTREAM = "vlbench:"  # KnowledgeFile.upstream of a file shipped in DATA_DIR ("vlbench:demo/<file>")

FAMILY_SOURCES = {
    "elevater_external": ("wiktionary", "wordnet_definition", "wordnet_path"),
    "elevater_gpt3": ("gpt3",),
    "cupl": ("cupl",),
    "cupl_imagenet": ("cupl",),
    "menon": ("menon",),
}
EXTERNAL_FIELDS = {"wiktionary": "def_wiki", "wordnet_definition": "def_wn", "wordnet_path": "path_wn"}
STATUSES = ("covered", "empty", "null", "missing")


class KnowledgeError(DatasetError):
    """A knowledge file is malformed, or a knowledge option or binding is wrong; the message names the file,
    the entry and the key."""


# ---------------------------------------------------------------------------------------------------- files


@dataclass(frozen=True)
class KnowledgeFile:
    """One upstream knowledge file: its download resource, its family (which parser) and where it comes from."""

    family: str
    resource: Resource
    upstream: str  # "<repo>@<commit>:<path>"
    key: str | None = None  # a top-level key the tables sit under (CLIP_benchmark's "imagenet1k")

    @property
    def name(self) -> str:
        return self.resource.filename

    @property
    def sources(self) -> tuple[str, ...]:
        return FAMILY_SOURCES[self.family]

    @property
    def local(self) -> Path | None:
        """The copy this package ships (the demo world's own files), or None for an upstream file."""
        if not self.upstream.startswith(LOCAL_UPSTREAM):
            return None
        return DATA_DIR / self.upstream[len(LOCAL_UPSTREAM):]

    def parse(self, path: str | Path) -> dict[str, KnowledgeTable]:
        """{source: table} of this file read from `path`."""
        if self.family == "elevater_external":
            return parse_elevater_external(path, self.name)
        if self.family == "elevater_gpt3":
            return {"gpt3": parse_elevater_gpt3(path, self.name)}
        source = self.sources[0]
        return {source: parse_descriptions(path, source, key=self.key, file=self.name)}

    def fetch(self, dataset: str, **kwargs) -> Path:
        """The verified file from the download cache, the local mirror folder or upstream (may download)."""
        return fetch(self.resource, dataset, **kwargs)

    def provenance(self, path: str | Path) -> dict:
        """What a text set records about this file: the download layer's record plus the upstream commit."""
        return {**self.resource.provenance(path), "upstream": self.upstream}


def _data(name: str) -> dict:
    return json.loads((DATA_DIR / name).read_text(encoding="utf-8"))


@functools.cache
def knowledge_files() -> dict[str, KnowledgeFile]:
    """Every known knowledge file by file name (data/resources.json)."""
    files = {}
    for family, spec in _data("resources.json").items():
        if family.startswith("_"):
            continue
        for name, sha256 in spec["files"].items():
            if "local" in spec:  # shipped in this package (the demo world's files), fetched from a file:// URL
                url = (DATA_DIR / spec["local"] / name).resolve().as_uri()
                upstream = f"{LOCAL_UPSTREAM}{spec['local']}/{name}"
            else:
                url = RAW_URL.format(repo=spec["repo"], commit=spec["commit"], folder=spec["folder"], file=name)
                upstream = f"{spec['repo']}@{spec['commit']}:{spec['folder']}/{name}"
            resource = Resource(name, (url,), sha256=sha256)
            files[name] = KnowledgeFile(spec.get("family", family), resource, upstream, spec.get("key"))
    return files


@functools.cache
def _bindings() -> dict:
    return _data("vocabularies.json")


def vocabularies() -> dict[str, list[str]]:
    """{vocabulary: [knowledge file names]} (data/vocabularies.json)."""
    return _bindings()["vocabularies"]


def vocabulary_files(vocabulary: str) -> list[KnowledgeFile]:
    if vocabulary not in vocabularies():
        raise KnowledgeError(f"unknown knowledge vocabulary {vocabulary!r}; known: {', '.join(sorted(vocabularies()))}")
    files = knowledge_files()
    return [files[name] for name in vocabularies()[vocabulary]]


def vocabulary_for(dataset: str, entry: Mapping[str, Any] | None = None) -> str | None:
    """The class vocabulary whose knowledge files describe `dataset`: the entry's `texts.knowledge` if set, else
    for ELEVATER's source its ELEVATER dataset (`prepare.dataset`, default the entry's name), else the dataset's own
    name if it is a vocabulary, else the binding in data/vocabularies.json; None if there is none."""
    entry = entry or {}
    texts = entry.get("texts") or {}
    chosen = texts.get("knowledge") if isinstance(texts, Mapping) else None
    if chosen is not None:
        if chosen not in vocabularies():
            raise KnowledgeError(f"dataset {dataset!r}: texts.knowledge {chosen!r} is not a knowledge vocabulary; "
                                 f"known: {', '.join(sorted(vocabularies()))}")
        return chosen
    spec = entry.get("prepare") or {}
    if isinstance(spec, Mapping) and spec.get("source") == "elevater" and spec.get("dataset", dataset) in vocabularies():
        return spec.get("dataset", dataset)
    if dataset in vocabularies():
        return dataset
    return _bindings()["datasets"].get(dataset)


def find_local(kfile: KnowledgeFile, cache: str | Path | None = None, mirror: str | Path | None = None
               ) -> tuple[Path | None, list[str]]:
    """(path of a verified copy in the download cache, the local mirror folder or, for a file this package ships, the
    package; or None; the copies found with a wrong sha256, each named with both checksums). Never downloads and never
    writes."""
    folder, mirror_path = cache_dir(cache), mirror_dir(mirror)
    candidates = [folder / kfile.name] + (mirror_candidates(mirror_path, kfile.name) if mirror_path else [])
    candidates += [kfile.local] if kfile.local is not None else []  # a file this package ships is local too
    mismatches = []
    for path in candidates:
        if not path.is_file():
            continue
        actual = sha256_file(path)
        if actual == kfile.resource.sha256:
            return path, mismatches
        mismatches.append(f"{path} has sha256 {actual}, expected {kfile.resource.sha256}")
    return None, mismatches


def search_places(cache: str | Path | None = None, mirror: str | Path | None = None) -> str:
    """Where `find_local` looks, in words."""
    mirror_path = mirror_dir(mirror)
    where = f"the mirror folder {mirror_path}" if mirror_path else "no mirror folder (env VLBENCH_MIRROR is unset)"
    return f"the download cache {cache_dir(cache)} and {where}"


# ---------------------------------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class KnowledgeTable:
    """One knowledge source of one file: class name (as the file spells it) -> value. A name the file lists more
    than once keeps its last entry (as ELEVATER's dict does) and is named in `duplicates`."""

    source: str
    file: str
    entries: Mapping[str, Any]
    duplicates: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.entries)


def entry_status(value: Any) -> str:
    """covered, empty or null, for a value found in a file (a class not found is "missing")."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return "covered" if value.strip() else "empty"
    return "covered" if any(item.strip() for item in value) else "empty"


def read_json(path: str | Path) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise KnowledgeError(f"{path}: cannot read the knowledge file: {err}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise KnowledgeError(f"{path}: not valid JSON (line {err.lineno}, column {err.colno}): {err.msg}") from None


def _records(path, data: Any, keys: Sequence[str]) -> list[Mapping]:
    shape = "{" + ", ".join(keys) + "}"
    if not isinstance(data, list):
        raise KnowledgeError(f"{path}: expected one JSON list of {shape} entries, got a JSON {type(data).__name__}")
    for i, record in enumerate(data):
        if not isinstance(record, Mapping):
            raise KnowledgeError(f"{path}: entry {i} must be an object {shape}, got {record!r:.80}")
        lacking = [k for k in keys if k not in record]
        if lacking:
            raise KnowledgeError(f"{path}: entry {i} ({record.get('classname')!r}) lacks key(s) {lacking}")
        if not isinstance(record["classname"], str) or not record["classname"].strip():
            raise KnowledgeError(f"{path}: entry {i}: 'classname' must be a non-empty string, "
                                 f"got {record['classname']!r}")
    return data


def _is_text_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _check_value(path, i: int, record: Mapping, key: str, allow_list: bool) -> Any:
    value = record[key]
    if value is None or isinstance(value, str) or (allow_list and _is_text_list(value)):
        return value
    kinds = "a string, a list of strings or null" if allow_list else "a string or null"
    raise KnowledgeError(f"{path}: entry {i} ({record['classname']!r}) key {key!r} must be {kinds}, got {value!r:.80}")


def _table(source: str, file: str, pairs: list[tuple[str, Any]]) -> KnowledgeTable:
    counts = Counter(name for name, _ in pairs)
    return KnowledgeTable(source, file, dict(pairs), tuple(sorted(n for n, c in counts.items() if c > 1)))


def parse_elevater_external(path: str | Path, file: str | None = None) -> dict[str, KnowledgeTable]:
    """ELEVATER's `<dataset>_knowledge.tsv` (one JSON list, despite the name) -> wiktionary, wordnet_definition and
    wordnet_path tables."""
    records = _records(path, read_json(path), ("classname", *EXTERNAL_FIELDS.values()))
    pairs: dict[str, list] = {source: [] for source in EXTERNAL_FIELDS}
    for i, record in enumerate(records):
        for source, key in EXTERNAL_FIELDS.items():
            pairs[source].append((record["classname"], _check_value(path, i, record, key, source == "wordnet_path")))
    return {source: _table(source, file or Path(path).name, rows) for source, rows in pairs.items()}


def parse_elevater_gpt3(path: str | Path, file: str | None = None) -> KnowledgeTable:
    """ELEVATER's `GPT3_<dataset>.tsv` (one JSON list of {classname, gpt3: [...]}) -> the gpt3 table."""
    records = _records(path, read_json(path), ("classname", "gpt3"))
    rows = []
    for i, record in enumerate(records):
        value = record["gpt3"]
        if value is not None and not _is_text_list(value):
            raise KnowledgeError(f"{path}: entry {i} ({record['classname']!r}) key 'gpt3' must be a list of strings "
                                 f"or null, got {value!r:.80}")
        rows.append((record["classname"], value))
    return _table("gpt3", file or Path(path).name, rows)


def parse_descriptions(path: str | Path, source: str, key: str | None = None, file: str | None = None
                       ) -> KnowledgeTable:
    """A `{classname: [texts]}` file (CuPL prompts, Menon & Vondrick descriptors), optionally under a top-level
    `key` (CLIP_benchmark's `{"imagenet1k": {...}}`)."""
    data = read_json(path)
    if key is not None:
        if not isinstance(data, Mapping) or key not in data:
            found = sorted(data)[:5] if isinstance(data, Mapping) else type(data).__name__
            raise KnowledgeError(f"{path}: expected a top-level key {key!r}, found {found}")
        data = data[key]
    where = f"{path}" + (f" [{key!r}]" if key else "")
    if not isinstance(data, Mapping):
        raise KnowledgeError(f"{where}: expected a JSON object {{classname: [texts]}}, got a JSON {type(data).__name__}")
    for name, value in data.items():
        if not name.strip():
            raise KnowledgeError(f"{where}: a class name is empty")
        if value is not None and not _is_text_list(value):
            raise KnowledgeError(f"{where}: class {name!r} must map to a list of strings, got {value!r:.80}")
    return KnowledgeTable(source, file or Path(path).name, dict(data))


# ---------------------------------------------------------------------------------------------------- names


def _spacing(name: str) -> str:
    return " ".join(name.split())


def _slash(name: str) -> str:
    return _spacing(name).replace("/", "-")


_LEADING_YEAR = re.compile(r"((?:19|20)\d\d) (.+)")


def _year(name: str) -> str:
    name = _slash(name)
    match = _LEADING_YEAR.fullmatch(name)
    return f"{match[2]} {match[1]}" if match else name


def _case(name: str) -> str:
    return _spacing(_year(name).replace("_", " ")).casefold()


# Rules that find a class in a file whose spelling differs, each one also applying the ones before it; a rule
# normalises both names and matches only when exactly one name of the file has the class's normal form.
ALIAS_RULES: dict[str, Callable[[str], str]] = {
    "spacing": _spacing,  # runs of white space count as one space: "head of a  crocodile" (ELEVATER's Caltech-101)
    "slash": _slash,  # "/" reads as "-": ELEVATER's "F-16A-B", "F-A-18" are CuPL's "F-16A/B", "F/A-18"
    "year": _year,  # a leading year moves to the end: CoOp's "2012 Tesla Model S Sedan" = "Tesla Model S Sedan 2012"
    "case": _case,  # letter case and "_" vs " " ignored: torchvision's CIFAR "maple_tree" = "maple tree"
}


@dataclass(frozen=True)
class AliasTable:
    """Hand-checked pairs for one file (data/aliases.json): our class name -> the file's name; an entry with an
    index applies only to the class at that index (for names our class list holds more than once)."""

    by_name: Mapping[str, str] = field(default_factory=dict)
    by_index: Mapping[tuple[int, str], str] = field(default_factory=dict)


@functools.cache
def alias_table(file: str) -> AliasTable:
    entries = _data("aliases.json").get(file, [])
    by_name = {e["class"]: e["alias"] for e in entries if "index" not in e}
    by_index = {(int(e["index"]), e["class"]): e["alias"] for e in entries if "index" in e}
    return AliasTable(by_name, by_index)


@dataclass(frozen=True)
class Match:
    """How one of our classes was found in a table: `name` as the file spells it (None: missing) and `how`
    ("exact", "alias", a rule name of ALIAS_RULES, or "missing")."""

    name: str | None
    how: str


def resolve(class_names: Sequence[str], table: KnowledgeTable, aliases: AliasTable | None = None) -> list[Match]:
    """Find each class of `class_names` (in order) in `table`; `aliases` defaults to the file's alias table."""
    aliases = alias_table(table.file) if aliases is None else aliases
    taken = {name for name in class_names if name in table.entries}  # exact matches are never given to another class
    normal_forms = {
        rule: _unique_forms(rule_fn, [n for n in table.entries if n not in taken]) for rule, rule_fn in ALIAS_RULES.items()
    }
    return [_match(index, name, table, aliases, normal_forms) for index, name in enumerate(class_names)]


def _unique_forms(rule: Callable[[str], str], names: list[str]) -> dict[str, str | None]:
    forms: dict[str, str | None] = {}
    shared = set()
    for name in names:
        form = rule(name)
        if form in forms:
            shared.add(form)
        forms[form] = name
    return {form: None if form in shared else name for form, name in forms.items()}  # shared forms match nothing


def _match(index: int, name: str, table: KnowledgeTable, aliases: AliasTable, normal_forms: Mapping) -> Match:
    """An alias for this index comes first (a repeated name: the file may use the name for the other class), then
    the exact name, then an alias for the name, then the rules."""
    by_index = aliases.by_index.get((index, name))
    if by_index is not None and by_index in table.entries:
        return Match(by_index, "alias")
    if name in table.entries:
        return Match(name, "exact")
    alias = aliases.by_name.get(name)
    if alias is not None and alias in table.entries:
        return Match(alias, "alias")
    for rule, rule_fn in ALIAS_RULES.items():
        found = normal_forms[rule].get(rule_fn(name))
        if found is not None:
            return Match(found, rule)
    return Match(None, "missing")


def lookup(class_names: Sequence[str], table: KnowledgeTable) -> list[tuple[Match, Any]]:
    """(match, value) per class; the value is None where the class is missing (see `Match.name`)."""
    return [(m, table.entries[m.name] if m.name is not None else None) for m in resolve(class_names, table)]


def coverage_counts(class_names: Sequence[str], table: KnowledgeTable) -> dict[str, int]:
    """{"classes", "covered", "empty", "null", "missing"} of our classes in one table."""
    counts = {"classes": len(class_names), **dict.fromkeys(STATUSES, 0)}
    for match, value in lookup(class_names, table):
        counts["missing" if match.name is None else entry_status(value)] += 1
    return counts
