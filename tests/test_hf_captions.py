"""Flickr and MSCOCO from DataComp's own source (vlbench/datasets/hf_captions.py): miniatures of the Hugging Face
datasets nlphuji/flickr_1k_test_image_text_retrieval and nlphuji/mscoco_2014_5k_test_image_text_retrieval as the
hub's Parquet conversion stores them, served from 127.0.0.1 as a local hub (tests/http_server.py) and read through
the hub layer (pinned in hub.lock at the first download, verified like WinoGAViL's files); the `datacomp` suite's
default entries read them, the shards stay an option."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import yaml

from tests.archives import CONF, sha256
from tests.http_server import point_branch, serve
from tests.wds_shards import REVISION, entry, png, write_hf_captions
from vlbench.compose import compose
from vlbench.dataset_entries import dataset_entry
from vlbench.datasets.canonical import DatasetError, load_meta
from vlbench.datasets.download import ChecksumError
from vlbench.datasets.hf_captions import catalogue_row
from vlbench.datasets.hub import read_lock
from vlbench.datasets.registry import prepare_dataset
from tests.datacomp_cells import datacomp_cell

COCO = "nlphuji/mscoco_2014_5k_test_image_text_retrieval"
FILES = ["TEST/test/0000.parquet", "TEST/test/0001.parquet"]
CAPTIONS = [["A dog runs.", "a dog  running ", "dog"], ["a cat."] * 5, ["two birds", "birds on a wire"],
            ["a red car parked."], ["a boat"] * 7]


def test_the_datacomp_suite_reads_flickr_and_mscoco_from_datacomps_source_and_keeps_the_shards_as_an_option():
    params = compose(["suite=datacomp"])
    for name, repo, shards in (("wds-flickr30k", "nlphuji/flickr_1k_test_image_text_retrieval",
                                "clip-benchmark/wds_flickr30k"),
                               ("wds-mscoco", COCO, "clip-benchmark/wds_mscoco_captions")):
        spec = dataset_entry(params, name)["prepare"]
        assert (spec["source"], spec["repo"], spec["split"]) == ("hf_captions", repo, "test")
        option = entry(f"{name}-shards")["prepare"]
        assert (option["source"], option["repo"], option["kind"]) == ("wds", shards, "retrieval")
        assert option["size"] == spec["size"] and f"{name}-shards" not in params["suite"]["datasets"]


def test_images_and_captions_prepared_in_file_and_row_order_exactly_as_stored(dirs, capsys):
    """The entry's own revision, the Parquet conversion's branch (URL-encoded), resolved through the hub's API and
    pinned: every file verified against the hash the hub declares (the first also against the entry's sha256)."""
    www, _, out = dirs
    paths = write_hf_captions(www, COCO, CAPTIONS, FILES)
    branch = yaml.safe_load((CONF / "wds-mscoco.yaml").read_text())["prepare"]["revision"]
    point_branch(www, COCO, "refs/convert/parquet", REVISION)
    with serve(www) as hub:
        spec = entry("wds-mscoco", revision=branch, size=5, captions=18, sha256={FILES[0]: sha256(paths[0])})[
            "prepare"]
        meta = prepare_dataset("wds-mscoco", spec, out)
    assert hub.requests[f"/api/datasets/{COCO}/revision/refs/convert/parquet"] == 1
    assert "not verified" not in capsys.readouterr().err
    assert (meta.task, meta.class_names, meta.splits) == ("captions", ["image"], {"test": 5})
    rows = pq.read_table(out / "splits/test.parquet").to_pylist()
    assert [r["captions"] for r in rows] == CAPTIONS  # every caption, whitespace and repeats as stored
    assert [r["sample_id"] for r in rows] == ["00000", "00001", "00002", "00003", "00004"]
    assert rows[3]["image"] == png(3)
    prov = load_meta(out).provenance
    assert (prov["source"], prov["repo"], prov["revision"], prov["commit"]) == ("hf_captions", COCO, branch, REVISION)
    assert [(f["path"], f["verified"], f["commit"]) for f in prov["files"]] == [(p, True, REVISION) for p in FILES]
    pin = read_lock()["wds-mscoco"]
    assert (pin.repository, pin.revision, pin.commit) == (COCO, branch, REVISION)
    assert pin.files == {f: {"sha256": sha256(p), "size": p.stat().st_size} for f, p in zip(FILES, paths)}
    assert catalogue_row("wds-mscoco", spec)["pinned"] == REVISION
    assert datacomp_cell("wds-mscoco", spec, {"i2t_r1": 0.5, "t2i_r1": 0.25}) == ("MSCOCO", 0.375)


@pytest.mark.parametrize("problem,spec,message", [
    ("images", {"size": 6, "captions": 18}, "hold 5 images with 18 captions, the entry expects 6 images (spec 'size')"),
    ("captions", {"size": 5, "captions": 25}, "hold 5 images with 18 captions, the entry expects 25 captions (spec "
                                              "'captions')"),
    ("column", {}, "TEST/test/0000.parquet has no column(s) ['caption'] (DataComp's retr_eval.py reads ['image', "
                   "'caption'])"),
    ("empty", {}, "TEST/test/0001.parquet row 1: 'caption' must be a non-empty list of texts, got []"),
    ("image", {}, "corrupt or truncated image(s): 'TEST/test/0000.parquet row 2'"),
])
def test_bad_files_are_one_line_errors_naming_file_and_row(dirs, problem, spec, message):
    www, _, out = dirs
    captions = [*CAPTIONS[:4], []] if problem == "empty" else CAPTIONS
    paths = write_hf_captions(www, COCO, captions, FILES)
    if problem == "column":
        pq.write_table(pq.read_table(paths[0]).drop_columns(["caption"]), paths[0])
    if problem == "image":
        table = pq.read_table(paths[0])
        images = table.column("image").to_pylist()
        images[2]["bytes"] = images[2]["bytes"][:60]
        pq.write_table(table.set_column(0, "image", pa.array(images, table.schema.field("image").type)), paths[0])
    with serve(www):
        with pytest.raises(DatasetError, match="wds-mscoco") as err:
            prepare_dataset("wds-mscoco", entry("wds-mscoco", **{"size": 5, "captions": 18, **spec})[
                "prepare"], out)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not out.exists()


def test_a_file_that_differs_from_the_pin_is_refused(dirs, tmp_path, monkeypatch):
    """Once pinned, a Parquet file whose bytes changed at the hub (the cache emptied) is an error naming the file, both
    hashes and the command that moves the pin; nothing is written."""
    www, _, out = dirs
    paths = write_hf_captions(www, COCO, CAPTIONS, FILES)
    spec = entry("wds-mscoco", size=5, captions=18)["prepare"]
    with serve(www):
        prepare_dataset("wds-mscoco", spec, out / "first")
    pinned = sha256(paths[1])
    write_hf_captions(www, COCO, [*CAPTIONS[:4], ["a ship"] * 7], FILES)
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "empty-cache"))
    with serve(www), pytest.raises(ChecksumError) as err:
        prepare_dataset("wds-mscoco", spec, out / "again")
    message = str(err.value)
    assert "0001.parquet" in message and pinned in message and sha256(paths[1]) in message
    assert "vlbench lock --update wds-mscoco" in message and not (out / "again").exists()
