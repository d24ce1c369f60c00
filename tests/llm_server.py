"""A local OpenAI-compatible chat-completions server for tests, on 127.0.0.1, that the test controls.

    with serve_llm() as llm:
        llm.fail(429, retry_after="1")      # the next request gets 429 with Retry-After: 1
        llm.fail(500)                       # the one after that a 500
        ... Endpoint(llm.url) ...
        assert len(llm.requests) == 3

POST /v1/chat/completions answers `n` choices (at most `max_n` per response), each a deterministic text made from the
last line of the user message and the choice number (`answer(prompt, i)`). `requests` holds every request body
received (failed ones too), `headers` their headers. Queued faults apply to the next requests in order: `ok()`
answers as usual, `fail(status, retry_after=None, body=None)` answers that status (with an OpenAI-style error body
unless `body` is given), `malformed()` answers 200 with a body that is not JSON, `stall(seconds)` waits, then answers,
`truncate()` sends half of its answer and closes the connection, `trickle(seconds)` sends its answer one byte every
`seconds` (each read is quick, the whole answer is not).
With `key` set, a request without "Authorization: Bearer <key>" gets 401.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def answer(prompt: str, i: int) -> str:
    """The server's i-th answer to a prompt: names the prompt's last line, so tests can tell answers apart."""
    return f" It is described by answer {i} to {prompt.splitlines()[-1]!r}\n\nwith more"


class FakeLLM:
    def __init__(self, key: str | None = None, max_n: int | None = None):
        self.key, self.max_n = key, max_n
        self.url = ""
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.faults: deque = deque()
        self.lock = threading.Lock()

    def ok(self) -> None:
        self.faults.append(("ok",))

    def fail(self, status: int, retry_after: str | None = None, body: bytes | None = None) -> None:
        self.faults.append(("status", status, retry_after, body))

    def malformed(self) -> None:
        self.faults.append(("malformed",))

    def truncate(self) -> None:
        self.faults.append(("truncate",))

    def stall(self, seconds: float) -> None:
        self.faults.append(("stall", seconds))

    def trickle(self, seconds: float) -> None:
        self.faults.append(("trickle", seconds))

    def next_fault(self):
        with self.lock:
            return self.faults.popleft() if self.faults else None


def _handler(llm: FakeLLM):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json.loads(raw)
            with llm.lock:
                llm.requests.append(body)
                llm.headers.append(dict(self.headers))
            if self.path != "/v1/chat/completions":
                return self._send(404, self._error(f"no route {self.path}"))
            if llm.key and self.headers.get("Authorization") != f"Bearer {llm.key}":
                return self._send(401, self._error("Incorrect API key provided"))
            fault = llm.next_fault()
            if fault and fault[0] == "status":
                _, status, retry_after, fault_body = fault
                return self._send(status, fault_body or self._error(f"fault {status}"),
                                  {"Retry-After": retry_after} if retry_after else {})
            if fault and fault[0] == "malformed":
                return self._send(200, b'{"choices": [{"message": ')
            if fault and fault[0] == "stall":
                time.sleep(fault[1])
            prompt = body["messages"][-1]["content"]
            n = min(body.get("n", 1), llm.max_n or body.get("n", 1))
            choices = [{"index": i, "message": {"role": "assistant", "content": answer(prompt, i)},
                        "finish_reason": "stop"} for i in range(n)]
            data = json.dumps({"id": "x", "object": "chat.completion", "model": body["model"], "choices": choices})
            if fault and fault[0] == "trickle":
                return self._trickle(data.encode(), fault[1])
            self._send(200, data.encode(), cut=fault is not None and fault[0] == "truncate")

        def _trickle(self, body: bytes, seconds: float):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.close_connection = True
            with contextlib.suppress(OSError):
                for i in range(len(body)):
                    self.wfile.write(body[i:i + 1])
                    self.wfile.flush()
                    time.sleep(seconds)

        @staticmethod
        def _error(message: str) -> bytes:
            return json.dumps({"error": {"message": message, "type": "invalid_request_error"}}).encode()

        def _send(self, status: int, body: bytes, headers: dict | None = None, cut: bool = False):
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            with contextlib.suppress(OSError):
                self.wfile.write(body[: len(body) // 2] if cut else body)
            self.close_connection = cut

    return Handler


@contextlib.contextmanager
def serve_llm(**kwargs) -> Iterator[FakeLLM]:
    """Run a FakeLLM on 127.0.0.1 (a free port) in a background thread; `llm.url` is its base URL (…/v1)."""
    llm = FakeLLM(**kwargs)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(llm))
    server.daemon_threads = True
    llm.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield llm
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
