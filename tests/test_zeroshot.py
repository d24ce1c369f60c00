import ast

import numpy as np
import pyarrow as pa
import pytest

from tests.test_imports import imports, project_modules
from vlbench.analyses.zeroshot import evaluate_zeroshot
from vlbench.analyses.zeroshot_classifier import class_weights, zeroshot_logits
from vlbench.datasets.canonical import ClassInfo, DatasetMeta


def test_class_weights_average_normalised_prompts_then_renormalise():
    # class 0: prompts (3, 0) and (0, 1) -> normalised (1,0),(0,1) -> mean (.5,.5) -> (1/sqrt2, 1/sqrt2)
    # class 1: one prompt (0, -2) -> (0, -1)
    text = np.array([[3.0, 0.0], [0.0, 1.0], [0.0, -2.0]])
    w = class_weights(text, np.array([0, 0, 1]), 2)
    np.testing.assert_allclose(w, [[2 ** -0.5, 2 ** -0.5], [0.0, -1.0]], atol=1e-6)


def test_logits_are_100_times_cosine():
    w = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    logits = zeroshot_logits(np.array([[2.0, 2.0], [0.0, 5.0]]), w)
    np.testing.assert_allclose(logits, [[100 * 2 ** -0.5, 100 * 2 ** -0.5], [0.0, 100.0]], rtol=1e-5)


def test_class_without_prompt_is_an_error():
    with pytest.raises(ValueError, match=r"class indices \[2\]"):
        class_weights(np.eye(2), np.array([0, 1]), 3)


def _meta(task="single-label", metric="accuracy", n=3):
    return DatasetMeta(name="d", task=task, metric=metric, classes=[ClassInfo(i, f"c{i}") for i in range(n)])


def test_evaluate_zeroshot_accuracy_and_predictions():
    text = pa.table({"class_index": [0, 1, 2], "source": ["template"] * 3, "text": ["a", "b", "c"]})
    text_emb = np.eye(3, dtype=np.float32)
    images = pa.table({"sample_id": ["x", "y", "z", "w"], "label": [0, 1, 2, 2]})
    image_emb = np.array([[1, 0.1, 0], [0, 1, 0], [0.2, 0, 1], [1, 0, 0.5]], dtype=np.float32)  # last one wrong
    metrics, preds = evaluate_zeroshot(images, image_emb, text, text_emb, _meta())
    assert metrics == {"accuracy": pytest.approx(0.75)}
    assert preds.column("predicted").to_pylist() == [0, 1, 2, 0]
    assert preds.column("predicted_name").to_pylist() == ["c0", "c1", "c2", "c0"]
    assert preds.column("predicted_logit").to_pylist()[1] == pytest.approx(100.0)
    assert len(preds.column("logits")[0].as_py()) == 3


def test_evaluate_zeroshot_multilabel_uses_map():
    text = pa.table({"class_index": [0, 1], "source": ["template"] * 2, "text": ["a", "b"]})
    images = pa.table({"sample_id": ["x", "y"], "labels": [[0], [0, 1]]})
    emb = np.array([[1, 0], [0.5, 1]], dtype=np.float32)
    metrics, _ = evaluate_zeroshot(images, emb, text, np.eye(2, dtype=np.float32), _meta("multi-label", "map_11point", 2))
    assert metrics == {"map_11point": pytest.approx(1.0)}


def test_evaluate_zeroshot_mean_per_class_also_reports_accuracy():
    text = pa.table({"class_index": [0, 1], "source": ["template"] * 2, "text": ["a", "b"]})
    images = pa.table({"sample_id": list("abcd"), "label": [0, 0, 0, 1]})
    emb = np.array([[1, 0], [1, 0], [1, 0], [1, 0.1]], dtype=np.float32)  # always predicts class 0
    metrics, _ = evaluate_zeroshot(images, emb, text, np.eye(2, dtype=np.float32), _meta(metric="mean_per_class", n=2))
    assert metrics == {"mean_per_class": pytest.approx(0.5), "accuracy": pytest.approx(0.75)}


# ---------------------------------------------------------------- zeroshot.scoring: logits | elevater


def _two_class_texts():
    return pa.table({"class_index": [0, 1], "source": ["template"] * 2, "text": ["a", "b"]}), np.eye(2, 3, dtype=np.float32)


def _unit_rows(cosines) -> np.ndarray:
    """Unit image embeddings whose cosines with the class weights e0, e1 are `cosines` (the rest in a third axis)."""
    c = np.asarray(cosines, dtype=np.float64)
    return np.c_[c, np.sqrt(1 - (c ** 2).sum(1))].astype(np.float32)


# Five images, two classes (VOC-style multi-label). Cosines (class 0, class 1) and positives:
#   A (.08, .06) {1}   B (.06, 0) {0}   C (0, .06) {1}   D (.028, 0) {0}   E (0, 0) {0}
VOC_COSINES = [[0.08, 0.06], [0.06, 0.0], [0.0, 0.06], [0.028, 0.0], [0.0, 0.0]]
VOC_LABELS = [[1], [0], [1], [0], [0]]
# logits (ranking by cosine), VOC devkit 11-point AP:
#   class 0: A(neg) > B > D > {C(neg), E} tied: precisions 0, 1/2 (R 1/3), 2/3 (R 2/3), 3/5 (R 1)
#            r = 0..0.6 -> 2/3 (7 points), r = 0.7..1 -> 3/5 (4 points): AP = (14/3 + 12/5)/11 = 106/165
#   class 1: {A, C} tied on top: AP 1                                   -> mAP = (106/165 + 1)/2 = 271/330
# elevater (softmax per image: class 0 ranks by c0 - c1 = .02, .06, -.06, .028, 0):
#   class 0: B > D > A(neg) > E > C(neg): precisions 1 (R 1/3), 1 (R 2/3), 2/3, 3/4 (R 1), 3/5
#            r = 0..0.6 -> 1 (7 points), r = 0.7..1 -> 3/4 (4 points): AP = 10/11
#   class 1: C > E(neg) > A > D > B: precisions 1 (R 1/2), 1/2, 2/3 (R 1), ...
#            r = 0..0.5 -> 1 (6 points), r = 0.6..1 -> 2/3 (5 points): AP = 28/33  -> mAP = (10/11 + 28/33)/2 = 29/33
VOC_MAP = {"logits": 271 / 330, "elevater": 29 / 33}


def _voc_meta():
    return DatasetMeta(name="voc", task="multi-label", metric="map_11point", classes=[ClassInfo(0, "a"), ClassInfo(1, "b")])


def _elevater_11point_reference(probabilities: np.ndarray, targets: np.ndarray) -> float:
    """ELEVATER's 11-point mAP computed independently: scikit-learn's precision-recall curve, its (recall 0,
    precision 1) end point kept, max precision at recall >= r for r = 0, .1, ..., 1, mean over classes."""
    from sklearn.metrics import precision_recall_curve

    aps = []
    for j in range(targets.shape[1]):
        precision, recall, _ = precision_recall_curve(targets[:, j], probabilities[:, j])
        aps.append(np.mean([precision[recall >= r - 1e-12].max() for r in np.arange(11) / 10]))
    return float(np.mean(aps))


@pytest.mark.parametrize("scoring", ["logits", "elevater"])
def test_scoring_changes_voc_11point_map_as_computed_by_hand(scoring):
    text, text_emb = _two_class_texts()
    images = pa.table({"sample_id": list("ABCDE"), "labels": VOC_LABELS})
    metrics, preds = evaluate_zeroshot(images, _unit_rows(VOC_COSINES), text, text_emb, _voc_meta(), scoring)
    assert metrics == {"map_11point": pytest.approx(VOC_MAP[scoring], abs=1e-12)}
    # the predictions keep the logits (100 * cosine) whatever the scoring
    assert preds.column("logits")[0].as_py() == pytest.approx([8.0, 6.0], rel=1e-5)


def test_elevater_scoring_matches_an_independent_softmax_and_sklearn_computation():
    from vlbench.metrics import multilabel_indicator

    text, text_emb = _two_class_texts()
    images = pa.table({"sample_id": list("ABCDE"), "labels": VOC_LABELS})
    metrics, _ = evaluate_zeroshot(images, _unit_rows(VOC_COSINES), text, text_emb, _voc_meta(), "elevater")
    logits = 100 * np.asarray(VOC_COSINES)
    probabilities = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    expected = _elevater_11point_reference(probabilities, multilabel_indicator(VOC_LABELS, 2))
    assert expected == pytest.approx(29 / 33)
    assert metrics["map_11point"] == pytest.approx(expected, abs=1e-12)


def test_elevater_scoring_uses_the_toolkits_recall_zero_point():
    """A class whose top-ranked image is a negative: the VOC devkit's r = 0 term is the best precision (1/2),
    ELEVATER's is 1 (scikit-learn's end point). Under softmax class 0 ranks by c0 - c1, the same order here."""
    text, text_emb = _two_class_texts()
    images = pa.table({"sample_id": ["neg", "pos"], "labels": [[1], [0, 1]]})
    emb = _unit_rows([[0.05, 0.0], [0.02, 0.0]])  # class 0: neg first, then pos; class 1: tied, AP 1
    meta = _voc_meta()
    logits_map, _ = evaluate_zeroshot(images, emb, text, text_emb, meta, "logits")
    elevater_map, _ = evaluate_zeroshot(images, emb, text, text_emb, meta, "elevater")
    # class 0: precision 0 at the first image, 1/2 (recall 1) after the second; class 1: AP 1
    assert logits_map["map_11point"] == pytest.approx((0.5 + 1) / 2)
    assert elevater_map["map_11point"] == pytest.approx(((1 + 10 * 0.5) / 11 + 1) / 2)


def test_elevater_roc_auc_ties_probabilities_that_round_to_one_in_float32():
    """Hateful Memes' ROC-AUC. softmax(100 * cos) of class 1 is 1.0 in float32 once c1 - c0 exceeds ~0.17, so
    ELEVATER's probabilities tie two images that the logits tell apart.
    Images (c1 - c0, label): p1 (.5, 1), n1 (.3, 0), p2 (.05, 1), n2 (-.1, 0).
    logits: p1 > n1 > p2 > n2: pairs (p1,n1) (p1,n2) (p2,n2) won, (p2,n1) lost -> 3/4.
    elevater: p1 and n1 both 1.0 -> that pair counts 1/2 -> 2.5/4."""
    from sklearn.metrics import roc_auc_score

    meta = DatasetMeta(name="memes", task="single-label", metric="roc_auc", classes=[ClassInfo(0, "no"), ClassInfo(1, "yes")])
    text, text_emb = _two_class_texts()
    cosines = [[0.1, 0.6], [0.2, 0.5], [0.3, 0.35], [0.4, 0.3]]
    images = pa.table({"sample_id": ["p1", "n1", "p2", "n2"], "label": [1, 0, 1, 0]})
    emb = _unit_rows(cosines)
    logits_result, _ = evaluate_zeroshot(images, emb, text, text_emb, meta, "logits")
    elevater_result, _ = evaluate_zeroshot(images, emb, text, text_emb, meta, "elevater")
    assert logits_result["roc_auc"] == pytest.approx(0.75)
    assert elevater_result["roc_auc"] == pytest.approx(0.625)
    # independently: float32 softmax of class 1, scikit-learn's AUC (what the toolkit's roc_auc does)
    logits32 = (100 * np.asarray(cosines)).astype(np.float32)
    p1 = np.exp(logits32[:, 1] - logits32.max(1)) / np.exp(logits32 - logits32.max(1, keepdims=True)).sum(1)
    assert p1[0] == p1[1] == np.float32(1.0)
    assert elevater_result["roc_auc"] == pytest.approx(roc_auc_score([1, 0, 1, 0], p1))
    assert logits_result["roc_auc"] == pytest.approx(roc_auc_score([1, 0, 1, 0], logits32[:, 1] - logits32[:, 0]))


@pytest.mark.parametrize("metric", ["accuracy", "mean_per_class"])
def test_accuracy_and_mean_per_class_do_not_depend_on_the_scoring(metric):
    rng = np.random.default_rng(0)
    n_classes = 5
    text = pa.table({"class_index": list(range(n_classes)), "source": ["template"] * n_classes,
                     "text": [f"c{i}" for i in range(n_classes)]})
    text_emb = rng.normal(size=(n_classes, 16)).astype(np.float32)
    image_emb = rng.normal(size=(60, 16)).astype(np.float32)
    images = pa.table({"sample_id": [f"s{i}" for i in range(60)], "label": rng.integers(0, n_classes, 60)})
    meta = _meta(metric=metric, n=n_classes)
    by_logits, _ = evaluate_zeroshot(images, image_emb, text, text_emb, meta, "logits")
    by_elevater, _ = evaluate_zeroshot(images, image_emb, text, text_emb, meta, "elevater")
    assert by_logits == by_elevater
    assert 0 < by_logits[metric] < 1


def test_run_records_the_scoring_and_refuses_an_unknown_one():
    from types import SimpleNamespace

    from vlbench.analyses.zeroshot import run
    from vlbench.features import Features
    from vlbench.params import ParamsError

    text, text_emb = _two_class_texts()
    images = pa.table({"sample_id": list("ABCDE"), "labels": VOC_LABELS})
    inputs = SimpleNamespace(
        meta=_voc_meta(),
        images=lambda split: Features(images, _unit_rows(VOC_COSINES), {}, []),
        texts=lambda name: Features(text, text_emb, {}, []),
    )
    default = run(inputs, {"split": "test"}, seed=0)
    elevater = run(inputs, {"split": "test", "scoring": "elevater"}, seed=0)
    assert default.params["scoring"] == "logits" and elevater.params["scoring"] == "elevater"
    assert default.metrics["map_11point"] == pytest.approx(VOC_MAP["logits"])
    assert elevater.metrics["map_11point"] == pytest.approx(VOC_MAP["elevater"])
    with pytest.raises(ParamsError, match=r"zeroshot.scoring 'softmax' is not one of \['logits', 'elevater'\]"):
        run(inputs, {"split": "test", "scoring": "softmax"}, seed=0)


def test_run_writes_a_bootstrap_interval_of_each_headline_metric():
    from types import SimpleNamespace

    from vlbench import stats
    from vlbench.analyses.zeroshot import run
    from vlbench.features import Features

    rng = np.random.default_rng(3)
    n, c = 300, 4
    text_emb = np.eye(c, 8, dtype=np.float32)
    text = pa.table({"class_index": list(range(c)), "source": ["template"] * c, "text": list("abcd")})
    labels = rng.integers(0, c, n)
    image_emb = (np.eye(c, 8)[labels] + rng.normal(0, 0.6, (n, 8))).astype(np.float32)
    images = pa.table({"sample_id": [f"s{i}" for i in range(n)], "label": labels})
    inputs = SimpleNamespace(meta=_meta(metric="mean_per_class", n=c),
                             images=lambda split: Features(images, image_emb, {}, []),
                             texts=lambda name: Features(text, text_emb, {}, []))
    result = run(inputs, {"split": "test"}, seed=7)
    assert set(result.intervals) == {"mean_per_class", "accuracy"}
    correct = (image_emb[:, :c]).argmax(axis=1) == labels  # cosine with a one-hot class weight: the first c dims
    for metric in ("mean_per_class", "accuracy"):
        expected = stats.bootstrap_sample_metric(metric, correct, labels, seed=7).to_json()
        assert result.intervals[metric] == expected
        assert expected["low"] < result.metrics[metric] < expected["high"]
        assert expected["resamples"] == stats.RESAMPLES and expected["method"] == "bootstrap"


def test_classes_with_identical_prompts_are_reported_with_what_their_ties_decide():
    """Two classes whose prompts are the same texts (CLIP_benchmark's two "missile" classes) get one class weight:
    every image scores them exactly alike. vlbench's top-1 takes the lower index; DataComp's acc1 takes torch.topk's
    order, unspecified on ties (the higher index in the worst case). The result says which classes, how many images
    have a tied top logit, and on how many the convention decides the hit (the two orders disagree on exactly those
    images, so their accuracies differ by at most that many)."""
    from types import SimpleNamespace

    from vlbench.analyses.zeroshot import identical_prompts, run
    from vlbench.features import Features

    rng = np.random.default_rng(5)
    n, c = 400, 4
    names = ["missile", "tank", "missile", "boat"]  # classes 0 and 2 share every prompt
    prompts = [f"a photo of a {name}." for name in names] + [f"a {name}." for name in names]
    text = pa.table({"class_index": list(range(c)) * 2, "source": ["template"] * 2 * c, "text": prompts})
    base = rng.normal(size=(c, 16))
    base[2] = base[0]
    text_emb = np.concatenate([base, base]).astype(np.float32)
    labels = rng.integers(0, c, n)
    image_emb = (base[labels] + rng.normal(0, 0.8, (n, 16))).astype(np.float32)
    images = pa.table({"sample_id": [f"s{i}" for i in range(n)], "label": labels})
    meta = DatasetMeta(name="d", task="single-label", metric="accuracy",
                       classes=[ClassInfo(index=i, name=f"{name}{i}") for i, name in enumerate(names)])
    inputs = SimpleNamespace(meta=meta, images=lambda split: Features(images, image_emb, {}, []),
                             texts=lambda name: Features(text, text_emb, {}, []))
    assert identical_prompts(text, c) == [[0, 2]]
    result = run(inputs, {"split": "test"}, seed=0)
    ties = result.details["ties"]
    logits = zeroshot_logits(image_emb, class_weights(text_emb, np.array(list(range(c)) * 2), c))
    lower = logits.argmax(axis=1)  # vlbench: the first of the tied columns
    higher = c - 1 - logits[:, ::-1].argmax(axis=1)  # a topk that orders ties the other way
    assert result.metrics["accuracy"] == pytest.approx(np.mean(lower == labels))
    at_top = logits == logits.max(axis=1, keepdims=True)
    assert ties["identical_prompts"] == [["missile0", "missile2"]] and ties["convention"] == "lowest class index"
    assert ties["tied_top1"] == int((at_top.sum(axis=1) > 1).sum()) == int(np.isin(lower, [0, 2]).sum()) > 0
    assert ties["decided_by_tie"] == int((np.isin(lower, [0, 2]) & np.isin(labels, [0, 2])).sum()) > 0
    # each decided image is a hit under one order and a miss under the other; no other image changes
    assert int(np.sum((lower == labels) != (higher == labels))) == ties["decided_by_tie"]
    assert abs(np.mean(lower == labels) - np.mean(higher == labels)) <= ties["decided_by_tie"] / n
    # a dataset whose classes all differ in their prompts reports nothing
    distinct = pa.table({"class_index": list(range(c)), "source": ["template"] * c, "text": list("abcd")})
    assert identical_prompts(distinct, c) == []


# ---------------------------------------------------------------------------------------------------- the two modules
CLASSIFIER, ANALYSIS = "vlbench.analyses.zeroshot_classifier", "vlbench.analyses.zeroshot"


def test_zero_shot_scoring_is_two_modules_and_the_classifier_imports_neither_the_analysis_nor_a_metric():
    """What zero-shot scores reads in one direction: the analysis (scores, the dataset metric, intervals, variants)
    imports the classifier (class weights, logits), which imports nothing of the project but its errors."""
    found = imports(project_modules())
    assert (ANALYSIS, CLASSIFIER) in {(importer, target) for importer, target, _, _ in found}
    assert sorted({target for importer, target, _, _ in found if importer == CLASSIFIER}) == ["vlbench.errors"]


def _references(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _used_from(path, names: set[str]) -> set[str]:
    """The names of `names` that the module in `path` uses: imported by name, or as an attribute of the classifier
    imported whole (`from vlbench.analyses import zeroshot_classifier`, `import ... as x`)."""
    tree = ast.parse(path.read_text())
    taken, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            taken |= {alias.name for alias in node.names if node.module == CLASSIFIER}
            bound |= {alias.asname or alias.name for alias in node.names if f"{node.module}.{alias.name}" == CLASSIFIER}
        elif isinstance(node, ast.Import):
            bound |= {alias.asname for alias in node.names if alias.name == CLASSIFIER and alias.asname}
    attributes = {n.attr for n in ast.walk(tree)
                  if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in bound}
    return (taken | attributes) & names


def test_the_classifier_holds_only_what_modules_besides_the_analysis_use():
    """A name of the classifier is there because a module other than the zero-shot analysis uses it, or a name so
    used needs it; what only the analysis uses lives in the analysis (no call into the classifier and back)."""
    modules = project_modules()
    tree = ast.parse(modules[CLASSIFIER].read_text())
    defines = {}
    for node in tree.body:
        targets = ([node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else
                   [t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else [])
        defines.update({name: _references(node) for name in targets})
    shared = set().union(*(_used_from(path, set(defines)) for m, path in modules.items()
                           if m not in (CLASSIFIER, ANALYSIS)))
    todo = list(shared)
    while todo:
        needed = defines[todo.pop()] & set(defines) - shared
        shared |= needed
        todo += needed
    only_the_analysis = sorted(set(defines) - shared)
    assert not only_the_analysis, f"used only by {ANALYSIS} (move them there): {only_the_analysis}"
