"""TFRecord and TFDS-folder writers for the tests' and benchmarks' miniatures: vlbench only reads these formats
(vlbench.datasets.tfrecord, vlbench.datasets.vtab)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from vlbench.datasets.tfrecord import write_records
from vlbench.datasets.vtab import INFO, TEMPLATE, builder, shard_name, tfds_folder
from vlbench.datasets.vtab_tasks import VtabTask


def varint_bytes(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    return varint_bytes(number << 3 | 2) + varint_bytes(len(payload)) + payload


def serialize_example(features: Mapping[str, Sequence[bytes] | Sequence[int] | Sequence[float] | np.ndarray]) -> bytes:
    """A tf.train.Example of {key: list of bytes | int64 values | float32 values} (packed lists, as TensorFlow
    writes them); an np.ndarray's dtype picks the list, a Python list's first element does."""
    entries = b""
    for key, values in features.items():
        array = np.asarray(values)
        if array.dtype.kind in "SOU" or (len(values) and isinstance(values[0], bytes)):
            feature = field(1, b"".join(field(1, bytes(v)) for v in values))
        elif array.dtype.kind == "f":
            feature = field(2, field(1, array.astype("<f4").tobytes()))
        else:
            feature = field(3, field(1, b"".join(varint_bytes(int(v)) for v in array.ravel())))
        entries += field(1, field(1, key.encode("utf-8")) + field(2, feature))
    return field(1, entries)


def write_tfds_folder(root: Path, task: VtabTask, splits: Mapping[str, list[list[bytes]]]) -> Path:
    """The task's TFDS-prepared folder under `root` as TFDS lays it out (dataset_info.json + shards), of
    {split: [records of each shard]}: the miniatures of the tests."""
    folder = tfds_folder(root, task)
    folder.mkdir(parents=True, exist_ok=True)
    info = {"name": builder(task), "version": task.version, "fileFormat": "tfrecord", "splits": []}
    for split, shards in splits.items():
        for i, records in enumerate(shards):
            write_records(folder / shard_name(task, split, i, len(shards)), records)
        info["splits"].append({"name": split, "filepathTemplate": TEMPLATE, "shardLengths": [str(len(r)) for r in shards]})
    (folder / INFO).write_text(json.dumps(info, indent=2))
    return folder
