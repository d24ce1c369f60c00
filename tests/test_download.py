"""The download layer against a local HTTP server with injected faults: verify, resume, retry, mirrors, manual files."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from tests.http_server import serve
from vlbench.datasets import download
from vlbench.datasets.canonical import DatasetError
from vlbench.datasets.download import (
    ChecksumError,
    DownloadError,
    ManualDownloadError,
    Resource,
    RetryPolicy,
    fetch,
    read_sidecar,
    resource,
    sidecar_path,
)
from vlbench.errors import VlbenchError

FAST = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.01, timeout=2.0)
SIZE = 300_000


@pytest.fixture
def payload(tmp_path):
    """A 300 kB file in a served folder, with its checksums."""
    www = tmp_path / "www"
    www.mkdir()
    data = os.urandom(SIZE)
    (www / "data.bin").write_bytes(data)
    return {
        "www": www,
        "data": data,
        "sha256": hashlib.sha256(data).hexdigest(),
        "md5": hashlib.md5(data).hexdigest(),
    }


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(folder))
    monkeypatch.delenv("VLBENCH_MIRROR", raising=False)
    return folder


def get(res: Resource, **kw):
    return fetch(res, "demo", progress=False, retry=kw.pop("retry", FAST), **kw)


def test_download_verifies_records_provenance_and_reuses_the_cache(payload, cache):
    with serve(payload["www"]) as base:
        res = Resource("data.bin", (f"{base}/data.bin",), sha256=payload["sha256"])
        path = get(res)
        assert path == cache / "data.bin"
        assert path.read_bytes() == payload["data"]
        assert not (cache / "data.bin.part").exists()
        assert read_sidecar(path)["sha256"] == payload["sha256"]
        assert get(res) == path
        assert base.requests["/data.bin"] == 1  # the second fetch never touched the network
    assert res.provenance(path) == {
        "file": "data.bin", "urls": [f"{base}/data.bin"], "sha256": payload["sha256"], "size": SIZE, "verified": True,
    }


def test_truncated_download_is_resumed_with_a_range_request(payload, cache):
    with serve(payload["www"], truncate=100_000) as base:
        path = get(Resource("data.bin", (f"{base}/data.bin",), sha256=payload["sha256"]))
        assert base.requests["/data.bin"] == 2
        assert base.ranges["/data.bin"] == [None, "bytes=100000-"]
    assert path.read_bytes() == payload["data"]


def test_connection_dropped_on_every_attempt_fails_then_a_later_run_resumes(payload, cache):
    res_of = lambda base: Resource("data.bin", (f"{base}/data.bin",), sha256=payload["sha256"])
    with serve(payload["www"], truncate=1000, truncate_times=None) as base:
        with pytest.raises(DownloadError) as err:
            get(res_of(base))
        assert f"{base}/data.bin" in str(err.value) and "connection closed after" in str(err.value)
        assert base.requests["/data.bin"] == FAST.attempts
    assert not (cache / "data.bin").exists()
    assert (cache / "data.bin.part").stat().st_size == 3000  # each attempt resumed and kept what arrived
    with serve(payload["www"]) as base:
        path = get(res_of(base))
        assert base.ranges["/data.bin"] == ["bytes=3000-"]
    assert path.read_bytes() == payload["data"]


def test_server_that_ignores_range_restarts_the_file_cleanly(payload, cache):
    with serve(payload["www"], truncate=5000, ignore_range=True) as base:
        path = get(Resource("data.bin", (f"{base}/data.bin",), sha256=payload["sha256"]))
        assert base.ranges["/data.bin"] == [None, "bytes=5000-"]  # asked to resume, got the whole file
    assert path.read_bytes() == payload["data"]


def test_a_silent_server_times_out_instead_of_hanging(payload, cache):
    retry = RetryPolicy(attempts=2, base_delay=0.001, timeout=0.3)
    with serve(payload["www"], stall=100, stall_seconds=5) as base:
        start = time.monotonic()
        with pytest.raises(DownloadError, match="timed out"):
            get(Resource("data.bin", (f"{base}/data.bin",), sha256=payload["sha256"]), retry=retry)
        assert time.monotonic() - start < 3


def test_wrong_checksum_deletes_the_file_and_names_url_expected_and_actual(payload, cache):
    wrong = "0" * 64
    with serve(payload["www"]) as base, pytest.raises(ChecksumError) as err:
        get(Resource("data.bin", (f"{base}/data.bin",), sha256=wrong))
    message = str(err.value)
    assert f"{base}/data.bin" in message and wrong in message and payload["sha256"] in message
    assert list(cache.glob("data.bin*")) == []


def test_404_on_the_first_mirror_then_200_on_the_second(payload, cache, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with serve(empty) as first, serve(payload["www"]) as second:
        path = get(Resource("data.bin", (f"{first}/data.bin", f"{second}/data.bin"), sha256=payload["sha256"]))
        assert first.requests["/data.bin"] == 1  # a 404 is not retried
        assert second.requests["/data.bin"] == 1
    assert path.read_bytes() == payload["data"]


def test_server_errors_are_retried_on_the_same_url(payload, cache):
    with serve(payload["www"], fail_first=2, fail_status=503) as base:
        path = get(Resource("data.bin", (f"{base}/data.bin",), sha256=payload["sha256"]))
        assert base.requests["/data.bin"] == 3
    assert path.read_bytes() == payload["data"]


def test_every_url_failing_names_them_all(payload, cache, tmp_path):
    with serve(tmp_path) as base:
        urls = (f"{base}/a/data.bin", f"{base}/b/data.bin")
        with pytest.raises(DownloadError) as err:
            get(Resource("data.bin", urls, sha256=payload["sha256"]))
    assert not isinstance(err.value, ChecksumError)
    assert all(url in str(err.value) for url in urls) and "HTTP 404" in str(err.value)
    assert isinstance(err.value, VlbenchError)


def test_missing_manual_file_then_continuing_from_the_mirror_folder(payload, cache, tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    monkeypatch.setenv("VLBENCH_MIRROR", str(mirror))
    res = Resource("data.bin", sha256=payload["sha256"], manual="https://example.org/register (log in, accept the licence)")
    with pytest.raises(ManualDownloadError) as err:
        get(res)
    message = str(err.value)
    for needed in ("'data.bin'", "https://example.org/register", str((cache / "data.bin").resolve()), str(mirror.resolve()),
                   payload["sha256"]):
        assert needed in message
    (mirror / "sub").mkdir()
    (mirror / "sub" / "data.bin").write_bytes(payload["data"])  # one sub-folder down is searched too
    path = get(res)
    assert path == cache / "data.bin" and path.read_bytes() == payload["data"]
    assert (mirror / "sub" / "data.bin").exists()


def test_manual_message_without_a_mirror_names_the_mirror_options(payload, cache):
    with pytest.raises(ManualDownloadError) as err:
        get(Resource("data.bin", md5=payload["md5"], manual="Kaggle: kaggle competitions download -c x"))
    message = str(err.value)
    assert "VLBENCH_MIRROR" in message and "downloads.mirror" in message and f"md5 {payload['md5']}" in message


def test_manual_file_placed_in_the_cache_is_used(payload, cache):
    cache.mkdir()
    (cache / "data.bin").write_bytes(payload["data"])
    path = get(Resource("data.bin", sha256=payload["sha256"], manual="from the authors"))
    assert read_sidecar(path)["verified"] is True


def test_hand_placed_file_with_wrong_checksum_is_an_error_and_is_kept(payload, cache):
    cache.mkdir()
    (cache / "data.bin").write_bytes(b"wrong")
    with pytest.raises(ChecksumError) as err:
        get(Resource("data.bin", ("http://127.0.0.1:9/data.bin",), sha256=payload["sha256"]))
    assert str(cache / "data.bin") in str(err.value) and payload["sha256"] in str(err.value)
    assert (cache / "data.bin").read_bytes() == b"wrong"


def test_failed_download_with_manual_instructions_says_both(payload, cache, tmp_path):
    res = lambda base: Resource("data.bin", (f"{base}/gone.bin",), sha256=payload["sha256"], manual="Google Drive X")
    with serve(tmp_path) as base, pytest.raises(ManualDownloadError) as err:
        get(res(base))
    assert "Google Drive X" in str(err.value) and f"{base}/gone.bin" in str(err.value)


def test_mirror_file_with_wrong_checksum_is_an_error_and_is_kept(payload, cache, tmp_path, monkeypatch):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "data.bin").write_bytes(b"not the file")
    monkeypatch.setenv("VLBENCH_MIRROR", str(mirror))
    with serve(payload["www"]) as base:
        with pytest.raises(ChecksumError) as err:
            get(Resource("data.bin", (f"{base}/data.bin",), sha256=payload["sha256"]))
        assert base.requests["/data.bin"] == 0
    assert str(mirror / "data.bin") in str(err.value) and payload["sha256"] in str(err.value)
    assert hashlib.sha256(b"not the file").hexdigest() in str(err.value)
    assert (mirror / "data.bin").read_bytes() == b"not the file"
    assert not (cache / "data.bin").exists()


def test_mirror_is_searched_before_any_download(payload, cache, tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "data.bin").write_bytes(payload["data"])
    with serve(payload["www"]) as base:
        path = get(Resource("data.bin", (f"{base}/data.bin",), sha256=payload["sha256"]), mirror=mirror)
        assert base.requests["/data.bin"] == 0
    assert path.read_bytes() == payload["data"]


def test_a_mirror_file_under_its_upstream_name_is_accepted_by_checksum(payload, cache, tmp_path):
    """docs/downloads.md: mirror files keep their upstream names; the cache name may carry a prefix (BREEDS does)."""
    mirror = tmp_path / "mirror"
    (mirror / "sub").mkdir(parents=True)
    (mirror / "sub" / "data.bin").write_bytes(payload["data"])
    with serve(payload["www"]) as base:
        res = Resource("demo-1234-data.bin", (f"{base}/data.bin",), sha256=payload["sha256"])
        assert res.mirror_names() == ("demo-1234-data.bin", "data.bin")
        path = get(res, mirror=mirror)
        assert base.requests["/data.bin"] == 0
    assert path == cache / "demo-1234-data.bin" and path.read_bytes() == payload["data"]
    assert (mirror / "sub" / "data.bin").exists()


def test_an_upstream_named_mirror_file_with_another_checksum_is_an_error_and_is_kept(payload, cache, tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "data.bin").write_bytes(b"another release")
    with pytest.raises(ChecksumError) as err:
        get(Resource("demo-1234-data.bin", ("http://127.0.0.1:9/data.bin",), sha256=payload["sha256"]), mirror=mirror)
    assert str(mirror / "data.bin") in str(err.value) and payload["sha256"] in str(err.value)
    assert (mirror / "data.bin").read_bytes() == b"another release"


def test_without_a_checksum_only_the_cache_name_is_looked_for_in_the_mirror(payload, cache, tmp_path):
    """An unverifiable file under a generic upstream name could be any dataset's `data.bin`."""
    assert Resource("demo-data.bin", ("http://x.org/data.bin",)).mirror_names() == ("demo-data.bin",)
    assert Resource("demo-data.bin", ("http://x.org/a%20b.bin",), md5="0" * 32).mirror_names() == ("demo-data.bin",
                                                                                                    "a b.bin")


def test_the_missing_file_message_names_the_mirror_folder_searched_and_the_names_accepted(payload, cache, tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    with serve(tmp_path / "empty") as base:
        with pytest.raises(DownloadError) as err:
            get(Resource("demo-1234-data.bin", (f"{base}/data.bin",), sha256=payload["sha256"]), mirror=mirror)
    message = str(err.value)
    assert f"mirror folder {mirror.resolve()}" in message and "one sub-folder down" in message
    assert "'demo-1234-data.bin' or 'data.bin'" in message and payload["sha256"] in message
    with pytest.raises(ManualDownloadError) as err:
        get(Resource("demo-1234-data.bin", sha256=payload["sha256"], manual="ask the authors"), mirror=mirror)
    assert f"mirror folder {mirror.resolve()}" in str(err.value) and "as 'demo-1234-data.bin'" in str(err.value)


def test_a_mirror_folder_that_does_not_exist_is_an_error(payload, cache, tmp_path, monkeypatch):
    monkeypatch.setenv("VLBENCH_MIRROR", str(tmp_path / "nowhere"))
    with pytest.raises(DownloadError, match="nowhere.*VLBENCH_MIRROR"):
        get(Resource("data.bin", ("http://127.0.0.1:9/data.bin",), sha256=payload["sha256"]))


def test_md5_only_resource_is_verified_by_md5(payload, cache):
    with serve(payload["www"]) as base:
        res = Resource("data.bin", (f"{base}/data.bin",), md5=payload["md5"].upper())
        path = get(res)
        assert res.provenance(path)["verified"] is True
        assert res.provenance(path)["md5"] == payload["md5"]
        assert res.provenance(path)["sha256"] == payload["sha256"]
        with pytest.raises(ChecksumError, match=f"md5 {payload['md5']}"):
            get(Resource("other.bin", (f"{base}/data.bin",), md5="f" * 32))


def test_resource_without_checksum_warns_once_and_records_unverified(payload, cache, capsys):
    with serve(payload["www"]) as base:
        res = Resource("data.bin", (f"{base}/data.bin",))
        path = get(res)
        warning = capsys.readouterr().err.strip().splitlines()
        assert len(warning) == 1 and "no published checksum" in warning[0] and payload["sha256"] in warning[0]
    assert res.provenance(path) == {
        "file": "data.bin", "urls": [f"{base}/data.bin"], "sha256": payload["sha256"], "size": SIZE, "verified": False,
    }


def test_cached_file_is_trusted_by_sidecar_until_size_or_mtime_change(payload, cache, monkeypatch):
    with serve(payload["www"]) as base:
        res = Resource("data.bin", (f"{base}/data.bin",), sha256=payload["sha256"])
        path = get(res)
        hashed = []
        real_hash = download._hash_file
        monkeypatch.setattr(download, "_hash_file", lambda p, want_md5: hashed.append(p) or real_hash(p, want_md5))
        sidecar_mtime = sidecar_path(path).stat().st_mtime_ns
        get(res)
        assert hashed == []  # sidecar matches: no re-hash, and the sidecar is left as it is
        assert sidecar_path(path).stat().st_mtime_ns == sidecar_mtime
        os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
        get(res)
        assert hashed == [path]  # mtime changed: re-hashed once, sidecar refreshed
        get(res)
        assert hashed == [path]
        path.write_bytes(b"x" + payload["data"][1:])  # damaged on disk: deleted and fetched again
        assert get(res).read_bytes() == payload["data"]
        assert base.requests["/data.bin"] == 2


def test_complete_part_file_answered_416_is_accepted(payload, cache):
    cache.mkdir()
    (cache / "data.bin.part").write_bytes(payload["data"])
    with serve(payload["www"]) as base:
        path = get(Resource("data.bin", (f"{base}/data.bin",), sha256=payload["sha256"]))
        assert base.ranges["/data.bin"] == [f"bytes={SIZE}-"]
    assert path.read_bytes() == payload["data"]


def test_resource_spec_parsing():
    res = resource("cifar10", {"url": "https://host/x/cifar-10-python.tar.gz?raw=1", "md5": "C58F30108F718F92721AF3B95E74349A"})
    assert res == Resource("cifar-10-python.tar.gz", ("https://host/x/cifar-10-python.tar.gz?raw=1",),
                           md5="c58f30108f718f92721af3b95e74349a")
    res = resource("imagenet", {"file": "ILSVRC2012_img_val.tar", "manual": "image-net.org", "sha256": "a" * 64})
    assert res.urls == () and res.manual == "image-net.org"
    assert resource("x", {"file": "f", "urls": ["http://a/f", "http://b/f"]}).urls == ("http://a/f", "http://b/f")


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"file": "f", "url": "http://a/f", "sha": "0" * 64}, ["unknown resource key", "sha"]),
        ({"file": "f", "url": "http://a/f", "sha256": "abc"}, ["sha256", "64 hex"]),
        ({"file": "f"}, ["'f'", "url", "manual"]),
        ({"file": "a/f", "url": "http://a/f"}, ["plain file name"]),
        ({"file": "f", "url": "gopher://a/f"}, ["'url'", "gopher"]),
        ({"file": "f", "url": "http://a/f", "urls": ["http://b/f"]}, ["either"]),
        ({"file": "f", "urls": [1]}, ["'urls'"]),
        ("http://a/f", ["mapping"]),
    ],
)
def test_resource_spec_errors_name_dataset_and_key(spec, words):
    with pytest.raises(DatasetError) as err:
        resource("ds", spec)
    assert "'ds'" in str(err.value)
    for word in words:
        assert word in str(err.value)


def test_file_urls_work_like_http(payload, cache):
    path = get(Resource("data.bin", ((payload["www"] / "data.bin").as_uri(),), sha256=payload["sha256"]))
    assert path.read_bytes() == payload["data"]


def test_retry_policy_from_environment(monkeypatch):
    monkeypatch.setenv("VLBENCH_DOWNLOAD_ATTEMPTS", "2")
    monkeypatch.setenv("VLBENCH_DOWNLOAD_BACKOFF", "0.5")
    monkeypatch.setenv("VLBENCH_DOWNLOAD_TIMEOUT", "7")
    policy = RetryPolicy.from_env()
    assert (policy.attempts, policy.base_delay, policy.timeout) == (2, 0.5, 7)
    assert [policy.delay(k) for k in range(3)] == [0.5, 1.0, 2.0]
    monkeypatch.setenv("VLBENCH_DOWNLOAD_ATTEMPTS", "many")
    with pytest.raises(DownloadError, match="VLBENCH_DOWNLOAD_ATTEMPTS='many'"):
        RetryPolicy.from_env()
