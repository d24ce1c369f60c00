"""Retrieval speed: FAISS index build time, queries per second and recall@k of approximate indexes vs exact search.

    python benchmarks/retrieval_speed.py --kinds flat ivf --nlist 1024 --train-size 65536   # 1M x 512 (2 GB a copy)
    python benchmarks/retrieval_speed.py --n 100000                                         # HNSW too

The corpus is synthetic but not uniform: L2-normalised Gaussian vectors whose i-th coordinate has standard
deviation i^-alpha (`--alpha`, default 0.5), a power-law spectrum like that of real embeddings, whose variance sits in
few directions. (On isotropic random vectors in 512 dimensions every point is about equally far from every other and
no approximate index can beat exact search; on tight Gaussian clusters every index finds everything.) Queries are
fresh vectors of the same distribution. Exact search (IndexFlatIP) gives the ground truth; it is checked against
numpy on a few queries. Each index is built through
`vlbench.knowledge.repe.build_index` (the repe stage's code), searched with the same queries, and
freed before the next one. Prints one JSON line per measurement, then a Markdown table.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

import numpy as np

from vlbench.knowledge import repe as rt


def anisotropic(n: int, dim: int, alpha: float, rng: np.random.Generator, chunk: int = 100_000) -> np.ndarray:
    """n L2-normalised vectors, coordinate i (from 1) drawn with standard deviation i^-alpha."""
    scale = np.arange(1, dim + 1, dtype=np.float32) ** np.float32(-alpha)
    out = np.empty((n, dim), np.float32)
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        out[start:start + m] = rt.l2_normalize(rng.standard_normal((m, dim), dtype=np.float32) * scale)
    return out


def timed_search(index, queries: np.ndarray, k: int, repeats: int) -> tuple[np.ndarray, float]:
    """(ids, best queries/s over `repeats` runs of the whole query batch)."""
    best, ids = 0.0, None
    for _ in range(repeats):
        _, ids, seconds = rt.search(index, queries, k)
        best = max(best, len(queries) / seconds)
    return ids, best


def measure(kind: str, corpus: np.ndarray, queries: np.ndarray, truth: np.ndarray | None, args, **params):
    """(one row per search setting, the ids of the last search): build through the stage's code, search, free."""
    cfg = rt.IndexConfig(kind=kind, seed=args.seed, train_size=args.train_size, **params)
    index, info = rt.build_index(corpus, cfg, device=args.device)
    row = {"kind": kind, "n": len(corpus), "dim": corpus.shape[1], "device": info.device, **info.params,
           "build_s": round(info.build_seconds, 2)}
    rows, ids = [], None
    for setting in args.nprobe if kind == "ivf" else args.ef_search if kind == "hnsw" else [None]:
        if kind == "ivf":
            index.nprobe = row["nprobe"] = setting
        elif kind == "hnsw":
            index.hnsw.efSearch = row["ef_search"] = setting
        ids, qps = timed_search(index, queries, args.k, args.repeats)
        row.update(qps=round(qps, 1), recall=round(rt.recall_at_k(ids, truth), 4) if truth is not None else 1.0)
        print(json.dumps(row), flush=True)
        rows.append(dict(row))
    del index
    gc.collect()
    return rows, ids


def table(rows: list[dict], k: int) -> str:
    lines = [f"| index | settings | build s | queries/s | recall@{k} |", "|---|---|---|---|---|"]
    for r in rows:
        keys = {"ivf": ("nlist", "nprobe", "train_size"), "hnsw": ("m", "ef_construction", "ef_search")}.get(r["kind"], ())
        settings = ", ".join(f"{key} {r[key]}" for key in keys) or "exact"
        lines.append(f"| {r['kind']} | {settings} | {r['build_s']} | {r['qps']} | {r['recall']:.4f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--k", type=int, default=100)
    p.add_argument("--alpha", type=float, default=0.5, help="spectrum decay: coordinate i has std i^-alpha")
    p.add_argument("--kinds", nargs="+", default=["flat", "ivf", "hnsw"], choices=["flat", "ivf", "hnsw"])
    p.add_argument("--nlist", type=int, default=None, help="ivf cells (default: the stage's rule, 4 sqrt(n))")
    p.add_argument("--nprobe", type=int, nargs="+", default=[8, 32, 128])
    p.add_argument("--train-size", type=int, default=100_000)
    p.add_argument("--hnsw-m", type=int, default=32)
    p.add_argument("--ef-construction", type=int, default=80)
    p.add_argument("--ef-search", type=int, nargs="+", default=[128, 256])
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--device", default="auto")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    faiss = rt.faiss_module()
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    corpus = anisotropic(args.n, args.dim, args.alpha, rng)
    queries = anisotropic(args.queries, args.dim, args.alpha, rng)
    print(json.dumps({"corpus": list(corpus.shape), "queries": len(queries), "generate_s": round(time.perf_counter() - start, 1),
                      "faiss": faiss.__version__, "threads": faiss.omp_get_max_threads(), "cpus": os.cpu_count()}), flush=True)

    rows, truth = measure("flat", corpus, queries, None, args)  # exact search: the ground truth
    check = rt.exact_search(corpus, queries[:5], args.k)[1]
    print(json.dumps({"faiss_flat_equals_numpy_on_5_queries": bool((check == truth[:5]).all())}), flush=True)
    if "ivf" in args.kinds:
        rows += measure("ivf", corpus, queries, truth, args, nlist=args.nlist, nprobe=max(args.nprobe))[0]
    if "hnsw" in args.kinds:
        rows += measure("hnsw", corpus, queries, truth, args, hnsw_m=args.hnsw_m,
                        ef_construction=args.ef_construction, ef_search=max(args.ef_search))[0]
    print(table(rows, args.k))


if __name__ == "__main__":
    main()
