"""Safe archive reading: tar (plain, gzip, bzip2, xz) and zip, recognised by content, never by file name.

- `extract(archive, dest)` unpacks into a temporary folder beside `dest` and renames it into place only when
  every member is written, with a completion marker `.vlbench-extracted.json` inside (the archive's name, size
  and mtime). A later call reuses `dest` only when that marker matches the archive; a folder without it (a
  half-extracted tree from a killed run, a folder made by hand) is never trusted and is replaced whole.
- `iter_members(archive, suffixes)` streams regular files as (name, bytes) without writing anything;
  `read_member(archive, name)` reads one.

Every member name is checked before use, in both: absolute paths, `..` components, symbolic and hard links,
device files and FIFOs are refused with an error naming the archive and the member (`UnsafeArchiveError`).

A corrupt archive (truncated, bad CRC, not an archive) raises `ArchiveError` naming it. If the archive lives in
the download cache, the cache is told (`download.forget_verification`): a file that no published checksum
verified is deleted, so the rerun downloads it again; a verified one loses its sidecar, so the rerun re-hashes it
and downloads it again only if it changed on disk (if it still matches its published checksum, upstream's file
itself is broken and downloading it again would not help). A user's own file is never touched.
"""

from __future__ import annotations

import contextlib
import json
import lzma
import os
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO

from vlbench.datasets.download import DownloadError, forget_verification
from vlbench.io import atomic_dir

MARKER = ".vlbench-extracted.json"
_CORRUPT = (tarfile.TarError, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error, lzma.LZMAError, OSError)
_COPY_CHUNK = 1 << 20


class ArchiveError(DownloadError):
    """An archive is corrupt, not an archive, or lacks a member; the message names the archive (and member)."""


class UnsafeArchiveError(ArchiveError):
    """An archive member could escape the target folder or is not a regular file or folder."""


def archive_kind(archive: str | os.PathLike) -> str:
    """'zip' or 'tar' (any compression tarfile reads), from the file's first bytes; ArchiveError otherwise."""
    path = Path(archive)
    try:
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError as err:
        raise ArchiveError(f"cannot read archive {path}: {err}") from None
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if head.startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")) or head[257:262] == b"ustar":
        return "tar"
    if _quietly(tarfile.is_tarfile, path):
        return "tar"
    if _quietly(zipfile.is_zipfile, path):  # a zip with a prefix (self-extracting)
        return "zip"
    looks = " and looks like a web page (an error or login page served instead of the file?)" if _is_html(head) else ""
    raise ArchiveError(
        f"{path} is not a tar or zip archive (first bytes {head[:8]!r}){looks}; {forget_verification(path)}"
    )


def _is_html(head: bytes) -> bool:
    start = head.lstrip().lower()
    return start.startswith((b"<!doctype html", b"<html", b"<head", b"<?xml"))


def _quietly(test, path: Path) -> bool:
    try:
        return bool(test(path))
    except _CORRUPT:
        return False


# ---------------------------------------------------------------------------------------------------- names


def safe_name(archive: Path, name: str) -> str:
    """The member's relative POSIX path (leading './' dropped), or UnsafeArchiveError for one that could escape."""
    unified = name.replace("\\", "/")
    if unified.startswith("/") or (len(unified) > 1 and unified[1] == ":") or "\x00" in unified:
        raise UnsafeArchiveError(f"archive {archive}: member {name!r} has an absolute path; refusing to extract it")
    parts = [p for p in PurePosixPath(unified).parts if p != "."]
    if ".." in parts:
        raise UnsafeArchiveError(f"archive {archive}: member {name!r} has a '..' component and would leave the target folder")
    return "/".join(parts)


def _tar_entries(archive: Path, tar: tarfile.TarFile) -> Iterator[tuple[str, tarfile.TarInfo]]:
    """(safe name, member) for each folder and regular file, in archive order; links and devices refused."""
    for member in tar:
        name = safe_name(archive, member.name)
        if member.issym() or member.islnk():
            raise UnsafeArchiveError(
                f"archive {archive}: member {member.name!r} is a {'symbolic' if member.issym() else 'hard'} link "
                f"(to {member.linkname!r}); links are refused"
            )
        if not (member.isfile() or member.isdir()):
            raise UnsafeArchiveError(f"archive {archive}: member {member.name!r} is a device, FIFO or other special file")
        if name:
            yield name, member


def _zip_entries(archive: Path, zf: zipfile.ZipFile) -> Iterator[tuple[str, zipfile.ZipInfo]]:
    for info in zf.infolist():
        name = safe_name(archive, info.filename)
        kind = stat.S_IFMT(info.external_attr >> 16) if info.create_system == 3 else 0  # 3: made on Unix
        if kind == stat.S_IFLNK:
            raise UnsafeArchiveError(f"archive {archive}: member {info.filename!r} is a symbolic link; links are refused")
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise UnsafeArchiveError(f"archive {archive}: member {info.filename!r} is a device, FIFO or other special file")
        if name:
            yield name, info


@contextlib.contextmanager
def _entries(archive: Path, password: bytes | None = None) -> Iterator[Iterator[tuple[str, bool, Callable[[], IO[bytes]]]]]:
    """(safe name, is_dir, open) for each member, in archive order, for both formats. Corrupt data raises
    ArchiveError while walking; reading a member's bytes is checked by `_read_blocks`."""
    kind = archive_kind(archive)
    try:
        handle = zipfile.ZipFile(archive) if kind == "zip" else tarfile.open(archive, "r:*")  # noqa: SIM115 - closed below
    except _CORRUPT as err:
        raise _corrupt(archive, err) from None
    if kind == "zip" and password is not None:
        handle.setpassword(password)
    with handle:
        yield _walk(archive, kind, handle)


def _walk(archive: Path, kind: str, handle) -> Iterator[tuple[str, bool, Callable[[], IO[bytes]]]]:
    found = _zip_entries(archive, handle) if kind == "zip" else _tar_entries(archive, handle)
    while True:
        try:
            name, member = next(found)
        except StopIteration:
            return
        except ArchiveError:
            raise
        except _CORRUPT as err:
            raise _corrupt(archive, err) from None
        if kind == "zip":
            yield name, member.is_dir(), lambda member=member: handle.open(member)
        else:
            yield name, member.isdir(), lambda member=member: handle.extractfile(member)


def _corrupt(archive: Path, err: BaseException) -> ArchiveError:
    what = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return ArchiveError(f"archive {archive} is corrupt or truncated ({what}); {forget_verification(archive)}")


# ---------------------------------------------------------------------------------------------------- reading


def iter_members(archive: str | os.PathLike, suffixes: Iterable[str] | None = None,
                 password: bytes | None = None) -> Iterator[tuple[str, bytes]]:
    """Regular files of `archive` as (safe relative name, bytes), in archive order, nothing written to disk.
    `suffixes` (e.g. (".jpg", ".png")) keeps only names ending with one of them, case-insensitively; `password`
    decrypts a ZipCrypto-encrypted zip (ObjectNet's)."""
    archive = Path(archive)
    wanted = tuple(s.lower() for s in suffixes) if suffixes is not None else None
    with _entries(archive, password) as entries:
        for name, is_dir, opener in entries:
            if is_dir or (wanted is not None and not name.lower().endswith(wanted)):
                continue
            yield name, _read_all(archive, opener)


def members(archive: str | os.PathLike) -> list[str]:
    """Names of the regular files of `archive` (safe relative names), in archive order."""
    archive = Path(archive)
    with _entries(archive) as entries:
        return [name for name, is_dir, _ in entries if not is_dir]


def read_member(archive: str | os.PathLike, name: str, password: bytes | None = None) -> bytes:
    """The bytes of the regular file `name` (as `iter_members` names it) in `archive`."""
    archive = Path(archive)
    target = safe_name(archive, name)
    with _entries(archive, password) as entries:
        for member, is_dir, opener in entries:
            if member == target and not is_dir:
                return _read_all(archive, opener)
    raise ArchiveError(f"archive {archive} has no member {name!r}")


def _read_all(archive: Path, opener: Callable[[], IO[bytes]]) -> bytes:
    return b"".join(_read_blocks(archive, opener))


def _read_blocks(archive: Path, opener: Callable[[], IO[bytes]]) -> Iterator[bytes]:
    """A member's bytes in blocks; damage found while decompressing or checking the CRC raises ArchiveError."""
    try:
        with opener() as source:
            while block := source.read(_COPY_CHUNK):
                yield block
    except _CORRUPT as err:
        raise _corrupt(archive, err) from None


# ---------------------------------------------------------------------------------------------------- extracting


def default_destination(archive: Path) -> Path:
    return archive.with_name(archive.name + ".d")


def extract(archive: str | os.PathLike, dest: str | os.PathLike | None = None) -> Path:
    """Unpack `archive` into `dest` (default `<archive>.d` beside it) safely and atomically; returns `dest`.
    A complete earlier extraction of the same archive (marker matches name, size and mtime) is reused."""
    archive = Path(archive)
    dest = Path(dest) if dest is not None else default_destination(archive)
    identity = _identity(archive)
    if _marker(dest) == identity:
        return dest
    with atomic_dir(dest) as tmp:
        count = _unpack(archive, tmp)
        (tmp / MARKER).write_text(json.dumps({**identity, "files": count}, indent=2) + "\n")
    return dest


def is_extracted(archive: str | os.PathLike, dest: str | os.PathLike | None = None) -> bool:
    """Whether `dest` holds a complete extraction of this very archive."""
    archive = Path(archive)
    dest = Path(dest) if dest is not None else default_destination(archive)
    return archive.exists() and _marker(dest) == _identity(archive)


def _identity(archive: Path) -> dict:
    try:
        st = archive.stat()
    except OSError as err:
        raise ArchiveError(f"cannot read archive {archive}: {err}") from None
    return {"archive": archive.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _marker(dest: Path) -> dict | None:
    try:
        record = json.loads((dest / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    return {k: record.get(k) for k in ("archive", "size", "mtime_ns")}


def _unpack(archive: Path, root: Path) -> int:
    """Write every member under `root`; returns the number of files. Names were checked by `_entries`."""
    count = 0
    with _entries(archive) as entries:
        for name, is_dir, opener in entries:
            if name == MARKER:
                raise UnsafeArchiveError(f"archive {archive}: member {name!r} would overwrite vlbench's completion marker")
            with _writing(archive, name):
                target = root / name
                if is_dir:
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as out:
                    out.writelines(_read_blocks(archive, opener))
            count += 1
    return count


@contextlib.contextmanager
def _writing(archive: Path, name: str) -> Iterator[None]:
    """Disk errors while writing a member (disk full, a member that is both a file and a folder) name both."""
    try:
        yield
    except ArchiveError:
        raise
    except OSError as err:
        raise ArchiveError(f"cannot write member {name!r} of archive {archive}: {err.strerror or err}") from None


__all__ = [
    "ArchiveError",
    "UnsafeArchiveError",
    "archive_kind",
    "extract",
    "is_extracted",
    "iter_members",
    "members",
    "read_member",
    "safe_name",
]
