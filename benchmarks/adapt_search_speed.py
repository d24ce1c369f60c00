"""ELEVATER search speed: one dataset's full hyper-parameter search, batched, vs two baselines on the same split.

Data: Gaussian class clusters standing in for CLIP image embeddings (`--n` training images of `--dim` features in
`--classes` classes, about 75% linear-probe accuracy), split as the protocol splits it (the first 20% of each class
is validation); or, with `--features`, a cached features file of the pipeline (real embeddings, e.g. the demo toy
model's). One head (Random-2P), the toolkit's full search: 6 learning rates x the weight-decay search
(7 coarse values, then spans 8, 4, 2, 1), 10 epochs of batch 64 per run, best validation epoch.

  batched   vlbench.analyses.adapt.elevater.search: every (learning rate, weight decay) of a round in one
            LinearHeads run (5 runs in all).
  toolkit   the same configurations, one at a time, as the toolkit trains them: a BatchNorm1d(affine=False) +
            Linear module, a DataLoader (batch 64, shuffled by a generator seeded 0, as its create_dataloader),
            torch.optim.SGD, CrossEntropyLoss with autograd, softmax + accuracy on validation after every epoch.
            Only the head is trained (the toolkit also rebuilds its backbone per run): this flatters the baseline.
            With `--toolkit-configs N` it runs N of the configurations and scales its time linearly (printed).
  sklearn   scikit-learn LogisticRegression (L-BFGS, max_iter 1000) on standardised features, C swept over
            10^-6..10^6 (97 values) in the CLIP-paper coarse-to-fine order, stopped as soon as its validation
            accuracy reaches the batched search's best; if it never does, the whole sweep is timed.

    python benchmarks/adapt_search_speed.py [--n 2000] [--dim 512] [--classes 10] [--repeats 3]

Prints one JSON line: median seconds of each, the ratios toolkit/batched and sklearn/batched, and the validation
accuracies each reached (the toolkit replay must reproduce the batched scores: it checks they agree).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np


def make(n: int, dim: int, classes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((classes, dim)).astype(np.float32)
    y = np.tile(np.arange(classes), n // classes)
    x = centers[y] * 0.07 + rng.standard_normal((y.size, dim)).astype(np.float32) * 0.5 + 1.0
    return x.astype(np.float32), y


def from_features(path: str):
    """A cached features file of the pipeline (features/<model>/<dataset>/images/<split>.parquet): real embeddings,
    whose classes overlap far more than Gaussian clusters do (L-BFGS needs many more iterations on them)."""
    import pyarrow.parquet as pq

    table = pq.read_table(path, columns=["label", "embedding"])
    x = np.asarray(table.column("embedding").combine_chunks().flatten(), dtype=np.float32).reshape(table.num_rows, -1)
    return x, np.asarray(table.column("label"), dtype=np.int64)


def split(x, y):
    from vlbench.analyses.adapt import elevater

    train, val = elevater.validation_split(y, 0.2)
    return x[train], y[train], x[val], y[val]


def batched(x, y, xv, yv, on=None):
    """(best validation score, [(lr, wd, score)] of every configuration tried, the head's init) on device `on`
    (default the CPU)."""
    import torch

    from vlbench.analyses.adapt import protocol, elevater

    s = elevater.Settings(heads=("random_2p",))
    problem = elevater.Problem(x, y, xv, yv, "accuracy", False)
    init = elevater.HeadInit({"random_2p": protocol.pytorch_linear_init(x.shape[1], int(y.max()) + 1, 0)})
    on = on or torch.device("cpu")
    work = s.batch_size * x.shape[1] * (int(y.max()) + 1) * s.lr_num * 7
    with protocol.cpu_threads(on, work):
        chosen, outcome = elevater.search(problem, init, s, on)
    configs = [(s.learning_rates()[t["line"][1]], s.weight_decays()[t["index"]], t["score"]) for t in outcome.trace]
    return chosen["random_2p"]["val_score"], configs, init.weights["random_2p"]


def toolkit_run(x, y, xv, yv, w0, b0, lr, wd, epochs=10, batch=64, device="cpu") -> float:
    """One configuration as the toolkit's train_task trains it (on `device`, as the toolkit does on its GPU); its best
    validation accuracy over the epochs."""
    import torch

    model = torch.nn.Sequential(torch.nn.BatchNorm1d(x.shape[1], affine=False), torch.nn.Linear(*w0.shape))
    model[1].weight.data, model[1].bias.data = torch.tensor(w0.T.copy()), torch.tensor(b0.copy())
    model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=wd, nesterov=False)
    data = torch.utils.data.TensorDataset(torch.tensor(x, device=device), torch.tensor(y, device=device))
    loader = torch.utils.data.DataLoader(data, batch_size=batch, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    crit, best, xv_t = torch.nn.CrossEntropyLoss(), 0.0, torch.tensor(xv, device=device)
    for _ in range(epochs):
        model.train()
        for xb, yb in loader:
            if xb.shape[0] == 1:
                continue
            opt.zero_grad()
            crit(model(xb), yb).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            probs = model(xv_t).softmax(-1).cpu().numpy()
        acc = float((probs.argmax(1) == yv).mean()) if np.isfinite(probs).all() else 0.0
        best = max(best, acc)
    return best


def toolkit(x, y, xv, yv, init, configs, limit: int | None) -> tuple[float, float, int]:
    """(seconds scaled to all configurations, largest score difference from the batched run, configurations run)."""
    import torch

    torch.set_num_threads(1)  # as fast as it gets on this machine for these sizes (see docs/benchmarks.md)
    w0, b0 = init
    todo = configs if not limit else configs[:limit]
    started = time.perf_counter()
    diffs = [abs(toolkit_run(x, y, xv, yv, w0, b0, lr, wd) - score) for lr, wd, score in todo]
    seconds = (time.perf_counter() - started) * len(configs) / len(todo)
    return seconds, max(diffs), len(todo)


class _Reached(Exception):
    pass


def sklearn_sweep(x, y, xv, yv, target: float) -> tuple[float, float, int]:
    """(seconds until validation accuracy >= target, or of the whole sweep; best accuracy reached; fits)."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    from vlbench.analyses.linear_probe import (
        STEPS_PER_DECADE,
        coarse_to_fine_search,
        default_c_grid,
    )

    mean, std = x.mean(axis=0), x.std(axis=0) + 1e-5
    xs, xvs = (x - mean) / std, (xv - mean) / std
    seen: list[float] = []

    def score(c: float) -> float:
        acc = float((LogisticRegression(C=c, max_iter=1000).fit(xs, y).predict(xvs) == yv).mean())
        seen.append(acc)
        if acc >= target:
            raise _Reached
        return acc

    started = time.perf_counter()
    with warnings.catch_warnings(), threadpool_limits(1, user_api="blas"):
        warnings.simplefilter("ignore", ConvergenceWarning)
        try:
            coarse_to_fine_search(score, list(default_c_grid()), 2 * STEPS_PER_DECADE)
        except _Reached:
            pass
    return time.perf_counter() - started, max(seen), len(seen)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--features", help="a single-label features file of the pipeline instead of Gaussian clusters")
    p.add_argument("--toolkit-configs", type=int, default=0, help="run only this many toolkit configurations (0: all)")
    args = p.parse_args()
    x, y, xv, yv = split(*(from_features(args.features) if args.features else make(args.n, args.dim, args.classes)))
    args.dim, args.classes = x.shape[1], int(y.max()) + 1
    batched(x[:200], y[:200], xv[:50], yv[:50])  # warm-up: first torch calls
    times, result = [], None
    for _ in range(args.repeats):
        started = time.perf_counter()
        result = batched(x, y, xv, yv)
        times.append(time.perf_counter() - started)
    best, configs, init = result
    tk_seconds, tk_diff, tk_run = toolkit(x, y, xv, yv, init, configs, args.toolkit_configs or None)
    sk_seconds, sk_best, sk_fits = sklearn_sweep(x, y, xv, yv, best)
    ours = statistics.median(times)
    print(json.dumps({"data": args.features or "gaussian", "n_train": int(y.size), "n_val": int(yv.size), "dim": args.dim, "classes": args.classes,
                      "configurations": len(configs), "batched_s": round(ours, 3), "val_accuracy": best,
                      "toolkit_s": round(tk_seconds, 2), "toolkit_configs_run": tk_run,
                      "toolkit_max_score_diff": tk_diff, "sklearn_s": round(sk_seconds, 2),
                      "sklearn_val_accuracy": sk_best, "sklearn_fits": sk_fits,
                      "toolkit_over_batched": round(tk_seconds / ours, 1),
                      "sklearn_over_batched": round(sk_seconds / ours, 1)}))


if __name__ == "__main__":
    main()
