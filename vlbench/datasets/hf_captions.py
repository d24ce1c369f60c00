"""Flickr and MSCOCO as DataComp evaluates them (`source: hf_captions`, entries `wds-flickr30k` and `wds-mscoco`).

DataComp's eval_utils/retr_eval.py reads the Hugging Face datasets `nlphuji/flickr_1k_test_image_text_retrieval` and
`nlphuji/mscoco_2014_5k_test_image_text_retrieval` (Karpathy's 1k and 5k test splits) with `datasets.load_dataset`,
split `test`, and takes two columns of each row: `image` (one image) and `caption` (the list of its captions); every
caption of every image is a text query and a candidate (CLIP_benchmark's image_captions_collate_fn and
zeroshot_retrieval.evaluate). Both repositories hold a loading script with a CSV file and a zip of images; vlbench
runs no script and reads the same rows from the hub's Parquet conversion of the script's output instead (branch
`refs/convert/parquet`, config `TEST`): the spec's `files` (paths in the repository, in order), fetched through the
hub layer as the wds and winogavil sources' files (vlbench/datasets/hub.py: the revision pinned to a commit in
`hub.lock` at the first download, each file verified against the hash the hub declares for it, then against the lock;
the spec's `sha256: {<path>: hex}`, where given, must agree). An `Image` feature is stored as a struct {bytes,
path}. The file names and the two columns' types are assumptions written offline (docs/datasets.md, "Flickr and
MSCOCO"); a file without the columns is refused in one line naming them.

Prepared dataset: task `captions` (a placeholder class, like Karpathy's splits and the wds source's retrieval sets),
one split (`test`), one row per image in file and row order, read one Parquet row group at a time: `sample_id` the
image's position (five digits), `image` the bytes as stored, `captions` the row's captions exactly as stored (the
tokenizer sees what DataComp's sees). The entry's `size` (images, DataComp's tasklist.yml) and `captions` (their
captions in all: MSCOCO 25,010) are checked once the split is read; a row with no caption, a caption that is not text,
or an image that does not decode is refused, naming the file and the row (nothing is skipped: DataComp skips nothing).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from vlbench.datasets.canonical import ClassInfo, DatasetError, DatasetMeta, write_dataset
from vlbench.datasets.hub import hub_file, parquet_rows, pinned_commit
from vlbench.datasets.images import checked_rows
from vlbench.datasets.spec import check_keys

SPEC_KEYS = ("source", "task", "datacomp", "repo", "revision", "split", "files", "metric", "size", "captions",
             "sha256")
COLUMNS = ("image", "caption")  # what retr_eval.py's RetrievalDataset reads of a row
RETR_EVAL_COLUMNS = f" (DataComp's retr_eval.py reads {list(COLUMNS)})"
METRIC = "mean_recall_at_1"  # the retrieval analysis' i2t_r1 and t2i_r1, averaged (DataComp's mean_recall@1)
CAPTION_CLASSES = [ClassInfo(index=0, name="image")]  # a placeholder: captioned images have no classes


@dataclass(frozen=True)
class CaptionSpec:
    repo: str
    revision: str
    split: str
    files: tuple[str, ...]
    metric: str  # classes.json's `metric` (the wds source's retrieval entries': accuracy); scored by `METRIC`
    size: int | None
    captions: int | None
    sha256: dict[str, str]


# ------------------------------------------------------------------------------------------------ public


def build(name: str, spec: dict, out_dir: str | Path) -> DatasetMeta:
    cfg = parse_spec(name, spec)
    files, paths = [], []
    for path in cfg.files:
        found = hub_file(name, cfg.repo, cfg.revision, path, cfg.sha256.get(path))
        files.append(found.provenance)
        paths.append((path, found.local))
    provenance = {"source": "hf_captions", "repo": cfg.repo, "revision": cfg.revision, "commit": files[0]["commit"],
                  "split": cfg.split, "files": files, "counts": {}, "skipped_corrupt": []}
    meta = DatasetMeta(name=name, task="captions", metric=cfg.metric, classes=list(CAPTION_CLASSES),
                       provenance=provenance)
    where = {}
    rows = checked_rows(name, cfg.split, image_rows(name, cfg, paths, where), False, provenance,
                        f"re-download the Parquet files of {cfg.repo}", where)
    return write_dataset(out_dir, meta, {cfg.split: rows}, extra_columns={"captions": pa.list_(pa.string())})


def catalogue_row(name: str, spec: dict) -> dict:
    """Test size (images, DataComp's tasklist.yml) and captions as the entry records them, without a download."""
    cfg = parse_spec(name, spec)
    datacomp = spec.get("datacomp") or {}
    return {"classes": None, "splits": {cfg.split: cfg.size} if cfg.size is not None else {}, "captions": cfg.captions,
            "metric": METRIC, "main_metric": datacomp.get("main_metric"),
            "task": datacomp.get("name", spec.get("task")), "manual_download": False,
            "repo": f"{cfg.repo}@{cfg.revision}",
            "shards_verified": True, "pinned": pinned_commit(name)}  # verified: against the hub, then hub.lock


def parse_spec(name: str, spec: Mapping) -> CaptionSpec:
    check_keys(name, spec, SPEC_KEYS, "hf_captions")
    for key in ("repo", "revision"):
        if not isinstance(spec.get(key), str) or not spec[key].strip() or spec[key].startswith("/"):
            raise DatasetError(f"dataset {name!r}: {key!r} must name the dataset repository's "
                               f"{'owner/name' if key == 'repo' else 'branch, tag or commit'}, got {spec.get(key)!r}")
    files = spec.get("files")
    if not isinstance(files, list) or not files or not all(isinstance(f, str) and f.endswith(".parquet")
                                                           for f in files):
        raise DatasetError(f"dataset {name!r}: 'files' must list the repository's Parquet files of the split "
                           f"(e.g. ['TEST/test/0000.parquet']), got {files!r}")
    sha = spec.get("sha256") or {}
    if not isinstance(sha, Mapping) or not all(isinstance(v, str) for v in sha.values()):
        raise DatasetError(f"dataset {name!r}: 'sha256' must map a repository path to its sha256, got {sha!r}")
    counts = {}
    for key in ("size", "captions"):
        value = counts[key] = spec.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise DatasetError(f"dataset {name!r}: {key!r} must be a positive integer or null, got {value!r}")
    return CaptionSpec(repo=spec["repo"], revision=spec["revision"], split=str(spec.get("split", "test")),
                       files=tuple(files),
                       metric=str(spec.get("metric", "accuracy")), sha256=dict(sha), **counts)


# ------------------------------------------------------------------------------------------------ reading


def image_rows(name: str, cfg: CaptionSpec, paths: list[tuple[str, Path]], where: dict[str, str]) -> Iterator[dict]:
    """One row per image of every file in order (`where`: each sample_id's file and row, for the image check's
    message); at the end the images and captions counted against the entry's `size` and `captions`."""
    images = captions = 0
    for path, local in paths:
        for row, item in parquet_rows(name, path, local, COLUMNS, COLUMNS, RETR_EVAL_COLUMNS):
            sample_id = f"{images:05d}"
            where[sample_id] = f"{path} row {row}"
            texts = item["caption"]
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
                raise DatasetError(f"dataset {name!r}: {path} row {row}: 'caption' must be a non-empty list of texts, "
                                   f"got {texts!r:.80}")
            image = item["image"].get("bytes") if isinstance(item["image"], Mapping) else item["image"]
            yield {"sample_id": sample_id, "label": 0, "image": image, "captions": texts}
            images += 1
            captions += len(texts)
    for key, expected, found in (("size", cfg.size, images), ("captions", cfg.captions, captions)):
        if expected is not None and found != expected:
            raise DatasetError(f"dataset {name!r}: the Parquet files of {cfg.repo}@{cfg.revision} hold {images:,} "
                               f"images with {captions:,} captions, the entry expects {expected:,} "
                               f"{'images' if key == 'size' else 'captions'} (spec {key!r})")
