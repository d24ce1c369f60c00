"""Atomic file output: write to a temporary sibling, then rename, so readers never see half a file or folder.

Outputs get the permissions the process's umask gives to a new file or folder (0644 / 0755 under umask 022,
0664 / 0775 under 002), not the private 0600 / 0700 of `tempfile`, so a teammate on a shared checkout can read them.

Temporaries are named `.<name>.<pid>-<random>.tmp` beside the output (`.<name>.<pid>-<random>.old` for an old
folder moved aside). A run that is killed leaves them behind; the next run for the same output deletes those of
dead processes before it starts (`clean_stale_temporaries`), and puts back an old folder that a kill left aside.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from vlbench.errors import VlbenchError

try:
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - platforms without a C library handle (Windows)
    _LIBC = None
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one atomic step (Linux renameat2 RENAME_EXCHANGE). False where the OS or the
    filesystem cannot; the caller then falls back to two renames."""
    fn = getattr(_LIBC, "renameat2", None)
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(err, f"cannot swap {a} and {b}: {os.strerror(err)}")


def umask() -> int:
    """The process's umask, read without changing it where /proc allows (os.umask can only set it)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:  # no /proc (macOS): set it and put it back at once
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _as_created(path: Path, folder: bool) -> None:
    """Give a `tempfile` file (0600) or folder (0700) the permissions a plain open() / mkdir() would have."""
    os.chmod(path, (0o777 if folder else 0o666) & ~umask())


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.{os.getpid()}-"


def _temp_pattern(path: Path) -> re.Pattern:
    """This output's temporaries and nothing else's: the part after the name has no dot, so `.out.v2.<...>.tmp`
    (output `out.v2`) never matches output `out`. The pid is absent in names made before it was added."""
    return re.compile(rf"\.{re.escape(path.name)}\.(?:(?P<pid>\d+)-)?[a-z0-9_]+\.(?P<kind>tmp|old)\Z")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def clean_stale_temporaries(path: str | os.PathLike) -> list[Path]:
    """Delete the temporaries that killed runs left beside `path` (only this output's, only of dead processes).
    If `path` is missing and a kill left the old folder aside, move it back first. Returns what was deleted."""
    path = Path(path)
    if not path.parent.is_dir():
        return []
    pattern = _temp_pattern(path)
    stale: list[Path] = []
    asides: list[Path] = []
    for entry in path.parent.iterdir():
        match = pattern.match(entry.name)
        if match is None or (match["pid"] is not None and _alive(int(match["pid"]))):
            continue
        (asides if match["kind"] == "old" else stale).append(entry)
    if asides and not os.path.lexists(path):
        latest = max(asides, key=lambda p: p.lstat().st_mtime_ns)
        os.rename(latest, path)
        asides.remove(latest)
    for entry in stale + asides:
        _remove(entry)
    return stale + asides


CACHE_VARIABLE = "VLBENCH_CACHE"  # the user's cache of machine facts (WordNet's copy, the plan's measured rates)


def user_cache_dir() -> Path:
    """$VLBENCH_CACHE, else ~/.cache/vlbench."""
    return Path(os.environ.get(CACHE_VARIABLE) or os.path.join(os.path.expanduser("~"), ".cache", "vlbench"))


class WriteError(VlbenchError):
    """A file could not be written (a full disk, a quota, a size limit, a read-only folder); the old file is kept."""


WRITE_FAILURES = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}  # what writing the temporary can meet
CREATE_FAILURES = WRITE_FAILURES | {errno.EACCES, errno.EPERM}  # and creating it


def _cannot_write(path: Path, err: OSError) -> WriteError:
    return WriteError(f"{path}: cannot write it ({err.strerror or err}); the old file is kept: free space on its disk "
                      f"(`df -h {path.parent}`) or make the folder writable, then rerun")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it onto `path`, on error delete it. A full disk (or
    another failure to write, `WRITE_FAILURES`) is a WriteError naming `path`, which is left as it was."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_temporaries(path)
        fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    except OSError as err:
        if err.errno in CREATE_FAILURES:
            raise _cannot_write(path, err) from err
        raise
    os.close(fd)
    tmp = Path(tmp)
    _as_created(tmp, folder=False)
    try:
        yield tmp
        os.replace(tmp, path)
    except OSError as err:
        if err.errno in WRITE_FAILURES:
            raise _cannot_write(path, err) from err
        raise
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary directory beside `path`; on success it replaces `path` whole.

    The old folder is never deleted before the new one is in place: the two are swapped in one atomic step where
    the filesystem allows it (then the temporary holds the old folder and is deleted), otherwise the old one is
    renamed aside, the new one renamed in, and the old one deleted. A kill at any point leaves either the old or
    the new folder at `path`, or (between the two renames) the old one aside, which the next run puts back."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temporaries(path)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent))
    _as_created(tmp, folder=True)
    try:
        yield tmp
        if not os.path.lexists(path):
            os.rename(tmp, path)
        elif not _exchange(tmp, path):
            aside = path.with_name(f"{_temp_prefix(path)}{secrets.token_hex(4)}.old")
            os.rename(path, aside)
            try:
                os.rename(tmp, path)
            except BaseException:
                os.rename(aside, path)
                raise
            _remove(aside)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_json(path: str | os.PathLike, obj) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
