"""Adversarial vocabulary speed: the batched scan (vlbench.analyses.extensibility.scan_vocabulary) vs the authors' loop.

CIFAR-100-sized: 10,000 images x 100 classes (random embeddings, dim 512, about 60% top-1), `--candidates` candidate
words (random text embeddings; the paper scans WordNet's nouns, 119,034 lemma names in WordNet 3.0).

  batched   the score matrix once, then one chunked product of the correctly classified images with every
            candidate: a candidate harms an image when its score beats the true class's.
  baseline  what lancopku/clip-openness main.py:adv_vocab_mining does per word (test_with_reassigned_adv_cn): logits of
            every test image against the class texts plus the word's text, argmax, accuracy. The embeddings stand in
            for the encoders (which the authors re-run per batch: the word's text every batch, the images every word),
            so the baseline pays only the normalisations, the product and the argmax, which flatters it. It runs
            `--baseline-words` words and its time is scaled linearly to all candidates.

    python benchmarks/adversarial_vocab_speed.py [--candidates 20000] [--repeats 3] [--baseline-words 20]

Prints a JSON line: median seconds of the batched scan, the scaled baseline, their ratio, and whether both give the
same accuracy drops on the words the baseline ran.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from vlbench.analyses import extensibility as op


def make(n=10_000, n_classes=100, n_words=20_000, dim=512, seed=0):
    rng = np.random.default_rng(seed)
    text = rng.standard_normal((n_classes, dim)).astype(np.float32)
    labels = np.repeat(np.arange(n_classes), n // n_classes)
    images = text[labels] * 0.12 + rng.standard_normal((n, dim)).astype(np.float32)
    words = text[rng.integers(0, n_classes, n_words)] * 0.5 + rng.standard_normal((n_words, dim)).astype(np.float32)
    return op.l2_normalize(images), op.l2_normalize(text), labels, op.l2_normalize(words)


def baseline(images, text, labels, words):
    """Accuracy with each word appended as one more class, word by word; returns the accuracy drops."""
    base = (np.argmax(images @ text.T, axis=1) == labels).mean()
    drops = []
    for w in words:
        vocab = np.vstack([text, w[None, :]])
        vocab = vocab / np.linalg.norm(vocab, axis=1, keepdims=True)
        x = images / np.linalg.norm(images, axis=1, keepdims=True)
        drops.append(base - (np.argmax(x @ vocab.T, axis=1) == labels).mean())
    return np.array(drops)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--candidates", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--baseline-words", type=int, default=20)
    args = ap.parse_args()
    images, text, labels, words = make(n_words=args.candidates)
    runs = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        harmed, correct = op.scan_vocabulary(images, labels, text, words)
        runs.append(time.perf_counter() - t)
    batched = statistics.median(runs)
    t = time.perf_counter()
    drops = baseline(images, text, labels, words[:args.baseline_words])
    base_run = time.perf_counter() - t
    scaled = base_run * args.candidates / args.baseline_words
    print(json.dumps({
        "images": int(labels.size), "classes": int(text.shape[0]), "candidates": args.candidates,
        "base_accuracy": float(correct.mean()), "largest_drop": float(harmed.max() / labels.size),
        "batched_s_median": round(batched, 3), "batched_runs": [round(r, 3) for r in runs],
        "baseline_words_run": args.baseline_words, "baseline_s_run": round(base_run, 3),
        "baseline_s_scaled_to_all_words": round(scaled, 1), "speedup": round(scaled / batched, 1),
        "baseline_matches_batched": bool(np.allclose(drops, harmed[:args.baseline_words] / labels.size, atol=1e-12)),
    }))


if __name__ == "__main__":
    main()
