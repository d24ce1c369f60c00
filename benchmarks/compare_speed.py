"""`vlbench compare` on a sweep: 40 rows, 10 experiments, 50,000 samples a row (issue 33), against the pairwise loop
of the compare before it, in the same run.

    python benchmarks/compare_speed.py                          # 40 accuracy rows (zero-shot on 40 datasets)
    python benchmarks/compare_speed.py --metrics accuracy mean_per_class --datasets 20 --classes 100
    python benchmarks/compare_speed.py --baseline-rows 2

Each experiment's per-sample tables are written as reports/zeroshot/<dataset>.predictions.parquet (sample_id, label,
predicted) in a folder read the way a revision is (fsspec, as DVC's file system), with the result JSON's numbers
computed from them. The experiments share each sample's difficulty (correlated errors, as models of one sweep have).

Ours: `vlbench.compare_runs.compare` on all rows: one alignment per row and experiment, the units resampled once for
all experiments (joint replicates: every pairwise difference, McNemar's tests for all pairs at once, rank
intervals), Holm over every difference, the leaderboard. Baseline: what compare did before, per row and pair: align
the two tables through a dict of sample ids, then `stats.paired_difference` (its own resampling per pair); timed on
`--baseline-rows` rows and scaled linearly to all rows. Wall and CPU time (process_time: the machine may be shared)
of both. Prints one JSON line, then a Markdown row.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from vlbench import stats


def write_runs(root: Path, experiments: int, datasets: int, n: int, classes: int, metrics: list[str], seed: int = 0):
    """The experiments' folders and their results {(analysis, dataset): {"metrics": ...}}."""
    import fsspec

    from vlbench.compare_runs import Experiment

    rng = np.random.default_rng(seed)
    ids = pa.array([f"img{i:06d}" for i in range(n)])
    runs = []
    difficulty = {d: rng.random(n) for d in range(datasets)}
    labels = {d: rng.integers(0, classes, n) for d in range(datasets)}
    for e in range(experiments):
        results = {}
        for d in range(datasets):
            skill = 0.5 + 0.03 * e
            right = difficulty[d] + 0.15 * rng.standard_normal(n) < skill
            predicted = np.where(right, labels[d], (labels[d] + 1) % classes)
            path = root / f"exp{e}" / "reports" / "zeroshot" / f"d{d:02d}.predictions.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(pa.table({"sample_id": ids, "label": labels[d], "predicted": predicted}), path)
            values = {"accuracy": float(right.mean())}
            if "mean_per_class" in metrics:
                values["mean_per_class"] = float(np.mean([right[labels[d] == c].mean()
                                                          for c in np.unique(labels[d])]))
            results[("zeroshot", f"d{d:02d}")] = {"metrics": {m: values[m] for m in metrics}}
        runs.append(Experiment(f"exp{e}", f"{e:040d}", results,
                               fsspec.filesystem("dir", path=str(root / f"exp{e}"))))
    return runs


def baseline(runs, rows: list[tuple[str, str, str]]) -> None:
    """The pre-issue-33 pairwise loop: per row and pair, a dict alignment and a paired bootstrap of its own."""
    tables = {}
    for analysis, dataset, metric in rows:
        for e in runs:
            key = (e.name, dataset)
            if key not in tables:
                with e.fs.open(f"reports/{analysis}/{dataset}.predictions.parquet", "rb") as f:
                    tables[key] = pq.read_table(f)
        for i, a in enumerate(runs):
            for b in runs[i + 1:]:
                ta, tb = tables[a.name, dataset], tables[b.name, dataset]
                ids_a, ids_b = ta.column("sample_id").to_pylist(), tb.column("sample_id").to_pylist()
                assert set(ids_a) == set(ids_b)
                position = {sid: k for k, sid in enumerate(ids_b)}
                tb = tb.take(np.array([position[sid] for sid in ids_a], dtype=np.int64))
                labels = ta.column("label").to_numpy()
                assert np.array_equal(labels, tb.column("label").to_numpy())
                stats.paired_difference(metric, ta.column("predicted").to_numpy() == labels,
                                        tb.column("predicted").to_numpy() == labels, labels)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiments", type=int, default=10)
    p.add_argument("--datasets", type=int, default=40)
    p.add_argument("--n", type=int, default=50_000)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--metrics", nargs="+", default=["accuracy"], choices=stats.SAMPLE_METRICS)
    p.add_argument("--baseline-rows", type=int, default=2)
    args = p.parse_args()
    from vlbench.compare_runs import compare

    with tempfile.TemporaryDirectory() as tmp:
        runs = write_runs(Path(tmp), args.experiments, args.datasets, args.n, args.classes, args.metrics)
        rows = [("zeroshot", f"d{d:02d}", m) for d in range(args.datasets) for m in args.metrics]
        start, cpu = time.perf_counter(), time.process_time()
        data = compare(runs)
        ours, ours_cpu = time.perf_counter() - start, time.process_time() - cpu
        start, cpu = time.perf_counter(), time.process_time()
        baseline(runs, rows[:args.baseline_rows])
        scale = len(rows) / args.baseline_rows
        base, base_cpu = (time.perf_counter() - start) * scale, (time.process_time() - cpu) * scale
    tests = data["correction"]["tests"]
    winners = sum(r["winner"] is not None for r in data["rows"])
    out = {"rows": len(rows), "experiments": args.experiments, "n": args.n, "classes": args.classes,
           "metrics": args.metrics, "tests": tests, "winners": winners, "ours_s": round(ours, 2),
           "ours_cpu_s": round(ours_cpu, 2), "baseline_s": round(base, 1), "baseline_cpu_s": round(base_cpu, 1),
           "baseline_rows_timed": args.baseline_rows, "ratio": round(base / ours, 1),
           "ratio_cpu": round(base_cpu / ours_cpu, 1)}
    print(json.dumps(out))
    print("\n| rows | experiments | n | metrics | tests | compare (s wall / CPU) | pairwise loop (s wall / CPU, scaled) "
          "| ratio (wall / CPU) |")
    print("|---:|---:|---:|---|---:|---:|---:|---:|")
    print(f"| {len(rows)} | {args.experiments} | {args.n:,} | {', '.join(args.metrics)} | {tests:,} | {ours:.1f} / "
          f"{ours_cpu:.1f} | {base:.0f} / {base_cpu:.0f} | {base / ours:.1f}x / {base_cpu / ours_cpu:.1f}x |")


if __name__ == "__main__":
    main()
