"""LLM descriptions for any class list: prompts by named style, an OpenAI-compatible chat client, an answer cache.

ELEVATER's GPT-3 file, CuPL's and Menon & Vondrick's files describe only their datasets' classes. The `llm_*`
knowledge variants ask a chat-completions endpoint instead, for any class list, with the prompts of a *style*
(`data/llm_styles.json`; every prompt text, sampling setting and post-processing rule there is data):

- `cupl` (CuPL's generate_image_prompts.py): per class, one request per question of a list (default `imagenet`, its
  five questions, "{article} {c}" filled by CuPL's article rule); temperature .99, max_tokens 50, n 10, stop ".";
  each answer with "\n\n" removed and "." appended; the class's texts are all its answers (as the cupl variant).
- `elevater_gpt3` (ELEVATER's extract_gpt3_knowledge.py with run_gpt3.sh): per class, 5 in-context prompts, each a
  header, 3 "Q: concept / A: definition" shots drawn with replacement from the dataset's Wiktionary definitions, then
  "Q: {c}\nA:"; temperature 0, max_tokens 50, n 1, stop ["\n", "<|endoftext|>"]; answers as they come, composed as
  the gpt3 variant composes ELEVATER's GPT-3 file (first `gpt3_items`).

The endpoint comes from the environment: `VLBENCH_LLM_BASE_URL` (POST `{url}/chat/completions`), `VLBENCH_LLM_API_KEY`
(sent as a bearer token, never written anywhere, redacted from every message), `VLBENCH_LLM_TIMEOUT` (seconds for a
whole request, default 60); the model from the params (`knowledge.llm.model`) or `VLBENCH_LLM_MODEL`. Each prompt is
sent as one user message. A Retry-After over `MAX_WAIT` and a response over `MAX_BYTES` are errors.

Every answer is cached (`AnswerCache`, one JSON line per request: key, style, class, prompt, model, settings, answers,
time), keyed by the sha256 of (model, messages, settings): a rerun asks only for what the cache lacks, and nothing is
asked when it lacks nothing (no endpoint needed then). New answers are appended to a journal beside the cache as they
come (one line each, flushed), and folded into the cache by an atomic rewrite at the end, also when the run fails; a
run that is killed leaves the journal, which the next run reads (a torn last line is dropped) and so resumes.
docs/protocols.md, "LLM descriptions for any class list".
"""

from __future__ import annotations

import contextlib
import email.utils
import functools
import hashlib
import http.client
import json
import os
import random
import re
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tqdm import tqdm

from vlbench.io import atomic_path
from vlbench.knowledge.sources import DATA_DIR, KnowledgeError
from vlbench.params import ParamsError, defaults

ENV_URL, ENV_KEY, ENV_MODEL, ENV_TIMEOUT = ("VLBENCH_LLM_BASE_URL", "VLBENCH_LLM_API_KEY", "VLBENCH_LLM_MODEL",
                                           "VLBENCH_LLM_TIMEOUT")
LLM_KEYS = ("model", "questions")
# What to check first when the endpoint refuses a request for good (no retry).
HINTS = {
    400: "the endpoint refused the request (model name or settings)",
    401: f"the endpoint wants a valid key in {ENV_KEY}",
    403: f"the key in {ENV_KEY} may not use this model",
    404: f"check {ENV_URL} (without /chat/completions) and the model name",
}
MAX_WAIT = 300.0  # seconds: the longest Retry-After vlbench waits for; a longer one fails naming the wait
MAX_BYTES = 256 * 1024  # bytes: the largest response kept (the styles' answers are a few KiB)
_BEARER = re.compile(r"(Bearer\s+)[^\s\"',;]+", re.IGNORECASE)


class LLMError(KnowledgeError):
    """An LLM endpoint, answer or answer cache problem; the message names the endpoint or file and the class."""


@functools.cache
def styles() -> dict[str, dict[str, Any]]:
    data = json.loads((DATA_DIR / "llm_styles.json").read_text(encoding="utf-8"))
    return {name: spec for name, spec in data.items() if not name.startswith("_")}


# ---------------------------------------------------------------------------------------------------- options


@dataclass(frozen=True)
class LLMOptions:
    """The params' `knowledge.llm`: the model (None: env VLBENCH_LLM_MODEL) and CuPL's questions (a list's name in
    the style table or the questions themselves)."""

    model: str | None = defaults("knowledge.llm.model")  # conf/settings/knowledge.yaml
    questions: str | tuple[str, ...] = defaults("knowledge.llm.questions")

    def for_style(self, style: str) -> dict[str, Any]:
        return {"llm_style": style, **({"questions": _jsonable(self.questions)} if _uses_questions(style) else {})}


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value


def _uses_questions(style: str) -> bool:
    return styles()[style]["prompts"] == "questions"


def llm_options(cfg: Mapping[str, Any] | None) -> LLMOptions:
    """`knowledge.llm`, checked; every error names the key."""
    cfg = dict(cfg or {})
    unknown = sorted(set(cfg) - set(LLM_KEYS))
    if unknown:
        raise ParamsError(f"params.yaml: unknown key(s) {unknown} under 'knowledge.llm'; "
                          f"allowed: {', '.join(LLM_KEYS)}")
    model = cfg.get("model")
    if model is not None and (not isinstance(model, str) or not model.strip()):
        raise ParamsError(f"params.yaml: knowledge.llm.model must be a model name or null, got {model!r}")
    questions = cfg.get("questions", LLMOptions.questions)
    named = styles()["cupl"]["questions"]
    if isinstance(questions, str) and questions not in named:
        raise ParamsError(f"params.yaml: knowledge.llm.questions {questions!r} is not a question list of "
                          f"llm_styles.json ({', '.join(named)}) nor a list of questions with '{{c}}'")
    if not isinstance(questions, str):
        if (not isinstance(questions, (list, tuple)) or not questions
                or not all(isinstance(q, str) and "{c}" in q for q in questions)):
            raise ParamsError(f"params.yaml: knowledge.llm.questions must name a list or be a non-empty list of "
                              f"questions with '{{c}}' (and optionally '{{article}}'), got {questions!r:.120}")
        questions = tuple(questions)
    return LLMOptions(model, questions)


def resolve_model(options: LLMOptions, env: Mapping[str, str] = os.environ) -> str:
    model = options.model or env.get(ENV_MODEL)
    if not model:
        raise LLMError(f"the llm_* knowledge variants need a model name: set knowledge.llm.model in the params or "
                       f"the environment variable {ENV_MODEL} (and {ENV_URL}, {ENV_KEY} for the endpoint)")
    return model


# ---------------------------------------------------------------------------------------------------- prompts

_FIELD = re.compile(r"\{(article|c|q|a)\}")


def fill(template: str, **values: str) -> str:
    """Put the values into `{article}`, `{c}`, `{q}`, `{a}` in one pass (a value's own braces stay as they are)."""
    return _FIELD.sub(lambda m: values.get(m[1], m[0]), template)


def article(rule: Mapping[str, str], name: str) -> str:
    """CuPL's article: "an" when the name's first character is in its vowel list ('A', 'E', 'I', 'O', 'U': capitals
    only, so "apple" gets "a"), else "a"."""
    return rule["an"] if name[:1] in rule["an_before"] else rule["a"]


@dataclass(frozen=True)
class Plan:
    """What one style asks for one dataset: the style's spec, the model, CuPL's questions, ELEVATER's context pairs."""

    style: str
    model: str
    questions: tuple[str, ...] = ()
    contexts: tuple[tuple[str, str], ...] = ()

    @property
    def spec(self) -> dict[str, Any]:
        return styles()[self.style]


def question_prompts(plan: Plan, name: str) -> list[str]:
    """CuPL: every question with the class name and its article."""
    rule = plan.spec["article"]
    return [fill(q, article=article(rule, name), c=name) for q in plan.questions]


def in_context_prompts(plan: Plan, name: str) -> list[str]:
    """ELEVATER: per repeat, the header, `shots` (concept, definition) pairs drawn uniformly with replacement from the
    context pool (the class itself may be drawn, as in the toolkit), then the query. Seeded by (seed, class, repeat)."""
    spec = plan.spec
    if not plan.contexts:
        raise LLMError(f"llm style {plan.style!r}: no (concept, definition) pairs to build the in-context prompt of "
                       f"class {name!r} from")
    shots = min(spec["shots"], len(plan.contexts))
    prompts = []
    for repeat in range(spec["repeats"]):
        rng = random.Random(f"{spec['seed']}|{name}|{repeat}")
        pairs = [plan.contexts[rng.randrange(len(plan.contexts))] for _ in range(shots)]
        prompts.append(spec["header"] + "".join(fill(spec["shot"], q=q, a=a) for q, a in pairs)
                       + fill(spec["query"], c=name))
    return prompts


PROMPTS: dict[str, Callable[[Plan, str], list[str]]] = {"questions": question_prompts, "in_context": in_context_prompts}


def plan_for(style: str, model: str, options: LLMOptions, contexts: Sequence[tuple[str, str]] = ()) -> Plan:
    spec = styles()[style]
    questions = options.questions
    if isinstance(questions, str):
        questions = spec.get("questions", {}).get(questions, ())
    return Plan(style, model, tuple(questions) if spec["prompts"] == "questions" else (), tuple(contexts))


@dataclass(frozen=True)
class Request:
    style: str
    class_index: int
    name: str
    part: int  # which question / repeat of the class
    prompt: str
    model: str
    settings: Mapping[str, Any] = field(hash=False)

    def body(self, n: int | None = None) -> dict[str, Any]:
        settings = {**self.settings, **({"n": n} if n is not None else {})}
        return {"model": self.model, "messages": [{"role": "user", "content": self.prompt}], **settings}

    @property
    def key(self) -> str:
        """sha256 of (model, messages, settings): the cache key (no URL, no key, no class index)."""
        return hashlib.sha256(json.dumps(self.body(), sort_keys=True).encode()).hexdigest()

    @property
    def n(self) -> int:
        return int(self.settings.get("n", 1))


def requests_for(plan: Plan, class_names: Sequence[str]) -> list[Request]:
    build = PROMPTS[plan.spec["prompts"]]
    settings = dict(plan.spec["settings"])
    return [Request(plan.style, index, name, part, prompt, plan.model, settings)
            for index, name in enumerate(class_names) for part, prompt in enumerate(build(plan, name))]


def postprocess(spec: Mapping[str, Any], answer: str) -> str:
    rules = spec["postprocess"]
    for old, new in rules["replace"]:
        answer = answer.replace(old, new)
    return answer + rules["append"]


# ---------------------------------------------------------------------------------------------------- client


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 60.0  # seconds for a whole try: connect, headers and body (not per socket read)
    retries: int = 6  # further tries after a 429, a 5xx, a timeout or a dropped connection
    backoff: float = 1.0  # seconds before the first retry without Retry-After, doubled each time
    max_backoff: float = 60.0
    max_wait: float = MAX_WAIT  # a longer Retry-After is an error, not a wait
    max_bytes: int = MAX_BYTES  # a larger response (answer or error) is an error, found while reading

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"


def endpoint_from_env(missing: int, cache: Path, env: Mapping[str, str] = os.environ) -> Endpoint:
    url = env.get(ENV_URL)
    if not url:
        raise LLMError(f"{cache}: {missing} LLM answer(s) are not cached and no endpoint is set: set {ENV_URL} (an "
                       f"OpenAI-compatible base URL such as https://api.openai.com/v1), {ENV_KEY} if it needs a key, "
                       f"and {ENV_MODEL} or knowledge.llm.model")
    try:
        timeout = float(env.get(ENV_TIMEOUT) or 60)
    except ValueError:
        raise LLMError(f"{ENV_TIMEOUT} must be a number of seconds, got {env.get(ENV_TIMEOUT)!r}") from None
    if not timeout > 0:
        raise LLMError(f"{ENV_TIMEOUT} must be a positive number of seconds, got {env.get(ENV_TIMEOUT)!r}")
    return Endpoint(url, env.get(ENV_KEY) or None, timeout)


def retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header (seconds or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    if value.strip().isdigit():
        return float(value)
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def redact(text: str, key: str | None) -> str:
    """The text without the key and without any bearer token (a server may echo the request's headers)."""
    if key:
        text = text.replace(key, "***")
    return _BEARER.sub(r"\1***", text)


def _where(endpoint: Endpoint, request: Request) -> str:
    return f"{endpoint.url}: class {request.class_index} ({request.name!r}), llm style {request.style}"


def _error(endpoint: Endpoint, request: Request, message: str) -> LLMError:
    """One line naming the endpoint and the class; the key and bearer tokens redacted."""
    return LLMError(redact(f"{_where(endpoint, request)}: {message}", endpoint.api_key))


def _detail(body: bytes, key: str | None) -> str:
    """The server's error message (OpenAI's {"error": {"message"}}) or the start of its body, redacted."""
    try:
        message = json.loads(body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = body.decode("utf-8", "replace")
    return redact(" ".join(str(message).split()), key)[:200]


def _excerpt(raw: bytes, key: str | None, size: int) -> str:
    return redact(repr(raw[:size + 200]), key)[:size]


def _choices(endpoint: Endpoint, request: Request, raw: bytes) -> list[str]:
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise _error(endpoint, request, f"the answer is not JSON: {_excerpt(raw, endpoint.api_key, 80)}") from None
    try:
        choices = [choice["message"]["content"] or "" for choice in data["choices"]]
    except (KeyError, TypeError):
        raise _error(endpoint, request, f"the answer has no choices[].message.content: "
                                        f"{_excerpt(raw, endpoint.api_key, 120)}") from None
    if not choices or not all(isinstance(c, str) for c in choices):
        raise _error(endpoint, request, f"the answer has no text choices: {_excerpt(raw, endpoint.api_key, 120)}")
    return choices


class _TooLarge(Exception):
    pass


class _Deadline:
    """A whole-request time limit: urllib's timeout bounds each socket read, so a server sending a byte now and then
    never times out; when the time is up this shuts the request's sockets down (which ends a blocked read), and
    `check` between reads raises TimeoutError."""

    def __init__(self, seconds: float):
        self.seconds, self.expired, self.sockets = seconds, False, []
        self.timer = threading.Timer(seconds, self._expire)
        self.timer.daemon = True

    def _expire(self) -> None:
        self.expired = True
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def handler(self, base: type) -> urllib.request.BaseHandler:
        """urllib's HTTP(S) handler whose sockets this deadline records (urllib detaches a response's socket from
        its connection, so it is recorded when it connects)."""
        deadline = self

        def watched(http_class):
            def make(*args, **kwargs):
                connection = http_class(*args, **kwargs)
                connect = connection.connect

                def connect_and_record():
                    connect()
                    deadline.sockets.append(connection.sock)
                    if deadline.expired:
                        deadline._expire()
                connection.connect = connect_and_record
                return connection
            return make

        class Watched(base):
            def do_open(self, http_class, req, **kwargs):
                return super().do_open(watched(http_class), req, **kwargs)

        return Watched()

    def __enter__(self):
        self.timer.start()
        return self

    def __exit__(self, *exc):
        self.timer.cancel()

    def check(self) -> None:
        if self.expired:
            raise TimeoutError(f"no complete answer within {self.seconds:g} s")


def _read(response, limit: int, deadline: _Deadline) -> bytes:
    """The body, read as it comes; more than `limit` bytes (declared or received) raises _TooLarge at once, the
    deadline's end TimeoutError."""
    length = response.headers.get("Content-Length", "")
    if length.isdigit() and int(length) > limit:
        raise _TooLarge(int(length))
    chunks, size, read = [], 0, getattr(response, "read1", response.read)  # read1: what has come, not 64 KiB
    while chunk := read(64 * 1024):
        deadline.check()
        size += len(chunk)
        if size > limit:
            raise _TooLarge(size)
        chunks.append(chunk)
    if length.isdigit() and size < int(length):  # read(amt) does not raise on a cut body, read() would
        raise http.client.IncompleteRead(b"".join(chunks), int(length) - size)
    return b"".join(chunks)


def _exchange(endpoint: Endpoint, post: urllib.request.Request) -> tuple[int, Any, bytes]:
    """One try: (status, headers, body), all within `endpoint.timeout` seconds and `endpoint.max_bytes` bytes."""
    with _Deadline(endpoint.timeout) as deadline:
        opener = urllib.request.build_opener(deadline.handler(urllib.request.HTTPHandler),
                                             deadline.handler(urllib.request.HTTPSHandler))
        try:
            try:
                response = opener.open(post, timeout=endpoint.timeout)
            except urllib.error.HTTPError as err:
                response = err
            with response:
                body = _read(response, endpoint.max_bytes, deadline)
            deadline.check()
            return response.status, response.headers, body
        except (OSError, http.client.HTTPException):
            deadline.check()
            raise


def _wait(endpoint: Endpoint, request: Request, attempt: int, cause: str, after: float | None,
          sleep: Callable[[float], None]) -> None:
    """Sleep before the next try, saying so; a server's Retry-After over `max_wait` is an error instead."""
    if after is not None and after > endpoint.max_wait:
        raise _error(endpoint, request, f"{cause}: the server asks to wait {after:g} s (Retry-After), more than the "
                                        f"{endpoint.max_wait:g} s vlbench waits; try again later")
    seconds = after if after is not None else min(endpoint.backoff * 2 ** attempt, endpoint.max_backoff)
    reason = "as the server asks (Retry-After)" if after is not None else "backoff"
    tqdm.write(redact(f"{endpoint.url}: {cause}; waiting {seconds:g} s {reason} before try {attempt + 2} of "
                      f"{endpoint.retries + 1}", endpoint.api_key), file=sys.stderr)
    sleep(seconds)


def _post(endpoint: Endpoint, request: Request, n: int, sleep: Callable[[float], None]) -> list[str]:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if endpoint.api_key:
        headers["Authorization"] = f"Bearer {endpoint.api_key}"
    data = json.dumps(request.body(n)).encode()
    for attempt in range(endpoint.retries + 1):
        last = attempt == endpoint.retries
        post = urllib.request.Request(endpoint.url, data=data, headers=headers, method="POST")
        try:
            status, response_headers, body = _exchange(endpoint, post)
        except _TooLarge as err:
            raise _error(endpoint, request, f"the response is larger than {endpoint.max_bytes:,} bytes "
                                            f"({err.args[0]:,} or more); vlbench keeps at most that per "
                                            f"request") from None
        except (urllib.error.URLError, http.client.HTTPException, TimeoutError, ConnectionError) as err:
            reason = getattr(err, "reason", err)
            if last:
                raise _error(endpoint, request, f"no answer after {attempt + 1} tries (timeout "
                                                f"{endpoint.timeout:g} s): {reason}") from None
            _wait(endpoint, request, attempt, f"no answer ({reason})", None, sleep)
            continue
        if status < 300:
            return _choices(endpoint, request, body)
        if status != 429 and status < 500:
            hint = HINTS.get(status, "the endpoint refused the request")
            raise _error(endpoint, request, f"HTTP {status} ({hint}): {_detail(body, endpoint.api_key)}")
        if last:
            raise _error(endpoint, request,
                         f"HTTP {status} after {attempt + 1} tries: {_detail(body, endpoint.api_key)}")
        _wait(endpoint, request, attempt, f"HTTP {status}", retry_after(response_headers.get("Retry-After")), sleep)
    raise AssertionError("unreachable")  # pragma: no cover


def complete(endpoint: Endpoint, request: Request, sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """The request's `n` answers; asks again for the rest when a server gives fewer choices than asked."""
    answers: list[str] = []
    while len(answers) < request.n:
        answers += _post(endpoint, request, request.n - len(answers), sleep)
    return answers[:request.n]


# ---------------------------------------------------------------------------------------------------- cache


class AnswerCache:
    """One JSON line per request (sorted by key) in `path`; new answers go to the journal `.<name>.journal` first."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.journal = self.path.with_name(f".{self.path.name}.journal")

    def _read(self, path: Path, torn_ok: bool) -> list[dict[str, Any]]:
        if not path.is_file():
            return []
        lines = path.read_text(encoding="utf-8").split("\n")
        if lines[-1] and torn_ok:  # the line a killed run was writing
            lines = lines[:-1]
        rows = []
        for number, line in enumerate(lines, 1):
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise LLMError(f"{path}: line {number} is not JSON; delete the line (its answers are asked "
                               f"again)") from None
            if not (isinstance(row, dict) and isinstance(row.get("key"), str) and isinstance(row.get("answers"), list)):
                raise LLMError(f"{path}: line {number} lacks 'key' or 'answers'")
            rows.append(row)
        return rows

    def load(self) -> dict[str, dict[str, Any]]:
        return {row["key"]: row for path, torn_ok in ((self.path, False), (self.journal, True))
                for row in self._read(path, torn_ok)}

    def append(self, row: Mapping[str, Any]) -> None:
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        with open(self.journal, "a", encoding="utf-8") as out:
            out.write(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n")
            out.flush()
            os.fsync(out.fileno())

    def commit(self, rows: Mapping[str, Mapping[str, Any]]) -> None:
        """Write every row into the cache at once (atomic), then drop the journal. A cache without answers is one
        empty line, not an empty file: DVC warns "'data/llm/<d>.jsonl' is empty" about an empty output on every
        run (readers skip blank lines)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(self.path) as tmp:
            lines = (json.dumps(rows[key], sort_keys=True, ensure_ascii=False) + "\n" for key in sorted(rows))
            tmp.write_text("".join(lines) or "\n", encoding="utf-8")
        self.journal.unlink(missing_ok=True)

    def ensure(self) -> None:
        """The cache exists (one empty line if nothing was ever asked) and holds the journal's answers."""
        if self.journal.exists() or not self.path.exists() or self.path.stat().st_size == 0:
            self.commit(self.load())


def _row(request: Request, answers: list[str]) -> dict[str, Any]:
    return {"key": request.key, "style": request.style, "class_index": request.class_index, "class": request.name,
            "part": request.part, "model": request.model, "prompt": request.prompt, "settings": dict(request.settings),
            "answers": answers, "time": datetime.now(timezone.utc).isoformat(timespec="seconds")}


def generate(plan: Plan, class_names: Sequence[str], cache: AnswerCache, endpoint: Endpoint | None = None,
             env: Mapping[str, str] = os.environ, progress: bool = True,
             sleep: Callable[[float], None] = time.sleep) -> list[list[str]]:
    """Per class, its texts (every answer of every request, post-processed, in request order); asks the endpoint
    (`endpoint`, else the environment's) only for the requests the cache lacks."""
    requests = requests_for(plan, class_names)
    rows = cache.load()
    missing = list({r.key: r for r in requests if r.key not in rows}.values())
    if missing:
        endpoint = endpoint or endpoint_from_env(len(missing), cache.path, env)
        try:
            for request in tqdm(missing, desc=f"llm {plan.style}", unit="request", disable=not progress):
                rows[request.key] = _row(request, complete(endpoint, request, sleep))
                cache.append(rows[request.key])
        finally:
            cache.commit(rows)
    cache.ensure()
    texts: list[list[str]] = [[] for _ in class_names]
    for request in requests:
        texts[request.class_index] += [postprocess(plan.spec, a) for a in rows[request.key]["answers"]]
    return texts


def cache_record(plan: Plan, cache: AnswerCache) -> dict[str, Any]:
    """What a text set's stamp says about its answers (no path, no URL, no key)."""
    return {"file": f"llm:{plan.style}", "model": plan.model, "settings": plan.spec["settings"],
            "upstream": plan.spec["source"], "cache": cache.path.name}
