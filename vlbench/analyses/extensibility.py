"""Extensibility and stability under vocabulary expansion (Ren et al., "Delving into the Openness of CLIP",
ACL Findings 2023; issue 12), as plain numpy functions on one precomputed image-by-class score matrix.

Not wired into the pipeline yet: no stage, params or dvc.yaml block reads this module.

Where the definitions come from
-------------------------------
The paper's full text could not be retrieved here (only its abstract: "we resort to an incremental
perspective ... and define extensibility to measure a model's ability to handle novel classes"). The
definitions below follow the authors' released code, lancopku/clip-openness, commit 14b83c0e:
``main.py:incremental_evaluation`` (docstring "We calculate Acc-E and Acc-S together") and
``trainers/zsclip.py:ZeroshotCLIP.test``. What that code does, and what is implemented here:

- A *vocabulary* is a group of classes (CIFAR-100: the 20 superclasses of 5 classes each). At every step
  the test set is the images of all classes in the current vocabulary (``datasets/my_cifar100.py`` keeps
  only images whose class is in ``target_label.json``) and each image is classified by argmax over the
  classes of the current vocabulary only.
- **Acc-C** (``acc_c``): for each group alone, the accuracy (correct / images) on that group's images with
  only that group's classes as candidates; the mean over groups.
- **Acc-E** (``acc_e``): for each target group t and each of ``--trials`` orders, the vocabulary starts as t
  and the other groups are appended one at a time in a random permutation
  (``np.random.permutation(non_target_vocabs)``). At every step the accuracy is the *micro* accuracy over
  all images of the groups added so far (dassl's evaluator: correct / total). The list starts with the
  target-alone accuracy (``acc_e_trial_i = [acc, ]``), so the first step **counts**: a trial's value is the
  mean of its G step accuracies (steps with 1, 2, ..., G groups). Then the mean over trials, then over
  targets. With the same number of orders per target (which :func:`paper_orders` guarantees) that is the
  mean over all orders, and the orders are, in distribution, uniform random permutations of the G groups.
- **Conditional accuracy / Acc-S** (``acc_s``): in the same trials, after each non-target group is added,
  the accuracy on the *target group's images only*, with every class of the current vocabulary as a
  candidate. The list starts empty (``acc_s_trial_i = []``), so the target-alone step does **not** count:
  a trial's value is the mean over its G-1 distractor steps; then the mean over trials and over targets.
  The authors' code averages per-class accuracies over the target's classes
  (``sum(target_acc) / len(target_acc)`` over ``_per_class_res``); on CIFAR-100 (100 test images per class)
  that equals the accuracy over the target's images. Here ``average="images"`` (default, the issue's
  "images of one target group only") or ``average="classes"`` (the authors' per-class mean) chooses.

Computation
-----------
The score matrix is computed once. For image i with true class y and any class c, "c beats y" means that
argmax over a vocabulary containing both would not return y: ``s[i, c] > s[i, y]``, or a tie with
``c < y`` (ties go to the lower column index, like ``np.argmax`` over the selected columns). Image i is
correct for a vocabulary V (a set of groups containing its own) iff no class in V beats y. So everything
reduces to one boolean (n, G) matrix ``beats[i, h]`` = "some class of group h beats y_i" (h may be the
image's own group: then it is wrong even alone). No score is ever recomputed.

- Acc-E per step: the count of correct images for a vocabulary V is #{i: g_i in V and beats[i] ∩ V = ∅}
  = F(V̄) - F'(V̄), with F(U) = #{i: beats[i] ⊆ U} and F'(U) = #{i: beats[i] ∪ {g_i} ⊆ U}: two subset-sum
  (zeta) transforms over the 2^G subsets, after which every step of every order is a table lookup
  (G <= ``_TABLE_MAX_GROUPS``); for more groups a chunked matrix product over (image, prefix) pairs.
- Acc-S: per target, a product of the target images' ``beats`` rows with the prefix indicators.

Exact expectations over all orders (uniform random permutations; ``expected_*`` fields):

- Acc-S, closed form: for an image of target t that is correct alone, with b the number of *other* groups
  that beat it, P(still correct after j random distractor groups out of G-1) = C(G-1-b, j) / C(G-1, j)
  (the j groups must all come from the G-1-b harmless ones); 0 if wrong alone.
- Acc-E, equal image counts per group (m each), closed form: the step-k vocabulary is a uniform random
  k-subset S, the denominator is k*m, P(g_i in S) = k/G, and given that, the other k-1 groups are a random
  (k-1)-subset of the G-1 others: E[acc_k] = 1/(G m) * sum_i own_i * C(G-1-b_i, k-1) / C(G-1, k-1).
- Acc-E, unequal counts: the denominator varies with S, so no per-image closed form; the exact expectation
  is the mean of numerator/denominator over all k-subsets, enumerated with the same subset-sum table when
  G <= ``_TABLE_MAX_GROUPS`` (otherwise ``None``).

Inputs: ``scores`` (n, C) float (no NaN; +-inf allowed), ``labels`` (n,) ints in [0, C), ``groups`` a
sequence of G non-empty sequences of class indices that partition range(C); every group must have at
least one image (for Acc-S only the target needs images). Orders are (R, G) integer arrays, each row a permutation of range(G).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vlbench.errors import VlbenchError

__all__ = [
    "Extensibility",
    "ExtensibilityError",
    "GroupAccuracy",
    "Stability",
    "StabilityAll",
    "beats_by_group",
    "extensibility",
    "extensibility_expected",
    "group_accuracy",
    "paper_orders",
    "sample_orders",
    "stability",
    "stability_all",
    "stability_expected",
]

# Subset-sum tables have 2^G entries: 2^20 int64 = 8 MiB each.
_TABLE_MAX_GROUPS = 20
# Elements per chunk of the (images x prefixes) products.
_CHUNK = 1 << 23


class ExtensibilityError(VlbenchError):
    """Scores, labels, groups, target or orders for the extensibility analysis are malformed."""


# --------------------------------------------------------------------------------------------------
# results


@dataclass(frozen=True)
class GroupAccuracy:
    """Acc-C: ``per_group[g]`` = accuracy on group g's images among group g's classes; ``mean`` over groups."""

    per_group: np.ndarray
    mean: float


@dataclass(frozen=True)
class Extensibility:
    """Acc-E. ``per_order[r, k]``: micro accuracy on the union of the first k+1 groups of order r.

    ``steps`` is the mean over orders (G values, first step included), ``mean`` the mean over steps and
    orders (Acc-E). ``expected_steps`` / ``expected_mean``: the exact expectation over all G! orders, or
    ``None`` where it is not computed (unequal group sizes and G > _TABLE_MAX_GROUPS).
    """

    per_order: np.ndarray
    steps: np.ndarray
    mean: float
    expected_steps: np.ndarray | None
    expected_mean: float | None


@dataclass(frozen=True)
class Stability:
    """Conditional accuracy for one target. ``per_order[r, j]``: accuracy on the target's images after the
    first j+1 distractor groups of order r (G-1 values; the target-alone step is not included).

    ``mean`` (this target's Acc-S) is the mean over steps and orders; ``expected_*`` the exact expectation
    over all (G-1)! orders of the distractors (closed form).
    """

    target: int
    per_order: np.ndarray
    steps: np.ndarray
    mean: float
    expected_steps: np.ndarray
    expected_mean: float


@dataclass(frozen=True)
class StabilityAll:
    """Acc-S over every target: ``per_target[t]`` is target t's mean, ``mean`` the mean over targets."""

    per_target: np.ndarray
    mean: float
    expected_per_target: np.ndarray
    expected_mean: float
    targets: tuple[Stability, ...]


# --------------------------------------------------------------------------------------------------
# validation and the one precomputation


@dataclass(frozen=True)
class _Problem:
    beats: np.ndarray  # (n, G) bool: some class of group h beats image i's true class
    image_group: np.ndarray  # (n,) int: the group of image i's true class
    sizes: np.ndarray  # (G,) int: images per group
    labels: np.ndarray  # (n,) int
    n_groups: int


def _check_groups(groups, n_classes: int) -> np.ndarray:
    """The group of every class, (C,) int; refuses empty groups, unknown, repeated or missing classes."""
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence) and not isinstance(groups, np.ndarray):
        raise ExtensibilityError(f"groups must be a sequence of sequences of class indices, got {type(groups).__name__}")
    if len(groups) == 0:
        raise ExtensibilityError("groups is empty: give at least one group of class indices")
    group_of = np.full(n_classes, -1, dtype=np.int64)
    for g, members in enumerate(groups):
        idx = np.asarray(members)
        if idx.ndim != 1:
            raise ExtensibilityError(f"group {g} must be a flat sequence of class indices, got shape {idx.shape}")
        if idx.size == 0:
            raise ExtensibilityError(f"group {g} is empty: every group needs at least one class")
        if not np.issubdtype(idx.dtype, np.integer):
            raise ExtensibilityError(f"group {g} must hold integer class indices, got dtype {idx.dtype}")
        bad = idx[(idx < 0) | (idx >= n_classes)]
        if bad.size:
            raise ExtensibilityError(
                f"group {g} names class {int(bad[0])}, outside [0, {n_classes}) (the score matrix has {n_classes} columns)")
        uniq, counts = np.unique(idx, return_counts=True)
        if (counts > 1).any():
            raise ExtensibilityError(f"group {g} lists class {int(uniq[counts > 1][0])} more than once")
        taken = group_of[idx] >= 0
        if taken.any():
            c = int(idx[taken][0])
            raise ExtensibilityError(f"class {c} is in group {int(group_of[c])} and in group {g}: groups must not overlap")
        group_of[idx] = g
    missing = np.flatnonzero(group_of < 0)
    if missing.size:
        raise ExtensibilityError(
            f"class {int(missing[0])} is in no group ({missing.size} classes in all are missing): "
            f"groups must cover all {n_classes} classes of the score matrix")
    return group_of


def _prepare(scores, labels, groups, require_images: bool = True) -> _Problem:
    s = np.asarray(scores)
    if s.ndim != 2:
        raise ExtensibilityError(f"scores must be a 2-D (images, classes) array, got shape {s.shape}")
    n, n_classes = s.shape
    if n == 0 or n_classes == 0:
        raise ExtensibilityError(f"scores is empty (shape {s.shape})")
    if not (np.issubdtype(s.dtype, np.floating) or np.issubdtype(s.dtype, np.integer)):
        raise ExtensibilityError(f"scores must be numeric, got dtype {s.dtype}")
    if np.issubdtype(s.dtype, np.floating) and np.isnan(s).any():
        i, c = np.argwhere(np.isnan(s))[0]
        raise ExtensibilityError(f"scores contain NaN (first at image {i}, class {c})")
    y = np.asarray(labels)
    if y.shape != (n,):
        raise ExtensibilityError(f"labels must have shape ({n},) to match scores {s.shape}, got {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise ExtensibilityError(f"labels must be integers, got dtype {y.dtype}")
    out = np.flatnonzero((y < 0) | (y >= n_classes))
    if out.size:
        raise ExtensibilityError(
            f"label {int(y[out[0]])} of image {int(out[0])} is outside [0, {n_classes}) "
            f"({out.size} labels out of range)")
    y = y.astype(np.int64)
    group_of = _check_groups(groups, n_classes)
    n_groups = int(group_of.max()) + 1
    image_group = group_of[y]
    sizes = np.bincount(image_group, minlength=n_groups)
    if require_images and (sizes == 0).any():
        raise ExtensibilityError(f"group {int(np.flatnonzero(sizes == 0)[0])} has no images: every group needs test images")
    true = s[np.arange(n), y][:, None]
    cls = np.arange(n_classes)
    beats_cls = (s > true) | ((s == true) & (cls[None, :] < y[:, None]))  # (n, C)
    # group-wise "any": a 0/1 matrix product with the class -> group indicator (exact in float32 up to 2^24).
    member = np.zeros((n_classes, n_groups), dtype=np.float32)
    member[cls, group_of] = 1.0
    beats = (beats_cls.astype(np.float32) @ member) > 0
    return _Problem(beats=beats, image_group=image_group, sizes=sizes, labels=y, n_groups=n_groups)


def beats_by_group(scores, labels, groups) -> np.ndarray:
    """(n, G) bool: ``[i, h]`` is true when some class of group h beats image i's true class (would be
    predicted instead of it by argmax over any vocabulary containing both; ties to the lower index)."""
    return _prepare(scores, labels, groups, require_images=False).beats


def _check_orders(orders, n_groups: int, name: str = "orders") -> np.ndarray:
    o = np.asarray(orders)
    if o.ndim != 2 or o.shape[1] != n_groups:
        raise ExtensibilityError(f"{name} must be an (R, {n_groups}) array of group permutations, got shape {o.shape}")
    if o.shape[0] == 0:
        raise ExtensibilityError(f"{name} is empty: give at least one order")
    if not np.issubdtype(o.dtype, np.integer):
        raise ExtensibilityError(f"{name} must hold integer group indices, got dtype {o.dtype}")
    ok = (np.sort(o, axis=1) == np.arange(n_groups)[None, :]).all(axis=1)
    if not ok.all():
        r = int(np.flatnonzero(~ok)[0])
        raise ExtensibilityError(f"{name} row {r} is not a permutation of the {n_groups} groups: {o[r].tolist()}")
    return o.astype(np.int64)


# --------------------------------------------------------------------------------------------------
# orders


def sample_orders(n_groups: int, n_orders: int, seed, first: int | None = None) -> np.ndarray:
    """Orders of the groups, an (R, n_groups) int array, each row a permutation of range(n_groups).

    With ``first`` every row starts with that group and only the rest is shuffled. When the number of
    possible orders (n_groups!, or (n_groups-1)! with ``first``) is at most ``n_orders``, all of them are
    returned once each, in lexicographic order (so R may be less than ``n_orders``); otherwise ``n_orders``
    independent uniform random orders from ``np.random.default_rng(seed)`` (an int or a sequence of ints;
    repeats possible).
    """
    if int(n_groups) != n_groups or n_groups < 1:
        raise ExtensibilityError(f"n_groups must be a positive integer, got {n_groups!r}")
    if int(n_orders) != n_orders or n_orders < 1:
        raise ExtensibilityError(f"n_orders must be a positive integer, got {n_orders!r}")
    n_groups, n_orders = int(n_groups), int(n_orders)
    if first is not None and not (0 <= first < n_groups):
        raise ExtensibilityError(f"first group {first!r} is outside [0, {n_groups})")
    rest = np.array([g for g in range(n_groups) if g != first], dtype=np.int64)
    if math.factorial(rest.size) <= n_orders:
        perms = np.array(list(itertools.permutations(rest.tolist())), dtype=np.int64).reshape(-1, rest.size)
    else:
        rng = np.random.default_rng(seed)
        perms = rng.permuted(np.tile(rest, (n_orders, 1)), axis=1)
    if first is not None:
        perms = np.concatenate([np.full((perms.shape[0], 1), first, dtype=np.int64), perms], axis=1)
    return perms


def paper_orders(n_groups: int, n_per_target: int, seed: int) -> np.ndarray:
    """The paper's design: for every target group t, ``n_per_target`` orders that start with t (all
    (G-1)! of them when that is no more), stacked target by target: (G * R, G). One seed for all; target t
    uses ``default_rng([seed, t])``, so a target's orders do not depend on how many groups come before it."""
    blocks = [sample_orders(n_groups, n_per_target, seed=[seed, t], first=t) for t in range(int(n_groups))]
    return np.concatenate(blocks, axis=0)


# --------------------------------------------------------------------------------------------------
# Acc-C


def group_accuracy(scores, labels, groups) -> GroupAccuracy:
    """Acc-C: each group alone (its images, its classes), then the mean over groups."""
    p = _prepare(scores, labels, groups)
    own_correct = ~p.beats[np.arange(p.labels.size), p.image_group]
    per_group = np.bincount(p.image_group, weights=own_correct, minlength=p.n_groups) / p.sizes
    return GroupAccuracy(per_group=per_group, mean=float(per_group.mean()))


# --------------------------------------------------------------------------------------------------
# Acc-E


def _subset_sum(counts: np.ndarray, n_bits: int) -> np.ndarray:
    """Zeta transform: out[U] = sum of counts[m] over all m ⊆ U (U, m bitmasks over n_bits)."""
    f = counts.astype(np.int64, copy=True)
    for b in range(n_bits):
        v = f.reshape(-1, 2, 1 << b)
        v[:, 1, :] += v[:, 0, :]
    return f


def _codes(bits: np.ndarray) -> np.ndarray:
    """Bitmask code of every row of an (n, G) bool matrix (G <= 62)."""
    return bits.astype(np.int64) @ (np.int64(1) << np.arange(bits.shape[1], dtype=np.int64))


def _correct_table(p: _Problem) -> np.ndarray:
    """numer[S] = #{i: g_i in S and beats[i] ∩ S = ∅} for every subset S of groups (bitmask)."""
    G = p.n_groups
    full = (1 << G) - 1
    m = _codes(p.beats)
    m_own = m | (np.int64(1) << p.image_group)
    F = _subset_sum(np.bincount(m, minlength=1 << G), G)
    F2 = _subset_sum(np.bincount(m_own, minlength=1 << G), G)
    comp = full ^ np.arange(1 << G, dtype=np.int64)
    return F[comp] - F2[comp]


def _prefix_indicator(orders: np.ndarray, n_groups: int) -> np.ndarray:
    """(R, G, G) bool: ``[r, k, h]`` is true when group h is among the first k+1 groups of order r."""
    pos = np.empty_like(orders)
    np.put_along_axis(pos, orders, np.arange(n_groups)[None, :].repeat(orders.shape[0], 0), axis=1)
    return pos[:, None, :] <= np.arange(n_groups)[None, :, None]


def _correct_counts_direct(p: _Problem, orders: np.ndarray) -> np.ndarray:
    """(R, G) correct counts per order and step, by products over (image, prefix) pairs, in chunks."""
    R, G = orders.shape
    prefix = _prefix_indicator(orders, G).reshape(R * G, G)  # (Q, G)
    beats = p.beats.astype(np.float32)
    out = np.empty(R * G, dtype=np.int64)
    step = max(1, _CHUNK // max(1, p.labels.size))
    for a in range(0, R * G, step):
        pq = prefix[a:a + step]
        hit = beats @ pq.T.astype(np.float32)  # (n, q): how many groups in the prefix beat image i
        present = pq.T[p.image_group]  # (n, q): image i's group is in the prefix
        out[a:a + step] = ((hit == 0) & present).sum(axis=0)
    return out.reshape(R, G)


def _correct_counts(p: _Problem, orders: np.ndarray, table: np.ndarray | None = None) -> np.ndarray:
    if p.n_groups <= _TABLE_MAX_GROUPS:
        table = _correct_table(p) if table is None else table
        codes = np.cumsum(np.int64(1) << orders, axis=1)  # distinct bits: cumulative sum = cumulative OR
        return table[codes]
    return _correct_counts_direct(p, orders)


def _additive(values: np.ndarray) -> np.ndarray:
    """out[S] = sum of values[h] over the bits h of S, for every subset S of len(values) groups."""
    out = np.zeros(1 << values.size, dtype=values.dtype)
    for b, v in enumerate(values):
        view = out.reshape(-1, 2, 1 << b)
        view[:, 1, :] = view[:, 0, :] + v
    return out


def _extensibility_expected(p: _Problem, table: np.ndarray | None = None) -> np.ndarray | None:
    G = p.n_groups
    n = p.labels.size
    own = ~p.beats[np.arange(n), p.image_group]
    b = p.beats.sum(axis=1) - (~own)  # other groups that beat image i
    if (p.sizes == p.sizes[0]).all():
        k = np.arange(1, G + 1)
        ratio = np.array([[math.comb(G - 1 - bb, kk - 1) / math.comb(G - 1, kk - 1) for kk in k] for bb in range(G)])
        hist = np.bincount(b[own], minlength=G).astype(np.float64)
        return hist @ ratio / (G * p.sizes[0])
    if G > _TABLE_MAX_GROUPS:
        return None
    numer = (_correct_table(p) if table is None else table)[1:]
    denom = _additive(p.sizes.astype(np.int64))[1:]
    k = _additive(np.ones(G, dtype=np.int64))[1:]
    sums = np.bincount(k - 1, weights=numer / denom, minlength=G)
    return sums / np.array([math.comb(G, kk) for kk in range(1, G + 1)], dtype=np.float64)


def extensibility_expected(scores, labels, groups) -> np.ndarray | None:
    """Exact expected Acc-E step accuracies (G values) over all G! orders; ``None`` when the groups have
    unequal image counts and G > _TABLE_MAX_GROUPS (no closed form, too many subsets)."""
    return _extensibility_expected(_prepare(scores, labels, groups))


def extensibility(scores, labels, groups, orders) -> Extensibility:
    """Acc-E over the given orders ((R, G) permutations; use :func:`paper_orders` for the paper's design).

    Step k of order r: the first k+1 groups with all their images; the value is the micro accuracy over
    those images, argmax over those groups' classes. All G steps count (the first group alone included).
    """
    p = _prepare(scores, labels, groups)
    o = _check_orders(orders, p.n_groups)
    table = _correct_table(p) if p.n_groups <= _TABLE_MAX_GROUPS else None
    correct = _correct_counts(p, o, table)
    denom = np.cumsum(p.sizes[o], axis=1)
    per_order = correct / denom
    steps = per_order.mean(axis=0)
    exp = _extensibility_expected(p, table)
    return Extensibility(per_order=per_order, steps=steps, mean=float(per_order.mean()),
                         expected_steps=exp, expected_mean=None if exp is None else float(exp.mean()))


# --------------------------------------------------------------------------------------------------
# Acc-S


def _image_weights(p: _Problem, members: np.ndarray, average: str) -> np.ndarray:
    if average == "images":
        return np.full(members.size, 1.0 / members.size)
    if average == "classes":
        cls, inv, counts = np.unique(p.labels[members], return_inverse=True, return_counts=True)
        return 1.0 / (counts[inv] * cls.size)
    raise ExtensibilityError(f"average must be 'images' or 'classes', got {average!r}")


def _stability_expected(p: _Problem, target: int, members: np.ndarray, w: np.ndarray) -> np.ndarray:
    G = p.n_groups
    beats = p.beats[members]
    own = ~beats[:, target]
    b = beats.sum(axis=1) - (~own)
    j = np.arange(1, G)
    ratio = np.array([[math.comb(G - 1 - bb, jj) / math.comb(G - 1, jj) for jj in j] for bb in range(G)])
    hist = np.bincount(b[own], weights=w[own], minlength=G)
    return hist @ ratio


def _target_members(p: _Problem, target: int) -> np.ndarray:
    members = np.flatnonzero(p.image_group == target)
    if members.size == 0:
        raise ExtensibilityError(f"target group {target} has no images: its conditional accuracy is undefined")
    return members


def _check_target(target, n_groups: int) -> int:
    if isinstance(target, bool) or int(target) != target or not (0 <= target < n_groups):
        raise ExtensibilityError(f"target group {target!r} is outside [0, {n_groups})")
    return int(target)


def _stability(p: _Problem, target: int, o: np.ndarray, average: str) -> Stability:
    G = p.n_groups
    if G < 2:
        raise ExtensibilityError("stability needs at least two groups (a target and a distractor)")
    bad = np.flatnonzero(o[:, 0] != target)
    if bad.size:
        raise ExtensibilityError(
            f"orders row {int(bad[0])} starts with group {int(o[bad[0], 0])}, not the target {target}: "
            f"stability orders start with the target (paper_orders / sample_orders(..., first=target))")
    members = _target_members(p, target)
    w = _image_weights(p, members, average)
    R = o.shape[0]
    prefix = _prefix_indicator(o, G)[:, 1:, :].reshape(R * (G - 1), G)  # steps with 1..G-1 distractors
    hit = p.beats[members].astype(np.float32) @ prefix.T.astype(np.float32)  # (n_t, R*(G-1))
    alive = hit == 0
    if average == "images":  # count / n_t: bit-identical to the mean of a boolean vector
        per_order = (alive.sum(axis=0) / members.size).reshape(R, G - 1)
    else:
        per_order = (w @ alive).reshape(R, G - 1)
    exp = _stability_expected(p, target, members, w)
    return Stability(target=target, per_order=per_order, steps=per_order.mean(axis=0), mean=float(per_order.mean()),
                     expected_steps=exp, expected_mean=float(exp.mean()))


def stability(scores, labels, groups, target: int, orders, average: str = "images") -> Stability:
    """Conditional accuracy of one target group: its images only; every row of ``orders`` ((R, G), each
    starting with ``target``) adds the other groups one at a time as distractor classes. The G-1 steps
    after each addition count; the target-alone step does not. ``average``: "images" (accuracy over the
    target's images) or "classes" (mean of per-class accuracies, as the authors' code)."""
    p = _prepare(scores, labels, groups, require_images=False)
    t = _check_target(target, p.n_groups)
    return _stability(p, t, _check_orders(orders, p.n_groups), average)


def stability_expected(scores, labels, groups, target: int, average: str = "images") -> np.ndarray:
    """Exact expected conditional accuracy after j = 1..G-1 random distractor groups (closed form)."""
    p = _prepare(scores, labels, groups, require_images=False)
    t = _check_target(target, p.n_groups)
    if p.n_groups < 2:
        raise ExtensibilityError("stability needs at least two groups (a target and a distractor)")
    members = _target_members(p, t)
    return _stability_expected(p, t, members, _image_weights(p, members, average))


def stability_all(scores, labels, groups, orders, average: str = "images") -> StabilityAll:
    """Acc-S: :func:`stability` for every target, each on the rows of ``orders`` that start with it
    (e.g. :func:`paper_orders`), then the mean over targets. Every group must start at least one row."""
    p = _prepare(scores, labels, groups)
    o = _check_orders(orders, p.n_groups)
    results = []
    for t in range(p.n_groups):
        rows = o[o[:, 0] == t]
        if rows.shape[0] == 0:
            raise ExtensibilityError(f"no order starts with group {t}: Acc-S needs orders for every target (paper_orders)")
        results.append(_stability(p, t, rows, average))
    per_target = np.array([r.mean for r in results])
    expected = np.array([r.expected_mean for r in results])
    return StabilityAll(per_target=per_target, mean=float(per_target.mean()), expected_per_target=expected,
                        expected_mean=float(expected.mean()), targets=tuple(results))
