"""The WinoGAViL source (vlbench/datasets/winogavil.py) on a miniature of the Hugging Face dataset's Parquet files,
served from 127.0.0.1: one canonical image row per candidate, DataComp's prompts as the class texts, checksums, and
one-line errors naming the file and the row."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from tests.archives import sha256
from tests.http_server import serve
from tests.wds_shards import REVISION, entry, winogavil_instances, write_winogavil
from vlbench.datasets.canonical import DatasetError, load_meta
from vlbench.datasets.registry import catalogue, prepare_dataset
from tests.datacomp_cells import datacomp_cell
from vlbench.datasets.winogavil import prompt
from vlbench.texts import build_text_sets

NAME = "wds-winogavil"
PATH = "default/test/0000.parquet"


def _prepare(www, out, instances, **spec):
    write_winogavil(www, instances)
    with serve(www):
        return prepare_dataset(NAME, entry(NAME, size=len(instances), **spec)["prepare"], out)


def test_datacomps_prompt():
    """wino_eval.py's get_clip_prompt: lower-cased, "An" before a vowel."""
    assert [prompt(c) for c in ("Apple", "moon", "Umbrella", "ICE", "yak")] == [
        "An apple", "A moon", "An umbrella", "An ice", "A yak"]


def test_candidates_become_image_rows_of_their_instance(dirs, capsys):
    www, _, out = dirs
    instances = winogavil_instances([5, 6, 10, 12, 5])
    target = write_winogavil(www, instances)
    with serve(www):
        meta = prepare_dataset(NAME, entry(NAME, size=5, sha256={PATH: sha256(target)})["prepare"], out)
    assert "not verified" not in capsys.readouterr().err
    assert (meta.task, meta.metric, meta.splits) == ("single-label", "winogavil_jaccard", {"test": 38})
    assert [c.name for c in meta.classes] == ["An apple", "A moon", "An ice", "A werewolf", "An ocean"]
    assert [c.key for c in meta.classes] == ["Apple", "moon", "ice", "Werewolf", "ocean"]
    rows = pq.read_table(out / "splits/test.parquet").to_pylist()
    expected = [(f"{i:05d}/{j:02d}", i, name, name in inst["associations"], inst["images"][j])
                for i, inst in enumerate(instances) for j, name in enumerate(inst["candidates"])]
    assert [(r["sample_id"], r["label"], r["candidate"], r["association"], r["image"]) for r in rows] == expected
    prov = load_meta(out).provenance
    assert (prov["source"], prov["repo"], prov["revision"]) == ("winogavil", "nlphuji/winogavil", REVISION)
    assert [(f["path"], f["verified"]) for f in prov["files"]] == [(PATH, True)]
    sets = build_text_sets(meta, out, entry(NAME)["texts"])
    assert sets["prompts"].column("text").to_pylist() == ["An apple", "A moon", "An ice", "A werewolf", "An ocean"]


def test_the_entry_gives_its_catalogue_row_and_cell():
    row = next(r for r in catalogue("datacomp") if r["name"] == NAME)
    assert (row["source"], row["instances"], row["metric"], row["main_metric"], row["task"]) == (
        "winogavil", 3563, "winogavil_jaccard", "jaccard_score_10-12", "WinoGAViL")
    assert row["splits"] == {} and "images is known after prepare" in row["note"]  # plan: images unknown, not 3563
    spec = entry(NAME)["prepare"]
    assert datacomp_cell(NAME, spec, {"winogavil_jaccard": 0.4}) == ("WinoGAViL", 0.4)
    with pytest.raises(DatasetError, match="no 'winogavil_jaccard'"):
        datacomp_cell(NAME, spec, {"accuracy": 0.4})


@pytest.mark.parametrize("change, message", [
    (lambda i: i[1].update(associations=[i[1]["candidates"][0], "nowhere"]),
     f"{PATH} row 1: association(s) ['nowhere'] are not among its candidates"),
    (lambda i: i[2]["images"].__setitem__(3, b"\x89PNG not really"),
     f"{PATH} row 2 candidate 'thing2_3': not an image format Pillow reads"),
    (lambda i: i[0].update(images=i[0]["images"][:4]),
     f"{PATH} row 0: 'candidate_images' has 4 image(s) for 5 candidates"),
])
def test_a_bad_row_is_a_one_line_error_naming_file_and_row(dirs, change, message):
    www, _, out = dirs
    instances = winogavil_instances([5, 6, 10])
    change(instances)
    with pytest.raises(DatasetError, match=NAME) as err:
        _prepare(www, out, instances)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not out.exists()


def test_a_wrong_instance_count_is_refused(dirs):
    www, _, out = dirs
    write_winogavil(www, winogavil_instances([5, 6]))
    with serve(www), pytest.raises(DatasetError, match="hold 2 instances, the entry expects 3"):
        prepare_dataset(NAME, entry(NAME, size=3)["prepare"], out)
