"""Cost of one fine-tuning step of the toy model on the CPU, as a ratio to the toy pretraining step (issue 23).

Cases, each `--steps` timed steps after two untimed ones, random 32 px images and random tokens, one process:
- pretrain: the pipeline's toy pretraining step (vlbench.models.toy.train_step: ClipLoss, fused AdamW), B images;
- elevater_full: vlbench.finetune's loop on ELEVATER's Classifier (image tower + BN + head, SGD momentum), B images;
- negclip: vlbench.finetune's loop on the NegCLIP loss with B/2 pairs, neighbour images and altered captions, so B
  images and 2B texts (the pretraining step's B images and B texts);
- negclip_checkpointing: the same with open_clip's gradient checkpointing (memory for compute);
- negclip_state_every_step: the same, writing the resumable state file after every step (the default is every 50).
The cases are timed round-robin, `--rounds` times, `--steps` steps each, and each case's median round is reported with
its ratio to `pretrain`'s median: on a shared machine the load changes by the minute, and interleaving lets every case
see the same load. Prints one JSON line per case.

    GOMP_SPINCOUNT=10000 python benchmarks/finetune_speed.py --steps 5 --rounds 5 --batch 64
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from vlbench.finetune.training import Loop, Runtime, constant, freeze, train
from vlbench.finetune.elevater_full import Classifier, trainable
from vlbench.finetune.negclip import Pairs, clamp_scale
from vlbench.models import register_local_configs
from vlbench.models.toy import make_optimizer, train_step, build_toy_model


def timed(run_steps, steps: int) -> float:
    start = time.perf_counter()
    run_steps(steps)
    return (time.perf_counter() - start) / steps


def pretrain_case(batch: int):
    from open_clip.loss import ClipLoss

    model = build_toy_model("vlbench-toy", 0).train()
    opt, loss = make_optimizer(model, 1e-4, 0.1), ClipLoss()
    x, text = torch.randn(batch, 3, 32, 32), torch.randint(1, 49000, (batch, 24))
    return lambda n: [train_step(model, opt, loss, x, text, 1e-4, 1.0, s) for s in range(n)]


def elevater_case(batch: int):
    model = Classifier(build_toy_model("vlbench-toy", 0), np.random.randn(128, 10).astype(np.float32),
                       np.zeros(10, np.float32), 1.0)
    freeze(model, trainable)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-4, momentum=0.9, weight_decay=1e-4)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))

    def loss(m, xb, yb):
        return torch.nn.functional.cross_entropy(m(xb), yb)

    return loop_case(model, opt, lambda step: (x, y), loss, None)


def negclip_case(batch: int, checkpointing: bool = False, state_every: int | None = None):
    model = build_toy_model("vlbench-toy", 0)
    model.set_grad_checkpointing(checkpointing)
    n = 4 * batch
    captions = [torch.randint(1, 49000, (2, 24)) for _ in range(n)]
    negatives = [torch.randint(1, 49000, (2, 24)) for _ in range(n)]
    neighbours = torch.stack([torch.randperm(n)[:3] for _ in range(n)])
    pairs = Pairs(torch.randn(n, 3, 32, 32), lambda t: t, captions, negatives, neighbours,
                  {"batch_size": batch // 2}, 0, None)
    return loop_case(model, make_optimizer(model, 1e-6, 0.2), pairs.batch, pairs.loss, clamp_scale, state_every)


def loop_case(model, opt, batch, loss, after, state_every: int | None = None):
    state = Path(tempfile.mkdtemp()) if state_every else None
    done = [0]

    def run_steps(k: int):
        steps = done[0] + k
        loop = Loop("bench", steps, batch, loss, constant(1e-4), 0, after)
        train(model, opt, loop, {"precision": "fp32"}, Runtime(progress=False, state_dir=state,
                                                               checkpoint_every=state_every or 50), torch.device("cpu"))
        done[0] = steps
        if state is None:  # without a state file every call starts at step 1: count steps as runs of k
            done[0] = 0

    return run_steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    register_local_configs()
    cases = {"pretrain": lambda: pretrain_case(args.batch), "elevater_full": lambda: elevater_case(args.batch),
             "negclip": lambda: negclip_case(args.batch),
             "negclip_checkpointing": lambda: negclip_case(args.batch, checkpointing=True),
             "negclip_state_every_step": lambda: negclip_case(args.batch, state_every=1)}
    runners = {name: make() for name, make in cases.items()}
    for run_steps in runners.values():
        run_steps(2)  # untimed warm-up
    rounds = {name: [timed(run_steps, args.steps) for _ in range(1)] for name, run_steps in runners.items()}
    for _ in range(args.rounds - 1):
        for name, run_steps in runners.items():
            rounds[name].append(timed(run_steps, args.steps))
    base = float(np.median(rounds["pretrain"]))
    for name, seconds in rounds.items():
        median = float(np.median(seconds))
        print(json.dumps({"case": name, "batch": args.batch, "threads": torch.get_num_threads(), "rounds": len(seconds),
                          "seconds_per_step": round(median, 4), "ratio_to_pretrain": round(median / base, 2),
                          "spread": [round(min(seconds), 3), round(max(seconds), 3)]}))


if __name__ == "__main__":
    main()
