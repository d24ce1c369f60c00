"""A local HTTP file server for tests: serves a folder on 127.0.0.1 with Range support and injectable faults.

    with serve(tmp_path / "www", truncate=100) as base_url:
        fetch(Resource("a.tar", (f"{base_url}/a.tar",), sha256=...), "demo")
        assert base_url.requests["/a.tar"] == 2
        assert base_url.ranges["/a.tar"] == [None, "bytes=100-"]

`base_url` is a str (no trailing slash) that also carries what the server saw: `requests` (a Counter of
requests per path) and `ranges` (per path, the Range header of each request, None where absent).

Faults (each applies to every path, or only to the paths in `only`, e.g. `only={"/a.tar"}`):
- `truncate=N`: send the headers with the full length, then only the first N bytes of the body, then close
  the connection; `truncate_times` responses are cut (default 1; None: always).
- `fail_first=k`: answer the first k requests of a path with `fail_status` (default 404).
- `ignore_range=True`: answer 200 with the whole file even when a Range is asked for.
- `stall=N`: send N bytes of the body, then go silent for `stall_seconds` (a client without a timeout hangs).

It also speaks the Hugging Face hub's dataset API, for the files under `<root>/datasets/<owner>/<name>/`
(`write_hub_file`, `point_branch`), and env HF_ENDPOINT points at it while it serves:
- `GET /datasets/<repo>/resolve/<commit>/<path>`: the file (with `X-Repo-Commit`; for an LFS file `X-Linked-Etag`
  and `X-Linked-Size`, its sha256 and size, as the hub sends them);
- `GET /api/datasets/<repo>/revision/<revision>` (a commit, or a branch of `<repo>/branches.json`): `{"id", "sha",
  "siblings": [{"rfilename", "size", "blobId", "lfs": {"sha256", "size", "pointerSize"}}]}` as huggingface_hub's
  `dataset_info(files_metadata=True)` reads it: `.tar` and `.parquet` files are LFS files (blobId: their pointer's git
  id), others are kept in git (blobId: git's blob id of the bytes).
- `hub_metadata={rfilename: {...} | None}` replaces a file's declared metadata (`{"lfs": {"sha256": ...}}` merges
  into its LFS pointer; None: no `lfs` and no `blobId`, nothing to verify it by).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


class BaseURL(str):
    """The server's base URL, with the per-path request log attached."""

    requests: collections.Counter
    ranges: dict[str, list[str | None]]


class _Faults:
    def __init__(self, truncate=None, truncate_times=1, fail_first=0, fail_status=404, ignore_range=False,
                 stall=None, stall_seconds=5.0, only=None):
        self.truncate, self.truncate_times = truncate, truncate_times
        self.fail_first, self.fail_status = fail_first, fail_status
        self.ignore_range = ignore_range
        self.stall, self.stall_seconds = stall, stall_seconds
        self.only = set(only) if only is not None else None
        self.truncated = collections.Counter()

    def applies(self, path: str) -> bool:
        return self.only is None or path in self.only

    def cut_at(self, path: str) -> int | None:
        """How many body bytes to send before dropping the connection, or None to send all."""
        if self.truncate is None or not self.applies(path):
            return None
        if self.truncate_times is not None and self.truncated[path] >= self.truncate_times:
            return None
        self.truncated[path] += 1
        return self.truncate


LFS_SUFFIXES = (".tar", ".parquet")
API = re.compile(r"/api/datasets/(?P<repo>[^/]+/[^/]+)/revision/(?P<revision>.+)")
RESOLVE = re.compile(r"/datasets/(?P<repo>[^/]+/[^/]+)/resolve/(?P<commit>[0-9a-f]{40})/(?P<path>.+)")


def write_hub_file(root: Path, repo: str, commit: str, path: str, data: bytes) -> Path:
    """Put `data` as `path` of dataset repository `repo` at `commit` on the local hub served from `root`."""
    target = root / "datasets" / repo / "resolve" / commit / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return target


def point_branch(root: Path, repo: str, branch: str, commit: str) -> None:
    """Make `branch` (e.g. main) of `repo` point at `commit` on the local hub."""
    refs = root / "datasets" / repo / "branches.json"
    branches = json.loads(refs.read_text()) if refs.exists() else {}
    refs.parent.mkdir(parents=True, exist_ok=True)
    refs.write_text(json.dumps({**branches, branch: commit}))


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    """The text git keeps for an LFS file (its pointer)."""
    oid = hashlib.sha256(data).hexdigest()
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {len(data)}\n".encode()


def _sibling(name: str, data: bytes) -> dict:
    if not name.endswith(LFS_SUFFIXES):
        return {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
    pointer = lfs_pointer(data)
    return {"rfilename": name, "size": len(data), "blobId": git_blob_id(pointer),
            "lfs": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": len(pointer)}}


def revision_info(root: Path, repo: str, revision: str, overrides: dict) -> dict | None:
    """The hub's answer for `revision` of `repo` (None: no such repository or revision)."""
    folder = root / "datasets" / repo
    refs = folder / "branches.json"
    commit = revision if (folder / "resolve" / revision).is_dir() else (
        json.loads(refs.read_text()).get(revision) if refs.exists() else None)
    if commit is None or not (folder / "resolve" / commit).is_dir():
        return None
    files = sorted(p for p in (folder / "resolve" / commit).rglob("*") if p.is_file())
    siblings = []
    for file in files:
        name = file.relative_to(folder / "resolve" / commit).as_posix()
        sibling = _sibling(name, file.read_bytes())
        if name in overrides:
            change = overrides[name]
            if change is None:
                sibling = {k: v for k, v in sibling.items() if k not in ("lfs", "blobId")}
            else:
                sibling = {**sibling, **change, **({"lfs": {**sibling.get("lfs", {}), **change["lfs"]}}
                                                   if "lfs" in change else {})}
        siblings.append(sibling)
    return {"id": repo, "sha": commit, "siblings": siblings}


def _handler(root: Path, faults: _Faults, base: BaseURL, lock: threading.Lock, hub_metadata: dict):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep test output quiet
            pass

        def do_GET(self):
            path = unquote(urlparse(self.path).path)
            with lock:
                base.requests[path] += 1
                base.ranges.setdefault(path, []).append(self.headers.get("Range"))
                count = base.requests[path]
            if faults.applies(path) and count <= faults.fail_first:
                return self._status(faults.fail_status)
            if api := API.fullmatch(path):
                return self._json(revision_info(root, api["repo"], api["revision"], hub_metadata))
            file = (root / path.lstrip("/")).resolve()
            if not file.is_file() or root.resolve() not in file.parents:
                return self._status(404)
            self._send_file(path, file.read_bytes())

        def _json(self, obj: dict | None):
            if obj is None:
                return self._status(404)
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _hub_headers(self, path: str, data: bytes):
            if found := RESOLVE.fullmatch(path):
                self.send_header("X-Repo-Commit", found["commit"])
                if found["path"].endswith(LFS_SUFFIXES):
                    self.send_header("X-Linked-Etag", f'"{hashlib.sha256(data).hexdigest()}"')
                    self.send_header("X-Linked-Size", str(len(data)))

        def _status(self, code: int):
            body = f"status {code}\n".encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _send_file(self, path: str, data: bytes):
            whole, start, status = data, 0, 200
            asked = self.headers.get("Range")
            if asked and not (faults.ignore_range and faults.applies(path)):
                match = re.fullmatch(r"bytes=(\d+)-(\d*)", asked.strip())
                if match:
                    start = int(match.group(1))
                    if start >= len(data):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(data)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    end = int(match.group(2)) + 1 if match.group(2) else len(data)
                    data, status = data[start:end], 206
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Accept-Ranges", "bytes")
            self._hub_headers(path, whole)
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{start + len(data) - 1}/{start + len(data)}")
            self.end_headers()
            self._send_body(path, data)

        def _send_body(self, path: str, data: bytes):
            with lock:
                cut = faults.cut_at(path)
            if cut is not None:
                self.wfile.write(data[:cut])
                self.wfile.flush()
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            if faults.stall is not None and faults.applies(path):
                self.wfile.write(data[: faults.stall])
                self.wfile.flush()
                time.sleep(faults.stall_seconds)
                self.close_connection = True
                return
            self.wfile.write(data)

    return Handler


@contextlib.contextmanager
def serve(root: Path, hub_metadata: dict | None = None, **faults) -> Iterator[BaseURL]:
    """Serve `root` on 127.0.0.1 (a free port) in a background thread; yield the base URL with its request log.
    Env HF_ENDPOINT is the base URL while it serves."""
    lock = threading.Lock()
    server = ThreadingHTTPServer(("127.0.0.1", 0), None)
    base = BaseURL(f"http://127.0.0.1:{server.server_address[1]}")
    base.requests, base.ranges = collections.Counter(), {}
    server.RequestHandlerClass = _handler(Path(root), _Faults(**faults), base, lock, hub_metadata or {})
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    endpoint = os.environ.get("HF_ENDPOINT")
    os.environ["HF_ENDPOINT"] = base
    try:
        yield base
    finally:
        if endpoint is None:
            os.environ.pop("HF_ENDPOINT", None)
        else:
            os.environ["HF_ENDPOINT"] = endpoint
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
