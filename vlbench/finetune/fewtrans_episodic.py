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
Each ensemble's centre comes from the held-out search (`vlbench.finetune.heldout`), the authors' code or params
(`resolve_centres`); each (method, episode) is a work unit (`EpisodeWork`, `vlbench.finetune.units`): cached as it
finishes, run locally or on Ray, the table assembled from the units in a fixed order.

Tunings (`TUNINGS`, named by `methods` in the settings): the multimodal rows of FewTrans' Tables 6-7 classify with
the class prompts' text features (CLIP's own head: logit_scale x cosine, the scale frozen), one learning rate, a 5 x 3
ensemble, base and base-to-novel; the vision-only rows of its Table 5 put a linear head (weights 1, bias 0) on the
normalised image features, two learning rates (backbone, head), a 3 x 3 x 3 ensemble, base only.
docs/protocols.md, "Adapt: FewTrans episodes", "Fine-tuning methods", has every rule with its source.
"""

from __future__ import annotations

import copy
import json
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
from vlbench.finetune import FinetuneError, units
from vlbench.finetune.training import Job, Outcome
from vlbench.finetune.selections import prepare
from vlbench.models.identity import model_identity
from vlbench.models.loading import load_model
from vlbench.stats import episodes_interval
from vlbench.texts import read_text_set


@dataclass(frozen=True)
class Tuning:
    """One of FewTrans's ways to fine-tune in an episode: which parameters train, and the head."""

    selection: str  # vlbench.finetune.selections.SELECTIONS
    head: str  # "text": the class prompts' features (one rate) | "linear": a linear head (backbone + head rates)


TUNINGS: dict[str, Tuning] = {
    "visual_ft": Tuning("visual", "text"),  # Tables 6-7, VisualFT
    "text_ft": Tuning("text", "text"),  # TextFT
    "all_ft": Tuning("all", "text"),  # AllFT
    "finetune": Tuning("visual", "linear"),  # Table 5, Finetune (vision-only)
    "lora": Tuning("lora", "linear"),  # Table 5, LoRA
    "bitfit": Tuning("bitfit", "linear"),  # Table 5, BitFit
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
    # where each method's ensemble centre (lr*, head_lr*, E*) comes from when its entry below gives none: heldout (the
    # held-out search's average optimum, Section 5.1 / App. A: reports/heldout/<finetune.heldout.dataset>.json) |
    # authors_fixed (the centres the authors' code fixes: finetune and lora only, AUTHORS_FIXED)
    "centres": "heldout",
    # per method: the support batch (the code's CLASSIFIER_PARAMETERS), LoRA's rank and alpha; a centre given here
    # (lr, epochs, and head_lr for a linear head, all together) overrides `centres` for that method
    "visual_ft": {"batch_size": 32},
    "text_ft": {"batch_size": 64},
    "all_ft": {"batch_size": 32},
    "finetune": {"batch_size": 64},
    "lora": {"batch_size": 64, "rank": 4, "alpha": 4.0},
    "bitfit": {"batch_size": 32},
}
CENTRES = ("heldout", "authors_fixed")
# The centres the code's ensembles fix (docs/protocols.md "Fine-tuning methods on the episodes", Centres): Finetune
# [2e-6, 1e-5, 5e-5] x [4e-4, 2e-3, 1e-2] at 70 epochs, LoRA [4e-4, 2e-3, 1e-2] x [2e-3, 1e-2, 5e-2] at 40 epochs
AUTHORS_FIXED = {"finetune": {"lr": 1.0e-5, "head_lr": 2.0e-3, "epochs": 60},
                 "lora": {"lr": 2.0e-3, "head_lr": 1.0e-2, "epochs": 30}}
CENTRE_KEYS = {"text": {"lr", "epochs"}, "linear": {"lr", "head_lr", "epochs"}}
LORA_KEYS = {"rank", "alpha"}


def settings(cfg: Mapping[str, Any] | None) -> dict[str, Any]:
    """`cfg` (params `finetune.fewtrans_episodic`) over DEFAULTS, one level deep for the method entries; unknown keys refused."""
    cfg = dict(cfg or {})
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise FinetuneError(f"params.yaml: finetune.fewtrans_episodic has unknown key(s) {unknown}; known: {sorted(DEFAULTS)}")
    out = {**DEFAULTS, **cfg, **{m: {**DEFAULTS[m], **(cfg.get(m) or {})} for m in TUNINGS}}
    check_settings(out)
    return out


def _method_problem(name: str, m: Mapping[str, Any]) -> str | None:
    centre = CENTRE_KEYS[TUNINGS[name].head]
    keys = centre | {"batch_size"} | (LORA_KEYS if TUNINGS[name].selection == "lora" else set())
    given = set(m) & centre
    problems = [
        not set(m) <= keys and f"has unknown key(s) {sorted(set(m) - keys)}; known: {sorted(keys)}",
        not keys - centre <= set(m) and f"must have the keys {sorted(keys - centre)}, has {sorted(m)}",
        given and given != centre and (f"gives a centre with {sorted(given)}: give {sorted(centre)} together, or "
                                       "none (then finetune.fewtrans_episodic.centres says where it comes from)"),
        given == centre and min(float(m["lr"]), float(m.get("head_lr", 1))) <= 0 and "learning rates must be positive",
        given == centre and int(m["epochs"]) < 1 and "epochs (E*) must be at least 1",
        "batch_size" in m and int(m["batch_size"]) < 1 and "batch_size must be at least 1",
        "rank" in m and int(m["rank"]) < 1 and "rank must be at least 1",
    ]
    return next((p for p in problems if p), None)


def check_settings(s: Mapping[str, Any], section: str = "finetune.fewtrans_episodic") -> None:
    """Resolved settings `s` (`settings`, or the held-out search's methods over them): a FinetuneError naming the first
    bad key, as `params.yaml: <section>.<key> <problem>` (`section`: the params section that gave `s`)."""
    bad = [m for m in s["methods"] if m not in TUNINGS]
    problems = {
        "methods": (bad or not s["methods"]) and f"must name methods of {list(TUNINGS)}, got {s['methods']}",
        "lr_factors": (not s["lr_factors"] or min(s["lr_factors"]) <= 0) and "must be positive factors",
        "two_lr_factors": (not s["two_lr_factors"] or min(s["two_lr_factors"]) <= 0) and "must be positive factors",
        "epoch_offset": int(s["epoch_offset"]) < 0 and "must be at least 0",
        "epoch_mode": s["epoch_mode"] not in EPOCH_MODES and f"must be one of {list(EPOCH_MODES)}",
        "combine": s["combine"] not in COMBINES and f"must be one of {list(COMBINES)}",
        "centres": s["centres"] not in CENTRES and f"must be one of {list(CENTRES)}",
        **{m: _method_problem(m, s[m]) for m in TUNINGS},
    }
    for key, problem in problems.items():
        if problem:
            raise FinetuneError(f"params.yaml: {section}.{key} {problem}")


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
    if TUNINGS[name].head == "text":
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
                                "(finetune.fewtrans_episodic.text_set)")
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
    method, cfg = TUNINGS[name], ctx.s[name]
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
# Centres


def heldout_path(params: Mapping[str, Any]) -> Path | None:
    """reports/heldout/<finetune.heldout.dataset>.json, the held-out search's result (None: no held-out dataset set)."""
    dataset = ((params.get("finetune") or {}).get("heldout") or {}).get("dataset")
    return Path("reports/heldout") / f"{dataset}.json" if dataset else None


def resolve_centres(s: Mapping[str, Any], heldout: Path | Mapping[str, Any] | None,
                    model: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """(settings with every method's centre filled in, {method: where its centre came from}). A centre given in the
    method's entry is used as given ("params"); otherwise `centres` decides: "heldout" takes the held-out search's
    average optimum (`heldout`: its result file or document; `model`: this run's model identity, which must be the
    one searched), "authors_fixed" the centres the authors' code fixes (AUTHORS_FIXED: finetune and lora only)."""
    out, sources, doc = dict(s), {}, None
    for name in s["methods"]:
        centre_keys = CENTRE_KEYS[TUNINGS[name].head]
        if centre_keys <= set(s[name]):
            sources[name] = "params"
            continue
        if s["centres"] == "authors_fixed":
            if name not in AUTHORS_FIXED:
                raise FinetuneError(f"params.yaml: finetune.fewtrans_episodic.centres authors_fixed: the authors' code "
                                    f"fixes no centre for {name!r} (only {sorted(AUTHORS_FIXED)}); give "
                                    f"finetune.fewtrans_episodic.{name} {sorted(centre_keys)} or use centres: heldout")
            centre, sources[name] = AUTHORS_FIXED[name], "authors_fixed"
        else:
            doc = doc or read_heldout(heldout, model)
            if name not in doc["centres"]:
                raise FinetuneError(f"{doc['_path']}: the held-out search has no centre for {name!r} (it searched "
                                    f"{sorted(doc['centres'])}); add it to finetune.heldout.methods and rerun it")
            centre, sources[name] = doc["centres"][name], f"heldout:{doc['dataset']}"
        out[name] = {**s[name], **{k: centre[k] for k in centre_keys}}
    check_settings(out)
    return out, sources


def read_heldout(heldout: Path | Mapping[str, Any] | None, model: Mapping[str, Any] | None) -> dict[str, Any]:
    if heldout is None:
        raise FinetuneError("params.yaml: finetune.fewtrans_episodic.centres heldout needs the held-out search: set "
                            "finetune.heldout.dataset and run its stage (heldout@<dataset>), or use centres: "
                            "authors_fixed, or give each method's centre")
    if isinstance(heldout, Mapping):
        doc = {"_path": "the held-out search", **heldout}
    else:
        if not Path(heldout).is_file():
            raise FinetuneError(f"{heldout}: no held-out search result; run `dvc repro heldout@"
                                f"{Path(heldout).stem}` (finetune.heldout), or set finetune.fewtrans_episodic.centres: "
                                "authors_fixed")
        doc = {"_path": str(heldout), **json.loads(Path(heldout).read_text())}
    if model is not None and doc.get("model") != dict(model):
        raise FinetuneError(f"{doc['_path']}: the centres were searched for model {doc.get('model', {}).get('model')!r} "
                            f"({doc.get('model')}), not this run's {dict(model)}; rerun the held-out search")
    return doc


# ----------------------------------------------------------------------------------------------------------------
# Work units: one method on one episode, or one search point on one task


@dataclass
class EpisodeWork:
    """What every unit of a run shares (vlbench.finetune.units.Work): the model, the pool, the episodes, settings."""

    model_cfg: dict[str, Any]
    prepared: str
    texts: str | None
    s: dict[str, Any]
    seed: int
    device: str
    episodes_cfg: dict[str, Any] | None
    threads: int
    token: str = ""

    def __post_init__(self):
        self.token = units.canonical({k: v for k, v in vars(self).items() if k != "token"})

    def setup(self) -> dict[str, Any]:
        meta, sampler, pool, _, _, pairs = draw_episodes(Path(self.prepared), self.episodes_cfg, self.seed)
        loaded = model_for_dataset(load_model(self.model_cfg, self.device), meta)
        needs_text = any(TUNINGS[m].head == "text" for m in self.s["methods"])
        prompts = Prompts(Path(self.texts), loaded.tokenizer, len(meta.classes)) if needs_text else None
        ctx = Context(loaded.model, prompts, self.s, loaded.device, loaded.autocast, self.seed)
        images = PoolImages(Path(self.prepared), list(sampler["splits"]), loaded.preprocess, pool.sample_ids)
        return {"ctx": ctx, "pairs": pairs, "images": images, "episode": None}

    def compute(self, state: dict[str, Any], identity: Mapping[str, Any]) -> dict[str, float]:
        ctx, i = state["ctx"], int(identity["episode"])
        if state["episode"] is None or state["episode"][0] != i:  # units come episode by episode: decode once
            state["episode"] = (i, episode_data(*state["pairs"][i], state["images"], ctx.device))
        data = state["episode"][1]
        with flush_denormals():  # CPU only: subnormal activations and updates made toy steps 1.6x slower (measured)
            if "lr" not in identity:
                return run_method(ctx, identity["method"], data, i)
            return {"base": point_accuracy(ctx, identity, data, i)}


def point_accuracy(ctx: Context, point: Mapping[str, Any], data: EpisodeData, episode: int) -> float:
    """Base query accuracy of one configuration (lr, head_lr, epochs) of one method: a single run, no ensemble."""
    member = Member(float(point["lr"]), None if point["head_lr"] is None else float(point["head_lr"]),
                    int(point["epochs"]), (int(point["epochs"]),))
    trained = train_member(ctx, point["method"], data, member, episode, 0)
    return ensemble_accuracy([trained.logits[member.epochs][0]], data.query_labels, "sum")


def unit_context(model_cfg: Mapping[str, Any], prepared: Path, texts: Path | None, s: Mapping[str, Any], name: str,
                 seed: int, device: str, sampler: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """What a unit's numbers depend on besides its identity: the model, the data versions, the sampler, the seed, the
    device type and the method's own settings (so a method added to `methods` reuses the others' units)."""
    head = TUNINGS[name].head
    own: dict[str, Any] = {"method": s[name]}
    if kind == "episode":  # the ensemble around the centre
        own |= {k: s[k] for k in ("epoch_offset", "epoch_mode", "combine")}
        own["factors"] = s["lr_factors" if head == "text" else "two_lr_factors"]
    else:  # a search point: one run, its rates and epochs in the identity
        own["method"] = {k: v for k, v in s[name].items() if k not in CENTRE_KEYS[head]}
    data = {"dataset_version": load_meta(prepared).version}
    if head == "text":
        own["text_set"] = s["text_set"]
        data["text_version"] = read_text_set(Path(texts))[1].get("text_version")
    return {"kind": f"fewtrans_{kind}", "model": model_identity(model_cfg), "precision": model_cfg.get("precision"),
            "device": device, "data": data, "sampler": {k: v for k, v in sampler.items() if k not in SAMPLER_ONLY},
            "seed": int(seed), "settings": own}


SAMPLER_ONLY = ("methods", "linear", "text_set")  # adapt.fewtrans keys that do not change the episodes


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
        counts[name] = prepare(copy.deepcopy(model), TUNINGS[name].selection, int(cfg.get("rank", 4)),
                               float(cfg.get("alpha", 4.0)))[1]
    return counts


def check_texts(s: Mapping[str, Any], texts_path, dataset: str) -> None:
    if any(TUNINGS[m].head == "text" for m in s["methods"]) and texts_path is None:
        raise FinetuneError(f"finetune.fewtrans_episodic.methods {s['methods']} need the text set "
                            f"finetune.fewtrans_episodic.text_set ({s['text_set']!r}) of dataset {dataset!r}")


def run_episodes(model_cfg: Mapping[str, Any], prepared_dir: str | Path, texts_path: str | Path | None,
                 cfg: Mapping[str, Any] | None, seed: int, device: str | None = None,
                 episodes_cfg: Mapping[str, Any] | None = None, *, heldout: Path | Mapping[str, Any] | None = None,
                 units_dir: Path | None = None, engine: str | None = None, gpus: float | None = None,
                 progress: bool = False):
    """(summary, episodes table) of FewTrans fine-tuning on one prepared dataset.

    `model_cfg`: params `model` (vlbench.models.loading.load_model); `prepared_dir`: data/prepared/<dataset>;
    `texts_path`: the text set file of the text head (data/texts/<dataset>/<finetune.fewtrans_episodic.text_set>.parquet; may
    be None when only linear-head methods run); `cfg`: params `finetune.fewtrans_episodic` (`DEFAULTS`); `seed`: params `seed`,
    adapt's episode seed; `episodes_cfg`: params `adapt.fewtrans` (the sampler's settings; its methods are ignored);
    `heldout`: the held-out search's result (file or document) where `centres: heldout` (`resolve_centres`).
    Each (method, episode) is a work unit (`vlbench.finetune.units`): run on `engine` (local or ray, `gpus` per unit)
    and kept in `units_dir` (None: in memory), which is left holding exactly this run's units.
    Summary: metrics `fewtrans/<split>/<method>`, `summary` (mean, ci95, episodes per metric), `intervals`, the
    ensemble of each method, the centres and where they came from, the trainable backbone parameters, the settings,
    seed, class split and how many units were computed or found."""
    s = settings(cfg)
    meta, sampler, pool, base, novel, pairs = draw_episodes(Path(prepared_dir), episodes_cfg, seed)
    check_texts(s, texts_path, meta.name)
    s, sources = resolve_centres(s, heldout, model_identity(model_cfg))
    where = units.plan_device(engine, device, gpus)
    work = EpisodeWork(dict(model_cfg), str(prepared_dir), None if texts_path is None else str(texts_path), s, seed,
                       where, dict(episodes_cfg or {}), torch.get_num_threads())
    todo = [u for name in s["methods"] for u in units.make_units(
        unit_context(model_cfg, Path(prepared_dir), texts_path, s, name, seed, where, sampler, "episode"),
        [{"method": name, "episode": i} for i in range(len(pairs))])]
    todo.sort(key=lambda u: (u.identity["episode"], s["methods"].index(u.identity["method"])))
    cache = units.UnitCache(units_dir)
    results, tally = units.run_units(work, todo, cache, engine, gpus, progress)
    cache.prune(todo)
    acc: dict[tuple[str, str], list[float]] = {}
    for name in s["methods"]:  # fixed order: methods, then episodes
        for unit, result in zip(todo, results):
            if unit.identity["method"] == name:
                for split, value in result.items():
                    acc.setdefault((split, name), []).append(value)
    acc_np = {k: np.array(v) for k, v in acc.items()}
    metrics, details = episodic.summarise(acc_np)
    model = model_for_dataset(load_model(model_cfg, "cpu"), meta).model
    summary = {"metrics": metrics, "summary": details,
               "intervals": {f"fewtrans/{sp}/{m}": episodes_interval(v).to_json() for (sp, m), v in acc_np.items()},
               "ensemble": {m: [vars(x) for x in members(m, s)] for m in s["methods"]},
               "centres": {m: {k: s[m][k] for k in sorted(CENTRE_KEYS[TUNINGS[m].head])} for m in s["methods"]},
               "centres_source": sources, "trainable_parameters": trainable_parameters(model, s), "settings": s,
               "seed": seed, "base_classes": base.tolist(), "novel_classes": novel.tolist(), "episodes": len(pairs),
               "units": tally.to_json()}
    return summary, episodic.episodes_table(pairs, pool, acc_np, list(s["methods"]))


def run(job: Job) -> Outcome:
    """`finetune.method: fewtrans_episodic` in the finetune stage: `run_episodes` on the job's dataset with params'
    `finetune.fewtrans_episodic` (over DEFAULTS), `adapt.fewtrans` (the episodes adapt samples), the global seed and
    the held-out search of `finetune.heldout.dataset`; units on the job's engine, kept in its units folder.
    No single model results (each episode fine-tunes its own copy), so no weights are written; the episodes table
    joins reports/adapt/<dataset>.episodes.parquet on (episode, split)."""
    s = settings(job.settings)
    texts = job.texts / f"{s['text_set']}.parquet"
    rt = job.runtime
    summary, table = run_episodes(job.model_cfg, job.prepared, texts if texts.is_file() else None, job.settings,
                                  job.seed, rt.device, (job.params.get("adapt") or {}).get("fewtrans"),
                                  heldout=heldout_path(job.params), units_dir=rt.units_dir, engine=rt.engine,
                                  gpus=rt.gpus, progress=rt.progress)
    details = {k: v for k, v in summary.items() if k not in ("metrics", "intervals", "units")}
    return Outcome(state_dict=None, trainable=[], hyper={"settings": summary["settings"], "seed": job.seed},
                   metrics=summary["metrics"], details=details, tables={"episodes": table},
                   counts={"episodes": summary["episodes"]}, intervals=summary["intervals"],
                   run={"units": summary["units"]})
