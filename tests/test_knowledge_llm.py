"""LLM descriptions for any class list (vlbench.knowledge.llm and the llm_* knowledge variants), against a real
OpenAI-compatible HTTP server on 127.0.0.1 that the tests control (tests/llm_server.py): prompts of the styles, the
client's retries and errors, the answer cache (reruns make no request), resuming after an interruption, and the
variants' text sets scored by the zero-shot analysis."""

from __future__ import annotations

import json
import socket
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.llm_server import answer, serve_llm
from tests.test_knowledge_variants import shapes_meta
from vlbench.analyses import zeroshot
from vlbench.analyses.base import Inputs
from vlbench.datasets.canonical import ClassInfo, DatasetMeta
from vlbench.features import embedding_array, features_schema, write_table
from vlbench.knowledge import demo, llm
from vlbench.knowledge.llm import AnswerCache, Endpoint, LLMError, generate, plan_for, requests_for
from vlbench.knowledge.variants import DEFAULT_VARIANTS, VARIANTS, build_knowledge, knowledge_options
from vlbench.params import ParamsError
from vlbench.wordnet import load_wordnet
from vlbench.texts import write_text_sets

CLASSES = ["apple", "Egyptian cat", "hexagon"]
META = DatasetMeta("mine", "single-label", "accuracy", [ClassInfo(i, n) for i, n in enumerate(CLASSES)], version="v1")
TEMPLATES = ["a photo of a {c}."]
CONTEXTS = [("ship", "A water-borne vessel larger than a boat."), ("storage tank", "A tank for storing liquids."),
            ("harbor", "A sheltered part of a body of water."), ("pier", "A raised platform built over water.")]
ENV = ("VLBENCH_LLM_BASE_URL", "VLBENCH_LLM_MODEL", "VLBENCH_LLM_API_KEY", "VLBENCH_LLM_TIMEOUT")


@pytest.fixture(autouse=True)
def no_endpoint(monkeypatch):
    """No test sees an endpoint from the machine's environment."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def download_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VLBENCH_DOWNLOADS", str(tmp_path / "cache"))
    monkeypatch.delenv("VLBENCH_MIRROR", raising=False)


@pytest.fixture(scope="module")
def wn():
    return load_wordnet()


def cupl_plan(questions="imagenet", model="test-model"):
    return plan_for("cupl", model, llm.llm_options({"questions": questions}))


def endpoint(server, **kwargs) -> Endpoint:
    return Endpoint(server.url, **{"backoff": 0.01, **kwargs})


def record_sleep():
    slept: list[float] = []
    return slept, slept.append


# ---------------------------------------------------------------------------------------------------- prompts


def test_cupl_prompts_are_its_five_imagenet_questions_with_its_article_rule():
    requests = requests_for(cupl_plan(), CLASSES[:2])
    assert [r.prompt for r in requests if r.class_index == 0] == [
        "Describe what a apple looks like", "How can you identify a apple?", "What does a apple look like?",
        "Describe an image from the internet of a apple", "A caption of an image of a apple:"]  # capitals only get "an"
    assert requests[5].prompt == "Describe what an Egyptian cat looks like"
    assert requests[0].body() == {"model": "test-model", "messages": [{"role": "user", "content": requests[0].prompt}],
                                  "temperature": 0.99, "max_tokens": 50, "n": 10, "stop": "."}
    own = requests_for(cupl_plan(["What texture does {article} {c} have? {c}"]), ["Oak {article}"])
    assert [r.prompt for r in own] == ["What texture does an Oak {article} have? Oak {article}"]  # one-pass fill
    assert llm.postprocess(llm.styles()["cupl"], "\n\nA red fruit with a stem") == "A red fruit with a stem."


def test_elevater_prompt_is_header_three_shots_and_query_seeded_per_class_and_repeat():
    plan = plan_for("elevater_gpt3", "m", llm.LLMOptions(), CONTEXTS)
    requests = requests_for(plan, ["snowberg"])
    assert len(requests) == 5 and requests[0].body()["temperature"] == 0.0 and requests[0].n == 1
    assert requests[0].settings["stop"] == ["\n", "<|endoftext|>"]
    prompt = requests[0].prompt
    assert prompt.startswith("Please explain the concept according to the context.\n===\n")
    assert prompt.endswith("===\nQ: snowberg\nA:") and prompt.count("\n\n===\n") == 3
    shots = {f"Q: {q}\nA: {a}\n\n===\n" for q, a in CONTEXTS}
    body = prompt[len("Please explain the concept according to the context.\n===\n"):-len("Q: snowberg\nA:")]
    assert all(part + "\n\n===\n" in shots for part in body.split("\n\n===\n")[:-1])
    assert [r.prompt for r in requests_for(plan, ["snowberg"])] == [r.prompt for r in requests]  # same every run
    assert len({r.key for r in requests}) > 1  # the repeats differ by their drawn shots
    two = requests_for(plan_for("elevater_gpt3", "m", llm.LLMOptions(), CONTEXTS[:2]), ["snowberg"])
    assert two[0].prompt.count("\n\n===\n") == 2  # the toolkit's min(n_shot, pairs)
    with pytest.raises(LLMError, match=r"no \(concept, definition\) pairs .* class 'snowberg'"):
        requests_for(plan_for("elevater_gpt3", "m", llm.LLMOptions()), ["snowberg"])


def test_options_are_checked_and_the_variants_are_off_by_default():
    assert not {"llm_cupl", "llm_elevater_gpt3"} & set(DEFAULT_VARIANTS)
    assert knowledge_options(None).variants == DEFAULT_VARIANTS and set(VARIANTS) - set(DEFAULT_VARIANTS)
    assert knowledge_options({"llm": {"model": "m", "questions": ["{c}?"]}}).llm == llm.LLMOptions("m", ("{c}?",))
    with pytest.raises(ParamsError, match=r"unknown key\(s\) \['temperature'\] under 'knowledge.llm'"):
        knowledge_options({"llm": {"temperature": 1}})
    with pytest.raises(ParamsError, match=r"knowledge.llm.questions 'cars' is not a question list"):
        knowledge_options({"llm": {"questions": "cars"}})
    with pytest.raises(ParamsError, match=r"knowledge.llm.questions must name a list .* got \['no placeholder'\]"):
        knowledge_options({"llm": {"questions": ["no placeholder"]}})


# ---------------------------------------------------------------------------------------------------- client


def test_answers_are_cached_and_a_second_run_makes_no_request(tmp_path):
    cache = AnswerCache(tmp_path / "llm" / "mine.jsonl")
    with serve_llm(key="sk-secret") as server:
        texts = generate(cupl_plan(), CLASSES, cache, endpoint(server, api_key="sk-secret"), progress=False)
        assert len(server.requests) == 15  # 3 classes x 5 questions, 10 answers each
        assert server.headers[0]["Authorization"] == "Bearer sk-secret"
        again = generate(cupl_plan(), CLASSES, cache, endpoint(server, api_key="sk-secret"), progress=False)
        assert len(server.requests) == 15 and again == texts
    assert generate(cupl_plan(), CLASSES, cache, env={}, progress=False) == texts  # no endpoint needed at all
    assert [len(t) for t in texts] == [50, 50, 50]
    assert texts[0][0] == " It is described by answer 0 to 'Describe what a apple looks like'with more."
    rows = [json.loads(line) for line in cache.path.read_text().splitlines()]
    assert len(rows) == 15 and [r["key"] for r in rows] == sorted(r["key"] for r in rows)
    first = next(r for r in rows if r["prompt"] == "Describe what a apple looks like")
    assert first["model"] == "test-model" and first["settings"]["n"] == 10 and first["style"] == "cupl"
    assert first["answers"][3] == answer("Describe what a apple looks like", 3) and first["time"].endswith("+00:00")
    assert "sk-secret" not in cache.path.read_text() and not cache.journal.exists()
    with serve_llm() as server:  # another model is another key: asked again
        generate(cupl_plan(model="other"), CLASSES[:1], cache, endpoint(server), progress=False)
        assert len(server.requests) == 5


def test_429_with_retry_after_5xx_and_a_cut_answer_are_retried(tmp_path):
    slept, sleep = record_sleep()
    with serve_llm() as server:
        server.fail(429, retry_after="7")
        server.fail(500)
        server.fail(503)
        server.truncate()
        texts = generate(cupl_plan(["{c}?"]), ["apple"], AnswerCache(tmp_path / "a.jsonl"), endpoint(server),
                         progress=False, sleep=sleep)
        assert len(server.requests) == 5 and len(texts[0]) == 10
    assert slept == [7.0, 0.02, 0.04, 0.08]  # Retry-After honoured, then exponential backoff from 0.01 s
    assert llm.retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0 and llm.retry_after("soon") is None


def test_a_server_giving_fewer_choices_is_asked_for_the_rest(tmp_path):
    with serve_llm(max_n=4) as server:
        texts = generate(cupl_plan(["{c}?"]), ["apple"], AnswerCache(tmp_path / "a.jsonl"), endpoint(server),
                         progress=False)
        assert [r["n"] for r in server.requests] == [10, 6, 2] and len(texts[0]) == 10


@pytest.mark.parametrize("status, message", [
    (401, r"HTTP 401 \(the endpoint wants a valid key in VLBENCH_LLM_API_KEY\): fault 401"),
    (404, r"HTTP 404 \(check VLBENCH_LLM_BASE_URL .*\): fault 404"),
    (400, r"HTTP 400 \(the endpoint refused the request .*\): fault 400"),
])
def test_a_refusal_is_one_error_naming_endpoint_and_class_without_retry(tmp_path, status, message):
    with serve_llm() as server:
        server.ok()
        server.fail(status)
        with pytest.raises(LLMError, match=rf"{server.url}/chat/completions: class 1 \('Egyptian cat'\), llm style "
                                           rf"cupl: {message}"):
            generate(cupl_plan(["{c}?"]), ["apple", "Egyptian cat"], AnswerCache(tmp_path / "a.jsonl"),
                     endpoint(server), progress=False)
        assert len(server.requests) == 2


def test_a_wrong_key_is_refused_at_once(tmp_path):
    with serve_llm(key="right") as server:
        with pytest.raises(LLMError, match=r"class 0 \('apple'\), llm style cupl: HTTP 401 .*VLBENCH_LLM_API_KEY"):
            generate(cupl_plan(["{c}?"]), ["apple"], AnswerCache(tmp_path / "a.jsonl"),
                     endpoint(server, api_key="wrong"), progress=False)
        assert len(server.requests) == 1


def test_malformed_json_timeouts_and_exhausted_retries_name_the_class(tmp_path):
    cache = AnswerCache(tmp_path / "a.jsonl")
    with serve_llm() as server:
        server.malformed()
        with pytest.raises(LLMError, match=r"class 0 \('apple'\), llm style cupl: the answer is not JSON"):
            generate(cupl_plan(["{c}?"]), ["apple"], cache, endpoint(server), progress=False)
        for _ in range(3):
            server.fail(502)
        with pytest.raises(LLMError, match=r"class 0 \('apple'\), llm style cupl: HTTP 502 after 3 tries: fault 502"):
            generate(cupl_plan(["{c}?"]), ["apple"], cache, endpoint(server, retries=2), progress=False,
                     sleep=lambda seconds: None)
        server.stall(2)
        started = time.monotonic()
        with pytest.raises(LLMError, match=r"class 0 \('apple'\), llm style cupl: no answer after 1 tries \(timeout "
                                           r"0.3 s\)"):
            generate(cupl_plan(["{c}?"]), ["apple"], cache, endpoint(server, timeout=0.3, retries=0), progress=False)
        assert time.monotonic() - started < 1.5
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(LLMError, match=r"no answer after 2 tries"):
        generate(cupl_plan(["{c}?"]), ["apple"], cache, Endpoint(f"http://127.0.0.1:{port}/v1", retries=1, backoff=0),
                 progress=False)


def test_a_long_retry_after_fails_naming_the_wait_and_a_short_one_is_announced(tmp_path, capsys):
    slept, sleep = record_sleep()
    with serve_llm() as server:
        server.fail(429, retry_after="3")
        server.fail(429, retry_after="100000")
        with pytest.raises(LLMError, match=rf"{server.url}/chat/completions: class 0 \('apple'\), llm style cupl: "
                                           r"HTTP 429: the server asks to wait 100000 s \(Retry-After\), more than "
                                           r"the 300 s vlbench waits"):
            generate(cupl_plan(["{c}?"]), ["apple"], AnswerCache(tmp_path / "a.jsonl"), endpoint(server),
                     progress=False, sleep=sleep)
        assert len(server.requests) == 2
    assert slept == [3.0]  # never the 27.8 hours
    assert (f"{server.url}/chat/completions: HTTP 429; waiting 3 s as the server asks (Retry-After) before try 2 of 7"
            in capsys.readouterr().err)


def test_the_timeout_bounds_the_whole_request_not_each_read(tmp_path):
    with serve_llm() as server:
        server.trickle(0.1)  # a byte every 0.1 s: each read is well within 0.5 s, the answer takes minutes
        started = time.monotonic()
        with pytest.raises(LLMError, match=r"class 0 \('apple'\), llm style cupl: no answer after 1 tries \(timeout "
                                           r"0.5 s\): no complete answer within 0.5 s"):
            generate(cupl_plan(["{c}?"]), ["apple"], AnswerCache(tmp_path / "a.jsonl"),
                     endpoint(server, timeout=0.5, retries=0), progress=False)
        assert time.monotonic() - started < 5


def test_an_oversized_answer_is_refused_while_reading(tmp_path):
    cache = AnswerCache(tmp_path / "a.jsonl")
    huge = json.dumps({"choices": [{"message": {"content": "x" * 2_000_000}}]}).encode()
    with serve_llm() as server:
        server.ok()
        server.fail(200, body=huge)
        with pytest.raises(LLMError, match=r"class 1 \('Egyptian cat'\), llm style cupl: the response is larger "
                                           r"than 262,144 bytes"):
            generate(cupl_plan(["{c}?"]), ["apple", "Egyptian cat"], cache, endpoint(server), progress=False)
    assert len(cache.load()) == 1 and cache.path.stat().st_size < 10_000  # nothing of it journalled or cached


def test_the_key_and_bearer_tokens_never_appear_in_a_message(tmp_path, capsys):
    echo = json.dumps({"error": {"message": "bad key; you sent Authorization: Bearer sk-secret-123 and "
                                            "x-api-key sk-secret-123; also Bearer tok-other"}}).encode()
    with serve_llm() as server:
        server.fail(503, body=b"upstream said: Authorization: Bearer sk-secret-123")
        server.fail(401, body=echo)
        with pytest.raises(LLMError) as caught:
            generate(cupl_plan(["{c}?"]), ["apple"], AnswerCache(tmp_path / "a.jsonl"),
                     endpoint(server, api_key="sk-secret-123"), progress=False, sleep=lambda seconds: None)
    message = str(caught.value)
    assert "HTTP 401" in message and "Bearer ***" in message and "x-api-key ***" in message
    assert "sk-secret" not in message and "tok-other" not in message
    assert "sk-secret" not in capsys.readouterr().err
    assert llm.redact("Bearer abc.def, then sk-1", "sk-1") == "Bearer ***, then ***"


def test_a_cache_without_answers_is_one_blank_line_not_an_empty_file(tmp_path):
    cache = AnswerCache(tmp_path / "llm" / "mine.jsonl")
    cache.ensure()
    assert cache.path.read_text() == "\n" and cache.load() == {}
    cache.path.write_text("")  # as an older version left it: DVC warns "is empty" on every run
    cache.ensure()
    assert cache.path.read_text() == "\n"


def test_without_an_endpoint_the_error_names_the_variables(tmp_path, monkeypatch):
    with pytest.raises(LLMError, match=r"a.jsonl: 5 LLM answer\(s\) are not cached and no endpoint is set: set "
                                       r"VLBENCH_LLM_BASE_URL .*VLBENCH_LLM_API_KEY.*VLBENCH_LLM_MODEL"):
        generate(cupl_plan(), ["apple"], AnswerCache(tmp_path / "a.jsonl"), progress=False)
    options = knowledge_options({"variants": ["llm_cupl"]})
    with pytest.raises(LLMError, match=r"need a model name: set knowledge.llm.model .* VLBENCH_LLM_MODEL"):
        build_knowledge("mine", {}, META, TEMPLATES, options, llm_cache=AnswerCache(tmp_path / "a.jsonl"))
    monkeypatch.setenv("VLBENCH_LLM_MODEL", "m")
    with pytest.raises(LLMError, match=r"15 LLM answer\(s\) are not cached .* set VLBENCH_LLM_BASE_URL"):
        build_knowledge("mine", {}, META, TEMPLATES, options, llm_cache=AnswerCache(tmp_path / "a.jsonl"))


def test_an_interrupted_generation_keeps_its_answers_and_resumes(tmp_path):
    cache = AnswerCache(tmp_path / "mine.jsonl")
    plan = cupl_plan()
    requests = requests_for(plan, CLASSES)
    with serve_llm() as server:
        for _ in range(3):  # three answers, then the server refuses: the three are kept
            server.ok()
        server.fail(401)
        with pytest.raises(LLMError, match="HTTP 401"):
            generate(plan, CLASSES, cache, endpoint(server), progress=False)
        assert len(cache.load()) == 3 and not cache.journal.exists()
    # A killed run: two more answers in the journal, the last line torn.
        rows = cache.load()
        for request in requests[3:5]:
            cache.append(llm._row(request, ["x"] * 10))
        with open(cache.journal, "a") as out:
            out.write('{"key": "torn')
        assert len(cache.load()) == 5
        before = len(server.requests)
        texts = generate(plan, CLASSES, cache, endpoint(server), progress=False)
        assert len(server.requests) - before == 10  # only what was neither cached nor journalled
        assert len(cache.load()) == 15 and not cache.journal.exists() and set(rows) < set(cache.load())
        assert texts[0][30:40] == ["x."] * 10  # the journalled answers were used (request 3 is apple's 4th question)
    cache.path.write_text(cache.path.read_text() + "not json\n")
    with pytest.raises(LLMError, match=r"mine.jsonl: line 16 is not JSON"):
        cache.load()


# ---------------------------------------------------------------------------------------------------- variants


def test_the_variants_reach_zero_shot_scoring(tmp_path, monkeypatch, wn):
    monkeypatch.setenv("VLBENCH_LLM_MODEL", "test-model")
    options = knowledge_options({"variants": ["llm_cupl", "llm_elevater_gpt3", "wn30_definition"], "gpt3_items": 2})
    cache = AnswerCache(tmp_path / "llm" / "mine.jsonl")
    with serve_llm() as server:
        monkeypatch.setenv("VLBENCH_LLM_BASE_URL", server.url)
        built = build_knowledge("mine", {}, META, TEMPLATES, options, wn, llm_cache=cache)
        elevater = requests_for(plan_for("elevater_gpt3", "test-model", options.llm,
                                         [(r["name"], r["definition"]) for r in built.wordnet]), CLASSES)
        assert len(elevater) == 15 and len({r.key for r in elevater}) < 15  # 3 shots from 3 pairs: repeats coincide
        assert len(server.requests) == 15 + len({r.key for r in elevater})  # one request per distinct prompt
        shots = server.requests[-1]["messages"][0]["content"].split("\n\n===\n")[:-1]
    assert all(s.split("\nA: ")[1] in {r["definition"] for r in built.wordnet} for s in shots)  # WordNet contexts
    cupl = built.sets["llm_cupl"]
    assert cupl.num_rows == 150 and set(cupl.column("source").to_pylist()) == {"cupl"}
    gpt3 = built.sets["llm_elevater_gpt3"].to_pylist()
    assert len(gpt3) == 3 * 2 and gpt3[0]["text"].startswith("a photo of a apple. ; apple , It is described by")
    stamp = built.stamps["llm_elevater_gpt3"]["knowledge"]
    assert stamp["options"] == {"style": "elevater", "tokenizer": "punkt-untrained", "gpt3_items": 2,
                                "llm_style": "elevater_gpt3"}
    assert stamp["files"][0]["model"] == "test-model" and stamp["files"][1]["context"] == "wordnet_definition"
    assert built.stamps["llm_cupl"]["knowledge"]["coverage"]["cupl"] == {"classes": 3, "covered": 3, "empty": 0,
                                                                         "null": 0, "missing": 0}
    monkeypatch.delenv("VLBENCH_LLM_BASE_URL")  # a rerun builds the same sets from the cache alone
    again = build_knowledge("mine", {}, META, TEMPLATES, options, wn, llm_cache=cache)
    assert all(again.sets[v].equals(built.sets[v]) for v in built.sets)

    inputs = zero_shot_inputs(tmp_path, built)
    result = zeroshot.run(inputs, {"split": "test"}, seed=0)
    variants = result.details["variants"]
    assert list(variants) == ["templates", "llm_cupl", "llm_elevater_gpt3", "wn30_definition"]
    assert variants["llm_cupl"]["texts"] == 150 and variants["llm_cupl"]["metrics"] == {"accuracy": 1.0}
    assert variants["llm_elevater_gpt3"]["texts"] == 6


def test_elevater_contexts_are_the_vocabularys_wiktionary_definitions(tmp_path, monkeypatch, download_cache):
    """With a Wiktionary file (the demo shapes' vocabulary), the in-context pairs are its defined concepts (all 22 of
    the file, as the toolkit samples from the whole file), and the stamp says so."""
    monkeypatch.setenv("VLBENCH_LLM_MODEL", "test-model")
    options = knowledge_options({"variants": ["llm_elevater_gpt3"]})
    with serve_llm() as server:
        monkeypatch.setenv("VLBENCH_LLM_BASE_URL", server.url)
        built = build_knowledge("shapes", {"texts": {"knowledge": "demo-shapes"}}, shapes_meta(), TEMPLATES, options,
                                llm_cache=AnswerCache(tmp_path / "shapes.jsonl"))
        shots = {shot for body in server.requests for shot in body["messages"][0]["content"].split("\n\n===\n")[:-1]}
    concepts = {shot.split("\n")[-2].removeprefix("Q: ") for shot in shots}
    assert len(server.requests) == 12 * 5
    assert {"plane figure", "conic section"} & concepts and concepts <= set(demo.WIKTIONARY)  # beyond the 12 classes
    assert all(shot.endswith(f"A: {demo.WIKTIONARY[c]}") for shot, c in
               ((shot, shot.split("\n")[-2].removeprefix("Q: ")) for shot in shots))
    stamp = built.stamps["llm_elevater_gpt3"]["knowledge"]
    assert stamp["files"][1] == {"context": "wiktionary", "file": "demo-shapes_knowledge.tsv"}
    assert stamp["coverage"]["gpt3"]["covered"] == 12 and built.sets["llm_elevater_gpt3"].num_rows == 12


def text_vectors(texts: list[str], dim: int = 16) -> np.ndarray:
    """A fixed random vector per distinct text (seeded by the text): the features an embed stage would write."""
    return np.stack([np.random.default_rng(list(t.encode())).standard_normal(dim) for t in texts]).astype(np.float32)


def zero_shot_inputs(tmp_path, built) -> Inputs:
    """The knowledge sets as the knowledge stage writes them, text features for them and the prompts (a fixed vector
    per text in place of a model: tests/test_knowledge_pipeline.py embeds an llm set with a real toy model under DVC),
    and one test image per class at its llm_cupl class weight (so llm_cupl scores 1.0 only if its own texts are
    scored)."""
    identity = {"model": "m", "arch": "a", "pretrained": "p", "weights_sha256": "w"}
    texts_dir, knowledge_dir, features = tmp_path / "texts", tmp_path / "knowledge", tmp_path / "features"
    prompts = pa.table({"class_index": [0, 1, 2], "source": ["template"] * 3, "text": CLASSES})
    sets = {"prompts": (texts_dir, "text", prompts)}
    write_text_sets(texts_dir, "mine", {"prompts": prompts})
    write_text_sets(knowledge_dir, "mine", built.sets, built.stamps)
    sets.update({name: (knowledge_dir, "knowledge", table) for name, table in built.sets.items()})
    for name, (folder, kind, table) in sets.items():
        stamp = json.loads(pq.read_schema(folder / f"{name}.parquet").metadata[b"vlbench.text_set"])
        write(features / kind / f"{name}.parquet", table, text_vectors(table.column("text").to_pylist()),
              {**identity, **stamp})
    cupl = built.sets["llm_cupl"]
    vectors = text_vectors(cupl.column("text").to_pylist())
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    owner = np.array(cupl.column("class_index").to_pylist())
    images = np.stack([vectors[owner == c].mean(0) for c in range(3)])
    write(features / "images" / "test.parquet", pa.table({"sample_id": ["p", "q", "r"], "label": [0, 1, 2]}), images,
          {**identity, "dataset": "mine", "dataset_version": "v1"})
    return Inputs(META, identity, features, texts_dir, knowledge_dir)


def write(path, rows: pa.Table, emb: np.ndarray, fingerprint: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_table(path, [rows.append_column("embedding", embedding_array(emb))],
                features_schema(rows.schema, emb.shape[1], fingerprint))
