"""ELEVATER's 20 image-classification datasets, from ELEVATER's own distribution (source `elevater`).

What the data is. ELEVATER (Li et al., NeurIPS 2022 Datasets and Benchmarks) evaluates on datasets it
distributes itself, in Microsoft's `vision-datasets` layout, from an Azure blob container (its toolkit's
`VISION_DATASET_STORAGE`, a URL with a read-only SAS query string). Each dataset lives in a folder
`<container>/<root_folder>/` holding, per split, an index file and zip archives of the images, and (for most)
a labelmap. Two index formats occur (`vision_datasets` 0.2.17, the version ELEVATER's toolkit pins):

- "iris" (17 datasets): a text file, one image a line, `<zip>@<path in zip> <label>[,<label>...]`, the labels
  being 0-based lines of the labelmap `labels.txt` (one class name a line; blank lines are skipped, as there).
- "coco" (hateful-memes, kitti-distance, resisc45_clip): a COCO JSON file whose `images` carry `file_name` and
  `zip_file`, whose `annotations` pair `image_id` with `category_id`, and whose `categories` (sorted by id)
  are the labelmap. Images are taken in id order, as `vision_datasets` does.

What is fixed by vlbench. `vlbench/datasets/data/elevater.json` (made by `tools/elevater_data.py` from the
toolkit at a fixed commit) holds, per dataset, ELEVATER's class names in ELEVATER's order (`prompts.py`, its
`class_map`), its templates, metric, task, preprocessing, root folder and, per split, the index file, the zips
and the number of images. Class counts, split sizes and metrics come from that file, so the catalogue needs
no download (`catalogue_row`).

Labels. ELEVATER's toolkit pairs labelmap line i with `class_map[i]` by position. vlbench pairs them by name
where it can: names are compared ignoring case, underscores and repeated spaces, through ELEVATER's own
alternative names (FER-2013's 'smiling' for 'happy') and an alias table of known label names of the original
datasets (`ALIASES`, extended per entry by the spec key `aliases`). When every labelmap name finds its class
and the pairing is one-to-one, labels are remapped by name, whatever the labelmap's order. When some names do
not match (ELEVATER's names are CLIP's prompt names: GTSRB's 'red and white circle 20 kph speed limit',
Country211's full country names), the labelmap is paired by position, exactly as ELEVATER's toolkit does, but
only if every name that does match sits at its own class's position; a name that contradicts its position, a
duplicate name, or a labelmap with another number of classes is refused, naming the dataset and the names.
`label_match: name` refuses any pairing that is not by name. classes.json records, per split, how labels were
paired, how many names agreed and the labelmap itself.

Caltech-101's 'Faces' / 'Faces_easy' have no alias on purpose: CLIP calls them 'off-center face' /
'centered face', but ELEVATER's class order puts 'centered face' where the alphabetical 'faces' comes; left
to the positional pairing, vlbench labels them as ELEVATER does.

Rows are in the index's order (ELEVATER's few-shot sampling follows it); `sample_id` is the index's image
path (`<zip>@<path in zip>`); images are the zip members' bytes as distributed, checked with
`images.image_problem`. Downloads go through `download.fetch` into the download cache, as
`elevater-<root folder name>-<file>` (ELEVATER's file names repeat across datasets); a local mirror folder
holds them under those names. No checksums are published for ELEVATER's files: each file's sha256 is
recorded in the provenance with `verified: false`, unless the spec's `checksums` gives it.

Spec keys: `source: elevater`, `dataset` (ELEVATER name, default the entry's name), `splits` (our split ->
ELEVATER split, default {train: train, test: test}), `base_urls` (default the toolkit's storage URL; a
file's URL is `<base>/<root_folder>/<file>`, keeping the base's query string), `checksums` ({ELEVATER file
name: sha256}), `metric` (default ELEVATER's), `preprocess` (default ELEVATER's: `squash` for KITTI
distance), `skip_corrupt`, `aliases` ({labelmap name: class name}), `label_match` (`auto` | `name`).
"""

from __future__ import annotations

import functools
import json
import re
import stat
import sys
import urllib.parse
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from vlbench.datasets.archives import UnsafeArchiveError, safe_name
from vlbench.datasets.canonical import (
    ClassInfo,
    DatasetError,
    DatasetMeta,
    write_dataset,
)
from vlbench.datasets.download import ManualDownloadError, Resource, all_missing, fetch, forget_verification
from vlbench.datasets.images import checked_rows
from vlbench.datasets.spec import check_flag, check_keys

DATA_FILE = Path(__file__).with_name("data") / "elevater.json"
KEYS = ("source", "dataset", "splits", "base_urls", "checksums", "metric", "preprocess", "skip_corrupt",
        "aliases", "label_match", "manual")
LABEL_MATCH = ("auto", "name")
DEFAULT_SPLITS = {"train": "train", "test": "test"}
MAX_REPORTED = 20  # names or images listed in one error; the rest are counted
_SPLIT_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")

# Label names of the original datasets that differ from ELEVATER's class names beyond case, underscores and
# spaces: {ELEVATER dataset: {label name: ELEVATER class name}}. Facts about the upstream label sets
# (Caltech-101's folders, EuroSAT's folders, FER-2013's emotion names), used only to pair names.
ALIASES: dict[str, dict[str, str]] = {
    "caltech-101": {
        "airplanes": "airplane", "BACKGROUND_Google": "background", "car_side": "side of a car",
        "cougar_body": "body of a cougar cat", "cougar_face": "face of a cougar cat",
        "crocodile_head": "head of a  crocodile", "flamingo_head": "head of a flamingo", "Leopards": "leopard",
        "Motorbikes": "motorbike", "snoopy": "snoopy (cartoon beagle)", "yin_yang": "yin and yang symbol",
    },
    "eurosat_clip": {
        "AnnualCrop": "annual crop land", "HerbaceousVegetation": "brushland or shrubland",
        "Highway": "highway or road", "Industrial": "industrial buildings or commercial buildings",
        "Pasture": "pasture land", "PermanentCrop": "permanent crop land",
        "Residential": "residential buildings or homes or apartments", "SeaLake": "lake or sea",
    },
    "fer-2013": {"disgust": "disgusted", "fear": "fearful", "surprise": "surprised"},
}


# ------------------------------------------------------------------------------------------- the data file


@functools.cache
def load_data(path: Path = DATA_FILE) -> dict[str, Any]:
    """The ELEVATER data file (class names, templates, splits, metrics; see tools/elevater_data.py)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise DatasetError(f"{path}: cannot read the ELEVATER data file ({err}); regenerate it with "
                           f"`python tools/elevater_data.py data`") from err


def dataset_names() -> list[str]:
    """The ELEVATER datasets that have images here (the 20; imagenet-1k has classes and templates only)."""
    return [name for name, entry in load_data().items() if not name.startswith("_") and "splits" in entry]


def upstream() -> dict[str, str]:
    source = load_data()["_source"]
    return {"repo": source["repo"], "commit": source["commit"], "licence": source["licence"]}


def classes(dataset: str) -> list[str]:
    """ELEVATER's class names in ELEVATER's order (also for imagenet-1k)."""
    data = load_data()
    if dataset.startswith("_") or dataset not in data:
        raise DatasetError(f"unknown ELEVATER dataset {dataset!r}; known: {', '.join(sorted(k for k in data if k[0] != '_'))}")
    return list(data[dataset]["classes"])


def templates(dataset: str) -> list[str]:
    """ELEVATER's templates for the dataset, with vlbench's `{c}` placeholder."""
    classes(dataset)
    return list(load_data()[dataset]["templates"])


# ------------------------------------------------------------------------------------------- the spec


@dataclass(frozen=True)
class ElevaterSpec:
    """A validated `prepare` spec of source `elevater`."""

    name: str
    dataset: str
    info: dict
    splits: dict[str, str]
    base_urls: tuple[str, ...]
    checksums: dict[str, str]
    metric: str
    preprocess: str
    skip_corrupt: bool
    aliases: dict[str, str]
    label_match: str
    manual: str | None = None

    @property
    def task(self) -> str:
        return self.info["task"]

    @property
    def multi_label(self) -> bool:
        return self.task == "multi-label"


def parse_spec(name: str, spec: Mapping[str, Any]) -> ElevaterSpec:
    check_keys(name, spec, KEYS)
    dataset = spec.get("dataset", name)
    known = dataset_names()
    if dataset not in known:
        raise DatasetError(f"dataset {name!r}: {dataset!r} is not one of ELEVATER's datasets "
                           f"(set 'dataset' to one of: {', '.join(known)})")
    info = load_data()[dataset]
    label_match = spec.get("label_match", "auto")
    if label_match not in LABEL_MATCH:
        raise DatasetError(f"dataset {name!r}: 'label_match' must be one of {LABEL_MATCH}, got {label_match!r}")
    return ElevaterSpec(
        name=name, dataset=dataset, info=info,
        splits=_split_map(name, spec.get("splits", DEFAULT_SPLITS), info),
        base_urls=_base_urls(name, spec.get("base_urls", [load_data()["_source"]["storage"]])),
        checksums=_checksums(name, spec.get("checksums", {}), info),
        metric=spec.get("metric", info["metric"]), preprocess=spec.get("preprocess", info["preprocess"]),
        skip_corrupt=check_flag(name, spec, "skip_corrupt"),
        aliases=_string_mapping(name, "aliases", spec.get("aliases", {})),
        label_match=label_match, manual=_manual(name, spec.get("manual")),
    )


def _manual(name: str, text: Any) -> str | None:
    """A licence to accept before download: every file then comes in by hand (the download layer says how)."""
    if text is not None and (not isinstance(text, str) or not text.strip()):
        raise DatasetError(f"dataset {name!r}: 'manual' must be a sentence saying where to get the files, got {text!r}")
    return text


def _split_map(name: str, splits: Any, info: dict) -> dict[str, str]:
    if not isinstance(splits, Mapping) or not splits:
        raise DatasetError(f"dataset {name!r}: 'splits' must be a non-empty mapping our split -> ELEVATER split")
    for ours, theirs in splits.items():
        if not isinstance(ours, str) or not _SPLIT_NAME.match(ours):
            raise DatasetError(f"dataset {name!r}: split name {ours!r} must be letters, digits, '_', '-' or '.'")
        if theirs not in info["splits"]:
            raise DatasetError(f"dataset {name!r}: splits.{ours}: ELEVATER has no split {theirs!r} "
                               f"(it has {', '.join(info['splits'])})")
    return dict(splits)


def _base_urls(name: str, urls: Any) -> tuple[str, ...]:
    urls = [urls] if isinstance(urls, str) else urls
    if not isinstance(urls, (list, tuple)) or not urls:
        raise DatasetError(f"dataset {name!r}: 'base_urls' must be a non-empty list of URLs, got {urls!r}")
    for url in urls:
        if not isinstance(url, str) or urllib.parse.urlsplit(url).scheme not in ("http", "https", "file"):
            raise DatasetError(f"dataset {name!r}: base_urls: {url!r} is not an http(s) or file URL")
    return tuple(urls)


def _checksums(name: str, checksums: Any, info: dict) -> dict[str, str]:
    checksums = _string_mapping(name, "checksums", checksums)
    unknown = sorted(set(checksums) - set(dataset_files(info)))
    if unknown:
        raise DatasetError(f"dataset {name!r}: checksums name {unknown}, which are not files of this dataset "
                           f"({', '.join(dataset_files(info))})")
    return checksums


def _string_mapping(name: str, key: str, value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise DatasetError(f"dataset {name!r}: {key!r} must be a mapping of strings, got {value!r}")
    return dict(value)


def dataset_files(info: dict) -> list[str]:
    """Every ELEVATER file of a dataset: labelmap, index files and zips of all splits."""
    files = [info["labelmap"]] if info.get("labelmap") else []
    for split in info["splits"].values():
        files += [split["index"], *split["files"]]
    return list(dict.fromkeys(files))


def catalogue_row(name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
    """Classes, split sizes and metric from the data file, without any download."""
    parsed = parse_spec(name, spec)
    return {
        "classes": len(parsed.info["classes"]),
        "splits": {ours: parsed.info["splits"][theirs]["num_images"] for ours, theirs in parsed.splits.items()},
        "metric": parsed.metric,
        "manual_download": parsed.manual is not None,
    }


# ------------------------------------------------------------------------------------------- downloads


def file_url(base: str, root_folder: str, file: str) -> str:
    """`<base>/<root_folder>/<file>`, keeping the base's query string (the SAS token) at the end."""
    parts = urllib.parse.urlsplit(base)
    path = "/".join([parts.path.rstrip("/"), root_folder.strip("/"), urllib.parse.quote(file)])
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def cache_name(info: dict, file: str) -> str:
    """The file's name in the download cache and the local mirror: ELEVATER's names repeat across datasets."""
    return f"elevater-{PurePosixPath(info['root_folder']).name}-{file}"


class _Files:
    """Fetches a dataset's files once each and keeps their provenance."""

    def __init__(self, spec: ElevaterSpec):
        self.spec = spec
        self.paths: dict[str, Path] = {}
        self.records: list[dict] = []

    def get(self, file: str) -> Path:
        if file not in self.paths:
            info = self.spec.info
            urls = tuple(file_url(b, info["root_folder"], file) for b in self.spec.base_urls)
            manual = self.spec.manual and f"{self.spec.manual} ELEVATER's copy of this file: {urls[0]}"
            res = Resource(cache_name(info, file), () if manual else urls, sha256=self.spec.checksums.get(file),
                           manual=manual)
            self.paths[file] = fetch(res, self.spec.name)
            self.records.append({"elevater_file": f"{info['root_folder']}/{file}", **res.provenance(self.paths[file])})
        return self.paths[file]

    def text(self, file: str) -> str:
        try:
            return self.get(file).read_text(encoding="utf-8-sig")
        except UnicodeDecodeError as err:
            raise DatasetError(f"dataset {self.spec.name!r}: {self.get(file)} (ELEVATER {file!r}) is not UTF-8 text: {err}") from err


# ------------------------------------------------------------------------------------------- index files


@dataclass(frozen=True)
class Sample:
    """One index entry: the image (`<zip>@<path in zip>`), its labels as labelmap lines, where it was read."""

    image: str
    labels: tuple[int, ...]
    where: str


def parse_labelmap(text: str, where: str) -> list[str]:
    """Class names, one a line, stripped; blank lines skipped (as vision_datasets does)."""
    names = [line.strip() for line in text.splitlines() if line.strip()]
    if not names:
        raise DatasetError(f"{where}: the labelmap names no class")
    return names


def parse_iris_index(text: str, where: str) -> list[Sample]:
    """Lines `<image path> <label>[,<label>...]`; the path may contain spaces, the labels may not."""
    samples = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        image, _, labels = line.rpartition(" ")
        if not image:
            image, labels = line, ""
        try:
            parsed = tuple(int(x) for x in labels.split(",")) if labels else ()
        except ValueError:
            raise DatasetError(f"{where} line {number}: expected '<zip>@<image path> <label>[,<label>...]' with integer "
                               f"labels, got {raw.strip()!r}") from None
        if any(y < 0 for y in parsed):
            raise DatasetError(f"{where} line {number}: negative label in {raw.strip()!r}")
        samples.append(Sample(image, parsed, f"{where} line {number}"))
    return samples


def parse_coco_index(obj: Any, where: str) -> tuple[list[str], list[Sample]]:
    """(category names sorted by id, samples in image-id order) of a COCO classification file."""
    try:
        categories = sorted((c["id"], str(c["name"])) for c in obj["categories"])
        position = {cid: i for i, (cid, _) in enumerate(categories)}
        images = sorted(obj["images"], key=lambda im: im["id"])
        labels: dict[Any, list[int]] = {im["id"]: [] for im in images}
        for k, ann in enumerate(obj["annotations"]):
            if ann["image_id"] not in labels:
                raise DatasetError(f"{where}: annotation {k} names image id {ann['image_id']!r}, which is not in 'images'")
            if ann["category_id"] not in position:
                raise DatasetError(f"{where}: annotation {k} names category id {ann['category_id']!r}, "
                                   f"which is not in 'categories'")
            labels[ann["image_id"]].append(position[ann["category_id"]])
        if len(labels) != len(images):
            raise DatasetError(f"{where}: image ids repeat in 'images'")
        samples = [Sample(_coco_path(im, where), tuple(labels[im["id"]]), f"{where} image id {im['id']}") for im in images]
    except (KeyError, TypeError) as err:
        raise DatasetError(f"{where}: not a COCO classification file (missing or malformed {err})") from err
    return [name for _, name in categories], samples


def _coco_path(image: dict, where: str) -> str:
    if not image.get("zip_file"):
        raise DatasetError(f"{where}: image id {image['id']} has no 'zip_file'; ELEVATER's images are read from zips")
    return f"{image['zip_file']}@{image['file_name']}"


def read_split(spec: ElevaterSpec, split: str, files: _Files) -> tuple[list[str], list[Sample]]:
    """(labelmap names, samples) of one ELEVATER split."""
    entry = spec.info["splits"][split]
    where = f"dataset {spec.name!r} split {split!r}: ELEVATER index {entry['index']!r}"
    if spec.info["format"] == "coco":
        try:
            obj = json.loads(files.text(entry["index"]))
        except json.JSONDecodeError as err:
            raise DatasetError(f"{where}: not valid JSON ({err})") from err
        names, samples = parse_coco_index(obj, where)
    else:
        labelmap = spec.info.get("labelmap")
        if not labelmap:
            raise DatasetError(f"dataset {spec.name!r}: the data file names no labelmap for this iris-format dataset")
        names = parse_labelmap(files.text(labelmap), f"dataset {spec.name!r}: ELEVATER labelmap {labelmap!r}")
        samples = parse_iris_index(files.text(entry["index"]), where)
    if not samples:
        raise DatasetError(f"{where}: empty split, the index lists no image")
    _check_labels(spec, samples, len(names))
    return names, samples


def _check_labels(spec: ElevaterSpec, samples: list[Sample], n: int) -> None:
    for s in samples:
        if not spec.multi_label and len(s.labels) != 1:
            raise DatasetError(f"{s.where}: image {s.image!r} has {len(s.labels)} labels {list(s.labels)}; "
                               f"this dataset is single-label")
        bad = [y for y in s.labels if y >= n]
        if bad:
            raise DatasetError(f"{s.where}: image {s.image!r} has label {bad[0]}, but the labelmap has {n} names (0..{n - 1})")


# ------------------------------------------------------------------------------------------- label pairing


def normalise(name: str) -> str:
    """Case, underscores and runs of spaces do not distinguish class names."""
    return " ".join(name.replace("_", " ").split()).casefold()


@dataclass(frozen=True)
class Pairing:
    """`to_class[i]` is the class index of labelmap line i; `how` is "name" or "position"."""

    to_class: list[int]
    how: str
    matched: int


def class_keys(dataset: str, names: list[str], alternatives: Mapping[str, list[str]]) -> dict[str, int]:
    """{normalised name or alternative name: class index}; names that collide are refused."""
    keys: dict[str, int] = {}
    for index, name in enumerate(names):
        for key in {normalise(n) for n in [name, *alternatives.get(name, [])]}:
            if keys.setdefault(key, index) != index:
                raise DatasetError(f"ELEVATER dataset {dataset!r}: classes {names[keys[key]]!r} and {name!r} "
                                   f"have the same normalised name {key!r}; names cannot pair labels one-to-one")
    return keys


def alias_targets(dataset: str, names: list[str], aliases: Mapping[str, str]) -> dict[str, int]:
    """{normalised label name: class index} of an alias table; every target must be a class name."""
    index = {name: i for i, name in enumerate(names)}
    unknown = sorted(t for t in aliases.values() if t not in index)
    if unknown:
        raise DatasetError(f"ELEVATER dataset {dataset!r}: aliases point at {unknown}, which are not class names")
    return {normalise(label): index[target] for label, target in aliases.items()}


def pair_labels(dataset: str, labelmap: list[str], names: list[str], alternatives: Mapping[str, list[str]],
                aliases: Mapping[str, str], mode: str = "auto") -> Pairing:
    """Pair labelmap lines with classes: by name when that is one-to-one; else, in mode auto, by position as
    ELEVATER's toolkit does, provided no matching name contradicts its position. Anything else is refused."""
    keys = {**class_keys(dataset, names, alternatives), **alias_targets(dataset, names, aliases)}
    targets = [keys.get(normalise(label)) for label in labelmap]
    where = f"ELEVATER dataset {dataset!r}"
    _refuse_duplicates(where, labelmap)
    if len(labelmap) != len(names):
        raise DatasetError(f"{where}: the labelmap has {len(labelmap)} names but ELEVATER's class list has "
                           f"{len(names)}; {_unmatched(labelmap, names, targets)}")
    claimed: dict[int, list[str]] = {}
    for label, target in zip(labelmap, targets):
        if target is not None:
            claimed.setdefault(target, []).append(label)
    shared = {names[t]: labels for t, labels in claimed.items() if len(labels) > 1}
    if shared:
        raise DatasetError(f"{where}: labelmap names pair with the same class, not one-to-one: {shared}")
    matched = sum(t is not None for t in targets)
    if matched == len(labelmap):
        return Pairing(list(targets), "name", matched)
    if mode == "name":
        raise DatasetError(f"{where}: the labelmap does not pair with the classes by name (label_match: name); "
                           f"{_unmatched(labelmap, names, targets)}; add them to the spec's 'aliases'")
    contradictions = [f"line {i} {label!r} is class {t} {names[t]!r}"
                      for i, (label, t) in enumerate(zip(labelmap, targets)) if t is not None and t != i]
    if contradictions:
        raise DatasetError(f"{where}: the labelmap pairs neither by name nor by position: "
                           f"{_shown(contradictions)}; {_unmatched(labelmap, names, targets)}")
    return Pairing(list(range(len(names))), "position", matched)


def _refuse_duplicates(where: str, labelmap: list[str]) -> None:
    seen: dict[str, str] = {}
    repeated = []
    for label in labelmap:
        key = normalise(label)
        if key in seen:
            repeated.append(f"{seen[key]!r} / {label!r}")
        seen.setdefault(key, label)
    if repeated:
        raise DatasetError(f"{where}: the labelmap repeats names, not one-to-one: {_shown(repeated)}")


def _unmatched(labelmap: list[str], names: list[str], targets: list[int | None]) -> str:
    loose = [label for label, t in zip(labelmap, targets) if t is None]
    free = [name for i, name in enumerate(names) if i not in set(targets)]
    return f"labelmap names without a class: {_shown([repr(x) for x in loose])}; classes without a labelmap name: " \
           f"{_shown([repr(x) for x in free])}"


def _shown(items: list[str]) -> str:
    more = f", and {len(items) - MAX_REPORTED} more" if len(items) > MAX_REPORTED else ""
    return "[" + ", ".join(items[:MAX_REPORTED]) + more + "]" if items else "none"


# ------------------------------------------------------------------------------------------- images


def _check_member_name(archive: Path, member: str, where: str) -> None:
    """The archives module's check: no absolute path, drive, NUL or '..' component (the member is then read by
    its exact name, as vision_datasets does)."""
    try:
        safe_name(archive, member)
    except UnsafeArchiveError as err:
        raise DatasetError(f"{where}: {err}") from None


class _Zips:
    """The split's zips, each opened once; members read by exact name (as vision_datasets does)."""

    def __init__(self, spec: ElevaterSpec, split: str, files: _Files):
        self.spec, self.split, self.files = spec, split, files
        self.allowed = spec.info["splits"][split]["files"]
        self.open: dict[str, zipfile.ZipFile] = {}

    def read(self, sample: Sample) -> bytes:
        zip_name, sep, member = sample.image.partition("@")
        if not sep:
            raise DatasetError(f"{sample.where}: image {sample.image!r} is not '<zip>@<path in zip>'")
        if zip_name not in self.allowed:
            raise DatasetError(f"{sample.where}: image {sample.image!r} is in {zip_name!r}, which is not among the "
                               f"split's files {self.allowed}")
        archive = self._archive(zip_name)
        _check_member_name(self.files.get(zip_name), member, sample.where)
        info = archive.NameToInfo.get(member)
        if info is None:
            raise DatasetError(f"{sample.where}: {member!r} is not in {zip_name!r} ({self.files.get(zip_name)})")
        kind = stat.S_IFMT(info.external_attr >> 16) if info.create_system == 3 else 0  # 3: made on Unix
        if info.is_dir() or kind not in (0, stat.S_IFREG):
            raise DatasetError(f"{sample.where}: {member!r} in {zip_name!r} is not a regular file (a folder, link or device)")
        try:
            return archive.read(info)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as err:
            raise self._corrupt(zip_name, f"cannot read {member!r}: {err}") from err

    def _archive(self, zip_name: str) -> zipfile.ZipFile:
        if zip_name not in self.open:
            path = self.files.get(zip_name)
            try:
                self.open[zip_name] = zipfile.ZipFile(path)
            except (zipfile.BadZipFile, OSError) as err:
                raise self._corrupt(zip_name, f"not a readable zip: {err}") from err
        return self.open[zip_name]

    def _corrupt(self, zip_name: str, problem: str) -> DatasetError:
        path = self.files.get(zip_name)
        done = forget_verification(path)
        return DatasetError(f"dataset {self.spec.name!r}: ELEVATER archive {zip_name!r} ({path}) is corrupt, {problem}; {done}")

    def close(self) -> None:
        for archive in self.open.values():
            archive.close()


# ------------------------------------------------------------------------------------------- build


def build(name: str, spec: dict, out_dir: Path) -> DatasetMeta:
    """Download (or take from the cache or mirror) the dataset's files, pair its labels with ELEVATER's
    classes and write the canonical dataset; rows in index order."""
    parsed = parse_spec(name, spec)
    files = _Files(parsed)
    if parsed.manual:
        _fetch_by_hand(parsed, files)
    names = parsed.info["classes"]
    alternatives = parsed.info.get("aliases", {})
    aliases = {**ALIASES.get(parsed.dataset, {}), **parsed.aliases}
    samples: dict[str, list[Sample]] = {}
    labels_record: dict[str, dict] = {}
    keys: list[str | None] = [None] * len(names)
    for ours, theirs in parsed.splits.items():
        labelmap, split_samples = read_split(parsed, theirs, files)
        try:
            pairing = pair_labels(parsed.dataset, labelmap, names, alternatives, aliases, parsed.label_match)
        except DatasetError as err:
            raise DatasetError(f"dataset {name!r} split {ours!r}: {err}") from None
        _note_positional(parsed, ours, pairing, len(labelmap))
        samples[ours] = [Sample(s.image, tuple(pairing.to_class[y] for y in s.labels), s.where) for s in split_samples]
        labels_record[ours] = {"pairing": pairing.how, "names_matched": pairing.matched, "labelmap": labelmap}
        for line, index in enumerate(pairing.to_class):
            keys[index] = keys[index] or labelmap[line]
        for zip_name in parsed.info["splits"][theirs]["files"]:
            files.get(zip_name)  # every download before any conversion: a missing file fails fast
    classes = [ClassInfo(index=i, name=n, aliases=list(alternatives.get(n, [])), key=k if k != n else None)
               for i, (n, k) in enumerate(zip(names, keys))]
    provenance = _provenance(parsed, files, labels_record)
    meta = DatasetMeta(name=name, task=parsed.task, metric=parsed.metric, classes=classes, provenance=provenance,
                       preprocess=parsed.preprocess)
    rows = {ours: _rows(parsed, ours, samples[ours], files, provenance) for ours in parsed.splits}
    return write_dataset(out_dir, meta, rows)


def _fetch_by_hand(spec: ElevaterSpec, files: _Files) -> None:
    """Every file the entry's splits need, or one error naming all those a person still has to bring."""
    wanted = [spec.info["labelmap"]] if spec.info.get("labelmap") else []
    for theirs in spec.splits.values():
        wanted += [spec.info["splits"][theirs]["index"], *spec.info["splits"][theirs]["files"]]
    missing = []
    for file in dict.fromkeys(wanted):
        try:
            files.get(file)
        except ManualDownloadError as err:
            missing.append(str(err))
    if missing:
        raise all_missing(missing)


def _note_positional(spec: ElevaterSpec, split: str, pairing: Pairing, n: int) -> None:
    if pairing.how == "position":
        print(f"note: dataset {spec.name!r} split {split!r}: {pairing.matched} of {n} labelmap names equal ELEVATER's "
              f"class names; labels paired by position, as ELEVATER's toolkit does", file=sys.stderr)


def _provenance(spec: ElevaterSpec, files: _Files, labels_record: dict) -> dict[str, Any]:
    return {
        "source": "elevater",
        "dataset": spec.dataset,
        "upstream": {**upstream(), "data_file": "vlbench/datasets/data/elevater.json"},
        "upstream_version": {"root_folder": spec.info["root_folder"], "version": spec.info.get("version")},
        "format": spec.info["format"],
        "split_map": dict(spec.splits),
        "files": files.records,
        "labels": labels_record,
        "counts": {},
        "skipped_corrupt": [],
    }


def _rows(spec: ElevaterSpec, split: str, samples: list[Sample], files: _Files, provenance: dict) -> Iterator[dict]:
    """Verified rows of one split, in index order. Without skip_corrupt every bad image is collected and reported
    in one error at the end (nothing is written: the dataset folder is atomic)."""
    zips = _Zips(spec, spec.splits[split], files)
    label_key = "labels" if spec.multi_label else "label"
    rows = ({"sample_id": s.image, label_key: list(s.labels) if spec.multi_label else s.labels[0], "image": zips.read(s)}
            for s in samples)
    try:
        yield from checked_rows(spec.name, split, rows, spec.skip_corrupt, provenance, "re-download the zip")
    finally:
        zips.close()


