"""Webdataset shards as DataComp and CLIP_benchmark evaluate on them (`source: wds`).

The layout (CLIP_benchmark's `build_wds_dataset`, read by DataComp's eval_utils/wds_eval.py and
download_evalsets.py), one dataset repository per task, e.g. huggingface.co/datasets/djghosh/wds_cars_test:

    classnames.txt                           one class name per line (classification)
    zeroshot_classification_templates.txt    one template with `{c}` per line (classification)
    <split>/nshards.txt                      the number of shards n
    <split>/0.tar ... <split>/<n-1>.tar      the samples

A shard is a tar of members `<key>.<ext>`; consecutive members with the same key are one sample (webdataset's
grouping: the key is the member path up to the first dot of its base name, the extension the rest, lower-cased; a
key that changes, or an extension seen twice, starts the next sample). A sample has one image member (`webp`, `png`,
`jpg` or `jpeg`, taken in that order, as CLIP_benchmark's `to_tuple` does) and, for classification, `cls` (the class
index as text) or, for retrieval, `txt` (one caption per line) or `json` (a list of captions, or an object with
`captions`). Grouped tasks carry `npy`, a numpy array of integer metadata (DataComp's WILDS and fairness evaluators
read it: FMoW `[region, year, y]`, Dollar Street `[income_ds, income_meta, region]`, GeoDE `[region, country]`); the
spec's `group: {field, index}` names the element that is the sample's group, stored as the column `group`
(`<field>:<value>`), which group metrics (vlbench.metrics.GROUP_METRICS) are computed over.

Multi-objective tasks (DataComp's FairFace and UTKFace, eval_utils/fairness_eval.py): every class name and every
template is `<objective>:<text>` (race, gender, age, toxic), and each face's `npy` holds its metadata, named by the
spec's `objectives: {label, metadata}` (DataComp's FairFaceEvaluator: `[age, gender, race, race_binary]`). Each
metadata element is stored as an int64 column of that name; an element named like an objective is that objective's
class, an index into the objective's classes (checked); the `label` objective's class is the sample's `label` (its
index among all classes). Classes stay as the shards name them; provenance `objectives` records the label objective
and the fields (canonical.objective_classes). The zero-shot analysis scores each objective over its own classes with
its own templates (vlbench/texts.py `prompts`, vlbench.metrics.fairness_outcomes).

Files come through the hub layer (vlbench/datasets/hub.py, on the download layer's cache and mirror folder): the
entry's `revision` (a branch such as `main`) is resolved to a commit at the first download and pinned in `hub.lock`;
every file comes from `{HF_ENDPOINT}/datasets/<repo>/resolve/<commit>/<path>`, verified against the hash the hub
declares for it (an LFS file's sha256, a git file's blob id) at its first download and against the lock after it. The
spec's `sha256: {<split>/<i>.tar: hex}`, where given, must agree with both. Provenance records the commit and every
file's sha256.

Prepared dataset: one split (the spec's `split`, `test`), its samples in shard order then tar order, each read from
the tar as a stream (`tarfile` mode "r|") and written row group by row group, never a split in memory; `sample_id`
is the sample's key; images as stored. A shard fault is a one-line error naming the shard and the member, and nothing
is written (`members`, `load_npy`): not a tar, cut inside a member or at a member boundary (no end-of-archive blocks),
a member declaring more bytes than the shard holds, a corrupt or pickled `.npy`. The samples are counted per shard and
their total checked against the entry's `size` (`samples`).
Classes: classnames.txt in order (their names exactly as the shards have
them); the templates of zeroshot_classification_templates.txt are kept in provenance (`templates`), and an entry
whose `texts.templates` is `prepared` uses them (vlbench/texts.py), so the prompts are the ones the table used.
Retrieval sets are task `captions` with a placeholder class, like Karpathy's splits.
"""

from __future__ import annotations

import io
import json
import tarfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
import pyarrow as pa

from vlbench.datasets.canonical import (
    GROUP_COLUMN,
    OBJECTIVES_KEY,
    ClassInfo,
    DatasetError,
    DatasetMeta,
    objective_classes,
    write_dataset,
)
from vlbench.datasets.hub import hub_file, pinned_commit
from vlbench.datasets.images import checked_rows
from vlbench.datasets.spec import check_flag, check_keys

SPEC_KEYS = ("source", "task", "datacomp", "repo", "revision", "split", "kind", "metric", "group", "size",
             "classes", "sha256", "unsupported", "skip_corrupt", "objectives")
KINDS = ("classification", "retrieval")
IMAGE_EXTENSIONS = ("webp", "png", "jpg", "jpeg")  # CLIP_benchmark's order
CLASSES_FILE = "classnames.txt"
TEMPLATES_FILE = "zeroshot_classification_templates.txt"
RETRIEVAL_METRIC = "mean_recall_at_1"  # the retrieval analysis' i2t_r1 and t2i_r1, averaged (metrics.mean_recall_at_1)
CAPTION_CLASSES = [ClassInfo(index=0, name="image")]  # a placeholder: captioned images have no classes
RESERVED_COLUMNS = ("sample_id", "label", "labels", "image", "captions", GROUP_COLUMN)
MAX_MEMBER_BYTES = 1 << 30  # no image or metadata member of an evaluation shard comes near 1 GiB


@dataclass(frozen=True)
class WdsSpec:
    repo: str
    revision: str
    split: str
    kind: str
    metric: str
    group: tuple[str, int] | None  # (field name, index into the sample's npy)
    size: int | None
    classes: int | None
    sha256: dict[str, str]
    skip_corrupt: bool
    objectives: tuple[str, tuple[str, ...]] | None = None  # (the label objective, the .npy metadata fields)


# ------------------------------------------------------------------------------------------------ public


def build(name: str, spec: dict, out_dir: str | Path) -> DatasetMeta:
    cfg = parse_spec(name, spec)
    files: list[dict] = []

    def get(path: str) -> Path:
        found = hub_file(name, cfg.repo, cfg.revision, path, cfg.sha256.get(path))
        files.append(found.provenance)
        return found.local

    nshards = read_nshards(name, get(f"{cfg.split}/nshards.txt"))
    classes, templates = CAPTION_CLASSES, []
    if cfg.kind == "classification":
        classes = [ClassInfo(index=i, name=c) for i, c in enumerate(read_lines(name, get(CLASSES_FILE)))]
        templates = read_lines(name, get(TEMPLATES_FILE))
        if cfg.classes is not None and len(classes) != cfg.classes:
            raise DatasetError(f"dataset {name!r}: {CLASSES_FILE} of {cfg.repo}@{cfg.revision} has {len(classes)} "
                               f"classes, the entry expects {cfg.classes} (spec 'classes')")
    shards = [get(f"{cfg.split}/{i}.tar") for i in range(nshards)]
    provenance = {
        **({OBJECTIVES_KEY: {"label": cfg.objectives[0], "metadata": list(cfg.objectives[1])}} if cfg.objectives
           else {}),
        "source": "wds", "repo": cfg.repo, "revision": cfg.revision, "commit": files[0]["commit"], "split": cfg.split,
        "nshards": nshards,
        "files": files, "templates": templates, "group": {"field": cfg.group[0], "index": cfg.group[1]} if cfg.group
        else None, "counts": {}, "skipped_corrupt": [],
    }
    meta = DatasetMeta(name=name, task="captions" if cfg.kind == "retrieval" else "single-label", metric=cfg.metric,
                       classes=list(classes), provenance=provenance)
    objectives = check_objectives(name, cfg, meta, templates) if cfg.objectives else {}
    rows = checked_rows(name, cfg.split, samples(name, cfg, shards, len(classes), objectives),
                        cfg.skip_corrupt, provenance, f"re-download the shards of {cfg.repo}")
    return write_dataset(out_dir, meta, {cfg.split: rows}, extra_columns=extra_columns(cfg))


def catalogue_row(name: str, spec: dict) -> dict:
    """Classes, test size and metric as the entry records them (DataComp's tasklist.yml); None where not known
    offline, with `note` saying so."""
    cfg = parse_spec(name, {k: v for k, v in spec.items() if k != "unsupported"})
    datacomp = spec.get("datacomp") or {}
    row = {"classes": cfg.classes if cfg.kind == "classification" else None,
           "splits": {cfg.split: cfg.size} if cfg.size is not None else {},
           "metric": RETRIEVAL_METRIC if cfg.kind == "retrieval" else cfg.metric,
           "main_metric": datacomp.get("main_metric"), "task": datacomp.get("name", spec.get("task")),
           "manual_download": False, "repo": f"{cfg.repo}@{cfg.revision}",
           "shards_verified": True, "pinned": pinned_commit(name)}  # verified: against the hub, then hub.lock
    unknown = [what for what, value in (("classes", row["classes"] if cfg.kind == "classification" else 0),
                                        ("test size", cfg.size)) if value is None]
    if unknown:
        row["note"] = f"{' and '.join(unknown)} not known before prepare (DataComp's tasklist.yml gives none)"
    if spec.get("unsupported"):
        row["unsupported"] = spec["unsupported"]
    return row


def parse_spec(name: str, spec: Mapping) -> WdsSpec:
    check_keys(name, spec, SPEC_KEYS, "wds")
    if spec.get("unsupported"):
        raise DatasetError(f"dataset {name!r}: {spec['unsupported']}")
    for key in ("repo", "revision"):
        if not isinstance(spec.get(key), str) or not spec[key].strip() or spec[key].startswith("/"):
            raise DatasetError(f"dataset {name!r}: {key!r} must name the dataset repository's "
                               f"{'owner/name' if key == 'repo' else 'branch, tag or commit'}, got {spec.get(key)!r}")
    kind = spec.get("kind", "classification")
    if kind not in KINDS:
        raise DatasetError(f"dataset {name!r}: 'kind' must be one of {list(KINDS)}, got {kind!r}")
    sha = spec.get("sha256") or {}
    if not isinstance(sha, Mapping) or not all(isinstance(v, str) for v in sha.values()):
        raise DatasetError(f"dataset {name!r}: 'sha256' must map a repository path (test/0.tar) to its sha256, "
                           f"got {sha!r}")
    group = spec.get("group")
    if group is not None and (not isinstance(group, Mapping) or not isinstance(group.get("field"), str)
                              or not isinstance(group.get("index"), int)):
        raise DatasetError(f"dataset {name!r}: 'group' must be {{field: <name>, index: <int>}} (the element of each "
                           f"sample's .npy metadata that is its group), got {group!r}")
    objectives = parse_objectives(name, spec.get("objectives"), kind, group)
    return WdsSpec(
        repo=spec["repo"], revision=spec["revision"], split=str(spec.get("split", "test")), kind=kind,
        metric=spec.get("metric", "accuracy"), group=(group["field"], group["index"]) if group else None,
        size=_optional_int(name, spec, "size"), classes=_optional_int(name, spec, "classes"),
        sha256=dict(sha), skip_corrupt=check_flag(name, spec, "skip_corrupt"), objectives=objectives)


def parse_objectives(name: str, value, kind: str, group) -> tuple[str, tuple[str, ...]] | None:
    """The spec's `objectives: {label: <objective>, metadata: [<field>, ...]}` (module docstring)."""
    if value is None:
        return None
    fields = value.get("metadata") if isinstance(value, Mapping) else None
    if (not isinstance(fields, list) or not fields or not all(isinstance(f, str) and f for f in fields)
            or len(set(fields)) != len(fields) or set(fields) & set(RESERVED_COLUMNS)
            or value.get("label") not in fields or set(value) - {"label", "metadata"}):
        raise DatasetError(f"dataset {name!r}: 'objectives' must be {{label: <objective>, metadata: [<field>, ...]}}: "
                           f"the names of the .npy elements (distinct, none of {list(RESERVED_COLUMNS)}), the label "
                           f"objective among them; got {value!r}")
    if kind != "classification" or group is not None:
        raise DatasetError(f"dataset {name!r}: 'objectives' needs kind classification and no 'group'")
    return value["label"], tuple(fields)


def extra_columns(cfg: WdsSpec) -> dict[str, pa.DataType]:
    out = {"captions": pa.list_(pa.string())} if cfg.kind == "retrieval" else {}
    if cfg.group:
        out[GROUP_COLUMN] = pa.string()
    for field in cfg.objectives[1] if cfg.objectives else ():
        out[field] = pa.int64()
    return out


def check_objectives(name: str, cfg: WdsSpec, meta: DatasetMeta, templates: list[str]) -> dict[str, list[int]]:
    """{objective: class indices} of a multi-objective task, its class names and templates checked: every class and
    template `<objective>:<text>`, every objective with a template, the label objective among the classes'."""
    bad = next((c.name for c in meta.classes if not all(c.name.partition(":")[::2])), None)
    if bad is not None:
        raise DatasetError(f"dataset {name!r}: {CLASSES_FILE} of {cfg.repo}@{cfg.revision}: class {bad!r} is not "
                           f"'<objective>:<class>', which the entry's 'objectives' needs")
    found = objective_classes(meta)
    if cfg.objectives[0] not in found:
        raise DatasetError(f"dataset {name!r}: the label objective {cfg.objectives[0]!r} (spec 'objectives') has no "
                           f"class in {CLASSES_FILE} of {cfg.repo}@{cfg.revision}, whose objectives are {list(found)}")
    missing = [o for o in found if not any(t.partition(":")[0] == o for t in templates)]
    unknown = sorted(t for t in templates if t.partition(":")[0] not in found)
    if missing or unknown:
        raise DatasetError(f"dataset {name!r}: {TEMPLATES_FILE} of {cfg.repo}@{cfg.revision} must give each objective "
                           f"of {CLASSES_FILE} ({list(found)}) a '<objective>:<template>' line, and no other (none for "
                           f"{missing}; unknown: {unknown[:3]})")
    return found


# ------------------------------------------------------------------------------------------------ reading


def read_nshards(name: str, path: Path) -> int:
    text = path.read_text().strip()
    if not text.isdigit() or int(text) < 1:
        raise DatasetError(f"dataset {name!r}: {path.name} must hold the number of shards, got {text[:40]!r}")
    return int(text)


def read_lines(name: str, path: Path) -> list[str]:
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    if not lines or not all(lines):
        raise DatasetError(f"dataset {name!r}: {path.name} must have one non-empty entry per line")
    return lines


def members(name: str, label: str, shard: Path) -> Iterator[tuple[str, str, bytes]]:
    """(key, extension, bytes) of each file of a tar, streamed in file order. A shard that is not a tar, is cut inside
    a member, ends without the tar end-of-archive blocks (cut at a member boundary), or has a member declaring more
    bytes than the shard holds after it (or more than `MAX_MEMBER_BYTES`) is a one-line error naming the shard
    (`label`, e.g. test/0.tar) and the member."""
    size, member = shard.stat().st_size, None
    try:
        with tarfile.open(shard, mode="r|") as tar:  # plain tar, as every DataComp shard
            for info in tar:
                member = info.name
                if not info.isfile():
                    continue
                if info.size > min(MAX_MEMBER_BYTES, size - info.offset_data):
                    raise DatasetError(f"dataset {name!r}: shard {label} member {member!r} declares {info.size:,} "
                                       f"bytes, the shard has {max(size - info.offset_data, 0):,} after its header "
                                       f"(at most {MAX_MEMBER_BYTES:,} are read); re-download the shard")
                path = PurePosixPath(info.name)
                if "." not in path.name:
                    continue
                stem, ext = path.name.split(".", 1)
                key = str(path.parent / stem) if str(path.parent) != "." else stem
                yield key, ext.lower(), tar.extractfile(info).read()
            end = tar.offset
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        at = f" member {member!r}" if member else ""
        raise DatasetError(f"dataset {name!r}: shard {label}{at} is not a readable tar ({err or type(err).__name__});"
                           f" re-download the shard") from None
    if not has_end_marker(shard, end):
        raise DatasetError(f"dataset {name!r}: shard {label} ends without the tar end-of-archive blocks after "
                           f"{'member ' + repr(member) if member else 'no member'}: it was cut short; re-download the "
                           f"shard")


def has_end_marker(shard: Path, end: int) -> bool:
    """Whether the tar `shard` has its two zero blocks of end-of-archive at `end` (where its last member's data,
    padded, ends): every tar writer (tarfile, GNU tar, webdataset's ShardWriter) writes them; a tar cut at a member
    boundary reads as a shorter, valid one without them."""
    with shard.open("rb") as f:
        f.seek(end)
        marker = f.read(2 * tarfile.BLOCKSIZE)
    return len(marker) == 2 * tarfile.BLOCKSIZE and not marker.strip(b"\0")


def grouped(name: str, label: str, shard: Path) -> Iterator[dict]:
    """Webdataset's samples of one shard: {"__key__", ext: bytes, ...}."""
    current: dict | None = None
    for key, ext, data in members(name, label, shard):
        if current is None or key != current["__key__"] or ext in current:
            if current is not None:
                yield current
            current = {"__key__": key}
        current[ext] = data
    if current is not None:
        yield current


def samples(name: str, cfg: WdsSpec, shards: list[Path], num_classes: int,
            objectives: Mapping[str, list[int]]) -> Iterator[dict]:
    """Every sample of the shards in order; at the end their number is checked against the entry's test size
    (DataComp's tasklist.yml `size`), the error naming each shard's count and the number `nshards.txt` declares."""
    counts: dict[str, int] = {}
    for index, shard in enumerate(shards):
        label = f"{cfg.split}/{index}.tar"
        counts[label] = 0
        for sample in grouped(name, label, shard):
            counts[label] += 1
            yield row(name, cfg, label, sample, num_classes, objectives)
    total = sum(counts.values())
    if cfg.size is not None and total != cfg.size:
        each = ", ".join(f"{label} {n:,}" for label, n in counts.items())
        raise DatasetError(f"dataset {name!r}: the {len(shards)} shard(s) {cfg.split}/nshards.txt of "
                           f"{cfg.repo}@{cfg.revision} declares hold {total:,} samples in {cfg.split!r} ({each}), the "
                           f"entry expects {cfg.size:,} (spec 'size'); a shard is cut short or missing")


def row(name: str, cfg: WdsSpec, shard: str, sample: dict, num_classes: int,
        objectives: Mapping[str, list[int]]) -> dict:
    where = f"dataset {name!r}: {shard} sample {sample['__key__']!r}"
    image = next((sample[ext] for ext in IMAGE_EXTENSIONS if ext in sample), None)
    if image is None:
        raise DatasetError(f"{where} has no image member ({', '.join(IMAGE_EXTENSIONS)}); members: "
                           f"{sorted(k for k in sample if k != '__key__')}")
    out = {"sample_id": sample["__key__"], "image": image}
    if cfg.kind == "retrieval":
        out.update(label=0, captions=captions(where, sample))
    elif cfg.objectives:
        out.update(objective_labels(where, sample, cfg.objectives, objectives))
    else:
        out["label"] = label(where, sample, num_classes)
    if cfg.group:
        out[GROUP_COLUMN] = group(where, sample, cfg.group)
    return out


def label(where: str, sample: dict, num_classes: int) -> int:
    text = sample.get("cls", b"").decode("utf-8", "replace").strip()
    if not text.lstrip("-").isdigit() or not 0 <= int(text) < num_classes:
        raise DatasetError(f"{where}: .cls must be a class index in [0, {num_classes}), got {text[:40]!r}")
    return int(text)


def captions(where: str, sample: dict) -> list[str]:
    if "txt" in sample:
        found = sample["txt"].decode("utf-8").splitlines()
    elif "json" in sample:
        obj = json.loads(sample["json"])
        found = obj.get("captions") if isinstance(obj, dict) else obj
    else:
        raise DatasetError(f"{where} has no captions (.txt or .json)")
    found = [c.strip() for c in found or [] if isinstance(c, str) and c.strip()]
    if not found:
        raise DatasetError(f"{where}: no non-empty caption")
    return found


def group(where: str, sample: dict, spec: tuple[str, int]) -> str:
    field, index = spec
    values = load_npy(where, sample, f"its {field}")
    if index >= values.size:
        raise DatasetError(f"{where}: .npy metadata has {values.size} values, the {field} is element {index}")
    return f"{field}:{int(values[index])}"


def metadata(where: str, sample: dict, length: int) -> np.ndarray:
    """The sample's .npy metadata: `length` integers."""
    values = load_npy(where, sample, "its metadata")
    if values.size != length:
        raise DatasetError(f"{where}: .npy metadata has {values.size} values, the entry's objectives.metadata names "
                           f"{length}")
    if (not np.issubdtype(values.dtype, np.number) or not np.all(np.isfinite(values))
            or np.any(values != np.round(values))):
        raise DatasetError(f"{where}: .npy metadata must be integers, got {values.tolist()[:8]}")
    return values.astype(np.int64)


def load_npy(where: str, sample: dict, holds: str) -> np.ndarray:
    """The sample's `npy` member as a flat array, read without pickles (numpy's allow_pickle=False: an object array
    would run code from the shard); a missing, corrupt or pickled member is a one-line error naming it."""
    if "npy" not in sample:
        raise DatasetError(f"{where} has no .npy metadata, which holds {holds}")
    try:
        return np.load(io.BytesIO(sample["npy"]), allow_pickle=False).reshape(-1)
    except (ValueError, EOFError, OSError) as err:
        raise DatasetError(f"{where}: member {sample['__key__'] + '.npy'!r} is not a numpy array of numbers "
                           f"({str(err).splitlines()[0] if str(err) else type(err).__name__})") from None


def objective_labels(where: str, sample: dict, spec: tuple[str, tuple[str, ...]],
                     objectives: Mapping[str, list[int]]) -> dict:
    """`label` (the label objective's class among all classes) and one column per metadata field; an element named
    like an objective must index that objective's classes."""
    label_objective, fields = spec
    values = dict(zip(fields, metadata(where, sample, len(fields)).tolist()))
    for field, value in values.items():
        if field in objectives and not 0 <= value < len(objectives[field]):
            raise DatasetError(f"{where}: .npy {field} {value} is not a class of objective {field!r}, an index in "
                               f"[0, {len(objectives[field])})")
    return {"label": objectives[label_objective][values[label_objective]], **values}


def _optional_int(name: str, spec: Mapping, key: str) -> int | None:
    value = spec.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise DatasetError(f"dataset {name!r}: {key!r} must be a positive integer or null, got {value!r}")
    return value
