"""Extensibility speed: the vectorised Acc-C/E/S on one score matrix vs a per-step recomputing baseline.

CIFAR-100-sized: 10,000 images x 100 classes (random "image" and "text" embeddings, dim 512), 20 groups of 5,
`--orders` orders per target (the paper's 100 x N for Acc-E; the same orders' Acc-S, 100 per target), every
target.

  vectorised  vlbench.analyses.expansion: the score matrix once (one normalise + matmul), then
              `expansion` (Acc-C, Acc-E, Acc-S from one preparation) over paper_orders (includes the exact
              expectations over all orders).
  analysis    the whole per-variant work of extensibility@<dataset> (vlbench.analyses.extensibility.evaluate_variant):
              the above plus per-step curves, per-group drops, margins, cosine statistics, alignment, uniformity.
  baseline    what the authors' code does at every step (lancopku/clip-openness main.py: rebuild the model
              and the data loader, re-encode and re-normalise the text features of the current vocabulary,
              re-normalise the images of the current test set, logits = image @ text.T, argmax): here the
              embeddings stand in for the encoders, so the baseline only pays the normalisations, the
              matmul and the argmax per step, which flatters it. Running all 2000 orders x 20 steps takes
              minutes, so it runs `--baseline-orders` orders per target and its time is scaled linearly
              to the full count (printed as such).

    python benchmarks/extensibility_speed.py [--orders 100] [--repeats 5] [--baseline-orders 2]

Prints a JSON line: median seconds of the vectorised metrics, of the whole per-variant analysis (metrics, curves,
per-group drops, geometry), the (scaled) baseline, and the ratio of the baseline to the vectorised metrics.

Many groups (issue 19): ``--images 50000 --classes 1000 --groups 100`` (an ImageNet-sized score matrix; classes split
into equal consecutive groups) with ``--former-orders 1`` also times the implementation before the scan (one product per
order and prefix over every image, `tests/test_extensibility.py::former_step_accuracies`) on that many orders per
target for Acc-E, scaled to all orders, and checks that it gives the same step accuracies. ``--baseline-orders 0`` skips
the authors' per-step recompute, ``--no-analysis`` the whole per-variant analysis.

    python benchmarks/extensibility_speed.py --images 50000 --classes 1000 --groups 100 --repeats 1 \
        --baseline-orders 0 --no-analysis --former-orders 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from vlbench.analyses import expansion as ex
from vlbench.analyses import extensibility as op


def make(n=10_000, n_classes=100, dim=512, seed=0):
    rng = np.random.default_rng(seed)
    text = rng.standard_normal((n_classes, dim)).astype(np.float32)
    labels = np.repeat(np.arange(n_classes), n // n_classes)
    images = text[labels] * 0.12 + rng.standard_normal((n, dim)).astype(np.float32)  # about 60% top-1 on all 100
    return images, text, labels


def normalise(x):
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def vectorised(images, text, labels, groups, orders):
    scores = normalise(images) @ normalise(text).T  # once
    r = ex.expansion(scores, labels, groups, orders)  # one preparation for Acc-C, Acc-E and Acc-S
    return r.acc_c.mean, r.acc_e.mean, r.acc_s.mean, r.acc_e.expected_mean, r.acc_s.expected_mean


def analysis(images, text, labels, groups, orders_per_target):
    """What extensibility@<dataset> computes per prompt variant (vlbench.analyses.extensibility.evaluate_variant): the
    paper's orders, Acc-C/E/S with expectations, per-step curves, per-group drops, margins, cosine statistics,
    alignment and uniformity (2,000 sampled images)."""
    v = op.Vocabulary(names=[str(c) for c in range(text.shape[0])], group_names=[str(g) for g in range(len(groups))],
                      groups=groups, overlap=False, images=op.l2_normalize(images), labels=labels,
                      weights={"v": op.l2_normalize(text)})
    return op.evaluate_variant(v, "v", op.parse_settings({"orders": orders_per_target}), 0)


def baseline(images, text, labels, groups, orders):
    """Per order and step: the vocabulary's text features and the current images, re-normalised, scored,
    argmaxed (Acc-E over the union; Acc-S over the target's images in the same pass, as the authors do)."""
    group_of = np.empty(text.shape[0], dtype=np.int64)
    for g, members in enumerate(groups):
        group_of[members] = g
    acc_e, acc_s = [], []
    for order in orders:
        target = order[0]
        e_steps, s_steps = [], []
        for k in range(len(order)):
            classes = np.sort(np.concatenate([groups[g] for g in order[:k + 1]]))
            sel = np.flatnonzero(np.isin(labels, classes))
            logits = normalise(images[sel]) @ normalise(text[classes]).T
            ok = classes[logits.argmax(axis=1)] == labels[sel]
            e_steps.append(ok.mean())
            if k > 0:
                s_steps.append(ok[group_of[labels[sel]] == target].mean())
        acc_e.append(np.mean(e_steps))
        acc_s.append(np.mean(s_steps))
    return float(np.mean(acc_e)), float(np.mean(acc_s))


def former(scores, labels, groups, orders):
    """(seconds, CPU seconds, step accuracies) of Acc-E by the implementation before the scan, on ``orders``."""
    from tests.test_extensibility import former_step_accuracies

    t, c = time.perf_counter(), time.process_time()
    p = ex._prepare(scores, labels, groups)
    acc = former_step_accuracies(p, orders, "images")
    return time.perf_counter() - t, time.process_time() - c, acc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--orders", type=int, default=100, help="orders per target (the paper: 100)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline-orders", type=int, default=2, help="orders per target the baseline really runs (0: skip)")
    ap.add_argument("--images", type=int, default=10_000)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--groups", type=int, default=20, help="groups of consecutive classes (np.array_split)")
    ap.add_argument("--former-orders", type=int, default=0,
                    help="orders per target run through the implementation before the scan (0: skip)")
    ap.add_argument("--no-analysis", action="store_true", help="skip the whole per-variant analysis")
    args = ap.parse_args()
    images, text, labels = make(n=args.images, n_classes=args.classes)
    G = args.groups
    groups = [a.tolist() for a in np.array_split(np.arange(args.classes), G)]  # consecutive, sizes differing by <= 1
    orders = ex.paper_orders(G, args.orders, seed=0)

    runs, cpu = [], []
    for _ in range(args.repeats):
        t, c = time.perf_counter(), time.process_time()
        acc_c, acc_e, acc_s, exp_e, exp_s = vectorised(images, text, labels, groups, orders)
        runs.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    vec = statistics.median(runs)
    full_runs = []
    for _ in range(0 if args.no_analysis else args.repeats):
        t = time.perf_counter()
        analysis(images, text, labels, groups, args.orders)
        full_runs.append(time.perf_counter() - t)
    out = {
        "images": int(labels.size), "classes": int(text.shape[0]), "groups": G,
        "orders": int(orders.shape[0]), "orders_per_target": args.orders,
        "acc_c": acc_c, "acc_e": acc_e, "acc_e_expected": exp_e, "acc_s": acc_s, "acc_s_expected": exp_s,
        "vectorised_s_median": round(vec, 4), "vectorised_runs": [round(r, 4) for r in runs],
        "vectorised_cpu_s": [round(c, 4) for c in cpu],  # process time (all threads): less sensitive to other load
    }
    if full_runs:
        out.update({
            "analysis_per_variant_s_median": round(statistics.median(full_runs), 4),
            "analysis_runs": [round(r, 4) for r in full_runs],
            # the stage runs every default variant (single, ensemble, repe) on the same images: that many times one
            "default_variants": len(op.DEFAULTS["variants"]),
            "analysis_default_variants_s": round(statistics.median(full_runs) * len(op.DEFAULTS["variants"]), 4)})
    scores = normalise(images) @ normalise(text).T
    if args.former_orders:
        sub = orders.reshape(G, -1, G)[:, :args.former_orders].reshape(-1, G)
        seconds, cpu_seconds, acc = former(scores, labels, groups, sub)
        scaled = seconds * orders.shape[0] / sub.shape[0]
        out.update({"former_orders_run": int(sub.shape[0]), "former_acc_e_s_run": round(seconds, 2),
                    "former_acc_e_cpu_s_run": round(cpu_seconds, 2),
                    "former_acc_e_s_scaled_to_all_orders": round(scaled, 1),
                    "former_over_vectorised": round(scaled / vec, 1),
                    "former_matches_scan": bool(np.array_equal(acc, ex.extensibility(scores, labels, groups,
                                                                                      sub).per_order))})
    if args.baseline_orders:
        sub = orders.reshape(G, -1, G)[:, :args.baseline_orders].reshape(-1, G)
        base_runs = []
        for _ in range(max(1, min(3, args.repeats))):
            t = time.perf_counter()
            base_e, base_s = baseline(images, text, labels, groups, sub)
            base_runs.append(time.perf_counter() - t)
        base_sub = statistics.median(base_runs)
        scale = orders.shape[0] / sub.shape[0]
        # the same orders through the vectorised path, to check that both give the same numbers
        check_e = ex.extensibility(scores, labels, groups, sub).mean
        check_s = ex.stability_all(scores, labels, groups, sub).mean
        out.update({
            "baseline_orders_run": int(sub.shape[0]), "baseline_s_median_run": round(base_sub, 3),
            "baseline_s_scaled_to_all_orders": round(base_sub * scale, 1),
            "speedup": round(base_sub * scale / vec, 1),
            "baseline_matches_vectorised": bool(abs(base_e - check_e) < 1e-4 and abs(base_s - check_s) < 1e-4)})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
