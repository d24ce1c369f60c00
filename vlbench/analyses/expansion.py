"""Extensibility and stability under vocabulary expansion (Ren et al., "Delving into the Openness of CLIP",
ACL Findings 2023; issue 12): Acc-C, Acc-E and Acc-S as plain numpy functions on one precomputed
image-by-class score matrix, on their own like `vlbench.metrics` (the pipeline's `extensibility` analysis around
them is `vlbench.analyses.extensibility`; docs/protocols.md, "Extensibility", has every choice).

Where the definitions come from
-------------------------------
The paper (Sec. 3.2, Def. 3.1, Eqs. (1) to (3); Sec. 3.3, Def. 3.2, Eqs. (4) to (6); docs/protocols.md,
"Extensibility", quotes them), where it agrees with the authors' released code, lancopku/clip-openness at commit
14b83c0e (``main.py:incremental_evaluation``, ``trainers/zsclip.py:ZeroshotCLIP.test``):

- A *vocabulary* is a group of classes (CIFAR-100: the 20 superclasses of 5 classes each). At every step
  the test set is the images of the classes in the current vocabulary and each image is classified by
  argmax over the classes of the current vocabulary only.
- **Acc-C** (Eq. 3): for each group alone, the accuracy on that group's images with only that group's classes as
  candidates; the mean over groups.
- **Acc-E** (Eq. 2): groups are added one at a time in a random order, with their images; after every step the
  accuracy on the images of the groups added so far (``average="images"``: correct / images, Eq. (1) and the code's
  micro accuracy; ``average="groups"``: the mean of the added groups' accuracies); the mean over the G steps (the
  first group alone included) and the orders (the paper samples 100 x N).
- **Acc-S** (conditional accuracy, Eqs. 4 to 6): the images of one target group only; the other groups are added one
  at a time as distractor classes; the accuracy after each addition (``average="images"``, Eq. (4), or
  ``"classes"``, the code's mean of per-class accuracies), the mean over the G-1 distractor steps, the orders and
  the targets.

The authors' exact procedure (3 trials per target from numpy's global seed 42, its start step, its micro and
per-class averaging) is :func:`authors_protocol`.

Computation
-----------
The score matrix is computed once. For image i with true class y and any class c, "c beats y" means that
argmax over a vocabulary containing both would not return y: ``s[i, c] > s[i, y]``, or a tie with
``c < y`` (ties go to the lower column index, like ``np.argmax`` over the selected columns). Image i is
correct for a vocabulary V (a set of groups) iff no class of V beats y. So everything reduces to one boolean
(n, G) matrix ``beats[i, h]`` = "some class of group h beats y_i", and one (n, G) matrix ``own[i, h]`` =
"the class of image i is in group h" (exactly one group per image when the groups partition the classes;
with ``overlap=True`` a class may be in several groups, as when the authors' code merges the classes that
several datasets share: such an image is tested as soon as any of its groups is in the vocabulary). No score
is ever recomputed.

- Acc-E per step: correct(V) = #{i: own_i ∩ V ≠ ∅, beats_i ∩ V = ∅} = F(V̄) - F'(V̄), with
  F(U) = #{i: beats_i ⊆ U} and F'(U) = #{i: beats_i ∪ own_i ⊆ U}: two subset-sum (zeta) transforms over the
  2^G subsets, after which every step of every order is a table lookup (G <= ``_TABLE_MAX_GROUPS``). For more
  groups each order is scanned: image i is correct at step k iff its group has entered and the first group that
  beats it has not, so one pass over the order's groups with a bit per image ("no beating group yet", 64 images per
  uint64 word, a chunk of orders side by side) gives every step: orders x G x n / 64 word operations.
- Acc-S: per target, the same scan over the target's images (``average="images"``), or a product of their
  ``beats`` rows with the prefix indicators (``"classes"``).

Exact expectations over all orders (uniform random permutations; ``expected_*`` fields):

- Acc-S, closed form: for an image of target t that is correct alone, with b the number of *other* groups
  that beat it, P(still correct after j random distractor groups out of G-1) = C(G-1-b, j) / C(G-1, j);
  0 if wrong alone.
- Acc-E, partition, ``average="groups"`` (or images with equal image counts, where the two coincide): the
  step-k vocabulary is a uniform random k-subset S; E[acc_k] = sum_i own_ok_i / (G n_{g_i}) *
  C(G-1-b_i, k-1) / C(G-1, k-1).
- Acc-E otherwise: the mean of numerator / denominator over all k-subsets, enumerated with the subset-sum
  tables when G <= ``_TABLE_MAX_GROUPS`` (otherwise ``None``).

Inputs: ``scores`` (n, C) float (no NaN; +-inf allowed), ``labels`` (n,) ints in [0, C), ``groups`` a
sequence of G non-empty sequences of class indices that partition range(C) (``overlap=True``: that cover
it); every group must have at least one image (for Acc-S only the target needs images). Orders are (R, G)
integer arrays, each row a permutation of range(G).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vlbench.errors import VlbenchError

__all__ = [
    "AuthorsProtocol",
    "Expansion",
    "Extensibility",
    "ExtensibilityError",
    "GroupAccuracy",
    "Stability",
    "StabilityAll",
    "authors_orders",
    "authors_protocol",
    "beats_by_group",
    "expansion",
    "extensibility",
    "extensibility_expected",
    "group_accuracy",
    "paper_orders",
    "run",
    "sample_orders",
    "stability",
    "stability_all",
    "stability_expected",
]

# Subset-sum tables have 2^G entries: 2^20 int64 = 8 MiB each.
_TABLE_MAX_GROUPS = 20
# Bits (images x orders) scanned at once: 1 MiB per bit array.
_CHUNK = 1 << 23
AVERAGES_E = ("images", "groups")
AVERAGES_S = ("images", "classes")
AUTHORS_SEED = 42  # main.py: np.random.seed(42), the only seed its orders depend on


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
    """Acc-E. ``per_order[r, k]``: accuracy on the union of the first k+1 groups of order r.

    ``steps`` is the mean over orders (G values, first step included), ``mean`` the mean over steps and
    orders (Acc-E). ``expected_steps`` / ``expected_mean``: the exact expectation over all G! orders, or
    ``None`` where it is not computed (no closed form and G > _TABLE_MAX_GROUPS).
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


@dataclass(frozen=True)
class Expansion:
    """Acc-C, Acc-E and Acc-S of one score matrix under one set of orders (:func:`expansion`)."""

    acc_c: GroupAccuracy
    acc_e: Extensibility
    acc_s: StabilityAll
    group_sizes: np.ndarray  # images per group (an image of a class in several groups counts in each)


@dataclass(frozen=True)
class AuthorsProtocol:
    """The authors' ``incremental_evaluation`` (:func:`authors_protocol`).

    ``orders``: (G * trials, G), target-major, each row starting with its target. ``acc_e_trials[t, i]`` /
    ``acc_s_trials[t, i]``: trial i of target t (the mean of its step list), ``acc_*_per_target`` their means
    over trials, ``acc_c`` / ``acc_e`` / ``acc_s`` the means over targets. ``steps_e[t, i]`` is the trial's
    list as the code builds it (its first entry is the start step), ``steps_s[t, i]`` its G-1 conditional
    accuracies.
    """

    orders: np.ndarray
    acc_c_per_target: np.ndarray
    acc_e_trials: np.ndarray
    acc_s_trials: np.ndarray
    steps_e: np.ndarray
    steps_s: np.ndarray
    acc_e_per_target: np.ndarray
    acc_s_per_target: np.ndarray
    acc_c: float
    acc_e: float
    acc_s: float


# --------------------------------------------------------------------------------------------------
# validation and the one precomputation


@dataclass(frozen=True)
class _Problem:
    beats: np.ndarray  # (n, G) bool: some class of group h beats image i's true class
    own: np.ndarray  # (n, G) bool: image i's class is in group h
    labels: np.ndarray  # (n,) int
    sizes: np.ndarray  # (G,) int: images per group (own.sum(0))
    n_groups: int
    image_group: np.ndarray | None  # (n,) int where every image has exactly one group, else None

    @property
    def partition(self) -> bool:
        return self.image_group is not None


def _check_members(g: int, members, n_classes: int) -> np.ndarray:
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
    return idx


def _check_groups(groups, n_classes: int, overlap: bool = False) -> np.ndarray:
    """(C, G) bool class-in-group matrix; refuses empty groups, unknown or repeated classes, classes in no group
    and (unless ``overlap``) classes in two groups."""
    if isinstance(groups, (str, bytes)) or not isinstance(groups, (Sequence, np.ndarray)):
        raise ExtensibilityError(f"groups must be a sequence of sequences of class indices, got {type(groups).__name__}")
    if len(groups) == 0:
        raise ExtensibilityError("groups is empty: give at least one group of class indices")
    member = np.zeros((n_classes, len(groups)), dtype=bool)
    for g, members in enumerate(groups):
        idx = _check_members(g, members, n_classes)
        taken = member[idx].any(axis=1)
        if taken.any() and not overlap:
            c = int(idx[taken][0])
            raise ExtensibilityError(f"class {c} is in group {int(np.argmax(member[c]))} and in group {g}: "
                                     f"groups must not overlap")
        member[idx, g] = True
    missing = np.flatnonzero(~member.any(axis=1))
    if missing.size:
        raise ExtensibilityError(
            f"class {int(missing[0])} is in no group ({missing.size} classes in all are missing): "
            f"groups must cover all {n_classes} classes of the score matrix")
    return member


def _check_scores_labels(scores, labels) -> tuple[np.ndarray, np.ndarray]:
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
    return s, y.astype(np.int64)


def beats_matrix(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(n, C) bool: class c beats image i's true class (a higher score, or a tie with a lower index)."""
    n, n_classes = scores.shape
    true = scores[np.arange(n), labels][:, None]
    cls = np.arange(n_classes)
    return (scores > true) | ((scores == true) & (cls[None, :] < labels[:, None]))


def _image_own(member: np.ndarray, y: np.ndarray, image_group) -> np.ndarray:
    """(n, G) bool: the groups an image enters with: those listing its class, or its one given group."""
    if image_group is None:
        return member[y]
    g = np.asarray(image_group)
    if g.shape != y.shape or not np.issubdtype(g.dtype, np.integer):
        raise ExtensibilityError(f"image_group must be ({y.size},) integer group indices, got shape {g.shape}")
    bad = np.flatnonzero((g < 0) | (g >= member.shape[1]))
    if bad.size:
        raise ExtensibilityError(f"image_group of image {int(bad[0])} is {int(g[bad[0]])}, outside [0, {member.shape[1]})")
    g = g.astype(np.int64)
    missing = np.flatnonzero(~member[y, g])
    if missing.size:
        i = int(missing[0])
        raise ExtensibilityError(f"image {i} enters with group {int(g[i])}, which does not list its class {int(y[i])}")
    own = np.zeros((y.size, member.shape[1]), dtype=bool)
    own[np.arange(y.size), g] = True
    return own


def _prepare(scores, labels, groups, require_images: bool = True, overlap: bool = False,
             image_group=None) -> _Problem:
    s, y = _check_scores_labels(scores, labels)
    member = _check_groups(groups, s.shape[1], overlap)
    n_groups = member.shape[1]
    own = _image_own(member, y, image_group)
    sizes = own.sum(axis=0)
    if require_images and (sizes == 0).any():
        raise ExtensibilityError(f"group {int(np.flatnonzero(sizes == 0)[0])} has no images: every group needs test images")
    # group-wise "any": a 0/1 matrix product with the class -> group indicator (exact in float32 up to 2^24).
    beats = (beats_matrix(s, y).astype(np.float32) @ member.astype(np.float32)) > 0
    single = (own.sum(axis=1) == 1).all()
    return _Problem(beats=beats, own=own, labels=y, sizes=sizes, n_groups=n_groups,
                    image_group=np.argmax(own, axis=1) if single else None)


def beats_by_group(scores, labels, groups, overlap: bool = False) -> np.ndarray:
    """(n, G) bool: ``[i, h]`` is true when some class of group h beats image i's true class (would be
    predicted instead of it by argmax over any vocabulary containing both; ties to the lower index)."""
    return _prepare(scores, labels, groups, require_images=False, overlap=overlap).beats


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


def _check_average(average: str, allowed: tuple[str, ...], what: str) -> str:
    if average not in allowed:
        raise ExtensibilityError(f"{what} average must be one of {list(allowed)}, got {average!r}")
    return average


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


def authors_orders(n_groups: int, trials: int, seed: int = AUTHORS_SEED) -> np.ndarray:
    """The orders of the authors' ``incremental_evaluation``: numpy's legacy global generator seeded once
    (``np.random.seed(42)`` in main.py), then for every target in group order and every trial
    ``np.random.permutation(non_target_vocabs)``, the other groups in group order. (G * trials, G), target-major.
    Reproduces their orders provided nothing else draws from numpy's global generator in between (main.py
    does not; their data loaders shuffle with torch)."""
    if int(trials) != trials or trials < 1:
        raise ExtensibilityError(f"trials must be a positive integer, got {trials!r}")
    rs = np.random.RandomState(seed)
    rows = []
    for t in range(int(n_groups)):
        others = np.array([g for g in range(n_groups) if g != t], dtype=np.int64)
        for _ in range(int(trials)):
            rows.append(np.concatenate([[t], rs.permutation(others)]))
    return np.array(rows, dtype=np.int64).reshape(-1, int(n_groups))


# --------------------------------------------------------------------------------------------------
# Acc-C


def _group_accuracy(p: _Problem) -> GroupAccuracy:
    correct = (p.own & ~p.beats).sum(axis=0)
    per_group = correct / p.sizes
    return GroupAccuracy(per_group=per_group, mean=float(per_group.mean()))


def group_accuracy(scores, labels, groups, overlap: bool = False) -> GroupAccuracy:
    """Acc-C: each group alone (its images, its classes), then the mean over groups."""
    return _group_accuracy(_prepare(scores, labels, groups, overlap=overlap))


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


def _complement_counts(codes: np.ndarray, n_groups: int) -> np.ndarray:
    """out[S] = #{i: codes_i ∩ S = ∅} for every subset S (bitmask)."""
    full = (1 << n_groups) - 1
    table = _subset_sum(np.bincount(codes, minlength=1 << n_groups), n_groups)
    return table[full ^ np.arange(1 << n_groups, dtype=np.int64)]


def _tables(p: _Problem) -> tuple[np.ndarray, np.ndarray]:
    """(numer, denom) over every subset S of groups: numer[S] = #{i: own_i ∩ S ≠ ∅ and beats_i ∩ S = ∅},
    denom[S] = #{i: own_i ∩ S ≠ ∅}."""
    beaten, owned = _codes(p.beats), _codes(p.own)
    n = p.labels.size
    numer = _complement_counts(beaten, p.n_groups) - _complement_counts(beaten | owned, p.n_groups)
    return numer, n - _complement_counts(owned, p.n_groups)


def _prefix_indicator(orders: np.ndarray, n_groups: int) -> np.ndarray:
    """(R, G, G) bool: ``[r, k, h]`` is true when group h is among the first k+1 groups of order r."""
    pos = np.empty_like(orders)
    np.put_along_axis(pos, orders, np.arange(n_groups)[None, :].repeat(orders.shape[0], 0), axis=1)
    return pos[:, None, :] <= np.arange(n_groups)[None, :, None]


# The counts above _TABLE_MAX_GROUPS: in an order, image i is correct at step k iff its group has entered (position
# e_i <= k) and no group that beats it has (k < f_i, the position of the first one): two positions per image, so a
# scan over the order's groups that keeps every image's "no beating group yet" bit decides all G steps at once.
# Images are bits of uint64 words (one word op covers 64 images); the orders of a chunk are scanned side by side.


def _pack(bits: np.ndarray) -> np.ndarray:
    """(..., m) bool, m a multiple of 64 -> (..., m / 64) uint64 words."""
    return np.ascontiguousarray(np.packbits(bits, axis=-1, bitorder="little")).view(np.uint64)


def _bit_masks(beats: np.ndarray, own: np.ndarray, slot: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(not_beaten (G, W), own (G, W), valid (W,)) packed over the slots (slot[j]: the image at bit j, -1 for padding):
    bit set where group h does not beat the image (padding: never), where the image enters with group h, where a slot
    holds an image."""
    valid = slot >= 0
    idx = np.maximum(slot, 0)
    return _pack((~beats[idx] & valid[:, None]).T), _pack((own[idx] & valid[:, None]).T), _pack(valid)


def _order_chunks(n_orders: int, n_words: int) -> list[slice]:
    step = max(1, _CHUNK // (64 * max(1, n_words)))
    return [slice(a, min(a + step, n_orders)) for a in range(0, n_orders, step)]


def _padded_slots(n: int) -> np.ndarray:
    slot = np.full(-(-n // 64) * 64, -1, dtype=np.int64)
    slot[:n] = np.arange(n)
    return slot


def _scan_counts(p: _Problem, orders: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(correct, tested), (R, G) int64 each: images of the first k+1 groups of order r, and those of them that no class
    of those groups beats. Classes in several groups (no partition): every image is scanned."""
    R, G = orders.shape
    if p.partition:
        correct = np.empty((R, G), dtype=np.int64)
        for rows, k, present, counts in _scan_groups(p, orders):
            correct[rows, k] = (counts * present).sum(axis=1)
        return correct, np.cumsum(p.sizes[orders], axis=1)
    not_beaten, own, valid = _bit_masks(p.beats, p.own, _padded_slots(p.labels.size))
    correct = np.empty((R, G), dtype=np.int64)
    tested = np.empty((R, G), dtype=np.int64)
    for rows in _order_chunks(R, valid.size):
        o = orders[rows]
        alive = np.repeat(valid[None, :], o.shape[0], axis=0)
        present = np.zeros_like(alive)
        for k in range(G):
            alive &= not_beaten[o[:, k]]
            present |= own[o[:, k]]
            correct[rows, k] = np.bitwise_count(alive & present).sum(axis=1)
            tested[rows, k] = np.bitwise_count(present).sum(axis=1)
    return correct, tested


def _scan_groups(p: _Problem, orders: np.ndarray):
    """For a partition, per chunk of orders and step k: (rows, k, present (r, G) bool: group g among the first k+1,
    counts (r, G) int64: images of group g that no group among the first k+1 beats, g's own included).

    Only the images some other group beats and their own does not are scanned (as bits, each group's on words of its
    own); an image no group beats counts from its group's entry on, one its own group beats never."""
    R, G = orders.shape
    own_ok, b = _others_beating(p)
    scanned = own_ok & (b > 0)
    always = np.bincount(p.image_group[own_ok & (b == 0)], minlength=G)
    idx = np.flatnonzero(scanned)
    sizes = np.bincount(p.image_group[idx], minlength=G)
    words = np.maximum(-(-sizes // 64), 1)  # at least one word per group: reduceat needs distinct starts
    starts = np.concatenate([[0], np.cumsum(words)[:-1]])
    rank = np.arange(idx.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    order = idx[np.argsort(p.image_group[idx], kind="stable")]
    slot = np.full(int(words.sum()) * 64, -1, dtype=np.int64)
    slot[starts[p.image_group[order]] * 64 + rank] = order
    not_beaten, _, valid = _bit_masks(p.beats, p.own, slot)
    pos = np.empty_like(orders)
    np.put_along_axis(pos, orders, np.arange(G)[None, :].repeat(R, 0), axis=1)
    for rows in _order_chunks(R, valid.size):
        o = orders[rows]
        alive = np.repeat(valid[None, :], o.shape[0], axis=0)
        for k in range(G):
            alive &= not_beaten[o[:, k]]
            counts = np.add.reduceat(np.bitwise_count(alive), starts, axis=1, dtype=np.int64) + always
            yield rows, k, pos[rows] <= k, counts


def _scan_group_accuracies(p: _Problem, orders: np.ndarray) -> np.ndarray:
    """(R, G) mean over the groups among the first k+1 of order r of their accuracies (a partition)."""
    R, G = orders.shape
    out = np.empty((R, G))
    for rows, k, present, counts in _scan_groups(p, orders):
        if k == 0:
            correct = np.empty((counts.shape[0], G, G), dtype=np.int64)  # [r, step, group]
        correct[:, k, :] = counts * present  # a group's images count from the step it enters
        if k == G - 1:
            prefix = _prefix_indicator(orders[rows], G)
            acc = correct / p.sizes[None, None, :]
            out[rows] = (acc * prefix).sum(axis=2) / prefix.sum(axis=2)
    return out


def _scan_alive(beats: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """(R, G) int64: how many of the images (rows of ``beats``) no group among the first k+1 of order r beats (only the
    images some group beats are scanned)."""
    R, G = orders.shape
    hit = beats.any(axis=1)
    not_beaten, _, valid = _bit_masks(beats[hit], beats[hit], _padded_slots(int(hit.sum())))
    out = np.empty((R, G), dtype=np.int64)
    for rows in _order_chunks(R, valid.size):
        o = orders[rows]
        alive = np.repeat(valid[None, :], o.shape[0], axis=0)
        for k in range(G):
            alive &= not_beaten[o[:, k]]
            out[rows, k] = np.bitwise_count(alive).sum(axis=1)
    return out + int((~hit).sum())


def _step_accuracies(p: _Problem, o: np.ndarray, average: str, tables) -> np.ndarray:
    """(R, G) accuracy per order and step."""
    if average == "groups" and not (p.sizes == p.sizes[0]).all():
        return _scan_group_accuracies(p, o)
    if tables is not None:
        numer, denom = tables
        codes = np.cumsum(np.int64(1) << o, axis=1)  # distinct bits: cumulative sum = cumulative OR
        return numer[codes] / denom[codes]
    correct, tested = _scan_counts(p, o)
    return correct / tested


def _ratio(n_groups: int, steps: np.ndarray, shift: int) -> np.ndarray:
    """[b, s] = C(G-1-b, s-shift) / C(G-1, s-shift) for b in 0..G-1 and every s of `steps`."""
    return np.array([[math.comb(n_groups - 1 - b, s - shift) / math.comb(n_groups - 1, s - shift) for s in steps]
                     for b in range(n_groups)])


def _others_beating(p: _Problem) -> tuple[np.ndarray, np.ndarray]:
    """(correct alone, number of other groups that beat the image), per image of a partition."""
    own_ok = ~p.beats[np.arange(p.labels.size), p.image_group]
    return own_ok, p.beats.sum(axis=1) - (~own_ok)


def _additive(values: np.ndarray) -> np.ndarray:
    """out[S] = sum of values[h] over the bits h of S, for every subset S of len(values) groups."""
    out = np.zeros(1 << values.size, dtype=values.dtype)
    for b, v in enumerate(values):
        view = out.reshape(-1, 2, 1 << b)
        view[:, 1, :] = view[:, 0, :] + v
    return out


def _extensibility_expected(p: _Problem, average: str, tables) -> np.ndarray | None:
    G = p.n_groups
    equal = bool((p.sizes == p.sizes[0]).all())
    if p.partition and (average == "groups" or equal):
        own_ok, b = _others_beating(p)
        weights = own_ok / (G * p.sizes[p.image_group])
        hist = np.bincount(b, weights=weights, minlength=G)
        return hist @ _ratio(G, np.arange(1, G + 1), 1)
    if tables is None:
        return None
    numer, denom = tables
    k = _additive(np.ones(G, dtype=np.int64))[1:]
    sums = np.bincount(k - 1, weights=numer[1:] / denom[1:], minlength=G)
    return sums / np.array([math.comb(G, kk) for kk in range(1, G + 1)], dtype=np.float64)


def _tables_if_small(p: _Problem) -> tuple[np.ndarray, np.ndarray] | None:
    return _tables(p) if p.n_groups <= _TABLE_MAX_GROUPS else None


def _extensibility(p: _Problem, o: np.ndarray, average: str) -> Extensibility:
    _check_average(average, AVERAGES_E, "Acc-E")
    if average == "groups" and not p.partition:
        raise ExtensibilityError("Acc-E average 'groups' needs groups that partition the classes (overlap=False)")
    tables = _tables_if_small(p)
    per_order = _step_accuracies(p, o, average, tables)
    exp = _extensibility_expected(p, average, tables)
    return Extensibility(per_order=per_order, steps=per_order.mean(axis=0), mean=float(per_order.mean()),
                         expected_steps=exp, expected_mean=None if exp is None else float(exp.mean()))


def extensibility_expected(scores, labels, groups, average: str = "images", overlap: bool = False) -> np.ndarray | None:
    """Exact expected Acc-E step accuracies (G values) over all G! orders; ``None`` when there is no closed form
    and G > _TABLE_MAX_GROUPS."""
    p = _prepare(scores, labels, groups, overlap=overlap)
    _check_average(average, AVERAGES_E, "Acc-E")
    return _extensibility_expected(p, average, _tables_if_small(p))


def extensibility(scores, labels, groups, orders, average: str = "images", overlap: bool = False,
                  image_group=None) -> Extensibility:
    """Acc-E over the given orders ((R, G) permutations; use :func:`paper_orders` for the paper's design).

    Step k of order r: the first k+1 groups with all their images, argmax over those groups' classes; the value
    is the accuracy over those images (``average="images"``) or the mean of the groups' accuracies
    (``"groups"``). All G steps count (the first group alone included).
    """
    p = _prepare(scores, labels, groups, overlap=overlap, image_group=image_group)
    return _extensibility(p, _check_orders(orders, p.n_groups), average)


# --------------------------------------------------------------------------------------------------
# Acc-S


def _image_weights(p: _Problem, members: np.ndarray, average: str) -> np.ndarray:
    _check_average(average, AVERAGES_S, "Acc-S")
    if average == "images":
        return np.full(members.size, 1.0 / members.size)
    cls, inv, counts = np.unique(p.labels[members], return_inverse=True, return_counts=True)
    return 1.0 / (counts[inv] * cls.size)


def _stability_expected(p: _Problem, target: int, members: np.ndarray, w: np.ndarray) -> np.ndarray:
    G = p.n_groups
    beats = p.beats[members]
    own_ok = ~beats[:, target]
    b = beats.sum(axis=1) - (~own_ok)
    hist = np.bincount(b[own_ok], weights=w[own_ok], minlength=G)
    return hist @ _ratio(G, np.arange(1, G), 0)


def _target_members(p: _Problem, target: int) -> np.ndarray:
    members = np.flatnonzero(p.own[:, target])
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
    if average == "images":  # count / n_t: bit-identical to the mean of a boolean vector
        per_order = _scan_alive(p.beats[members], o)[:, 1:] / members.size
    else:
        prefix = _prefix_indicator(o, G)[:, 1:, :].reshape(R * (G - 1), G)  # steps with 1..G-1 distractors
        alive = (p.beats[members].astype(np.float32) @ prefix.T.astype(np.float32)) == 0  # (n_t, R*(G-1))
        per_order = (w @ alive).reshape(R, G - 1)
    exp = _stability_expected(p, target, members, w)
    return Stability(target=target, per_order=per_order, steps=per_order.mean(axis=0), mean=float(per_order.mean()),
                     expected_steps=exp, expected_mean=float(exp.mean()))


def stability(scores, labels, groups, target: int, orders, average: str = "images",
              overlap: bool = False) -> Stability:
    """Conditional accuracy of one target group: its images only; every row of ``orders`` ((R, G), each
    starting with ``target``) adds the other groups one at a time as distractor classes. The G-1 steps
    after each addition count; the target-alone step does not. ``average``: "images" (accuracy over the
    target's images) or "classes" (mean of per-class accuracies, as the authors' code)."""
    p = _prepare(scores, labels, groups, require_images=False, overlap=overlap)
    t = _check_target(target, p.n_groups)
    return _stability(p, t, _check_orders(orders, p.n_groups), average)


def stability_expected(scores, labels, groups, target: int, average: str = "images",
                       overlap: bool = False) -> np.ndarray:
    """Exact expected conditional accuracy after j = 1..G-1 random distractor groups (closed form)."""
    p = _prepare(scores, labels, groups, require_images=False, overlap=overlap)
    t = _check_target(target, p.n_groups)
    if p.n_groups < 2:
        raise ExtensibilityError("stability needs at least two groups (a target and a distractor)")
    members = _target_members(p, t)
    return _stability_expected(p, t, members, _image_weights(p, members, average))


def _stability_all(p: _Problem, o: np.ndarray, average: str) -> StabilityAll:
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


def stability_all(scores, labels, groups, orders, average: str = "images", overlap: bool = False,
                  image_group=None) -> StabilityAll:
    """Acc-S: :func:`stability` for every target, each on the rows of ``orders`` that start with it
    (e.g. :func:`paper_orders`), then the mean over targets. Every group must start at least one row."""
    p = _prepare(scores, labels, groups, overlap=overlap, image_group=image_group)
    return _stability_all(p, _check_orders(orders, p.n_groups), average)


# --------------------------------------------------------------------------------------------------
# all three at once; the authors' procedure


def expansion(scores, labels, groups, orders, average_e: str = "images", average_s: str = "images",
              overlap: bool = False, image_group=None) -> Expansion:
    """Acc-C, Acc-E (over all ``orders``) and Acc-S (each target on the rows that start with it), from one
    preparation of the score matrix: the paper's design is ``orders = paper_orders(G, 100, seed)``. ``image_group``
    (n,): the one group each image enters with (a dataset-level vocabulary whose shared classes several groups list,
    `duplicates: first`); by default an image enters with every group that lists its class."""
    p = _prepare(scores, labels, groups, overlap=overlap, image_group=image_group)
    o = _check_orders(orders, p.n_groups)
    acc_s = _stability_all(p, o, average_s) if p.n_groups > 1 else None
    return Expansion(acc_c=_group_accuracy(p), acc_e=_extensibility(p, o, average_e), acc_s=acc_s,
                     group_sizes=p.sizes)


def authors_protocol(scores, labels, groups, trials: int = 3, seed: int = AUTHORS_SEED,
                     overlap: bool = False, image_group=None) -> AuthorsProtocol:
    """``incremental_evaluation`` of lancopku/clip-openness (main.py), computed from the score matrix.

    For every target t (in group order): Acc-C_t = micro accuracy of t alone; then ``trials`` orders
    (:func:`authors_orders`), each adding the other groups one at a time. A trial's Acc-E is the mean of the list
    ``[start, acc_1, ..., acc_{G-1}]`` of micro accuracies over the images of the vocabulary so far, where
    ``start`` is Acc-C_t in the first trial but, in later trials, the accuracy left in the code's variable by the
    previous trial's last step (the whole vocabulary): their ``acc_e_trial_i = [acc, ]`` is not reset between
    trials. A trial's Acc-S is the mean over its G-1 steps of the per-class accuracy averaged over t's classes.
    Means over trials, then over targets. ``overlap=True`` with classes shared by several groups reproduces their
    merged dataset-level vocabularies (such a class's images are tested once any of its groups is added);
    ``image_group`` as in :func:`expansion`.
    """
    p = _prepare(scores, labels, groups, overlap=overlap, image_group=image_group)
    G = p.n_groups
    if G < 2:
        raise ExtensibilityError("the authors' protocol needs at least two groups")
    o = authors_orders(G, trials, seed)
    tables = _tables_if_small(p)
    steps = _step_accuracies(p, o, "images", tables).reshape(G, trials, G)
    acc_c = _group_accuracy(p).per_group
    whole = steps[0, 0, -1]  # the last step of any order is the whole vocabulary
    start = np.where(np.arange(trials)[None, :] == 0, acc_c[:, None], whole)
    steps_e = np.concatenate([start[:, :, None], steps[:, :, 1:]], axis=2)
    steps_s = np.stack([_stability(p, t, o[t * trials:(t + 1) * trials], "classes").per_order for t in range(G)])
    acc_e_trials, acc_s_trials = steps_e.mean(axis=2), steps_s.mean(axis=2)
    acc_e_t, acc_s_t = acc_e_trials.mean(axis=1), acc_s_trials.mean(axis=1)
    return AuthorsProtocol(orders=o, acc_c_per_target=acc_c, acc_e_trials=acc_e_trials, acc_s_trials=acc_s_trials,
                           steps_e=steps_e, steps_s=steps_s, acc_e_per_target=acc_e_t, acc_s_per_target=acc_s_t,
                           acc_c=float(acc_c.mean()), acc_e=float(acc_e_t.mean()), acc_s=float(acc_s_t.mean()))
