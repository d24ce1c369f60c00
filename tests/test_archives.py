"""Safe, atomic archive extraction and streaming: formats by content, hostile members, corrupt and interrupted runs."""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
import zipfile

import pytest

from tests.http_server import serve
from vlbench.datasets import archives
from vlbench.datasets.archives import (
    MARKER,
    ArchiveError,
    UnsafeArchiveError,
    archive_kind,
    extract,
    is_extracted,
    iter_members,
    members,
    read_member,
)
from vlbench.datasets.download import (
    DownloadError,
    Resource,
    RetryPolicy,
    fetch,
    read_sidecar,
    sidecar_path,
)

FILES = {"imgs/a.jpg": b"\xff\xd8jpeg-a", "imgs/b.PNG": b"\x89PNGb", "labels.txt": b"a 0\nb 1\n"}


def add_tar_file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def make_tar(path, files=FILES, mode="w:gz", extra=()):
    """A tar (compression by `mode`) of `files`, then `extra` raw TarInfo members (links, devices)."""
    with tarfile.open(path, mode) as tar:
        folder = tarfile.TarInfo("imgs")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for name, data in files.items():
            add_tar_file(tar, name, data)
        for info in extra:
            tar.addfile(info)
    return path


def make_zip(path, files=FILES, links=()):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("imgs/", b"")
        for name, data in files.items():
            zf.writestr(name, data)
        for name, target in links:
            info = zipfile.ZipInfo(name)
            info.create_system = 3
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, target)
    return path


def tree(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != MARKER}


@pytest.mark.parametrize(
    ("name", "maker", "kind"),
    [
        ("data.tar", lambda p: make_tar(p, mode="w"), "tar"),
        ("data.tgz", lambda p: make_tar(p, mode="w:gz"), "tar"),
        ("data.tar.bz2", lambda p: make_tar(p, mode="w:bz2"), "tar"),
        ("data.tar.xz", lambda p: make_tar(p, mode="w:xz"), "tar"),
        ("data.zip", make_zip, "zip"),
        ("zip-named.tar.gz", make_zip, "zip"),  # the name lies; the content decides
        ("tar-named.zip", lambda p: make_tar(p, mode="w:gz"), "tar"),
    ],
)
def test_every_format_is_recognised_by_content_and_extracted(tmp_path, name, maker, kind):
    archive = maker(tmp_path / name)
    assert archive_kind(archive) == kind
    dest = extract(archive)
    assert dest == tmp_path / f"{name}.d"
    assert tree(dest) == FILES
    assert json.loads((dest / MARKER).read_text())["files"] == 3
    assert is_extracted(archive)


def test_iter_members_streams_regular_files_with_a_suffix_filter(tmp_path):
    for archive in (make_tar(tmp_path / "a.tgz"), make_zip(tmp_path / "a.zip")):
        assert dict(iter_members(archive)) == FILES
        assert dict(iter_members(archive, suffixes=(".jpg", ".png"))) == {k: FILES[k] for k in ("imgs/a.jpg", "imgs/b.PNG")}
        assert members(archive) == list(FILES)
        assert read_member(archive, "labels.txt") == FILES["labels.txt"]
        assert read_member(archive, "./imgs/a.jpg") == FILES["imgs/a.jpg"]
        with pytest.raises(ArchiveError, match="no member 'missing.txt'"):
            read_member(archive, "missing.txt")
    assert not (tmp_path / "a.tgz.d").exists()


def test_a_complete_extraction_is_reused_and_a_changed_archive_re_extracted(tmp_path, monkeypatch):
    archive = make_tar(tmp_path / "a.tgz")
    dest = extract(archive, tmp_path / "out")
    calls = []
    real_unpack = archives._unpack
    monkeypatch.setattr(archives, "_unpack", lambda a, root: calls.append(a) or real_unpack(a, root))
    assert extract(archive, tmp_path / "out") == dest and calls == []
    make_tar(archive, files={"only.txt": b"new"})
    os.utime(archive, ns=(1, 1))  # a different mtime even on coarse filesystems
    extract(archive, tmp_path / "out")
    assert calls == [archive] and tree(dest) == {"only.txt": b"new"}  # no stale file of the old archive left


@pytest.mark.parametrize("bad_name", ["../evil.txt", "imgs/../../evil.txt", "/tmp/evil.txt", "..\\evil.txt"])
@pytest.mark.parametrize("fmt", ["tar", "zip"])
def test_members_escaping_the_target_are_refused(tmp_path, bad_name, fmt):
    files = {**FILES, bad_name: b"pwned"}
    archive = make_tar(tmp_path / "a.tgz", files) if fmt == "tar" else make_zip(tmp_path / "a.zip", files)
    dest = tmp_path / "deep" / "out"
    with pytest.raises(UnsafeArchiveError) as err:
        extract(archive, dest)
    assert str(archive) in str(err.value) and repr(bad_name) in str(err.value)
    with pytest.raises(UnsafeArchiveError):
        list(iter_members(archive))
    assert not dest.exists()
    assert not list(tmp_path.rglob("evil.txt"))
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == []  # no temporary folder left behind


def link_member(name: str, target: str, kind=tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


@pytest.mark.parametrize(
    ("member", "words"),
    [
        (link_member("imgs/link.jpg", "/etc/passwd"), ["symbolic link", "/etc/passwd"]),
        (link_member("imgs/hard.jpg", "labels.txt", tarfile.LNKTYPE), ["hard link"]),
        (link_member("dev/null", "", tarfile.CHRTYPE), ["device"]),
        (link_member("pipe", "", tarfile.FIFOTYPE), ["device, FIFO"]),
    ],
)
def test_links_and_special_files_in_a_tar_are_refused(tmp_path, member, words):
    archive = make_tar(tmp_path / "a.tar", extra=[member])
    with pytest.raises(UnsafeArchiveError) as err:
        extract(archive)
    for word in [str(archive), repr(member.name), *words]:
        assert word in str(err.value)
    assert not (tmp_path / "a.tar.d").exists()


def test_symlink_in_a_zip_is_refused(tmp_path):
    archive = make_zip(tmp_path / "a.zip", links=[("imgs/link.jpg", "/etc/passwd")])
    with pytest.raises(UnsafeArchiveError, match="'imgs/link.jpg' is a symbolic link"):
        extract(archive)
    assert not (tmp_path / "a.zip.d").exists()


def corrupt_variants(tmp_path):
    tgz = make_tar(tmp_path / "src.tgz", files={f"f{i}.bin": os.urandom(50_000) for i in range(4)}).read_bytes()
    zipped = bytearray(make_zip(tmp_path / "src.zip", files={"f.bin": b"A" * 100_000}, ).read_bytes())
    at = zipped.find(b"f.bin") + 40  # inside the deflated data of f.bin: the CRC check fails
    zipped[at] ^= 0xFF
    return {
        "truncated.tgz": tgz[: len(tgz) // 2],
        "badcrc.zip": bytes(zipped),
        "garbage.tar": os.urandom(4096),
        "empty.zip": b"",
    }


def test_corrupt_archives_raise_errors_naming_them(tmp_path):
    for name, data in corrupt_variants(tmp_path).items():
        archive = tmp_path / name
        archive.write_bytes(data)
        with pytest.raises(ArchiveError) as err:
            extract(archive)
        assert str(archive) in str(err.value), name
        assert isinstance(err.value, DownloadError)
        assert not (tmp_path / f"{name}.d").exists(), name
        assert archive.exists(), name  # not from the download cache: a user's file is never deleted
        with pytest.raises(ArchiveError):
            list(iter_members(archive))


def test_corrupt_cached_archive_is_deleted_or_flagged_for_the_next_run(tmp_path, monkeypatch):
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "cache"))
    monkeypatch.delenv("VLBENCH_MIRROR", raising=False)
    www = tmp_path / "www"
    www.mkdir()
    data = make_tar(tmp_path / "good.tgz", files={f"f{i}.bin": os.urandom(50_000) for i in range(4)}).read_bytes()
    (www / "data.tgz").write_bytes(data[: len(data) // 2])  # upstream serves a broken file
    retry = RetryPolicy(attempts=1, base_delay=0.001)
    with serve(www) as base:
        unverified = fetch(Resource("data.tgz", (f"{base}/data.tgz",)), "demo", progress=False, retry=retry)
        with pytest.raises(ArchiveError, match="deleted from the download cache"):
            extract(unverified)
        assert not unverified.exists() and not sidecar_path(unverified).exists()

        sha = hashlib.sha256(data[: len(data) // 2]).hexdigest()
        verified = fetch(Resource("data.tgz", (f"{base}/data.tgz",), sha256=sha), "demo", progress=False, retry=retry)
        assert read_sidecar(verified)["verified"] is True
        with pytest.raises(ArchiveError, match="re-hashes it"):
            extract(verified)
        assert verified.exists() and not sidecar_path(verified).exists()


def test_interrupted_extraction_leaves_no_trusted_folder(tmp_path, monkeypatch):
    archive = make_tar(tmp_path / "a.tgz")
    dest = tmp_path / "out"
    real_read = archives._read_blocks
    seen = []

    def dying_read(archive_path, opener):
        seen.append(1)
        if len(seen) == 2:
            raise KeyboardInterrupt  # the run is stopped while the second file is written
        yield from real_read(archive_path, opener)

    monkeypatch.setattr(archives, "_read_blocks", dying_read)
    with pytest.raises(KeyboardInterrupt):
        extract(archive, dest)
    assert not dest.exists() and list(tmp_path.glob(".out*")) == []
    assert not is_extracted(archive, dest)
    monkeypatch.setattr(archives, "_read_blocks", real_read)
    assert tree(extract(archive, dest)) == FILES


def test_a_folder_without_completion_marker_is_never_trusted(tmp_path):
    archive = make_tar(tmp_path / "a.tgz")
    dest = tmp_path / "a.tgz.d"
    (dest / "imgs").mkdir(parents=True)
    (dest / "imgs" / "a.jpg").write_bytes(b"half")  # what a killed older run (or a person) left there
    (dest / "stray.txt").write_bytes(b"stray")
    assert not is_extracted(archive)
    assert tree(extract(archive)) == FILES
