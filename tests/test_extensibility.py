"""Acc-C / Acc-E / Acc-S (vlbench.analyses.expansion): brute force over explicit vocabularies vs the
vectorised functions vs the closed forms, on tiny score matrices with ties and -inf."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from vlbench.analyses import expansion as ex
from vlbench.errors import VlbenchError

# ---------------------------------------------------------------- brute force: argmax over the vocabulary


def brute_correct(scores, labels, groups, vocab):
    """Per image of the vocabulary's groups: is argmax over the vocabulary's classes (ascending column
    order, so ties go to the lower index, like np.argmax) its true class? Returns (images, correct)."""
    cols = np.sort(np.concatenate([np.asarray(groups[g]) for g in vocab]))
    images = np.flatnonzero(np.isin(labels, cols))
    pred = cols[np.argmax(scores[np.ix_(images, cols)], axis=1)]
    return images, pred == labels[images]


def brute_extensibility(scores, labels, groups, orders):
    out = np.empty(orders.shape, dtype=np.float64)
    for r, order in enumerate(orders):
        for k in range(len(order)):
            _, ok = brute_correct(scores, labels, groups, order[:k + 1])
            out[r, k] = np.mean(ok)
    return out


def brute_stability(scores, labels, groups, target, orders):
    tcls = np.asarray(groups[target])
    out = np.empty((orders.shape[0], orders.shape[1] - 1))
    for r, order in enumerate(orders):
        for j in range(1, len(order)):
            images, ok = brute_correct(scores, labels, groups, order[:j + 1])
            out[r, j - 1] = np.mean(ok[np.isin(labels[images], tcls)])
    return out


def random_problem(seed, n_groups=4, sizes=(1, 3), n_images=40, ties=True, equal=False):
    rng = np.random.default_rng(seed)
    per = rng.integers(sizes[0], sizes[1] + 1, n_groups)
    perm = rng.permutation(int(per.sum()))
    groups, a = [], 0
    for k in per:
        groups.append(sorted(perm[a:a + k].tolist()))
        a += k
    C = int(per.sum())
    if ties:
        scores = rng.integers(0, 3, (n_images, C)).astype(np.float64)
        scores[rng.random((n_images, C)) < 0.05] = -np.inf
    else:
        scores = rng.standard_normal((n_images, C))
    if equal:  # the same number of images in every group
        per_group = n_images // n_groups
        labels = np.concatenate([rng.choice(groups[g], per_group) for g in range(n_groups)])
        scores = scores[:labels.size]
    else:
        labels = rng.integers(0, C, n_images)
        for g in range(n_groups):  # every group needs images
            labels[g] = groups[g][0]
    scores[np.arange(labels.size), labels] += rng.random(labels.size) < 0.5  # some images are easy
    return scores, labels, groups


ALL4 = np.array(list(itertools.permutations(range(4))))


# ---------------------------------------------------------------- hand-computed example

HAND_GROUPS = [[0, 1], [2], [3]]
HAND_SCORES = np.array([
    [1, 0, 2, -1],  # label 0: right within group 0, beaten by class 2 (group 1)
    [0, 1, 0, 0],  # label 1: never beaten
    [3, 0, 1, 0],  # label 2: beaten by class 0 (group 0)
    [0, 0, 0, 5],  # label 3: never beaten
    [0, 0, 0, 0],  # label 3: all tied, lower indices win: beaten by groups 0 and 1
], dtype=float)
HAND_LABELS = np.array([0, 1, 2, 3, 3])


def test_hand_computed_example():
    assert ex.group_accuracy(HAND_SCORES, HAND_LABELS, HAND_GROUPS).per_group.tolist() == [1.0, 1.0, 1.0]
    e = ex.extensibility(HAND_SCORES, HAND_LABELS, HAND_GROUPS, np.array([[0, 1, 2]]))
    assert e.per_order.tolist() == [[1.0, 1 / 3, 2 / 5]]
    assert e.mean == pytest.approx((1 + 1 / 3 + 2 / 5) / 3)
    s = ex.stability(HAND_SCORES, HAND_LABELS, HAND_GROUPS, 2, np.array([[2, 0, 1]]))
    assert s.per_order.tolist() == [[0.5, 0.5]]
    # closed form: image 4 is beaten by b=2 of the G-1=2 other groups -> 0 after any distractor
    assert s.expected_steps.tolist() == [0.5, 0.5]
    # target 0: image 0 (b=1) survives one random distractor with probability C(1,1)/C(2,1) = 1/2
    assert ex.stability_expected(HAND_SCORES, HAND_LABELS, HAND_GROUPS, 0) == pytest.approx([0.75, 0.5])
    beats = ex.beats_by_group(HAND_SCORES, HAND_LABELS, HAND_GROUPS)
    assert beats.astype(int).tolist() == [[0, 1, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0], [1, 1, 0]]


# ---------------------------------------------------------------- brute force vs vectorised vs closed form


@pytest.mark.parametrize("seed", range(6))
def test_acc_c_matches_brute_force(seed):
    scores, labels, groups = random_problem(seed)
    res = ex.group_accuracy(scores, labels, groups)
    brute = [np.mean(brute_correct(scores, labels, groups, [g])[1]) for g in range(len(groups))]
    assert res.per_group.tolist() == brute
    assert res.mean == pytest.approx(np.mean(brute), abs=1e-15)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("path", ["table", "direct"])
def test_acc_e_matches_brute_force_exactly(seed, path, monkeypatch):
    if path == "direct":
        monkeypatch.setattr(ex, "_TABLE_MAX_GROUPS", 0)
        monkeypatch.setattr(ex, "_CHUNK", 50)  # several chunks
    scores, labels, groups = random_problem(seed)
    res = ex.extensibility(scores, labels, groups, ALL4)
    brute = brute_extensibility(scores, labels, groups, ALL4)
    assert np.array_equal(res.per_order, brute)  # same integers divided: bit-identical
    assert np.array_equal(res.steps, brute.mean(axis=0))


def exact_expected_e(scores, labels, groups):
    """Expected step accuracies over all orders, as Fractions, by enumerating every order."""
    G = len(groups)
    sums = [Fraction(0)] * G
    orders = list(itertools.permutations(range(G)))
    for order in orders:
        for k in range(G):
            _, ok = brute_correct(scores, labels, groups, order[:k + 1])
            sums[k] += Fraction(int(ok.sum()), ok.size)
    return [float(s / len(orders)) for s in sums]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("equal", [True, False])
def test_acc_e_expectation_equals_enumeration_of_all_orders(seed, equal):
    scores, labels, groups = random_problem(seed, equal=equal)
    if equal:
        assert len(set(np.bincount([next(g for g in range(4) if c in groups[g]) for c in labels]))) == 1
    res = ex.extensibility(scores, labels, groups, ALL4)
    exact = exact_expected_e(scores, labels, groups)
    assert res.expected_steps == pytest.approx(exact, abs=1e-12)
    # with every order enumerated the sampled value is the expectation
    assert res.steps == pytest.approx(exact, abs=1e-12)
    assert res.expected_mean == pytest.approx(res.mean, abs=1e-12)


def test_acc_e_expectation_unequal_sizes_beyond_table_is_none(monkeypatch):
    scores, labels, groups = random_problem(0, equal=False)
    monkeypatch.setattr(ex, "_TABLE_MAX_GROUPS", 2)
    res = ex.extensibility(scores, labels, groups, ALL4)
    assert res.expected_steps is None and res.expected_mean is None
    assert np.array_equal(res.per_order, brute_extensibility(scores, labels, groups, ALL4))


@pytest.mark.parametrize("seed", range(6))
def test_acc_s_matches_brute_force_and_closed_form(seed):
    scores, labels, groups = random_problem(seed, n_groups=5)
    G = len(groups)
    orders = ex.paper_orders(G, 100, seed=seed)  # (G-1)! = 24 <= 100: all orders per target
    assert orders.shape == (G * 24, G)
    per_target = []
    for t in range(G):
        rows = orders[orders[:, 0] == t]
        res = ex.stability(scores, labels, groups, t, rows)
        brute = brute_stability(scores, labels, groups, t, rows)
        assert np.array_equal(res.per_order, brute)
        # closed form vs the average over all (G-1)! distractor orders (every one of them is in `rows`)
        assert res.expected_steps == pytest.approx(brute.mean(axis=0), abs=1e-12)
        assert res.expected_mean == pytest.approx(res.mean, abs=1e-12)
        per_target.append(res.mean)
    allres = ex.stability_all(scores, labels, groups, orders)
    assert allres.per_target.tolist() == per_target
    assert allres.mean == pytest.approx(np.mean(per_target), abs=1e-15)
    assert allres.expected_mean == pytest.approx(allres.mean, abs=1e-12)


def test_acc_s_closed_form_is_the_binomial_ratio():
    # one image of group 0, beaten by b=2 of the G-1=4 other groups: P(j distractors harmless) = C(2,j)/C(4,j)
    groups = [[0], [1], [2], [3], [4]]
    scores = np.array([[1.0, 2.0, 3.0, 0.0, 0.0]])
    got = ex.stability_expected(scores, np.array([0]), groups, 0)
    assert got.tolist() == [math.comb(2, j) / math.comb(4, j) for j in range(1, 5)]


def test_acc_s_class_average_matches_authors_per_class_mean():
    scores, labels, groups = random_problem(3, n_groups=4, sizes=(2, 3))
    orders = ex.paper_orders(4, 10, seed=0)
    for t in range(4):
        rows = orders[orders[:, 0] == t]
        res = ex.stability(scores, labels, groups, t, rows, average="classes")
        for r, order in enumerate(rows):
            for j in range(1, 4):
                images, ok = brute_correct(scores, labels, groups, order[:j + 1])
                tl = labels[images]
                accs = [np.mean(ok[tl == c]) for c in groups[t] if (tl == c).any()]
                assert res.per_order[r, j - 1] == pytest.approx(np.mean(accs), abs=1e-12)
        exp = ex.stability_expected(scores, labels, groups, t, average="classes")
        assert exp == pytest.approx(res.steps, abs=1e-12)


def test_acc_e_first_step_is_acc_c_of_the_first_group():
    scores, labels, groups = random_problem(1)
    res = ex.extensibility(scores, labels, groups, ALL4)
    acc_c = ex.group_accuracy(scores, labels, groups)
    assert np.array_equal(res.per_order[:, 0], acc_c.per_group[ALL4[:, 0]])
    # the last step is the whole vocabulary: the same in every order
    assert len(set(res.per_order[:, -1].tolist())) == 1


# ---------------------------------------------------------------- orders


def test_sample_orders_enumerates_when_few():
    o = ex.sample_orders(3, 100, seed=0)
    assert o.tolist() == [list(p) for p in itertools.permutations(range(3))]
    o = ex.sample_orders(3, 6, seed=0)
    assert o.shape == (6, 3)
    first = ex.sample_orders(4, 6, seed=0, first=2)
    assert first.shape == (6, 4) and (first[:, 0] == 2).all()
    assert sorted(map(tuple, first[:, 1:].tolist())) == sorted(itertools.permutations([0, 1, 3]))
    # the paper's three-dataset case: only 6 orders in all, 2 per target
    po = ex.paper_orders(3, 100, seed=0)
    assert po.shape == (6, 3) and sorted(map(tuple, po.tolist())) == sorted(itertools.permutations(range(3)))


def test_sample_orders_is_seeded_and_uniform():
    a = ex.sample_orders(20, 100, seed=7)
    b = ex.sample_orders(20, 100, seed=7)
    c = ex.sample_orders(20, 100, seed=8)
    assert a.shape == (100, 20) and np.array_equal(a, b) and not np.array_equal(a, c)
    assert (np.sort(a, axis=1) == np.arange(20)).all()
    p1 = ex.paper_orders(20, 100, seed=1)
    assert p1.shape == (2000, 20) and np.array_equal(p1, ex.paper_orders(20, 100, seed=1))
    assert (p1.reshape(20, 100, 20)[:, :, 0] == np.arange(20)[:, None]).all()
    # rough uniformity: position of group 0 over many orders
    many = ex.sample_orders(8, 30000, seed=0)  # 8! = 40320 > 30000: sampled, not enumerated
    assert many.shape == (30000, 8)
    freq = np.bincount(np.argmax(many == 0, axis=1), minlength=8) / 30000
    assert np.abs(freq - 1 / 8).max() < 0.01


def test_large_equal_groups_sampled_close_to_expected():
    rng = np.random.default_rng(0)
    G, n = 20, 2000
    scores = rng.standard_normal((n, 100)).astype(np.float32)
    labels = np.repeat(np.arange(100), n // 100)
    scores[np.arange(n), labels] += 2
    groups = [list(range(5 * g, 5 * g + 5)) for g in range(G)]
    orders = ex.paper_orders(G, 20, seed=0)
    e = ex.extensibility(scores, labels, groups, orders)
    s = ex.stability_all(scores, labels, groups, orders)
    assert abs(e.mean - e.expected_mean) < 0.01 and abs(s.mean - s.expected_mean) < 0.01
    assert e.expected_steps[0] == pytest.approx(ex.group_accuracy(scores, labels, groups).mean, abs=1e-12)


# ---------------------------------------------------------------- bad input


S3 = np.zeros((2, 3))
Y3 = np.array([0, 2])


@pytest.mark.parametrize("groups, message", [
    ([[0, 1]], "class 2 is in no group"),
    ([[0, 1], [], [2]], "group 1 is empty"),
    ([[0, 1], [1, 2]], "class 1 is in group 0 and in group 1"),
    ([[0, 1, 2, 3]], "group 0 names class 3, outside [0, 3)"),
    ([[0, 0], [1, 2]], "lists class 0 more than once"),
    ([[0], [1], [2]], "group 1 has no images"),
    ([], "groups is empty"),
    ("abc", "groups must be a sequence"),
])
def test_bad_groups(groups, message):
    with pytest.raises(ex.ExtensibilityError) as err:
        ex.group_accuracy(S3, Y3, groups)
    assert message in str(err.value)
    assert isinstance(err.value, VlbenchError)


@pytest.mark.parametrize("labels, message", [
    (np.array([0, 3]), "label 3 of image 1 is outside [0, 3)"),
    (np.array([-1, 0]), "label -1 of image 0 is outside [0, 3)"),
    (np.array([0]), "labels must have shape (2,)"),
    (np.array([0.0, 1.0]), "labels must be integers"),
])
def test_bad_labels(labels, message):
    with pytest.raises(ex.ExtensibilityError, match=None) as err:
        ex.group_accuracy(S3, labels, [[0, 1], [2]])
    assert message in str(err.value)


def test_bad_scores_orders_and_targets():
    groups = [[0, 1], [2]]
    with pytest.raises(ex.ExtensibilityError, match="NaN"):
        ex.group_accuracy(np.array([[0.0, np.nan, 0.0], [0, 0, 0]]), Y3, groups)
    with pytest.raises(ex.ExtensibilityError, match="2-D"):
        ex.group_accuracy(np.zeros(3), Y3, groups)
    with pytest.raises(ex.ExtensibilityError, match="not a permutation"):
        ex.extensibility(S3, Y3, groups, np.array([[0, 0]]))
    with pytest.raises(ex.ExtensibilityError, match=r"\(R, 2\)"):
        ex.extensibility(S3, Y3, groups, np.array([0, 1]))
    with pytest.raises(ex.ExtensibilityError, match="not the target 1"):
        ex.stability(S3, Y3, groups, 1, np.array([[0, 1]]))
    with pytest.raises(ex.ExtensibilityError, match="target group 5"):
        ex.stability(S3, Y3, groups, 5, np.array([[0, 1]]))
    with pytest.raises(ex.ExtensibilityError, match="no order starts with group 1"):
        ex.stability_all(S3, Y3, groups, np.array([[0, 1]]))
    with pytest.raises(ex.ExtensibilityError, match="average"):
        ex.stability(S3, Y3, groups, 0, np.array([[0, 1]]), average="micro")
    with pytest.raises(ex.ExtensibilityError, match="n_orders"):
        ex.sample_orders(3, 0, seed=0)
    with pytest.raises(ex.ExtensibilityError, match="first group"):
        ex.sample_orders(3, 5, seed=0, first=3)


# ---------------------------------------------------------------- classes shared by several groups (merged names)


def brute_correct_shared(scores, labels, groups, vocab):
    """As brute_correct, for groups that may share classes: the vocabulary's classes are the union of its groups',
    its images those of these classes."""
    cols = np.unique(np.concatenate([np.asarray(groups[g]) for g in vocab]))
    images = np.flatnonzero(np.isin(labels, cols))
    pred = cols[np.argmax(scores[np.ix_(images, cols)], axis=1)]
    return images, pred == labels[images]


def shared_problem(seed, n_groups=4, n_images=40):
    """Random groups over C classes where some classes are in two or three groups; every group has images."""
    rng = np.random.default_rng(seed)
    scores, labels, groups = random_problem(seed, n_groups=n_groups, n_images=n_images)
    C = scores.shape[1]
    for c in rng.choice(C, 2, replace=False):  # two classes joined to further groups
        for g in rng.choice(n_groups, 2, replace=False):
            if c not in groups[g]:
                groups[g] = sorted(groups[g] + [int(c)])
    return scores, labels, groups


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("path", ["table", "direct"])
def test_shared_classes_match_brute_force(seed, path, monkeypatch):
    if path == "direct":
        monkeypatch.setattr(ex, "_TABLE_MAX_GROUPS", 0)
        monkeypatch.setattr(ex, "_CHUNK", 64)
    scores, labels, groups = shared_problem(seed)
    assert sum(len(g) for g in groups) > scores.shape[1]  # some class really is in several groups
    with pytest.raises(ex.ExtensibilityError, match="must not overlap"):
        ex.group_accuracy(scores, labels, groups)
    acc_c = ex.group_accuracy(scores, labels, groups, overlap=True)
    assert acc_c.per_group.tolist() == [np.mean(brute_correct_shared(scores, labels, groups, [g])[1]) for g in range(4)]
    res = ex.extensibility(scores, labels, groups, ALL4, overlap=True)
    brute = np.array([[np.mean(brute_correct_shared(scores, labels, groups, o[:k + 1])[1]) for k in range(4)]
                      for o in ALL4])
    assert np.array_equal(res.per_order, brute)
    if path == "table":  # the exact expectation enumerates the subsets (no closed form with shared classes)
        assert res.expected_steps == pytest.approx(brute.mean(axis=0), abs=1e-12)
    for t in range(4):
        rows = ALL4[ALL4[:, 0] == t]
        s = ex.stability(scores, labels, groups, t, rows, overlap=True)
        tcls = np.asarray(groups[t])
        for r, o in enumerate(rows):
            for j in range(1, 4):
                images, ok = brute_correct_shared(scores, labels, groups, o[:j + 1])
                assert s.per_order[r, j - 1] == pytest.approx(np.mean(ok[np.isin(labels[images], tcls)]), abs=1e-15)
        assert s.expected_steps == pytest.approx(s.steps, abs=1e-12)


# ---------------------------------------------------------------- Acc-E averaged over groups


@pytest.mark.parametrize("seed", range(5))
def test_acc_e_group_average_matches_brute_force_and_closed_form(seed):
    scores, labels, groups = random_problem(seed)  # unequal image counts per group
    sizes = [np.isin(labels, g).sum() for g in groups]
    assert len(set(sizes)) > 1
    res = ex.extensibility(scores, labels, groups, ALL4, average="groups")
    brute = np.empty(ALL4.shape)
    for r, o in enumerate(ALL4):
        for k in range(4):
            images, ok = brute_correct(scores, labels, groups, o[:k + 1])
            brute[r, k] = np.mean([np.mean(ok[np.isin(labels[images], groups[g])]) for g in o[:k + 1]])
    assert res.per_order == pytest.approx(brute, abs=1e-12)
    assert res.expected_steps == pytest.approx(brute.mean(axis=0), abs=1e-12)  # closed form = all orders
    micro = ex.extensibility(scores, labels, groups, ALL4)
    assert not np.allclose(micro.per_order, res.per_order)


def test_acc_e_group_average_equals_micro_with_equal_counts():
    scores, labels, groups = random_problem(2, equal=True)
    a = ex.extensibility(scores, labels, groups, ALL4, average="groups")
    b = ex.extensibility(scores, labels, groups, ALL4)
    assert np.array_equal(a.per_order, b.per_order) and a.expected_steps == pytest.approx(b.expected_steps)
    with pytest.raises(ex.ExtensibilityError, match="partition"):
        ex.extensibility(*shared_problem(0), ALL4, average="groups", overlap=True)
    with pytest.raises(ex.ExtensibilityError, match="Acc-E average"):
        ex.extensibility(scores, labels, groups, ALL4, average="classes")


# ---------------------------------------------------------------- the authors' procedure


def test_authors_orders_are_numpys_global_seed_42_sequence():
    names = ["aquatic_mammals", "fish", "flowers", "food_containers", "fruit_and_vegetables"]
    state = np.random.get_state()
    try:
        np.random.seed(42)
        expect = []
        for target in names:  # main.py: for each target, --trials permutations of the others (list of names)
            others = [n for n in names if n != target]
            expect += [[target] + np.random.permutation(others).tolist() for _ in range(3)]
    finally:
        np.random.set_state(state)
    got = ex.authors_orders(5, 3)
    assert [[names[g] for g in row] for row in got] == expect


def authors_replica(scores, labels, groups, trials, class_average=True):
    """main.py's incremental_evaluation written out with brute-force argmax (acc carried over between trials)."""
    G = len(groups)
    orders = ex.authors_orders(G, trials)
    acc_c, acc_e, acc_s = [], [], []
    for t in range(G):
        images, ok = brute_correct_shared(scores, labels, groups, [t])
        acc = np.mean(ok)
        acc_c.append(acc)
        e_local, s_local = [], []
        for i in range(trials):
            order = orders[t * trials + i]
            e_trial, s_trial = [acc], []
            for j in range(1, G):
                images, ok = brute_correct_shared(scores, labels, groups, order[:j + 1])
                acc = np.mean(ok)
                per_class = [np.mean(ok[labels[images] == c]) for c in groups[t]]
                e_trial.append(acc)
                s_trial.append(np.mean(per_class))
            e_local.append(np.mean(e_trial))
            s_local.append(np.mean(s_trial))
        acc_e.append(np.mean(e_local))
        acc_s.append(np.mean(s_local))
    return np.mean(acc_c), np.mean(acc_e), np.mean(acc_s), acc_e


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shared", [False, True])
def test_authors_protocol_matches_a_replica_of_their_loop(seed, shared):
    scores, labels, groups = shared_problem(seed) if shared else random_problem(seed)
    for c in range(scores.shape[1]):  # their per-class accuracy needs images of every class
        labels[c] = c
    got = ex.authors_protocol(scores, labels, groups, trials=3, overlap=shared)
    acc_c, acc_e, acc_s, per_target = authors_replica(scores, labels, groups, 3)
    assert (got.acc_c, got.acc_e, got.acc_s) == pytest.approx((acc_c, acc_e, acc_s), abs=1e-12)
    assert got.acc_e_per_target == pytest.approx(per_target, abs=1e-12)
    # the start step: trial 0 starts with Acc-C of the target, later trials with the whole vocabulary's accuracy
    assert got.steps_e[:, 0, 0] == pytest.approx(got.acc_c_per_target)
    assert (got.steps_e[:, 1:, 0] == got.steps_e[0, 0, -1]).all()


# ---------------------------------------------------------------- many groups: the scan against the former products


def former_step_accuracies(p, orders, average):
    """The implementation before the scan (one product per order and prefix over every image), kept here as the
    reference: (R, G) accuracies."""
    R, G = orders.shape
    prefix = ex._prefix_indicator(orders, G)  # (R, G, G)
    q = prefix.reshape(R * G, G).T.astype(np.float32)
    beats, own = p.beats.astype(np.float32), p.own.astype(np.float32)
    alive, present = (beats @ q) == 0, (own @ q) > 0  # (n, R*G)
    if average == "groups" and not (p.sizes == p.sizes[0]).all():
        per_group = (own.T @ (alive & present).astype(np.float32)).T.astype(np.int64).reshape(R, G, G)
        acc = per_group / p.sizes[None, None, :]
        return (acc * prefix).sum(axis=2) / prefix.sum(axis=2)
    return ((alive & present).sum(axis=0) / present.sum(axis=0)).reshape(R, G)


def former_stability(p, target, orders):
    R, G = orders.shape
    members = np.flatnonzero(p.own[:, target])
    prefix = ex._prefix_indicator(orders, G)[:, 1:, :].reshape(R * (G - 1), G)
    alive = (p.beats[members].astype(np.float32) @ prefix.T.astype(np.float32)) == 0
    return (alive.sum(axis=0) / members.size).reshape(R, G - 1)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("chunk", [64 * 3, 1 << 23])  # one order per chunk (with 3 words of images), all at once
def test_scan_equals_the_former_products_with_many_groups(seed, chunk, monkeypatch):
    monkeypatch.setattr(ex, "_CHUNK", chunk)
    G = 28  # above the subset-table limit: the scan runs
    assert G > ex._TABLE_MAX_GROUPS
    scores, labels, groups = random_problem(seed, n_groups=G, sizes=(1, 4), n_images=100, ties=True)
    orders = ex.paper_orders(G, 3, seed)
    p = ex._prepare(scores, labels, groups)
    assert p.partition and not (p.sizes == p.sizes[0]).all()
    for average in ex.AVERAGES_E:
        got = ex.extensibility(scores, labels, groups, orders, average=average).per_order
        assert np.array_equal(got, former_step_accuracies(p, orders, average))  # bit-identical
    got = ex.stability_all(scores, labels, groups, orders)
    for t, res in enumerate(got.targets):
        assert np.array_equal(res.per_order, former_stability(p, t, orders[orders[:, 0] == t]))
    # classes shared by several groups (images enter with any group listing their class), and images given a group
    shared = [sorted(set(g) | {groups[(i + 1) % G][0]}) for i, g in enumerate(groups)]
    ps = ex._prepare(scores, labels, shared, overlap=True)
    assert not ps.partition
    got = ex.extensibility(scores, labels, shared, orders, overlap=True).per_order
    assert np.array_equal(got, former_step_accuracies(ps, orders, "images"))
    first = np.array([next(g for g in range(G) if y in groups[g]) for y in labels])
    pf = ex._prepare(scores, labels, shared, overlap=True, image_group=first)
    for average in ex.AVERAGES_E:
        got = ex.extensibility(scores, labels, shared, orders, average, overlap=True, image_group=first).per_order
        assert np.array_equal(got, former_step_accuracies(pf, orders, average))
