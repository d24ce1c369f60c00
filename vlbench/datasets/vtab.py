"""VTAB's 19 tasks (Zhai et al. 2019) from TFDS-prepared files, read without TensorFlow (`source: vtab`).

`prepare: {source: vtab, task: <VTAB task, e.g. clevr_count>, root: <TFDS data dir>}` (optional `preprocess`,
default `squash`: VTAB resizes every image to 224 x 224 without a crop, App. I, as adapt.vtab requires).
The task's TFDS builder, pinned version, split slices, label rule, class names and group come from
`vtab_tasks.TASKS[task]`.

Files: TFDS's prepared folder `<root>/<builder>[/<config>]/<version>/` with `dataset_info.json` (the version, the
split names and each split's `shardLengths`) and the shards `<builder>-<split>.tfrecord-<i>-of-<n>` (5 digits
each: tensorflow_datasets/core/naming.py DEFAULT_FILENAME_TEMPLATE `{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}`).
The version in dataset_info.json must be the pinned one; every shard's record count (length checksums verified)
must equal its `shardLengths` entry; each record read has its data checksum verified.

Order: a split's prepared order is its shards in index order, each shard's records in file order. A TFDS slice
`train[a:b]` is the rows a..b-1 of that order (TFDS's file instructions, core/utils/shard_utils.py
get_file_instructions, cut the split by absolute position from `shardLengths`, shards in order), so "the first
800" (`train[:800]`) is exactly the rows here. TFDS's reader (core/reader.py) may interleave shards when a slice
spans several (cycle length 16 unless the builder disables shuffling), which changes the order inside a split,
never its rows; vlbench keeps the prepared order.

Canonical splits: the task's VTAB splits train, val and test, each the rows of its slices in order; `sample_id`
is `<TFDS split>/<row, 7 digits>`. The 1k splits (train800, val200, train800val200) are not copied: they must be
the first rows of train / val (checked), which is how adapt.vtab takes them (DESIGN.md: "VTAB-1k subsets are index
lists over these rows, never copies of images"); classes.json `provenance.subsets` says so. Images as stored,
except where the task scales pixels (dSprites' 0/1 pixels times 255, as task_adaptation does: a lossless PNG).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator, Mapping
from itertools import islice
from pathlib import Path

import numpy as np
from PIL import Image

from vlbench.datasets.canonical import ClassInfo, DatasetError, DatasetMeta, write_dataset
from vlbench.datasets.download import ManualDownloadError
from vlbench.datasets.spec import check_keys
from vlbench.datasets.tfrecord import count_records, iter_records, parse_example
from vlbench.datasets.vtab_tasks import TASKS, VtabTask

KEYS = ("source", "task", "root", "preprocess")
INFO = "dataset_info.json"
TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"  # TFDS's default; the only one read here
GCS = "gs://tfds-data/datasets"  # TFDS's public copies (tensorflow_datasets/core/utils/gcs_utils.py), for some datasets


def task_of(name: str, spec: Mapping) -> VtabTask:
    task = spec.get("task")
    if task not in TASKS:
        raise DatasetError(f"dataset {name!r}: 'task' must be one of VTAB's tasks ({', '.join(sorted(TASKS)) or 'none known'}), "
                           f"got {task!r}")
    return TASKS[task]


def tfds_folder(root: str | Path, task: VtabTask) -> Path:
    return Path(root) / task.tfds / task.version


def builder(task: VtabTask) -> str:
    return task.tfds.split("/")[0]


def shard_name(task: VtabTask, split: str, index: int, count: int) -> str:
    return f"{builder(task)}-{split}.tfrecord-{index:05d}-of-{count:05d}"


def tfds_splits(task: VtabTask) -> list[str]:
    """The TFDS splits the task's slices read, in first-use order."""
    return list(dict.fromkeys(s for slices in task.splits.values() for s, _, _ in slices))


def catalogue_row(name: str, spec: dict) -> dict:
    check_keys(name, spec, KEYS)
    task = task_of(name, spec)
    return {"classes": len(task.classes), "splits": task.split_sizes(), "metric": "accuracy",
            "manual_download": True, "group": task.group}


# ----------------------------------------------------------------------------------------------------------------
# dataset_info.json and the shards


def _how_to_get(task: VtabTask, root: Path) -> str:
    return (f"make them with TensorFlow Datasets on a machine that has it: python -c \"import tensorflow_datasets as tfds; "
            f"tfds.builder('{task.tfds}:{task.version}', data_dir='{root}').download_and_prepare()\" (a "
            f"tensorflow-datasets release that still provides version {task.version}), or copy the folder "
            f"{GCS}/{task.tfds}/{task.version}/ where TFDS publishes one; then put the folder "
            f"{task.tfds}/{task.version}/ under {root}")


def read_info(name: str, task: VtabTask, root: Path) -> dict[str, list[tuple[Path, int]]]:
    """{TFDS split: [(shard path, records)]} for the task's splits, from dataset_info.json; refuses a wrong version,
    an unknown split or file format, and names every missing file in one message."""
    folder = tfds_folder(root, task)
    info_path = folder / INFO
    if not info_path.is_file():
        raise ManualDownloadError(
            f"dataset {name!r}: VTAB task {task.name!r} reads TFDS's prepared {task.tfds} version {task.version}: "
            f"{info_path} and the TFRecord shards of split(s) {', '.join(tfds_splits(task))} beside it are missing; "
            + _how_to_get(task, root))
    try:
        info = json.loads(info_path.read_text())
        version, splits = str(info["version"]), {s["name"]: s for s in info["splits"]}
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise DatasetError(f"{info_path}: not a TFDS dataset_info.json ({type(err).__name__}: {err})") from err
    if version != task.version:
        raise DatasetError(f"{info_path}: version {version} but VTAB task {task.name!r} is pinned to {task.tfds} "
                           f"version {task.version}; " + _how_to_get(task, root))
    if info.get("fileFormat", "tfrecord") != "tfrecord":
        raise DatasetError(f"{info_path}: file format {info['fileFormat']!r}; only TFDS's tfrecord files are read")
    shards = {split: _split_shards(info_path, task, splits, split) for split in tfds_splits(task)}
    missing = [str(path) for files in shards.values() for path, _ in files if not path.is_file()]
    if missing:
        raise ManualDownloadError(f"dataset {name!r}: {len(missing)} TFRecord shard(s) of {folder} are missing: "
                                  f"{', '.join(missing)}; " + _how_to_get(task, root))
    return shards


def _split_shards(info_path: Path, task: VtabTask, splits: Mapping, split: str) -> list[tuple[Path, int]]:
    if split not in splits:
        raise DatasetError(f"{info_path}: no split {split!r} (it has {', '.join(splits)}); VTAB task {task.name!r} reads it")
    entry = splits[split]
    if entry.get("filepathTemplate", TEMPLATE) != TEMPLATE:
        raise DatasetError(f"{info_path}: split {split!r} uses file template {entry['filepathTemplate']!r}; "
                           f"only TFDS's default {TEMPLATE!r} is read")
    if "shardLengths" not in entry:
        raise DatasetError(f"{info_path}: split {split!r} has no shardLengths (a TFDS too old to record them); "
                           f"rebuild it with a newer tensorflow-datasets release")
    try:
        lengths = [int(n) for n in entry["shardLengths"]]
    except (TypeError, ValueError) as err:
        raise DatasetError(f"{info_path}: split {split!r} has shardLengths {entry['shardLengths']!r}, not counts") from err
    return [(info_path.parent / shard_name(task, split, i, len(lengths)), n) for i, n in enumerate(lengths)]


def check_shard_lengths(shards: Mapping[str, list[tuple[Path, int]]]) -> None:
    """Every shard holds the records dataset_info.json says (headers read, data skipped): a truncated or wrong
    shard is refused before anything is written."""
    for files in shards.values():
        for path, expected in files:
            found = count_records(path, verify_data=False)
            if found != expected:
                raise DatasetError(f"{path}: {found} records but dataset_info.json's shardLengths says {expected}; "
                                   f"the file is not the one TFDS prepared (re-copy it)")


def iter_slice(files: list[tuple[Path, int]], start: int, stop: int) -> Iterator[tuple[int, Path, int, bytes]]:
    """(row in the split, shard, record index in the shard, record) of rows start..stop-1 of a TFDS split in its
    prepared order: shards in index order, records in file order; whole shards before `start` are not opened."""
    offset = 0
    for path, n in files:
        lo, hi = max(start - offset, 0), min(stop - offset, n)
        if lo < hi:
            for i, record in enumerate(iter_records(path, skip=lo, limit=hi - lo), lo):
                yield offset + i, path, i, record
        offset += n
        if offset >= stop:
            return


def check_slices(name: str, task: VtabTask, shards: Mapping[str, list[tuple[Path, int]]]) -> None:
    for split, slices in task.splits.items():
        for tfds_split, start, stop in slices:
            total = sum(n for _, n in shards[tfds_split])
            if not 0 <= start < stop <= total:
                raise DatasetError(f"dataset {name!r}: VTAB split {split!r} reads {tfds_split}[{start}:{stop}] but "
                                   f"TFDS's {tfds_split} split has {total} records")


# The 1k splits are the first rows of train and val (task_adaptation: train800 = train[:800], val200 = the validation
# slice's first 200); adapt.vtab relies on it, taking train800 / val200 as the first rows of train / val.
PREFIXES = {"train800": ("train",), "val200": ("val",), "train800val200": ("train800", "val200")}


def check_prefixes(name: str, task: VtabTask) -> None:
    for split, parts in PREFIXES.items():
        if split not in task.splits or not all(p in task.splits for p in parts):
            continue
        n = task.split_sizes()[split]
        want = list(islice((row for p in parts for row in _rows_of(task.splits[p])), n + 1))
        want = want[:n] if len(parts) == 1 else want  # a prefix of train / val; train800 + val200 whole
        if list(_rows_of(task.splits[split])) != want:
            raise DatasetError(f"dataset {name!r}: VTAB split {split!r} of task {task.name!r} is not "
                               f"{' + '.join(parts) if len(parts) > 1 else f'the first rows of {parts[0]!r}'}; "
                               f"adapt.vtab takes it so")


def _rows_of(slices) -> Iterator[tuple[str, int]]:
    return ((s, i) for s, a, b in slices for i in range(a, b))


def split_rows(name: str, task: VtabTask, shards: Mapping[str, list[tuple[Path, int]]], split: str) -> Iterator[dict]:
    """The canonical rows of one VTAB split: its slices' records in order, each labelled by the task's rule."""
    for tfds_split, start, stop in task.splits[split]:
        for row, path, index, record in iter_slice(shards[tfds_split], start, stop):
            yield {"sample_id": f"{tfds_split}/{row:07d}", **_sample(name, task, path, index, record)}


def partition(name: str, task: VtabTask, shards: Mapping[str, list[tuple[Path, int]]]) -> dict:
    """The identity of the TFDS train/test partition the task reads, for a builder that partitions at preparation
    (TFDS's Caltech-101 picks its 30 training images per class in file-system order, so two preparations can differ):
    per TFDS split, the sha256 of its examples' ids in prepared order, one per line, an id being
    `<label>/<identity_key value>` (file names repeat across classes); `sha256` hashes the splits' lines
    `<split> <sha256>`, sorted. Two users evaluated the same split (and the same 1k subsets, which are prefixes)
    exactly when their `sha256` agree; classes.json `provenance.partition`, and every result on the dataset."""
    digests = {}
    for split in sorted({s for slices in task.splits.values() for s, _, _ in slices}):
        lines = hashlib.sha256()
        for _, path, index, record in iter_slice(shards[split], 0, sum(n for _, n in shards[split])):
            lines.update(f"{_identity(name, task, path, index, record)}\n".encode())
        digests[split] = lines.hexdigest()
    overall = "".join(f"{split} {digest}\n" for split, digest in sorted(digests.items()))
    return {"sha256": hashlib.sha256(overall.encode()).hexdigest(), "splits": digests,
            "id": f"<label>/<{task.identity_key}>, one per line in prepared order"}


def _identity(name: str, task: VtabTask, path: Path, index: int, record: bytes) -> str:
    where = f"dataset {name!r}: {path} record {index}"
    try:
        features = parse_example(record)
        label = int(task.label(features))
    except (KeyError, IndexError, ValueError, TypeError) as err:
        raise DatasetError(f"{where}: cannot read its label ({type(err).__name__}: {err})") from err
    value = features.get(task.identity_key)
    if value is None or len(value) != 1:
        raise DatasetError(f"{where}: feature {task.identity_key!r} must hold one value (the example's identity in "
                           f"task {task.name!r}), found {'nothing' if value is None else f'{len(value)} value(s)'}")
    text = value[0].decode("utf-8", "replace") if isinstance(value[0], bytes) else str(value[0])
    return f"{label}/{text}"


def _sample(name: str, task: VtabTask, path: Path, index: int, record: bytes) -> dict:
    where = f"dataset {name!r}: {path} record {index}"
    try:
        features = parse_example(record)
    except ValueError as err:
        raise DatasetError(f"{where}: not a tf.train.Example ({err})") from err
    image = features.get(task.image_key)
    if not isinstance(image, list) or len(image) != 1:
        raise DatasetError(f"{where}: feature {task.image_key!r} must hold one encoded image, found "
                           f"{'nothing' if image is None else f'{len(image)} value(s)'}")
    try:
        label = int(task.label(features))
    except (KeyError, IndexError, ValueError, TypeError) as err:
        raise DatasetError(f"{where}: the label rule of VTAB task {task.name!r} failed "
                           f"({type(err).__name__}: {err}); features present: {sorted(features)}") from err
    return {"label": label, "image": image[0] if task.pixel_scale == 1 else scaled_png(where, image[0], task.pixel_scale)}


def scaled_png(where: str, data: bytes, scale: int) -> bytes:
    """The image's pixels times `scale`, as a PNG: dSprites stores 0/1 pixels, which task_adaptation multiplies by 255
    before the model sees them. Lossless, so the stored image is recoverable exactly (divide by `scale`)."""
    try:
        pixels = np.asarray(Image.open(io.BytesIO(data)))
    except OSError as err:
        raise DatasetError(f"{where}: cannot decode the image to scale its pixels ({err})") from err
    if pixels.max(initial=0) * scale > 255:
        raise DatasetError(f"{where}: pixel values up to {pixels.max()} times {scale} exceed 255; is this the TFDS "
                           f"version the task pins?")
    out = io.BytesIO()
    Image.fromarray((pixels * scale).astype(np.uint8)).save(out, format="PNG")
    return out.getvalue()


def build(name: str, spec: dict, out_dir: Path) -> DatasetMeta:
    check_keys(name, spec, KEYS)
    task = task_of(name, spec)
    if "root" not in spec:
        raise DatasetError(f"dataset {name!r}: 'root' (the TFDS data dir holding {task.tfds}/{task.version}/) is required")
    root = Path(str(spec["root"]))
    shards = read_info(name, task, root)
    check_shard_lengths(shards)
    check_slices(name, task, shards)
    check_prefixes(name, task)
    provenance = {
        "source": "vtab", "task": task.name, "group": task.group,
        "upstream": "VTAB (Zhai et al. 2019), google-research/task_adaptation; TFDS-prepared files read without TensorFlow",
        "tfds": task.tfds, "tfds_version": task.version,
        "slices": {split: [f"{s}[{a}:{b}]" for s, a, b in slices] for split, slices in task.splits.items()},
        "files": {split: [{"file": path.name, "records": n, "bytes": path.stat().st_size} for path, n in files]
                  for split, files in shards.items()},
        "subsets": {split: f"the first {task.split_sizes()[split]} rows of {parts[0]}" if len(parts) == 1 else
                    " + ".join(parts) for split, parts in PREFIXES.items() if split in task.splits},
        "class_source": task.class_source,
        **({"partition": partition(name, task, shards)} if task.identity_key else {}),
        "image_encoding": "as stored in the TFDS records (not re-encoded)" if task.pixel_scale == 1 else
                          f"PNG of the stored pixels times {task.pixel_scale} (task_adaptation's scaling), lossless",
    }
    classes = [ClassInfo(index=i, name=c) for i, c in enumerate(task.classes)]
    meta = DatasetMeta(name=name, task="single-label", metric="accuracy", classes=classes, provenance=provenance,
                       preprocess=spec.get("preprocess", "squash"))
    rows = {split: split_rows(name, task, shards, split) for split in task.splits if split not in PREFIXES}
    return write_dataset(out_dir, meta, rows)
