"""ImageNet-1k validation (ILSVRC2012) as a dataset source (`source: imagenet`).

`prepare: {source: imagenet}` (optional `skip_corrupt`, and `files` to override a file's name or checksum).

Files. image-net.org needs a login and acceptance of its terms, so both files are a manual download
(`ManualDownloadError` says where to get them and where to put them): `ILSVRC2012_img_val.tar` (6.3 GB, md5
29b22e2961454d5413ddabcf34fc5622) and `ILSVRC2012_devkit_t12.tar.gz` (2.5 MB, md5
fa75699e90414af021442c21a62c3abf), the md5s torchvision publishes (`torchvision.datasets.imagenet.ARCHIVE_META`);
no sha256 is published upstream. Put them in the download cache or the local mirror folder (see
vlbench/datasets/download.py).

Labels. torchvision's devkit parser (`parse_devkit_archive` / `load_meta_file`) reads `data/meta.mat` (the 1000
leaf synsets and their WordNet lemmas) and `data/ILSVRC2012_validation_ground_truth.txt` (an ILSVRC2012_ID per
validation image, in image-number order). Class order is the standard one: the 1000 wnids sorted (index 0 =
n01440764 tench), as torchvision's `ImageNet` and every ImageFolder copy number them.

Class names are CLIP's (OpenAI's prompt-engineering names, as open_clip ships them in
`open_clip.zero_shot_metadata.IMAGENET_CLASSNAMES`), in the same standard order; they include two duplicate
names ("missile" at 657 and 744, "sunglasses" at 836 and 837), kept as CLIP has them. Each class also carries
its `wnid` and the devkit's WordNet lemmas as `aliases`.

Images. The JPEG bytes are streamed member by member from the tar (never the whole tar in memory, never
extracted to disk) into the one split `test` (50,000 images, 50 per class: ILSVRC-2012's validation images,
which serve as ImageNet's test set, as in ELEVATER's `imagenet-1k`), each verified with `image_problem`;
`sample_id` is the file name (`ILSVRC2012_val_00000001.JPEG`).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from vlbench.datasets.archives import iter_members
from vlbench.datasets.canonical import (
    ClassInfo,
    DatasetError,
    DatasetMeta,
    write_dataset,
)
from vlbench.datasets.images import checked_rows
from vlbench.datasets.download import fetch, fetch_files, resource as make_resource
from vlbench.datasets.spec import check_flag, check_keys
from vlbench.datasets.wnids import CLASS_INFO, IMAGENET_CLASSES, parse_class_info

KEYS = ("source", "files", "skip_corrupt")
NUM_CLASSES = 1000
VAL_PER_CLASS = 50
VAL_IMAGES = NUM_CLASSES * VAL_PER_CLASS
SPLIT = "test"  # the ILSVRC-2012 validation images are the test split (ELEVATER names them so too)
UPSTREAM = "ILSVRC2012 (ImageNet-1k) validation set, devkit t12"
FIX = "replace the archive"  # what a corrupt-image error advises
CLASS_NAMES_SOURCE = "OpenAI CLIP's ImageNet class names, as open_clip ships them (zero_shot_metadata.IMAGENET_CLASSNAMES)"
DOWNLOAD_PAGE = "https://image-net.org/challenges/LSVRC/2012/2012-downloads.php"
MAX_REPORTED = 20  # corrupt images named in one error; the rest are counted
VAL_NAME = re.compile(r"ILSVRC2012_val_(\d{8})\.JPEG")


def _manual(section: str) -> str:
    return (f"{DOWNLOAD_PAGE} (log in with an image-net.org account and accept the terms of access; "
            f"ILSVRC2012, section {section!r})")


# Spec mappings as download.resource reads them; an entry's `files: {role: {...}}` replaces one of them.
FILES = {
    "devkit": {"file": "ILSVRC2012_devkit_t12.tar.gz", "md5": "fa75699e90414af021442c21a62c3abf",
               "manual": _manual("Development kit (Task 1 & 2)")},
    "val_images": {"file": "ILSVRC2012_img_val.tar", "md5": "29b22e2961454d5413ddabcf34fc5622",
                   "manual": _manual("Validation images (all tasks)")},
}


# ------------------------------------------------------------------------------------------------ files


# ----------------------------------------------------------------------------------------------- devkit


@dataclass(frozen=True)
class Devkit:
    """What the ILSVRC2012 devkit says about the validation set."""

    wnids: list[str]  # the classes in the standard order (sorted wnids)
    lemmas: dict[str, tuple[str, ...]]  # wnid -> WordNet lemmas ("tench", "Tinca tinca")
    val_wnids: list[str]  # val_wnids[k] is the class of ILSVRC2012_val_<k+1>.JPEG


def read_devkit(name: str, devkit: Path) -> Devkit:
    """Parse the devkit archive with torchvision's parser (it checks the official md5 itself)."""
    from torchvision.datasets.imagenet import load_meta_file, parse_devkit_archive

    with tempfile.TemporaryDirectory(prefix="vlbench-devkit-") as root:
        # torchvision reads `root/<file>` and writes its parsed meta.bin beside it: a scratch folder, not the cache.
        os.symlink(Path(devkit).resolve(), Path(root) / Path(devkit).name)
        try:
            parse_devkit_archive(root, file=Path(devkit).name)
            wnid_to_lemmas, val_wnids = load_meta_file(root)
        except Exception as err:  # torchvision raises RuntimeError, scipy/tarfile their own errors
            raise DatasetError(
                f"dataset {name!r}: torchvision cannot parse the ImageNet devkit {devkit} "
                f"({type(err).__name__}: {err}); it must be the official ILSVRC2012_devkit_t12.tar.gz "
                f"(md5 {FILES['devkit']['md5']})"
            ) from err
    if len(wnid_to_lemmas) != NUM_CLASSES:
        raise DatasetError(f"dataset {name!r}: the devkit {devkit} lists {len(wnid_to_lemmas)} leaf classes, "
                           f"not ImageNet-1k's {NUM_CLASSES}")
    return Devkit(wnids=sorted(wnid_to_lemmas), lemmas={w: tuple(v) for w, v in wnid_to_lemmas.items()},
                  val_wnids=list(val_wnids))


def clip_classnames() -> tuple[str, ...]:
    from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES

    return tuple(IMAGENET_CLASSNAMES)


def imagenet_classes(name: str, devkit: Devkit) -> list[ClassInfo]:
    """The 1000 classes in the standard order with CLIP's names, wnids and WordNet lemmas as aliases."""
    names = clip_classnames()
    if len(names) != len(devkit.wnids):
        raise DatasetError(f"dataset {name!r}: open_clip has {len(names)} ImageNet class names for "
                           f"{len(devkit.wnids)} devkit classes")
    return [ClassInfo(index=i, name=clip_name, wnid=wnid, aliases=[a for a in devkit.lemmas[wnid] if a != clip_name])
            for i, (wnid, clip_name) in enumerate(zip(devkit.wnids, names))]


# ----------------------------------------------------------------------------------------------- images


def iter_val_images(name: str, val_tar: Path, devkit: Devkit) -> Iterator[tuple[str, str, bytes]]:
    """(sample_id, wnid, JPEG bytes) of every validation image, streamed in the tar's order. Every image of
    the devkit's ground truth must be there exactly once, and nothing else."""
    seen: set[int] = set()
    for member, data in iter_members(val_tar):
        filename = PurePosixPath(member).name
        number = _val_number(name, val_tar, member, len(devkit.val_wnids))
        if number in seen:
            raise DatasetError(f"dataset {name!r}: {val_tar} holds {filename!r} twice")
        seen.add(number)
        yield filename, devkit.val_wnids[number - 1], data
    if len(seen) != len(devkit.val_wnids):
        absent = [k for k in range(1, len(devkit.val_wnids) + 1) if k not in seen]
        shown = ", ".join(f"ILSVRC2012_val_{k:08d}.JPEG" for k in absent[:5]) + (", ..." if len(absent) > 5 else "")
        raise DatasetError(
            f"dataset {name!r}: {val_tar} lacks {len(absent)} of the {len(devkit.val_wnids)} validation images "
            f"of the devkit's ground truth ({shown}); the archive is incomplete"
        )


def _val_number(name: str, val_tar: Path, member: str, count: int) -> int:
    match = VAL_NAME.fullmatch(PurePosixPath(member).name)
    if match is None:
        raise DatasetError(f"dataset {name!r}: {val_tar} member {member!r} is not a validation image "
                           f"(ILSVRC2012_val_<8 digits>.JPEG)")
    number = int(match.group(1))
    if not 1 <= number <= count:
        raise DatasetError(f"dataset {name!r}: {val_tar} member {member!r} has no label: the devkit's ground truth "
                           f"covers images 1..{count}")
    return number


# ----------------------------------------------------------------------------------------------- source


def catalogue_row(name: str, spec: dict) -> dict:
    check_keys(name, spec, KEYS)
    return {"classes": NUM_CLASSES, "splits": {SPLIT: VAL_IMAGES}, "metric": "accuracy", "manual_download": True}


def leaf_classes(name: str, spec: dict, cache: Path | None = None, mirror: Path | None = None
                 ) -> tuple[list[str], str]:
    """ImageNet-1k's wnids in class order, through the download layer (BREEDS' class list), before any prepare."""
    return imagenet_wnids(name, cache=cache, mirror=mirror), "ImageNet-1k class list (BREEDS copy)"


def imagenet_wnids(dataset: str = "imagenet", resource: Mapping[str, Any] | None = None, *,
                   cache: Path | None = None, mirror: Path | None = None, expected: int | None = IMAGENET_CLASSES,
                   ) -> list[str]:
    """ImageNet-1k's wnids in class-index order, from BREEDS' class list (`resource`: a download spec mapping,
    default `CLASS_INFO`) fetched by the download layer: cache, then local mirror, then its URL, checksum verified.
    `expected` is the number of classes the file must list."""
    spec = dict(CLASS_INFO if resource is None else resource)
    path = fetch(make_resource(dataset, spec), dataset, cache=cache, mirror=mirror, progress=False)
    return [wnid for _, wnid, _ in parse_class_info(path, expected=expected)]


def build(name: str, spec: dict, out_dir: Path) -> DatasetMeta:
    check_keys(name, spec, KEYS)
    skip = check_flag(name, spec, "skip_corrupt")
    files = fetch_files(name, spec, FILES)
    devkit = read_devkit(name, files["devkit"][1])
    classes = imagenet_classes(name, devkit)
    provenance = {
        "source": "imagenet",
        "upstream": UPSTREAM,
        "files": {role: res.provenance(path) for role, (res, path) in files.items()},
        "class_names": CLASS_NAMES_SOURCE,
        "skipped_corrupt": [],
    }
    meta = DatasetMeta(name=name, task="single-label", metric="accuracy", classes=classes, provenance=provenance)
    label = {c.wnid: c.index for c in classes}
    rows = ({"sample_id": sid, "label": label[wnid], "image": data}
            for sid, wnid, data in iter_val_images(name, files["val_images"][1], devkit))
    return write_dataset(out_dir, meta, {SPLIT: checked_rows(name, SPLIT, rows, skip, provenance, FIX)})
