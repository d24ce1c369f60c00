"""The `datacomp` suite's pipeline on miniature shards in DataComp's exact layout (tests/wds_shards.py), served from
127.0.0.1 and run through real DVC with the few-step toy model (tests/pipeline_repo.py): a classification task
scored by macro F1 (iWildCam), a grouped task (Dollar Street's worst income group top-5 accuracy), a retrieval
task (MSCOCO from a miniature of DataComp's own source, its Hugging Face Parquet files; mean of image and
text Recall@1), WinoGAViL from a miniature of its Hugging Face Parquet file
(Jaccard on the 10- and 12-candidate instances) and the `datacomp-fairness` extra FairFace (each objective over its
own classes, DataComp's fairness metrics per group); five tasks keep it within its time budget (the other metrics,
mean per-class recall and worst-region accuracy, go through the same code path and have unit tests:
tests/test_datacomp_metrics.py). Every number is checked against a computation written here from the features: logits
by hand, metrics with scikit-learn or loops, groups decoded from the shards' own .npy members."""

from __future__ import annotations

import json
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import balanced_accuracy_score, f1_score, jaccard_score

from tests.http_server import serve
from tests.test_wds_fairness import _expected as fairness_loops
from tests.wds_shards import (
    FAIRFACE_CLASSES,
    FAIRFACE_TEMPLATES,
    classification_samples,
    entry,
    face_samples,
    fairface_metadata,
    winogavil_instances,
    write_hf_captions,
    write_repo,
    write_winogavil,
)
from vlbench import metrics

DVC = (sys.executable, "-m", "dvc")
MODEL = "toy-smoke"
RNG = np.random.default_rng(31)
TASKS = {  # entry: (repo, labels, classes, .npy metadata or None)
    "wds-wilds-iwildcam": ("djghosh/wds_wilds-iwildcam_test", RNG.integers(0, 4, 14),
                           ["deer", "fox", "boar", "empty"], None),
    "wds-dollar_street": ("djghosh/wds_dollar_street_test", RNG.integers(0, 6, 14),
                          ["bed", "stove", "toilet", "sofa", "tv", "cup"], [[g, 7, 2] for g in RNG.integers(0, 3, 14)]),
}
FACES = fairface_metadata(16, seed=31)  # [age, gender, race, race_binary] per face
CAPTIONS = [[f"a picture number {i}.", f"image {i} with {j} things."] for i, j in enumerate(range(6))]
WINOGAVIL = winogavil_instances([5, 10, 6, 12, 10, 12, 5], seed=4)


@pytest.fixture(scope="module")
def repo(smoke_run, tmp_path_factory):
    from tests.pipeline_repo import read_suite, run, write_suite

    base = tmp_path_factory.mktemp("datacomp")
    www = base / "www"
    for i, (name, (repo_name, labels, classes, meta)) in enumerate(TASKS.items()):
        samples = classification_samples(labels, seed=i, groups=meta)
        write_repo(www, repo_name, [samples[:8], samples[8:]], classes, ["a photo of a {c}.", "a {c}."])
    write_hf_captions(www, "nlphuji/mscoco_2014_5k_test_image_text_retrieval", CAPTIONS,
                      ["TEST/test/0000.parquet", "TEST/test/0001.parquet"], seed=9)
    write_repo(www, "djghosh/wds_fairface_test", [face_samples(FACES[:9], 5), face_samples(FACES[9:], 6, "g")],
               FAIRFACE_CLASSES, FAIRFACE_TEMPLATES)
    write_winogavil(www, WINOGAVIL)
    repo = smoke_run(base / "repo")  # the session's smoke run (tests/conftest.py): its toy model is reused
    with serve(www):
        suite = read_suite(repo, "smoke")
        suite["datasets"] = {name: entry(name, size=14, classes=len(spec[2])) for name, spec in TASKS.items()}
        suite["datasets"]["wds-mscoco"] = entry("wds-mscoco", size=len(CAPTIONS), captions=sum(map(len, CAPTIONS)))
        suite["datasets"]["wds-fairface"] = entry("wds-fairface", size=len(FACES))
        suite["datasets"]["wds-winogavil"] = entry("wds-winogavil", size=len(WINOGAVIL))
        suite.update(embed=[*TASKS, "wds-mscoco", "wds-fairface", "wds-winogavil"],
                     zeroshot=[*TASKS, "wds-fairface", "wds-winogavil"], linear_probe=[], retrieval=["wds-mscoco"])
        write_suite(repo, suite)
        run(repo, sys.executable, "-m", "vlbench.cli", "compose")
        run(repo, "git", "add", "-A")
        run(repo, "git", "commit", "-qm", "datacomp miniature")
        run(repo, *DVC, "repro", "report", env={"VLBENCH_DOWNLOADS": str(base / "cache")})
    return repo


def _normed(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _logits(repo, name):
    """100 x cosine of each image to each class's renormalised mean prompt embedding, from the features files."""
    images = pq.read_table(repo / f"features/{MODEL}/{name}/images/test.parquet").to_pydict()
    texts = pq.read_table(repo / f"features/{MODEL}/{name}/text/prompts.parquet").to_pydict()
    emb, owner = _normed(texts["embedding"]), np.array(texts["class_index"])
    weights = _normed(np.stack([emb[owner == c].mean(axis=0) for c in range(owner.max() + 1)]))
    return images, 100 * _normed(images["embedding"]) @ weights.T


def _worst_group_topk(logits, labels, groups, k):
    worst = 1.0
    for g in set(groups):
        hits = [labels[i] in sorted(range(logits.shape[1]), key=lambda j: (-logits[i, j], j))[:k]
                for i in range(len(labels)) if groups[i] == g]
        worst = min(worst, sum(hits) / len(hits))
    return worst


def test_every_zeroshot_metric_against_an_independent_computation(repo):
    expected = {}
    for name, (_, labels, _, meta) in TASKS.items():
        images, logits = _logits(repo, name)
        assert images["label"] == labels.tolist() and len(images["sample_id"]) == 14
        pred = logits.argmax(axis=1)
        groups = [f"{'region' if name == 'wds-geode' else 'income_ds'}:{m[0]}" for m in meta] if meta else None
        expected[name] = {
            "wds-vtab-pets": lambda: balanced_accuracy_score(labels, pred),
            "wds-wilds-iwildcam": lambda: f1_score(labels, pred, average="macro", labels=np.unique(labels)),
            "wds-geode": lambda: _worst_group_topk(logits, labels, groups, 1),
            "wds-dollar_street": lambda: _worst_group_topk(logits, labels, groups, 5),
        }[name]()
        result = json.loads((repo / f"reports/zeroshot/{name}.json").read_text())
        metric = {"wds-vtab-pets": "mean_per_class", "wds-wilds-iwildcam": "f1_macro",
                  "wds-geode": "worst_group_accuracy", "wds-dollar_street": "worst_group_top5"}[name]
        assert result["metrics"][metric] == pytest.approx(expected[name], abs=6e-4), name
        assert result["metrics"]["accuracy"] == pytest.approx(np.mean(pred == labels), abs=6e-4)
        interval = result["intervals"][metric]
        assert interval["method"] == "bootstrap" and interval["low"] <= result["metrics"][metric] <= interval["high"]
        predictions = pq.read_table(next((repo / "reports/zeroshot").glob(f"{name}.predictions.parquet")))
        assert np.allclose(np.array(predictions.column("logits").to_pylist()), logits, atol=1e-3)
        if groups:  # the per-sample file keeps the group, as the shards' .npy have it
            assert predictions.column("group").to_pylist() == groups
    assert len(set(expected.values())) > 1  # not one constant
    headline = json.loads((repo / "reports/metrics.json").read_text())["zeroshot"]  # the cells are headline numbers
    assert headline["wds-wilds-iwildcam"]["f1_macro"] == pytest.approx(expected["wds-wilds-iwildcam"], abs=6e-4)
    assert headline["wds-dollar_street"]["worst_group_top5"] == pytest.approx(expected["wds-dollar_street"], abs=6e-4)


def test_fairface_every_objective_and_fairness_metric_against_an_independent_computation(repo):
    """Each objective predicted by the argmax over its own classes of the logits computed here, DataComp's fairness
    numbers by the loops of tests/test_wds_fairness.py on the shards' own metadata; every number with its interval."""
    images, logits = _logits(repo, "wds-fairface")
    columns = {o: [i for i, c in enumerate(FAIRFACE_CLASSES) if c.startswith(o + ":")]
               for o in ("race", "gender", "age", "toxic")}
    pred = {o: [int(np.argmax(logits[i, cols])) for i in range(len(FACES))] for o, cols in columns.items()}
    meta = {field: [face[j] for face in FACES] for j, field in enumerate(("age", "gender", "race", "race_binary"))}
    assert {f: images[f] for f in meta} == meta and images["label"] == [columns["race"][r] for r in meta["race"]]
    expected = {"accuracy": np.mean([p == r for p, r in zip(pred["race"], meta["race"])]),
                **fairness_loops(pred, meta)}
    result = json.loads((repo / "reports/zeroshot/wds-fairface.json").read_text())
    assert result["metrics"] == pytest.approx(expected, abs=6e-4)  # every key, none more
    assert {"acc_race_avg", "acc_gender_race_binary:1", "acc_gender_x_race:2_gender:0", "toxicity_crime_race:0",
            "toxicity_nonhuman_race:1"} <= set(result["metrics"])
    assert len({round(v, 6) for v in result["metrics"].values()}) > 3  # not one constant
    assert set(result["intervals"]) == set(result["metrics"])
    for key, interval in result["intervals"].items():
        assert interval["method"] == "bootstrap" and 0 <= interval["low"] <= interval["high"] <= 1, key
    predictions = pq.read_table(repo / "reports/zeroshot/wds-fairface.predictions.parquet").to_pydict()
    assert {o: predictions[f"predicted_{o}"] for o in pred} == pred
    assert {f: predictions[f] for f in meta} == meta
    assert predictions["predicted"] == [columns["race"][p] for p in pred["race"]]
    headline = json.loads((repo / "reports/metrics.json").read_text())["zeroshot"]["wds-fairface"]
    assert headline["acc_race_avg"] == pytest.approx(expected["acc_race_avg"], abs=6e-4)


def test_retrieval_mean_recall_at_1_against_an_independent_computation(repo):
    images = pq.read_table(repo / f"features/{MODEL}/wds-mscoco/images/test.parquet").to_pydict()
    texts = pq.read_table(repo / f"features/{MODEL}/wds-mscoco/text/captions_prompted.parquet").to_pydict()
    assert texts["text"] == [c for caps in CAPTIONS for c in caps]  # the shards' captions, no prompt added
    sims = _normed(images["embedding"]) @ _normed(texts["embedding"]).T
    owner = np.array([images["sample_id"].index(s) for s in texts["sample_id"]])
    i2t = np.mean([owner[np.argmax(sims[i])] == i and (sims[i] == sims[i].max()).sum() == 1 for i in range(6)])
    t2i = np.mean([np.argmax(sims[:, t]) == owner[t] and (sims[:, t] == sims[:, t].max()).sum() == 1
                   for t in range(12)])
    result = json.loads((repo / "reports/retrieval/wds-mscoco.json").read_text())["metrics"]
    assert (result["i2t_r1"], result["t2i_r1"]) == (pytest.approx(i2t, abs=6e-4), pytest.approx(t2i, abs=6e-4))
    assert metrics.mean_recall_at_1(result["i2t_r1"], result["t2i_r1"]) == pytest.approx((i2t + t2i) / 2, abs=6e-4)


def _winogavil_jaccards(repo):
    """DataComp's wino_eval.py loop on the features: per instance the cosine of each candidate image with the cue's
    prompt ("An <cue>" / "A <cue>", lower-cased), the top-k by np.argsort with k the number of associations, and
    scikit-learn's jaccard_score; (Jaccard, number of candidates) per instance."""
    images = pq.read_table(repo / f"features/{MODEL}/wds-winogavil/images/test.parquet").to_pydict()
    texts = pq.read_table(repo / f"features/{MODEL}/wds-winogavil/text/prompts.parquet").to_pydict()
    prompts = [("An " if c["cue"].lower()[0] in "aeiou" else "A ") + c["cue"].lower() for c in WINOGAVIL]
    assert texts["text"] == prompts and texts["class_index"] == list(range(len(WINOGAVIL)))
    x, t = _normed(images["embedding"]), _normed(texts["embedding"])
    out, row = [], 0
    for i, instance in enumerate(WINOGAVIL):
        n = len(instance["candidates"])
        assert images["label"][row:row + n] == [i] * n
        logits = x[row:row + n] @ t[i]
        y_true = np.isin(instance["candidates"], instance["associations"])
        y_pred = np.isin(np.arange(n), np.argsort(logits)[-int(y_true.sum()):])
        out.append((jaccard_score(y_true, y_pred), n))
        row += n
    assert row == len(images["sample_id"])
    return out


def test_winogavil_jaccard_against_datacomps_loop(repo):
    expected = _winogavil_jaccards(repo)
    main = np.mean([j for j, n in expected if n >= 10])
    result = json.loads((repo / "reports/zeroshot/wds-winogavil.json").read_text())
    assert result["metrics"] == {"winogavil_jaccard": pytest.approx(main, abs=1e-9)}
    interval = result["intervals"]["winogavil_jaccard"]
    assert interval["method"] == "bootstrap" and interval["low"] <= main <= interval["high"]
    assert result["details"]["datacomp"]["jaccard_score_5-6"] == pytest.approx(
        np.mean([j for j, n in expected if n <= 6]), abs=1e-9)
    assert result["counts"]["counted"] == 4 and result["counts"]["samples"] == 60
    per_instance = pq.read_table(repo / "reports/zeroshot/wds-winogavil.predictions.parquet").to_pydict()
    assert per_instance["jaccard"] == pytest.approx([j for j, _ in expected], abs=1e-9)
    assert per_instance["cue"] == [c["cue"] for c in WINOGAVIL]
    assert len({j for j, _ in expected}) > 1  # not one constant
    headline = json.loads((repo / "reports/metrics.json").read_text())["zeroshot"]
    assert headline["wds-winogavil"]["winogavil_jaccard"] == pytest.approx(main, abs=1e-9)


def test_the_results_give_their_cells_of_the_datacomp_average(repo):
    """The four results' DataComp cells (`tests.datacomp_cells.datacomp_cell`) in a row whose other 34 cells are written here: the
    average is the plain mean of the 38 (DataComp's aggregate_scores.py); WinoGAViL's cell is its Jaccard."""
    import yaml

    from tests.datacomp_cells import datacomp_cell
    from vlbench.reference.datacomp import run_numbers

    cells = {}
    for name, analysis in (("wds-wilds-iwildcam", "zeroshot"), ("wds-dollar_street", "zeroshot"),
                           ("wds-mscoco", "retrieval"), ("wds-winogavil", "zeroshot")):
        spec = yaml.safe_load((repo / f"conf/dataset/{name}.yaml").read_text())["prepare"]
        result = json.loads((repo / f"reports/{analysis}/{name}.json").read_text())["metrics"]
        task, value = datacomp_cell(name, spec, result)
        cells[task] = value
    assert cells["MSCOCO"] == pytest.approx(metrics.mean_recall_at_1(*[json.loads(
        (repo / "reports/retrieval/wds-mscoco.json").read_text())["metrics"][k] for k in ("i2t_r1", "t2i_r1")]))
    winogavil = np.mean([j for j, n in _winogavil_jaccards(repo) if n >= 10])
    assert cells["WinoGAViL"] == pytest.approx(winogavil, abs=1e-9)
    row = {task: 0.5 for task in metrics.DATACOMP_TASKS if task not in cells} | cells
    assert len(row) == 38
    assert metrics.datacomp_average(row)["Average"] == pytest.approx((34 * 0.5 + sum(cells.values())) / 38)
    assert metrics.datacomp_average(row)["Retrieval"] == pytest.approx(
        (0.5 + cells["MSCOCO"] + cells["WinoGAViL"]) / 3)
    # the reference table reads the same cell from reports/metrics.json, with its interval
    placed = run_numbers(json.loads((repo / "reports/metrics.json").read_text()),
                         {"zeroshot": {"wds-winogavil": json.loads(
                             (repo / "reports/zeroshot/wds-winogavil.json").read_text())}})
    assert placed["WinoGAViL"]["value"] == pytest.approx(winogavil, abs=1e-9)
    assert placed["WinoGAViL"]["low"] <= winogavil <= placed["WinoGAViL"]["high"]


def test_nothing_is_stale_after_the_run(repo):
    from tests.pipeline_repo import run

    assert json.loads(run(repo, *DVC, "status", "--json", "report").stdout) == {}
