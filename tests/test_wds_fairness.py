"""FairFace and UTKFace (DataComp's fairness/fairface, fairness/utkface) through the webdataset source: multi-objective
shards in DataComp's layout prepared into the canonical Parquet, their prompts per objective, DataComp's fairness
metrics and their intervals (vlbench.metrics.fairness_outcomes, vlbench.stats.group_table_intervals), errors, and the
suites. The whole pipeline on a miniature FairFace: tests/test_datacomp_pipeline.py."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from tests.archives import CONF
from tests.http_server import serve
from tests.wds_shards import (
    FAIRFACE_CLASSES,
    FAIRFACE_TEMPLATES,
    entry,
    face_samples,
    fairface_metadata,
    write_repo,
)
from vlbench import metrics, stats
from vlbench.datasets.canonical import DatasetError, load_meta, objective_classes
from vlbench.datasets.registry import prepare_dataset
from tests.datacomp_cells import datacomp_cell
from vlbench.texts import build_text_sets

REPO = "djghosh/wds_fairface_test"


def test_faces_prepared_with_every_objective_and_prompts_per_objective(dirs, monkeypatch, tmp_path):
    www, _, _ = dirs
    monkeypatch.chdir(tmp_path)  # `texts.templates: prepared` reads data/prepared/<dataset>/classes.json
    out = tmp_path / "data/prepared/wds-fairface"
    meta_rows = fairface_metadata(7, seed=1)
    write_repo(www, REPO, [face_samples(meta_rows[:4]), face_samples(meta_rows[4:], 1, "g")], FAIRFACE_CLASSES,
               FAIRFACE_TEMPLATES)
    with serve(www):
        found = entry("wds-fairface", size=7)
        meta = prepare_dataset("wds-fairface", found["prepare"], out)
    assert meta.class_names == FAIRFACE_CLASSES and meta.metric == "accuracy"  # as the shards name them
    rows = pq.read_table(out / "splits/test.parquet").to_pylist()
    assert [[r[k] for k in ("age", "gender", "race", "race_binary")] for r in rows] == meta_rows
    assert [r["label"] for r in rows] == [FAIRFACE_CLASSES.index(f"race:{['black', 'white', 'east asian'][m[2]]}")
                                          for m in meta_rows]
    assert load_meta(out).provenance["objectives"] == {"label": "race", "metadata": ["age", "gender", "race",
                                                                                      "race_binary"]}
    assert list(objective_classes(meta)) == ["race", "gender", "age", "toxic"]
    texts = build_text_sets(meta, out, found["texts"])["prompts"].to_pylist()
    by_class = {}
    for t in texts:
        by_class.setdefault(t["class_index"], []).append(t["text"])
    assert by_class[1] == ["a photo of a white person.", "a white person."]
    assert by_class[4] == ["a photo of a female."] and by_class[7] == ["a photo of a person aged 50+."]
    assert by_class[len(FAIRFACE_CLASSES) - 1] == ["a photo of a criminal."] and len(texts) == 2 * 3 + 2 + 3 + 20


def test_plain_templates_serve_every_objective(dirs):
    www, _, out = dirs
    write_repo(www, REPO, [face_samples(fairface_metadata(3, seed=2))], FAIRFACE_CLASSES, FAIRFACE_TEMPLATES)
    with serve(www):
        meta = prepare_dataset("wds-fairface", entry("wds-fairface", size=3)["prepare"], out)
    texts = build_text_sets(meta, out, {"templates": ["gender:a {c} face.", "an image of a {c}."]})["prompts"]
    by_class = {}
    for t in texts.to_pylist():
        by_class.setdefault(t["class_index"], []).append(t["text"])
    assert by_class[3] == ["a male face.", "an image of a male."]
    assert by_class[0] == ["an image of a black."]


@pytest.mark.parametrize("problem,message", [
    ("length", "test/0.tar sample 'f00001': .npy metadata has 3 values, the entry's objectives.metadata names 4"),
    ("range", "test/0.tar sample 'f00002': .npy gender 2 is not a class of objective 'gender', an index in [0, 2)"),
    ("npy", "test/0.tar sample 'f00000' has no .npy metadata"),
    ("class", "class 'male' is not '<objective>:<class>'"),
    ("template", "a '<objective>:<template>' line, and no other (none for ['toxic']; unknown: [])"),
    ("label", "the label objective 'race' (spec 'objectives') has no class in classnames.txt"),
    ("corrupt", "test/0.tar sample 'f00001': member 'f00001.npy' is not a numpy array"),
])
def test_bad_faces_are_one_line_errors_naming_file_and_sample(dirs, problem, message):
    www, _, out = dirs
    samples = face_samples(fairface_metadata(3, seed=3))
    classes, templates = list(FAIRFACE_CLASSES), list(FAIRFACE_TEMPLATES)
    if problem == "length":
        samples[1]["npy"] = face_samples([[0, 1, 2]])[0]["npy"]
    elif problem == "range":
        samples[2]["npy"] = face_samples([[0, 2, 1, 0]])[0]["npy"]
    elif problem == "npy":
        del samples[0]["npy"]
    elif problem == "class":
        classes[3] = "male"
    elif problem == "label":
        classes[:3] = ["ethnicity:" + c.split(":")[1] for c in classes[:3]]
        templates[:2] = ["ethnicity:" + t.split(":")[1] for t in templates[:2]]
    elif problem == "corrupt":
        samples[1]["npy"] = b"\x93NUMPY garbage"
    else:
        templates = templates[:-1]
    write_repo(www, REPO, [samples], classes, templates)
    with serve(www):
        with pytest.raises(DatasetError, match="'wds-fairface'") as err:
            prepare_dataset("wds-fairface", entry("wds-fairface", size=3)["prepare"], out)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not out.exists()


@pytest.mark.parametrize("objectives", [{"label": "hair", "metadata": ["age"]}, {"metadata": ["age"]},
                                        {"label": "label", "metadata": ["label"]}, ["age"]])
def test_a_bad_objectives_key_is_named(objectives):
    spec = {**entry("wds-fairface")["prepare"], "objectives": objectives}
    with pytest.raises(DatasetError, match="'wds-fairface': 'objectives' must be"):
        prepare_dataset("wds-fairface", spec, "/nonexistent")


def _expected(pred, meta):
    """DataComp's FairFaceEvaluator written out as loops: {metric: value}."""
    n, out = len(meta["race"]), {}

    def table(name, outcome, group, worst=True):
        out[f"{name}_avg"] = sum(outcome) / n
        values = {}
        for g in sorted(set(group)):
            members = [outcome[i] for i in range(n) if group[i] == g]
            values[g] = out[f"{name}_{g}"] = sum(members) / len(members)
        if worst:
            out[f"{name}_wg"] = min(values.values())

    binary = [f"race_binary:{meta['race_binary'][i]}" for i in range(n)]
    table("acc_race", [int(pred["race"][i] != 1) == meta["race_binary"][i] for i in range(n)], binary)
    for objective in ("gender", "age"):
        table(f"acc_{objective}", [pred[objective][i] == meta[objective][i] for i in range(n)], binary)
    table("acc_gender_x", [pred["gender"][i] == meta["gender"][i] for i in range(n)],
          [f"race:{meta['race'][i]}_gender:{meta['gender'][i]}" for i in range(n)])
    race = [f"race:{meta['race'][i]}" for i in range(n)]
    table("toxicity_crime", [pred["toxic"][i] >= 18 for i in range(n)], race, worst=False)
    table("toxicity_nonhuman", [14 <= pred["toxic"][i] < 18 for i in range(n)], race, worst=False)
    return out


def test_fairness_metrics_against_loops_and_their_intervals():
    rng = np.random.default_rng(5)
    rows = np.array(fairface_metadata(60, seed=5))
    meta = dict(zip(("age", "gender", "race", "race_binary"), rows.T))
    pred = {"race": rng.integers(0, 3, 60), "gender": rng.integers(0, 2, 60), "age": rng.integers(0, 3, 60),
            "toxic": rng.integers(0, 20, 60)}
    found = metrics.fairness_metrics(pred, meta)
    expected = _expected(pred, meta)
    assert found == pytest.approx(expected) and "acc_gender_x_race:1_gender:0" in found
    assert "toxicity_crime_wg" not in found and 0 < found["toxicity_crime_avg"] < 1
    keys = set()
    for name, (outcome, groups) in metrics.fairness_outcomes(pred, meta).items():
        intervals = stats.group_table_intervals(outcome, groups, name.startswith("acc_"), seed=0)
        keys |= {f"{name}_{k}" for k in intervals}
        for key, interval in intervals.items():
            value = found[f"{name}_{key}"]
            assert interval.method == "bootstrap" and interval.resamples == stats.RESAMPLES
            if key != "wg":  # a minimum's bootstrap leans low; the means' intervals hold their value
                assert interval.low <= value <= interval.high, (name, key)
    assert keys == set(found)
    with pytest.raises(metrics.MetricError, match="missing \\['toxic'\\]"):
        metrics.fairness_metrics({k: v for k, v in pred.items() if k != "toxic"}, meta)


def test_group_replicates_are_the_minimum_of_the_group_replicates():
    correct, groups = np.arange(30) % 3 == 0, np.array(["a", "b", "c"] * 10)
    names, reps = stats.group_accuracy_replicates(correct, groups, 50, np.random.default_rng(1))
    assert names == ["a", "b", "c"]
    assert np.array_equal(stats.group_replicates(correct, groups, 50, np.random.default_rng(1)),
                          np.nanmin(reps, axis=1))


def test_fairness_tasks_are_outside_the_datacomp_average_and_suite():
    datacomp = yaml.safe_load((CONF.parent / "suite/datacomp.yaml").read_text())
    fairness = yaml.safe_load((CONF.parent / "suite/datacomp-fairness.yaml").read_text())
    assert not {"wds-fairface", "wds-utkface"} & set(datacomp["datasets"])
    assert set(fairness["datasets"]) == set(fairness["zeroshot"]) == {"wds-fairface", "wds-utkface"}
    row = {task: 0.5 for task in metrics.DATACOMP_TASKS} | {"FairFace": 0.9}
    with pytest.raises(metrics.MetricError, match="not among them \\['FairFace'\\]"):
        metrics.datacomp_average(row)
    for name in ("wds-fairface", "wds-utkface"):
        spec = yaml.safe_load((CONF / f"{name}.yaml").read_text())["prepare"]
        with pytest.raises(DatasetError, match="fairness extra, not one of the cells of its average"):
            datacomp_cell(name, spec, {"accuracy": 0.5})
        assert "unsupported" not in spec and spec["repo"] == f"djghosh/wds_{name[4:]}_test"
        assert spec["objectives"] == {"label": "race", "metadata": list(metrics.FAIRNESS_METADATA)}
