"""WinoGAViL (Bitton et al. 2022) as DataComp evaluates it (`source: winogavil`, entry `wds-winogavil`).

DataComp's eval_utils/wino_eval.py reads the Hugging Face dataset `nlphuji/winogavil`, split `test`, with
`datasets.load_dataset`: per instance a `cue` (text), `candidates` (the candidate images' names), `associations`
(the names among them the cue is associated with) and `candidate_images` (the images, in the order of
`candidates`). vlbench reads the same rows from the dataset's Parquet files instead: the spec's `files` (paths in the
repository, in order), fetched through the hub layer (vlbench/datasets/hub.py: the revision pinned to a commit in
`hub.lock` at the first download, each file verified against the hash the hub declares for it, then against the
lock; the spec's `sha256: {<path>: hex}`, where given, must agree). The files are the hub's standard Parquet encoding
of a `datasets` table: a list of `Image` features is a list of structs {bytes: binary, path: string}. This layout,
the files' names and the revision that holds them (the hub's Parquet conversion, `refs/convert/parquet`) are
assumptions not checked against the hub (written offline; the first prepare pins the branch's commit). vlbench sends
no hub token: should the repository be gated, download the files yourself and put them in the mirror folder
(`downloads.mirror`) under their cache names (docs/downloads.md).

Prepared dataset: one split (`test`), read one Parquet row group at a time (never the split in memory). An instance
is a class: its name is DataComp's prompt of the cue (`prompt`, wino_eval.py's `get_clip_prompt`), its `key` the cue
as the dataset has it; the entry's templates are `["{c}"]`, so the class prompts are exactly DataComp's texts. Each
candidate image is one row: `sample_id` `<instance>/<position>` (the instance's number in file order, five digits;
the candidate's position in `candidates`, two digits), `label` its instance's class, `image` the bytes as stored,
`candidate` its name and `association` whether it is among the instance's associations (`np.isin(candidates,
associations)`). The zero-shot analysis scores it (vlbench/analyses/zeroshot.py, `evaluate_winogavil`). A row whose
associations are not all among its candidates, with no association, or whose images do not match its candidates is
refused in one line naming the file and the row; so is an image that does not decode (`image_problem`, the check every
source runs), with its candidate's name: no image is skipped, since an instance without one of its candidates would be
another instance.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from vlbench.datasets.canonical import ASSOCIATION_COLUMN, ClassInfo, DatasetError, DatasetMeta, write_dataset
from vlbench.datasets.hub import hub_file, parquet_rows, pinned_commit
from vlbench.datasets.images import checked_rows, image_problem
from vlbench.datasets.spec import check_keys

SPEC_KEYS = ("source", "task", "datacomp", "repo", "revision", "split", "files", "metric", "size",
             "sha256")
METRIC = "winogavil_jaccard"
COLUMNS = ("cue", "candidates", "associations", "candidate_images")
CANDIDATE_COLUMN = "candidate"
VOWELS = ("a", "e", "i", "o", "u")


@dataclass(frozen=True)
class WinoSpec:
    repo: str
    revision: str
    split: str
    files: tuple[str, ...]
    size: int | None
    sha256: dict[str, str]


def prompt(cue: str) -> str:
    """DataComp's text for a cue (wino_eval.py `get_clip_prompt`): the cue lower-cased, after "An " if it starts with a
    vowel (a, e, i, o, u), else after "A "."""
    text = cue.lower()
    return f"An {text}" if text[:1] in VOWELS else f"A {text}"


# ------------------------------------------------------------------------------------------------ public


def build(name: str, spec: dict, out_dir: str | Path) -> DatasetMeta:
    cfg = parse_spec(name, spec)
    files, paths = [], []
    for path in cfg.files:
        found = hub_file(name, cfg.repo, cfg.revision, path, cfg.sha256.get(path))
        files.append(found.provenance)
        paths.append((path, found.local))
    cases = read_cases(name, cfg, paths)
    classes = [ClassInfo(index=i, name=prompt(cue), key=cue) for i, (cue, _, _) in enumerate(cases)]
    provenance = {"source": "winogavil", "repo": cfg.repo, "revision": cfg.revision, "commit": files[0]["commit"],
                  "split": cfg.split,
                  "files": files, "templates": ["{c}"], "counts": {}, "skipped_corrupt": []}
    meta = DatasetMeta(name=name, task="single-label", metric=METRIC, classes=classes, provenance=provenance)
    # each image is checked as it streams (candidate_rows); checked_rows adds Pillow's strictness check and the count
    rows = checked_rows(name, cfg.split, candidate_rows(name, cfg, paths, cases), False, provenance)
    return write_dataset(out_dir, meta, {cfg.split: rows}, extra_columns=extra_columns())


def catalogue_row(name: str, spec: dict) -> dict:
    """Test size (instances, DataComp's tasklist.yml) and metric as the entry records them, without a download; the
    split's size (its candidate images, what embed_images embeds) is known only once prepared."""
    cfg = parse_spec(name, spec)
    datacomp = spec.get("datacomp") or {}
    return {"classes": None, "splits": {}, "instances": cfg.size, "metric": METRIC,
            "main_metric": datacomp.get("main_metric"), "task": datacomp.get("name", spec.get("task")),
            "manual_download": False, "repo": f"{cfg.repo}@{cfg.revision}",
            "shards_verified": True, "pinned": pinned_commit(name),  # verified: against the hub, then hub.lock
            "note": "test size in instances (one class each, its cue), each of 5 to 12 candidate images; the number "
                    "of images is known after prepare"}


def parse_spec(name: str, spec: Mapping) -> WinoSpec:
    check_keys(name, spec, SPEC_KEYS, "winogavil")
    for key in ("repo", "revision"):
        if not isinstance(spec.get(key), str) or not spec[key].strip() or spec[key].startswith("/"):
            raise DatasetError(f"dataset {name!r}: {key!r} must name the dataset repository's "
                               f"{'owner/name' if key == 'repo' else 'commit or branch'}, got {spec.get(key)!r}")
    files = spec.get("files")
    if not isinstance(files, list) or not files or not all(isinstance(f, str) and f.endswith(".parquet")
                                                           for f in files):
        raise DatasetError(f"dataset {name!r}: 'files' must list the repository's Parquet files of the split "
                           f"(e.g. ['default/test/0000.parquet']), got {files!r}")
    if spec.get("metric", METRIC) != METRIC:
        raise DatasetError(f"dataset {name!r}: 'metric' must be {METRIC!r} (DataComp's jaccard_score_10-12), "
                           f"got {spec.get('metric')!r}")
    sha = spec.get("sha256") or {}
    if not isinstance(sha, Mapping) or not all(isinstance(v, str) for v in sha.values()):
        raise DatasetError(f"dataset {name!r}: 'sha256' must map a repository path to its sha256, got {sha!r}")
    size = spec.get("size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise DatasetError(f"dataset {name!r}: 'size' must be a positive integer or null, got {size!r}")
    return WinoSpec(repo=spec["repo"], revision=spec["revision"], split=str(spec.get("split", "test")), files=tuple(files), size=size, sha256=dict(sha))


def extra_columns() -> dict[str, pa.DataType]:
    return {CANDIDATE_COLUMN: pa.string(), ASSOCIATION_COLUMN: pa.bool_()}


# ------------------------------------------------------------------------------------------------ reading


def read_cases(name: str, cfg: WinoSpec, paths: list[tuple[str, Path]]) -> list[tuple[str, list[str], set[str]]]:
    """(cue, candidate names, associations) of every instance in file and row order, from the text columns alone (no
    image is read), each checked (`checked_case`); their number checked against the entry's test size."""
    cases = [checked_case(f"dataset {name!r}: {path} row {row}", item) for path, local in paths
             for row, item in parquet_rows(name, path, local, COLUMNS[:3], COLUMNS)]
    if cfg.size is not None and len(cases) != cfg.size:
        raise DatasetError(f"dataset {name!r}: the Parquet files of {cfg.repo}@{cfg.revision} hold {len(cases)} "
                           f"instances, the entry expects {cfg.size} (spec 'size')")
    return cases


def checked_case(where: str, item: dict) -> tuple[str, list[str], set[str]]:
    """(cue, candidate names, associations) of one row, or a one-line error naming it (`where`)."""
    cue, names, truth = (item.get(c) for c in COLUMNS[:3])
    if not isinstance(cue, str) or not cue.strip():
        raise DatasetError(f"{where}: 'cue' must be a non-empty text, got {cue!r}")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise DatasetError(f"{where}: 'candidates' must be a non-empty list of names, got {names!r}")
    if len(set(names)) != len(names):
        raise DatasetError(f"{where}: 'candidates' repeats a name: {names}")
    if not isinstance(truth, list) or not truth:
        raise DatasetError(f"{where}: 'associations' must be a non-empty list of candidate names, got {truth!r}")
    stray = [a for a in truth if a not in names]
    if stray:
        raise DatasetError(f"{where}: association(s) {stray} are not among its candidates {names}")
    return cue, names, set(truth)  # as given: DataComp's prompt lower-cases it and nothing else


def candidate_rows(name: str, cfg: WinoSpec, paths: list[tuple[str, Path]],
                   cases: list[tuple[str, list[str], set[str]]]) -> Iterator[dict]:
    """One row per candidate image of every instance (`cases`, in file and row order), its images read a row group
    at a time; an image that does not decode stops the split at once, named by file, row and candidate (a WinoGAViL
    instance without one of its candidates would be another instance: no image is skipped)."""
    index = 0
    for path, local in paths:
        for row, item in parquet_rows(name, path, local, COLUMNS[3:], COLUMNS):
            _, names, truth = cases[index]
            images = item.get(COLUMNS[3])
            if not isinstance(images, list) or len(images) != len(names):
                count = len(images) if isinstance(images, list) else type(images).__name__
                raise DatasetError(f"dataset {name!r}: {path} row {row}: 'candidate_images' has {count} image(s) for "
                                   f"{len(names)} candidates")
            for position, (candidate, image) in enumerate(zip(names, images)):
                data = image_bytes(image)
                problem = image_problem(data)
                if problem:
                    raise DatasetError(f"dataset {name!r}: {path} row {row} candidate {candidate!r}: {problem}; "
                                       f"re-download the Parquet files of {cfg.repo}")
                yield {"sample_id": f"{index:05d}/{position:02d}", "label": index, "image": data,
                       CANDIDATE_COLUMN: candidate, ASSOCIATION_COLUMN: candidate in truth}
            index += 1


def image_bytes(image) -> bytes | None:
    """The bytes of one `Image` feature as the hub stores it in Parquet ({bytes, path}); None when it has none."""
    if isinstance(image, Mapping):
        image = image.get("bytes")
    return image if isinstance(image, bytes) else None
