"""The papers' tables as package data: one JSON file per paper table, `vlbench/reference/data/<paper>_<table>.json`.

A file: {"paper", "table", "title", "source", "settings", "how_to_run", "rows", "notes"?}; a row:
{"model" (a conf/model slug or null), "model_name", "analysis", "dataset" (a registry name, "average", or the
paper's name), "metric", "value" (vlbench units: fractions for accuracy-like metrics), "published" (as printed),
"spread" (null or {"kind": std|ci95|sem, "value"}), "settings", "row", "column"}.

`metric` is the number's key in reports/metrics.json under analysis and dataset (`accuracy`, `acc_c_single`,
`fewtrans/base/linear`), or `dataset_metric`: each dataset's own metric (an `average` row's value is their mean
over `settings.datasets`, a list of registry names); an `adapt` row with `head` and `shots` settings names the key
`elevater/<head>/<shots>/<params.elevater.report or last>`. A row's settings are the table's overlaid with its
own (`Row.settings`); keys `model.<key>` and `params.<dotted path>` are checked against the run
(vlbench.reference.verdicts), any other key is words for the reader. `load_tables` validates every file and names
the file, row and key of any defect.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from vlbench.analyses import ANALYSES
from vlbench.errors import VlbenchError

DATA_DIR = Path(__file__).parent / "data"
PAPERS = ("elevater", "vtab", "openness", "granularity", "fewtrans", "open_clip", "mobileclip2", "pe", "siglip2")
SPREAD_KINDS = ("std", "ci95", "sem")
# metrics that are fractions in vlbench (a published percentage is divided by 100)
FRACTION_METRICS = re.compile(r"^(accuracy|mean_per_class|map_11point|roc_auc|map|dataset_metric|acc_[ces](_[a-z0-9]+)?"
                              r"|leaf_map|coarse_map(_[a-z]+)?|(i2t|t2i)_r\d+|mean_recall_at_1|winogavil_jaccard|f1_macro"
                              r"|worst_group_accuracy|worst_group_top5)$")
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")
_TABLE_KEYS = {"paper": str, "table": str, "title": str, "source": str, "settings": dict, "how_to_run": str,
               "rows": list}
_ROW_KEYS = {"model": (str, type(None)), "model_name": str, "analysis": str, "dataset": str, "metric": str,
             "value": (int, float), "published": str, "spread": (dict, type(None)), "settings": dict, "row": str,
             "column": str}


class ReferenceDataError(VlbenchError):
    """A reference data file that does not follow the schema; the message names the file, row and key."""


class UnknownPaperError(VlbenchError):
    """A paper name that has no reference tables."""


@dataclass(frozen=True)
class Row:
    model: str | None
    model_name: str
    analysis: str
    dataset: str
    metric: str
    value: float
    published: str
    spread: dict[str, Any] | None
    settings: dict[str, Any]  # the table's settings overlaid with the row's own
    row: str
    column: str


@dataclass(frozen=True)
class Table:
    file: str
    paper: str
    table: str
    title: str
    source: str
    settings: dict[str, Any]
    how_to_run: str
    rows: tuple[Row, ...]
    notes: str | list[str] | None = None

    def summary(self) -> dict[str, Any]:
        """The `vlbench reference --json` entry of this table (README, "Reference numbers")."""
        return {"file": self.file, "paper": self.paper, "table": self.table, "title": self.title,
                "source": self.source, "settings": self.settings, "how_to_run": self.how_to_run,
                "notes": self.notes, "models": sorted({r.model for r in self.rows if r.model}),
                "rows": [row_json(r, self) for r in self.rows]}


def row_json(row: Row, table: Table) -> dict[str, Any]:
    own = {k: v for k, v in row.settings.items() if table.settings.get(k, _MISSING) != v}
    return {"model": row.model, "model_name": row.model_name, "analysis": row.analysis, "dataset": row.dataset,
            "metric": row.metric, "value": row.value, "published": row.published, "spread": row.spread,
            "settings": own, "row": row.row, "column": row.column}


_MISSING = object()


def published_number(published: str) -> tuple[float, int] | None:
    """(the first number printed, its decimals), e.g. '71.2±0.3' -> (71.2, 1)."""
    m = _NUMBER.search(published)
    if m is None:
        return None
    text = m.group(0)
    return float(text), len(text.split(".")[1]) if "." in text else 0


def published_scale(value: float, published: str) -> float:
    """1 when `value` is the printed number, 0.01 when it is the printed percentage as a fraction."""
    number, _ = published_number(published) or (value, 0)
    return 0.01 if not math.isclose(value, number, abs_tol=1e-9) and math.isclose(value, number / 100,
                                                                                  abs_tol=1e-9) else 1.0


def _check_keys(obj: Any, keys: Mapping[str, Any], where: str) -> None:
    if not isinstance(obj, dict):
        raise ReferenceDataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    for key, kind in keys.items():
        if key not in obj:
            raise ReferenceDataError(f"{where}: key {key!r} missing (required: {', '.join(keys)})")
        if not isinstance(obj[key], kind) or isinstance(obj[key], bool):
            expected = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
            raise ReferenceDataError(f"{where}: key {key!r} has type {type(obj[key]).__name__}; expected {expected}")


def _check_row(raw: Any, where: str) -> None:
    _check_keys(raw, _ROW_KEYS, where)
    if raw["analysis"] not in ANALYSES:
        raise ReferenceDataError(f"{where}: analysis {raw['analysis']!r} is not one of {sorted(ANALYSES)}")
    value = float(raw["value"])
    if not math.isfinite(value):
        raise ReferenceDataError(f"{where}: value {raw['value']!r} is not a finite number")
    if FRACTION_METRICS.match(raw["metric"]) and not 0.0 <= value <= 1.0:
        raise ReferenceDataError(f"{where}: metric {raw['metric']!r} is a fraction in vlbench; value {value} is "
                                 f"outside [0, 1] (write 71.2% as 0.712)")
    number = published_number(raw["published"])
    if number is None:
        raise ReferenceDataError(f"{where}: published {raw['published']!r} holds no number; leave out a row whose "
                                 f"number cannot be read, and say so in the file's 'notes'")
    if not (math.isclose(value, number[0], abs_tol=1e-9) or math.isclose(value, number[0] / 100, abs_tol=1e-9)):
        raise ReferenceDataError(f"{where}: value {value} is neither the published number {number[0]} nor it / 100")
    spread = raw["spread"]
    if spread is not None:
        if set(spread) != {"kind", "value"} or spread["kind"] not in SPREAD_KINDS:
            raise ReferenceDataError(f"{where}: spread must be null or {{'kind': one of {list(SPREAD_KINDS)}, "
                                     f"'value': number}}; got {spread!r}")
        if (not isinstance(spread["value"], (int, float)) or isinstance(spread["value"], bool)
                or not math.isfinite(spread["value"]) or spread["value"] < 0):
            raise ReferenceDataError(f"{where}: spread value {spread['value']!r} must be a number >= 0")


def validate_table(obj: Any, file: str) -> Table:
    """A Table from one file's parsed JSON, or a ReferenceDataError naming the file, the row and the key."""
    _check_keys(obj, _TABLE_KEYS, file)
    if obj["paper"] not in PAPERS:
        raise ReferenceDataError(f"{file}: paper {obj['paper']!r} is not one of {list(PAPERS)}")
    notes = obj.get("notes")
    if notes is not None and not (isinstance(notes, str) or (isinstance(notes, list)
                                                             and all(isinstance(n, str) for n in notes))):
        raise ReferenceDataError(f"{file}: 'notes' must be a string or a list of strings")
    unknown = set(obj) - set(_TABLE_KEYS) - {"notes"}
    if unknown:
        raise ReferenceDataError(f"{file}: unknown keys {sorted(unknown)}; allowed: {[*_TABLE_KEYS, 'notes']}")
    rows = []
    for i, raw in enumerate(obj["rows"]):
        where = f"{file}: rows[{i}]" + (f" ({raw.get('row')!r} / {raw.get('column')!r})" if isinstance(raw, dict)
                                         else "")
        _check_row(raw, where)
        unknown = set(raw) - set(_ROW_KEYS)
        if unknown:
            raise ReferenceDataError(f"{where}: unknown keys {sorted(unknown)}; allowed: {list(_ROW_KEYS)}")
        rows.append(Row(**{**raw, "value": float(raw["value"]), "settings": {**obj["settings"], **raw["settings"]}}))
    if not rows:
        raise ReferenceDataError(f"{file}: 'rows' is empty")
    return Table(file=file, paper=obj["paper"], table=obj["table"], title=obj["title"], source=obj["source"],
                 settings=dict(obj["settings"]), how_to_run=obj["how_to_run"], rows=tuple(rows), notes=notes)


def load_table(path: Path) -> Table:
    try:
        obj = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ReferenceDataError(f"{Path(path).name}: not valid JSON ({err})") from err
    return validate_table(obj, Path(path).name)


def load_tables(paper: str | None = None, data_dir: Path = DATA_DIR) -> list[Table]:
    """Every table in `data_dir` (sorted by file name), or those of `paper`; each validated."""
    if paper is not None and paper not in PAPERS:
        raise UnknownPaperError(f"unknown paper {paper!r}; known papers: {', '.join(PAPERS)}")
    tables = [load_table(p) for p in sorted(Path(data_dir).glob("*.json"))]
    return [t for t in tables if paper is None or t.paper == paper]
