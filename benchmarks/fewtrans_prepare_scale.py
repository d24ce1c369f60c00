"""Peak memory and time of preparing a FewTrans folder-layout dataset of Quick Draw's size (172,500 images).

A generated stand-in in DomainNet's layout (quickdraw/<class>/<n>.png, 345 classes x 500 tiny PNGs) is written as a
zip, placed in a private mirror folder, and prepared with the real `quickdraw` entry (its md5 replaced by the
stand-in's). Prints one JSON line: images, seconds, peak RSS (MiB) of this process, and the prepared split's size.

    python benchmarks/fewtrans_prepare_scale.py [--classes 345] [--per-class 500] [--work /tmp/ft-scale]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import resource
import shutil
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
from PIL import Image
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def stand_in(path: Path, classes: int, per_class: int) -> None:
    rng = np.random.default_rng(0)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for c in range(classes):
            for n in range(per_class):
                buf = io.BytesIO()
                Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(buf, "PNG")
                zf.writestr(f"quickdraw/class_{c:03d}/{n}.png", buf.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--classes", type=int, default=345)
    parser.add_argument("--per-class", type=int, default=500)
    parser.add_argument("--work", default="/tmp/ft-scale")
    args = parser.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    (work / "mirror").mkdir(parents=True)
    archive = work / "mirror" / "quickdraw.zip"
    stand_in(archive, args.classes, args.per_class)
    os.environ.update(VLBENCH_DOWNLOADS=str(work / "cache"), VLBENCH_MIRROR=str(work / "mirror"))

    from vlbench.datasets.registry import prepare_dataset

    spec = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/dataset/quickdraw.yaml"), resolve=True)["prepare"]
    spec["files"]["archive"]["md5"] = hashlib.md5(archive.read_bytes()).hexdigest()
    spec.update(classes=args.classes, images=args.classes * args.per_class, names="folder")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    meta = prepare_dataset("quickdraw", spec, work / "out")
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    split = work / "out" / "splits" / "test.parquet"
    print(json.dumps({"images": meta.splits["test"], "seconds": round(seconds, 1),
                      "peak_rss_mib": round(peak / 1024, 1), "rss_before_mib": round(before / 1024, 1),
                      "zip_mib": round(archive.stat().st_size / 2**20, 1),
                      "split_mib": round(split.stat().st_size / 2**20, 1)}))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
