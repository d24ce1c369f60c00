"""FewTrans episodes on cached features (Luo et al., "Benchmarking Few-shot Transferability of Pre-trained Models
with Improved Evaluation Protocols"; code: github.com/Frankluox/FewTrans).

Episodes come from Meta-Dataset's variable-way variable-shot sampler as FewTrans configures it
(`data/sampling.py`, `write_yaml_test_with_arg_visual_only.py`): per episode, a number of ways uniform on
2..min(15, classes), a balanced query set of min(10, floor(smallest class / 2)) images per class, a support-set size
drawn as Meta-Dataset does and split over the classes in proportion to their pool sizes (times exp(U(-log 2, log 2)))
with FewTrans' cap of 10 images per class (so at most 150 images), support and query drawn without replacement from
each class's whole pool. Base-to-novel: classes are split once into base and novel classes (FewTrans'
`gen_rand_split_inds`, RandomState(22)); each episode also draws novel classes with min(15, n) query images each and
no support set. Each dataset's base/novel counts come from `fewtrans_splits.json` (the paper's Appendix B.1). With
`hierarchy: {dataset: dag}` (FewTrans' USE_DAG_HIERARCHY path, its ImageNet-Sketch rule) each episode's classes are
instead those below one WordNet node drawn uniformly (`fewtrans_dag.py`), and `novel_roots` gives Meta-Dataset's
hierarchical base/novel split.

Methods, all on the cached features: `zeroshot` (the `prompts` text classifier restricted to the episode's classes),
`prototype` (cosine to the mean of the L2-normalised support features) and `linear` (a linear head on L2-normalised
features, weights initialised to ones and bias to zero as the code's `FinetuneModel` does, Adam with a per-step
cosine learning rate, full batch), with FewTrans' hyper-parameter ensemble (the paper's Appendix B.2 grid for methods
with one learning rate: 5 learning rates c/25, c/5, c, 5c, 25c x 3 epoch counts E'/3, 2E'/3, E' with E' = E* + 10),
members combined by summing their logits (the paper, Section 5.1) or by majority vote (the code).
Every head of every ensemble member of a chunk of episodes trains as one batched computation.

docs/protocols.md, "Adapt: FewTrans episodes", has every rule with its source and every difference.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from vlbench.analyses.adapt import fewtrans_dag as dag
from vlbench.analyses.adapt.protocol import AdaptError, ProtocolResult, cpu_threads, device as pick_device
from vlbench.analyses.adapt.vtab import exp_shifted, flush_denormals
from vlbench.analyses.zeroshot_classifier import l2_normalize, template_weights
from vlbench.datasets.registry import FEWTRANS_SPLITS
from vlbench.metrics import mean_confidence_interval
from vlbench.params import defaults
from vlbench.stats import episodes_interval

FEWSHOT_CLASSIFIERS = ("zeroshot", "prototype", "linear")  # adapt.fewtrans.methods: classifiers on cached features
COMBINES = ("sum", "vote")
EPOCH_MODES = ("grid", "snapshots")
CLASS_SPLIT_SEED = 22  # FewTrans' dataset_spec.SEED for its base/novel class split
LOG_WEIGHT = math.log(2.0)  # Meta-Dataset's MIN/MAX_LOG_WEIGHT = -/+ 0.69314718055994529
SPLITS_FILE = FEWTRANS_SPLITS  # per dataset: base and novel class counts, as data (the dataset registry's)
EPOCH_SEARCH = (1, 2, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90, 100)  # App. A: the search space of E*
CHUNK = 64  # episodes per batched linear-head computation (runtime only: results do not depend on it)

DEFAULTS: dict[str, Any] = defaults("adapt.fewtrans")  # conf/settings/adapt.yaml


def settings(cfg: Mapping[str, Any] | None) -> dict[str, Any]:
    """`cfg` over DEFAULTS (one level deep for `linear`); unknown keys are refused."""
    cfg = dict(cfg or {})
    unknown = sorted(set(cfg) - set(DEFAULTS))
    if unknown:
        raise AdaptError(f"params.yaml: adapt.fewtrans has unknown key(s) {unknown}; known: {sorted(DEFAULTS)}")
    out = {**DEFAULTS, **cfg, "linear": {**DEFAULTS["linear"], **(cfg.get("linear") or {})}}
    unknown = sorted(set(out["linear"]) - set(DEFAULTS["linear"]))
    if unknown:
        raise AdaptError(f"params.yaml: adapt.fewtrans.linear has unknown key(s) {unknown}")
    _check(out)
    return out


def _check(s: Mapping[str, Any]) -> None:
    bad = [m for m in s["methods"] if m not in FEWSHOT_CLASSIFIERS]
    lin = s["linear"]
    problems = {
        "methods": bad and f"unknown method(s) {bad}; known: {list(FEWSHOT_CLASSIFIERS)}",
        "min_ways": s["min_ways"] < 2 and "must be at least 2",
        "max_ways": s["max_ways"] < s["min_ways"] and "must be at least min_ways",
        "max_support": s["max_support"] < s["max_ways"] and "must allow one support image per way",
        "episodes": s["episodes"] < 2 and "needs at least 2 episodes for a confidence interval",
        "novel_fraction": s["novel_fraction"] is not None and not 0 <= s["novel_fraction"] < 1 and (
            "must be null (the counts of fewtrans_splits.json) or in [0, 1)"),
        "hierarchy": _bad_modes(s["hierarchy"]),
        "novel_roots": _bad_roots(s["novel_roots"], s["hierarchy"], s["novel_classes"]),
        "max_spanning_leaves": s["max_spanning_leaves"] < s["min_ways"] and "must be at least min_ways",
        "linear.lr_factors": (not lin["lr_factors"] or min(lin["lr_factors"]) <= 0) and "must be positive factors",
        "linear.epochs": int(lin["epochs"]) < 1 and "must be at least 1 (E*, the best single number of epochs)",
        "linear.epoch_offset": int(lin["epoch_offset"]) < 0 and "must be at least 0",
        "linear.combine": lin["combine"] not in COMBINES and f"must be one of {list(COMBINES)}",
        "linear.epoch_mode": lin["epoch_mode"] not in EPOCH_MODES and f"must be one of {list(EPOCH_MODES)}",
        "linear.batch_size": lin["batch_size"] < s["max_support"] and (
            "must be at least max_support: the head trains full-batch, one step per epoch"),
    }
    for key, problem in problems.items():
        if problem:
            raise AdaptError(f"params.yaml: adapt.fewtrans.{key} {problem}")


def _bad_modes(hierarchy: Mapping[str, Any]) -> str | None:
    bad = {d: m for d, m in hierarchy.items() if m not in dag.MODES}
    return bad and f"{bad}: the mode must be one of {list(dag.MODES)}"


def _bad_roots(roots: Mapping[str, Any], hierarchy: Mapping[str, Any], novel_classes: Mapping[str, Any]) -> str | None:
    for d, wnids in roots.items():
        if hierarchy.get(d) != "dag":
            return f"[{d!r}] needs adapt.fewtrans.hierarchy[{d!r}]: dag"
        if d in novel_classes:
            return f"[{d!r}] and novel_classes[{d!r}] both choose its novel classes; keep one"
        if not isinstance(wnids, (list, tuple)) or not wnids or not all(isinstance(w, str) for w in wnids):
            return f"[{d!r}] must be a non-empty list of wnids, got {wnids!r}"
    return None


# ----------------------------------------------------------------------------------------------------------------
# Classes and pools


def class_split(num_classes: int, num_novel: int, seed: int = CLASS_SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """(base classes in FewTrans' order, novel classes ascending): `gen_rand_split_inds` draws the base classes with
    RandomState(22).choice(num_classes, num_base, replace=False); the novel classes are the rest."""
    num_base = num_classes - num_novel
    base = np.random.RandomState(seed).choice(num_classes, num_base, replace=False)
    return base.astype(np.int64), np.setdiff1d(np.arange(num_classes), base).astype(np.int64)


def split_table() -> dict[str, dict[str, Any]]:
    """{dataset: {"base", "novel", "source"}}: the base/novel class counts of fewtrans_splits.json."""
    return json.loads(SPLITS_FILE.read_text())["splits"]


def num_novel_classes(dataset: str, num_classes: int, s: Mapping[str, Any]) -> int:
    """Novel classes for `dataset`: `novel_classes[dataset]`, else the count of fewtrans_splits.json (the paper's
    Appendix B.1), else round(novel_fraction * classes) (at least min_ways) when novel_fraction is set; the base
    classes must keep at least min_ways. A dataset with none of these is refused."""
    n, row = s["novel_classes"].get(dataset), split_table().get(dataset)
    if n is None and row is not None and row.get("novel_roots"):
        raise AdaptError(f"dataset {dataset!r}: its novel classes are those below {row['novel_roots']} "
                         f"({SPLITS_FILE.name}); set adapt.fewtrans.hierarchy[{dataset!r}]: dag and "
                         f"adapt.fewtrans.novel_roots[{dataset!r}]: {row['novel_roots']}")
    if n is None and row is not None:
        if row["base"] + row["novel"] != num_classes:
            raise AdaptError(f"dataset {dataset!r} has {num_classes} classes but {SPLITS_FILE.name} splits "
                             f"{row['base']} + {row['novel']}; set adapt.fewtrans.novel_classes[{dataset!r}]")
        n = row["novel"]
    if n is None:
        if s["novel_fraction"] is None:
            raise AdaptError(f"dataset {dataset!r} has no base/novel count in {SPLITS_FILE} (FewTrans App. B.1); set "
                             f"adapt.fewtrans.novel_classes[{dataset!r}], or novel_fraction (e.g. 0.2; 0: no novel)")
        n = round(s["novel_fraction"] * num_classes)
        n = max(n, s["min_ways"]) if s["novel_fraction"] > 0 else 0
    if n and n < s["min_ways"] or num_classes - n < s["min_ways"]:
        raise AdaptError(f"dataset {dataset!r}: {num_classes} classes cannot give {num_classes - n} base and {n} novel "
                         f"classes with min_ways={s['min_ways']} (adapt.fewtrans.novel_fraction / novel_classes)")
    return int(n)


def class_pools(labels: np.ndarray, num_classes: int) -> list[np.ndarray]:
    """Per class, the pool rows holding it, in row order (Meta-Dataset sorts each class's file paths)."""
    order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], np.arange(num_classes + 1))
    return [order[bounds[c]:bounds[c + 1]] for c in range(num_classes)]


# ----------------------------------------------------------------------------------------------------------------
# The sampler (FewTrans' data/sampling.py, numbered as its draws happen; RandomState so draws match its code)


@dataclass
class Episode:
    split: str  # "base" or "novel"
    classes: np.ndarray  # dataset class indices, in episode label order
    support: list[np.ndarray]  # per class: pool rows (empty for novel classes)
    query: list[np.ndarray]  # per class: pool rows
    node: str | None = None  # the WordNet node the classes came from (hierarchical sampling only)

    @property
    def ways(self) -> int:
        return len(self.classes)

    @property
    def shots(self) -> list[int]:
        return [len(s) for s in self.support]

    def rows(self, part: str) -> tuple[np.ndarray, np.ndarray]:
        """(pool rows, episode labels) of the support or query set."""
        sets = self.support if part == "support" else self.query
        labels = np.repeat(np.arange(self.ways), [len(x) for x in sets])
        return (np.concatenate(sets) if labels.size else np.zeros(0, np.int64)), labels


def sample_ways(rng: np.random.RandomState, num_classes: int, s: Mapping[str, Any]) -> int:
    """Uniform on min_ways..min(max_ways, num_classes) (`sample_num_ways_uniformly`)."""
    return int(rng.randint(low=s["min_ways"], high=min(s["max_ways"], num_classes) + 1))


def query_per_class(sizes: np.ndarray, max_query: int) -> int:
    """min(max_query, floor(smallest class / 2)) (`compute_num_query` without a fixed support size)."""
    if sizes.min() < 2:
        raise AdaptError(f"an episode class has {sizes.min()} image(s); the sampler needs at least 2 per class")
    return int(min(max_query, (sizes // 2).min()))


def support_set_size(rng: np.random.RandomState, remaining: np.ndarray, s: Mapping[str, Any]) -> int:
    """min(sum_c floor(beta * min(max_shots, remaining_c) + 1), max_support), beta ~ U[0, 1)."""
    beta = rng.uniform()
    contributions = np.minimum(s["max_shots"], remaining)
    return int(min(np.floor(beta * contributions + 1).sum(), s["max_support"]))


def shots_per_class(rng: np.random.RandomState, sizes: np.ndarray, remaining: np.ndarray, size: int,
                    s: Mapping[str, Any]) -> np.ndarray:
    """One support image per class plus the rest of `size` in proportion to sizes * exp(U(-log 2, log 2)),
    floored; capped at max_shots (FewTrans' addition to Meta-Dataset) and at the images left after the query."""
    weights = sizes * np.exp(rng.uniform(-LOG_WEIGHT, LOG_WEIGHT, size=sizes.shape))
    desired = np.floor(weights / weights.sum() * (size - len(sizes))).astype(np.int32) + 1
    return np.minimum(np.minimum(desired, s["max_shots"]), remaining).astype(np.int64)


def sample_classes(rng: np.random.RandomState, classes: np.ndarray, s, nodes=None) -> tuple[np.ndarray, str | None]:
    """(classes, node): ways uniformly then that many classes (`sample_class_ids_uniformly`), or with `nodes` one
    WordNet node's classes (the USE_DAG_HIERARCHY path, `fewtrans_dag.draw_classes`)."""
    if nodes is not None:
        return dag.draw_classes(rng, nodes, s["max_ways"])
    return rng.choice(classes, sample_ways(rng, len(classes), s), replace=False), None


def sample_base(rng: np.random.RandomState, base: np.ndarray, pools: list[np.ndarray], s, nodes=None) -> Episode:
    """Classes, query size, support-set size, shots, then each class's images, as `sample_single_episode`."""
    classes, node = sample_classes(rng, base, s, nodes)
    sizes = np.array([len(pools[c]) for c in classes])
    query = query_per_class(sizes, s["max_query"])
    remaining = sizes - query
    shots = shots_per_class(rng, sizes, remaining, support_set_size(rng, remaining, s), s)
    support, queries = [], []
    for c, k in zip(classes, shots):
        chosen = rng.choice(pools[c], k + query, replace=False)
        support.append(chosen[:k])
        queries.append(chosen[k:])
    return Episode("base", classes.astype(np.int64), support, queries, node)


def sample_novel(rng: np.random.RandomState, novel: np.ndarray, pools: list[np.ndarray], s, nodes=None) -> Episode:
    """Classes among the novel classes, min(novel_query, n) query images each, no support set."""
    classes, node = sample_classes(rng, novel, s, nodes)
    queries = [rng.choice(pools[c], min(s["novel_query"], len(pools[c])), replace=False) for c in classes]
    return Episode("novel", classes.astype(np.int64), [np.zeros(0, np.int64) for _ in classes], queries, node)


def split_nodes(graph: dag.DagSplits | None, eligible: np.ndarray, novel: np.ndarray, s) -> tuple[list | None, list | None]:
    """Each split's eligible WordNet nodes (None without a hierarchy): Meta-Dataset needs at least one per split."""
    if graph is None:
        return None, None
    out = []
    for split, nodes, allowed in (("base", graph.base_nodes, eligible), ("novel", graph.novel_nodes, novel)):
        kept = dag.eligible_nodes(nodes, set(allowed.tolist()), s["min_ways"], s["max_spanning_leaves"])
        if not kept and (split == "base" or len(novel)):
            raise AdaptError(f"dataset {graph.dataset!r}: no WordNet node spans {s['min_ways']}.."
                             f"{s['max_spanning_leaves']} eligible {split} classes (adapt.fewtrans.hierarchy, "
                             "min_ways, max_spanning_leaves)")
        out.append(kept)
    return out[0], out[1]


def sample_episodes(pools: list[np.ndarray], base: np.ndarray, novel: np.ndarray, s: Mapping[str, Any],
                    seed: int, graph: dag.DagSplits | None = None) -> list[tuple[Episode, Episode | None]]:
    """`episodes` (base, novel-or-None) pairs from one RandomState(seed): the dataset's own generator. Base classes
    with fewer than min_examples images are left out, as the sampler does; novel classes without images too. With
    `graph`, each episode's classes come from one WordNet node of its split."""
    eligible = base[np.array([len(pools[c]) >= s["min_examples"] for c in base], dtype=bool)]
    if len(eligible) < s["min_ways"]:
        raise AdaptError(f"only {len(eligible)} base classes have at least {s['min_examples']} images; "
                         f"episodes need min_ways={s['min_ways']}")
    novel = novel[np.array([len(pools[c]) > 0 for c in novel], dtype=bool)]  # a class without images scores nothing
    if 0 < len(novel) < s["min_ways"]:
        raise AdaptError(f"only {len(novel)} novel classes have images; episodes need min_ways={s['min_ways']}")
    base_nodes, novel_nodes = split_nodes(graph, eligible, novel, s)
    rng = np.random.RandomState(seed)
    out = []
    for _ in range(s["episodes"]):
        b = sample_base(rng, eligible, pools, s, base_nodes)
        out.append((b, sample_novel(rng, novel, pools, s, novel_nodes) if len(novel) else None))
    return out


# ----------------------------------------------------------------------------------------------------------------
# Methods on features


def episode_accuracy(scores: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy; ties go to the lower episode label (argmax)."""
    return float((scores.argmax(axis=1) == labels).mean())


def zeroshot_accuracy(ep: Episode, x: np.ndarray, weights: np.ndarray) -> float:
    """The text classifier restricted to the episode's classes: cosine to their class weights."""
    rows, labels = ep.rows("query")
    return episode_accuracy(l2_normalize(x[rows]) @ weights[ep.classes].T, labels)


def prototype_accuracy(ep: Episode, x: np.ndarray) -> float:
    """Cosine to the renormalised mean of each class's L2-normalised support features (the code's
    `prototype_scores`, whose factor 10 changes no prediction)."""
    srows, slabels = ep.rows("support")
    qrows, qlabels = ep.rows("query")
    sums = np.zeros((ep.ways, x.shape[1]))
    np.add.at(sums, slabels, l2_normalize(x[srows].astype(np.float64)))
    protos = l2_normalize(sums / np.bincount(slabels, minlength=ep.ways)[:, None])
    return episode_accuracy(l2_normalize(x[qrows].astype(np.float64)) @ protos.T, qlabels)


def epoch_axis(epochs: int, offset: int) -> list[int]:
    """The ensemble's epochs (App. B.2): E' = E* + offset and its thirds, floor(k E' / 3) for k = 1, 2, 3 (the paper's
    13, 26, 40 for E' = 40, App. A on Table 3), at least 1."""
    top = int(epochs) + int(offset)
    return sorted({max(1, top * k // 3) for k in (1, 2, 3)})


def ensemble_members(lin: Mapping[str, Any]) -> tuple[list[float], list[int]]:
    """(learning rates, epochs) of the ensemble grid: the centre lr times each factor, and `epoch_axis`."""
    return [float(lin["lr"]) * f for f in lin["lr_factors"]], epoch_axis(lin["epochs"], lin["epoch_offset"])


def snapshot_epochs(epochs: int) -> list[int]:
    """The code's `epoch_ensemble` members: after every (epochs // 3 + 1)-th epoch and after the last."""
    every = epochs // 3 + 1
    return sorted({e for e in range(1, epochs + 1) if e % every == 0} | {epochs})


def grid_plan(lrs: list[float], epochs: list[int]) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """One head per (lr, epochs), scored at its end, heads ordered by decreasing epochs."""
    pairs = [(lr, e) for e in sorted(epochs, reverse=True) for lr in lrs]
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]), [(h, p[1]) for h, p in enumerate(pairs)]


def member_plan(lin: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """(learning rate per trained head, epochs per trained head, [(head, epoch at which its scores count)]), heads
    ordered by decreasing epochs. grid: one head per (lr, epochs) of `ensemble_members`; snapshots: one head per lr
    trained for E' epochs, scored at each snapshot epoch (the code's `epoch_ensemble`)."""
    lrs, epochs = ensemble_members(lin)
    if lin["epoch_mode"] == "snapshots":
        top = max(epochs)
        return np.array(lrs), np.full(len(lrs), top), [(h, e) for h in range(len(lrs)) for e in snapshot_epochs(top)]
    return grid_plan(lrs, epochs)


def _pad(episodes: list[Episode], x: np.ndarray, part: str):
    """(features (E, S, d), labels (E, S), row mask (E, S)) of every episode's support or query set, zero-padded."""
    sets = [ep.rows(part) for ep in episodes]
    n = max(len(r) for r, _ in sets)
    feats = np.zeros((len(sets), n, x.shape[1]), np.float32)
    labels = np.zeros((len(sets), n), np.int64)
    mask = np.zeros((len(sets), n), bool)
    for i, (rows, lab) in enumerate(sets):
        feats[i, :len(rows)], labels[i, :len(rows)], mask[i, :len(rows)] = l2_normalize(x[rows]), lab, True
    return feats, labels, mask


def _adam(p, g, m, v, lr, t: int, betas=(0.9, 0.999), eps: float = 1e-8) -> None:
    """One torch.optim.Adam step in place (no weight decay, no amsgrad), a learning rate per head (lr broadcasts)."""
    m.mul_(betas[0]).add_(g, alpha=1 - betas[0])
    v.mul_(betas[1]).addcmul_(g, g, value=1 - betas[1])
    denom = (v / (1 - betas[1] ** t)).sqrt_().add_(eps)
    p.sub_(lr * m / (1 - betas[0] ** t) / denom)


class _Heads:
    """Linear heads on one chunk of episodes, heads first: weight (H, E, K, d), bias (H, E, K), Adam state."""

    def __init__(self, torch, heads: int, episodes: int, ways: int, dim: int, dev):
        self.w = torch.ones(heads, episodes, ways, dim, device=dev)  # Linear_head.weight.data.fill_(1)
        self.b = torch.zeros(heads, episodes, ways, device=dev)  # Linear_head.bias.data.fill_(0)
        self.state = [torch.zeros_like(self.w), torch.zeros_like(self.w), torch.zeros_like(self.b),
                      torch.zeros_like(self.b)]

    def logits(self, x, n: int):
        """(n, E, rows, K) logits of the first n heads on x (E, rows, d)."""
        import torch

        return torch.einsum("esd,hekd->hesk", x, self.w[:n]) + self.b[:n, :, None, :]

    def head_logits(self, x, h: int):
        """(E, rows, K) logits of head h on x (E, rows, d)."""
        import torch

        return torch.einsum("esd,ekd->esk", x, self.w[h]) + self.b[h, :, None, :]

    def step(self, grad, x, lr, t: int, n: int) -> None:
        """Adam on the first n heads with the loss gradient wrt their logits, grad (n, E, S, K)."""
        import torch

        m_w, v_w, m_b, v_b = (s[:n] for s in self.state)
        _adam(self.w[:n], torch.einsum("hesk,esd->hekd", grad, x), m_w, v_w, lr[:, None, None, None], t)
        _adam(self.b[:n], grad.sum(2), m_b, v_b, lr[:, None, None], t)


def train_linear_heads(episodes: list[Episode], x: np.ndarray, lin: Mapping[str, Any], device: str | None = None,
                       plan=None):
    """Query logits (E, members, Q, K) of every ensemble member on a chunk of episodes (padded classes -inf).

    Cross-entropy on L2-normalised support features, full batch (one step per epoch), Adam with the learning rate
    0.5 * lr * (1 + cos(pi * step / steps)) set before each step, as the code's `Finetuner.forward`. All heads train
    together; a head whose epochs are done stops (the heads are ordered by decreasing epochs). `plan`: a
    `member_plan`-shaped plan to train instead of the ensemble's (e.g. `centre_grid`'s single heads)."""
    import torch

    dev = pick_device(device)
    lrs, steps, scored = plan if plan is not None else member_plan(lin)
    xs, ys, sm = (torch.as_tensor(a, device=dev) for a in _pad(episodes, x, "support"))
    xq = torch.as_tensor(_pad(episodes, x, "query")[0], device=dev)
    ways = torch.as_tensor([ep.ways for ep in episodes], device=dev)
    valid = torch.arange(int(ways.max()), device=dev)[None, :] < ways[:, None]  # (E, K)
    mask = valid[None, :, None, :].float()
    heads = _Heads(torch, len(lrs), xs.shape[0], valid.shape[1], xs.shape[2], dev)
    target = torch.nn.functional.one_hot(ys, valid.shape[1]).float() * sm[..., None]  # (E, S, K)
    weight = (sm / sm.sum(1, keepdim=True).clamp(min=1)).float()[None, :, :, None]  # mean over the support set
    lr0, total = torch.as_tensor(lrs, dtype=torch.float32, device=dev), torch.as_tensor(steps, device=dev)
    kept = {}
    with cpu_threads(dev, xs.numel() * valid.shape[1] * len(lrs)), flush_denormals():
        for t in range(int(steps.max())):
            n = int((total > t).sum())
            e = exp_shifted(heads.logits(xs, n).masked_fill_(~valid[None, :, None, :], float("-inf"))) * mask
            prob = e / e.sum(dim=-1, keepdim=True)
            lr = 0.5 * lr0[:n] * (1 + torch.cos(math.pi * t / total[:n]))
            heads.step((prob - target[None]) * weight, xs, lr, t + 1, n)
            for head, epoch in scored:
                if epoch == t + 1 and (head, epoch) not in kept:
                    kept[head, epoch] = heads.head_logits(xq, head)
    out = torch.stack([kept[hk] for hk in scored], dim=1)
    return out.masked_fill(~valid[:, None, None, :], float("-inf")).cpu().numpy()


def combine(logits: np.ndarray, how: str) -> np.ndarray:
    """(E, Q) predictions from (E, members, Q, K) member logits: `sum` adds the logits (the paper); `vote` takes
    each member's arg-max and the most frequent class (the code's torch.mode), ties to the lower class."""
    if how == "sum":
        return logits.sum(axis=1).argmax(axis=-1)
    votes = logits.argmax(axis=-1)  # (E, M, Q)
    counts = (votes[..., None] == np.arange(logits.shape[-1])).sum(axis=1)  # (E, Q, K)
    return counts.argmax(axis=-1)


def _chunks(episodes: list[Episode]):
    """Index arrays of chunks of at most CHUNK episodes of similar support size (less padding)."""
    order = np.argsort([sum(ep.shots) for ep in episodes], kind="stable")
    return [order[i:i + CHUNK] for i in range(0, len(order), CHUNK)]


def linear_accuracies(episodes: list[Episode], x: np.ndarray, lin: Mapping[str, Any],
                      device: str | None = None, members: bool = False, plan=None) -> np.ndarray:
    """Per episode, the ensemble's query accuracy (E,), or with members=True each member's (E, members)."""
    out = None
    for idx in _chunks(episodes):
        chunk = [episodes[i] for i in idx]
        logits = train_linear_heads(chunk, x, lin, device, plan)  # (E, M, Q, K)
        preds = logits.argmax(axis=-1) if members else combine(logits, lin["combine"])[:, None, :]
        if out is None:
            out = np.zeros((len(episodes), preds.shape[1]))
        for row, (i, ep) in enumerate(zip(idx, chunk)):
            labels = ep.rows("query")[1]
            out[i] = (preds[row, :, :len(labels)] == labels[None, :]).mean(axis=1)
    return out if members else out[:, 0]


def lr_search_space(low: float, high: float) -> list[float]:
    """App. A's learning rates between low and high: 1, 2 and 5 times each power of 10 (the paper's lower limit is
    1e-8 and it has no upper one)."""
    powers = range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
    values = sorted({float(f"{m}e{p}") for p in powers for m in (1, 2, 5)})
    return [v for v in values if low * (1 - 1e-9) <= v <= high * (1 + 1e-9)]


def centre_grid(inputs, cfg: Mapping[str, Any], seed: int, lrs: list[float], epochs: list[int],
                device: str | None = None) -> dict[str, float]:
    """Mean base-episode accuracy of single heads (no ensemble) for each (learning rate, epochs): how the
    ensemble's centre (lr*, E*) is found on a held-out dataset (App. A and B.2: the best average single setting over
    epochs `EPOCH_SEARCH` and learning rates `lr_search_space`). Keys "lr=<lr>,epochs=<n>"."""
    s = settings(cfg)
    pool = load_pool(inputs, list(s["splits"]))
    c = len(inputs.meta.classes)
    base, novel, graph = episode_classes(inputs.meta, s)
    episodes = [b for b, _ in sample_episodes(class_pools(pool.labels, c), base, novel, s, seed, graph)]
    plan = grid_plan([float(v) for v in lrs], [int(e) for e in epochs])
    acc = linear_accuracies(episodes, pool.x, s["linear"], device, members=True, plan=plan).mean(axis=0)
    return {f"lr={lr:g},epochs={int(n)}": float(a) for lr, n, a in zip(plan[0], plan[1], acc)}


# ----------------------------------------------------------------------------------------------------------------
# The protocol


@dataclass
class Pool:
    x: np.ndarray  # (n, d) image features of every pool split, concatenated
    labels: np.ndarray
    sample_ids: np.ndarray


def episode_classes(meta, s: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, dag.DagSplits | None]:
    """(base, novel, WordNet graphs or None): FewTrans' random class split, or with `novel_roots` the classes below
    those nodes as novel (Meta-Dataset's ImageNet split); with `hierarchy: dag` each split's sampling graph."""
    num_classes = len(meta.classes)
    if s["hierarchy"].get(meta.name) != "dag":
        return (*class_split(num_classes, num_novel_classes(meta.name, num_classes, s)), None)
    wnids = dag.class_wnids(meta)
    parents = dag.wordnet_parents(wnids, meta.name)
    roots = s["novel_roots"].get(meta.name)
    if roots:
        by_root = dag.root_split(parents, wnids, roots, meta.name)
        novel = np.sort(np.concatenate(by_root))
        check_root_count(meta.name, len(novel), num_classes)
        base = np.setdiff1d(np.arange(num_classes), novel)
    else:
        base, novel = class_split(num_classes, num_novel_classes(meta.name, num_classes, s))
        by_root = None
    return base, novel, dag.build(parents, wnids, base, novel, roots, by_root, meta.name)


def check_root_count(dataset: str, num_novel: int, num_classes: int) -> None:
    """A dataset whose counts fewtrans_splits.json gives (ImageNet-Sketch: 712/288) must get them from its roots."""
    row = split_table().get(dataset)
    if row is not None and (num_classes - num_novel, num_novel) != (row["base"], row["novel"]):
        raise AdaptError(f"dataset {dataset!r}: adapt.fewtrans.novel_roots give {num_classes - num_novel} base and "
                         f"{num_novel} novel classes, {SPLITS_FILE.name} (the paper) {row['base']} and {row['novel']}")


def load_pool(inputs, splits: list[str]) -> Pool:
    if inputs.meta.multi_label:
        raise AdaptError(f"dataset {inputs.meta.name!r}: FewTrans episodes need single-label data")
    parts = []
    for split in splits:
        if not inputs.has_split(split):
            raise AdaptError(f"dataset {inputs.meta.name!r} has no split {split!r} (adapt.fewtrans.splits); "
                             f"it has {sorted(inputs.meta.splits)}")
        f = inputs.images(split)
        parts.append((f.embeddings, f.table.column("label").to_numpy(), f.table.column("sample_id").to_numpy(zero_copy_only=False)))
    return Pool(*(np.concatenate([p[i] for p in parts]) for i in range(3)))


def text_weights(inputs, text_set: str) -> np.ndarray:
    """(C, d) class weights from the text set's template rows, as the zeroshot analysis builds them."""
    texts = inputs.texts(text_set)
    try:
        return template_weights(texts.table, texts.embeddings, len(inputs.meta.classes)).astype(np.float64)
    except ValueError as err:
        raise AdaptError(f"dataset {inputs.meta.name!r}, text set {text_set!r}: {err}") from None


def score_episodes(pairs, pool: Pool, weights: np.ndarray | None, s, device: str | None = None) -> dict:
    """{(split, method): per-episode accuracies}; novel episodes only for methods that need no support set."""
    methods, base = s["methods"], [p[0] for p in pairs]
    novel = [p[1] for p in pairs if p[1] is not None]
    acc = {}
    for split, eps in (("base", base), ("novel", novel)):
        if not eps:
            continue
        if "zeroshot" in methods:
            acc[split, "zeroshot"] = np.array([zeroshot_accuracy(ep, pool.x, weights) for ep in eps])
        if split == "base" and "prototype" in methods:
            acc[split, "prototype"] = np.array([prototype_accuracy(ep, pool.x) for ep in eps])
        if split == "base" and "linear" in methods:
            acc[split, "linear"] = linear_accuracies(eps, pool.x, s["linear"], device)
    return acc


def episodes_table(pairs, pool: Pool, acc: Mapping, methods: list[str]):
    """One row per episode and split: episode, split, ways, shots, query, classes, node (the WordNet node of a
    hierarchical episode, else null), support/query sample ids and each method's accuracy (null where a method
    does not apply)."""
    import pyarrow as pa

    rows = [(i, ep) for i, pair in enumerate(pairs) for ep in pair if ep is not None]
    position = {"base": 0, "novel": 0}
    cols: dict[str, list] = {"episode": [], "split": [], "ways": [], "shots": [], "query": [], "classes": [],
                             "node": [], "support_ids": [], "query_ids": [], **{m: [] for m in methods}}
    for i, ep in rows:
        cols["episode"].append(i)
        cols["split"].append(ep.split)
        cols["ways"].append(ep.ways)
        cols["shots"].append(ep.shots)
        cols["query"].append([len(q) for q in ep.query])
        cols["classes"].append(ep.classes.tolist())
        cols["node"].append(ep.node)
        cols["support_ids"].append(pool.sample_ids[ep.rows("support")[0]].tolist())
        cols["query_ids"].append(pool.sample_ids[ep.rows("query")[0]].tolist())
        for m in methods:
            values = acc.get((ep.split, m))
            cols[m].append(None if values is None else float(values[position[ep.split]]))
        position[ep.split] += 1
    types = {"episode": pa.int64(), "split": pa.string(), "ways": pa.int64(), "shots": pa.list_(pa.int64()),
             "query": pa.list_(pa.int64()), "classes": pa.list_(pa.int64()), "node": pa.string(),
             "support_ids": pa.list_(pa.string()),
             "query_ids": pa.list_(pa.string()), **{m: pa.float64() for m in methods}}
    return pa.table({k: pa.array(v, types[k]) for k, v in cols.items()})


def summarise(acc: Mapping) -> tuple[dict[str, float], dict[str, Any]]:
    """Metrics `fewtrans/<split>/<method>` (mean accuracy) and details with the 95% interval
    (1.96 * std / sqrt(episodes), std with ddof=1)."""
    metrics, details = {}, {}
    for (split, method), values in acc.items():
        mean, half = mean_confidence_interval(values, 0.95, ddof=1)
        metrics[f"fewtrans/{split}/{method}"] = float(mean)
        details[f"{split}/{method}"] = {"mean": float(mean), "ci95": float(half), "episodes": len(values)}
    return metrics, details


def evaluate(inputs, cfg: Mapping[str, Any], seed: int, device: str | None = None) -> ProtocolResult:
    """The FewTrans protocol on one dataset: sample the episodes, score every method, summarise."""
    s = settings(cfg)
    meta = inputs.meta
    pool = load_pool(inputs, list(s["splits"]))
    num_classes = len(meta.classes)
    base, novel, graph = episode_classes(meta, s)
    pairs = sample_episodes(class_pools(pool.labels, num_classes), base, novel, s, seed, graph)
    weights = text_weights(inputs, s["text_set"]) if "zeroshot" in s["methods"] else None
    acc = score_episodes(pairs, pool, weights, s, device)
    metrics, summary = summarise(acc)
    lrs, _, scored = member_plan(s["linear"])
    details = {"summary": summary, "seed": seed, "settings": s, "base_classes": base.tolist(),
               "novel_classes": novel.tolist(), "ensemble": {"members": len(scored), "learning_rates": lrs.tolist(),
                                                             "epochs": [int(e) for _, e in scored]}}
    if graph is not None:
        details["hierarchy"] = hierarchy_details(pairs, graph, s, meta.name)
    intervals = {f"fewtrans/{split}/{method}": episodes_interval(values).to_json() for (split, method), values in acc.items()}
    return ProtocolResult(metrics, details, {"episodes": episodes_table(pairs, pool, acc, s["methods"])},
                          {"episodes": len(pairs), "pool_images": len(pool.labels)}, intervals=intervals)


def hierarchy_details(pairs, graph: dag.DagSplits, s: Mapping[str, Any], dataset: str) -> dict[str, Any]:
    """What the hierarchical sampler used: mode, novel roots, internal nodes per split, nodes drawn."""
    drawn = {"base": set(), "novel": set()}
    for pair in pairs:
        for ep in pair:
            if ep is not None:
                drawn[ep.split].add(ep.node)
    return {"mode": "dag", "novel_roots": s["novel_roots"].get(dataset, []),
            "internal_nodes": {"base": len(graph.base_nodes), "novel": len(graph.novel_nodes)},
            "nodes_drawn": {k: sorted(v) for k, v in drawn.items()}}


def aggregate(per_dataset: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The average over datasets of each `fewtrans/<split>/<method>` metric (datasets lacking one are left out of
    its mean): `fewtrans/average/<split>/<method>`."""
    keys = sorted({k for m in per_dataset.values() for k in m if k.startswith("fewtrans/")})
    return {f"fewtrans/average/{k.removeprefix('fewtrans/')}":
            float(np.mean([m[k] for m in per_dataset.values() if k in m])) for k in keys}
