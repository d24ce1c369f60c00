"""The canonical prepared-dataset format (DESIGN.md, "Data contracts").

`data/prepared/<dataset>/classes.json` describes the classes, task, metric and provenance (prompts are text
sets, vlbench/texts.py);
`<split>.parquet` holds `sample_id`, `label` (int) or `labels` (list<int>), `image` (encoded bytes as
distributed), optional `captions` and free metadata columns. Splits are written and read in row groups so
that no split is ever held in memory whole.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from vlbench.errors import VlbenchError
from vlbench.io import atomic_dir, sha256_file

TASKS = ("single-label", "multi-label", "captions")
METRICS = ("accuracy", "mean_per_class", "map_11point", "roc_auc", "f1_macro", "worst_group_accuracy", "worst_group_top5",
           "winogavil_jaccard")
GROUP_COLUMN = "group"  # optional per-sample group (region, income bucket) that group metrics are computed over
# provenance entry of a multi-objective dataset (DataComp's FairFace, UTKFace: classes '<objective>:<class>'):
# {"label": the objective that is `label`, "metadata": the per-sample integer columns, one per .npy element}
OBJECTIVES_KEY = "objectives"
# WinoGAViL: whether a candidate image is one of its instance's (its label's cue's) associations (datasets/winogavil.py)
ASSOCIATION_COLUMN = "association"
PREPROCESS_FILE = "preprocess.txt"  # in splits/, only when not "default"
# squash: resize to the model's square input without a centre crop (ELEVATER's KITTI distance, VTAB's 224 x 224);
# fewtrans: FewTrans' code (squash with bilinear resizing and ImageNet's mean and std); vlbench/embed.py PREPROCESS_MODES;
# objectnet: ObjectNet's border cropped off each side, then the model's own transform (vlbench/embed.py BORDER_CROPS)
PREPROCESS = ("default", "squash", "fewtrans", "objectnet")
ROWS_PER_GROUP = 256
SPLITS = "splits"  # the sub-folder of images and labels that image embedding depends on


class DatasetError(VlbenchError):
    """A prepared dataset is missing, malformed or inconsistent; the message names the file."""


@dataclass
class ClassInfo:
    """One class. `key` is its identifier in the source data when that differs from the index: the ImageFolder
    class folder or a manifest's label string; classes.json shows it right after the display `name`."""

    index: int
    name: str
    wnid: str | None = None
    group: str | None = None
    aliases: list[str] = field(default_factory=list)
    key: str | None = None

    def to_json(self) -> dict:
        fields = asdict(self)
        ordered = {"index": fields.pop("index"), "name": fields.pop("name"), "key": fields.pop("key"), **fields}
        return {k: v for k, v in ordered.items() if v not in (None, [])}


@dataclass
class DatasetMeta:
    """Everything in classes.json except the split sizes and the version, which writing fills in."""

    name: str
    task: str
    metric: str
    classes: list[ClassInfo]
    provenance: dict[str, Any] = field(default_factory=dict)
    splits: dict[str, int] = field(default_factory=dict)
    version: str = ""
    preprocess: str = "default"

    def __post_init__(self):
        if self.task not in TASKS:
            raise DatasetError(f"dataset {self.name!r}: task {self.task!r} is not one of {TASKS}")
        if self.metric not in METRICS:
            raise DatasetError(f"dataset {self.name!r}: metric {self.metric!r} is not one of {METRICS}")
        if self.preprocess not in PREPROCESS:
            raise DatasetError(f"dataset {self.name!r}: preprocess {self.preprocess!r} is not one of {PREPROCESS}")
        if [c.index for c in self.classes] != list(range(len(self.classes))):
            raise DatasetError(f"dataset {self.name!r}: class indices must be 0..{len(self.classes) - 1} in order")
        self._check_metric_applies()

    def _check_metric_applies(self) -> None:
        """Refuse a metric that `vlbench.metrics` could not compute on this task and class count."""
        n, problem = len(self.classes), None
        if self.metric == "map_11point" and not self.multi_label:
            problem = "11-point mAP needs multi-label targets"
        elif self.metric != "map_11point" and self.multi_label:
            problem = f"{self.metric} needs one integer label per sample; multi-label tasks use map_11point"
        elif self.metric == "roc_auc" and n != 2:
            problem = "ROC-AUC here is binary only (exactly 2 classes); use accuracy or mean_per_class"
        if problem:
            raise DatasetError(
                f"dataset {self.name!r}: metric {self.metric!r} cannot apply to a {self.task} task "
                f"with {n} class{'' if n == 1 else 'es'}: {problem}"
            )

    @property
    def multi_label(self) -> bool:
        return self.task == "multi-label"

    @property
    def label_column(self) -> str:
        """The one place that knows the label column: `labels` (list<int>) for multi-label data, else `label`."""
        return label_column(self.multi_label)

    @property
    def class_names(self) -> list[str]:
        return [c.name for c in self.classes]

    def to_json(self) -> dict:
        """`preprocess` appears only when not "default", so classes.json of existing datasets is unchanged."""
        return {
            "name": self.name,
            "version": self.version,
            "task": self.task,
            "metric": self.metric,
            **({"preprocess": self.preprocess} if self.preprocess != "default" else {}),
            "num_classes": len(self.classes),
            "classes": [c.to_json() for c in self.classes],
            "splits": dict(self.splits),
            "provenance": self.provenance,
        }

    @classmethod
    def from_json(cls, obj: dict) -> DatasetMeta:
        classes = [ClassInfo(**c) for c in obj["classes"]]
        return cls(
            name=obj["name"], task=obj["task"], metric=obj["metric"], classes=classes,
            provenance=obj.get("provenance", {}),
            splits=obj.get("splits", {}), version=obj.get("version", ""),
            preprocess=obj.get("preprocess", "default"),
        )


def objective_classes(meta: DatasetMeta) -> dict[str, list[int]]:
    """{objective: its class indices, in class order} of a multi-objective dataset (`provenance.objectives`), whose
    class names are '<objective>:<class>'; {} for any other dataset."""
    out: dict[str, list[int]] = {}
    if meta.provenance.get(OBJECTIVES_KEY):
        for c in meta.classes:
            out.setdefault(c.name.split(":", 1)[0], []).append(c.index)
    return out


def metadata_columns(meta: DatasetMeta) -> list[str]:
    """The per-sample metadata columns of a multi-objective dataset (its .npy elements by name); [] for others."""
    return list((meta.provenance.get(OBJECTIVES_KEY) or {}).get("metadata", []))


def label_column(multi_label: bool) -> str:
    return "labels" if multi_label else "label"


def split_schema(multi_label: bool, extra: dict[str, pa.DataType] | None = None) -> pa.Schema:
    label = pa.field(label_column(multi_label), pa.list_(pa.int64()) if multi_label else pa.int64())
    fields = [pa.field("sample_id", pa.string()), label, pa.field("image", pa.binary())]
    fields += [pa.field(k, v) for k, v in (extra or {}).items()]
    return pa.schema(fields)


def write_split(path: Path, rows: Iterable[dict], schema: pa.Schema, rows_per_group: int = ROWS_PER_GROUP) -> int:
    """Stream `rows` (dicts with the schema's columns) into a Parquet file, one row group at a time."""
    count = 0
    buffer: list[dict] = []
    with pq.ParquetWriter(path, schema) as writer:
        for row in rows:
            buffer.append(row)
            if len(buffer) == rows_per_group:
                writer.write_table(pa.Table.from_pylist(buffer, schema=schema), row_group_size=rows_per_group)
                count += len(buffer)
                buffer = []
        if buffer or count == 0:
            writer.write_table(pa.Table.from_pylist(buffer, schema=schema), row_group_size=rows_per_group)
            count += len(buffer)
    return count


def write_dataset(
    out_dir: str | Path,
    meta: DatasetMeta,
    splits: dict[str, Iterable[dict]],
    extra_columns: dict[str, pa.DataType] | None = None,
) -> DatasetMeta:
    """Write classes.json and every split (`splits/<split>.parquet`) atomically: `out_dir` is complete or untouched.

    The dataset version is a hash of the split files only, that is of the images, labels and per-sample
    fields (never of class names, templates or provenance): image features stay valid when a class is
    renamed, and a teammate's copy of the same data at another path has the same version. A `preprocess`
    other than "default" is hashed in too, since the images the model sees differ.
    A dataset without splits, or a split without rows, is refused (naming the dataset and split).
    """
    schema = split_schema(meta.multi_label, extra_columns)
    if not splits:
        raise DatasetError(f"dataset {meta.name!r}: no splits to write")
    with atomic_dir(out_dir) as tmp:
        digest = hashlib.sha256()
        for split, rows in splits.items():
            (tmp / SPLITS).mkdir(exist_ok=True)
            path = tmp / SPLITS / f"{split}.parquet"
            meta.splits[split] = write_split(path, _check_rows(rows, meta, split), schema)
            digest.update(f"{split}:{sha256_file(path)}".encode())
        if meta.preprocess != "default":  # it changes what the model sees; the default keeps existing versions
            digest.update(f"preprocess:{meta.preprocess}".encode())
            # in the splits folder too, which is what embed_images depends on: flipping it re-embeds
            (tmp / SPLITS / PREPROCESS_FILE).write_text(meta.preprocess + "\n")
        meta.version = digest.hexdigest()[:16]
        (tmp / "classes.json").write_text(json.dumps(meta.to_json(), indent=2) + "\n")
    return meta


def _check_rows(rows: Iterable[dict], meta: DatasetMeta, split: str) -> Iterator[dict]:
    """Check each row's sample_id and labels as it streams past; refuse a split with no rows."""
    n = len(meta.classes)
    seen: set[str] = set()
    for row in rows:
        sid = row["sample_id"]
        if sid in seen:
            raise DatasetError(f"dataset {meta.name!r} split {split!r}: duplicate sample_id {sid!r}")
        seen.add(sid)
        labels = row["labels"] if meta.multi_label else [row["label"]]
        bad = [y for y in labels if not 0 <= y < n]
        if bad:
            raise DatasetError(f"dataset {meta.name!r} split {split!r} sample {sid!r}: label {bad[0]} not in 0..{n - 1}")
        yield row
    if not seen:
        raise DatasetError(f"dataset {meta.name!r} split {split!r}: empty split, no samples to write")


def load_meta(dataset_dir: str | Path) -> DatasetMeta:
    path = Path(dataset_dir) / "classes.json"
    if not path.exists():
        raise DatasetError(f"{path}: not found; run the prepare stage for this dataset first")
    try:
        return DatasetMeta.from_json(json.loads(path.read_text()))
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise DatasetError(f"{path}: malformed classes.json ({err})") from err


def split_path(dataset_dir: str | Path, split: str) -> Path:
    path = Path(dataset_dir) / SPLITS / f"{split}.parquet"
    if not path.exists():
        raise DatasetError(f"{path}: split {split!r} not found in {dataset_dir}")
    return path


def iter_batches(path: str | Path, columns: list[str] | None = None, batch_size: int = ROWS_PER_GROUP) -> Iterator[pa.RecordBatch]:
    yield from pq.ParquetFile(path).iter_batches(batch_size=batch_size, columns=columns)


def read_columns(path: str | Path, columns: list[str]) -> pa.Table:
    """Read small columns (ids, labels, metadata) whole; never use this for `image`."""
    return pq.read_table(path, columns=columns)
