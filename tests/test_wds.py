"""The webdataset source (vlbench/datasets/wds.py) on miniature shards in DataComp's exact layout, served from
127.0.0.1: streaming into the canonical Parquet, classes and templates, groups, captions, checksums, and errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.archives import sha256
from tests.http_server import serve
from tests.wds_shards import (REVISION, caption_samples, classification_samples, cut_tar, entry, huge_member_tar,
                              npy, write_repo)
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


def test_prepared_templates_are_filled_with_str_format_as_datacomp_fills_them(dirs, monkeypatch, tmp_path):
    """CLIP_benchmark's zero_shot_classifier (DataComp's wds_eval.py) fills each template with
    `template.format(c=classname)`: a template's other braces are format fields, '{{' a literal brace; str.replace kept
    '{{' doubled. A template str.format cannot fill is a one-line error naming it."""
    www, _, _ = dirs
    templates = ["a photo of a {c} {{sic}}.", "a {c}."]
    write_repo(www, "djghosh/wds_vtab-pets_test", [classification_samples([0, 1, 2])], CLASSES, templates)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "data/prepared/wds-vtab-pets"
    with serve(www):
        found = entry("wds-vtab-pets", size=3, classes=3)
        meta = prepare_dataset("wds-vtab-pets", found["prepare"], out)
    prompts = build_text_sets(meta, out, found["texts"])["prompts"].column("text").to_pylist()
    assert prompts[:2] == ["a photo of a abyssinian {sic}.", "a abyssinian."]
    classes = json.loads((out / "classes.json").read_text())
    classes["provenance"]["templates"] = ["a {c} of {kind}."]
    (out / "classes.json").write_text(json.dumps(classes))
    with pytest.raises(DatasetError, match=r"'wds-vtab-pets': template 'a \{c\} of \{kind\}.' cannot be filled with "
                                           r"str.format\(c=...\) as DataComp fills it \(KeyError: 'kind'\)"):
        build_text_sets(meta, out, found["texts"])


def test_group_from_the_npy_metadata_and_captions(dirs):
    www, _, out = dirs
    write_repo(www, "djghosh/wds_dollar_street_test",
               [classification_samples([0, 1, 2], groups=[[3, 7, 1], [0, 2, 2], [3, 1, 0]])], CLASSES, TEMPLATES)
    write_repo(www, "clip-benchmark/wds_mscoco_captions", [caption_samples([["a dog.", "a dog running."], ["a cat."]])])
    with serve(www):
        prepare_dataset("wds-dollar_street", entry("wds-dollar_street", size=3, classes=3)["prepare"],
                        out / "ds")
        meta = prepare_dataset("wds-mscoco-shards", entry("wds-mscoco-shards", size=2)["prepare"], out / "coco")
    assert pq.read_table(out / "ds/splits/test.parquet").column("group").to_pylist() == [
        "income_ds:3", "income_ds:0", "income_ds:3"]
    assert (meta.task, meta.class_names, meta.splits) == ("captions", ["image"], {"test": 2})
    rows = pq.read_table(out / "coco/splits/test.parquet").to_pylist()
    assert [r["captions"] for r in rows] == [["a dog.", "a dog running."], ["a cat."]]


@pytest.mark.parametrize("problem,spec,message", [
    ("size", {"size": 4}, "the 1 shard(s) test/nshards.txt of djghosh/wds_vtab-pets_test@"
                          "0123456789abcdef0123456789abcdef01234567 declares hold 3 samples in 'test' (test/0.tar 3), "
                          "the entry expects 4 (spec 'size')"),
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


def test_a_shard_cut_at_a_member_boundary_is_an_error_even_without_a_size(dirs):
    """A tar cut between two samples reads as a valid, shorter tar: without the entry's size (the retrieval entries
    had none) it was prepared with 1 of its 2 samples; its missing end-of-archive blocks name it."""
    www, _, out = dirs
    second = [dict(s, __key__=f"b{s['__key__']}") for s in caption_samples([["a cow."], ["a hen."]], 1)]
    root = write_repo(www, "clip-benchmark/wds_mscoco_captions", [caption_samples([["a dog."], ["a cat."]]), second])
    cut_tar(root / "test/1.tar", 2)  # bim00000.jpg, bim00000.txt: the first sample whole, the second gone
    with serve(www):
        spec = entry("wds-mscoco-shards", size=None)["prepare"]
        with pytest.raises(DatasetError) as err:
            prepare_dataset("wds-mscoco-shards", spec, out)
    assert str(err.value) == ("dataset 'wds-mscoco-shards': shard test/1.tar ends without the tar end-of-archive "
                              "blocks after member 'bim00000.txt': it was cut short; re-download the shard")
    assert not out.exists()


def test_a_missing_shard_count_file_is_an_error_not_one_shard(dirs):
    www, _, out = dirs
    root = write_repo(www, "djghosh/wds_vtab-pets_test", [classification_samples([0, 1]), classification_samples([2])],
                      CLASSES, TEMPLATES)
    (root / "test/nshards.txt").unlink()
    with serve(www):
        with pytest.raises(DatasetError, match="test/nshards.txt") as err:
            prepare_dataset("wds-vtab-pets", entry("wds-vtab-pets", size=3, classes=3)["prepare"], out)
    assert "\n" not in str(err.value) and not out.exists()


def test_a_shard_count_file_declaring_fewer_shards_names_each_shards_count(dirs):
    www, _, out = dirs
    root = write_repo(www, "djghosh/wds_vtab-pets_test", [classification_samples([0, 1]), classification_samples([2])],
                      CLASSES, TEMPLATES)
    (root / "test/nshards.txt").write_text("1\n")
    with serve(www):
        with pytest.raises(DatasetError) as err:
            prepare_dataset("wds-vtab-pets", entry("wds-vtab-pets", size=3, classes=3)["prepare"], out)
    assert "the 1 shard(s) test/nshards.txt of djghosh/wds_vtab-pets_test@" in str(err.value)
    assert "hold 2 samples in 'test' (test/0.tar 2), the entry expects 3 (spec 'size')" in str(err.value)
    assert not out.exists()


def test_every_datacomp_entry_declares_the_tasklists_size():
    """All 38 tasks (and the two fairness extras) have a test size in tasklist.yml; each entry checks it at prepare
    (WinoGAViL: instances; Flickr and MSCOCO: images, their captions too)."""
    from tools.datacomp_conf import FAIRNESS, TABLE, slug

    for key, _, size, *_ in [*TABLE, *FAIRNESS]:
        spec = entry(slug(key))["prepare"]
        assert spec["size"] == size, key
    assert entry("wds-mscoco")["prepare"]["captions"] == 25010
    assert entry("wds-flickr30k")["prepare"]["captions"] == 5000


@pytest.mark.parametrize("fault,message", [
    ("not a tar", "shard test/0.tar is not a readable tar"),
    ("cut inside a member", "shard test/0.tar member 's00000.png' declares 1,820 bytes, the shard has 1,488 after"),
    ("8 GiB member", "shard test/0.tar member 's00003.png' declares 8,589,934,592 bytes, the shard has 1,034 after "
                     "its header"),
    ("corrupt npy", "test/0.tar sample 's00001': member 's00001.npy' is not a numpy array of numbers"),
    ("pickled npy", "test/0.tar sample 's00002': member 's00002.npy' is not a numpy array of numbers (Object arrays "
                    "cannot be loaded when allow_pickle=False)"),
])
def test_shard_faults_are_one_line_errors_naming_shard_and_member(dirs, fault, message):
    """Dollar Street's layout (a group in each sample's .npy): every fault stopped with tarfile's or numpy's own
    error, naming no shard; now one line naming the shard and the member, and nothing written."""
    www, _, out = dirs
    samples = classification_samples([0, 1, 2], groups=[[3, 7, 1], [0, 2, 2], [3, 1, 0]])
    if fault == "corrupt npy":
        samples[1]["npy"] = b"\x93NUMPY\x01\x00garbage"
    if fault == "pickled npy":
        buf = __import__("io").BytesIO()
        np.save(buf, np.array([{"region": 1}], dtype=object), allow_pickle=True)
        samples[2]["npy"] = buf.getvalue()
    root = write_repo(www, "djghosh/wds_dollar_street_test", [samples], CLASSES, TEMPLATES)
    shard = root / "test/0.tar"
    if fault == "not a tar":
        shard.write_bytes(b"<html>rate limited</html>" * 40)
    if fault == "cut inside a member":
        shard.write_bytes(shard.read_bytes()[:2000])
    if fault == "8 GiB member":
        huge_member_tar(shard, samples, "s00003.png", 8 << 30)
    with serve(www):
        with pytest.raises(DatasetError) as err:
            prepare_dataset("wds-dollar_street", entry("wds-dollar_street", size=None, classes=3)["prepare"],
                            out)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith("dataset 'wds-dollar_street': ")
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
    assert {k: rows["wds-flickr30k"][k] for k in ("source", "metric", "splits", "captions")} == {
        "source": "hf_captions", "metric": "mean_recall_at_1", "splits": {"test": 1000}, "captions": 5000}
    assert (rows["wds-mscoco"]["splits"], rows["wds-mscoco"]["captions"]) == ({"test": 5000}, 25010)
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
    from tests.datacomp_cells import datacomp_cell

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
