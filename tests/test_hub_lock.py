"""Hugging Face files verified at their first download and pinned after it (vlbench/datasets/hub.py, hub.lock), against
a local server that speaks the hub's revision API and resolve URLs (tests/http_server.py): the first download
verified and recorded, `main` moved after the pin, bytes that differ from the declared hash, a missing LFS pointer,
a lock edited by hand, and offline runs that make no request."""

from __future__ import annotations

import json
import subprocess

import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from tests.archives import CONF, sha256
from tests.http_server import git_blob_id, point_branch, serve
from tests.wds_shards import classification_samples, entry, winogavil_instances, write_repo, write_winogavil
from vlbench.cli import main
from vlbench.datasets.canonical import load_meta
from vlbench.datasets.download import ChecksumError, ManualDownloadError, _hash_file
from vlbench.datasets.hub import PinError, read_lock
from vlbench.datasets.registry import prepare_dataset
from vlbench.datasets.wds import catalogue_row

NAME, REPO = "wds-vtab-pets", "djghosh/wds_vtab-pets_test"
C1, C2 = "1" * 40, "2" * 40
CLASSES, TEMPLATES = ["abyssinian", "beagle", "boxer"], ["a photo of a {c}."]
FILES = ["test/nshards.txt", "classnames.txt", "zeroshot_classification_templates.txt", "test/0.tar"]


def _hub(www, commit=C1, classes=CLASSES, labels=(0, 1, 2)):
    """The repository at `commit`, its branch main pointing there."""
    root = write_repo(www, REPO, [classification_samples(list(labels), seed=int(commit[0]))], classes, TEMPLATES,
                      revision=commit)
    point_branch(www, REPO, "main", commit)
    return root


def _prepare(out, **spec):
    return prepare_dataset(NAME, entry(NAME, **{"revision": "main", "size": 3, "classes": 3, **spec})["prepare"], out)


def _lock_file(tmp_path):
    return tmp_path / "hub.lock"


def test_the_first_download_resolves_main_verifies_every_file_and_records_it(dirs, tmp_path):
    www, _, out = dirs
    root = _hub(www)
    with serve(www) as hub:
        meta = _prepare(out)
    pin = read_lock()[NAME]
    assert (pin.repository, pin.revision, pin.commit) == (REPO, "main", C1)
    assert pin.files == {p: {"sha256": sha256(root / p), "size": (root / p).stat().st_size} for p in FILES}
    assert hub.requests[f"/api/datasets/{REPO}/revision/main"] == 1  # the branch, resolved once
    assert {p for p in hub.requests if "/resolve/" in p} == {f"/datasets/{REPO}/resolve/{C1}/{p}" for p in FILES}
    prov = meta.provenance
    assert (prov["revision"], prov["commit"]) == ("main", C1)
    assert all(f["verified"] and f["commit"] == C1 for f in prov["files"])
    text = _lock_file(tmp_path).read_text()
    assert text.startswith("# Hugging Face dataset repositories pinned") and yaml.safe_load(text)[NAME]["commit"] == C1


def test_main_moved_after_the_pin_is_ignored_until_lock_update_moves_it(dirs, tmp_path, monkeypatch):
    www, _, out = dirs
    _hub(www)
    with serve(www):
        _prepare(out / "first")
    old = read_lock()[NAME]
    root2 = _hub(www, C2, classes=["sphynx", "pug", "corgi"], labels=(2, 2, 0))  # main moves to another commit
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "empty-cache"))  # everything downloaded again
    with serve(www) as hub:
        meta = _prepare(out / "again")
    assert meta.class_names == CLASSES and meta.provenance["commit"] == C1  # the pinned commit, not main's
    assert read_lock()[NAME] == old
    assert not any(C2 in p for p in hub.requests) and not any("/api/" in p for p in hub.requests)

    with serve(www) as hub:
        result = CliRunner().invoke(main, ["--conf", str(CONF.parent), "lock", "--update", NAME])
        assert result.exit_code == 0, result.output
        assert f"moved from {C1} (4 files forgotten) to {C2}" in result.output
        assert "dvc repro -f -s prepare@wds-vtab-pets" in result.output
        moved = _prepare(out / "moved")
    pin = read_lock()[NAME]
    assert (pin.commit, moved.class_names, moved.provenance["commit"]) == (C2, ["sphynx", "pug", "corgi"], C2)
    assert pin.files["classnames.txt"] == {"sha256": sha256(root2 / "classnames.txt"),
                                           "size": (root2 / "classnames.txt").stat().st_size}
    assert pq.read_table(out / "moved/splits/test.parquet").column("label").to_pylist() == [2, 2, 0]
    with serve(www):  # main has not moved since: the pin and its files stay
        result = CliRunner().invoke(main, ["--conf", str(CONF.parent), "lock", "--update", NAME])
    assert f"is still at {C2}" in result.output and read_lock()[NAME] == pin


def test_bytes_that_differ_from_the_hubs_declared_hash_are_refused(dirs):
    www, _, out = dirs
    root = _hub(www)
    with serve(www, hub_metadata={"test/0.tar": {"lfs": {"sha256": "f" * 64}}}), pytest.raises(ChecksumError) as err:
        _prepare(out)
    message = str(err.value)
    assert "test__0.tar" in message and sha256(root / "test/0.tar") in message and "f" * 64 in message
    assert "vlbench lock --update wds-vtab-pets" in message and "\n" not in message
    assert "test/0.tar" not in read_lock()[NAME].files and not out.exists()


def test_a_git_file_is_verified_by_its_blob_id(dirs):
    www, _, out = dirs
    _hub(www)
    with serve(www, hub_metadata={"classnames.txt": {"blobId": "0" * 40}}), pytest.raises(ChecksumError) as err:
        _prepare(out)
    blob_id = git_blob_id((www / "datasets" / REPO / "resolve" / C1 / "classnames.txt").read_bytes())
    assert "classnames.txt" in str(err.value) and f"gave git_sha1 {blob_id}, expected {'0' * 40}" in str(err.value)


def test_git_sha1_is_gits_blob_id(tmp_path):
    """The digest a hub declares for a file kept in git is `git hash-object`'s."""
    path = tmp_path / "classnames.txt"
    path.write_bytes("\n".join(CLASSES).encode() + b"\n\x00tail")
    git = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True).stdout.strip()
    assert _hash_file(path, ("git_sha1",))["git_sha1"] == git


def test_a_file_without_lfs_pointer_or_blob_id_is_refused_before_download(dirs):
    www, _, out = dirs
    _hub(www)
    with serve(www, hub_metadata={"test/0.tar": None}) as hub, pytest.raises(ChecksumError) as err:
        _prepare(out)
    assert f"the hub declares no hash for {REPO}@{C1} 'test/0.tar'" in str(err.value)
    assert hub.requests[f"/datasets/{REPO}/resolve/{C1}/test/0.tar"] == 0  # nothing unverifiable is downloaded


@pytest.mark.parametrize("cache", ["kept", "emptied"])
def test_a_lock_edited_by_hand_to_a_wrong_hash_is_an_error(dirs, tmp_path, monkeypatch, cache):
    www, _, out = dirs
    root = _hub(www)
    with serve(www):
        _prepare(out / "first")
    lock = yaml.safe_load(_lock_file(tmp_path).read_text())
    lock[NAME]["files"]["test/0.tar"]["sha256"] = "a" * 64
    _lock_file(tmp_path).write_text(yaml.safe_dump(lock))
    if cache == "emptied":
        monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "empty-cache"))
    with serve(www), pytest.raises(ChecksumError) as err:
        _prepare(out / "again")
    message = str(err.value)
    assert "test__0.tar" in message and "a" * 64 in message and sha256(root / "test/0.tar") in message
    assert "vlbench lock --update wds-vtab-pets" in message and not (out / "again").exists()


def test_a_malformed_lock_and_a_changed_entry_are_named(dirs, tmp_path):
    www, _, out = dirs
    _hub(www)
    with serve(www):
        _prepare(out / "first")
        with pytest.raises(PinError, match=r"the entry reads djghosh/wds_vtab-pets_test@" + C1 + r", .*pins "
                                           r"djghosh/wds_vtab-pets_test@main .*vlbench lock --update wds-vtab-pets"):
            _prepare(out / "other", revision=C1)
    lock = yaml.safe_load(_lock_file(tmp_path).read_text())
    lock[NAME]["files"]["test/0.tar"]["sha256"] = "not hex"
    _lock_file(tmp_path).write_text(yaml.safe_dump(lock))
    with pytest.raises(PinError, match=r"hub.lock, entry 'wds-vtab-pets': file 'test/0.tar' needs 'sha256'"):
        read_lock()


def test_offline_with_lock_and_cache_makes_no_request(dirs, monkeypatch):
    www, _, out = dirs
    _hub(www)
    with serve(www):
        first = _prepare(out / "first")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with serve(www) as hub:
        again = _prepare(out / "offline")
    assert sum(hub.requests.values()) == 0
    assert again.provenance["files"] == first.provenance["files"]
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # no hub at all: a pinned, cached entry needs none
    assert _prepare(out / "no-network").provenance["commit"] == C1


def test_offline_without_a_pin_or_a_cached_file_says_what_to_do(dirs, tmp_path, monkeypatch):
    www, _, out = dirs
    _hub(www)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with serve(www) as hub, pytest.raises(PinError, match="HF_HUB_OFFLINE is set and .*hub.lock has no pin for it"):
        _prepare(out)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with serve(www):
        _prepare(out / "first")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "empty-cache"))
    with serve(www) as hub, pytest.raises(ManualDownloadError, match="HF_HUB_OFFLINE is set, so nothing is downloaded"):
        _prepare(out / "offline")
    assert sum(hub.requests.values()) == 0


def test_a_branch_with_slashes_is_resolved_through_the_api(dirs):
    """WinoGAViL's entry reads the hub's Parquet conversion, branch `refs/convert/parquet` (URL-encoded in the
    entry)."""
    www, _, out = dirs
    instances = winogavil_instances([5, 6])
    target = write_winogavil(www, instances, revision=C1)
    point_branch(www, "nlphuji/winogavil", "refs/convert/parquet", C1)
    spec = entry("wds-winogavil", size=2)["prepare"] | {"revision": "refs%2Fconvert%2Fparquet"}
    with serve(www) as hub:
        meta = prepare_dataset("wds-winogavil", spec, out)
    assert hub.requests["/api/datasets/nlphuji/winogavil/revision/refs/convert/parquet"] == 1
    assert load_meta(out).provenance["commit"] == meta.provenance["commit"] == C1
    assert read_lock()["wds-winogavil"].files == {"default/test/0000.parquet": {
        "sha256": sha256(target), "size": target.stat().st_size}}


def test_lock_shows_the_pins(dirs):
    www, _, out = dirs
    assert "no pins yet" in CliRunner().invoke(main, ["--conf", str(CONF.parent), "lock"]).output
    assert catalogue_row(NAME, entry(NAME, revision="main")["prepare"])["pinned"] is None
    _hub(www)
    with serve(www):
        _prepare(out)
    shown = CliRunner().invoke(main, ["--conf", str(CONF.parent), "lock"]).output
    assert f"{NAME} {REPO}@main -> {C1}  4 files" in shown
    assert catalogue_row(NAME, entry(NAME, revision="main")["prepare"])["pinned"] == C1
    as_json = json.loads(CliRunner().invoke(main, ["--conf", str(CONF.parent), "lock", "--json"]).output)
    assert as_json[NAME]["commit"] == C1 and sorted(as_json[NAME]["files"]) == sorted(FILES)
    result = CliRunner().invoke(main, ["--conf", str(CONF.parent), "lock", "--update", "cifar10"])
    assert result.exit_code != 0 and "'cifar10' is not a registered Hugging Face dataset entry" in result.output
