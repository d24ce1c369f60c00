"""ImageNet's natural distribution shifts as dataset sources (`source: shift`): ImageNetV2, ImageNet-R, ImageNet-A, ObjectNet.

Each prepared shift is one split, `test`, of the images as distributed (never re-encoded), and its classes.json says
which ImageNet-1k classes each of its classes stands for: `provenance.imagenet_classes`, one list of ImageNet-1k class
indices (standard order: sorted wnids) per class. The `robustness` analysis scores the shift's images with the
ImageNet-1k entry's own class text features restricted to the union of those classes (the subset or mask the
dataset's authors define) and counts a prediction right when it is one of the image's class's ImageNet classes.
ImageNet-Sketch is the `imagenet-sketch` entry (source fewtrans): the full 50,889-image set, 1,000 wnid folders in
the standard order, mapped by wnid. docs/datasets.md ("Distribution shifts") and docs/protocols.md ("Robustness")
give every rule's source and the differences from CLIP_benchmark.

Spec (a registry entry's `prepare`):

    source: shift
    layout: v2 | hendrycks | objectnet   # LAYOUTS
    files: {archive: {file, url|urls, md5|sha256, manual}}
    root: imagenetv2-matched-frequency-format-val   # the archive's folder holding the class folders
    subset: imagenet-r                   # hendrycks: the 200-wnid list of data/shifts.json the folders must equal
    password: objectnetisatestset        # objectnet: the zip's published password (ZipCrypto)
    images: 10000                        # checked where given; the catalogue's split size
    preprocess: default                  # objectnet: objectnet (crop the border before the model's transform)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from vlbench.datasets.archives import iter_members, read_member
from vlbench.datasets.canonical import ClassInfo, DatasetError, DatasetMeta, write_dataset
from vlbench.datasets.download import fetch_files, resource
from vlbench.datasets.imagenet import clip_classnames
from vlbench.datasets.images import checked_rows
from vlbench.datasets.spec import check_flag, check_keys

KEYS = ("source", "layout", "files", "root", "subset", "password", "classes", "images", "preprocess", "upstream",
        "skip_corrupt")
SPLIT = "test"
SUBSETS_FILE = Path(__file__).with_name("data") / "shifts.json"
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
OBJECTNET_MAPPINGS = "mappings"  # objectnet-1.0/mappings/ beside objectnet-1.0/images/


@dataclass
class Shift:
    """The classes (each with the ImageNet-1k indices it stands for) and a function that streams
    (sample_id, label, bytes) from the archive."""

    classes: list[ClassInfo]
    imagenet: list[list[int]]
    rows: Callable[[], Iterator[tuple[str, int, bytes]]]


# ------------------------------------------------------------------------------------------------ layouts


def read_v2(name: str, spec: Mapping, archive: Path) -> Shift:
    """ImageNetV2 (Recht et al. 2019), the tarball layout `<root>/<k>/<hash>.jpeg` with k = 0..999 the ImageNet-1k
    class index (modestyachts/ImageNetV2; CLIP_benchmark's imagenetv2.py takes the label from the folder name)."""
    names = clip_classnames()
    classes = [ClassInfo(index=i, name=n, key=str(i)) for i, n in enumerate(names)]

    def label(member: str) -> int:
        folder = _class_folder(name, spec, archive, member)
        if not (folder.isdigit() and int(folder) < len(names) and str(int(folder)) == folder):
            raise DatasetError(f"dataset {name!r}: {archive} member {member!r}: class folder {folder!r} is not an "
                               f"ImageNet class index 0..{len(names) - 1}")
        return int(folder)

    return Shift(classes, [[i] for i in range(len(names))], _rows(name, spec, archive, label))


def read_hendrycks(name: str, spec: Mapping, archive: Path) -> Shift:
    """ImageNet-R / ImageNet-A (Hendrycks et al.), `<root>/<wnid>/<file>`: the class folders must be exactly the
    authors' 200 wnids (`subset`); classes in sorted-wnid order (ImageFolder's, and the order of the authors' mask over
    the 1,000 classes), named by CLIP's ImageNet names."""
    subset = subset_table(name, spec.get("subset"))
    names = clip_classnames()
    classes = [ClassInfo(index=k, name=names[i], wnid=w) for k, (w, i) in enumerate(zip(subset["wnids"],
                                                                                         subset["indices"]))]
    label_of = {w: k for k, w in enumerate(subset["wnids"])}
    seen: set[str] = set()

    def label(member: str) -> int:
        folder = _class_folder(name, spec, archive, member)
        if folder not in label_of:
            raise DatasetError(f"dataset {name!r}: {archive} member {member!r}: class folder {folder!r} is not one of "
                               f"the {len(label_of)} wnids of {spec.get('subset')!r} ({SUBSETS_FILE.name})")
        seen.add(folder)
        return label_of[folder]

    def rows() -> Iterator[tuple[str, int, bytes]]:
        yield from _rows(name, spec, archive, label)()
        absent = sorted(set(label_of) - seen)
        if absent:
            raise DatasetError(f"dataset {name!r}: {archive} has no images of {len(absent)} of the "
                               f"{len(label_of)} classes of {spec.get('subset')!r} (e.g. {absent[:3]}); is this the "
                               f"right archive?")

    return Shift(classes, [[i] for i in subset["indices"]], rows)


def read_objectnet(name: str, spec: Mapping, archive: Path) -> Shift:
    """ObjectNet 1.0 (Barbu et al. 2019): the 113 ObjectNet classes that overlap ImageNet-1k, from the zip's own
    mappings (`objectnet_mapping`); images of other classes are left out. Classes in sorted-folder order (CLIP_benchmark's
    label_map), named by ObjectNet's labels; each stands for its ImageNet classes."""
    password = str(spec["password"]).encode() if spec.get("password") is not None else None
    base = f"{spec.get('root', 'objectnet-1.0')}/{OBJECTNET_MAPPINGS}"
    files = {f: _member(name, archive, f"{base}/{f}", password) for f in OBJECTNET_FILES}
    folders = objectnet_mapping(name, files)
    order = sorted(folders)
    classes = [ClassInfo(index=k, name=folders[f][0], key=f) for k, f in enumerate(order)]
    label_of = {f: k for k, f in enumerate(order)}
    images_root = f"{spec.get('root', 'objectnet-1.0')}/images"

    def rows() -> Iterator[tuple[str, int, bytes]]:
        for member, data in _members(name, archive, password):
            path = PurePosixPath(member)
            if not member.startswith(images_root + "/") or len(path.parts) < 2:
                continue
            folder = path.parent.name
            if folder in label_of:
                yield str(path.relative_to(images_root)), label_of[folder], data

    return Shift(classes, [folders[f][1] for f in order], rows)


OBJECTNET_FILES = ("folder_to_objectnet_label.json", "objectnet_to_imagenet_1k.json",
                   "pytorch_to_imagenet_2012_id.json", "imagenet_to_label_2012_v2")


def objectnet_mapping(name: str, files: Mapping[str, bytes]) -> dict[str, tuple[str, list[int]]]:
    """{image folder: (ObjectNet label, [ImageNet-1k class indices])} for the ObjectNet classes that map to ImageNet,
    from the four files of objectnet-1.0/mappings/: folder_to_objectnet_label.json (folder -> label),
    objectnet_to_imagenet_1k.json (label -> ImageNet labels joined by "; "), imagenet_to_label_2012_v2 (line k: the
    label of ILSVRC-2012 id k, counted from 0) and pytorch_to_imagenet_2012_id.json (class index -> that id); the chain
    CLIP_benchmark's objectnet.py (from wise-ft) and imagenet-testbed's objectnet.py follow."""
    folder_label = _json(name, files, "folder_to_objectnet_label.json")
    to_imagenet = _json(name, files, "objectnet_to_imagenet_1k.json")
    pytorch = _json(name, files, "pytorch_to_imagenet_2012_id.json")
    index_of_id = {int(v): int(k) for k, v in pytorch.items()}
    lines = files["imagenet_to_label_2012_v2"].decode("utf-8").splitlines()
    index_of_label = {line.strip(): index_of_id[i] for i, line in enumerate(lines) if i in index_of_id}
    folder_of = {label: folder for folder, label in folder_label.items()}
    mapping = {}
    for label, imagenet in to_imagenet.items():
        if label not in folder_of:
            raise DatasetError(f"dataset {name!r}: objectnet_to_imagenet_1k.json names ObjectNet class {label!r}, which "
                               f"folder_to_objectnet_label.json lacks")
        unknown = [n for n in imagenet.split("; ") if n not in index_of_label]
        if unknown:
            raise DatasetError(f"dataset {name!r}: objectnet_to_imagenet_1k.json maps {label!r} to {unknown[:3]}, not "
                               f"found in imagenet_to_label_2012_v2")
        mapping[folder_of[label]] = (label, [index_of_label[n] for n in imagenet.split("; ")])
    return mapping


# layout -> reader
LAYOUTS: dict[str, Callable[[str, Mapping, Path], Shift]] = {
    "v2": read_v2,
    "hendrycks": read_hendrycks,
    "objectnet": read_objectnet,
}


# ------------------------------------------------------------------------------------------------ public


def subset_table(name: str, subset: str | None) -> dict[str, list]:
    """The authors' 200 wnids of ImageNet-R or ImageNet-A and their ImageNet-1k indices (data/shifts.json)."""
    tables = {k: v for k, v in json.loads(SUBSETS_FILE.read_text()).items() if not k.startswith("_")}
    if subset not in tables:
        raise DatasetError(f"dataset {name!r}: subset {subset!r} is not one of {sorted(tables)} ({SUBSETS_FILE})")
    return tables[subset]


def catalogue_row(name: str, spec: dict) -> dict:
    check_keys(name, spec, KEYS)
    _layout(name, spec)
    res = resource(name, (spec.get("files") or {}).get("archive") or {})
    images = spec.get("images")
    return {"classes": spec.get("classes"), "splits": {SPLIT: images} if images else {}, "metric": "accuracy",
            "manual_download": not res.urls}


def build(name: str, spec: dict, out_dir: Path) -> DatasetMeta:
    check_keys(name, spec, KEYS)
    layout = _layout(name, spec)
    fetched = fetch_files(name, {}, {"archive": (spec.get("files") or {}).get("archive") or {}})
    res, archive = fetched["archive"]
    shift = LAYOUTS[layout](name, spec, archive)
    if spec.get("classes") is not None and spec["classes"] != len(shift.classes):
        raise DatasetError(f"dataset {name!r}: the files hold {len(shift.classes)} classes, the entry says "
                           f"{spec['classes']} (spec 'classes'); is this the right archive?")
    provenance = {"source": "shift", "layout": layout, "upstream": spec.get("upstream"),
                  "files": {"archive": res.provenance(archive)}, "imagenet_classes": shift.imagenet,
                  "skipped_corrupt": []}
    meta = DatasetMeta(name=name, task="single-label", metric="accuracy", classes=shift.classes,
                       provenance=provenance, preprocess=spec.get("preprocess", "default"))
    skip = check_flag(name, spec, "skip_corrupt")
    rows = _counted(name, spec, ({"sample_id": s, "label": y, "image": b} for s, y, b in shift.rows()))
    return write_dataset(out_dir, meta, {SPLIT: checked_rows(name, SPLIT, rows, skip, provenance, "replace the archive")})


# ------------------------------------------------------------------------------------------------ helpers


def _layout(name: str, spec: Mapping) -> str:
    layout = spec.get("layout")
    if layout not in LAYOUTS:
        raise DatasetError(f"dataset {name!r}: layout {layout!r} is not one of {list(LAYOUTS)}")
    return layout


def _rows(name: str, spec: Mapping, archive: Path, label: Callable[[str], int]
          ) -> Callable[[], Iterator[tuple[str, int, bytes]]]:
    """(sample_id: the path below `root`, label, bytes) of every image under `root`, in archive order."""
    root = str(spec.get("root", "")).strip("/")

    def rows() -> Iterator[tuple[str, int, bytes]]:
        for member, data in _members(name, archive, None):
            if root and not member.startswith(root + "/"):
                continue
            yield member[len(root) + 1:] if root else member, label(member), data

    return rows


def _members(name: str, archive: Path, password: bytes | None) -> Iterator[tuple[str, bytes]]:
    try:
        yield from iter_members(archive, IMAGE_SUFFIXES, password)
    except RuntimeError as err:  # zipfile: an encrypted member without (or with a wrong) password
        raise DatasetError(f"dataset {name!r}: cannot read {archive} ({err}); check the entry's 'password'") from None


def _member(name: str, archive: Path, member: str, password: bytes | None) -> bytes:
    try:
        return read_member(archive, member, password)
    except RuntimeError as err:
        raise DatasetError(f"dataset {name!r}: cannot read {member!r} in {archive} ({err}); check the entry's "
                           f"'password'") from None


def _class_folder(name: str, spec: Mapping, archive: Path, member: str) -> str:
    parts = PurePosixPath(member).parts
    depth = len(PurePosixPath(str(spec.get("root", "")).strip("/")).parts) if spec.get("root") else 0
    if len(parts) != depth + 2:
        raise DatasetError(f"dataset {name!r}: {archive} member {member!r} is not <root>/<class folder>/<image> "
                           f"(root {spec.get('root')!r})")
    return parts[depth]


def _json(name: str, files: Mapping[str, bytes], key: str) -> dict:
    try:
        value = json.loads(files[key])
    except ValueError as err:
        raise DatasetError(f"dataset {name!r}: ObjectNet's mappings/{key} is not JSON ({err})") from None
    if not isinstance(value, dict):
        raise DatasetError(f"dataset {name!r}: ObjectNet's mappings/{key} must be a JSON object")
    return value


def _counted(name: str, spec: Mapping, rows: Iterator[dict]) -> Iterator[dict]:
    """The rows, then a check of their number against the entry's `images` where given."""
    n = 0
    for row in rows:
        n += 1
        yield row
    if spec.get("images") is not None and n != spec["images"]:
        raise DatasetError(f"dataset {name!r}: the archive holds {n} images, the entry says {spec['images']} "
                           f"(spec 'images'); is this the right archive?")


__all__ = ["build", "catalogue_row", "objectnet_mapping", "subset_table", "LAYOUTS"]
