"""The `vtab` source on miniature TFDS-prepared folders that the tests write (real TFRecord bytes)."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from tests.tfds_fixtures import serialize_example
from tests.tfds_fixtures import write_tfds_folder as write_folder
from vlbench.analyses.adapt import vtab as adapt_vtab
from vlbench.datasets import vtab_tasks
from vlbench.datasets.canonical import DatasetError, load_meta
from vlbench.datasets.download import ManualDownloadError
from vlbench.datasets.registry import describe, prepare_dataset
from vlbench.datasets.tfrecord import write_records
from vlbench.datasets.vtab import shard_name
from vlbench.datasets.vtab_tasks import VtabTask
from vlbench.features import embedding_array, features_schema, write_table
from vlbench.texts import text_table, write_text_sets

SHARDS = {"train": [4, 3, 2], "test": [3]}  # TFDS split -> records per shard


def label_rule(features):
    return int(features["n"][0]) % 3  # the test's own rule: n mod 3


TASK = VtabTask(
    name="mini_task", group="structured", tfds="minids/cfg", version="1.2.0",
    splits={"train": (("train", 0, 5),), "val": (("train", 5, 9),), "test": (("test", 0, 3),),
            "train800": (("train", 0, 2),), "val200": (("train", 5, 7),),
            "train800val200": (("train", 0, 2), ("train", 5, 7))},
    classes=("zero", "one", "two"), label=label_rule, class_source="the test",
)


def image(split, row):
    return f"image {split} {row}".encode()  # stored bytes are copied, never decoded: any bytes do


def n_of(split, row):
    return 7 * row + (100 if split == "test" else 0)


def records(split):
    rows, out = 0, []
    for count in SHARDS[split]:
        out.append([serialize_example({"image": [image(split, r)], "n": [n_of(split, r)]})
                    for r in range(rows, rows + count)])
        rows += count
    return out


@pytest.fixture
def task(monkeypatch):
    monkeypatch.setitem(vtab_tasks.TASKS, TASK.name, TASK)
    return TASK


@pytest.fixture
def root(tmp_path, task):
    write_folder(tmp_path / "tfds", task, {split: records(split) for split in SHARDS})
    return tmp_path / "tfds"


def spec(root):
    return {"source": "vtab", "task": TASK.name, "root": str(root)}


def expected(split):
    """(sample_id, label, image) of a VTAB split, from the slices and the test's own row -> n rule."""
    return [(f"{s}/{r:07d}", n_of(s, r) % 3, image(s, r)) for s, a, b in TASK.splits[split] for r in range(a, b)]


def test_prepare_gives_each_vtab_split_in_tfds_order_across_shards(tmp_path, root):
    meta = prepare_dataset("vtab-mini", spec(root), tmp_path / "out")
    assert meta.splits == {"train": 5, "val": 4, "test": 3}  # the 1k splits are train's / val's first rows
    assert not (tmp_path / "out" / "splits" / "train800.parquet").exists()
    for split in meta.splits:
        table = pq.read_table(tmp_path / "out" / "splits" / f"{split}.parquet")
        got = list(zip(table["sample_id"].to_pylist(), table["label"].to_pylist(), table["image"].to_pylist()))
        assert got == expected(split), split
        if split in ("train", "val"):  # adapt.vtab's train800 / val200: the first rows
            assert got[:2] == expected({"train": "train800", "val": "val200"}[split])
    # rows 4..6 sit in the second shard, row 7 in the third: the val split crosses a shard boundary
    assert [sid for sid, _, _ in expected("val")] == ["train/0000005", "train/0000006", "train/0000007", "train/0000008"]
    classes = json.loads((tmp_path / "out" / "classes.json").read_text())
    assert [c["name"] for c in classes["classes"]] == ["zero", "one", "two"]
    assert classes["preprocess"] == "squash"
    assert classes["provenance"]["group"] == "structured"
    assert classes["provenance"]["tfds_version"] == "1.2.0"
    assert classes["provenance"]["subsets"] == {"train800": "the first 2 rows of train", "val200": "the first 2 rows of val",
                                                "train800val200": "train800 + val200"}
    assert classes["provenance"]["files"]["train"][1] == {
        "file": "minids-train.tfrecord-00001-of-00003", "records": 3,
        "bytes": (root / "minids/cfg/1.2.0/minids-train.tfrecord-00001-of-00003").stat().st_size}


def test_prepared_task_is_accepted_by_adapt_vtab_and_has_its_group(tmp_path, root):
    prepare_dataset("vtab-mini", spec(root), tmp_path / "out")
    meta = load_meta(tmp_path / "out")
    adapt_vtab.check_preprocess(meta, adapt_vtab.settings({}))
    own = meta.provenance["group"]
    assert adapt_vtab.task_group(meta.name, {}, own) == "structured"  # from the data: "vtab-mini" is in no table
    assert adapt_vtab.task_group(meta.name, {"vtab-mini": "natural"}, own) == "natural"  # params still win
    with pytest.raises(adapt_vtab.AdaptError, match="'vtab-mini' has no VTAB group"):
        adapt_vtab.task_group(meta.name, {})


def test_catalogue_row_needs_no_files(task, tmp_path):
    row = describe("vtab-mini", {"prepare": spec(tmp_path / "nowhere"), "input": str(tmp_path)})
    assert row["classes"] == 3 and row["group"] == "structured" and row["metric"] == "accuracy"
    assert row["splits"] == {"train": 5, "val": 4, "test": 3, "train800": 2, "val200": 2, "train800val200": 4}
    assert row["manual_download"] is True


def test_missing_folder_names_what_is_needed_and_how_to_get_it(task, tmp_path):
    with pytest.raises(ManualDownloadError) as err:
        prepare_dataset("vtab-mini", spec(tmp_path / "tfds"), tmp_path / "out")
    message = str(err.value)
    assert str(tmp_path / "tfds/minids/cfg/1.2.0/dataset_info.json") in message
    assert "split(s) train, test" in message and "tfds.builder('minids/cfg:1.2.0'" in message
    assert "gs://tfds-data/datasets/minids/cfg/1.2.0/" in message
    assert not (tmp_path / "out").exists()


def test_missing_shards_are_all_named_in_one_message(tmp_path, root):
    folder = root / "minids/cfg/1.2.0"
    for name in ("minids-train.tfrecord-00002-of-00003", "minids-test.tfrecord-00000-of-00001"):
        (folder / name).unlink()
    with pytest.raises(ManualDownloadError, match="2 TFRecord shard") as err:
        prepare_dataset("vtab-mini", spec(root), tmp_path / "out")
    assert "minids-train.tfrecord-00002-of-00003" in str(err.value)
    assert "minids-test.tfrecord-00000-of-00001" in str(err.value)


def test_version_mismatch_is_refused(tmp_path, root):
    info_path = root / "minids/cfg/1.2.0/dataset_info.json"
    info = json.loads(info_path.read_text())
    info_path.write_text(json.dumps({**info, "version": "1.1.0"}))
    with pytest.raises(DatasetError, match=r"dataset_info.json: version 1.1.0 but VTAB task 'mini_task' is pinned to "
                                           r"minids/cfg version 1.2.0"):
        prepare_dataset("vtab-mini", spec(root), tmp_path / "out")


def test_corrupt_truncated_or_wrong_shards_are_refused_naming_the_file(tmp_path, root):
    shard = root / "minids/cfg/1.2.0" / shard_name(TASK, "train", 1, 3)
    good = shard.read_bytes()
    damaged = bytearray(good)
    damaged[-6] ^= 0xFF  # inside the last record's data
    shard.write_bytes(bytes(damaged))
    with pytest.raises(DatasetError, match=rf"{shard}: record 2 has a bad data checksum"):
        prepare_dataset("vtab-mini", spec(root), tmp_path / "out")
    shard.write_bytes(good[:-10])
    with pytest.raises(DatasetError, match=rf"{shard}: record 2 is truncated"):
        prepare_dataset("vtab-mini", spec(root), tmp_path / "out")
    write_records(shard, records("train")[1][:2])  # a whole record fewer than shardLengths says
    with pytest.raises(DatasetError, match=rf"{shard}: 2 records but dataset_info.json's shardLengths says 3"):
        prepare_dataset("vtab-mini", spec(root), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_record_the_label_rule_cannot_read_is_named(tmp_path, root):
    shard = root / "minids/cfg/1.2.0" / shard_name(TASK, "test", 0, 1)
    rows = records("test")[0]
    rows[1] = serialize_example({"image": [b"x"], "m": [1]})
    write_records(shard, rows)
    with pytest.raises(DatasetError, match=rf"{shard} record 1: the label rule of VTAB task 'mini_task' failed "
                                           r"\(KeyError: 'n'\); features present: \['image', 'm'\]"):
        prepare_dataset("vtab-mini", spec(root), tmp_path / "out")


def test_unknown_task_and_missing_root_are_refused(task, tmp_path):
    with pytest.raises(DatasetError, match="'task' must be one of VTAB's tasks"):
        prepare_dataset("vtab-x", {"source": "vtab", "task": "nope", "root": "x"}, tmp_path / "out")
    with pytest.raises(DatasetError, match="'root' .* is required"):
        prepare_dataset("vtab-x", {"source": "vtab", "task": TASK.name}, tmp_path / "out")


# ------------------------------------------------------------------------------------------- registry and suite

ROOT = Path(__file__).resolve().parents[1]
GROUPS = json.loads((ROOT / "vlbench/analyses/adapt/vtab_groups.json").read_text())["groups"]


def test_entries_and_suite_are_what_the_tool_generates():
    proc = subprocess.run([sys.executable, "tools/vtab_conf.py", "--check"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_suite_composes_with_the_19_tasks_and_vtab_adaptation():
    from vlbench.compose import compose

    params = compose(["suite=vtab"])
    names = [f"vtab-{t}" for t in GROUPS]
    assert list(params["suite"]["datasets"]) == names
    assert params["suite"]["embed"] == params["suite"]["zeroshot"] == params["suite"]["adapt"] == names
    assert params["adapt"]["protocols"] == ["vtab"]
    for task in GROUPS:
        entry = yaml.safe_load((ROOT / f"conf/dataset/vtab-{task}.yaml").read_text())
        assert entry["prepare"] == {"source": "vtab", "task": task, "root": "data/tfds"}


@pytest.mark.skipif(not vtab_tasks.TASKS, reason="vtab_tasks.TASKS is filled on branch vtab-tasks")
def test_catalogue_lists_the_19_tasks_with_group_without_any_file(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "vlbench.cli", "datasets", "--suite", "vtab", "--json"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["name"] for r in rows] == [f"vtab-{t}" for t in GROUPS]
    for row in rows:
        task = vtab_tasks.TASKS[row["name"].removeprefix("vtab-")]
        assert row["source"] == "vtab" and row["metric"] == "accuracy"
        assert row["group"] == GROUPS[task.name] == task.group
        assert row["classes"] == len(task.classes) > 1
        assert {"train", "val", "test", "train800", "val200", "train800val200"} <= set(row["splits"])
        assert row["splits"]["train800"] == 800 and row["splits"]["val200"] == 200
        assert row["splits"]["train800val200"] == 1000


def test_1k_splits_that_are_not_prefixes_are_refused(tmp_path, root, monkeypatch):
    import dataclasses

    shifted = dataclasses.replace(TASK, splits={**TASK.splits, "val200": (("train", 6, 8),)})
    monkeypatch.setitem(vtab_tasks.TASKS, TASK.name, shifted)
    with pytest.raises(DatasetError, match="VTAB split 'val200' of task 'mini_task' is not the first rows of 'val'"):
        prepare_dataset("vtab-mini", spec(root), tmp_path / "out")
    mixed = dataclasses.replace(TASK, splits={**TASK.splits, "train800val200": (("train", 5, 7), ("train", 0, 2))})
    monkeypatch.setitem(vtab_tasks.TASKS, TASK.name, mixed)
    with pytest.raises(DatasetError, match="'train800val200' of task 'mini_task' is not train800 \\+ val200"):
        prepare_dataset("vtab-mini", spec(root), tmp_path / "out")


def test_entry_input_must_contain_the_tfds_root(task):
    from vlbench.datasets.registry import check_input
    from vlbench.params import ParamsError

    check_input("vtab-mini", {"prepare": spec("data/tfds"), "input": "data/tfds"})
    with pytest.raises(ParamsError, match="does not contain 'data/tfds'"):
        check_input("vtab-mini", {"prepare": spec("data/tfds"), "input": "data/other"})


def test_malformed_dataset_info_is_refused_naming_it(tmp_path, root):
    info_path = root / "minids/cfg/1.2.0/dataset_info.json"
    info = json.loads(info_path.read_text())
    info["splits"][0]["shardLengths"] = ["Unknown"]
    info_path.write_text(json.dumps(info))
    with pytest.raises(DatasetError, match=r"dataset_info.json: split 'train' has shardLengths \['Unknown'\], not counts"):
        prepare_dataset("vtab-mini", spec(root), tmp_path / "out")
    info_path.write_text("{not json")
    with pytest.raises(DatasetError, match=r"dataset_info.json: not a TFDS dataset_info.json"):
        prepare_dataset("vtab-mini", spec(root), tmp_path / "out")


def test_catalogue_of_the_vtab_suite_has_group_classes_and_sizes(monkeypatch):
    """The suite's catalogue through the registry, with a stand-in table (the real one is vtab_tasks.TASKS)."""
    import dataclasses

    from vlbench.datasets.registry import catalogue

    for i, (name, group) in enumerate(GROUPS.items()):
        classes = tuple(f"c{k}" for k in range(2 + i))
        monkeypatch.setitem(vtab_tasks.TASKS, name, dataclasses.replace(TASK, name=name, group=group, classes=classes))
    rows = catalogue("vtab", ROOT / "conf")
    assert [r["name"] for r in rows] == [f"vtab-{t}" for t in GROUPS]
    for i, row in enumerate(rows):
        assert row["group"] == GROUPS[row["name"].removeprefix("vtab-")] and row["classes"] == 2 + i
        assert row["splits"] == TASK.split_sizes() and row["metric"] == "accuracy" and row["source"] == "vtab"


def test_dsprites_pixels_are_scaled_to_255_losslessly(tmp_path, monkeypatch):
    """dSprites stores 0/1 pixels; the model must see 0/255 (task_adaptation multiplies by 255)."""
    import dataclasses
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    masks = [rng.integers(0, 2, (8, 8), dtype=np.uint8) for _ in range(9)]

    def png(mask):
        out = io.BytesIO()
        Image.fromarray(mask, mode="L").save(out, format="PNG")
        return out.getvalue()

    task = dataclasses.replace(TASK, name="mini_sprites", pixel_scale=255)
    monkeypatch.setitem(vtab_tasks.TASKS, task.name, task)
    shards = [[serialize_example({"image": [png(masks[r])], "n": [r]}) for r in rows] for rows in ((0, 1, 2, 3), (4, 5, 6, 7, 8))]
    write_folder(tmp_path / "tfds", task, {"train": shards, "test": [shards[0][:3]]})
    prepare_dataset("vtab-sprites", {**spec(tmp_path / "tfds"), "task": task.name}, tmp_path / "out")
    table = pq.read_table(tmp_path / "out" / "splits" / "train.parquet")
    for sample_id, data in zip(table["sample_id"].to_pylist(), table["image"].to_pylist()):
        got = np.asarray(Image.open(io.BytesIO(data)))
        assert np.array_equal(got, masks[int(sample_id.split("/")[1])] * 255), sample_id
    provenance = json.loads((tmp_path / "out" / "classes.json").read_text())["provenance"]
    assert "times 255" in provenance["image_encoding"]


# ----------------------------------------------------------------------------------------------------------------
# The identity of a partition made at preparation (TFDS's Caltech-101: file-system order)

PARTITIONED = replace(TASK, name="mini_partitioned", identity_key="image/file_name")


def named_records(files: dict[str, list[str]], shards: dict[str, list[int]] = SHARDS) -> dict[str, list[list[bytes]]]:
    """Records whose file names the test picks; n (hence the label) from the name's number."""
    out = {}
    for split, names in files.items():
        examples = [serialize_example({"image": [name.encode()], "n": [int(name[4:8])],
                                       "image/file_name": [name.encode()]}) for name in names]
        out[split], start = [], 0
        for count in shards[split]:
            out[split].append(examples[start:start + count])
            start += count
    return out


def prepared_partition(tmp_path, monkeypatch, files, shards=SHARDS, name="a") -> dict:
    monkeypatch.setitem(vtab_tasks.TASKS, PARTITIONED.name, PARTITIONED)
    root = tmp_path / name / "tfds"
    write_folder(root, PARTITIONED, named_records(files, shards))
    prepare_dataset("vtab-part", {**spec(root), "task": PARTITIONED.name}, tmp_path / name / "out")
    return load_meta(tmp_path / name / "out").provenance["partition"]


FILES = {"train": [f"img_{k:04d}.jpg" for k in range(9)], "test": [f"img_{k:04d}.jpg" for k in range(9, 12)]}


def test_caltech101_records_its_partition_as_a_hash_of_its_train_and_test_ids():
    assert vtab_tasks.TASKS["caltech101"].identity_key == "image/file_name"  # TFDS caltech101's feature
    assert all(t.identity_key is None for n, t in vtab_tasks.TASKS.items() if n != "caltech101")


def test_partition_identity_is_the_hash_of_label_and_file_name_per_split(tmp_path, monkeypatch):
    got = prepared_partition(tmp_path, monkeypatch, FILES)
    by_hand = {split: hashlib.sha256("".join(f"{int(f[4:8]) % 3}/{f}\n" for f in names).encode()).hexdigest()
               for split, names in FILES.items()}
    assert got["splits"] == by_hand
    assert got["sha256"] == hashlib.sha256(f"test {by_hand['test']}\ntrain {by_hand['train']}\n".encode()).hexdigest()
    # the same examples in the same order, in other shards: the same partition
    same = prepared_partition(tmp_path, monkeypatch, FILES, {"train": [9], "test": [1, 2]}, name="b")
    assert same == got
    # another preparation that put one other image in train (as a file-system order can): another identity
    swapped = {"train": FILES["train"][:8] + FILES["test"][:1], "test": FILES["train"][8:] + FILES["test"][1:]}
    other = prepared_partition(tmp_path, monkeypatch, swapped, name="c")
    assert other["sha256"] != got["sha256"] and other["splits"]["train"] != got["splits"]["train"]


def test_an_example_without_its_identity_is_named(tmp_path, monkeypatch, root):
    monkeypatch.setitem(vtab_tasks.TASKS, PARTITIONED.name, PARTITIONED)
    write_folder(tmp_path / "plain", PARTITIONED, {split: records(split) for split in SHARDS})
    with pytest.raises(DatasetError, match=r"minids-test.tfrecord-00000-of-00001 record 0: feature 'image/file_name' "
                                           r"must hold one value"):
        prepare_dataset("vtab-part", {**spec(tmp_path / "plain"), "task": PARTITIONED.name}, tmp_path / "out")


def test_the_analysis_stage_writes_the_partition_into_the_result(tmp_path, monkeypatch):
    """A zero-shot result on the prepared miniature, through the real stage: its JSON carries the partition."""
    got = prepared_partition(tmp_path, monkeypatch, FILES)
    meta = load_meta(tmp_path / "a" / "out")
    shutil.copytree(tmp_path / "a" / "out", tmp_path / "data" / "prepared" / "vtab-part")
    identity = {"model": "m", "arch": "a", "pretrained": "openai"}
    rng = np.random.default_rng(0)
    test = pq.read_table(tmp_path / "a" / "out" / "splits" / "test.parquet").select(["sample_id", "label"])
    feats = tmp_path / "features" / "m" / "vtab-part"
    (feats / "images").mkdir(parents=True)
    write_table(feats / "images" / "test.parquet",
                [test.append_column("embedding", embedding_array(rng.normal(size=(test.num_rows, 4))))],
                features_schema(test.schema, 4, {**identity, "dataset": "vtab-part", "dataset_version": meta.version,
                                                 "decode": "pil"}))
    prompts = text_table("class_index", [0, 1, 2], ["template"] * 3, ["zero", "one", "two"])
    versions = write_text_sets(tmp_path / "data" / "texts" / "vtab-part", "vtab-part", {"prompts": prompts})
    (feats / "text").mkdir()
    write_table(feats / "text" / "prompts.parquet",
                [prompts.append_column("embedding", embedding_array(rng.normal(size=(3, 4))))],
                features_schema(prompts.schema, 4, {**identity, "dataset": "vtab-part", "text_set": "prompts",
                                                    "text_version": versions["prompts"]}))
    params = {"seed": 0, "model": {"slug": "m", "arch": "a", "pretrained": "openai"}, "embed": {"decode": "pil"},
              "zeroshot": {"split": "test"}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    proc = subprocess.run([sys.executable, "-m", "stages.analysis", "--analysis", "zeroshot", "--dataset", "vtab-part"],
                          cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "reports" / "zeroshot" / "vtab-part.json").read_text())
    assert result["partition"] == got
