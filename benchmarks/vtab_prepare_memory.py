"""Peak memory of `prepare` for a VTAB task of dSprites' size (issue 20, "Bad input and scale").

    python benchmarks/vtab_prepare_memory.py [--images 737280] [--shards 16] [--work DIR] [--keep]

1. Writes a TFDS-prepared stand-in of dSprites (`dsprites` 2.0.0's layout: one `train` split, 737,280 records
   of a 64 x 64 one-channel PNG plus `label_x_position` / `label_orientation` int64 features) in TFRecord shards,
   with vlbench's own writer. Each image is a filled rectangle whose size and place follow dSprites' latent
   grid (3 shapes x 6 scales x 40 orientations x 32 x 32 positions), so PNG sizes are of dSprites' order.
2. Runs `prepare` (vlbench.datasets.registry.prepare_dataset, source `vtab`) in a fresh child process on a
   dsprites_location-like task with VTAB's dSprites splits (train = train[:80%], val = [80%:90%],
   test = [90%:], and the 1k splits), and reports that process's peak RSS (ru_maxrss) and wall time,
   next to the size of the TFRecord files and of the prepared Parquet.

The task is defined here (not read from vtab_tasks.TASKS) so that the figure does not depend on the table.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.tfds_fixtures import serialize_example  # noqa: E402
from vlbench.datasets.tfrecord import write_records  # noqa: E402
from vlbench.datasets.vtab_tasks import VtabTask  # noqa: E402


def x_position_label(features) -> int:
    return int(features["label_x_position"][0]) // 2  # task_adaptation dsprites: 32 positions -> 16 classes


def stand_in_task(n: int) -> VtabTask:
    a, b = n * 8 // 10, n * 9 // 10
    splits = {"train": (("train", 0, a),), "val": (("train", a, b),), "test": (("train", b, n),),
              "train800": (("train", 0, 800),), "val200": (("train", a, a + 200),),
              "train800val200": (("train", 0, 800), ("train", a, a + 200))}
    return VtabTask(name="dsprites_standin", group="structured", tfds="dsprites", version="2.0.0", splits=splits,
                    classes=tuple(f"x {i}" for i in range(16)), label=x_position_label)


def image(index: int) -> tuple[bytes, int, int]:
    from PIL import Image

    x, y = index % 32, index // 32 % 32
    orientation, scale = index // 1024 % 40, index // 40960 % 6
    side = 6 + 2 * scale
    pixels = np.zeros((64, 64), np.uint8)
    top, left = 2 + y * 50 // 31, 2 + x * 50 // 31
    pixels[top:top + side, left:left + side + orientation % 3] = 255
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode="L").save(buffer, format="PNG")
    return buffer.getvalue(), x, orientation


def examples(start: int, stop: int):
    for i in range(start, stop):
        png, x, orientation = image(i)
        yield serialize_example({"image": [png], "label_x_position": [x], "label_orientation": [orientation]})


def write_stand_in(root: Path, task: VtabTask, n: int, shards: int) -> None:
    from vlbench.datasets.vtab import INFO, TEMPLATE, shard_name, tfds_folder

    folder = tfds_folder(root, task)
    folder.mkdir(parents=True, exist_ok=True)
    bounds = [n * i // shards for i in range(shards + 1)]
    for s in range(shards):  # streamed: one record at a time
        write_records(folder / shard_name(task, "train", s, shards), examples(bounds[s], bounds[s + 1]))
    info = {"name": "dsprites", "version": task.version, "fileFormat": "tfrecord",
            "splits": [{"name": "train", "filepathTemplate": TEMPLATE,
                        "shardLengths": [str(bounds[s + 1] - bounds[s]) for s in range(shards)]}]}
    (folder / INFO).write_text(json.dumps(info))


CHILD = """
import resource, sys, time
sys.path.insert(0, {root!r})
from benchmarks.vtab_prepare_memory import stand_in_task
from vlbench.datasets import vtab_tasks
from vlbench.datasets.registry import prepare_dataset
task = stand_in_task({n})
vtab_tasks.TASKS[task.name] = task
start = time.perf_counter()
meta = prepare_dataset("vtab-standin", {{"source": "vtab", "task": task.name, "root": {tfds!r}}}, {out!r})
print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, dict(meta.splits))
"""


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=737_280)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--work", type=Path, default=Path("/tmp/vlbench-vtab-memory"))
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    args = parser.parse_args()
    task = stand_in_task(args.images)
    shutil.rmtree(args.work, ignore_errors=True)
    tfds, out = args.work / "tfds", args.work / "prepared"
    start = time.perf_counter()
    write_stand_in(tfds, task, args.images, args.shards)
    generated = time.perf_counter() - start
    code = CHILD.format(root=str(ROOT), n=args.images, tfds=str(tfds), out=str(out))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seconds, rss_kib, splits = proc.stdout.strip().split(" ", 2)
    baseline = subprocess.run([sys.executable, "-c", CHILD.split("start =")[0].format(root=str(ROOT), n=args.images)
                               + "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"],
                              capture_output=True, text=True, check=True).stdout.strip()
    print(json.dumps({
        "images": args.images, "shards": args.shards, "generate_s": round(generated, 1),
        "tfrecord_mib": round(size(tfds) / 2**20, 1), "prepared_mib": round(size(out) / 2**20, 1),
        "prepare_s": round(float(seconds), 1), "prepare_peak_rss_mib": round(int(rss_kib) / 1024, 1),
        "imports_only_peak_rss_mib": round(int(baseline) / 1024, 1), "splits": splits,
    }, indent=2))
    if not args.keep:
        shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
