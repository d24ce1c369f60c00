"""`vlbench knowledge coverage`: counts per dataset and knowledge source from files in the download cache or the
mirror folder (never downloaded), checked against counts this test computes from the files itself; on ELEVATER's
20 datasets with the real files when ../shared/reference is present."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.test_knowledge_sources import (
    local_file,
    needs_reference,
    reference_paths,
    write_json,
)
from vlbench.cli import main
from vlbench.knowledge import sources
from vlbench.knowledge.coverage import (
    coverage_report,
    dataset_class_names,
    format_report,
)

ROOT = Path(__file__).resolve().parents[1]
ELEVATER = json.loads((ROOT / "vlbench" / "datasets" / "data" / "elevater.json").read_text())
STATUSES = ("covered", "empty", "null", "missing")


def status_of(value) -> str:
    """Independent of the library: null, empty (no non-blank text) or covered."""
    if value is None:
        return "null"
    texts = [value] if isinstance(value, str) else value
    return "covered" if any(t.strip() for t in texts) else "empty"


def expected_counts(class_names, entries: dict, renamed: dict | None = None) -> dict:
    """Counts from a {file name: value} mapping: our name, else the file's name given in `renamed`."""
    counts = {"classes": len(class_names), **dict.fromkeys(STATUSES, 0)}
    for name in class_names:
        key = name if name in entries else (renamed or {}).get(name)
        counts["missing" if key not in entries else status_of(entries[key])] += 1
    return counts


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """An empty working directory (no prepared data), an empty cache and a mirror folder."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "cache"))
    monkeypatch.setenv("VLBENCH_MIRROR", str(tmp_path / "mirror"))
    (tmp_path / "mirror").mkdir()
    return tmp_path


def use_files(monkeypatch, *paths: Path) -> None:
    """Known knowledge files: the real registry, with these test files (real names, own checksums) in place."""
    files = dict(sources.knowledge_files())
    for path in paths:
        files[path.name] = local_file(path, files[path.name].family, files[path.name].key)
    monkeypatch.setattr(sources, "knowledge_files", lambda: files)


def cifar10_fixture(mirror: Path) -> tuple[Path, Path]:
    """ELEVATER-format files for CIFAR-10 with every case: covered, empty, null, missing, a respelled name."""
    names = ELEVATER["cifar-10"]["classes"]
    external = [{"classname": n, "def_wiki": f"A {n}.", "path_wn": [n, "thing"], "def_wn": f"the {n}"}
                for n in names[:6]]
    external[1]["classname"] = external[1]["classname"].upper()  # "AUTOMOBILE": found by the case rule
    external += [{"classname": names[6], "def_wiki": "", "path_wn": "", "def_wn": ""},
                 {"classname": names[7], "def_wiki": None, "path_wn": "", "def_wn": "   "}]  # names[8:] missing
    gpt3 = [{"classname": n, "gpt3": [f" {n} item."]} for n in names[:8]]
    gpt3 += [{"classname": names[8], "gpt3": None}, {"classname": names[9], "gpt3": [" "]}]
    return (write_json(mirror / "cifar-10_knowledge.tsv", external),
            write_json(mirror / "sub" / "GPT3_cifar-10.tsv", gpt3))


def test_counts_per_source_match_the_files(isolated, monkeypatch):
    external, gpt3 = cifar10_fixture(isolated / "mirror")
    use_files(monkeypatch, external, gpt3)
    report = coverage_report({"cifar-10": {"prepare": {"source": "elevater"}}})
    names = ELEVATER["cifar-10"]["classes"]
    records = json.loads(external.read_text())
    respelled = {names[1]: names[1].upper()}
    for source, key in (("wiktionary", "def_wiki"), ("wordnet_definition", "def_wn"), ("wordnet_path", "path_wn")):
        entries = {r["classname"]: r[key] for r in records}
        assert report.counts["cifar-10"][source] == expected_counts(names, entries, respelled), source
    entries = {r["classname"]: r["gpt3"] for r in json.loads(gpt3.read_text())}
    assert report.counts["cifar-10"]["gpt3"] == expected_counts(names, entries)
    assert report.counts["cifar-10"]["wiktionary"] == {"classes": 10, "covered": 6, "empty": 1, "null": 1, "missing": 2}
    assert report.counts["cifar-10"]["gpt3"] == {"classes": 10, "covered": 8, "empty": 1, "null": 1, "missing": 0}
    assert report.renamed["cifar-10", "wiktionary"] == 1
    # CuPL's CIFAR-10 file is in neither place: said, not counted, not downloaded
    assert [(a.file, a.sources) for a in report.absent] == [("cifar10_prompts_base.json", ("cupl",))]
    assert "cupl" not in report.counts["cifar-10"] and not (isolated / "cache").exists()
    write_json(isolated / "mirror" / "cifar10_prompts_base.json", {"airplane": ["not the upstream file"]})
    notes = coverage_report({"cifar-10": {"prepare": {"source": "elevater"}}}).notes()
    assert notes[0] == "cifar-10: not counted, absent: cifar10_prompts_base.json (cupl)"
    assert notes[1].startswith(f"  wrong copy: {isolated / 'mirror' / 'cifar10_prompts_base.json'} has sha256 ")


def test_cli_json_and_table(isolated, monkeypatch):
    conf = isolated / "conf"
    (conf / "dataset").mkdir(parents=True)
    (conf / "config.yaml").write_text("defaults: []\n")
    (conf / "dataset" / "cifar-10.yaml").write_text("prepare: {source: elevater}\n")
    (conf / "dataset" / "shapes.yaml").write_text("prepare: {source: synthetic}\n")
    (conf / "dataset" / "coop-cars.yaml").write_text("prepare: {source: coop}\n")
    (conf / "dataset" / "coop-pets.yaml").write_text("prepare: {source: coop}\n")
    # coop-cars is prepared, with CoOp's year-first names; ELEVATER's Stanford Cars file has the year last
    ours = ["2012 Tesla Model S Sedan", "2000 AM General Hummer SUV", "2012 Ram C/V Cargo Van Minivan"]
    write_json(isolated / "data" / "prepared" / "coop-cars" / "classes.json",
               {"classes": [{"index": i, "name": n} for i, n in enumerate(ours)]})
    cars = write_json(isolated / "mirror" / "stanford-cars_knowledge.tsv", [
        {"classname": n, "def_wiki": None, "path_wn": "", "def_wn": ""}
        for n in ("Tesla Model S Sedan 2012", "AM General Hummer SUV 2000")])
    use_files(monkeypatch, *cifar10_fixture(isolated / "mirror"), cars)

    result = CliRunner().invoke(main, ["--conf", str(conf), "knowledge", "coverage", "--json"])
    assert result.exit_code == 0, result.output
    counts = json.loads(result.stdout)
    assert sorted(counts) == ["cifar-10", "coop-cars"]
    assert counts["coop-cars"] == {
        "wiktionary": {"classes": 3, "covered": 0, "empty": 0, "null": 2, "missing": 1},
        "wordnet_definition": {"classes": 3, "covered": 0, "empty": 2, "null": 0, "missing": 1},
        "wordnet_path": {"classes": 3, "covered": 0, "empty": 2, "null": 0, "missing": 1}}
    assert all(set(per) == {"classes", *STATUSES} for d in counts.values() for per in d.values())
    assert ("coop-cars: not counted, absent: GPT3_stanford-cars.tsv (gpt3); cars_prompts_base.json (cupl)\n"
            in result.stderr)
    assert f"(absent: not in the download cache {isolated / 'cache'} and the mirror folder" in result.stderr
    assert "shapes: no knowledge vocabulary is bound to this dataset" in result.stderr
    assert "coop-pets: class names are known once the dataset is prepared" in result.stderr

    table = CliRunner().invoke(main, ["--conf", str(conf), "knowledge", "coverage"])
    assert table.exit_code == 0, table.output
    row = next(line for line in table.stdout.splitlines() if line.startswith("coop-cars") and " wiktionary " in line)
    assert row.split()[2:7] == ["3", "0", "0", "2", "1"] and "(2 by alias or rule)" in row


def test_a_mirror_folder_that_does_not_exist_is_an_error(isolated, monkeypatch):
    monkeypatch.setenv("VLBENCH_MIRROR", str(isolated / "nowhere"))
    conf = isolated / "conf"
    (conf / "dataset").mkdir(parents=True)
    (conf / "config.yaml").write_text("defaults: []\n")
    (conf / "dataset" / "dtd.yaml").write_text("prepare: {source: elevater}\n")
    result = CliRunner().invoke(main, ["--conf", str(conf), "knowledge", "coverage"])
    assert result.exit_code == 1 and "the local mirror folder" in result.output and "nowhere" in result.output


def test_class_names_come_from_prepared_data_first(isolated):
    assert dataset_class_names("dtd", {"prepare": {"source": "elevater"}}) == ELEVATER["dtd"]["classes"]
    assert dataset_class_names("my-dtd", {"prepare": {"source": "elevater", "dataset": "dtd"}}) == ELEVATER["dtd"]["classes"]
    assert dataset_class_names("mine", {"prepare": {"source": "manifest", "classnames": ["a", "b"]}}) == ["a", "b"]
    assert dataset_class_names("coop-pets", {"prepare": {"source": "coop"}}) is None
    write_json(isolated / "data" / "prepared" / "dtd" / "classes.json", {"classes": [{"index": 0, "name": "x"}]})
    assert dataset_class_names("dtd", {"prepare": {"source": "elevater"}}) == ["x"]


# ---------------------------------------------------------------------------------------------------- real files

# Where CuPL's or Menon's files spell one of ELEVATER's (= CLIP's, for ImageNet) class names differently, checked
# by hand against the files: (vocabulary, file, our class name, index) -> the file's name.
RENAMED = {
    ("fgvc-aircraft-2013b-variants102", "airplane_prompts_base.json", "F-16A-B", None): "F-16A/B",
    ("fgvc-aircraft-2013b-variants102", "airplane_prompts_base.json", "F-A-18", None): "F/A-18",
    ("caltech-101", "cal_prompts_base.json", "head of a  crocodile", None): "head of a crocodile",
    ("stanford-cars", "cars_prompts_base.json", "Ram C V Cargo Van Minivan 2012", None): "Ram CV Cargo Van Minivan 2012",
    ("imagenet-1k", "descriptors_imagenet.json", "newt", 27): "eft",
    ("imagenet-1k", "descriptors_imagenet.json", "tights", 638): "maillot",
    ("imagenet-1k", "descriptors_imagenet.json", "missile", 744): "projectile",
    ("imagenet-1k", "descriptors_imagenet.json", "sunglasses", 836): "sunglass",
}
EXTERNAL_KEYS = {"wiktionary": "def_wiki", "wordnet_definition": "def_wn", "wordnet_path": "path_wn"}


def independent_counts(vocabulary: str, file: Path) -> dict[str, dict]:
    """Counts of one real file for one ELEVATER vocabulary, computed from the raw JSON by this test."""
    names = ELEVATER[vocabulary]["classes"]
    raw = json.loads(file.read_text())
    if file.name.endswith("_knowledge.tsv"):
        return {source: expected_counts(names, {r["classname"]: r[key] for r in raw})
                for source, key in EXTERNAL_KEYS.items()}
    if file.name.startswith("GPT3_"):
        return {"gpt3": expected_counts(names, {r["classname"]: r["gpt3"] for r in raw})}
    raw = raw.get("imagenet1k", raw)
    counts = {"classes": len(names), **dict.fromkeys(STATUSES, 0)}
    for index, name in enumerate(names):
        key = next((v for (voc, f, n, i), v in RENAMED.items()
                    if (voc, f, n) == (vocabulary, file.name, name) and i in (None, index)), name)
        counts["missing" if key not in raw else status_of(raw[key])] += 1
    return {"menon" if file.name.startswith("descriptors_") else "cupl": counts}


@needs_reference
def test_elevater_suite_coverage_on_the_real_files(isolated):
    for name, path in reference_paths().items():
        (isolated / "mirror" / name).symlink_to(path)
    result = CliRunner().invoke(main, ["--conf", str(ROOT / "conf"), "knowledge", "coverage", "--suite", "elevater",
                                       "--json"])
    assert result.exit_code == 0, result.output
    counts = json.loads(result.stdout)
    datasets = [d for d in ELEVATER if not d.startswith("_") and d != "imagenet-1k"]
    assert sorted(counts) == sorted(datasets) and len(datasets) == 20
    assert sum(c["wiktionary"]["classes"] for c in counts.values()) == 1151
    for dataset in datasets:
        expected = {}
        for name in sources.vocabularies()[dataset]:
            expected.update(independent_counts(dataset, reference_paths()[name]))
        assert counts[dataset] == expected, dataset
    assert counts["stanford-cars"]["wiktionary"] == {"classes": 196, "covered": 0, "empty": 0, "null": 196, "missing": 0}
    assert result.stderr == ""  # every file found, every dataset bound


@needs_reference
def test_imagenet_coverage_on_the_real_files(isolated):
    for name, path in reference_paths().items():
        (isolated / "mirror" / name).symlink_to(path)
    report = coverage_report({"imagenet-1k": {"prepare": {"source": "elevater"}}})
    assert not report.absent
    expected = {}
    for name in sources.vocabularies()["imagenet-1k"]:
        expected.update(independent_counts("imagenet-1k", reference_paths()[name]))
    assert report.counts["imagenet-1k"] == expected
    assert report.counts["imagenet-1k"]["menon"] == {"classes": 1000, "covered": 1000, "empty": 0, "null": 0,
                                                     "missing": 0}
    assert report.renamed["imagenet-1k", "menon"] == 4
    assert "imagenet-1k" in format_report(report)
