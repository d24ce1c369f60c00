"""Image features shared by datasets of the same images (suite.share_images; VTAB's two CLEVR, dSprites and SmallNORB
tasks): the model embeds the source's images once, and the target's features are those rows with the target's labels.

Sharing is refused unless the two prepared datasets hold the same splits with byte-identical (sample_id, image) rows in
the same order (a sha256 per split) and the same preprocessing. The target's files keep the source's fingerprint (the
model, its preprocessing) with the target's `dataset` and `dataset_version`, so its readers accept them, and
`images_of`: the source dataset, its version and the split's image digest. No model.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vlbench import features
from vlbench.datasets.canonical import DatasetMeta, iter_batches, load_meta, read_columns, split_path
from vlbench.errors import VlbenchError
from vlbench.io import atomic_dir


class SharedImagesError(VlbenchError):
    """Two datasets that should share image features do not hold the same images (or the source's are stale)."""


def images_digest(path: str | Path) -> str:
    """sha256 of a prepared split's (sample_id, image bytes) rows in order, read in row groups."""
    digest = hashlib.sha256()
    for batch in iter_batches(path, columns=["sample_id", "image"]):
        for sid, image in zip(batch.column("sample_id").to_pylist(), batch.column("image").to_pylist()):
            for part in (sid.encode(), image or b""):
                digest.update(len(part).to_bytes(8, "little") + part)
    return digest.hexdigest()


def check_same_images(source_dir: Path, target_dir: Path) -> tuple[DatasetMeta, DatasetMeta, dict[str, str]]:
    """(source meta, target meta, split -> digest) when both prepared datasets hold the same images; else an error
    naming both datasets and the split."""
    source, target = load_meta(source_dir), load_meta(target_dir)
    pair = f"datasets {target.name!r} and {source.name!r} cannot share image features"
    if sorted(source.splits) != sorted(target.splits):
        raise SharedImagesError(f"{pair}: their splits differ ({sorted(target.splits)} vs {sorted(source.splits)})")
    if source.preprocess != target.preprocess:
        raise SharedImagesError(f"{pair}: preprocess {target.preprocess!r} vs {source.preprocess!r}")
    digests = {}
    for split in target.splits:
        digests[split] = images_digest(split_path(target_dir, split))
        if digests[split] != images_digest(split_path(source_dir, split)):
            raise SharedImagesError(f"{pair}: split {split!r} differs in sample ids or image bytes (sha256 of "
                                    f"(sample_id, image) rows); remove {target.name!r} from share_images and list it "
                                    f"in embed_images")
    return source, target, digests


def share_image_features(source_dir: Path, target_dir: Path, source_images: Path, out_dir: Path) -> dict[str, Any]:
    """Write `out_dir` (the target's features/<model>/<target>/images, replaced whole) from the source's image
    features `source_images`: every split file (pre-projection ones too) with the target's labels, and the projection
    file, each restamped. Returns {"dataset", "images_of", "splits": {split: rows}}."""
    source, target, digests = check_same_images(Path(source_dir), Path(target_dir))
    files = sorted(Path(source_images).rglob("*.parquet"))
    if not files:
        raise features.MissingFeaturesError(f"{source_images}: no image features of {source.name!r}; run "
                                            f"embed_images@{source.name} first")
    labels = {split: read_columns(split_path(target_dir, split), ["sample_id", target.label_column])
              for split in target.splits}
    summary: dict[str, Any] = {"dataset": target.name, "images_of": source.name, "splits": {}}
    with atomic_dir(out_dir) as tmp:
        for path in files:
            found = features.check_fingerprint(path, {"dataset": source.name, "dataset_version": source.version})
            split = None if path.name == features.PROJECTION_FILE else path.stem
            stamp = {**found, "dataset": target.name, "dataset_version": target.version,
                     "images_of": {"dataset": source.name, "dataset_version": source.version,
                                   **({"images_sha256": digests[split]} if split else {})}}
            dest = tmp / path.relative_to(source_images)
            dest.parent.mkdir(parents=True, exist_ok=True)
            rows = _relabel(path, dest, labels[split] if split else None, stamp)
            if split and path.parent == Path(source_images):
                summary["splits"][split] = rows
    return summary


def _relabel(path: Path, dest: Path, labels: pa.Table | None, fingerprint: dict[str, Any]) -> int:
    """Copy a features file to `dest` stamped with `fingerprint`; with `labels` (the split's sample_id and label
    column), its label column replaced by theirs, matched by sample_id, batch by batch."""
    source = pq.ParquetFile(path)
    schema = source.schema_arrow
    metadata = {**schema.metadata, features.FINGERPRINT_KEY: json.dumps(fingerprint, sort_keys=True).encode()}
    if labels is not None:
        schema = pa.schema([schema.field("sample_id"), labels.schema.field(1), schema.field("embedding")])
        ids = pq.read_table(path, columns=["sample_id"]).column(0)
        values = labels.column(1).take(pc.index_in(ids, value_set=labels.column(0))).combine_chunks()
        if values.null_count:
            raise SharedImagesError(f"{path}: {values.null_count} sample ids are not in the split's prepared rows")

    def batches():
        start = 0
        for batch in source.iter_batches():
            if labels is not None:
                batch = pa.record_batch([batch.column("sample_id"), values.slice(start, batch.num_rows),
                                         batch.column("embedding")], schema=schema)
                start += batch.num_rows
            yield batch

    return features.write_table(dest, batches(), schema.with_metadata(metadata))
