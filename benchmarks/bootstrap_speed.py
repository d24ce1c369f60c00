"""Bootstrap speed: vlbench.stats's intervals on an ImageNet-sized test set against a naive loop, in the same run.

    python benchmarks/bootstrap_speed.py                      # n = 50,000, 1,000 classes, 2,000 and 10,000 resamples
    python benchmarks/bootstrap_speed.py --classes 100        # ELEVATER's mean-per-class datasets have 37-102 classes
    python benchmarks/bootstrap_speed.py --naive-resamples 500

The naive loop is what one writes first: per resample, draw n indices with replacement and recompute the metric on
them (accuracy: the mean of the drawn correctness; mean-per-class: a bincount per class). Its time is measured on
`--naive-resamples` resamples and scaled linearly to the same count. Both give the same distribution (the check
prints the two intervals). Prints one JSON line per measurement, then a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from vlbench import stats


def naive(metric: str, correct: np.ndarray, labels: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n, k = correct.size, int(labels.max()) + 1
    out = np.empty(resamples)
    for b in range(resamples):
        idx = rng.integers(0, n, n)
        if metric == "accuracy":
            out[b] = correct[idx].mean()
        else:
            total = np.bincount(labels[idx], minlength=k)
            right = np.bincount(labels[idx], weights=correct[idx], minlength=k)
            present = total > 0
            out[b] = np.mean(right[present] / total[present])
    return out


def best_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=50_000)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--resamples", type=int, nargs="+", default=[2000, 10_000])
    p.add_argument("--naive-resamples", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    labels = rng.integers(0, args.classes, args.n)
    correct = rng.random(args.n) < 0.7
    other = np.where(rng.random(args.n) < 0.1, ~correct, correct)
    rows = []
    naive_per = {m: best_time(lambda m=m: naive(m, correct, labels, args.naive_resamples, 0), 1) / args.naive_resamples
                 for m in stats.SAMPLE_METRICS}
    for metric in stats.SAMPLE_METRICS:
        check = np.quantile(naive(metric, correct, labels, args.naive_resamples, 1), [0.025, 0.975])
        for b in args.resamples:
            ours = best_time(lambda: stats.bootstrap_sample_metric(metric, correct, labels, resamples=b), args.repeats)
            paired = best_time(lambda: stats.paired_difference(metric, correct, other, labels, resamples=b),
                               args.repeats)
            interval = stats.bootstrap_sample_metric(metric, correct, labels, resamples=b)
            row = {"metric": metric, "n": args.n, "classes": args.classes, "resamples": b, "interval_s": ours,
                   "paired_s": paired, "naive_s": naive_per[metric] * b, "speedup": naive_per[metric] * b / ours,
                   "interval": [interval.low, interval.high], "naive_interval": check.tolist()}
            print(json.dumps(row))
            rows.append(row)
    print("\n| metric | n | classes | resamples | interval (s) | paired difference (s) | naive loop (s) | speed-up |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['metric']} | {r['n']:,} | {r['classes']:,} | {r['resamples']:,} | {r['interval_s']:.4f} | "
              f"{r['paired_s']:.4f} | {r['naive_s']:.1f} | {r['speedup']:,.0f}x |")


if __name__ == "__main__":
    main()
