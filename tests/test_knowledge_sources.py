"""Knowledge sources: parsers of ELEVATER's knowledge files, CuPL and Menon & Vondrick files (on miniatures in the
exact upstream formats, and on every real copy in ../shared/reference when present), name matching, resources."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from tests.http_server import serve
from vlbench.datasets.download import Resource
from vlbench.knowledge import sources
from vlbench.knowledge.sources import (
    AliasTable,
    KnowledgeError,
    KnowledgeFile,
    KnowledgeTable,
    coverage_counts,
    entry_status,
    find_local,
    parse_descriptions,
    parse_elevater_external,
    parse_elevater_gpt3,
    resolve,
    search_places,
    vocabulary_for,
)

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference"
needs_reference = pytest.mark.skipif(not (REFERENCE / "SHA256SUMS").is_file(), reason="../shared/reference is absent")

# The upstream formats: ELEVATER writes each `.tsv` with json.dump (one JSON list on one line); CuPL and Menon
# files are JSON objects {classname: [texts]}; CLIP_benchmark nests CuPL's ImageNet prompts under "imagenet1k".
EXTERNAL = [
    {"classname": "cat", "def_wiki": "A small domesticated carnivorous mammal.", "path_wn": ["cat", "feline", "carnivore",
     "placental", "mammal"], "def_wn": "feline mammal usually having thick soft fur"},
    {"classname": "dog", "def_wiki": None, "path_wn": "", "def_wn": ""},
    {"classname": "F-16A/B", "def_wiki": "", "path_wn": ["fighter"], "def_wn": "a fast plane"},
    {"classname": "cat", "def_wiki": "The last cat entry wins.", "path_wn": ["cat"], "def_wn": "x"},
]
GPT3 = [
    {"classname": "cat", "gpt3": [" Cats purr.", " They hunt mice.", "", " Whiskers."]},
    {"classname": "dog", "gpt3": []},
    {"classname": "bird", "gpt3": None},
]
DESCRIPTIONS = {"cat": ["\nA photo of a cat, a small pet.", "Cats have whiskers."], "tench": [], "eel": None}


def write_json(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def local_file(path: Path, family: str, key: str | None = None, urls=()) -> KnowledgeFile:
    """A KnowledgeFile for a test's own file (its real name, its own checksum)."""
    return KnowledgeFile(family, Resource(path.name, tuple(urls), sha256=sha256(path)), f"test:{path.name}", key)


# ---------------------------------------------------------------------------------------------------- parsers


def test_external_file_gives_three_tables_last_entry_wins(tmp_path):
    tables = parse_elevater_external(write_json(tmp_path / "toy_knowledge.tsv", EXTERNAL))
    assert sorted(tables) == ["wiktionary", "wordnet_definition", "wordnet_path"]
    wiki, wn_def, wn_path = tables["wiktionary"], tables["wordnet_definition"], tables["wordnet_path"]
    assert len(wiki) == 3 and wiki.duplicates == ("cat",) and wiki.file == "toy_knowledge.tsv"
    assert wiki.entries == {"cat": "The last cat entry wins.", "dog": None, "F-16A/B": ""}
    assert wn_path.entries["dog"] == "" and wn_path.entries["F-16A/B"] == ["fighter"]
    assert [entry_status(wn_def.entries[n]) for n in ("cat", "dog", "F-16A/B")] == ["covered", "empty", "covered"]
    assert [entry_status(wiki.entries[n]) for n in ("cat", "dog", "F-16A/B")] == ["covered", "null", "empty"]


def test_gpt3_and_description_files(tmp_path):
    gpt3 = parse_elevater_gpt3(write_json(tmp_path / "GPT3_toy.tsv", GPT3))
    assert gpt3.source == "gpt3" and gpt3.entries["cat"][1] == " They hunt mice."
    assert [entry_status(gpt3.entries[n]) for n in ("cat", "dog", "bird")] == ["covered", "empty", "null"]
    cupl = parse_descriptions(write_json(tmp_path / "toy_prompts_base.json", DESCRIPTIONS), "cupl")
    assert cupl.entries["cat"][0].startswith("\nA photo") and entry_status(cupl.entries["tench"]) == "empty"
    nested = write_json(tmp_path / "cupl_prompts.json", {"imagenet1k": DESCRIPTIONS})
    assert parse_descriptions(nested, "cupl", key="imagenet1k").entries == DESCRIPTIONS


def test_entry_status_counts_blank_text_as_empty():
    assert [entry_status(v) for v in ("x", " ", "", None, [" ", ""], ["", "y"], [])] == [
        "covered", "empty", "empty", "null", "empty", "covered", "empty"]


@pytest.mark.parametrize("data, message", [
    ({"classname": "cat"}, r"expected one JSON list .* got a JSON dict"),
    (["cat"], r"entry 0 must be an object"),
    ([{"classname": "cat", "def_wiki": "x", "def_wn": "y"}], r"entry 0 \('cat'\) lacks key\(s\) \['path_wn'\]"),
    ([{"classname": "", "def_wiki": "x", "path_wn": [], "def_wn": "y"}], r"entry 0: 'classname' must be a non-empty"),
    ([{"classname": "cat", "def_wiki": 3, "path_wn": [], "def_wn": "y"}], r"\('cat'\) key 'def_wiki' must be a string or"),
    ([{"classname": "cat", "def_wiki": "x", "path_wn": [1], "def_wn": "y"}], r"key 'path_wn' must be a string, a list"),
])
def test_malformed_external_file_names_file_entry_and_key(tmp_path, data, message):
    path = write_json(tmp_path / "bad_knowledge.tsv", data)
    with pytest.raises(KnowledgeError, match=message) as err:
        parse_elevater_external(path)
    assert str(path) in str(err.value)


def test_malformed_files_are_clear_errors(tmp_path):
    broken = tmp_path / "GPT3_broken.tsv"
    broken.write_text('[{"classname": "cat", "gpt3": ["a"]}')
    with pytest.raises(KnowledgeError, match=r"GPT3_broken.tsv: not valid JSON \(line 1, column 37\)"):
        parse_elevater_gpt3(broken)
    with pytest.raises(KnowledgeError, match=r"entry 0 \('cat'\) key 'gpt3' must be a list of strings or null"):
        parse_elevater_gpt3(write_json(tmp_path / "GPT3_x.tsv", [{"classname": "cat", "gpt3": "purrs"}]))
    with pytest.raises(KnowledgeError, match=r"expected a top-level key 'imagenet1k', found \['cars'\]"):
        parse_descriptions(write_json(tmp_path / "n.json", {"cars": {}}), "cupl", key="imagenet1k")
    with pytest.raises(KnowledgeError, match=r"class 'cat' must map to a list of strings"):
        parse_descriptions(write_json(tmp_path / "d.json", {"cat": "whiskers"}), "menon")
    with pytest.raises(KnowledgeError, match=r"cannot read the knowledge file"):
        parse_descriptions(tmp_path / "absent.json", "menon")


# ---------------------------------------------------------------------------------------------------- names


def table(*names: str, file: str = "t.json") -> KnowledgeTable:
    return KnowledgeTable("cupl", file, {n: [f"about {n}"] for n in names})


def test_names_found_exactly_by_alias_and_by_each_rule():
    file_names = ("head of a crocodile", "F-16A/B", "Tesla Model S Sedan 2012", "maple tree", "cat", "eft")
    ours = ["cat", "head of a  crocodile", "F-16A-B", "2012 Tesla Model S Sedan", "maple_tree", "newt", "unicorn"]
    found = resolve(ours, table(*file_names), AliasTable({"newt": "eft"}))
    assert [(m.name, m.how) for m in found] == [
        ("cat", "exact"), ("head of a crocodile", "spacing"), ("F-16A/B", "slash"),
        ("Tesla Model S Sedan 2012", "year"), ("maple tree", "case"), ("eft", "alias"), (None, "missing")]


def test_an_index_alias_separates_a_repeated_name():
    # ImageNet's CLIP names hold "missile" at 657 and 744; Menon's file calls 744 "projectile"
    ours = ["missile", "projectile launcher", "missile"]
    aliases = AliasTable(by_index={(2, "missile"): "projectile"})
    assert [m.name for m in resolve(ours, table("missile", "projectile"), aliases)] == ["missile", None, "projectile"]


def test_a_rule_never_guesses_between_two_names_or_takes_an_exact_match():
    assert resolve(["Maple Tree"], table("maple tree", "maple_tree"), AliasTable())[0].how == "missing"
    # "cat" is our exact match, so rules do not give it to "Cat" as well
    assert [m.name for m in resolve(["cat", "Cat"], table("cat"), AliasTable())] == ["cat", None]


def test_the_alias_data_tables_are_well_formed():
    aliases = json.loads((sources.DATA_DIR / "aliases.json").read_text())
    for file, entries in aliases.items():
        if file.startswith("_"):
            continue
        assert file in sources.knowledge_files(), file
        for entry in entries:
            assert {"class", "alias", "why"} <= set(entry) <= {"class", "alias", "why", "index"}
    menon = sources.alias_table("descriptors_imagenet.json")
    assert menon.by_name["newt"] == "eft" and menon.by_index[744, "missile"] == "projectile"


def test_coverage_counts_every_status():
    tables = {"x": KnowledgeTable("wiktionary", "f", {"a": "text", "b": "", "c": None, "D": "text"})}
    assert coverage_counts(["a", "b", "c", "d", "e"], tables["x"]) == {
        "classes": 5, "covered": 2, "empty": 1, "null": 1, "missing": 1}


# ---------------------------------------------------------------------------------------------------- resources


def upstream_files() -> dict:
    """The known files that come from an upstream repository (not the demo world's files this package ships)."""
    return {name: f for name, f in sources.knowledge_files().items() if f.local is None}


def test_every_knowledge_file_has_a_pinned_url_and_a_sha256():
    files = sources.knowledge_files()
    families = [f.family for f in upstream_files().values()]
    assert {fam: families.count(fam) for fam in set(families)} == {
        "elevater_external": 21, "elevater_gpt3": 21, "cupl": 12, "cupl_imagenet": 1, "menon": 7}
    for name, kfile in files.items():
        (url,) = kfile.resource.urls
        if kfile.local is not None:  # the demo world's files: shipped here, fetched from their file:// URL
            assert url == kfile.local.resolve().as_uri() and kfile.local.is_file()
            assert kfile.upstream == f"vlbench:demo/{name}" and re.fullmatch(r"[0-9a-f]{64}", kfile.resource.sha256)
            continue
        assert re.fullmatch(r"https://raw\.githubusercontent\.com/[\w.-]+/[\w.-]+/[0-9a-f]{40}/.+", url), url
        assert url.endswith("/" + name) and re.fullmatch(r"[0-9a-f]{64}", kfile.resource.sha256)
    for vocabulary, names in sources.vocabularies().items():
        assert all(n in files for n in names), vocabulary
    assert files["cupl_prompts.json"].key == "imagenet1k"


def test_vocabulary_binding():
    assert vocabulary_for("cifar-100", {"prepare": {"source": "elevater"}}) == "cifar-100"
    assert vocabulary_for("cars-again", {"prepare": {"source": "elevater", "dataset": "stanford-cars"}}) == "stanford-cars"
    assert vocabulary_for("coop-cars", {}) == "stanford-cars"
    assert vocabulary_for("shapes", {"texts": {"templates": ["a {c}."]}}) is None
    assert vocabulary_for("my-cars", {"texts": {"knowledge": "stanford-cars"}}) == "stanford-cars"
    with pytest.raises(KnowledgeError, match=r"dataset 'my-cars': texts.knowledge 'cars' is not a knowledge vocab"):
        vocabulary_for("my-cars", {"texts": {"knowledge": "cars"}})
    assert [f.name for f in sources.vocabulary_files("dtd")] == [
        "dtd_knowledge.tsv", "GPT3_dtd.tsv", "texture_prompts_base.json", "descriptors_dtd.json"]


def test_a_file_is_downloaded_verified_and_recorded(tmp_path, monkeypatch):
    www = write_json(tmp_path / "www" / "GPT3_toy.tsv", GPT3).parent
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "cache"))
    monkeypatch.delenv("VLBENCH_MIRROR", raising=False)
    with serve(www) as base_url:
        kfile = local_file(www / "GPT3_toy.tsv", "elevater_gpt3", urls=[f"{base_url}/GPT3_toy.tsv"])
        path = kfile.fetch("toy", progress=False)
    assert path == tmp_path / "cache" / "GPT3_toy.tsv"
    assert kfile.parse(path)["gpt3"].entries["dog"] == []
    record = kfile.provenance(path)
    assert record["sha256"] == kfile.resource.sha256 and record["verified"] and record["upstream"] == "test:GPT3_toy.tsv"


def test_find_local_reads_cache_then_mirror_and_never_downloads(tmp_path):
    original = write_json(tmp_path / "orig" / "dtd_knowledge.tsv", EXTERNAL)
    kfile = local_file(original, "elevater_external", urls=["http://127.0.0.1:9/never"])
    cache, mirror = tmp_path / "cache", tmp_path / "mirror"
    (mirror / "elevater").mkdir(parents=True)
    assert find_local(kfile, cache, mirror) == (None, [])
    assert search_places(cache, mirror) == f"the download cache {cache} and the mirror folder {mirror}"
    assert not cache.exists()  # read only: nothing created
    (mirror / "elevater" / "dtd_knowledge.tsv").write_bytes(original.read_bytes())
    assert find_local(kfile, cache, mirror) == (mirror / "elevater" / "dtd_knowledge.tsv", [])
    write_json(cache / "dtd_knowledge.tsv", [])  # a cached copy with the wrong content is named, then skipped
    path, mismatches = find_local(kfile, cache, mirror)
    assert path == mirror / "elevater" / "dtd_knowledge.tsv"
    wrong = cache / "dtd_knowledge.tsv"
    assert mismatches == [f"{wrong} has sha256 {sha256(wrong)}, expected {kfile.resource.sha256}"]
    (mirror / "elevater" / "dtd_knowledge.tsv").unlink()
    assert find_local(kfile, cache, mirror) == (None, mismatches)


# ---------------------------------------------------------------------------------------------------- real files


def reference_paths() -> dict[str, Path]:
    """File name -> the shared reference copy, for every known knowledge file."""
    found = {p.name: p for p in REFERENCE.rglob("*") if p.is_file()}
    return {name: found[name] for name in upstream_files() if name in found}


@needs_reference
def test_every_real_file_matches_its_checksum_and_every_entry_parses():
    paths = reference_paths()
    assert len(paths) == len(upstream_files()) == 62
    entries = {}
    for name, kfile in upstream_files().items():
        assert sha256(paths[name]) == kfile.resource.sha256, name
        tables = kfile.parse(paths[name])
        raw = json.loads(paths[name].read_text())
        raw = raw[kfile.key] if kfile.key else raw
        names = [r["classname"] for r in raw] if isinstance(raw, list) else list(raw)
        for table in tables.values():
            assert set(table.entries) == set(names) and len(table.duplicates) == len(names) - len(set(names))
            for value in table.entries.values():
                entry_status(value)
        entries[kfile.family] = entries.get(kfile.family, 0) + len(names)
    # ELEVATER's 20 datasets have 1,151 classes, ImageNet 1,000 (998 distinct CLIP names in the GPT-3 file)
    assert entries == {"elevater_external": 1151 + 1000, "elevater_gpt3": 1151 + 998, "cupl": 1737, "cupl_imagenet": 998,
                       "menon": 1760}
    imagenet = sources.knowledge_files()["imagenet-1k_knowledge.tsv"].parse(paths["imagenet-1k_knowledge.tsv"])
    assert imagenet["wiktionary"].duplicates == ("missile", "sunglasses")
