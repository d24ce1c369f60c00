"""The download layer every real dataset source uses: checksummed, resumable, atomic, local mirror first.

`fetch(resource, dataset)` returns a verified file in the download cache. It looks, in order:

1. in the cache (`cache=` argument, else env `VLBENCH_DOWNLOADS`, else `data/downloads`): a file there is
   trusted through its sidecar `<file>.sha256` (JSON: digests, size, mtime) while size and mtime match,
   and re-hashed otherwise; a cached file that no longer matches its checksum is deleted and fetched again;
2. in the local mirror folder (`mirror=` argument, else env `VLBENCH_MIRROR`; the prepare stage fills it from
   the config key `downloads.mirror`), by file name (the cache name, or for a resource with a checksum also its
   upstream name, the last part of a URL), at its top level or one sub-folder down. A mirror file
   is verified by the same checksums (a mismatch is an error naming it; mirror files are never deleted),
   then hard-linked (or copied) into the cache;
3. on the resource's URLs, mirrors in order: each download goes to `<file>.part` in the cache, resumes with
   an HTTP Range request after a dropped connection (a server that answers 200 instead of 206 restarts the
   file cleanly), retries with exponential backoff, times out on a silent socket, and is verified before it
   is renamed to its final name. A checksum mismatch deletes the bad file and names the URL, the expected
   and the actual checksum.

A resource without URLs (licence, login, Google Drive, Kaggle) that is in neither place raises
`ManualDownloadError`, which says which file, where to get it, where to put it and its checksum; the next
run continues from the placed file. See docs/downloads.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import ssl
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from vlbench.datasets.canonical import DatasetError
from vlbench.io import atomic_path, write_json

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

CACHE_ENV = "VLBENCH_DOWNLOADS"
MIRROR_ENV = "VLBENCH_MIRROR"
DEFAULT_CACHE = Path("data/downloads")
SIDECAR_SUFFIX = ".sha256"
PART_SUFFIX = ".part"
CHUNK = 1 << 20
USER_AGENT = "vlbench (+https://github.com/; dataset preparation)"
RESOURCE_KEYS = ("file", "url", "urls", "sha256", "md5", "manual")
CHECKSUMS = ("sha256", "md5", "git_sha1")  # the checksums a Resource may carry, checked in this order
UPSTREAM_CHANGED = "if upstream changed the file, update the checksum in the dataset entry"  # a mismatch's default remedy
# HTTP answers that another attempt on the same URL would not change: go to the next mirror at once.
PERMANENT_HTTP = {400, 401, 403, 404, 405, 410, 451}


class DownloadError(DatasetError):
    """A file could not be brought into the download cache (network or disk failure after retries and mirrors)."""


class ChecksumError(DownloadError):
    """A file's checksum differs from the expected one; the message names the file or URL and both checksums."""


class ManualDownloadError(DownloadError):
    """A file must be placed by hand; the message says which file, from where, where to put it and its checksum."""


@dataclass(frozen=True)
class RetryPolicy:
    """How hard `fetch` tries one URL: `attempts` requests, sleeping `base_delay * 2**k` (at most `max_delay`)
    between them; `timeout` seconds of socket silence abort a request (then it is retried and resumed).

    Defaults can be changed through env `VLBENCH_DOWNLOAD_ATTEMPTS`, `VLBENCH_DOWNLOAD_BACKOFF` (base delay)
    and `VLBENCH_DOWNLOAD_TIMEOUT`."""

    attempts: int = 4
    base_delay: float = 1.0
    max_delay: float = 60.0
    timeout: float = 60.0

    @classmethod
    def from_env(cls) -> RetryPolicy:
        default = cls()
        return cls(
            attempts=int(_env_number("VLBENCH_DOWNLOAD_ATTEMPTS", default.attempts)),
            base_delay=_env_number("VLBENCH_DOWNLOAD_BACKOFF", default.base_delay),
            max_delay=default.max_delay,
            timeout=_env_number("VLBENCH_DOWNLOAD_TIMEOUT", default.timeout),
        )

    def delay(self, attempt: int) -> float:
        return min(self.max_delay, self.base_delay * 2**attempt)


def _env_number(variable: str, default: float) -> float:
    raw = os.environ.get(variable)
    if raw in (None, ""):
        return default
    try:
        value = float(raw)
    except ValueError:
        raise DownloadError(f"environment variable {variable}={raw!r} is not a number") from None
    if value < 0 or (variable.endswith("ATTEMPTS") and value < 1):
        raise DownloadError(f"environment variable {variable}={raw!r} is out of range")
    return value


@dataclass(frozen=True)
class Resource:
    """One upstream file: its name in the cache and mirror folder, where to download it, how to verify it."""

    filename: str
    urls: tuple[str, ...] = ()
    sha256: str | None = None
    md5: str | None = None
    manual: str | None = None
    git_sha1: str | None = None  # git's blob id (sha1 of "blob <size>\0" + bytes): a hub's hash of a non-LFS file
    remedy: str | None = None  # what to do when the file's checksum differs (default: update the entry's checksum)

    def __post_init__(self) -> None:
        if not self.filename or self.filename in (".", "..") or "/" in self.filename or "\\" in self.filename:
            raise DatasetError(f"resource file name {self.filename!r} must be a plain file name (no folders)")
        object.__setattr__(self, "urls", tuple(self.urls))
        for algo, length in (("sha256", 64), ("md5", 32), ("git_sha1", 40)):
            value = getattr(self, algo)
            if value is not None:
                value = str(value).strip().lower()
                if not re.fullmatch(rf"[0-9a-f]{{{length}}}", value):
                    raise DatasetError(
                        f"resource {self.filename!r}: {algo} must be {length} hex digits, got {getattr(self, algo)!r}"
                    )
                object.__setattr__(self, algo, value)

    @property
    def verifiable(self) -> bool:
        return bool(self.sha256 or self.md5 or self.git_sha1)

    @property
    def extra_digests(self) -> tuple[str, ...]:
        """The digests besides sha256 (always computed) that verifying this file needs."""
        return tuple(algo for algo in ("md5", "git_sha1") if getattr(self, algo))

    def mirror_names(self) -> tuple[str, ...]:
        """The names a mirror file may have: the cache name, then, for a resource with a checksum, each URL's
        upstream file name where it differs (a mirror filled by hand keeps those). Without a checksum only the
        cache name counts: a generic upstream name (`train.zip`) could be any dataset's file."""
        names = [self.filename]
        for url in self.urls if self.verifiable else ():
            upstream = urllib.parse.unquote(Path(urllib.parse.urlparse(url).path).name)
            if upstream and "/" not in upstream and upstream not in names:
                names.append(upstream)
        return tuple(names)

    def expected(self) -> str:
        """The expected checksum in words, for messages."""
        parts = [f"{algo} {getattr(self, algo)}" for algo in CHECKSUMS if getattr(self, algo)]
        return ", ".join(parts) or "none (no checksum is published)"

    def provenance(self, path: str | os.PathLike) -> dict:
        """What the prepared dataset records about this file: name, URLs, sha256 (always, computed or taken from a
        still-valid sidecar), the upstream md5 where given, size, and whether a published checksum verified it."""
        path = Path(path)
        digests, _ = _digests(path, self.extra_digests)
        record = {"file": self.filename, "urls": list(self.urls), "sha256": digests["sha256"]}
        if self.md5:
            record["md5"] = self.md5
        record["size"] = path.stat().st_size
        record["verified"] = self.verifiable and _mismatch(self, digests) is None
        return record


def resource(name: str, obj: Mapping) -> Resource:
    """A `Resource` from a spec mapping `{file, url | urls, sha256 | md5, manual}` of dataset `name`.

    `file` defaults to the last path component of the first URL. Every error names the dataset and the key."""
    if not isinstance(obj, Mapping):
        raise DatasetError(f"dataset {name!r}: a resource must be a mapping with keys {list(RESOURCE_KEYS)}, got {obj!r}")
    unknown = sorted(str(k) for k in obj if k not in RESOURCE_KEYS)
    if unknown:
        raise DatasetError(f"dataset {name!r}: unknown resource key(s) {unknown}; allowed keys: {', '.join(RESOURCE_KEYS)}")
    if "url" in obj and "urls" in obj:
        raise DatasetError(f"dataset {name!r}: give a resource either 'url' or 'urls', not both")
    urls = _spec_urls(name, obj)
    filename = obj.get("file")
    if filename is None and urls:
        filename = Path(urllib.parse.urlparse(urls[0]).path).name
    if not isinstance(filename, str) or not filename:
        raise DatasetError(f"dataset {name!r}: resource key 'file' must be a file name, got {filename!r}")
    manual = obj.get("manual")
    if manual is not None and (not isinstance(manual, str) or not manual.strip()):
        raise DatasetError(f"dataset {name!r}: resource {filename!r} key 'manual' must be a non-empty text")
    if not urls and manual is None:
        raise DatasetError(f"dataset {name!r}: resource {filename!r} needs 'url'/'urls' or 'manual' instructions")
    for key in ("sha256", "md5"):
        if obj.get(key) is not None and not isinstance(obj[key], str):
            raise DatasetError(f"dataset {name!r}: resource {filename!r} key {key!r} must be a hex string, got {obj[key]!r}")
    try:
        return Resource(filename, urls, sha256=obj.get("sha256"), md5=obj.get("md5"), manual=manual)
    except DatasetError as err:
        raise DatasetError(f"dataset {name!r}: {err}") from None


def _spec_urls(name: str, obj: Mapping) -> tuple[str, ...]:
    raw = obj.get("urls", obj.get("url", ()))
    key = "urls" if "urls" in obj else "url"
    urls = (raw,) if isinstance(raw, str) else raw
    if not isinstance(urls, (list, tuple)) or not all(isinstance(u, str) and u for u in urls):
        raise DatasetError(f"dataset {name!r}: resource key {key!r} must be a URL or a list of URLs, got {raw!r}")
    for url in urls:
        if urllib.parse.urlparse(url).scheme not in ("http", "https", "file", "ftp"):
            raise DatasetError(f"dataset {name!r}: resource key {key!r}: {url!r} is not an http(s), ftp or file URL")
    return tuple(urls)


# ---------------------------------------------------------------------------------------------------- locations


def cache_dir(cache: str | os.PathLike | None = None) -> Path:
    """The download cache: `cache`, else env VLBENCH_DOWNLOADS, else data/downloads."""
    return Path(cache or os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def mirror_dir(mirror: str | os.PathLike | None = None) -> Path | None:
    """The local mirror folder: `mirror`, else env VLBENCH_MIRROR, else none. A named folder must exist."""
    chosen = mirror or os.environ.get(MIRROR_ENV)
    if not chosen:
        return None
    path = Path(chosen)
    if not path.is_dir():
        origin = "mirror= / downloads.mirror" if mirror else f"env {MIRROR_ENV}"
        raise DownloadError(f"the local mirror folder {path} ({origin}) does not exist or is not a folder")
    return path


def mirror_candidates(mirror: Path, *names: str) -> list[Path]:
    """Files with one of `names` in the mirror folder, name by name: at its top level first, then one sub-folder
    down (sorted)."""
    subs = sorted(p for p in mirror.iterdir() if p.is_dir())
    return [folder / name for name in names for folder in (mirror, *subs) if (folder / name).is_file()]


def _mirror_place(res: Resource, mirror: Path | None) -> str:
    """Where a missing file may be put besides the cache, and under which names (for messages)."""
    names = " or ".join(repr(n) for n in res.mirror_names())
    if len(res.mirror_names()) > 1:
        names += " (its upstream name)"
    if mirror is None:
        return f"into a mirror folder named by env {MIRROR_ENV} or the config key downloads.mirror, as {names}"
    return f"into the mirror folder {mirror.resolve()} (searched at its top and one sub-folder down), as {names}"


# ---------------------------------------------------------------------------------------------------- fetch


def fetch(
    res: Resource,
    dataset: str,
    *,
    cache: str | os.PathLike | None = None,
    mirror: str | os.PathLike | None = None,
    progress: bool = True,
    retry: RetryPolicy | None = None,
) -> Path:
    """A verified copy of `res` in the download cache: from the cache, else the local mirror, else its URLs."""
    folder = cache_dir(cache)
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / res.filename
    with file_lock(folder, res.filename):
        if dest.exists() and _cached_is_valid(res, dest, dataset):
            return dest
        mirror_path = mirror_dir(mirror)
        if mirror_path is not None and (found := _from_mirror(res, dataset, mirror_path, dest)):
            return found
        if not res.urls:
            raise ManualDownloadError(_manual_message(res, dataset, dest, mirror_path))
        return _download(res, dataset, dest, mirror_path, progress, retry or RetryPolicy.from_env())


@contextlib.contextmanager
def file_lock(folder: Path, filename: str) -> Iterator[None]:
    """One process at a time per cached file (two prepare stages may want the same file)."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(folder / f".{filename}.lock", "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cached_is_valid(res: Resource, dest: Path, dataset: str) -> bool:
    """Whether the cached file matches; one that does not is deleted if vlbench put it there (it has a sidecar),
    and is an error if a person did (a hand-placed file is never deleted)."""
    digests, from_sidecar = _digests(dest, res.extra_digests)
    bad = _mismatch(res, digests)
    if bad is None:
        if not from_sidecar:
            _write_sidecar(dest, digests, res.verifiable)
        return True
    algo, expected, actual = bad
    if not sidecar_path(dest).exists():
        raise ChecksumError(
            f"dataset {dataset!r}: the file {dest} (placed by hand?) has {algo} {actual}, expected {expected}; "
            f"replace it with the right file, or delete it so that it is fetched again{_remedy(res, '; ')}"
        )
    _warn(f"dataset {dataset!r}: cached {dest} has {algo} {actual}, expected {expected}; deleting it and fetching again")
    _delete(dest)
    return False


def _from_mirror(res: Resource, dataset: str, mirror: Path, dest: Path) -> Path | None:
    failures = []
    for source in mirror_candidates(mirror, *res.mirror_names()):
        try:
            digests = _install_from_mirror(res, source, dest)
        except _MirrorMismatch as err:
            failures.append(f"{source} has {err}")
            continue
        if not res.verifiable:
            _warn_unverified(res, dataset, digests["sha256"], source)
        return dest
    if failures:
        raise ChecksumError(
            f"dataset {dataset!r}: mirror file(s) for {res.filename!r} do not match the expected checksum "
            f"({res.expected()}): {'; '.join(failures)}. Replace the mirror file with the correct one (it was not deleted)"
            f"{_remedy(res, '; ')}"
        )
    return None


class _MirrorMismatch(Exception):
    """A mirror file's actual checksum (the message) differs from the expected one."""


def _install_from_mirror(res: Resource, source: Path, dest: Path) -> dict:
    """Link or copy `source` into the cache as `dest`, verified; a mismatch leaves the cache as it was."""
    with atomic_path(dest) as tmp:
        _link_or_copy(source, tmp)
        digests = _hash_file(tmp, res.extra_digests)
        bad = _mismatch(res, digests)
        if bad is not None:
            raise _MirrorMismatch(f"{bad[0]} {bad[2]}")
    _write_sidecar(dest, digests, res.verifiable)
    return digests


def _link_or_copy(source: Path, tmp: Path) -> None:
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:
        shutil.copyfile(source, tmp)


def _manual_message(res: Resource, dataset: str, dest: Path, mirror: Path | None, failures: list[str] = ()) -> str:
    origin = f"get it from: {res.manual.strip().rstrip('.')}" if res.manual else "no download URL is known for it"
    tried = f" Downloading failed ({'; '.join(failures)})." if failures else ""
    place = f"{dest.resolve()}, or {_mirror_place(res, mirror)}"
    checksum = f"its expected checksum is {res.expected()}" if res.verifiable else "no checksum is published for it"
    return (
        f"dataset {dataset!r} needs the file {res.filename!r}, which must be downloaded by hand: {origin}.{tried} "
        f"Put it at {place}; {checksum}. Then run again: preparation continues from that file."
    )


def _download(res: Resource, dataset: str, dest: Path, mirror: Path | None, progress: bool, retry: RetryPolicy) -> Path:
    part = dest.with_name(dest.name + PART_SUFFIX)
    failures: list[str] = []
    mismatches: list[str] = []
    for url in res.urls:
        try:
            _download_url(url, part, res.filename, progress, retry)
        except _UrlFailed as err:
            failures.append(f"{url}: {err}")
            continue
        digests = _hash_file(part, res.extra_digests)
        bad = _mismatch(res, digests)
        if bad is not None:
            _delete(part)
            mismatches.append(f"{url} gave {bad[0]} {bad[2]}, expected {bad[1]}")
            continue
        os.replace(part, dest)
        _write_sidecar(dest, digests, res.verifiable)
        if not res.verifiable:
            _warn_unverified(res, dataset, digests["sha256"], url)
        return dest
    if mismatches:
        others = f" (other URLs failed: {'; '.join(failures)})" if failures else ""
        raise ChecksumError(
            f"dataset {dataset!r}: checksum mismatch for {res.filename!r}: {'; '.join(mismatches)}{others}. "
            f"The bad download was deleted; {res.remedy or UPSTREAM_CHANGED}"
        )
    if res.manual:
        raise ManualDownloadError(_manual_message(res, dataset, dest, mirror, failures))
    raise DownloadError(
        f"dataset {dataset!r}: could not download {res.filename!r} from any of its {len(res.urls)} URL(s): "
        f"{'; '.join(failures)}. Without network, put the file at {dest.resolve()}, or {_mirror_place(res, mirror)}; "
        f"its expected checksum is {res.expected()}"
    )


# ---------------------------------------------------------------------------------------------------- HTTP


class _UrlFailed(Exception):
    """This URL gave up (after retries or at once on a permanent answer); the message says why."""


class _Retryable(Exception):
    """One request failed in a way another attempt may fix (dropped connection, timeout, 5xx)."""


def _download_url(url: str, part: Path, label: str, progress: bool, retry: RetryPolicy) -> None:
    """Bring `url` completely into `part`, resuming what is there; raise _UrlFailed when it cannot."""
    last = "no attempt"
    for attempt in range(retry.attempts):
        if attempt:
            time.sleep(retry.delay(attempt - 1))
        try:
            _request_into(url, part, label, progress, retry.timeout)
            return
        except urllib.error.HTTPError as err:
            err.close()
            last = f"HTTP {err.code} {err.reason}"
            if err.code in PERMANENT_HTTP:
                raise _UrlFailed(last) from None
        except urllib.error.URLError as err:
            last = f"{err.reason}"
            if isinstance(err.reason, (socket.gaierror, ssl.SSLCertVerificationError, FileNotFoundError, str)):
                raise _UrlFailed(last) from None  # unknown host (offline), bad certificate, no such file: final
        except (_Retryable, http.client.HTTPException, OSError) as err:
            last = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    raise _UrlFailed(f"{last} (after {retry.attempts} attempt(s))")


def _request_into(url: str, part: Path, label: str, progress: bool, timeout: float) -> None:
    """One request: resume from `part`'s size with a Range header, append what arrives, check the length."""
    offset = part.stat().st_size if part.exists() else 0
    headers = {"User-Agent": USER_AGENT}
    if offset:
        headers["Range"] = f"bytes={offset}-"
    request = urllib.request.Request(url, headers=headers)
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as err:
        if err.code != 416 or not offset:
            raise
        err.close()
        _handle_unsatisfiable_range(err, part, offset)
        return
    with response:
        offset = _resume_offset(response, part, offset)
        length = response.headers.get("Content-Length")
        total = offset + int(length) if length is not None and length.isdigit() else None
        written = _stream(response, part, offset, total, label, progress)
    if total is not None and written != total:
        raise _Retryable(f"connection closed after {written} of {total} bytes")


def _resume_offset(response, part: Path, offset: int) -> int:
    """Where the response's body starts in the file: `offset` for a matching 206, else 0 (the part is discarded)."""
    status = getattr(response, "status", None) or 200
    if offset and status == 206:
        match = re.match(r"bytes\s+(\d+)-", response.headers.get("Content-Range", ""))
        if match and int(match.group(1)) == offset:
            return offset
        part.unlink(missing_ok=True)
        raise _Retryable(f"server resumed at the wrong position ({response.headers.get('Content-Range')!r}); starting over")
    if status not in (200, 206):
        raise _Retryable(f"unexpected HTTP status {status}")
    if offset:
        part.unlink(missing_ok=True)  # the server ignored Range: start the file over
    return 0


def _handle_unsatisfiable_range(err: urllib.error.HTTPError, part: Path, offset: int) -> None:
    """416 for `bytes=<size>-`: the part is complete when the server's size equals it; otherwise start over."""
    match = re.search(r"/(\d+)", err.headers.get("Content-Range", "") if err.headers else "")
    if match and int(match.group(1)) == offset:
        return
    part.unlink(missing_ok=True)
    raise _Retryable("server refused the resume position; starting over")


def _stream(response, part: Path, offset: int, total: int | None, label: str, progress: bool) -> int:
    from tqdm import tqdm

    written = offset
    bar = tqdm(
        total=total, initial=offset, unit="B", unit_scale=True, unit_divisor=1024, desc=label,
        disable=None if progress else True, leave=False, file=sys.stderr,
    )
    with bar, _writable(part, offset) as out:
        while block := response.read(CHUNK):
            _write(out, part, block)
            written += len(block)
            bar.update(len(block))
    return written


def _writable(part: Path, offset: int):
    try:
        return open(part, "ab" if offset else "wb")
    except OSError as err:
        raise DownloadError(f"cannot write the download {part}: {err.strerror or err}") from None


def _write(out, part: Path, block: bytes) -> None:
    """Disk errors (disk full, permissions) end the download at once, naming the file: no retry can fix them."""
    try:
        out.write(block)
    except OSError as err:
        raise DownloadError(f"cannot write the download {part}: {err.strerror or err}") from None


# ---------------------------------------------------------------------------------------------------- checksums


def _hash_file(path: Path, extra: tuple[str, ...] = ()) -> dict:
    """{"sha256": hex} and the `extra` digests ("md5"; "git_sha1", git's blob id: sha1 of "blob <size>\\0" + bytes)."""
    hashes = {"sha256": hashlib.sha256()}
    if "md5" in extra:
        hashes["md5"] = hashlib.md5(usedforsecurity=False)
    if "git_sha1" in extra:
        hashes["git_sha1"] = hashlib.sha1(f"blob {path.stat().st_size}\0".encode(), usedforsecurity=False)
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            for digest in hashes.values():
                digest.update(block)
    return {algo: digest.hexdigest() for algo, digest in hashes.items()}


def _mismatch(res: Resource, digests: Mapping) -> tuple[str, str, str] | None:
    """(algorithm, expected, actual) of the first published checksum the digests fail, else None."""
    for algo in CHECKSUMS:
        expected = getattr(res, algo)
        if expected and digests.get(algo) != expected:
            return algo, expected, digests.get(algo, "?")
    return None


def sidecar_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


def _write_sidecar(path: Path, digests: Mapping, verified: bool, stat: os.stat_result | None = None) -> None:
    stat = stat or path.stat()
    write_json(sidecar_path(path), {**digests, "verified": verified, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns})


def read_sidecar(path: str | os.PathLike) -> dict | None:
    """The sidecar of a cached file while it still describes it (same size and mtime), else None."""
    path = Path(path)
    try:
        record = json.loads(sidecar_path(path).read_text())
        stat = path.stat()
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("size") != stat.st_size or record.get("mtime_ns") != stat.st_mtime_ns:
        return None
    return record


def _digests(path: Path, extra: tuple[str, ...] = ()) -> tuple[dict, bool]:
    """(digests, whether they came from a still-valid sidecar): the sidecar's when it has the ones wanted."""
    record = read_sidecar(path)
    if record and all(algo in record for algo in ("sha256", *extra)):
        return record, True
    return _hash_file(path, extra), False


def forget_verification(path: str | os.PathLike) -> str:
    """After `path` turned out unusable (a corrupt archive): make the next `fetch` notice. A cached file that no
    published checksum verified is deleted (a rerun downloads it again); a verified one loses its sidecar, so the
    next fetch re-hashes it (a file damaged on disk is then fetched again, an intact one is upstream's own fault).
    Files without a sidecar (a user's file, a mirror file) are never touched. Returns what was done, for messages."""
    path = Path(path)
    sidecar = sidecar_path(path)
    try:
        record = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return "it is not in the download cache, so it was left as it is"
    if not record.get("verified", False):
        _delete(path)
        return "it had no published checksum, so it was deleted from the download cache and the next run downloads it again"
    sidecar.unlink(missing_ok=True)
    return (
        "it matched its published checksum; the next run re-hashes it and downloads it again if it changed on disk "
        "(if it still matches, the upstream file itself is damaged)"
    )


def _delete(path: Path) -> None:
    path.unlink(missing_ok=True)
    sidecar_path(path).unlink(missing_ok=True)


def _remedy(res: Resource, before: str) -> str:
    return f"{before}{res.remedy}" if res.remedy else ""


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _warn_unverified(res: Resource, dataset: str, sha256: str, source) -> None:
    _warn(f"dataset {dataset!r}: {res.filename!r} from {source} has no published checksum; not verified (sha256 {sha256})")


def spec_resources(name: str, spec: Mapping, defaults: Mapping[str, Mapping]) -> dict[str, Resource]:
    """The source's files by role: `defaults`, each replaced whole by the entry's `files.<role>` if given
    (another mirror URL or file name; a test's miniature file)."""
    overrides = spec.get("files") or {}
    if not isinstance(overrides, Mapping):
        raise DatasetError(f"dataset {name!r}: 'files' must be a mapping role -> {{file, url, md5|sha256, manual}}")
    unknown = sorted(str(k) for k in overrides if k not in defaults)
    if unknown:
        raise DatasetError(f"dataset {name!r}: unknown file role(s) {unknown} under 'files'; known: {', '.join(defaults)}")
    return {role: resource(name, overrides.get(role, default)) for role, default in defaults.items()}


def fetch_files(name: str, spec: Mapping, defaults: Mapping[str, Mapping]) -> dict[str, tuple[Resource, Path]]:
    """Every file of the source, verified, in `defaults` order. Files that must be downloaded by hand and are
    missing are all named in one ManualDownloadError, so that one trip to the website brings them all."""
    found: dict[str, tuple[Resource, Path]] = {}
    missing: list[str] = []
    for role, res in spec_resources(name, spec, defaults).items():
        try:
            found[role] = (res, fetch(res, name))
        except ManualDownloadError as err:
            missing.append(str(err))
    if missing:
        raise all_missing(missing)
    return found


def all_missing(messages: list[str]) -> ManualDownloadError:
    """One error naming every file a person must fetch, so that one trip to the website brings them all."""
    if len(messages) == 1:
        return ManualDownloadError(messages[0])
    listed = " ".join(f"({i}) {message}" for i, message in enumerate(messages, 1))
    return ManualDownloadError(f"{len(messages)} files must be downloaded by hand: {listed}")
