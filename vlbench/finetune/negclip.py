"""NegCLIP (Yuksekgonul et al., ICLR 2023, "When and why vision-language models behave like bags-of-words", Sec. 5;
docs/protocols.md "Fine-tuning: NegCLIP"): contrastive fine-tuning of the whole model on image-caption pairs whose
batches also hold hard negatives.

Per step, B images of the dataset's `train_split` (a seeded pass order), each with one of its captions and one of its
altered captions (the specificity texts, `altered_captions`: one noun swapped for one not in the image,
vlbench/knowledge/negatives.py) as a negative text; with `hard_negative_images`, each image also brings one of its
`neighbours` nearest images (cosine of the base model's image embeddings) with that image's caption and altered
caption, so a batch of B pairs is 2B images and up to 4B texts (the authors' README: batch 256 -> "512x1024").
Loss: CLIP's symmetric cross-entropy, where each image's softmax runs over every true and altered caption of the
batch, and each true caption's over the batch's images (an altered caption has no image of its own). AdamW and
open_clip's warmup + cosine schedule, logit scale clamped at 100, as open_clip's training.

Before and after: the specificity analysis and zero-shot classification on the dataset's `eval_split`, run by the
analyses' own `run` on features the two models make here (a temporary feature store): one table of what hard
negatives buy (specificity mAPs) and what they cost (zero-shot metric).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import torch.nn.functional as F

from vlbench.analyses import specificity, zeroshot
from vlbench.analyses.base import Inputs
from vlbench.datasets.canonical import load_meta
from vlbench.embed import embed_image_splits, embed_text_sets, model_for_dataset
from vlbench.engines import engine
from vlbench.finetune import FinetuneError
from vlbench.params import defaults
from vlbench.finetune.training import (
    Job,
    Loop,
    Outcome,
    cosine_with_warmup,
    count_parameters,
    deterministic,
    freeze,
    generator,
    pick_device,
    prepare_model,
    state_on_cpu,
    step_seed,
    train,
)
from vlbench.finetune.data import load_split
from vlbench.models.loading import load_model
from vlbench.models.toy import make_optimizer
from vlbench.texts import read_text_set

METHOD = "negclip"
DEFAULTS: dict[str, Any] = defaults("finetune.negclip")  # conf/settings/finetune.yaml
LOG_SCALE_MAX = float(np.log(100.0))


def settings(job: Job) -> dict[str, Any]:
    unknown = sorted(set(job.settings) - set(DEFAULTS))
    if unknown:
        raise FinetuneError(f"params.yaml: unknown key(s) finetune.negclip.{', '.join(unknown)}; allowed: "
                            f"{', '.join(DEFAULTS)}")
    s = {**DEFAULTS, **{k: v for k, v in job.settings.items() if v is not None or k == "max_steps"}}
    for key in ("epochs", "batch_size", "neighbours"):
        if not isinstance(s[key], int) or s[key] < 1:
            raise FinetuneError(f"params.yaml: finetune.negclip.{key} must be an integer >= 1, got {s[key]!r}")
    return s


def run(job: Job) -> Outcome:
    s = settings(job)
    device = pick_device(job.runtime.device)
    meta = load_meta(job.prepared)
    raw = load_model(job.model_cfg, device)  # evaluate() embeds through the embed stage's own dataset preprocessing
    loaded = model_for_dataset(raw, meta)
    prepare_model(loaded.model, job.options)
    pairs = Pairs.load(job, s, meta, loaded)
    before = evaluate(job, s, meta, raw, "base")
    started = time.perf_counter()
    with deterministic(job.seed):
        model = loaded.model
        names = freeze(model, lambda name: True)  # the paper fine-tunes the whole model
        steps = s["max_steps"] or max(1, s["epochs"] * len(pairs) // s["batch_size"])
        loop = Loop("negclip", steps, pairs.batch, pairs.loss, cosine_with_warmup(s["lr"], s["warmup"], steps),
                    job.seed, clamp_scale)
        log = train(model, make_optimizer(model, s["lr"], s["weight_decay"]), loop, job.options, job.runtime,
                    device)
    seconds = time.perf_counter() - started
    model.eval()
    tuned = replace(raw, fingerprint={**raw.fingerprint, "weights_sha256": "fine-tuned in memory",
                                         "finetune": METHOD})
    after = evaluate(job, s, meta, tuned, "negclip")
    rows = comparison(before, after)
    metrics = {f"{METHOD}/{r['analysis']}/{r['metric']}/{when}": r[when] for r in rows for when in ("before", "after")}
    hyper = {**{k: v for k, v in s.items() if k != "workers"}, "steps": steps, "altered_version": pairs.version,
             "options": {k: job.options.get(k) for k in ("precision",)}}
    return Outcome(
        state_dict=state_on_cpu(model), trainable=names, hyper=hyper, metrics=metrics,
        details={"table": rows, "steps": steps, "pairs": len(pairs), "with_negative": pairs.with_negative,
                 "initial_loss": log[0]["loss"], "final_loss": float(np.mean([e["loss"] for e in log[-max(1, steps // 10):]])),
                 "trainable_params": count_parameters(model, names)},
        tables={"comparison": comparison_table(rows), "train_log": pa.Table.from_pylist(log)},
        counts={"pairs": len(pairs)}, run={"seconds": seconds}, chart=comparison_chart(rows, meta.name))


def clamp_scale(model, step: int) -> None:
    with torch.no_grad():
        model.logit_scale.clamp_(0, LOG_SCALE_MAX)


class Pairs:
    """The training images with their captions and altered captions, tokenised once, and the batch of a step."""

    def __init__(self, images, finish, captions, negatives, neighbours, s, seed, version):
        self.images, self.finish, self.captions, self.negatives = images, finish, captions, negatives
        self.neighbours, self.s, self.seed, self.version = neighbours, s, seed, version
        self.with_negative = int(sum(1 for n in negatives if len(n)))

    def __len__(self) -> int:
        return len(self.captions)

    @classmethod
    def load(cls, job: Job, s, meta, loaded) -> Pairs:
        split = load_split(meta, job.prepared, s["train_split"], loaded.preprocess, s["workers"], ("captions",))
        ids = split.table.column("sample_id").to_pylist()
        caps = [[c for c in (cs or []) if c and c.strip()] for cs in split.table.column("captions").to_pylist()]
        keep = [i for i, c in enumerate(caps) if c]
        if len(keep) < 2:
            raise FinetuneError(f"dataset {meta.name!r} split {s['train_split']!r}: fewer than two images with a "
                                f"caption; NegCLIP trains on image-caption pairs")
        altered, stamp = read_text_set(job.texts / "altered_captions.parquet")
        by_id: dict[str, list[str]] = {}
        for sid, text in zip(altered.column("sample_id").to_pylist(), altered.column("text").to_pylist()):
            by_id.setdefault(sid, []).append(text)
        tok = loaded.tokenizer
        captions = [tok(caps[i]) for i in keep]
        negatives = [tok(by_id[ids[i]]) if by_id.get(ids[i]) else torch.zeros((0, captions[0].shape[1]), dtype=torch.long)
                     for i in keep]
        pixels = split.pixels[keep]
        neighbours = nearest(loaded, pixels, split.finish, s["neighbours"]) if s["hard_negative_images"] else None
        return cls(pixels, split.finish, captions, negatives, neighbours, s, job.seed, stamp.get("text_version"))

    def batch(self, step: int):
        """Rows of the step's pass order, their neighbours; one caption and one altered caption of each (empty-token
        rows where an image has none, flagged in `has_negative`)."""
        n, b = len(self), min(self.s["batch_size"], len(self))
        per_pass = n // b
        epoch, k = divmod(step - 1, per_pass)
        order = torch.randperm(n, generator=generator(step_seed(self.seed, "negclip-order", epoch)))
        rows = order[k * b:(k + 1) * b]
        g = generator(step_seed(self.seed, "negclip-pick", step))
        if self.neighbours is not None:
            pick = torch.randint(self.neighbours.shape[1], (b,), generator=g)
            rows = torch.cat([rows, self.neighbours[rows, pick]])
        caption = torch.stack([self.captions[r][torch.randint(len(self.captions[r]), (1,), generator=g)][0]
                               for r in rows.tolist()])
        has = torch.tensor([len(self.negatives[r]) > 0 for r in rows.tolist()])
        negative = torch.stack([self.negatives[r][torch.randint(len(self.negatives[r]), (1,), generator=g)][0]
                                if len(self.negatives[r]) else torch.zeros_like(caption[0]) for r in rows.tolist()])
        return self.images[rows], caption, negative, has

    def loss(self, model, x, caption, negative, has) -> torch.Tensor:
        image = F.normalize(model.encode_image(self.finish(x)), dim=-1)
        texts = F.normalize(model.encode_text(torch.cat([caption, negative[has]])), dim=-1)
        scale = model.logit_scale.exp()
        per_image = scale * image @ texts.T  # [N, N + negatives]: true captions first, then the altered ones
        per_text = per_image[:, :image.shape[0]].T  # [N, N]: each true caption over the batch's images
        labels = torch.arange(image.shape[0], device=image.device)
        return (F.cross_entropy(per_image, labels) + F.cross_entropy(per_text, labels)) / 2


@torch.no_grad()
def nearest(loaded, pixels: torch.Tensor, finish, k: int, chunk: int = 256) -> torch.Tensor:
    """[n, k]: each image's k nearest other images by the base model's image-embedding cosine."""
    model = loaded.model.eval()
    emb = torch.cat([F.normalize(model.encode_image(finish(pixels[i:i + chunk].to(loaded.device))).float(), dim=-1)
                     for i in range(0, pixels.shape[0], chunk)])
    sim = emb @ emb.T
    sim.fill_diagonal_(-float("inf"))
    return sim.topk(min(k, pixels.shape[0] - 1), dim=1).indices.cpu()


def evaluate(job: Job, s, meta, loaded, name: str) -> dict[str, Any]:
    """The specificity analysis and zero-shot classification of `loaded` on the eval split, by the analyses' own
    `run`, on features written to a temporary store with the model's fingerprint."""
    params = job.params
    with tempfile.TemporaryDirectory(prefix=f"vlbench-negclip-{name}-") as tmp:
        features = Path(tmp)
        on = engine(job.runtime.engine)  # the finetune stage's --engine, else $VLBENCH_ENGINE's
        embed_image_splits(loaded, job.prepared, features / "images", progress=False, num_workers=0, engine=on)
        embed_text_sets(loaded, job.texts, features / "text", engine=on)
        identity = {k: loaded.fingerprint[k] for k in ("model", "arch", "pretrained", "weights_sha256")}
        inputs = Inputs(meta, identity, features, job.texts)
        spec_cfg = {**(params.get("specificity") or {}), "split": s["eval_split"]}
        zs_cfg = {**(params.get("zeroshot") or {}), "split": s["eval_split"]}
        return {"specificity": specificity.run(inputs, spec_cfg, job.seed).metrics,
                "zeroshot": {k: v for k, v in zeroshot.run(inputs, zs_cfg, job.seed).metrics.items()
                             if not k.startswith("knowledge_")}}


def comparison(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per number: analysis, metric, before, after, change."""
    return [{"analysis": a, "metric": m, "before": float(before[a][m]), "after": float(after[a][m]),
             "change": float(after[a][m]) - float(before[a][m])}
            for a in ("specificity", "zeroshot") for m in before[a] if m in after[a]]


def comparison_table(rows: list[dict[str, Any]]) -> pa.Table:
    schema = pa.schema([("analysis", pa.string()), ("metric", pa.string()), ("before", pa.float64()),
                        ("after", pa.float64()), ("change", pa.float64())])
    return pa.Table.from_pylist(rows, schema=schema)


def comparison_chart(rows: list[dict[str, Any]], dataset: str) -> dict[str, Any]:
    """Each specificity cell and zero-shot metric before and after NegCLIP, side by side."""
    values = [{"number": f"{r['analysis']}: {r['metric']}", "model": when, "value": r[when]}
              for r in rows for when in ("before", "after")]
    return {"$schema": "https://vega.github.io/schema/vega-lite/v5.json",
            "title": f"NegCLIP on {dataset}: what hard negatives buy (specificity) and cost (zero-shot)",
            "data": {"values": values}, "mark": "bar",
            "encoding": {"y": {"field": "number", "type": "nominal", "title": None, "sort": None},
                         "yOffset": {"field": "model", "sort": ["before", "after"]},
                         "x": {"field": "value", "type": "quantitative", "title": "mAP / metric"},
                         "color": {"field": "model", "type": "nominal", "sort": ["before", "after"]}},
            "width": 360}
