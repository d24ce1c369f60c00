"""FewTrans fine-tuning (VisualFT, TextFT, AllFT, Finetune, LoRA, BitFit) on the episodes that `adapt` samples.

`run_episodes(model_cfg, prepared_dir, texts_path, cfg, seed, device=None, episodes_cfg=None)` draws the episodes of
adapt's FewTrans protocol (`vlbench.analyses.adapt.fewtrans`: the same `sample_episodes`, class split, settings
`episodes_cfg` = params `adapt.fewtrans` and the same global `seed`), so every episode has the same classes, support
and query sample ids as a row of adapt's `episodes.parquet`. Per episode and method it fine-tunes a fresh copy of the
model on the support images (decoded from data/prepared/<dataset>/<split>.parquet by row, the model's own
preprocessing) once per member of the hyper-parameter ensemble, classifies the query images with each member and
combines the members (summed logits, the paper; or a vote, the code). It returns (summary, table): the metrics
`fewtrans/<split>/<method>` with their 95% intervals, and one row per episode and split in episodes.parquet's schema
(episode, split, ways, shots, query, classes, node, support_ids, query_ids, one accuracy column per method).

Methods (`METHODS`): the multimodal rows of FewTrans' Tables 6-7 classify with the class prompts' text features
(CLIP's own head: logit_scale x cosine, the scale frozen), one learning rate, a 5 x 3 ensemble, base and base-to-novel;
the vision-only rows of its Table 5 put a linear head (weights 1, bias 0) on the normalised image features, two
learning rates (backbone, head), a 3 x 3 x 3 ensemble, base only. docs/protocols.md, "Adapt: FewTrans episodes",
"Fine-tuning methods", has every rule with its source.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
from torch import nn

from vlbench.analyses.adapt import fewtrans as episodic
from vlbench.analyses.adapt.vtab import flush_denormals
from vlbench.datasets.canonical import load_meta, read_columns, split_path
from vlbench.datasets.images import decode_rgb
from vlbench.embed import CorruptImageError, model_for_dataset
from vlbench.finetune import FinetuneError
from vlbench.finetune.common import Job, Outcome
from vlbench.finetune.methods import prepare
from vlbench.models.loading import load_model
from vlbench.stats import episodes_interval
from vlbench.texts import read_text_set


@dataclass(frozen=True)
class Method:
    selection: str  # vlbench.finetune.methods.SELECTIONS
    head: str  # "text": the class prompts' features (one rate) | "linear": a linear head (backbone + head rates)


METHODS: dict[str, Method] = {
    "visual_ft": Method("visual", "text"),  # Tables 6-7, VisualFT
    "text_ft": Method("text", "text"),  # TextFT
    "all_ft": Method("all", "text"),  # AllFT
    "finetune": Method("visual", "linear"),  # Table 5, Finetune (vision-only)
    "lora": Method("lora", "linear"),  # Table 5, LoRA
    "bitfit": Method("bitfit", "linear"),  # Table 5, BitFit
}
COMBINES = ("sum", "vote")
SHUFFLE_SEED = 11  # the code's `_rng = np.random.RandomState(11)`, made afresh for every member of every episode
QUERY_BATCH = 256  # images per forward pass when scoring (runtime only)

DEFAULTS: dict[str, Any] = {
    "methods": ["visual_ft", "text_ft", "all_ft", "lora", "bitfit"],
    "text_set": "prompts",  # class prompts of the text head (template rows)
    "lr_factors": [0.04, 0.2, 1.0, 5.0, 25.0],  # App. B.2, one learning rate: 5 rates x5 apart around lr*
    "two_lr_factors": [0.2, 1.0, 5.0],  # App. B.2, two learning rates: lr* / 5, lr*, 5 lr* on each axis (3 x 3)
    "epoch_offset": 10,  # App. B.2: E' = E* + 10; members train E'/3, 2E'/3, E' epochs
    "epoch_mode": "grid",  # grid: a run per (rates, epochs) | snapshots: the code's epoch_ensemble | last: E' only
    "combine": "sum",  # sum: logits summed (Section 5.1) | vote: the code's majority vote
    # per method: the ensemble's centre (lr*, head_lr*, E*) and the support batch (the code's CLASSIFIER_PARAMETERS)
    "visual_ft": {"lr": 1.0e-5, "epochs": 60, "batch_size": 32},
    "text_ft": {"lr": 1.0e-5, "epochs": 60, "batch_size": 64},
    "all_ft": {"lr": 1.0e-5, "epochs": 60, "batch_size": 32},
    "finetune": {"lr": 1.0e-5, "head_lr": 2.0e-3, "epochs": 60, "batch_size": 64},
    "lora": {"lr": 2.0e-3, "head_lr": 1.0e-2, "epochs": 30, "batch_size": 64, "rank": 4, "alpha": 4.0},
    "bitfit": {"lr": 2.0e-3, "head_lr": 1.0e-2, "epochs": 30, "batch_size": 32},
}
METHOD_KEYS = {"text": {"lr", "epochs", "batch_size"}, "linear": {"lr", "head_lr", "epochs", "batch_size"}}
LORA_KEYS = {"rank", "alpha"}


def settings(cfg: Mapping[str, Any] | None) -> dict[str, Any]:
    """`cfg` (params `finetune.fewtrans`) over DEFAULTS, one level deep for the method entries; unknown keys refused."""
    cfg = dict(cfg or {})
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise FinetuneError(f"params.yaml: finetune.fewtrans has unknown key(s) {unknown}; known: {sorted(DEFAULTS)}")
    out = {**DEFAULTS, **cfg, **{m: {**DEFAULTS[m], **(cfg.get(m) or {})} for m in METHODS}}
    _check(out)
    return out


def _method_problem(name: str, m: Mapping[str, Any]) -> str | None:
    keys = METHOD_KEYS[METHODS[name].head] | (LORA_KEYS if METHODS[name].selection == "lora" else set())
    problems = [
        set(m) != keys and f"must have exactly the keys {sorted(keys)}, has {sorted(m)}",
        set(m) == keys and min(float(m["lr"]), float(m.get("head_lr", 1))) <= 0 and "learning rates must be positive",
        set(m) == keys and int(m["epochs"]) < 1 and "epochs (E*) must be at least 1",
        set(m) == keys and int(m["batch_size"]) < 1 and "batch_size must be at least 1",
        "rank" in keys and set(m) == keys and int(m["rank"]) < 1 and "rank must be at least 1",
    ]
    return next((p for p in problems if p), None)


def _check(s: Mapping[str, Any]) -> None:
    bad = [m for m in s["methods"] if m not in METHODS]
    problems = {
        "methods": (bad or not s["methods"]) and f"must name methods of {list(METHODS)}, got {s['methods']}",
        "lr_factors": (not s["lr_factors"] or min(s["lr_factors"]) <= 0) and "must be positive factors",
        "two_lr_factors": (not s["two_lr_factors"] or min(s["two_lr_factors"]) <= 0) and "must be positive factors",
        "epoch_offset": int(s["epoch_offset"]) < 0 and "must be at least 0",
        "epoch_mode": s["epoch_mode"] not in EPOCH_MODES and f"must be one of {list(EPOCH_MODES)}",
        "combine": s["combine"] not in COMBINES and f"must be one of {list(COMBINES)}",
        **{m: _method_problem(m, s[m]) for m in METHODS},
    }
    for key, problem in problems.items():
        if problem:
            raise FinetuneError(f"params.yaml: finetune.fewtrans.{key} {problem}")


# ----------------------------------------------------------------------------------------------------------------
# The ensemble


@dataclass(frozen=True)
class Member:
    lr: float  # backbone (or the one) learning rate
    head_lr: float | None  # linear head's rate; None for the text head
    epochs: int  # epochs trained (each its own cosine schedule to zero)
    scored: tuple[int, ...]  # epochs after which its query logits count as members of the ensemble


def _grid(rates, axis: list[int]) -> list[Member]:
    return [Member(lr, hlr, e, (e,)) for e in sorted(axis, reverse=True) for lr, hlr in rates]


def _snapshots(rates, axis: list[int]) -> list[Member]:
    top = max(axis)
    return [Member(lr, hlr, top, tuple(episodic.snapshot_epochs(top))) for lr, hlr in rates]


def _last(rates, axis: list[int]) -> list[Member]:
    return [Member(lr, hlr, max(axis), (max(axis),)) for lr, hlr in rates]


EPOCH_MODES: dict[str, Callable[[list, list[int]], list[Member]]] = {
    "grid": _grid, "snapshots": _snapshots, "last": _last}


def members(name: str, s: Mapping[str, Any]) -> list[Member]:
    """The method's ensemble (App. B.2): text head, rates lr* x lr_factors (5 x 3 with the epochs); linear head,
    (lr* x f, head_lr* x g) for f, g in two_lr_factors (3 x 3 x 3); epochs `epoch_axis(E*, epoch_offset)`."""
    m = s[name]
    if METHODS[name].head == "text":
        rates = [(float(m["lr"]) * f, None) for f in s["lr_factors"]]
    else:
        factors = s["two_lr_factors"]
        rates = [(float(m["lr"]) * f, float(m["head_lr"]) * g) for f in factors for g in factors]
    return EPOCH_MODES[s["epoch_mode"]](rates, episodic.epoch_axis(m["epochs"], s["epoch_offset"]))


def cosine_rate(base: float, step: int, steps: int) -> float:
    """0.5 x base x (1 + cos(pi x step / steps)), set before step `step` (0-based): no warm-up, zero at the end."""
    return 0.5 * base * (1.0 + math.cos(math.pi * step / steps))


# ----------------------------------------------------------------------------------------------------------------
# Data: the pool's images by row, the class prompts


class PoolImages:
    """The pool's images (the prepared splits concatenated in `splits` order, as adapt's pool), decoded and
    preprocessed by row; reads only the row groups that hold the rows asked for."""

    def __init__(self, dataset_dir: Path, splits: list[str], preprocess: Callable, sample_ids: np.ndarray):
        self.files = [pq.ParquetFile(split_path(dataset_dir, s)) for s in splits]
        groups = [(f, g, pf.metadata.row_group(g).num_rows) for f, pf in enumerate(self.files)
                  for g in range(pf.num_row_groups)]
        self.groups = [(f, g) for f, g, _ in groups]
        self.starts = np.cumsum([0] + [n for _, _, n in groups])[:-1]
        self.preprocess, self.sample_ids, self.dataset_dir = preprocess, sample_ids, dataset_dir

    def load(self, rows: np.ndarray) -> torch.Tensor:
        where = np.searchsorted(self.starts, rows, side="right") - 1
        out: list[torch.Tensor | None] = [None] * len(rows)
        for g in np.unique(where):
            f, group = self.groups[g]
            column = self.files[f].read_row_group(group, columns=["image"]).column("image")
            for i in np.flatnonzero(where == g):
                out[i] = self._decode(column[int(rows[i] - self.starts[g])].as_py(), int(rows[i]))
        return torch.stack(out)

    def _decode(self, data: bytes | None, row: int) -> torch.Tensor:
        try:
            return self.preprocess(decode_rgb(data))
        except (OSError, ValueError, SyntaxError) as err:
            raise CorruptImageError(f"{self.dataset_dir}: sample {self.sample_ids[row]!r} cannot be decoded ({err}); "
                                    "fine-tuning needs every image of the FewTrans pool") from None


def read_pool(dataset_dir: Path, meta, splits: list[str]) -> episodic.Pool:
    """Labels and sample ids of the pool's rows (no images, no features): adapt's pool, row for row."""
    if meta.multi_label:
        raise FinetuneError(f"dataset {meta.name!r}: FewTrans episodes need single-label data")
    missing = [s for s in splits if s not in meta.splits]
    if missing:
        raise FinetuneError(f"dataset {meta.name!r} has no split(s) {missing} (adapt.fewtrans.splits); "
                            f"it has {sorted(meta.splits)}")
    parts = [read_columns(split_path(dataset_dir, s), ["sample_id", "label"]) for s in splits]
    return episodic.Pool(None, np.concatenate([p.column("label").to_numpy() for p in parts]),
                         np.concatenate([p.column("sample_id").to_numpy(zero_copy_only=False) for p in parts]))


class Prompts:
    """The text set's template rows, tokenised per class."""

    def __init__(self, texts_path: Path, tokenizer: Callable, num_classes: int):
        table, _ = read_text_set(Path(texts_path))
        keep = [src == "template" for src in table.column("source").to_pylist()]
        index = table.column("class_index").to_numpy()[np.array(keep, dtype=bool)]
        texts = [t for t, k in zip(table.column("text").to_pylist(), keep) if k]
        missing = sorted(set(range(num_classes)) - set(index.tolist()))
        if missing:
            raise FinetuneError(f"{texts_path}: no template prompt for class indices {missing[:10]} "
                                "(finetune.fewtrans.text_set)")
        self.index, self.tokens = index, tokenizer(texts)

    def of(self, classes: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, episode label of each prompt) of the episode's classes, in episode label order."""
        rows = [np.flatnonzero(self.index == c) for c in classes]
        labels = np.repeat(np.arange(len(classes)), [len(r) for r in rows])
        return self.tokens[np.concatenate(rows)], torch.as_tensor(labels)


# ----------------------------------------------------------------------------------------------------------------
# Heads: what turns a fine-tuned model into logits


def class_features(model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor, ways: int) -> torch.Tensor:
    """(ways, d): per class the renormalised mean of its normalised prompt features (the zeroshot analysis's rule)."""
    emb = F.normalize(model.encode_text(tokens), dim=-1)
    sums = torch.zeros(ways, emb.shape[1], dtype=emb.dtype, device=emb.device).index_add(0, labels, emb)
    return F.normalize(sums / torch.bincount(labels, minlength=ways)[:, None], dim=-1)


class TextHead(nn.Module):
    """CLIP's classifier: logit_scale.exp() x cosine(image, class prompt features); the scale stays frozen. The
    prompt features are recomputed at every call while the text tower trains, else computed once."""

    def __init__(self, model: nn.Module, prompts: tuple[torch.Tensor, torch.Tensor], ways: int):
        super().__init__()
        self.model, self.prompts, self.ways = model, prompts, ways
        self.trains_text = any(p.requires_grad for n, p in model.named_parameters() if not n.startswith("visual."))
        self.fixed = None

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        weights = self.fixed if self.fixed is not None else class_features(self.model, *self.prompts, self.ways)
        if not self.trains_text and self.fixed is None:
            self.fixed = weights.detach()
        return self.model.logit_scale.exp() * feats @ weights.T


def linear_head(dim: int, ways: int, device) -> nn.Linear:
    """The code's `Linear_head`: nn.Linear(d, ways), weight.data.fill_(1), bias 0."""
    head = nn.Linear(dim, ways).to(device)
    with torch.no_grad():
        head.weight.fill_(1.0)
        head.bias.zero_()
    return head


def encode(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    return F.normalize(model.encode_image(images), dim=-1)


# ----------------------------------------------------------------------------------------------------------------
# Training one member


@dataclass
class Trained:
    losses: list[float]  # the loss of every step, in order
    rates: list[list[float]]  # the learning rate of each parameter group (backbone, head) at every step
    logits: dict[int, list[torch.Tensor]]  # scored epoch -> [logits of each evaluation set]


def fit(model: nn.Module, head: nn.Module, support: torch.Tensor, labels: torch.Tensor, member: Member,
        batch_size: int, evaluate: Callable[[], list[torch.Tensor]], autocast) -> Trained:
    """Cross-entropy on the support set in shuffled batches (a fresh RandomState(11) per member, reshuffled every
    epoch), Adam (default betas and eps, no weight decay; backbone and head rates as two parameter groups) with the
    rate set to `cosine_rate` before every step; the model stays in eval mode (BatchNorm statistics and dropout as
    at inference, the code's `model.eval()`). When the image tower is frozen its support features are computed once."""
    groups = [{"params": [p for p in model.parameters() if p.requires_grad], "lr": member.lr}]
    if member.head_lr is not None:
        groups.append({"params": list(head.parameters()), "lr": member.head_lr})
    rates = [g["lr"] for g in groups]
    optimizer = torch.optim.Adam(groups)
    visual_trains = any(p.requires_grad for p in model.visual.parameters())
    inputs = support
    if not visual_trains:
        with torch.no_grad(), autocast():
            inputs = encode(model, support).float()
    n = len(support)
    steps, step = member.epochs * math.ceil(n / batch_size), 0
    rng, out = np.random.RandomState(SHUFFLE_SEED), Trained([], [], {})
    model.eval()
    for epoch in range(1, member.epochs + 1):
        order = torch.from_numpy(rng.permutation(n))
        for start in range(0, n, batch_size):
            for group, rate in zip(optimizer.param_groups, rates):
                group["lr"] = cosine_rate(rate, step, steps)
            out.rates.append([g["lr"] for g in optimizer.param_groups])
            optimizer.zero_grad()
            idx = order[start:start + batch_size]
            with autocast():
                feats = encode(model, inputs[idx]) if visual_trains else inputs[idx]
                loss = F.cross_entropy(head(feats).float(), labels[idx])
            loss.backward()
            optimizer.step()
            out.losses.append(float(loss.detach()))
            step += 1
        if epoch in member.scored:
            out.logits[epoch] = evaluate()
    return out


# ----------------------------------------------------------------------------------------------------------------
# One episode


@dataclass
class EpisodeData:
    support: torch.Tensor
    support_labels: torch.Tensor
    query: torch.Tensor
    query_labels: np.ndarray
    base: episodic.Episode
    novel: episodic.Episode | None
    novel_query: torch.Tensor | None
    novel_labels: np.ndarray | None


def episode_data(base: episodic.Episode, novel: episodic.Episode | None, images: PoolImages, device) -> EpisodeData:
    srows, slabels = base.rows("support")
    qrows, qlabels = base.rows("query")
    nrows, nlabels = novel.rows("query") if novel is not None else (None, None)
    return EpisodeData(images.load(srows).to(device), torch.as_tensor(slabels, device=device),
                       images.load(qrows).to(device), qlabels, base, novel,
                       images.load(nrows).to(device) if novel is not None else None, nlabels)


def batched_logits(model: nn.Module, head: nn.Module, images: torch.Tensor, autocast) -> torch.Tensor:
    with torch.no_grad(), autocast():
        return torch.cat([head(encode(model, images[i:i + QUERY_BATCH])).float()
                          for i in range(0, len(images), QUERY_BATCH)]).cpu()


@dataclass
class Context:
    """What every member of every episode shares: the base model, prompts, settings, device."""

    model: nn.Module
    prompts: Prompts | None
    s: Mapping[str, Any]
    device: torch.device
    autocast: Callable
    seed: int


def member_generator(ctx: Context, episode: int, index: int) -> torch.Generator:
    """The seed of a member's LoRA initialisation: from (seed, episode, member), so runs repeat exactly."""
    state = np.random.SeedSequence([ctx.seed, episode, index]).generate_state(1)[0]
    return torch.Generator(device="cpu").manual_seed(int(state))


def train_member(ctx: Context, name: str, data: EpisodeData, member: Member, episode: int, index: int) -> Trained:
    """A fresh copy of the model prepared for `name`, fine-tuned on the episode's support set with `member`'s
    rates and epochs; its logits on the base query (and, for a text head, the novel query) at each scored epoch."""
    method, cfg = METHODS[name], ctx.s[name]
    model, _ = prepare(copy.deepcopy(ctx.model), method.selection, int(cfg.get("rank", 4)),
                       float(cfg.get("alpha", 4.0)), member_generator(ctx, episode, index))
    model.to(ctx.device)
    ways = data.base.ways
    if method.head == "text":
        head = TextHead(model, tuple(t.to(ctx.device) for t in ctx.prompts.of(data.base.classes)), ways)
    else:
        head = linear_head(model.visual.output_dim, ways, ctx.device)

    def evaluate() -> list[torch.Tensor]:
        out = [batched_logits(model, head, data.query, ctx.autocast)]
        if method.head == "text" and data.novel is not None:
            novel_head = TextHead(model, tuple(t.to(ctx.device) for t in ctx.prompts.of(data.novel.classes)),
                                  data.novel.ways)
            out.append(batched_logits(model, novel_head, data.novel_query, ctx.autocast))
        return out

    return fit(model, head, data.support, data.support_labels, member, int(cfg["batch_size"]), evaluate, ctx.autocast)


def ensemble_accuracy(logits: list[torch.Tensor], labels: np.ndarray, how: str) -> float:
    """Accuracy of the members' combined predictions: summed logits or a vote (adapt's `combine`)."""
    stacked = torch.stack(logits).numpy()[None]  # (1, members, Q, K)
    return float((episodic.combine(stacked, how)[0] == labels).mean())


def run_method(ctx: Context, name: str, data: EpisodeData, episode: int) -> dict[str, float]:
    """{split: ensemble accuracy} of one method on one episode (novel only for a text head)."""
    sets: list[list[torch.Tensor]] = [[], []]
    for index, member in enumerate(members(name, ctx.s)):
        trained = train_member(ctx, name, data, member, episode, index)
        for epoch in member.scored:
            for k, logits in enumerate(trained.logits[epoch]):
                sets[k].append(logits)
    out = {"base": ensemble_accuracy(sets[0], data.query_labels, ctx.s["combine"])}
    if sets[1]:
        out["novel"] = ensemble_accuracy(sets[1], data.novel_labels, ctx.s["combine"])
    return out


# ----------------------------------------------------------------------------------------------------------------
# The protocol


def draw_episodes(dataset_dir: Path, episodes_cfg: Mapping[str, Any] | None, seed: int):
    """(meta, adapt's settings, pool, base classes, novel classes, episode pairs): adapt's FewTrans draws on the
    prepared dataset's rows (`sample_episodes` with the same settings and seed)."""
    meta = load_meta(dataset_dir)
    s = episodic.settings(episodes_cfg)
    pool = read_pool(Path(dataset_dir), meta, list(s["splits"]))
    base, novel, graph = episodic.episode_classes(meta, s)
    pairs = episodic.sample_episodes(episodic.class_pools(pool.labels, len(meta.classes)), base, novel, s, seed, graph)
    return meta, s, pool, base, novel, pairs


def trainable_parameters(model: nn.Module, s: Mapping[str, Any]) -> dict[str, int]:
    """Per method, the backbone parameters it trains (the linear head's ways x (d + 1) come on top)."""
    counts = {}
    for name in s["methods"]:
        cfg = s[name]
        counts[name] = prepare(copy.deepcopy(model), METHODS[name].selection, int(cfg.get("rank", 4)),
                               float(cfg.get("alpha", 4.0)))[1]
    return counts


def run_episodes(model_cfg: Mapping[str, Any], prepared_dir: str | Path, texts_path: str | Path | None,
                 cfg: Mapping[str, Any] | None, seed: int, device: str | None = None,
                 episodes_cfg: Mapping[str, Any] | None = None):
    """(summary, episodes table) of FewTrans fine-tuning on one prepared dataset.

    `model_cfg`: params `model` (vlbench.models.loading.load_model); `prepared_dir`: data/prepared/<dataset>;
    `texts_path`: the text set file of the text head (data/texts/<dataset>/<finetune.fewtrans.text_set>.parquet; may
    be None when only linear-head methods run); `cfg`: params `finetune.fewtrans` (`DEFAULTS`); `seed`: params `seed`,
    adapt's episode seed; `episodes_cfg`: params `adapt.fewtrans` (the sampler's settings; its methods are ignored).
    Summary: metrics `fewtrans/<split>/<method>`, `summary` (mean, ci95, episodes per metric), `intervals`, the
    ensemble of each method, the trainable backbone parameters, the settings, seed and class split."""
    s = settings(cfg)
    meta, sampler, pool, base, novel, pairs = draw_episodes(Path(prepared_dir), episodes_cfg, seed)
    loaded = model_for_dataset(load_model(model_cfg, device), meta)
    needs_text = any(METHODS[m].head == "text" for m in s["methods"])
    if needs_text and texts_path is None:
        raise FinetuneError(f"finetune.fewtrans.methods {s['methods']} need the text set "
                            f"finetune.fewtrans.text_set ({s['text_set']!r}) of dataset {meta.name!r}")
    prompts = Prompts(Path(texts_path), loaded.tokenizer, len(meta.classes)) if needs_text else None
    ctx = Context(loaded.model, prompts, s, loaded.device, loaded.autocast, seed)
    images = PoolImages(Path(prepared_dir), list(sampler["splits"]), loaded.preprocess, pool.sample_ids)
    acc: dict[tuple[str, str], list[float]] = {}
    with flush_denormals():  # CPU only: subnormal activations and updates made toy steps 1.6x slower (measured)
        for i, (b, n) in enumerate(pairs):
            data = episode_data(b, n, images, loaded.device)
            for name in s["methods"]:
                for split, value in run_method(ctx, name, data, i).items():
                    acc.setdefault((split, name), []).append(value)
    acc_np = {k: np.array(v) for k, v in acc.items()}
    metrics, details = episodic.summarise(acc_np)
    summary = {"metrics": metrics, "summary": details,
               "intervals": {f"fewtrans/{sp}/{m}": episodes_interval(v).to_json() for (sp, m), v in acc_np.items()},
               "ensemble": {m: [vars(x) for x in members(m, s)] for m in s["methods"]},
               "trainable_parameters": trainable_parameters(loaded.model, s), "settings": s, "seed": seed,
               "base_classes": base.tolist(), "novel_classes": novel.tolist(), "episodes": len(pairs)}
    return summary, episodic.episodes_table(pairs, pool, acc_np, list(s["methods"]))


def run(job: Job) -> Outcome:
    """`finetune.method: fewtrans_episodic` in the finetune stage: `run_episodes` on the job's dataset with params'
    `finetune.fewtrans_episodic` (over DEFAULTS), `adapt.fewtrans` (the episodes adapt samples) and the global seed.
    No single model results (each episode fine-tunes its own copy), so no weights are written; the episodes table
    joins reports/adapt/<dataset>.episodes.parquet on (episode, split)."""
    s = settings(job.settings)
    texts = job.texts / f"{s['text_set']}.parquet"
    summary, table = run_episodes(job.model_cfg, job.prepared, texts if texts.is_file() else None, job.settings,
                                  job.seed, job.runtime.device, (job.params.get("adapt") or {}).get("fewtrans"))
    details = {k: v for k, v in summary.items() if k not in ("metrics", "intervals")}
    return Outcome(state_dict=None, trainable=[], hyper={"settings": s, "seed": job.seed},
                   metrics=summary["metrics"], details=details, tables={"episodes": table},
                   counts={"episodes": summary["episodes"]}, intervals=summary["intervals"])
