"""The specificity analysis: AP against scikit-learn (ties included), the chance level against brute force, the
negative samplers, a whole run on hand-made features checked image by image against scikit-learn, the heat map, and
the stages in a temporary pipeline repository."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from sklearn.metrics import average_precision_score

from vlbench.analyses import specificity as sp
from vlbench.datasets.canonical import ClassInfo, DatasetMeta

DVC = (sys.executable, "-m", "dvc")


# --------------------------------------------------------------------------------------------------------------
# Metrics


def test_average_precision_matches_sklearn_with_ties_and_padding():
    rng = np.random.default_rng(0)
    for trial in range(200):
        k = int(rng.integers(2, 30))
        scores = rng.integers(0, 6, size=k).astype(np.float64) / 5 if trial % 2 else rng.standard_normal(k)
        positive = rng.random(k) < 0.3
        positive[rng.integers(k)] = True
        pad = int(rng.integers(0, 5))
        row = np.concatenate([scores, np.full(pad, np.nan)])
        mask = np.concatenate([positive, rng.random(pad) < 0.5])  # padded cells never count, whatever they say
        got = sp.average_precision_rows(row[None], mask[None])[0]
        assert got == pytest.approx(average_precision_score(positive, scores), abs=1e-12)


def test_all_tied_scores_give_the_positive_fraction_and_rows_without_positives_nan():
    got = sp.average_precision_rows(np.array([[0.5, 0.5, 0.5, 0.5], [1.0, 0.0, np.nan, np.nan]]),
                                    np.array([[True, False, False, False], [False, False, True, True]]))
    assert got[0] == pytest.approx(0.25) and np.isnan(got[1])


def brute_force_expected_ap(r: int, n: int) -> float:
    aps = []
    for positions in itertools.combinations(range(n), r):
        ranks = np.array(positions) + 1
        aps.append(np.mean(np.arange(1, r + 1) / ranks))
    return float(np.mean(aps))


@pytest.mark.parametrize("r, n", [(1, 1), (1, 2), (1, 7), (2, 5), (3, 8), (5, 9), (4, 4), (2, 12)])
def test_expected_random_ap_is_exact(r, n):
    assert sp.expected_random_ap(r, n) == pytest.approx(brute_force_expected_ap(r, n), abs=1e-12)


def test_expected_random_ap_is_vectorised_and_refuses_impossible_counts():
    got = sp.expected_random_ap(np.array([1, 5]), np.array([101, 105]))
    assert got[0] == pytest.approx(sum(1 / k for k in range(1, 102)) / 101)
    assert 0.05 < got[1] < 0.09
    with pytest.raises(ValueError, match="1 <= n_pos <= n_total"):
        sp.expected_random_ap(3, 2)


# --------------------------------------------------------------------------------------------------------------
# Grouping and sampling


def test_padded_groups_keep_table_order_limit_and_ignore_other_images():
    owners = np.array(["b", "a", "x", "b", "a", "b"], dtype=object)
    got = sp.padded_groups(owners, np.array(["a", "b", "c"], dtype=object))
    assert got.tolist() == [[1, 4, -1], [0, 3, 5], [-1, -1, -1]]
    assert sp.padded_groups(owners, np.array(["a", "b"], dtype=object), limit=2).tolist() == [[1, 4], [0, 3]]
    assert sp.class_positives([[2], [], [0, 2]], {0: 5, 2: 7}).tolist() == [[7, -1], [-1, -1], [5, 7]]


def caption_world():
    """6 images, 3 captions each; image 4's first caption repeats image 0's text (another case)."""
    texts = [f"caption {i}.{j}" for i in range(6) for j in range(3)]
    texts[12] = "CAPTION 0.0"
    image = np.repeat(np.arange(6), 3)
    ids = sp.text_ids(texts)
    own = np.where(sp.padded_groups(image.astype(str).astype(object), np.arange(6).astype(str).astype(object)) >= 0,
                   ids[np.arange(18).reshape(6, 3)], -1)
    return texts, image, ids, own


def test_random_negatives_are_distinct_other_images_captions_with_other_texts():
    _, image, ids, own = caption_world()
    got = sp.sample_caption_negatives(image, ids, own, 10, np.random.default_rng(0))
    assert got.shape == (6, 10)
    for i, row in enumerate(got):
        assert len(set(row.tolist())) == 10 and (row >= 0).all()
        assert not (image[row] == i).any()
        assert not set(ids[row].tolist()) & set(own[i].tolist())
    assert 12 not in got[0] and 0 not in got[4]  # the repeated text is never a negative of either image
    short = sp.sample_caption_negatives(image, ids, own, 16, np.random.default_rng(0))
    assert (short[0] >= 0).sum() == 14 and (short[1] >= 0).sum() == 15  # 15 others, one with image 0's text


def test_relevant_negatives_come_only_from_allowed_images_and_draws_are_uniform():
    _, image, ids, own = caption_world()
    allowed = sp.share_a_class([[0], [0, 1], [1], [2], [2], []], 3)
    assert allowed[0].tolist() == [True, True, False, False, False, False]
    got = sp.sample_caption_negatives(image, ids, own, 5, np.random.default_rng(1), allowed)
    assert sorted(got[0][got[0] >= 0].tolist()) == [3, 4, 5]
    assert (got[5] == -1).all()
    counts = np.zeros(18)
    rng = np.random.default_rng(2)
    for _ in range(1500):
        counts[sp.sample_caption_negatives(image, ids, own, 1, rng)[2, 0]] += 1
    drawn = counts[np.r_[0:6, 9:18]]
    assert counts[6:9].sum() == 0 and drawn.min() > 60 and drawn.max() < 150  # 15 captions, 100 expected each


# --------------------------------------------------------------------------------------------------------------
# A whole run on hand-made features


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


class FakeInputs:
    """What `run` reads: the dataset's meta, image features of one split, text features by set."""

    def __init__(self, tmp: Path, meta, images, sets, split="test"):
        self.meta, self.texts_dir, self._images, self._sets, self._split = meta, tmp, images, sets, split
        tmp.mkdir(parents=True, exist_ok=True)
        for name in sets:
            (tmp / f"{name}.parquet").touch()

    def images(self, split):
        assert split == self._split
        return self._images

    def texts(self, name):
        return self._sets[name]


def features(table: dict, emb: np.ndarray):
    return SimpleNamespace(table=pa.table(table), embeddings=emb.astype(np.float32))


@pytest.fixture
def world(tmp_path):
    """24 images of 4 classes: captions near the image, label prompts near the class, altered captions between."""
    rng = np.random.default_rng(0)
    n, d, c = 24, 32, 4
    classes = [[i % c] + ([(i + 1) % c] if i % 3 == 0 else []) for i in range(n)]
    class_emb = unit(rng.standard_normal((c, d)))
    img = unit(class_emb[[cs[0] for cs in classes]] + 0.8 * unit(rng.standard_normal((n, d))))
    ids = [f"test-{i:03d}" for i in range(n)]
    caps_per = rng.integers(2, 6, size=n)
    cap_owner = np.repeat(np.arange(n), caps_per)
    cap_emb = unit(img[cap_owner] + 0.5 * unit(rng.standard_normal((len(cap_owner), d))))
    alt_owner = np.repeat(np.arange(n), 7)
    alt_emb = unit(img[alt_owner] + 1.0 * unit(rng.standard_normal((len(alt_owner), d))))
    multi_emb = unit(class_emb[[cs[0] for cs in classes]] + 0.3 * unit(rng.standard_normal((n, d))))
    sid = np.array(ids, dtype=object)
    sets = {
        "captions": features({"sample_id": sid[cap_owner].tolist(), "source": ["caption"] * len(cap_owner),
                              "text": [f"cap {k}" for k in range(len(cap_owner))]}, cap_emb),
        "single_label_prompts": features({"class_index": list(range(c)), "source": ["single_label"] * c,
                                          "text": [f"a photo of a c{k}." for k in range(c)]}, class_emb),
        "multi_label_prompts": features({"sample_id": ids, "source": ["multi_label"] * n,
                                         "text": [f"m{i}" for i in range(n)], "classes": classes}, multi_emb),
        "altered_captions": features({"sample_id": sid[alt_owner].tolist(), "source": ["negative"] * len(alt_owner),
                                      "text": [f"alt {k}" for k in range(len(alt_owner))]}, alt_emb),
    }
    meta = DatasetMeta("caps", "captions", "accuracy", [ClassInfo(k, f"c{k}") for k in range(c)], splits={"test": n})
    images = features({"sample_id": ids, "label": [cs[0] for cs in classes]}, img)
    return FakeInputs(tmp_path, meta, images, sets)


def test_run_on_hand_made_features_matches_sklearn_image_by_image(world):
    cfg = {"negatives": 10}
    result = sp.run(world, cfg, seed=3)
    assert set(result.metrics) == {f"{p}_vs_{n}" for p in ("captions", "single_label", "multi_label")
                                   for n in sp.NEGATIVES}
    assert result.params["positives_missing"] == ["narratives"] and result.params["split"] == "test"
    ap = result.tables["ap"].to_pydict()
    assert len(ap["ap"]) == 24 * 9
    # recompute every cell of every image from scratch with scikit-learn
    x = unit(world._images.embeddings)
    sets = world._sets
    caps = sets["captions"]
    cap_owner = np.array(caps.table.column("sample_id").to_pylist())
    ids = np.array(world._images.table.column("sample_id").to_pylist(), dtype=object)
    classes = sp.image_class_lists(sp.Texts(sets["multi_label_prompts"].table, None), ids)
    chosen = sp.one_label(classes, 3)  # the paper's single-label positive: one label of the image
    for kind in sp.NEGATIVES:
        rows = sp.negative_rows(kind, sp.Texts(caps.table, None), sp.Texts(sets["altered_captions"].table, None),
                                ids, classes, 4, 10, 3)
        neg_emb = unit(sets["altered_captions" if kind == "altered" else "captions"].embeddings)
        for i, sid in enumerate(ids):
            neg = neg_emb[rows[i][rows[i] >= 0]]
            assert len(neg) == (7 if kind == "altered" else 10)
            positives = {"captions": unit(caps.embeddings)[cap_owner == sid],
                         "single_label": unit(sets["single_label_prompts"].embeddings)[chosen[i]],
                         "multi_label": unit(sets["multi_label_prompts"].embeddings)[[i]]}
            for p, pos in positives.items():
                scores = np.concatenate([pos @ x[i], neg @ x[i]])
                truth = np.r_[np.ones(len(pos)), np.zeros(len(neg))]
                k = next(j for j in range(len(ap["ap"]))
                         if (ap["sample_id"][j], ap["positive"][j], ap["negative"][j]) == (sid, p, kind))
                assert ap["ap"][k] == pytest.approx(average_precision_score(truth, scores), abs=1e-5)
                assert ap["chance"][k] == pytest.approx(float(sp.expected_random_ap(len(pos), len(scores))))
    table = result.details["table"]
    for p, row in table.items():
        for n, cell in row.items():
            assert cell["map"] == pytest.approx(result.metrics[f"{p}_vs_{n}"])
            assert cell["map"] > cell["chance"]  # captions near their image, prompts near its class
            assert cell["images"] == 24
    assert result.details["rows"] == ["captions", "single_label", "multi_label"]
    assert result.counts["images_short_of_altered"] == 24 and result.counts["images_short_of_random"] == 0
    assert sp.run(world, cfg, seed=3).metrics == result.metrics
    assert sp.run(world, cfg, seed=4).metrics != result.metrics  # other random and relevant negatives


def test_single_label_positive_names_one_label_of_the_image(world):
    """The paper (Sec. 5): Prompt_s^+ applies the classification prompt "on one label of the query image"; `each` keeps
    every label's prompt as a positive (the former behaviour)."""
    ids = np.array(world._images.table.column("sample_id").to_pylist(), dtype=object)
    classes = sp.image_class_lists(sp.Texts(world._sets["multi_label_prompts"].table, None), ids)
    assert sum(len(c) > 1 for c in classes) == 8  # images with two labels
    chosen = sp.one_label(classes, 3)
    assert all(len(c) == 1 and c[0] in cs for c, cs in zip(chosen, classes))
    assert {c[0] == cs[1] for c, cs in zip(chosen, classes) if len(cs) > 1} == {True, False}  # either label
    assert sp.one_label([[], [5]], 0) == [[], [5]]
    one = sp.run(world, {"negatives": 10}, seed=3)
    cell = one.details["table"]["single_label"]["random"]
    assert cell["mean_positives"] == 1.0 and one.params["single_label"] == "one"
    each = sp.run(world, {"negatives": 10, "single_label": "each"}, seed=3)
    assert each.details["table"]["single_label"]["random"]["mean_positives"] == pytest.approx(32 / 24)
    assert each.metrics["captions_vs_random"] == one.metrics["captions_vs_random"]
    with pytest.raises(sp.SpecificityError, match="specificity.single_label must be one of"):
        sp.run(world, {"single_label": "all"}, seed=3)


def test_identical_positive_and_negative_scores_tie(world):
    """Altered captions that score exactly like the true captions: AP = positives / all, the tie rule."""
    sets = world._sets
    caps = sets["captions"]
    owner = np.array(caps.table.column("sample_id").to_pylist())
    img = {s: e for s, e in zip(world._images.table.column("sample_id").to_pylist(), world._images.embeddings)}
    caps.embeddings = np.stack([img[s] for s in owner])  # every caption is its image
    alt_owner = sets["altered_captions"].table.column("sample_id").to_pylist()
    sets["altered_captions"].embeddings = np.stack([img[s] for s in alt_owner])
    result = sp.run(world, {"negatives": 10, "positives": ["captions"]}, seed=0)
    counts = np.unique(owner, return_counts=True)[1]
    assert result.metrics["captions_vs_altered"] == pytest.approx(np.mean(counts / (counts + 7)))
    assert result.metrics["captions_vs_random"] == pytest.approx(1.0)


def test_params_and_missing_sets_are_clear_errors(world):
    with pytest.raises(sp.SpecificityError, match="specificity.negatives must be an integer >= 1; got 0"):
        sp.check_config({"negatives": 0}, ["test"])
    with pytest.raises(sp.SpecificityError, match=r"specificity.positives must be a non-empty list of .*'tags'"):
        sp.check_config({"positives": ["tags"]}, ["test"])
    with pytest.raises(sp.SpecificityError, match=r"split is null but the dataset has splits \['a', 'b'\]"):
        sp.check_config({}, ["a", "b"])
    with pytest.raises(sp.SpecificityError, match="split 'val' is not a split"):
        sp.check_config({"split": "val"}, ["test"])
    (world.texts_dir / "altered_captions.parquet").unlink()
    with pytest.raises(sp.SpecificityError, match="text set 'altered_captions' missing; .* `texts.specificity`"):
        sp.run(world, {}, seed=0)


# --------------------------------------------------------------------------------------------------------------
# COCO: a prepared miniature (real COCO-MINI instances and captions when ../shared/reference is present)


@pytest.fixture
def coco_prepared(tmp_path, monkeypatch):
    from tests.http_server import serve
    from tests.test_coco import REFERENCE, make_coco, narrative_line, served
    from vlbench.datasets import coco

    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "cache"))
    monkeypatch.delenv("VLBENCH_MIRROR", raising=False)
    (tmp_path / "www").mkdir()
    kwargs = {}
    if (REFERENCE / "coco_mini/instances_val2017.json").is_file():
        instances = json.loads((REFERENCE / "coco_mini/instances_val2017.json").read_text())
        captions = json.loads((REFERENCE / "captions_val2017.json").read_text())
        ids = sorted(im["id"] for im in instances["images"])
        captions = {**captions, "images": [im for im in captions["images"] if im["id"] in ids],
                    "annotations": [a for a in captions["annotations"] if a["image_id"] in ids]}
        narratives = [narrative_line(i, 1, "In this image we can see a table, a person and a dog.") for i in ids[:20]]
        kwargs = {"instances": instances, "captions": captions, "narratives": narratives,
                  "categories": instances["categories"]}
    mini = make_coco(tmp_path / "www", **kwargs)
    with serve(tmp_path / "www") as base_url:
        meta = coco.build("coco-2017-val", served(mini["spec"], base_url), tmp_path / "out")
    return meta, tmp_path / "out"


def test_coco_texts_and_a_run_with_narratives(coco_prepared, tmp_path):
    from vlbench.knowledge.negatives import join_names, specificity_text_sets
    from vlbench.texts import build_text_sets

    meta, out = coco_prepared
    sets = {**build_text_sets(meta, out, {}), **specificity_text_sets(meta, out, {"synonyms": "coco", "altered": 12})}
    labels = {r["sample_id"]: r["labels"] for r in pq.read_table(out / "splits/val.parquet").to_pylist()}
    multi = sets["multi_label_prompts"].to_pylist()
    assert [r["sample_id"] for r in multi] == [s for s, cs in labels.items() if cs]  # none for an image without labels
    assert all(r["classes"] == labels[r["sample_id"]] for r in multi)
    names = [c.name for c in meta.classes]
    first = multi[0]
    assert first["text"] == "a photo of " + join_names([names[c] for c in first["classes"]]) + "."
    altered = sets["altered_captions"].to_pylist()
    assert 0 < len(altered) <= 12 * len(labels)
    rng = np.random.default_rng(0)
    emb = {name: rng.standard_normal((t.num_rows, 8)) for name, t in sets.items()}
    images = features({"sample_id": list(labels), "labels": list(labels.values())},
                      rng.standard_normal((len(labels), 8)))
    inputs = FakeInputs(tmp_path / "texts", meta, images,
                        {name: features(t.to_pydict(), emb[name]) for name, t in sets.items()}, split="val")
    result = sp.run(inputs, {"negatives": 20}, seed=0)
    assert result.params["split"] == "val" and result.params["positives_missing"] == []
    assert set(result.details["rows"]) == {"captions", "single_label", "multi_label", "narratives"}
    with_narratives = sum(1 for r in pq.read_table(out / "splits/val.parquet").to_pylist() if r["narratives"])
    assert result.details["table"]["narratives"]["random"]["images"] == with_narratives
    assert result.details["table"]["single_label"]["random"]["images"] == len(multi)
    gaps = [cell["map"] - cell["chance"] for row in result.details["table"].values() for cell in row.values()]
    assert abs(np.mean(gaps)) < 0.05 and max(abs(g) for g in gaps) < 0.3  # random embeddings: about chance


# --------------------------------------------------------------------------------------------------------------
# Heat map


def test_heatmap_rows_and_file(tmp_path):
    from vlbench.report.plots import (
        HEATMAP_FILE,
        heatmap_rows,
        write_specificity_heatmap,
    )

    table = {"captions": {"random": {"map": 0.9, "chance": 0.08, "images": 10},
                          "altered": {"map": None, "chance": None, "images": 0}},
             "single_label": {"random": {"map": 0.4, "chance": 0.05, "images": 10}}}
    result = {"details": {"table": table, "rows": ["captions", "single_label"], "columns": ["random", "altered"]}}
    rows = heatmap_rows({"demo": result})
    assert [(r["positive"], r["negative"], r["value"], r["note"], r["dark"]) for r in rows] == [
        ("captions", "random", "0.900", "chance 0.080", True), ("single_label", "random", "0.400", "chance 0.050", False)]
    path = write_specificity_heatmap({"demo": result}, tmp_path)
    assert path == tmp_path / HEATMAP_FILE
    svg = path.read_text()
    assert "0.900" in svg and "chance 0.050" in svg and "single_label" in svg
    assert write_specificity_heatmap({"demo": {"details": {}}}, tmp_path / "none") is None


# --------------------------------------------------------------------------------------------------------------
# The stages in a pipeline


@pytest.fixture(scope="module")
def repo(smoke_run, tmp_path_factory):
    """A copy of the session's smoke run (tests/conftest.py; its toy model is reused) with a captions suite."""
    from tests.pipeline_repo import read_suite, run, synthetic_entry, write_suite

    repo = smoke_run(tmp_path_factory.mktemp("specificity") / "repo")
    suite = read_suite(repo, "smoke")
    entry = synthetic_entry("captions", {"test": 30}, ["a {c}."])
    entry["texts"]["specificity"] = {"altered": 5, "nouns": "vocabulary", "classes_from": "labels_and_captions",
                                     "groups": {"colour": ["red", "orange", "yellow", "green", "cyan", "blue",
                                                           "purple", "pink", "brown"]}}
    suite["datasets"] = {"captions": entry}
    suite.update(embed=["captions"], zeroshot=[], linear_probe=[], specificity=["captions"])
    write_suite(repo, suite)
    run(repo, sys.executable, "-m", "vlbench.cli", "compose")
    run(repo, *DVC, "repro", "report")
    return repo


def test_the_pipeline_writes_texts_results_metrics_and_the_heat_map(repo):
    texts = repo / "data/texts/captions"
    assert {p.stem for p in texts.glob("*.parquet")} >= {"captions", "single_label_prompts", "multi_label_prompts",
                                                         "altered_captions"}
    altered = pq.read_table(texts / "altered_captions.parquet")
    assert 0 < altered.num_rows <= 5 * 30
    embedded = pq.read_table(repo / "features/toy-smoke/captions/text/altered_captions.parquet")
    assert embedded.num_rows == altered.num_rows
    result = json.loads((repo / "reports/specificity/captions.json").read_text())
    assert len(result["metrics"]) == 9 and result["counts"]["images"] == 30
    assert result["details"]["table"]["captions"]["altered"]["mean_negatives"] <= 5
    cells = [c for row in result["details"]["table"].values() for c in row.values()]
    assert pq.read_table(repo / "reports/specificity/captions.ap.parquet").num_rows == sum(c["images"] for c in cells)
    metrics = json.loads((repo / "reports/metrics.json").read_text())
    assert metrics["specificity"]["captions"] == result["metrics"]
    assert (repo / "reports/plots/specificity_heatmap.svg").is_file()

