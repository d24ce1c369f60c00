"""Fine-tuning work units on this machine (docs/benchmarks.md, "Fine-tuning work units"): the toy model (random
weights) on a miniature six-colour dataset, CPU only.

1. `heldout`: a tiny held-out search (text_ft, 3 tasks, epochs [1, 2, 3, 5], learning rates 1e-5..1, from 1e-3 x 2
   epochs), local and on
   a local Ray of 2 workers: seconds, points searched, units, the centre (the same on both).
2. `table`: a 20-episode table (text_ft and lora, 2-member ensembles), local and on Ray (2 workers): seconds, and
   whether the tables are byte-identical.
3. `kill`: the 20-episode run in a subprocess killed with SIGKILL once half its units are written, then rerun: units
   found in the cache (the hit rate), units computed again, and whether the table is the uninterrupted run's.

Each unit runs with one torch thread on both engines (the driver's count, which the Ray tasks take), so Ray's 2
workers use the 2 cores the local engine leaves idle.

    python benchmarks/finetune_units.py [--episodes 20] [--out runs/benchmarks/finetune_units.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from PIL import Image

from vlbench.datasets.canonical import ClassInfo, DatasetMeta, load_meta, write_dataset
from vlbench.finetune import fewtrans_episodic as fft
from vlbench.finetune import heldout
from vlbench.io import write_json
from vlbench.texts import build_text_sets, write_text_sets

HUES = [(220, 30, 30), (30, 200, 30), (30, 30, 220), (210, 210, 30), (30, 200, 200), (200, 30, 200)]
NAMES = ["red", "green", "blue", "yellow", "cyan", "magenta"]
SMALL = {"lr_factors": [1.0], "two_lr_factors": [1.0], "epoch_offset": 0, "methods": ["text_ft", "lora"],
         "text_ft": {"lr": 1e-3, "epochs": 2}, "lora": {"lr": 1e-2, "head_lr": 1e-2, "epochs": 2}}
SEARCH = {"methods": ["text_ft"], "sampler": {"episodes": 3, "novel_fraction": 0, "novel_classes": {}},
          "epochs": [1, 2, 3, 5], "lr_min": 1e-5, "lr_max": 1.0, "coarse": {"lr": [1e-3], "epochs": [2]}}


def png(rgb, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = np.clip(np.array(rgb)[None, None, :] + rng.normal(0, 10, (24, 24, 3)), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def world(root: Path) -> dict:
    meta = DatasetMeta(name="hues", task="single-label", metric="accuracy",
                       classes=[ClassInfo(index=i, name=n) for i, n in enumerate(NAMES)])

    def rows(split, n, offset):
        for k in range(n):
            yield {"sample_id": f"{split}/{k:03d}", "label": k % 6, "image": png(HUES[k % 6], offset + k)}

    prepared = root / "prepared" / "hues"
    write_dataset(prepared, meta, {"train": rows("train", 48, 0), "test": rows("test", 48, 500)})
    texts = root / "texts" / "hues"
    write_text_sets(texts, "hues", build_text_sets(load_meta(prepared), prepared, {"templates": ["a {c} square."]}))
    import open_clip

    from vlbench.models import register_local_configs

    register_local_configs()
    torch.manual_seed(0)
    checkpoint = root / "toy.pt"
    torch.save(open_clip.create_model("vlbench-toy").state_dict(), checkpoint)
    model = {"slug": "toy-random", "arch": "vlbench-toy", "pretrained": str(checkpoint), "precision": "fp32"}
    return {"prepared": str(prepared), "texts": str(texts / "prompts.parquet"), "model": model}


def sampler(episodes: int) -> dict:
    return {"episodes": episodes, "splits": ["train", "test"], "novel_classes": {"hues": 2}, "max_query": 5,
            "max_shots": 5}


def table_run(w: dict, episodes: int, units_dir: Path, engine: str):
    start = time.perf_counter()
    summary, table = fft.run_episodes(w["model"], w["prepared"], w["texts"], SMALL, 0, "cpu", sampler(episodes),
                                      units_dir=units_dir, engine=engine, gpus=0)
    seconds = time.perf_counter() - start
    path = units_dir.parent / f"{units_dir.name}.parquet"
    pq.write_table(table, path)
    return {"engine": engine, "episodes": episodes, "seconds": round(seconds, 1), "units": summary["units"]}, \
        path.read_bytes()


def search_run(w: dict, units_dir: Path, engine: str) -> dict:
    start = time.perf_counter()
    doc, table, tally = heldout.search(w["model"], w["prepared"], w["texts"], SEARCH, {"methods": ["text_ft"]}, 0,
                                       sampler(3), "cpu", units_dir=units_dir, engine=engine, gpus=0)
    return {"engine": engine, "seconds": round(time.perf_counter() - start, 1), "points": table.num_rows,
            "rounds": max(table.column("round").to_pylist()), "units": tally.to_json(),
            "centre": doc["centres"]["text_ft"]}


KILLED = """
import json, sys, torch
torch.set_num_threads(1)
from vlbench.finetune import fewtrans_episodic as fewtrans
a = json.loads(sys.argv[1])
fewtrans.run_episodes(a["model"], a["prepared"], a["texts"], a["cfg"], 0, "cpu", a["sampler"], units_dir=a["units"],
                      engine="local", gpus=0)
"""


def kill_run(w: dict, episodes: int, units_dir: Path, reference: bytes) -> dict:
    total = episodes * len(SMALL["methods"])
    args = {**w, "cfg": SMALL, "sampler": sampler(episodes), "units": str(units_dir)}
    proc = subprocess.Popen([sys.executable, "-c", KILLED, json.dumps(args)])
    while len(list(units_dir.glob("*.json"))) < total // 2 and proc.poll() is None:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    found = len(list(units_dir.glob("*.json")))
    result, data = table_run(w, episodes, units_dir, "local")
    return {"units": total, "written_before_kill": found, "rerun": result["units"],
            "hit_rate": round(result["units"]["cached"] / total, 3), "rerun_seconds": result["seconds"],
            "same_table": data == reference}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--episodes", type=int, default=20)
    p.add_argument("--out", type=Path, default=Path("runs/benchmarks/finetune_units.json"))
    args = p.parse_args()
    torch.set_num_threads(1)
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    out: dict = {"machine": {"cpus": os.cpu_count(), "torch_threads_per_unit": 1, "ray_workers": 2}}
    with tempfile.TemporaryDirectory(prefix="finetune_units_") as tmp:
        root = Path(tmp)
        w = world(root)
        out["heldout"] = [search_run(w, root / f"search_{e}", e) for e in ("local", "ray")]
        local, ref = table_run(w, args.episodes, root / "table_local", "local")
        on_ray, data = table_run(w, args.episodes, root / "table_ray", "ray")
        out["table"] = [local, {**on_ray, "same_table_as_local": data == ref}]
        out["kill"] = kill_run(w, args.episodes, root / "table_killed", ref)
    ray.shutdown()
    write_json(args.out, out)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
