"""The feature store: embeddings in Parquet, each file stamped with the fingerprint of what made it.

`features/<model>/<dataset>/images/<split>.parquet`: sample_id, label|labels, embedding (fixed-size list<float32>).
`features/<model>/<dataset>/text/<set>.parquet`: the text set's rows (owner column, source, text) + embedding.
`features/<model>/<dataset>/images/pre_projection/<split>.parquet` (the embed step's `embed.pre_projection`): the same
rows with the image tower's features before its projection, and `.../pre_projection/projection.weights.parquet` the
projection itself (one row per output dimension: `weight` [d_pre], `bias`), so that projected = pre @ W.T + b.
The schema metadata key `vlbench.fingerprint` holds a JSON object: the model (slug, arch, pretrained tag, its own
preprocessing `model_preprocess`, text handling `text`, scoring `logits` with `logit_scale` and `logit_bias`,
weights hash, preprocessing, precision, vlbench version) and what was encoded (dataset and its image-data
version, or dataset, text set and text-set version). Readers state what they expect and get a
`StaleFeaturesError` on any mismatch: features are never silently reused.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vlbench.errors import VlbenchError

FINGERPRINT_KEY = b"vlbench.fingerprint"
SKIPPED_KEY = b"vlbench.skipped_corrupt"
PRE_PROJECTION = "pre_projection"  # the folder under images/, and the fingerprint's `representation` of its splits
PROJECTION = "visual_projection"  # the `representation` of the projection file
PROJECTION_FILE = "projection.weights.parquet"  # split names have no dot, so no split file can take this name


class StaleFeaturesError(VlbenchError):
    """Features on disk were made by another model or from another version of the data."""


class FeaturesWriteError(VlbenchError):
    """A features file could not be written (a full disk, a read-only folder); the message names the file."""


class MissingFeaturesError(VlbenchError):
    """No features where a stage expects them: the embed stage has not run for this model and dataset."""


def embedding_type(dim: int) -> pa.DataType:
    return pa.list_(pa.float32(), dim)


def embedding_array(x: np.ndarray) -> pa.FixedSizeListArray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])


def with_fingerprint(schema: pa.Schema, fingerprint: Mapping[str, Any]) -> pa.Schema:
    return schema.with_metadata({FINGERPRINT_KEY: json.dumps(dict(fingerprint), sort_keys=True).encode()})


def features_schema(rows: pa.Schema, dim: int, fingerprint: Mapping[str, Any]) -> pa.Schema:
    """The schema of `rows` (ids and labels, or a text set's columns) plus the embedding, stamped."""
    return with_fingerprint(pa.schema(list(rows) + [pa.field("embedding", embedding_type(dim))]), fingerprint)


def write_table(path: Path, batches: Iterable[pa.RecordBatch | pa.Table], schema: pa.Schema) -> int:
    """Stream record batches into `path` (the caller makes the directory atomic); a full disk or another write
    failure is a FeaturesWriteError naming the file."""
    rows = 0
    try:
        with pq.ParquetWriter(path, schema) as writer:
            for batch in batches:
                table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
                writer.write_table(table.cast(schema))
                rows += table.num_rows
    except OSError as err:
        detail = " ".join(str(err).split()) or type(err).__name__
        raise FeaturesWriteError(f"{path}: cannot write the features ({detail}); free space on its disk (`df -h "
                                 f"{Path(path).parent}`) or point the workspace elsewhere, then rerun") from err
    return rows


def read_fingerprint(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise MissingFeaturesError(f"{path}: no features here; run the embed stages for this model and dataset first")
    meta = pq.read_schema(path).metadata or {}
    if FINGERPRINT_KEY not in meta:
        raise StaleFeaturesError(f"{path}: has no vlbench fingerprint; it was not written by vlbench's embed stage")
    return json.loads(meta[FINGERPRINT_KEY])


def matches(found: Any, expected: Any) -> bool:
    """`found` satisfies `expected`: equal, or both mappings and every key `expected` names matches (a reader demands
    what its params declare, e.g. the entry's preprocessing keys, and nothing it does not)."""
    if isinstance(found, Mapping) and isinstance(expected, Mapping):
        return all(k in found and matches(found[k], v) for k, v in expected.items())
    return found == expected


def check_fingerprint(path: str | Path, expect: Mapping[str, Any]) -> dict[str, Any]:
    found = read_fingerprint(path)
    diffs = {k: (found.get(k), v) for k, v in expect.items() if v is not None and not matches(found.get(k), v)}
    if diffs:
        detail = "; ".join(f"{k}: file has {f!r}, expected {e!r}" for k, (f, e) in diffs.items())
        raise StaleFeaturesError(f"{path}: features do not match what was asked for ({detail}); re-run the embed stage")
    return found


@dataclass
class Features:
    table: pa.Table  # every column but the embedding
    embeddings: np.ndarray  # (n, d) float32
    fingerprint: dict[str, Any]
    skipped: list[str]  # sample ids left out because their image could not be decoded


def read_features(path: str | Path, expect: Mapping[str, Any]) -> Features:
    fingerprint = check_fingerprint(path, expect)
    table = pq.read_table(path)
    emb = table.column("embedding").combine_chunks()
    x = emb.flatten().to_numpy(zero_copy_only=False).reshape(-1, emb.type.list_size).astype(np.float32, copy=False)
    skipped = json.loads((table.schema.metadata or {}).get(SKIPPED_KEY, b"[]"))
    return Features(table.drop(["embedding"]).replace_schema_metadata(None), x, fingerprint, skipped)


def pre_projection_path(images_dir: str | Path, split: str) -> Path:
    """Where the pre-projection features of `split` sit, for the image features folder `images_dir`."""
    return Path(images_dir) / PRE_PROJECTION / f"{split}.parquet"


def projection_path(images_dir: str | Path) -> Path:
    return Path(images_dir) / PRE_PROJECTION / PROJECTION_FILE


@dataclass
class Projection:
    """The image tower's projection: projected = pre @ weight.T + bias; weight [d_out, d_pre], bias [d_out]."""

    weight: np.ndarray
    bias: np.ndarray
    fingerprint: dict[str, Any]


def write_projection(path: Path, weight: np.ndarray, bias: np.ndarray, fingerprint: Mapping[str, Any]) -> None:
    """One row per output dimension: `weight` (that row of W, d_pre floats) and `bias` (the caller makes it atomic)."""
    weight = np.ascontiguousarray(weight, dtype=np.float32)
    table = pa.table({"weight": embedding_array(weight), "bias": pa.array(np.asarray(bias, np.float32))})
    schema = with_fingerprint(pa.schema([pa.field("weight", embedding_type(weight.shape[1])),
                                         pa.field("bias", pa.float32())]), fingerprint)
    write_table(path, [table], schema)


def read_projection(path: str | Path, expect: Mapping[str, Any]) -> Projection:
    fingerprint = check_fingerprint(path, expect)
    table = pq.read_table(path)
    column = table.column("weight").combine_chunks()
    weight = column.flatten().to_numpy(zero_copy_only=False).reshape(-1, column.type.list_size)
    return Projection(weight.astype(np.float32, copy=False),
                      table.column("bias").to_numpy().astype(np.float32, copy=False), fingerprint)
