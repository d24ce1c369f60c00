"""The extensibility analysis on cached features (Ren et al., "Delving into the Openness of CLIP"; issue 12):
the metrics of `vlbench.analyses.expansion` per prompt variant, with per-step curves, per-group drops, margins,
cosine statistics, alignment and uniformity, and the adversarial vocabulary scan. docs/protocols.md,
"Extensibility", states every choice.

- One dataset (`run_dataset`, stage extensibility@<dataset>): the groups are its classes' `group` field (CIFAR-100
  superclasses, BREEDS superclasses, the demo's shapes over colour-shape pairs), or one group per class.
- Several datasets (`run_union`, stage extensibility_sets@<name>): each member dataset is one group, over the union
  of their classes. A class name that an earlier member already has is removed from the later member's vocabulary
  and its images keep it as their label (`duplicates: first`, the paper's App. A.3: "Classes in the new vocabulary
  will be removed if they already exist in the previous vocabularies"); such a class is in the vocabulary once any
  member that lists it is, its images enter with their own dataset. `remove`: the name is dropped from every member
  with its images; `merge`: one class, the last member's text, its images tested once any member listing it entered
  (the authors' code).

Variants: `<v>` scores the images against the class weights of text set `prompts_<v>` (texts.prompt_sets of the
dataset entry: "a photo of a {c}.", CLIP's 7 ImageNet templates, CIFAR's 18, ...); `repe` reads the repe
stage's REPE class weights (features/<model>/<dataset>/retrieval/class_weights.parquet). `repe` is a default variant:
it runs where that file exists (the datasets of suite.repe; for a dataset-level vocabulary, every member's) and is
otherwise skipped, with the reason and the param to change in the result's `details.skipped_variants`; where it ran,
`details.repe` names per dataset the corpus its captions came from and the model that searched it (the paper's is
CC12M, App. A.5). A prompt variant without its text set is an error. Class weights are the renormalised mean of the normalised prompt
embeddings, scores the cosine similarities (the scale changes no argmax).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vlbench.analyses import expansion as ex
from vlbench.analyses.zeroshot_classifier import class_weights, similarities
from vlbench.dataset_entries import check_suite_dataset
from vlbench.analyses.expansion import ExtensibilityError
from vlbench.knowledge.repe import DEFAULT_PROMPTS, read_repe_class_weights, weights_path
from vlbench.knowledge.vocabulary import PROMPT_SET_PREFIX, VOCABULARY_SET, related_words
from vlbench.params import check_name, defaults, get
from vlbench.results import Result
from vlbench.texts import text_set_names

PROTOCOLS = ("paper", "authors")
DUPLICATES = ("first", "remove", "merge")
GROUPINGS = ("auto", "group", "class")
REPE = "repe"
DEFAULTS: dict[str, Any] = defaults("extensibility")  # conf/config.yaml and conf/settings/extensibility.yaml
UNIFORMITY_T = 2.0  # Wang & Isola's t
_CHUNK = 1 << 22  # elements per chunk of an (images x texts) product


@dataclass(frozen=True)
class Settings:
    split: str
    protocol: str
    orders: int
    trials: int
    average_e: str
    average_s: str
    variants: tuple[str, ...]
    grouping: str
    duplicates: str
    max_images: int
    adversarial_variant: str
    top: int
    exclude_related: bool

    def params(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("split", "protocol", "grouping", "duplicates")}
        out["variants"] = list(self.variants)
        if self.protocol == "paper":
            out.update(orders=self.orders, average_e=self.average_e, average_s=self.average_s)
        else:  # the authors' orders come from numpy's global generator seeded with 42, whatever the params' seed
            out.update(trials=self.trials, authors_seed=ex.AUTHORS_SEED, average_e="images", average_s="classes")
        out["geometry"] = {"max_images": self.max_images}
        out["adversarial"] = {"variant": self.adversarial_variant, "top": self.top,
                              "exclude_related": self.exclude_related}
        return out


def _choice(key: str, value: Any, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ExtensibilityError(f"params.yaml: extensibility.{key} must be one of {list(allowed)}, got {value!r}")
    return value


def _positive(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ExtensibilityError(f"params.yaml: extensibility.{key} must be a positive integer, got {value!r}")
    return value


def parse_settings(cfg: Mapping[str, Any]) -> Settings:
    """The `extensibility` params, each checked, defaults filled in (DEFAULTS)."""
    known = set(DEFAULTS)
    unknown = sorted(set(cfg) - known)
    if unknown:
        raise ExtensibilityError(f"params.yaml: unknown extensibility key(s) {unknown}; known: {sorted(known)}")
    c = {**DEFAULTS, **cfg}
    geo = {**DEFAULTS["geometry"], **(c["geometry"] or {})}
    adv = {**DEFAULTS["adversarial"], **(c["adversarial"] or {})}
    variants = c["variants"]
    if not isinstance(variants, list) or not variants or len(set(variants)) != len(variants) \
            or not all(isinstance(v, str) and v for v in variants):
        raise ExtensibilityError(f"params.yaml: extensibility.variants must be a list of distinct names, got {variants!r}")
    return Settings(
        split=str(c["split"]), protocol=_choice("protocol", c["protocol"], PROTOCOLS),
        orders=_positive("orders", c["orders"]), trials=_positive("trials", c["trials"]),
        average_e=_choice("average_e", c["average_e"], ex.AVERAGES_E),
        average_s=_choice("average_s", c["average_s"], ex.AVERAGES_S),
        variants=tuple(variants), grouping=_choice("grouping", c["grouping"], GROUPINGS),
        duplicates=_choice("duplicates", c["duplicates"], DUPLICATES),
        max_images=_positive("geometry.max_images", geo["max_images"]),
        adversarial_variant=str(adv["variant"]), top=_positive("adversarial.top", adv["top"]),
        exclude_related=bool(adv["exclude_related"]))


# --------------------------------------------------------------------------------------------------
# what the metrics see: normalised images, labels, groups and class weights per variant


@dataclass
class Vocabulary:
    names: list[str]  # class names
    group_names: list[str]
    groups: list[list[int]]  # class indices per group
    overlap: bool  # a class may be in several groups (merged duplicates)
    images: np.ndarray  # (n, d) L2-normalised
    labels: np.ndarray  # (n,)
    weights: dict[str, np.ndarray]  # variant -> (C, d) L2-normalised class weights
    prompt_pairs: dict[str, tuple[np.ndarray, np.ndarray] | None] = field(default_factory=dict)  # same_class_sums
    counts: dict[str, int] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # variant -> why it was not run (no REPE class weights)
    image_groups: np.ndarray | None = None  # (n,) the group each image enters with, where not every group listing its class
    repe: dict[str, Any] | None = None  # where the REPE class weights came from (corpus, retrieval model), if repe ran


def l2_normalize(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def dataset_groups(meta, grouping: str) -> tuple[list[str], list[list[int]], str]:
    """(group names, class indices per group, the grouping used): the classes' `group` field, in order of first
    appearance, or one group per class (`class`; `auto` when some class has no group)."""
    has = [c.group is not None for c in meta.classes]
    if grouping == "group" and not all(has):
        missing = next(c for c in meta.classes if c.group is None)
        raise ExtensibilityError(f"dataset {meta.name!r}: extensibility.grouping 'group' needs a `group` for every "
                                 f"class in classes.json; class {missing.index} ({missing.name!r}) has none")
    if grouping == "class" or not all(has):
        return [c.name for c in meta.classes], [[c.index] for c in meta.classes], "class"
    names = list(dict.fromkeys(c.group for c in meta.classes))
    return names, [[c.index for c in meta.classes if c.group == g] for g in names], "group"


def prompt_weights(features, n_classes: int, where: str) -> np.ndarray:
    index = features.table.column("class_index").to_numpy()
    missing = sorted(set(range(n_classes)) - set(index.tolist()))
    if missing:
        raise ExtensibilityError(f"{where}: no prompt for class indices {missing[:10]}")
    return class_weights(features.embeddings, index, n_classes)


def same_class_sums(x: np.ndarray, labels: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Per class c, over the distinct pairs i < j of its L2-normalised rows: (sum of x_i . x_j, number of pairs);
    sum_{i<j} x_i . x_j = (||sum_i x_i||^2 - n_c) / 2 for unit vectors. Float64."""
    sums = np.zeros((n_classes, x.shape[1]))
    np.add.at(sums, labels, x.astype(np.float64))
    counts = np.bincount(labels, minlength=n_classes)
    return ((sums ** 2).sum(axis=1) - counts) / 2.0, counts * (counts - 1) // 2


def _variant(inputs, variant: str) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """(class weights, same_class_sums of the normalised prompts or None for REPE) of one variant."""
    if variant == REPE:
        return variant_weights(inputs, variant), None
    features = inputs.texts(_prompt_set(inputs, variant))
    n_classes = len(inputs.meta.classes)
    index = features.table.column("class_index").to_numpy()
    weights = prompt_weights(features, n_classes, f"dataset {inputs.meta.name!r}, variant {variant!r}")
    return weights, same_class_sums(l2_normalize(features.embeddings), index, n_classes)


def _prompt_set(inputs, variant: str) -> str:
    name = f"{PROMPT_SET_PREFIX}{variant}"
    if name not in text_set_names(inputs.texts_dir):
        raise ExtensibilityError(
            f"dataset {inputs.meta.name!r}: extensibility variant {variant!r} needs text set {name!r}: add "
            f"`prompt_sets: {{{variant}: [...]}}` under the dataset entry's `texts` (or drop the variant)")
    return name


def variant_weights(inputs, variant: str) -> np.ndarray:
    """(C, d) normalised class weights of one variant for one dataset's `Inputs`."""
    meta = inputs.meta
    if variant == REPE:
        found = read_repe_class_weights(inputs.features_dir, inputs.identity, meta.name)
        if found.embeddings.shape[0] != len(meta.classes):
            raise ExtensibilityError(f"dataset {meta.name!r}: REPE class weights have {found.embeddings.shape[0]} rows "
                                     f"for {len(meta.classes)} classes; re-run repe@{meta.name}")
        return l2_normalize(found.embeddings)
    name = _prompt_set(inputs, variant)
    return prompt_weights(inputs.texts(name), len(meta.classes), f"dataset {meta.name!r}, text set {name!r}")


PAPER_REPE_CORPUS = "cc12m"  # the paper's App. A.5: "We retrieve the images and captions from CC12M"


def repe_source(inputs) -> dict[str, Any]:
    """Where one dataset's REPE class weights came from, read from their file's fingerprint: the corpus (dataset, split,
    caption set, versions), the retrieval settings, the prompts mixed, the model that embedded query and corpus (the
    model under test: vlbench has no second retrieval model) and how many classes fell back to their query; `paper_corpus`
    says whether the corpus is the paper's CC12M (App. A.5)."""
    found = read_repe_class_weights(inputs.features_dir, inputs.identity, inputs.meta.name)
    fp = found.fingerprint
    corpus = fp.get("corpus")
    return {"corpus": corpus, "corpus_split": fp.get("corpus_split"), "corpus_captions": fp.get("corpus_captions"),
            "corpus_dataset_version": fp.get("corpus_dataset_version"),
            "corpus_text_version": fp.get("corpus_text_version"),
            "paper_corpus": str(corpus).casefold() == PAPER_REPE_CORPUS,
            "retrieval_model": {k: fp.get(k) for k in ("model", "arch", "pretrained")}, "prompts": fp.get("prompts_set", DEFAULT_PROMPTS),
            "retrieval": fp.get("retrieval"),
            "fallback_classes": int(sum(found.table.column("fallback").to_pylist()))}


def repe_details(members: Sequence[tuple[str, Any]], variants: Sequence[str]) -> dict[str, Any] | None:
    """{dataset: repe_source} for the datasets whose REPE weights a result used, or None when repe did not run."""
    return {name: repe_source(inp) for name, inp in members} if REPE in variants else None


def repe_missing(inputs) -> str | None:
    """None where the dataset has REPE class weights (the repe stage's file), else why `repe` cannot run there."""
    path = weights_path(inputs.features_dir)
    return None if path.is_file() else f"dataset {inputs.meta.name!r} has no REPE class weights ({path})"


REPE_HINT = ("the repe stage writes REPE class weights for the datasets of suite.repe: add the dataset(s) to "
             "suite.repe to report repe, or drop 'repe' from extensibility.variants")


def runnable_variants(s: Settings, members: Sequence[Any], where: str) -> tuple[list[str], dict[str, str]]:
    """(the variants to run, {variant: why not}): `repe` is skipped unless every member has REPE class weights;
    an error when nothing is left to run."""
    skipped = {}
    if REPE in s.variants:
        missing = [why for why in (repe_missing(inp) for inp in members) if why]
        if missing:
            skipped[REPE] = "not run: " + "; ".join(missing) + "; " + REPE_HINT
    variants = [v for v in s.variants if v not in skipped]
    if not variants:
        raise ExtensibilityError(f"{where}: no extensibility variant can run ({skipped[REPE]})")
    return variants, skipped


def image_labels(inputs, split: str) -> tuple[np.ndarray, np.ndarray]:
    meta = inputs.meta
    if meta.multi_label:
        raise ExtensibilityError(f"dataset {meta.name!r} is multi-label: extensibility needs one label per image")
    if not inputs.has_split(split):
        raise ExtensibilityError(f"dataset {meta.name!r} has no split {split!r} (extensibility.split); "
                                 f"it has {sorted(meta.splits)}")
    images = inputs.images(split)
    return l2_normalize(images.embeddings), images.table.column(meta.label_column).to_numpy().astype(np.int64)


def dataset_vocabulary(inputs, s: Settings) -> Vocabulary:
    group_names, groups, used = dataset_groups(inputs.meta, s.grouping)
    images, labels = image_labels(inputs, s.split)
    variants, skipped = runnable_variants(s, [inputs], f"dataset {inputs.meta.name!r}")
    found = {v: _variant(inputs, v) for v in variants}
    return Vocabulary(names=inputs.meta.class_names, group_names=group_names, groups=groups, overlap=False,
                      images=images, labels=labels, weights={v: w for v, (w, _) in found.items()},
                      prompt_pairs={v: p for v, (_, p) in found.items()}, notes={"grouping": used}, skipped=skipped,
                      repe=repe_details([(inputs.meta.name, inputs)], variants))


# --------------------------------------------------------------------------------------------------
# several datasets as groups


def name_key(name: str) -> str:
    """Class names compared across datasets: case-folded, '_' as ' ', runs of white space as one."""
    return " ".join(str(name).replace("_", " ").split()).casefold()


@dataclass(frozen=True)
class Union:
    """The classes of several datasets: ``classes[j] = (member, class index)`` of union class j (its text weight);
    ``groups[m]`` the union classes of member m; ``label_map[m][c]`` the union class of member m's class c, or -1
    where that class was removed; ``shared`` the normalised names found in more than one member."""

    names: list[str]
    classes: list[tuple[int, int]]
    groups: list[list[int]]
    label_map: list[np.ndarray]
    shared: list[str]


def union_classes(class_names: Sequence[Sequence[str]], duplicates: str) -> Union:
    """Union of the members' class lists (in member order). A name in several members is one class:
    `first` (the paper) takes its text weight from the first member that lists it and keeps it in the group of every
    member that lists it (it is in the vocabulary as soon as one of them is; the images stay with their own member,
    `union_vocabulary`); `merge` the same, with the last member's text weight (the authors' `class2superclass` dict
    keeps the last dataset that lists it); `remove` drops the name from every member (label_map -1)."""
    owners: dict[str, list[int]] = {}
    for m, names in enumerate(class_names):
        for name in dict.fromkeys(name_key(n) for n in names):
            owners.setdefault(name, []).append(m)
    shared = sorted(k for k, ms in owners.items() if len(ms) > 1)
    index: dict[str, int] = {}
    names_out, classes, groups = [], [], [[] for _ in class_names]
    label_map = [np.full(len(n), -1, dtype=np.int64) for n in class_names]
    for m, names in enumerate(class_names):
        for c, name in enumerate(names):
            key = name_key(name)
            if len(owners[key]) > 1 and duplicates == "remove":
                continue
            if key not in index:
                index[key] = len(classes)
                names_out.append(name)
                classes.append((m, c) if duplicates == "first" else (owners[key][-1], -1))
            j = index[key]
            if duplicates == "merge" and owners[key][-1] == m and classes[j][1] == -1:
                classes[j] = (m, c)
            label_map[m][c] = j
            if j not in groups[m]:
                groups[m].append(j)
    return Union(names=names_out, classes=classes, groups=groups, label_map=label_map, shared=shared)


def union_vocabulary(members: Sequence[tuple[str, Any]], s: Settings) -> Vocabulary:
    """`members`: (dataset name, `Inputs`) pairs, each dataset one group."""
    if len(members) < 2:
        raise ExtensibilityError(f"a dataset-level vocabulary needs at least two datasets, got {[m for m, _ in members]}")
    metas = [inp.meta for _, inp in members]
    u = union_classes([m.class_names for m in metas], s.duplicates)
    empty = [members[m][0] for m, g in enumerate(u.groups) if not g]
    if empty:
        raise ExtensibilityError(f"dataset-level vocabulary: {empty} keep no class once the names they share are "
                                 f"removed (extensibility.duplicates: remove)")
    imgs, labels = [], []
    for m, (_, inp) in enumerate(members):
        x, y = image_labels(inp, s.split)
        keep = u.label_map[m][y] >= 0
        imgs.append(x[keep])
        labels.append(u.label_map[m][y[keep]])
    variants, skipped = runnable_variants(s, [inp for _, inp in members],
                                          f"dataset-level vocabulary {[m for m, _ in members]}")
    weights, pairs = {}, {}
    for v in variants:
        per_member = [_variant(inp, v) for _, inp in members]
        weights[v] = np.stack([per_member[m][0][c] for m, c in u.classes])
        pairs[v] = None if per_member[0][1] is None else tuple(
            np.array([per_member[m][1][k][c] for m, c in u.classes]) for k in (0, 1))
    removed = {"remove": sum(int((lm < 0).sum()) for lm in u.label_map),
               "first": sum(len(lm) for lm in u.label_map) - len(u.names), "merge": 0}[s.duplicates]
    image_groups = np.concatenate([np.full(len(y), m, dtype=np.int64) for m, y in enumerate(labels)])
    return Vocabulary(names=u.names, group_names=[m for m, _ in members], groups=u.groups,
                      overlap=s.duplicates != "remove" and bool(u.shared), images=np.concatenate(imgs),
                      labels=np.concatenate(labels), weights=weights, prompt_pairs=pairs,
                      counts={"shared_names": len(u.shared), "removed_classes": removed},
                      notes={"grouping": "dataset", "shared_names": u.shared[:50]}, skipped=skipped,
                      image_groups=image_groups if s.duplicates == "first" else None,
                      repe=repe_details(members, variants))


# --------------------------------------------------------------------------------------------------
# the metrics of one variant


def _f(x) -> float | None:
    return None if x is None else float(x)


def _floats(xs) -> list[float | None]:
    return [None if x is None or not math.isfinite(float(x)) else float(x) for x in xs]


def paper_metrics(scores: np.ndarray, vocab: Vocabulary, s: Settings, seed: int) -> dict[str, Any]:
    """Acc-C/E/S over the paper's orders (`orders` per target, seeded, all of them when fewer), with the exact
    expectations, the per-step curves and the per-group values."""
    G = len(vocab.groups)
    orders = ex.paper_orders(G, s.orders, seed)
    r = ex.expansion(scores, vocab.labels, vocab.groups, orders, s.average_e, s.average_s, vocab.overlap,
                     vocab.image_groups)
    targets = r.acc_s.targets
    per_group = [{"acc_c": float(r.acc_c.per_group[g]), "acc_s": float(t.mean), "acc_s_expected": float(t.expected_mean),
                  "acc_full": float(t.per_order[0, -1])} for g, t in enumerate(targets)]
    return {
        "acc_c": r.acc_c.mean, "acc_e": r.acc_e.mean, "acc_e_expected": _f(r.acc_e.expected_mean),
        "acc_s": r.acc_s.mean, "acc_s_expected": r.acc_s.expected_mean,
        "orders": int(orders.shape[0]), "orders_per_target": int(orders.shape[0] // G),
        "steps": {"acc_e": _floats(r.acc_e.steps),
                  "acc_e_expected": None if r.acc_e.expected_steps is None else _floats(r.acc_e.expected_steps),
                  "acc_s": _floats(np.mean([t.steps for t in targets], axis=0)),
                  "acc_s_expected": _floats(np.mean([t.expected_steps for t in targets], axis=0))},
        "per_group": per_group, "group_sizes": r.group_sizes.tolist(),
    }


def authors_metrics(scores: np.ndarray, vocab: Vocabulary, s: Settings) -> dict[str, Any]:
    """The authors' incremental_evaluation (3 trials per target from numpy's seed 42, its start step, micro Acc-E,
    per-class Acc-S): no expectation (its start step is no random quantity)."""
    r = ex.authors_protocol(scores, vocab.labels, vocab.groups, s.trials, overlap=vocab.overlap,
                            image_group=vocab.image_groups)
    last = r.steps_s[:, :, -1].mean(axis=1)
    per_group = [{"acc_c": float(r.acc_c_per_target[g]), "acc_s": float(r.acc_s_per_target[g]), "acc_s_expected": None,
                  "acc_full": float(last[g])} for g in range(len(vocab.groups))]
    return {
        "acc_c": r.acc_c, "acc_e": r.acc_e, "acc_e_expected": None, "acc_s": r.acc_s, "acc_s_expected": None,
        "orders": int(r.orders.shape[0]), "orders_per_target": s.trials,
        "steps": {"acc_e": _floats(r.steps_e.mean(axis=(0, 1))), "acc_e_expected": None,
                  "acc_s": _floats(r.steps_s.mean(axis=(0, 1))), "acc_s_expected": None},
        "per_group": per_group, "group_sizes": _group_sizes(vocab),
    }


def _group_sizes(vocab: Vocabulary) -> list[int]:
    if vocab.image_groups is not None:
        return np.bincount(vocab.image_groups, minlength=len(vocab.groups)).tolist()
    return [int(np.isin(vocab.labels, g).sum()) for g in vocab.groups]


def with_drops(values: dict[str, Any], vocab: Vocabulary) -> dict[str, Any]:
    """Per group: its name, classes, images, Acc-C, conditional accuracy and the drops from Acc-C to the mean
    conditional accuracy (`drop_s`) and to the whole vocabulary (`drop_full`)."""
    rows = []
    for g, row in enumerate(values.pop("per_group")):
        rows.append({"group": vocab.group_names[g], "classes": len(vocab.groups[g]), "images": values["group_sizes"][g],
                     **row, "drop_s": row["acc_c"] - row["acc_s"], "drop_full": row["acc_c"] - row["acc_full"]})
    values.pop("group_sizes")
    values["groups"] = rows
    return values


# --------------------------------------------------------------------------------------------------
# geometry: margins, cosine statistics, alignment and uniformity


def _stats(x: np.ndarray) -> dict[str, float | None]:
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return {"mean": None, "std": None, "p10": None, "median": None, "p90": None}
    p10, med, p90 = np.percentile(x, [10, 50, 90])
    return {"mean": float(x.mean()), "std": float(x.std()), "p10": float(p10), "median": float(med), "p90": float(p90)}


def sample_rows(n: int, k: int, seed: int) -> np.ndarray:
    return np.arange(n) if n <= k else np.sort(np.random.default_rng([seed, 12]).choice(n, k, replace=False))


def pair_statistics(x: np.ndarray) -> dict[str, float | None]:
    """Over the distinct pairs i < j of the L2-normalised rows of x: the mean cosine and Wang & Isola's uniformity
    log E[exp(-t ||x_i - x_j||^2)] with t = 2 (on unit vectors ||x_i - x_j||^2 = 2 - 2 cos). None for one row."""
    n = x.shape[0]
    if n < 2:
        return {"pairs": 0, "cos_mean": None, "uniformity": None}
    total_cos, total_exp = 0.0, 0.0
    step = max(1, _CHUNK // n)
    for a in range(0, n, step):
        g = similarities(x[a:a + step], x).astype(np.float64)  # (q, n)
        upper = np.arange(n)[None, :] > np.arange(a, min(a + step, n))[:, None]
        total_cos += float(g[upper].sum())
        total_exp += float(np.exp(-UNIFORMITY_T * (2.0 - 2.0 * g[upper])).sum())
    pairs = n * (n - 1) // 2
    return {"pairs": pairs, "cos_mean": total_cos / pairs, "uniformity": math.log(total_exp / pairs)}


def _same_group(vocab: Vocabulary, n_classes: int) -> np.ndarray:
    same = np.zeros((n_classes, n_classes), dtype=bool)
    for g in vocab.groups:
        same[np.ix_(g, g)] = True
    return same


def image_class_margins(scores: np.ndarray, labels: np.ndarray, same: np.ndarray) -> dict[str, np.ndarray | float]:
    """Per image: the true class's score and the margins to the best wrong class overall and within its own group
    (-inf where the group has no other class); and the mean and std of the scores of every (image, other class)
    pair. In chunks of images (a union of datasets has tens of thousands of images and a thousand classes)."""
    n, C = scores.shape
    true, margin, margin_group = np.empty(n), np.empty(n), np.empty(n)
    total, total_sq = 0.0, 0.0
    step = max(1, _CHUNK // max(1, C))
    for a in range(0, n, step):
        block = scores[a:a + step].astype(np.float64)
        rows, y = np.arange(block.shape[0]), labels[a:a + step]
        t = block[rows, y]
        total += float(block.sum() - t.sum())
        total_sq += float((block ** 2).sum() - (t ** 2).sum())
        block[rows, y] = -np.inf
        true[a:a + step] = t
        margin[a:a + step] = t - block.max(axis=1)
        margin_group[a:a + step] = t - np.where(same[y], block, -np.inf).max(axis=1)
    pairs = n * (C - 1)
    mean = total / pairs if pairs else float("nan")
    std = math.sqrt(max(total_sq / pairs - mean ** 2, 0.0)) if pairs else float("nan")
    return {"true": true, "margin": margin, "margin_group": margin_group, "other_mean": mean, "other_std": std}


def _negative_share(x: np.ndarray) -> float | None:
    x = x[np.isfinite(x)]
    return float((x < 0).mean()) if x.size else None


def _alignment(pair_sums: tuple[np.ndarray, np.ndarray] | None) -> float | None:
    """Mean ||u - v||^2 = 2 - 2 cos over the pooled same-class pairs; None without pairs."""
    if pair_sums is None or int(pair_sums[1].sum()) == 0:
        return None
    return float(2.0 - 2.0 * pair_sums[0].sum() / pair_sums[1].sum())


def geometry(scores: np.ndarray, vocab: Vocabulary, weights: np.ndarray, s: Settings, seed: int,
             prompt_pairs: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:
    """Margins (true-class cosine minus the best wrong class: over every class, and over the image's own group),
    image-text and text-text cosine statistics, Wang & Isola's alignment (alpha = 2: the mean squared distance between
    L2-normalised positives) with three kinds of positive pairs, (image, its class's text weight) (`alignment`), two
    images of one class (`alignment_images`) and two prompts of one class (`alignment_texts`, from `prompt_pairs`;
    None with one prompt per class), and uniformity (t = 2) of the images (a seeded sample of at most
    `geometry.max_images`) and of the class weights."""
    n, C = scores.shape
    same = _same_group(vocab, C)
    m = image_class_margins(scores, vocab.labels, same)
    text = pair_statistics(weights)
    text_cos = similarities(weights, weights)
    np.fill_diagonal(text_cos, -np.inf)
    pair = np.triu(np.ones((C, C), dtype=bool), 1)
    images = pair_statistics(vocab.images[sample_rows(n, s.max_images, seed)])
    return {
        "margin": {**_stats(m["margin"]), "negative_fraction": _negative_share(m["margin"])},
        "margin_in_group": {**_stats(m["margin_group"]), "negative_fraction": _negative_share(m["margin_group"])},
        "cosine": {"image_true_class": _stats(m["true"]),
                   "image_other_classes": {"mean": _f(m["other_mean"]), "std": _f(m["other_std"])},
                   "text_text": _stats(text_cos[pair]), "text_nearest_class": _stats(text_cos.max(axis=1)),
                   "text_text_same_group": _stats(text_cos[pair & same]),
                   "text_text_other_group": _stats(text_cos[pair & ~same]),
                   "image_image_mean": images["cos_mean"]},
        "alignment": float(np.mean(2.0 - 2.0 * m["true"])),
        "alignment_images": _alignment(same_class_sums(vocab.images, vocab.labels, C)),
        "alignment_texts": _alignment(prompt_pairs),
        "uniformity_images": images["uniformity"], "uniformity_texts": text["uniformity"],
        "uniformity_image_pairs": images["pairs"], "uniformity_text_pairs": text["pairs"],
    }


def evaluate_variant(vocab: Vocabulary, variant: str, s: Settings, seed: int) -> dict[str, Any]:
    weights = vocab.weights[variant]
    scores = similarities(vocab.images, weights)
    if len(vocab.groups) < 2:
        raise ExtensibilityError(f"extensibility needs at least two groups of classes, got {vocab.group_names}")
    values = paper_metrics(scores, vocab, s, seed) if s.protocol == "paper" else authors_metrics(scores, vocab, s)
    return {**with_drops(values, vocab),
            "geometry": geometry(scores, vocab, weights, s, seed, vocab.prompt_pairs.get(variant))}


# --------------------------------------------------------------------------------------------------
# adversarial vocabulary


def candidate_weights(features) -> tuple[np.ndarray, np.ndarray]:
    """(words, (W, d) normalised weights) of a `vocabulary` text set: per word (owner `key`), the renormalised mean
    of its normalised template embeddings, words in sorted order."""
    words, inverse = np.unique(np.asarray(features.table.column("key").to_pylist(), dtype=object), return_inverse=True)
    return words, class_weights(features.embeddings, inverse, len(words))


def scan_vocabulary(images: np.ndarray, labels: np.ndarray, weights: np.ndarray,
                    candidates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(harmed, correct): per candidate, how many images that the closed vocabulary gets right it takes away when
    added as one extra class, and which images are right without it. The candidate comes after every class (the
    authors' `torch.cat([text_features, adv_text_features])`), so it wins only with a strictly higher score. One
    chunked product of the right images with all candidates."""
    scores = similarities(images, weights)
    correct = scores.argmax(axis=1) == labels
    x = images[correct]
    true = scores[np.flatnonzero(correct), labels[correct]][:, None]
    harmed = np.zeros(candidates.shape[0], dtype=np.int64)
    step = max(1, _CHUNK // max(1, x.shape[0]))
    for a in range(0, candidates.shape[0], step):
        harmed[a:a + step] = (similarities(x, candidates[a:a + step]) > true).sum(axis=0)
    return harmed, correct


def combined_harm(images: np.ndarray, labels: np.ndarray, weights: np.ndarray, candidates: np.ndarray) -> int:
    """Images right without the candidates and wrong once all of them are added together."""
    scores = similarities(images, weights)
    correct = scores.argmax(axis=1) == labels
    true = scores[np.arange(labels.size), labels]
    best = similarities(images, candidates).max(axis=1) if candidates.shape[0] else np.full(labels.size, -np.inf)
    return int((correct & (best > true)).sum())


def _vocabulary_table(words, harmed, n, relations, order):
    import pyarrow as pa

    rel = [relations[i] for i in order]
    return pa.table({"word": pa.array([str(words[i]) for i in order], pa.string()),
                     "harmed": pa.array(harmed[order], pa.int64()),
                     "drop": pa.array(harmed[order] / max(n, 1), pa.float64()),
                     "relation": pa.array([r[0] if r else None for r in rel], pa.string()),
                     "related_class": pa.array([r[1] if r else None for r in rel], pa.string())})


def empty_vocabulary_table():
    return _vocabulary_table([], np.zeros(0, dtype=np.int64), 0, [], np.zeros(0, dtype=np.int64))


def adversarial(inputs, vocab: Vocabulary, s: Settings, relate=None):
    """(details, table) of the adversarial scan, or (None, empty table) when the dataset has no `vocabulary` text
    set. `relate(meta, words)` gives each word's (relation, class) or None (default: WordNet, vocabulary.py)."""
    if VOCABULARY_SET not in text_set_names(inputs.texts_dir):
        return None, empty_vocabulary_table()
    variant = s.adversarial_variant
    if variant in vocab.skipped:
        raise ExtensibilityError(f"dataset {inputs.meta.name!r}: extensibility.adversarial.variant {variant!r} "
                                 f"cannot run: {vocab.skipped[variant]}")
    weights = vocab.weights[variant] if variant in vocab.weights else variant_weights(inputs, variant)
    words, candidates = candidate_weights(inputs.texts(VOCABULARY_SET))
    harmed, correct = scan_vocabulary(vocab.images, vocab.labels, weights, candidates)
    relations = (relate or related_words)(inputs.meta, [str(w) for w in words])
    n = vocab.labels.size
    order = np.lexsort((words.astype(str), -harmed))
    flagged = np.array([r is not None for r in relations], dtype=bool)
    ranked = order[~flagged[order]] if s.exclude_related else order
    top3 = ranked[:3]
    both = combined_harm(vocab.images, vocab.labels, weights, candidates[top3])

    def row(i):
        r = relations[i]
        return {"word": str(words[i]), "drop": float(harmed[i] / n), "harmed": int(harmed[i]),
                **({"relation": r[0], "class": r[1]} if r else {})}

    details = {
        "variant": variant, "candidates": int(words.size), "base_accuracy": float(correct.mean()),
        "exclude_related": s.exclude_related,
        "drop_top1": float(harmed[ranked[0]] / n) if ranked.size else None,
        "drop_top3": float(both / n) if top3.size else None,
        "drop_top3_sum_of_single": float(harmed[top3].sum() / n) if top3.size else None,
        "top": [row(i) for i in ranked[:s.top]],
        "related": [row(i) for i in order[flagged[order]][:s.top]],
        "related_counts": {k: int(sum(1 for r in relations if r and r[0] == k)) for k in
                           sorted({r[0] for r in relations if r})},
    }
    return details, _vocabulary_table(words, harmed, n, relations, order)


# --------------------------------------------------------------------------------------------------
# results


def headline(variants: Mapping[str, Mapping[str, Any]], adv: Mapping[str, Any] | None) -> dict[str, float]:
    """The numbers that go to reports/metrics.json: Acc-C/E/S per variant, the adversarial drops."""
    out = {}
    for v, d in variants.items():
        out.update({f"acc_c_{v}": d["acc_c"], f"acc_e_{v}": d["acc_e"], f"acc_s_{v}": d["acc_s"]})
    if adv and adv["drop_top1"] is not None:
        out.update(adversarial_drop_top1=adv["drop_top1"], adversarial_drop_top3=adv["drop_top3"])
    return {k: float(v) for k, v in out.items()}


def _result(vocab: Vocabulary, s: Settings, seed: int, extra_params: dict, adv=None, tables=None):
    variants = {v: evaluate_variant(vocab, v, s, seed) for v in vocab.weights}
    details = {"groups": vocab.group_names, **vocab.notes, "variants": variants, "skipped_variants": vocab.skipped}
    if vocab.repe is not None:
        details["repe"] = vocab.repe
    if adv is not None:
        details["adversarial"] = adv
    counts = {"samples": int(vocab.labels.size), "classes": len(vocab.names), "groups": len(vocab.groups),
              **vocab.counts, **({"candidates": adv["candidates"]} if adv else {})}
    return Result(headline(variants, adv), counts=counts, params={**s.params(), "seed": seed, **extra_params},
                  tables=dict(tables or {}), details=details)


def run_dataset(inputs, cfg: Mapping[str, Any], seed: int):
    """extensibility@<dataset>: the dataset's classes grouped (module docstring), every variant, the adversarial
    scan where the dataset has a `vocabulary` text set (written as the `vocabulary` table: every candidate's drop)."""
    s = parse_settings(cfg)
    vocab = dataset_vocabulary(inputs, s)
    adv, table = adversarial(inputs, vocab, s)
    return _result(vocab, s, seed, {"grouped_by": vocab.notes["grouping"]}, adv, {"vocabulary": table})


def run_union(members: Sequence[tuple[str, Any]], cfg: Mapping[str, Any], seed: int):
    """extensibility_sets@<name>: the member datasets as groups over the union of their classes."""
    s = parse_settings(cfg)
    vocab = union_vocabulary(members, s)
    return _result(vocab, s, seed, {"members": [m for m, _ in members], "grouped_by": "dataset"})


def set_members(params: Mapping[str, Any], name: str) -> list[str]:
    """The member datasets of `suite.extensibility_sets.<name>`: at least two distinct datasets of the suite; the
    set's name may not be a dataset's (both write reports/extensibility/<name>.json)."""
    sets = get(params, "suite.extensibility_sets", Mapping)
    check_name("dataset-level vocabulary", name)
    if name not in sets:
        raise ExtensibilityError(f"params.yaml: no suite.extensibility_sets.{name}; known: {sorted(sets)}")
    members = sets[name]
    if not isinstance(members, list) or len(members) < 2 or len(set(members)) != len(members):
        raise ExtensibilityError(f"params.yaml: suite.extensibility_sets.{name} must list at least two distinct "
                                 f"datasets, got {members!r}")
    if name in get(params, "suite.datasets", Mapping):
        raise ExtensibilityError(f"params.yaml: suite.extensibility_sets.{name} has the name of a dataset; its "
                                 f"result would overwrite extensibility@{name}'s: rename it")
    for member in members:
        check_suite_dataset(params, member)
    return list(members)


def run(inputs, cfg, seed: int):
    """The `extensibility` analysis of one dataset (stage extensibility@<dataset>): Acc-C/E/S per prompt variant,
    per-step curves, per-group drops, margins, cosine statistics, alignment and uniformity, and, where the dataset
    has a `vocabulary` text set, the adversarial vocabulary scan."""
    return run_dataset(inputs, cfg, seed)
