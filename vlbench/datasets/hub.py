"""Hugging Face dataset repositories, verified at the first download and pinned after it (the lock file `hub.lock`).

`hub_file(dataset, repo, revision, path)` brings one file of a dataset repository into the download cache
(vlbench/datasets/download.py `fetch`: cache, mirror, resumable download) and returns it with its provenance:

1. **Pin.** The lock (`hub.lock` in the project, env `VLBENCH_HUB_LOCK` moves it) records, per dataset entry, the
   repository, the revision the entry names (a branch such as `main`, a tag or a commit) and the commit it resolved to.
   An entry without a pin is pinned at its first download: the hub's revision API
   (`GET {endpoint}/api/datasets/{repo}/revision/{revision}?blobs=true`, what huggingface_hub's `dataset_info` asks)
   gives the commit (`sha`) and every file's metadata (`siblings`: `rfilename`, `size`, `blobId` and, for an LFS file,
   `lfs: {sha256, size}`).
2. **Every file from the commit**: `{endpoint}/datasets/{repo}/resolve/{commit}/{path}`, never from the branch, so that
   a branch moved between two files of one run cannot mix two versions. Cache names carry the commit.
3. **Verified at its first download**: an LFS file against the sha256 and size its LFS pointer declares, a file kept in
   git (small text files: classnames.txt, nshards.txt) against its git blob id (sha1 of `blob <size>\\0` + bytes) and
   size. A file the hub declares no hash for (no LFS pointer, no blob id) is refused: nothing unverified is pinned.
   The verified file's sha256 and size are then recorded in the lock.
4. **Every later download** uses the recorded commit and checks the recorded sha256 and size, and asks the hub
   nothing: with a lock and a filled cache (or mirror folder) no request is made, online or not. A file whose bytes
   differ from the lock is an error naming the file, both hashes and `vlbench lock --update <entry>`, the command that
   moves a pin on purpose (it re-resolves the entry's revision and forgets the files' hashes, which the next prepare
   records again, verified against the hub at the new commit).

The endpoint is env `HF_ENDPOINT` (default https://huggingface.co), as for huggingface_hub; env `HF_HUB_OFFLINE=1`
forbids every request to the hub: a file must then be pinned in the lock and be in the cache or the mirror folder.
vlbench sends no token (a gated repository's files go into the mirror folder by hand). See docs/downloads.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from vlbench.datasets.canonical import DatasetError
from vlbench.datasets.download import (
    USER_AGENT,
    ChecksumError,
    DownloadError,
    Resource,
    RetryPolicy,
    cache_dir,
    fetch,
    file_lock,
)
from vlbench.io import atomic_path

ENDPOINT_ENV = "HF_ENDPOINT"
DEFAULT_ENDPOINT = "https://huggingface.co"
OFFLINE_ENV = "HF_HUB_OFFLINE"
TRUE_VALUES = {"1", "ON", "YES", "TRUE"}  # huggingface_hub's constants.ENV_VARS_TRUE_VALUES
LOCK_ENV = "VLBENCH_HUB_LOCK"
DEFAULT_LOCK = Path("hub.lock")
COMMIT = re.compile(r"[0-9a-f]{40}")
SHA256 = re.compile(r"[0-9a-f]{64}")
LOCK_HEADER = (
    "# Hugging Face dataset repositories pinned at their first download (vlbench/datasets/hub.py, docs/downloads.md):\n"
    "# per dataset entry the repository, the revision the entry names, the commit it resolved to, and each file's\n"
    "# sha256 and size as verified against the hub. Commit it like dvc.lock. Written by the prepare stage;\n"
    "# `vlbench lock` shows it, `vlbench lock --update <entry>` moves a pin on purpose.\n"
)


class PinError(DownloadError):
    """The lock, the entry and the hub disagree (or the lock is malformed); the message says what to run."""


@dataclass(frozen=True)
class Pin:
    """One entry's pin: `files` maps a repository path to {"sha256": hex, "size": bytes}."""

    repository: str
    revision: str
    commit: str
    files: dict[str, dict] = field(default_factory=dict)

    def as_yaml(self) -> dict:
        return {"repository": self.repository, "revision": self.revision, "commit": self.commit,
                "files": {path: dict(self.files[path]) for path in sorted(self.files)}}


# ------------------------------------------------------------------------------------------------ settings


def endpoint() -> str:
    return (os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT).rstrip("/")


def offline() -> bool:
    return (os.environ.get(OFFLINE_ENV) or "").strip().upper() in TRUE_VALUES


def lock_path() -> Path:
    return Path(os.environ.get(LOCK_ENV) or DEFAULT_LOCK)


def pinned_commit(dataset: str) -> str | None:
    """The commit the lock pins `dataset` to, or None (pinned at its first download)."""
    pin = read_lock().get(dataset)
    return pin.commit if pin else None


def update_command(dataset: str) -> str:
    return f"vlbench lock --update {dataset}"


def resolve_url(repo: str, commit: str, path: str) -> str:
    return f"{endpoint()}/datasets/{repo}/resolve/{commit}/{urllib.parse.quote(path)}"


def cache_name(repo: str, commit: str, path: str) -> str:
    return f"{repo.replace('/', '__')}@{commit}__{path.replace('/', '__')}"


# ------------------------------------------------------------------------------------------------ the lock file


def read_lock(path: Path | None = None) -> dict[str, Pin]:
    """{entry: Pin} of the lock file (empty when there is none); a malformed lock is an error naming the file, the
    entry and the key."""
    path = path or lock_path()
    try:
        data = yaml.safe_load(path.read_text()) if path.exists() else {}
    except yaml.YAMLError as err:
        raise PinError(f"the hub lock {path} is not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, Mapping):
        raise PinError(f"the hub lock {path} must map dataset entries to their pins, got {type(data).__name__}")
    return {str(name): _pin(path, str(name), value) for name, value in data.items()}


def _pin(path: Path, name: str, value) -> Pin:
    where = f"the hub lock {path}, entry {name!r}"
    if not isinstance(value, Mapping) or not all(isinstance(value.get(k), str) for k in ("repository", "revision",
                                                                                          "commit")):
        raise PinError(f"{where}: needs 'repository', 'revision' and 'commit' (texts), got {value!r}")
    if not COMMIT.fullmatch(value["commit"]):
        raise PinError(f"{where}: 'commit' must be 40 hex digits, got {value['commit']!r}")
    files = value.get("files") or {}
    if not isinstance(files, Mapping):
        raise PinError(f"{where}: 'files' must map repository paths to {{sha256, size}}, got {files!r}")
    for file, record in files.items():
        if (not isinstance(record, Mapping) or not isinstance(record.get("sha256"), str)
                or not SHA256.fullmatch(record["sha256"]) or isinstance(record.get("size"), bool)
                or not isinstance(record.get("size"), int) or record["size"] < 0):
            raise PinError(f"{where}: file {file!r} needs 'sha256' (64 lower-case hex digits) and 'size' (bytes), "
                           f"got {record!r}")
    return Pin(value["repository"], value["revision"], value["commit"],
               {str(f): {"sha256": r["sha256"], "size": r["size"]} for f, r in files.items()})


@contextlib.contextmanager
def _editing_lock() -> Iterator[dict[str, Pin]]:
    """The lock's pins, read and written back (atomically) under a file lock: two prepare stages may pin at once."""
    path = lock_path()
    with file_lock(_lock_guard_dir(), "hub-lock"):
        pins = read_lock(path)
        yield pins
        with atomic_path(path) as tmp:
            body = {name: pins[name].as_yaml() for name in sorted(pins)}
            tmp.write_text(LOCK_HEADER + (yaml.safe_dump(body, sort_keys=False, width=120) if body else "{}\n"))


def _lock_guard_dir() -> Path:
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def record_file(dataset: str, commit: str, path: str, sha256: str, size: int) -> None:
    """Add a file verified at `commit` to `dataset`'s pin (an error if the pin moved meanwhile)."""
    with _editing_lock() as pins:
        pin = pins.get(dataset)
        if pin is None or pin.commit != commit:
            raise PinError(f"dataset {dataset!r}: its pin in {lock_path()} moved from {commit} while {path!r} was "
                           f"downloaded (`{update_command(dataset)}` ran meanwhile?); run prepare again")
        pins[dataset] = Pin(pin.repository, pin.revision, pin.commit, {**pin.files, path: {"sha256": sha256,
                                                                                            "size": size}})


def repin(dataset: str, repo: str, revision: str, first: bool = False) -> tuple[Pin | None, Pin]:
    """Resolve `revision` of `repo` at the hub now and pin `dataset` to that commit, with no file recorded yet (the
    next prepare downloads and verifies them at the new commit); a pin already at that commit keeps its files, and
    with `first` any pin there is kept (another prepare pinned it meanwhile). Returns (the old pin or None, the pin)."""
    if offline():
        raise PinError(f"dataset {dataset!r}: {OFFLINE_ENV} is set: pinning {repo}@{revision} needs the hub")
    commit = resolve(repo, revision)
    with _editing_lock() as pins:
        old = pins.get(dataset)
        if old is None or (not first and (old.repository, old.revision, old.commit) != (repo, revision, commit)):
            pins[dataset] = Pin(repo, revision, commit)
    return old, pins[dataset]


# ------------------------------------------------------------------------------------------------ the hub's API


def resolve(repo: str, revision: str) -> str:
    """The commit `revision` (a branch, tag or commit) of dataset repository `repo` points at now."""
    info = _revision_info(endpoint(), repo, revision)
    commit = info.get("sha")
    if not isinstance(commit, str) or not COMMIT.fullmatch(commit):
        raise DownloadError(f"the hub's revision API for {repo}@{revision} gave no commit ('sha': {commit!r})")
    _COMMITS[endpoint(), repo, commit] = info
    return commit


def declared(repo: str, commit: str, path: str) -> dict:
    """The hub's metadata of `path` at `commit`: {"sha256", "size"} of an LFS file's pointer, else {"git_sha1",
    "size"} of a file kept in git; an error when the file is absent or the hub declares no hash for it."""
    key = (endpoint(), repo, commit)
    if key not in _COMMITS:
        _COMMITS[key] = _revision_info(*key)
    siblings = {s.get("rfilename"): s for s in _COMMITS[key].get("siblings") or [] if isinstance(s, Mapping)}
    if path not in siblings:
        raise DownloadError(f"{repo}@{commit} has no file {path!r} (the hub lists {len(siblings)} files: "
                            f"{sorted(siblings)[:8]})")
    sibling = siblings[path]
    lfs = sibling.get("lfs")
    if isinstance(lfs, Mapping) and isinstance(lfs.get("sha256"), str) and isinstance(lfs.get("size"), int):
        return {"sha256": lfs["sha256"].lower(), "size": lfs["size"]}
    if isinstance(sibling.get("blobId"), str) and isinstance(sibling.get("size"), int) and not lfs:
        return {"git_sha1": sibling["blobId"].lower(), "size": sibling["size"]}
    raise ChecksumError(f"the hub declares no hash for {repo}@{commit} {path!r} (no LFS pointer with sha256 and size, "
                        f"no git blob id; its metadata: {dict(sibling)}): it cannot be verified, so it is not "
                        f"downloaded. Put a file you trust into the mirror folder and pin it in {lock_path()} by hand "
                        f"(docs/downloads.md)")


# (endpoint, repository, commit) -> the revision API's answer: a commit's files never change, so one question per
# commit and process
_COMMITS: dict[tuple[str, str, str], dict] = {}


def _revision_info(endpoint_url: str, repo: str, revision: str) -> dict:
    """The hub's revision API answer for `revision` (asked now: a branch moves)."""
    quoted = urllib.parse.quote(urllib.parse.unquote(revision), safe="")
    url = f"{endpoint_url}/api/datasets/{repo}/revision/{quoted}?blobs=true"
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, "Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=RetryPolicy.from_env().timeout) as response:
            info = json.loads(response.read())
    except urllib.error.HTTPError as err:
        err.close()
        why = {401: "gated or private: vlbench sends no token", 403: "gated or private: vlbench sends no token",
               404: "no such repository or revision"}.get(err.code, err.reason)
        raise DownloadError(f"the hub's revision API {url} answered HTTP {err.code} ({why})") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise DownloadError(f"the hub's revision API {url} could not be read ({getattr(err, 'reason', err)}); "
                            "without network, a pinned entry's files in the cache or mirror folder need no hub"
                            ) from None
    if not isinstance(info, dict):
        raise DownloadError(f"the hub's revision API {url} gave no JSON object")
    return info


# ------------------------------------------------------------------------------------------------ files


@dataclass(frozen=True)
class HubFile:
    """A verified file of a pinned repository: the cached copy and what the prepared dataset records about it."""

    local: Path
    commit: str
    provenance: dict


def hub_file(dataset: str, repo: str, revision: str, path: str, sha256: str | None = None) -> HubFile:
    """`path` of dataset repository `repo` at the commit `dataset`'s pin records (pinned now if it has none),
    verified against the lock, or at its first download against the hub's declaration (and the entry's `sha256`,
    where given), then recorded in the lock."""
    pin = _pin_of(dataset, repo, revision)
    recorded = pin.files.get(path)
    if recorded is not None and sha256 is not None and sha256.lower() != recorded["sha256"]:
        raise PinError(f"dataset {dataset!r}: the entry gives {path!r} sha256 {sha256.lower()}, {lock_path()} records "
                       f"{recorded['sha256']} at {repo}@{pin.commit}; correct the entry, or run "
                       f"`{update_command(dataset)}` to pin the hub's current files")
    expected = recorded or _first_download(dataset, repo, pin.commit, path, sha256)
    res = _resource(dataset, repo, pin.commit, path, expected)
    local = fetch(res, dataset)
    size = local.stat().st_size
    if size != expected["size"]:
        raise ChecksumError(f"dataset {dataset!r}: {repo}@{pin.commit} {path!r} ({local}) has {size} bytes, "
                            f"{'the lock records' if recorded else 'the hub declares'} {expected['size']}; "
                            f"{res.remedy}")
    # no URL: the endpoint (HF_ENDPOINT, offline or not) must not change what the prepared dataset records
    provenance = {"path": path, **{k: v for k, v in res.provenance(local).items() if k != "urls"}, "commit": pin.commit}
    if recorded is None:
        record_file(dataset, pin.commit, path, provenance["sha256"], size)
    return HubFile(local, pin.commit, provenance)


def _pin_of(dataset: str, repo: str, revision: str) -> Pin:
    pin = read_lock().get(dataset)
    if pin is None:
        if offline():
            raise PinError(f"dataset {dataset!r}: {OFFLINE_ENV} is set and {lock_path()} has no pin for it: run its "
                           f"prepare once with network (it pins {repo}@{revision}), or use a {lock_path().name} that "
                           f"has one")
        pin = repin(dataset, repo, revision, first=True)[1]
    if (pin.repository, pin.revision) != (repo, revision):
        raise PinError(f"dataset {dataset!r}: the entry reads {repo}@{revision}, {lock_path()} pins "
                       f"{pin.repository}@{pin.revision} (commit {pin.commit}); run `{update_command(dataset)}` to "
                       f"pin the entry's repository and revision")
    return pin


def _first_download(dataset: str, repo: str, commit: str, path: str, sha256: str | None) -> dict:
    """What the hub declares for a file not yet in the lock (checked against the entry's `sha256`, where given)."""
    if offline():
        raise PinError(f"dataset {dataset!r}: {OFFLINE_ENV} is set and {lock_path()} records no hash for {path!r} of "
                       f"{repo}@{commit}: run its prepare once with network, or use a lock that records it")
    found = declared(repo, commit, path)
    if sha256 is not None and "sha256" in found and found["sha256"] != sha256.lower():
        raise ChecksumError(f"dataset {dataset!r}: the entry gives {path!r} sha256 {sha256.lower()}, the hub declares "
                            f"{found['sha256']} at {repo}@{commit}; correct the entry's 'sha256'")
    return found if sha256 is None else {**found, "sha256": sha256.lower()}


def _resource(dataset: str, repo: str, commit: str, path: str, expected: Mapping) -> Resource:
    remedy = (f"the file differs from what {lock_path()} pins (or the hub declares) for {repo}@{commit}; if the "
              f"repository changed on purpose, `{update_command(dataset)}` pins its current commit and the next "
              f"prepare verifies its files again")
    manual = (f"{OFFLINE_ENV} is set, so nothing is downloaded: copy it from a machine that prepared {dataset!r} "
              f"({resolve_url(repo, commit, path)})") if offline() else None
    return Resource(cache_name(repo, commit, path), () if offline() else (resolve_url(repo, commit, path),),
                    sha256=expected.get("sha256"), git_sha1=expected.get("git_sha1"), manual=manual, remedy=remedy)


def parquet_rows(name: str, path: str, local: Path, columns: Sequence[str], required: Sequence[str],
                 hint: str = "") -> Iterator[tuple[int, dict]]:
    """(row number in the file, row) of one of the hub's Parquet files (`path` in the repository, `local` on disk), a
    row group at a time, `columns` only; a file that is not Parquet or lacks a `required` column is a one-line error
    naming it (`hint`: what reads those columns upstream)."""
    try:
        parquet = pq.ParquetFile(local)
    except (pa.ArrowInvalid, OSError) as err:
        raise DatasetError(f"dataset {name!r}: {path} is not a Parquet file ({err})") from None
    missing = [c for c in required if c not in parquet.schema_arrow.names]
    if missing:
        raise DatasetError(f"dataset {name!r}: {path} has no column(s) {missing}{hint}; columns: "
                           f"{parquet.schema_arrow.names}")
    row = 0
    for group in range(parquet.num_row_groups):
        for item in parquet.read_row_group(group, columns=list(columns)).to_pylist():
            yield row, item
            row += 1
