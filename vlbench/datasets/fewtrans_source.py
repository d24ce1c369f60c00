"""FewTrans's ten datasets as the authors' code reads them (`source: fewtrans`).

Luo et al., "Benchmarking Few-shot Transferability of Pre-trained Models with Improved Evaluation Protocols", App. B.1;
code Frankluox/FewTrans@9290c48: `data/dataset_spec.py` (`create_*_spec`: class list, class names, each class's
image pool), `prepare_datasets.py` (what it converts first: CIFAR-100, Aircraft) and
`write_yaml_test_with_arg_visual_only.py` (each dataset's root folder). FewTrans evaluates only: every image of a
class is in its pool (support and query are both drawn from it), so a prepared FewTrans dataset has one split, `test`,
holding every image the code can sample, class by class in the code's class order and each class's rows in the
code's pool order (so that `adapt.fewtrans`'s seeded draws pick what the code's would).

Spec (a registry entry's `prepare`):

    source: fewtrans
    layout: folders        # folders | flowers | fungi | aircraft | cifar (LAYOUTS)
    files: {<role>: {file, url|urls, md5|sha256, manual}}   # download.Resource per role the layout reads
    root: dtd/images       # folders/aircraft/fungi: the folder of the extracted archive the code's root is
    names: folder          # folders: folder (as is) | underscores ("_" -> " ", the code's get_real_names) |
                           #   imagenet (CLIP's names, class folders are wnids) | a table of data/fewtrans_names.json
    classes: 47            # checked; the catalogue's count
    images: 5640           # checked where given (a wrong manual file is refused); the catalogue's split size
    variant_folders: paper # aircraft only: paper (100 variants) | code (the class folders the code's converter makes)
    converter_resize: false  # cifar only: true stores the code converter's 84x84 LANCZOS resize of each image
    preprocess: default    # or fewtrans: the code's test transform (canonical.PREPROCESS; docs/protocols.md)
    metric: accuracy
    skip_corrupt: false

docs/datasets.md ("FewTrans's 10 datasets") has every dataset's rule with its source and every difference.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlbench.datasets.archives import extract
from vlbench.datasets.canonical import ClassInfo, DatasetError, DatasetMeta, write_dataset
from vlbench.datasets.cifar import unpickle
from vlbench.datasets.download import fetch_files, resource
from vlbench.datasets.imagenet import clip_classnames
from vlbench.datasets.images import checked_rows
from vlbench.datasets.spec import check_flag, check_keys

KEYS = ("source", "layout", "files", "root", "names", "classes", "images", "variant_folders", "converter_resize",
        "preprocess", "metric", "skip_corrupt", "upstream")
CONVERTER_SIZE = 84  # prepare_datasets.py process_cifar: pil_image.resize((84, 84), resample=Image.LANCZOS)
SPLIT = "test"
# data/dataset_spec.py IMG_EXTENSIONS, matched case-insensitively (has_file_allowed_extension lowers the name)
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
NAMES_FILE = Path(__file__).with_name("data") / "fewtrans_names.json"
NAME_MODES = ("folder", "underscores", "imagenet")


@dataclass
class Pools:
    """The code's classes in its order, and per class the (sample_id, file) of its pool in the code's order."""

    classes: list[ClassInfo]
    pools: list[list[tuple[str, Callable[[], bytes]]]]


# ------------------------------------------------------------------------------------------------ public


def catalogue_row(name: str, spec: dict) -> dict:
    """Classes, the one split's size where the spec knows it, metric, manual download: no download."""
    check_keys(name, spec, KEYS)
    _layout(name, spec)
    files = _resources(name, spec)
    images = spec.get("images")
    return {"classes": spec.get("classes"), "splits": {SPLIT: images} if images else {},
            "metric": spec.get("metric", "accuracy"), "manual_download": any(not r.urls for r in files.values())}


def build(name: str, spec: dict, out_dir: Path) -> DatasetMeta:
    check_keys(name, spec, KEYS)
    layout = _layout(name, spec)
    _resources(name, spec)
    fetched = fetch_files(name, {}, {role: spec["files"][role] for role in LAYOUTS[layout][0]})
    paths = {role: path for role, (_, path) in fetched.items()}
    read = LAYOUTS[layout][1]
    pools = read(name, spec, paths)
    _check_counts(name, spec, pools)
    provenance = {"source": "fewtrans", "layout": layout, "upstream": spec.get("upstream"),
                  "files": {role: res.provenance(path) for role, (res, path) in fetched.items()},
                  "pool_order": "each class's rows in the order FewTrans' data/dataset_spec.py lists its pool",
                  "counts": {}, "skipped_corrupt": []}
    meta = DatasetMeta(name=name, task="single-label", metric=spec.get("metric", "accuracy"), classes=pools.classes,
                       provenance=provenance, preprocess=spec.get("preprocess", "default"))
    rows = ({"sample_id": sid, "label": label, "image": load()}
            for label, pool in enumerate(pools.pools) for sid, load in pool)
    skip = check_flag(name, spec, "skip_corrupt")
    return write_dataset(out_dir, meta, {SPLIT: checked_rows(name, SPLIT, rows, skip, provenance, "replace the archive")})


# ------------------------------------------------------------------------------------------------ layouts


def read_folders(name: str, spec: Mapping, paths: Mapping[str, Path]) -> Pools:
    """`create_{DTD,QuickDraw,ucf,euroSAT,plantD,cifar100}_spec` and ImageNet-Sketch's leaves: classes =
    sorted(os.listdir(root)), each class's pool = its image files (IMG_EXTENSIONS), sorted. `__MACOSX` and hidden
    folders are not classes; a class folder without an image file is an error naming it."""
    root = _root(name, spec, paths["archive"])
    keys = sorted(p.name for p in root.iterdir() if p.is_dir() and not _foreign(p.name))
    pools = [[(f"{key}/{f.name}", f.read_bytes) for f in sorted((root / key).iterdir(), key=lambda p: p.name)
              if f.is_file() and is_image_file(f.name)] for key in keys]
    empty = [key for key, pool in zip(keys, pools) if not pool]
    if empty:
        raise DatasetError(f"dataset {name!r}: class folder(s) {empty[:10]} under {root} hold no image file "
                           f"({len(empty)} of {len(keys)}); is this the right archive, or the right 'root'?")
    return Pools(class_names(name, spec.get("names", "folder"), keys), pools)


def _foreign(folder: str) -> bool:
    """A folder that is not a class: macOS's resource forks (`__MACOSX`) and hidden folders (`.git`, `.thumbs`)."""
    return folder == "__MACOSX" or folder.startswith(".")


def read_flowers(name: str, spec: Mapping, paths: Mapping[str, Path]) -> Pools:
    """`create_VGGFlower_spec`: classes in label order 1..102 named by VggFlower_labels.txt; a class's pool is
    jpg/image_{i:05d}.jpg for every i whose imagelabels.mat label it is, in image-number order."""
    from scipy.io import loadmat

    try:
        labels = [int(x) for x in loadmat(str(paths["labels"]))["labels"][0]]
    except (OSError, ValueError, KeyError, IndexError) as err:
        raise DatasetError(f"dataset {name!r}: cannot read the labels of {paths['labels']} ({err})") from None
    flowers = json.loads(NAMES_FILE.read_text())["vgg_flower"]
    bad = sorted({y for y in labels if not 1 <= y <= len(flowers)})
    if bad:
        raise DatasetError(f"dataset {name!r}: {paths['labels']} has label(s) {bad[:5]} outside 1..{len(flowers)}")
    root = _root(name, spec, paths["images"])
    pools: list[list] = [[] for _ in flowers]
    for i, y in enumerate(labels):
        sid = f"jpg/image_{i + 1:05d}.jpg"
        pools[y - 1].append((sid, _reader(name, root / sid)))
    classes = [ClassInfo(index=i, name=n, key=f"{i + 1:03d}.{n}") for i, n in enumerate(flowers)]
    return Pools(classes, pools)


def read_fungi(name: str, spec: Mapping, paths: Mapping[str, Path]) -> Pools:
    """`create_fungi_spec`: train.json and val.json (the test set has no labels); classes sorted by category id
    (ids must be 0..n-1), key '{id:04d}.{name}' (names repeat), display name the category's name; a class's pool is
    its images in the order of train's then val's image lists (not sorted)."""
    notes = extract(paths["annotations"])
    train, val = (_load_json(name, _find(name, notes, f"{s}.json")) for s in ("train", "val"))
    if train.get("categories") != val.get("categories"):
        raise DatasetError(f"dataset {name!r}: train.json and val.json list different categories")
    categories = sorted(train["categories"], key=lambda c: c["id"])
    if [c["id"] for c in categories] != list(range(len(categories))):
        raise DatasetError(f"dataset {name!r}: train.json's category ids are not 0..{len(categories) - 1}")
    images = train["images"] + val["images"]
    label = {}
    for a in train["annotations"] + val["annotations"]:
        if a["image_id"] in label:
            raise DatasetError(f"dataset {name!r}: image id {a['image_id']} is annotated twice")
        label[a["image_id"]] = a["category_id"]
    root = _root(name, spec, paths["images"])
    pools: list[list] = [[] for _ in categories]
    for image in images:
        if image["id"] not in label:
            raise DatasetError(f"dataset {name!r}: image {image['file_name']!r} (id {image['id']}) has no annotation")
        pools[label[image["id"]]].append((image["file_name"], _reader(name, root / image["file_name"])))
    classes = [ClassInfo(index=c["id"], name=c["name"], key=f"{c['id']:04d}.{c['name']}") for c in categories]
    return Pools(classes, pools)


def read_aircraft(name: str, spec: Mapping, paths: Mapping[str, Path]) -> Pools:
    """`process_aircraft` then `create_Aircraft_spec`: the 100 variants of data/variants.txt, their images from
    images_variant_trainval.txt and images_variant_test.txt (all 10,000), each class's pool its image ids sorted
    (the converter numbers them file_000001.png... in that order, uncropped); classes sorted by name. With
    `variant_folders: code`, the classes are the folders the converter really makes: a variant with '/' (F-16A/B,
    F/A-18) becomes a folder named by its part before the '/' holding a sub-folder, which the spec lists as a class
    without images."""
    base = _root(name, spec, paths["archive"]) / "data"
    variants = [v for v in _lines(name, base / "variants.txt") if v]
    by_variant: dict[str, list[str]] = {v: [] for v in variants}
    for listing in ("images_variant_trainval.txt", "images_variant_test.txt"):
        for line in _lines(name, base / listing):
            image, _, variant = line.partition(" ")
            if variant not in by_variant:
                raise DatasetError(f"dataset {name!r}: {base / listing}: image {image!r} has unknown variant {variant!r}")
            by_variant[variant].append(image)
    mode = spec.get("variant_folders", "paper")
    if mode not in ("paper", "code"):
        raise DatasetError(f"dataset {name!r}: variant_folders must be 'paper' or 'code', got {mode!r}")
    folder = {v: v.split("/")[0] if mode == "code" else v for v in variants}
    order = sorted(variants, key=lambda v: folder[v])
    pools = [[] if mode == "code" and "/" in v else
             [(f"data/images/{i}.jpg", _reader(name, base / "images" / f"{i}.jpg")) for i in sorted(by_variant[v])]
             for v in order]
    classes = [ClassInfo(index=k, name=folder[v], key=v if folder[v] != v else None) for k, v in enumerate(order)]
    return Pools(classes, pools)


def read_cifar(name: str, spec: Mapping, paths: Mapping[str, Path]) -> Pools:
    """`process_cifar(imagesFileName='test')` then `create_cifar100_spec`: the `test` batch only, one folder per
    fine label name holding each image under its `filenames` entry (a later image with the same name replaces the
    earlier, as saving it does); classes = the sorted folder names, named as the folders are ("maple_tree"); each
    class's pool its file names sorted. Images are PNGs of the official 32x32 pixels (the code's converter resizes
    them to 84x84 with LANCZOS first: docs/datasets.md)."""
    folder = _root(name, spec, paths["archive"])
    names = list(unpickle(name, folder / "meta")["fine_label_names"])
    batch = unpickle(name, folder / "test")
    files: dict[str, dict[str, Any]] = {n: {} for n in names}
    for pixels, label, filename in zip(batch["data"], batch["fine_labels"], batch["filenames"]):
        files[names[label]][filename] = pixels
    keys = sorted(names)
    size = CONVERTER_SIZE if check_flag(name, spec, "converter_resize") else None
    pools = [[(f"{key}/{f}", _png(files[key][f], size)) for f in sorted(files[key])] for key in keys]
    return Pools([ClassInfo(index=i, name=key) for i, key in enumerate(keys)], pools)


# layout -> (file roles it reads, reader)
LAYOUTS: dict[str, tuple[tuple[str, ...], Callable[[str, Mapping, Mapping[str, Path]], Pools]]] = {
    "folders": (("archive",), read_folders),
    "flowers": (("images", "labels"), read_flowers),
    "fungi": (("images", "annotations"), read_fungi),
    "aircraft": (("archive",), read_aircraft),
    "cifar": (("archive",), read_cifar),
}
LAYOUT_KEYS = {"variant_folders": "aircraft", "converter_resize": "cifar", "names": "folders"}  # key -> its layout


# ------------------------------------------------------------------------------------------------ names


def class_names(name: str, mode: str, keys: list[str]) -> list[ClassInfo]:
    """ClassInfo per class folder `keys[i]`: named as the folder, with '_' as spaces, by CLIP's ImageNet names
    (folders are wnids), or by a table of fewtrans_names.json (every folder must be in it)."""
    if mode == "imagenet":
        return _imagenet(name, keys)
    if mode in ("folder", "underscores"):
        shown = [k if mode == "folder" else " ".join(k.split("_")).strip() for k in keys]
        return [ClassInfo(index=i, name=s, key=k if s != k else None) for i, (k, s) in enumerate(zip(keys, shown))]
    tables = json.loads(NAMES_FILE.read_text())["tables"]
    if mode not in tables:
        raise DatasetError(f"dataset {name!r}: names {mode!r} is not one of {list(NAME_MODES) + sorted(tables)}")
    unknown = [k for k in keys if k not in tables[mode]]
    if unknown:
        raise DatasetError(f"dataset {name!r}: class folder(s) {unknown[:5]} have no name in {NAMES_FILE.name} "
                           f"table {mode!r} (FewTrans' hand-written names); is this the right archive?")
    return [ClassInfo(index=i, name=tables[mode][k], key=k) for i, k in enumerate(keys)]


def _imagenet(name: str, keys: list[str]) -> list[ClassInfo]:
    clip = clip_classnames()
    if len(keys) != len(clip) or any(not (k.startswith("n") and k[1:].isdigit()) for k in keys):
        raise DatasetError(f"dataset {name!r}: expected {len(clip)} class folders named by ImageNet wnids, found "
                           f"{len(keys)} (e.g. {keys[:3]})")
    return [ClassInfo(index=i, name=n, wnid=k) for i, (k, n) in enumerate(zip(keys, clip))]


# ------------------------------------------------------------------------------------------------ helpers


def is_image_file(filename: str) -> bool:
    return filename.lower().endswith(IMG_EXTENSIONS)


def _layout(name: str, spec: Mapping) -> str:
    layout = spec.get("layout")
    if layout not in LAYOUTS:
        raise DatasetError(f"dataset {name!r}: layout {layout!r} is not one of {list(LAYOUTS)}")
    foreign = sorted(k for k, owner in LAYOUT_KEYS.items() if k in spec and owner != layout)
    if foreign:
        raise DatasetError(f"dataset {name!r}: key(s) {foreign} apply to layout {LAYOUT_KEYS[foreign[0]]!r} only, "
                           f"not {layout!r}")
    return layout


def _resources(name: str, spec: Mapping) -> dict:
    files, roles = spec.get("files"), LAYOUTS[_layout(name, spec)][0]
    if not isinstance(files, Mapping) or sorted(files) != sorted(roles):
        raise DatasetError(f"dataset {name!r}: 'files' must give exactly the roles {list(roles)} of layout "
                           f"{spec.get('layout')!r}, got {sorted(files) if isinstance(files, Mapping) else files!r}")
    return {role: resource(name, files[role]) for role in roles}


def _root(name: str, spec: Mapping, archive: Path) -> Path:
    tree = extract(archive)
    root = tree / spec.get("root", ".")
    if not root.is_dir():
        top = sorted(p.name for p in tree.iterdir() if not p.name.startswith("."))[:10]
        raise DatasetError(f"dataset {name!r}: archive {archive} has no folder {spec.get('root')!r} (spec 'root'); "
                           f"its top level: {top}")
    return root


def _find(name: str, tree: Path, filename: str) -> Path:
    found = sorted(tree.rglob(filename))
    if len(found) != 1:
        raise DatasetError(f"dataset {name!r}: expected one {filename} in {tree}, found {len(found)}")
    return found[0]


def _load_json(name: str, path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise DatasetError(f"dataset {name!r}: {path}: not a readable JSON file ({err})") from None


def _lines(name: str, path: Path) -> list[str]:
    try:
        return [line.rstrip("\n") for line in path.read_text().splitlines()]
    except OSError as err:
        raise DatasetError(f"dataset {name!r}: cannot read {path} ({err.strerror or err})") from None


def _reader(name: str, path: Path) -> Callable[[], bytes]:
    def read() -> bytes:
        try:
            return path.read_bytes()
        except OSError as err:
            raise DatasetError(f"dataset {name!r}: image {path} listed by the annotations is missing "
                               f"({err.strerror or err})") from None
    return read


def _png(pixels, size: int | None = None) -> Callable[[], bytes]:
    """PNG bytes of a CIFAR row (3072 values, channel-major), resized to size x size with LANCZOS when given."""
    def encode() -> bytes:
        import numpy as np
        from PIL import Image

        image = Image.fromarray(np.asarray(pixels, dtype=np.uint8).reshape(3, 32, 32).transpose(1, 2, 0))
        if size is not None:
            image = image.resize((size, size), resample=Image.LANCZOS)
        buffer = io.BytesIO()
        image.save(buffer, "PNG")
        return buffer.getvalue()
    return encode


def _check_counts(name: str, spec: Mapping, pools: Pools) -> None:
    """The spec's class count (and image count where given) against what the files hold."""
    found = (len(pools.classes), sum(len(p) for p in pools.pools))
    for key, n in zip(("classes", "images"), found):
        if spec.get(key) is not None and spec[key] != n:
            raise DatasetError(f"dataset {name!r}: the files hold {n} {key}, FewTrans' dataset has {spec[key]} "
                               f"(spec {key!r}); is this the right archive?")


__all__ = ["build", "catalogue_row", "class_names", "is_image_file", "LAYOUTS"]
