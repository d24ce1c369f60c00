"""The webdataset source (vlbench/datasets/wds.py) on miniature shards in DataComp's exact layout, served from
127.0.0.1: streaming into the canonical Parquet, classes and templates, groups, captions, checksums, and errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from tests.archives import sha256
from tests.http_server import serve
from tests.wds_shards import REVISION, caption_samples, classification_samples, entry, write_repo
from vlbench.datasets.canonical import DatasetError, load_meta
from vlbench.datasets.hub import read_lock
from vlbench.datasets.registry import prepare_dataset
from vlbench.datasets.wds import catalogue_row
from vlbench.texts import build_text_sets

CLASSES = ["abyssinian", "beagle", "boxer"]
TEMPLATES = ["a photo of a {c}, a type of pet."]


def test_classification_shards_prepared_in_order_with_their_classes_and_templates(dirs, capsys):
    www, _, out = dirs
    shards = [classification_samples([0, 1, 2, 1], 0, prefix="a"), classification_samples([2, 0], 1, prefix="b")]
    root = write_repo(www, "djghosh/wds_vtab-pets_test", shards, CLASSES, TEMPLATES)
    with serve(www):
        spec = entry("wds-vtab-pets", size=6, classes=3,
                     sha256={"test/0.tar": sha256(root / "test/0.tar")})["prepare"]
        meta = prepare_dataset("wds-vtab-pets", spec, out)
    assert "not verified" not in capsys.readouterr().err  # every file verified against the hub's declaration
    assert (meta.task, meta.metric, meta.splits, meta.class_names) == ("single-label", "mean_per_class", {"test": 6},
                                                                       CLASSES)
    rows = pq.read_table(out / "splits/test.parquet").to_pylist()
    assert [r["sample_id"] for r in rows] == ["a00000", "a00001", "a00002", "a00003", "b00000", "b00001"]
    assert [r["label"] for r in rows] == [0, 1, 2, 1, 2, 0]
    assert rows[4]["image"] == shards[1][0]["png"]  # bytes as stored
    prov = load_meta(out).provenance
    assert (prov["repo"], prov["revision"], prov["nshards"], prov["templates"]) == (
        "djghosh/wds_vtab-pets_test", REVISION, 2, TEMPLATES)
    assert prov["commit"] == REVISION
    paths = ["test/nshards.txt", "classnames.txt", "zeroshot_classification_templates.txt", "test/0.tar", "test/1.tar"]
    assert [(f["path"], f["verified"], f["commit"]) for f in prov["files"]] == [(p, True, REVISION) for p in paths]
    pinned = read_lock()["wds-vtab-pets"]  # the entry pinned at the first download, every file's sha256 and size
    assert (pinned.repository, pinned.revision, pinned.commit) == ("djghosh/wds_vtab-pets_test", REVISION, REVISION)
    assert pinned.files == {p: {"sha256": sha256(root / p), "size": (root / p).stat().st_size} for p in paths}
    assert pq.ParquetFile(out / "splits/test.parquet").metadata.num_row_groups == 1


def test_prepared_templates_are_the_entrys_prompts(dirs, monkeypatch, tmp_path):
    www, _, _ = dirs
    write_repo(www, "djghosh/wds_vtab-pets_test", [classification_samples([0, 1, 2])], CLASSES, TEMPLATES)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "data/prepared/wds-vtab-pets"
    with serve(www):
        found = entry("wds-vtab-pets", size=3, classes=3)
        meta = prepare_dataset("wds-vtab-pets", found["prepare"], out)
    prompts = build_text_sets(meta, out, found["texts"])["prompts"].to_pylist()
    assert [p["text"] for p in prompts] == [t.replace("{c}", c) for c in CLASSES for t in TEMPLATES]


def test_group_from_the_npy_metadata_and_captions(dirs):
    www, _, out = dirs
    write_repo(www, "djghosh/wds_dollar_street_test",
               [classification_samples([0, 1, 2], groups=[[3, 7, 1], [0, 2, 2], [3, 1, 0]])], CLASSES, TEMPLATES)
    write_repo(www, "clip-benchmark/wds_mscoco_captions", [caption_samples([["a dog.", "a dog running."], ["a cat."]])])
    with serve(www):
        prepare_dataset("wds-dollar_street", entry("wds-dollar_street", size=3, classes=3)["prepare"],
                        out / "ds")
        meta = prepare_dataset("wds-mscoco", entry("wds-mscoco")["prepare"], out / "coco")
    assert pq.read_table(out / "ds/splits/test.parquet").column("group").to_pylist() == [
        "income_ds:3", "income_ds:0", "income_ds:3"]
    assert (meta.task, meta.class_names, meta.splits) == ("captions", ["image"], {"test": 2})
    rows = pq.read_table(out / "coco/splits/test.parquet").to_pylist()
    assert [r["captions"] for r in rows] == [["a dog.", "a dog running."], ["a cat."]]


@pytest.mark.parametrize("problem,spec,message", [
    ("size", {"size": 4}, "hold 3 samples in 'test', the entry expects 4"),
    ("classes", {"classes": 4}, "classnames.txt of djghosh/wds_vtab-pets_test@0123456789abcdef0123456789abcdef01234567 "
                                "has 3 classes, the entry expects 4"),
    ("label", {}, "test/0.tar sample 's00002': .cls must be a class index in [0, 3), got '7'"),
    ("image", {}, "test/0.tar sample 's00001' has no image member"),
    ("checksum", {"sha256": {"test/0.tar": "0" * 64}}, "test/0.tar"),
])
def test_bad_shards_are_one_line_errors_naming_the_sample(dirs, problem, spec, message):
    www, _, out = dirs
    samples = classification_samples([0, 1, 7 if problem == "label" else 2])
    if problem == "image":
        del samples[1]["png"]
    write_repo(www, "djghosh/wds_vtab-pets_test", [samples], CLASSES, TEMPLATES)
    with serve(www):
        with pytest.raises(DatasetError, match="wds-vtab-pets") as err:
            prepare_dataset("wds-vtab-pets", entry("wds-vtab-pets", **{"size": 3, "classes": 3, **spec})[
                "prepare"], out)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not out.exists()


def test_an_unsupported_entry_says_why():
    """An entry marked `unsupported` (tools/datacomp_conf.py `UNSUPPORTED`, empty since WinoGAViL, FairFace and UTKFace
    can be prepared) stops prepare with its reason, before any download; the catalogue carries the reason too."""
    spec = dict(entry("wds-cars")["prepare"], unsupported="its shards are not readable yet")
    with pytest.raises(DatasetError, match="wds-cars.*its shards are not readable yet"):
        prepare_dataset("wds-cars", spec, "/nonexistent")
    assert catalogue_row("wds-cars", spec)["unsupported"] == "its shards are not readable yet"


def test_the_catalogue_lists_datacomps_38_without_a_download():
    proc = subprocess.run([sys.executable, "-m", "vlbench.cli", "datasets", "--suite", "datacomp", "--json"],
                          capture_output=True, text=True, check=True)
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert len(rows) == 38
    assert {k: rows["wds-wilds-iwildcam"][k] for k in ("classes", "splits", "metric", "main_metric")} == {
        "classes": 182, "splits": {"test": 42791}, "metric": "f1_macro", "main_metric": "F1-macro_all"}
    assert rows["wds-geode"]["metric"] == "worst_group_accuracy" and rows["wds-dollar_street"]["metric"] == \
        "worst_group_top5"
    assert rows["wds-flickr30k"]["metric"] == "mean_recall_at_1" and "test size not known" in rows["wds-flickr30k"][
        "note"]
    assert sorted(r["task"] for r in rows.values()) == sorted(__import__("vlbench.metrics").metrics.DATACOMP_TASKS)


def test_the_entries_are_the_tools_output(tmp_path):
    """conf/dataset/wds-*.yaml and the two suites are what tools/datacomp_conf.py writes (no hand edits)."""
    from tools import datacomp_conf
    from tests.archives import CONF

    before = {p.name: p.read_text() for p in CONF.glob("wds-*.yaml")}
    suites = {n: (CONF.parent / "suite" / f"{n}.yaml").read_text() for n in ("datacomp", "datacomp-fairness")}
    datacomp_conf.main()
    assert before == {p.name: p.read_text() for p in CONF.glob("wds-*.yaml")}
    assert suites == {n: (CONF.parent / "suite" / f"{n}.yaml").read_text() for n in suites}


def test_a_result_gives_its_datacomp_cell():
    from vlbench.datasets.wds import datacomp_cell

    iwildcam = entry("wds-wilds-iwildcam")["prepare"]
    assert datacomp_cell("wds-wilds-iwildcam", iwildcam, {"f1_macro": 0.25, "accuracy": 0.5}) == ("iWildCam", 0.25)
    coco = entry("wds-mscoco")["prepare"]
    assert datacomp_cell("wds-mscoco", coco, {"i2t_r1": 0.5, "t2i_r1": 0.3, "i2t_r5": 0.9}) == ("MSCOCO", 0.4)
    with pytest.raises(DatasetError, match="no 't2i_r1'"):
        datacomp_cell("wds-mscoco", coco, {"i2t_r1": 0.5})


def test_prepared_templates_before_prepare_is_a_one_line_error(tmp_path, monkeypatch):
    from vlbench.texts import entry_templates

    monkeypatch.chdir(tmp_path)
    with pytest.raises(DatasetError, match=r"'wds-cars': texts.templates is 'prepared' but .*classes.json records no "
                                           r"templates"):
        entry_templates("wds-cars", {"templates": "prepared"})
