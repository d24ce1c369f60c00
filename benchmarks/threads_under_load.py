"""Toy-model training steps per second alone and beside a busy process, per OpenMP/torch thread setting.

Each case runs in a fresh process (OpenMP reads its environment once, at start-up): `--steps` timed steps of the
pipeline's own toy training step (vlbench.models.toy: open_clip's ClipLoss, fused AdamW, batch 128 of 32 px images),
after two untimed ones, with random data. "Loaded" starts `--hogs` busy-looping processes first (each holds one core,
as another job on a shared machine does) and stops them after. Prints one JSON line per case and the ratios
loaded / alone, so the figures compare within one run.

    python benchmarks/threads_under_load.py --steps 20 --hogs 1
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time

CASES = {  # name -> environment of the training process
    "default": {},
    "omp_passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin_10k": {"GOMP_SPINCOUNT": "10000"},  # libgomp's active spin before sleeping (default 300,000; 30e9 with ACTIVE)
    "spin_1k": {"GOMP_SPINCOUNT": "1000"},
    "one_thread": {"OMP_NUM_THREADS": "1"},
}

WORKER = r"""
import json, math, sys, time
import torch
from vlbench.models import register_local_configs
from vlbench.models.toy import make_optimizer, train_step, build_toy_model
from open_clip.loss import ClipLoss
register_local_configs()
steps = int(sys.argv[1])
model = build_toy_model("vlbench-toy", 0)
model.train()
opt = make_optimizer(model, 1e-3, 0.1)
loss_fn = ClipLoss()
g = torch.Generator().manual_seed(0)
x = torch.randn(128, 3, 32, 32, generator=g)
text = torch.randint(1, 1000, (128, model.context_length), generator=g)
for step in range(2):
    train_step(model, opt, loss_fn, x, text, 1e-3, 1.0, step + 1)
start = time.perf_counter()
for step in range(steps):
    train_step(model, opt, loss_fn, x, text, 1e-3, 1.0, step + 3)
print(json.dumps({"steps_per_s": steps / (time.perf_counter() - start), "threads": torch.get_num_threads()}))
"""


def _hog() -> None:
    while True:
        pass


def run_case(env_extra: dict, steps: int) -> dict:
    env = {**os.environ, **env_extra}
    out = subprocess.run([sys.executable, "-c", WORKER, str(steps)], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hogs", type=int, default=1, help="busy processes beside training in the loaded runs")
    args = ap.parse_args()
    results = {}
    for name, env in CASES.items():
        alone = run_case(env, args.steps)
        hogs = [mp.Process(target=_hog, daemon=True) for _ in range(args.hogs)]
        for h in hogs:
            h.start()
        time.sleep(0.5)
        try:
            loaded = run_case(env, args.steps)
        finally:
            for h in hogs:
                h.terminate()
        results[name] = {"env": env, "alone": alone, "loaded": loaded,
                         "loaded_over_alone": loaded["steps_per_s"] / alone["steps_per_s"]}
        print(json.dumps({name: results[name]}), flush=True)
    base = results["default"]["alone"]["steps_per_s"]
    print(json.dumps({"vs_default_alone": {name: {k: r[k]["steps_per_s"] / base for k in ("alone", "loaded")}
                                           for name, r in results.items()}}))


if __name__ == "__main__":
    main()
