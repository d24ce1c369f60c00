"""Knowledge coverage per dataset and source, without running the pipeline and without any download.

`coverage_report(entries)` looks up each dataset's knowledge vocabulary (`sources.vocabulary_for`), finds every
knowledge file of it in the download cache or the local mirror folder (`sources.find_local`: verified by sha256,
read only), and counts for each knowledge source how many of the dataset's classes are covered (a usable,
non-blank entry), empty, null or missing. Its `counts` are the JSON of `vlbench knowledge coverage --json`:

    {dataset: {source: {"classes": n, "covered": k, "empty": e, "null": z, "missing": m}}}

A source whose file is absent is left out of `counts` and listed in `absent`, with the reason; datasets without
a vocabulary are listed in `unbound`, and those whose class names are known only once prepared in `unknown`.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vlbench.datasets.registry import DATASET_SOURCES
from vlbench.paths import prepared_dir
from vlbench.knowledge.sources import (
    KnowledgeFile,
    KnowledgeTable,
    coverage_counts,
    find_local,
    resolve,
    search_places,
    vocabulary_files,
    vocabulary_for,
)

COVERAGE_KEYS = ("classes", "covered", "empty", "null", "missing")
ELEVATER_DATA = Path(__file__).resolve().parents[1] / "datasets" / "data" / "elevater.json"


@dataclass(frozen=True)
class Absent:
    """A knowledge file of a dataset that is in neither the cache nor the mirror folder (`mismatches`: copies
    found with a wrong sha256), so its sources are not counted."""

    dataset: str
    file: str
    sources: tuple[str, ...]
    mismatches: tuple[str, ...] = ()


@dataclass
class CoverageReport:
    counts: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    vocabulary: dict[str, str] = field(default_factory=dict)  # dataset -> knowledge vocabulary
    files: dict[tuple[str, str], str] = field(default_factory=dict)  # (dataset, source) -> file name
    renamed: dict[tuple[str, str], int] = field(default_factory=dict)  # classes found by alias or rule
    absent: list[Absent] = field(default_factory=list)
    unbound: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    searched: str = ""  # where the files were looked for, in words

    def notes(self) -> list[str]:
        """What the counts leave out, one line per dataset: absent files (and wrong copies), datasets without a
        knowledge vocabulary, datasets whose class names are known once prepared."""
        per_dataset: dict[str, list[str]] = {}
        for a in self.absent:
            per_dataset.setdefault(a.dataset, []).append(f"{a.file} ({', '.join(a.sources)})")
        lines = [f"{name}: not counted, absent: {'; '.join(files)}" for name, files in per_dataset.items()]
        lines += [f"  wrong copy: {m}" for a in self.absent for m in a.mismatches]
        if self.absent:
            lines.append(f"  (absent: not in {self.searched}; nothing is downloaded here: the knowledge stage "
                         f"downloads these files, or put them in the local mirror folder, env VLBENCH_MIRROR)")
        lines += [f"{name}: no knowledge vocabulary is bound to this dataset" for name in self.unbound]
        lines += [f"{name}: class names are known once the dataset is prepared" for name in self.unknown]
        return lines


def dataset_class_names(name: str, entry: Mapping[str, Any]) -> list[str] | None:
    """The dataset's class names in class order: from its prepared classes.json, else without any download (its
    source module's `class_names(name, spec)` where it has one, ELEVATER's class list, a manifest's `classnames`
    list), else None (known once prepared)."""
    classes_json = prepared_dir(name) / "classes.json"
    if classes_json.is_file():
        return [c["name"] for c in json.loads(classes_json.read_text())["classes"]]
    spec = entry.get("prepare") or {}
    from_source = _source_class_names(name, spec)
    if from_source is not None:
        return from_source
    if spec.get("source") == "elevater":
        return _elevater_classes(str(spec.get("dataset", name)))
    if spec.get("source") == "manifest" and isinstance(spec.get("classnames"), list):
        return [str(c) for c in spec["classnames"]]
    return None


def _source_class_names(name: str, spec: Mapping[str, Any]) -> list[str] | None:
    """The class names a source module knows without data: its optional `class_names(name, spec)`."""
    module_name = DATASET_SOURCES.get(spec.get("source"), "").split(":")[0]
    if not module_name or importlib.util.find_spec(module_name) is None:
        return None
    known = getattr(importlib.import_module(module_name), "class_names", None)
    names = known(name, dict(spec)) if callable(known) else None
    return None if names is None else [str(n) for n in names]


def _elevater_classes(name: str) -> list[str] | None:
    data = json.loads(ELEVATER_DATA.read_text(encoding="utf-8")) if ELEVATER_DATA.is_file() else {}
    return list(data[name]["classes"]) if name in data else None


def coverage_report(entries: Mapping[str, Mapping[str, Any]], cache: str | Path | None = None,
                    mirror: str | Path | None = None) -> CoverageReport:
    report = CoverageReport(searched=search_places(cache, mirror))
    parsed: dict[str, dict[str, KnowledgeTable] | list[str]] = {}  # file name -> tables, or wrong copies found
    for name, entry in entries.items():
        vocabulary = vocabulary_for(name, entry)
        if vocabulary is None:
            report.unbound.append(name)
            continue
        report.vocabulary[name] = vocabulary
        class_names = dataset_class_names(name, entry)
        if class_names is None:
            report.unknown.append(name)
            continue
        for kfile in vocabulary_files(vocabulary):
            tables = _tables(kfile, parsed, cache, mirror)
            if isinstance(tables, list):
                report.absent.append(Absent(name, kfile.name, kfile.sources, tuple(tables)))
                continue
            for source in kfile.sources:
                _count(report, name, source, kfile, class_names, tables[source])
    return report


def _tables(kfile: KnowledgeFile, parsed: dict, cache, mirror) -> dict[str, KnowledgeTable] | list[str]:
    if kfile.name not in parsed:
        path, mismatches = find_local(kfile, cache, mirror)
        parsed[kfile.name] = kfile.parse(path) if path is not None else mismatches
    return parsed[kfile.name]


def _count(report: CoverageReport, name: str, source: str, kfile: KnowledgeFile, class_names: list[str],
           table: KnowledgeTable) -> None:
    report.counts.setdefault(name, {})[source] = coverage_counts(class_names, table)
    report.files[name, source] = kfile.name
    report.renamed[name, source] = sum(m.how not in ("exact", "missing") for m in resolve(class_names, table))


def format_report(report: CoverageReport) -> str:
    """The report as a table, one line per dataset and source, then the notes."""
    rows = [(dataset, source, counts, report.files[dataset, source], report.renamed[dataset, source])
            for dataset, sources in report.counts.items() for source, counts in sources.items()]
    width = max([len("dataset")] + [len(r[0]) for r in rows])
    lines = [f"{'dataset':{width}s} {'source':18s} " + " ".join(f"{k:>7s}" for k in COVERAGE_KEYS) + "  file"]
    for dataset, source, counts, file, renamed in rows:
        note = f" ({renamed} by alias or rule)" if renamed else ""
        numbers = " ".join(f"{counts[k]:7d}" for k in COVERAGE_KEYS)
        lines.append(f"{dataset:{width}s} {source:18s} {numbers}  {file}{note}")
    if not rows:
        lines.append("(no knowledge file of these datasets is in the download cache or the mirror folder)")
    return "\n".join(lines + report.notes())
