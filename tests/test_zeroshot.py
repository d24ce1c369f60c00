import numpy as np
import pyarrow as pa
import pytest

from vlbench.analyses.zeroshot import class_weights, evaluate_zeroshot, zeroshot_logits
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
