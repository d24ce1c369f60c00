"""Cost of FewTrans fine-tuning per episode (vlbench/finetune/fewtrans_episodic.py), and what a whole FewTrans table
costs.

Three measurements, one JSON line each:

1. `episode`: per method, `run_episodes` on a prepared dataset with the params' model and `adapt.fewtrans` sampler
   (seed `seed`), the paper's ensemble (`finetune.fewtrans` defaults: 15 members for a text head, 27 for a linear
   head), `--episodes` episodes: seconds per episode, and the work it did (members, optimiser steps, image
   forward+backward passes, query images scored).
2. `workload`: the sampler's mean support and query sizes over 600 episodes of a pool of `--classes` x `--per-class`
   images (a CIFAR-100-like test split by default) and, per method, the image passes one episode needs with the
   default ensemble: sum over members of epochs x support images, plus the query images at each scored epoch.
3. `vit_b16`: forward+backward images per second of ViT-B/16 (random weights) at 224 px on this machine's CPU
   (`--vit-batch` images, a few steps), the cost unit of a real run.

    python benchmarks/finetune_episode_cost.py [--dataset count] [--episodes 2] [--methods ...] [--params params.yaml]

Needs data/prepared/<dataset>, data/texts/<dataset>/prompts.parquet and the model's weights (dvc repro); runs on CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import open_clip
import torch

from vlbench.analyses.adapt import fewtrans as episodic
from vlbench.finetune import fewtrans_episodic as fft
from vlbench.params import load_params


def episode_cost(model_cfg, dataset: str, episodes_cfg, seed: int, methods: list[str], episodes: int,
                 overrides: dict) -> list[dict]:
    """Per method: seconds per episode with `finetune.fewtrans` = DEFAULTS + `overrides`, the work done, and seconds
    per optimiser step; `full_ensemble_seconds` scales the measured seconds per step to the default ensemble's
    steps on the same episodes (an estimate: every step costs about the same; per-member copies and scoring vary)."""
    out = []
    sampler = {**episodes_cfg, "episodes": episodes}
    _, s, _, _, _, pairs = fft.draw_episodes(f"data/prepared/{dataset}", sampler, seed)
    for name in methods:
        cfg = {**overrides, "methods": [name]}
        settings = cost_settings(cfg)
        start = time.perf_counter()
        summary, _ = fft.run_episodes(model_cfg, f"data/prepared/{dataset}", f"data/texts/{dataset}/prompts.parquet",
                                      settings, seed, "cpu", sampler)
        seconds = time.perf_counter() - start
        work = episode_work(name, settings, *sizes(pairs))
        full = episode_work(name, cost_settings({"methods": [name]}), *sizes(pairs))
        per_step = seconds / episodes / work["steps_per_episode"]
        out.append({"measure": "episode", "dataset": dataset, "method": name, "episodes": episodes,
                    "overrides": overrides, "seconds_per_episode": round(seconds / episodes, 2), **work,
                    "seconds_per_step": round(per_step, 4), "full_ensemble_steps": full["steps_per_episode"],
                    "full_ensemble_seconds": round(per_step * full["steps_per_episode"], 1),
                    "metrics": {k: round(v, 4) for k, v in summary["metrics"].items()}})
    return out


# The cost model's centres where params give none: the authors' code's for finetune and lora (fft.AUTHORS_FIXED), the
# same E* for the others (an assumption for counting steps, not a centre any run uses: runs take the held-out search's)
ASSUMED_CENTRES = {"visual_ft": {"lr": 1e-5, "epochs": 60}, "text_ft": {"lr": 1e-5, "epochs": 60},
                   "all_ft": {"lr": 1e-5, "epochs": 60}, "bitfit": {"lr": 2e-3, "head_lr": 1e-2, "epochs": 30},
                   **fft.AUTHORS_FIXED}


def cost_settings(cfg) -> dict:
    """`finetune.fewtrans` settings with every method's centre: the given one, else ASSUMED_CENTRES."""
    s = fft.settings(cfg)
    return fft.settings({**dict(cfg or {}), **{m: {**ASSUMED_CENTRES[m], **s[m]} for m in fft.TUNINGS}})


def episode_work(name: str, settings, support: list[int], base_query: list[int], novel_query: list[int]) -> dict:
    """Per episode (mean over the given episodes): members, optimiser steps, image forward+backward passes (a frozen
    image tower encodes the support set once per member instead), images scored (novel queries for a text head)."""
    members, batch = fft.members(name, settings), int(settings[name]["batch_size"])
    visual = fft.TUNINGS[name].selection != "text"
    query = [b + (n if fft.TUNINGS[name].head == "text" else 0) for b, n in zip(base_query, novel_query)]
    steps = np.mean([sum(m.epochs * -(-s // batch) for m in members) for s in support])
    passes = np.mean([sum(m.epochs * s for m in members) for s in support]) if visual else 0.0
    scored = np.mean([sum(len(m.scored) for m in members) * q for q in query])
    frozen = np.mean([len(members) * s for s in support]) if not visual else 0.0
    return {"members": len(members), "steps_per_episode": round(float(steps), 1),
            "image_passes_per_episode": round(float(passes), 1),
            "support_encodings_per_episode": round(float(frozen), 1),
            "images_scored_per_episode": round(float(scored), 1)}


def sizes(pairs) -> tuple[list[int], list[int], list[int]]:
    """(support, base query, novel query) images per episode."""
    return ([sum(b.shots) for b, _ in pairs], [sum(len(q) for q in b.query) for b, _ in pairs],
            [sum(len(q) for q in n.query) if n is not None else 0 for _, n in pairs])


def workload(episodes_cfg, seed: int, classes: int, per_class: int) -> dict:
    s = episodic.settings({**episodes_cfg, "episodes": 600})
    labels = np.repeat(np.arange(classes), per_class)
    base, novel = episodic.class_split(classes, round(0.2 * classes))
    pairs = episodic.sample_episodes(episodic.class_pools(labels, classes), base, novel, s, seed)
    support, base_query, novel_query = sizes(pairs)
    settings = cost_settings(None)
    per_method = {m: episode_work(m, settings, support, base_query, novel_query) for m in fft.TUNINGS}
    return {"measure": "workload", "classes": classes, "per_class": per_class, "episodes": 600,
            "mean_support": round(float(np.mean(support)), 1), "mean_base_query": round(float(np.mean(base_query)), 1),
            "mean_novel_query": round(float(np.mean(novel_query)), 1), "methods": per_method}


def vit_b16(batch: int, steps: int) -> dict:
    torch.manual_seed(0)
    model = open_clip.create_model("ViT-B-16-quickgelu").eval()
    x = torch.randn(batch, 3, 224, 224)
    opt = torch.optim.Adam(model.visual.parameters(), lr=1e-5)
    times = []
    for _ in range(steps + 1):  # the first step warms up
        start = time.perf_counter()
        opt.zero_grad()
        model.encode_image(x).pow(2).mean().backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return {"measure": "vit_b16", "device": "cpu", "threads": torch.get_num_threads(), "batch": batch,
            "images_per_second": round(batch / float(np.median(times[1:])), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="count")
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--methods", nargs="+", default=None)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--vit-batch", type=int, default=8)
    parser.add_argument("--vit-steps", type=int, default=2)
    parser.add_argument("--skip", nargs="*", default=[], choices=["episode", "workload", "vit_b16"])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--overrides", default="{}", help='finetune.fewtrans overrides as JSON, e.g. '
                        '\'{"lr_factors": [1.0], "two_lr_factors": [1.0]}\' (3 members per method)')
    args = parser.parse_args()
    params = load_params(args.params)
    if args.threads:
        torch.set_num_threads(args.threads)
    episodes_cfg = dict(params["adapt"]["fewtrans"])
    print(json.dumps({"measure": "machine", "cpus": len(os.sched_getaffinity(0)), "threads": torch.get_num_threads(),
                      "load_average": os.getloadavg()[0], "gpu": torch.cuda.is_available()}), flush=True)
    if "workload" not in args.skip:
        print(json.dumps(workload(episodes_cfg, params["seed"], args.classes, args.per_class)), flush=True)
    if "vit_b16" not in args.skip:
        print(json.dumps(vit_b16(args.vit_batch, args.vit_steps)), flush=True)
    if "episode" not in args.skip:
        for row in episode_cost(params["model"], args.dataset, episodes_cfg, params["seed"],
                                args.methods or list(fft.TUNINGS), args.episodes, json.loads(args.overrides)):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
