"""One live server against what users and bad luck throw at it (issue 9).

Malformed requests get a 400 naming the field and the server keeps serving;
an injected fault in the forward or the detokenizer fails only the request it
hits; a queue-full burst is refused with 429 + Retry-After, never frozen; and
after all of it the KV pool is intact.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time

import fuzz_bodies
import httpx
import hypothesis
import pytest
import requests
from http_server_fixture import start_server

from sglang.test.pool_checks import idle_pool_problems

pytestmark = pytest.mark.slow

FORWARD_MARKER = "poison-forward"
DETOK_MARKER = "poison-detok"
MAX_QUEUED = 128
HEALTH_TIMEOUT_S = 5.0  # SGLANG_HEALTH_TIMEOUT's default: /health answers within it
GREEDY = {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True}


# Renders earlier tool calls and the tools, so hostile ones reach the template.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}"
    "{% if m.tool_calls %}{{ m.tool_calls | tojson }}{% endif %}\n{% endfor %}"
    "{% if tools %}{{ tools | tojson }}{% endif %}{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("robust-server")
    template = workdir / "template.jinja"
    template.write_text(CHAT_TEMPLATE)
    fault = f"forward:{FORWARD_MARKER},detokenize:{DETOK_MARKER}"
    srv = start_server(
        tiny_llama_dir,
        workdir / "server.log",
        "--max-queued-requests", str(MAX_QUEUED),
        "--max-running-requests", "64",
        "--chat-template", str(template),
        env={"SGLANG_FAULT_INJECT": fault},
    )  # fmt: skip
    yield srv
    srv.stop()


def post(server, path: str, body, **kw) -> requests.Response:
    return requests.post(server.base_url + path, json=body, timeout=60, **kw)


def assert_pool_intact(server, timeout_s: float = 20.0) -> None:
    """Idle, nothing leaked, integrity check ok."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = requests.get(server.base_url + "/server_info", timeout=30).json()
        state = state["internal_states"][0]
        idle = state["num_running_reqs"] == 0 and state["num_queued_reqs"] == 0
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not idle_pool_problems(state), (idle_pool_problems(state), state)


def assert_healthy(server) -> None:
    assert requests.get(server.base_url + "/health", timeout=30).status_code == 200
    out = post(server, "/generate", {"text": "def f(", "sampling_params": GREEDY})
    assert out.status_code == 200 and len(out.json()["output_ids"]) == 8


KILLERS = [
    # Each of these took the whole server down before issue 9.
    ({"sampling_params": {"max_new_tokens": 4, "seed": "x"}}, "sampling_params.seed"),
    ({"sampling_params": {"max_new_tokens": 4, "seed": 1.5}}, "sampling_params.seed"),
    ({"sampling_params": {"max_new_tokens": 4, "stop": [1]}}, "sampling_params.stop"),
    (
        {"sampling_params": {"max_new_tokens": 4, "min_new_tokens": 2, "stop_token_ids": [1.5]}},
        "sampling_params.stop_token_ids.0",
    ),
    (
        {"sampling_params": {"max_new_tokens": 4, "skip_special_tokens": "no"}},
        "sampling_params.skip_special_tokens",
    ),
    ({"return_logprob": True, "top_logprobs_num": 100_000}, "top_logprobs_num"),
    ({"sampling_params": {"max_new_tokens": 4, "stop_token_ids": [10**9]}}, "stop_token_ids"),
    ({"sampling_params": {"max_new_tokens": 10**9}}, "max_new_tokens"),
]


@pytest.mark.parametrize("extra, param", KILLERS)
def test_malformed_native_requests_are_400_and_server_survives(server, extra, param):
    response = post(server, "/generate", {"text": "def f(", **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert param in (error["param"] or ""), error
    assert_healthy(server)


DEEP_JSON = "[" * 100_000 + "]" * 100_000  # past Python's recursion limit
NESTED_SCHEMA = '{"type":"array","items":' * 950 + "{}" + "}" * 950  # parses; 46 s to compile
HI = [{"role": "user", "content": "Hi"}]


def _earlier_call(arguments: str) -> list[dict]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return [*HI, {"role": "assistant", "content": None, "tool_calls": [call]}]


HOSTILE = [
    # (route, body, expected status, the error's param): each was a 500 or a stall.
    ("/generate", {"sampling_params": {"max_new_tokens": 2, "json_schema": DEEP_JSON}},
     400, "sampling_params.json_schema"),
    ("/generate", {"sampling_params": {"max_new_tokens": 2, "json_schema": NESTED_SCHEMA}},
     400, "sampling_params.json_schema"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 2,
                              "chat_template_kwargs": {"messages": 5}}, 400, "chat_template_kwargs"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 2,
                              "chat_template_kwargs": {"tokenize": True}}, 400, "chat_template_kwargs"),
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 2,
                              "chat_template_kwargs": {"documents": "x"}}, 400, "messages"),
    ("/v1/chat/completions", {"messages": _earlier_call("[" * 1500 + "]" * 1500), "max_tokens": 2},
     200, None),
    ("/v1/chat/completions", {"messages": _earlier_call('{"a": 1' + "0" * 5000 + "}"),
                              "max_tokens": 2}, 200, None),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "top_k": 2**63}, 200, None),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "logit_bias": {"--5": 1}},
     400, "logit_bias"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "logit_bias": {"\uff15": 1}},
     400, "logit_bias"),
]  # fmt: skip


@pytest.mark.parametrize("path, extra, status, param", HOSTILE)
def test_hostile_requests_are_served_or_400_never_500(server, path, extra, status, param):
    body = {"model": "default", **extra} if path.startswith("/v1") else {"text": "Hi", **extra}
    begin = time.monotonic()
    response = post(server, path, body)
    assert response.status_code == status, response.text
    assert time.monotonic() - begin < 10  # refused before any grammar compile
    if status == 400:
        assert response.json()["error"]["param"] == param, response.json()
    assert "unhandled error" not in server.log()


def test_top_logprobs_under_a_grammar_are_json_numbers(server):
    """Tokens a grammar forbids have logprob -inf; JSON has none: they read -9999.0."""
    native = post(server, "/generate", {"text": "Hi", "return_logprob": True, "top_logprobs_num": 3,
                                        "sampling_params": {"max_new_tokens": 2, "regex": "a"}})  # fmt: skip
    assert native.status_code == 200, native.text
    tops = native.json()["meta_info"]["output_top_logprobs"]
    assert -9999.0 in [entry[0] for entry in tops[0]]
    body = {"model": "default", "prompt": "Hi", "max_tokens": 2, "regex": "a", "logprobs": 3,
            "stream": True}  # fmt: skip
    with requests.post(server.base_url + "/v1/completions", json=body, stream=True) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line[6:] not in (b"", b"[DONE]")]
    values = [v for c in chunks for top in c["choices"][0]["logprobs"]["top_logprobs"]
              for v in top.values()]  # fmt: skip
    assert values and all(isinstance(v, float) for v in values) and -9999.0 in values


def test_a_refused_duplicate_rid_leaves_the_running_request_alone(server):
    body = {"text": "Hi", "rid": "held-rid", "stream": True,
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}  # fmt: skip
    # the tiny model decodes ~5,000 tokens/s: 3,000 keep it running past the refusals
    with requests.post(server.base_url + "/generate", json=body, stream=True, timeout=60) as first:
        lines = first.iter_lines()
        next(line for line in lines if line)  # it runs
        for path, dup in [("/generate", {"text": "Yo", "rid": "held-rid"}),
                          ("/v1/completions", {"model": "default", "prompt": "Yo", "rid": "held-rid"})]:  # fmt: skip
            refused = post(server, path, {**dup, "max_tokens": 2} if path.startswith("/v1") else dup)
            assert refused.status_code == 400 and "duplicate" in refused.text
        last = [line for line in lines if line and line != b"data: [DONE]"][-1]
    meta = json.loads(last[6:])["meta_info"]
    assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 3000


def test_a_retry_under_a_dropped_requests_rid_gets_only_its_own_output(server):
    # A client drops a stream and at once retries under the same rid: the dropped
    # request's last outputs and its abort must not answer the retry. The retry is
    # refused (400, the rid is held while the abort completes) or served its own tokens.
    greedy = {"max_new_tokens": 12, "temperature": 0.0}
    own = post(server, "/generate", {"text": "Retry", "sampling_params": greedy}).json()
    for trial in range(12):
        rid = f"dropped-{trial}"
        body = {"text": "Hi", "rid": rid, "stream": True,
                "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}  # fmt: skip
        with requests.post(server.base_url + "/generate", json=body, stream=True, timeout=60) as r:
            lines = (line for line in r.iter_lines() if line)
            for _ in range(1 + trial % 4):
                next(lines)
        for _attempt in range(50):
            retry = post(server, "/generate", {"text": "Retry", "rid": rid, "sampling_params": greedy})
            if retry.status_code != 400:
                break
            assert "still being aborted" in retry.json()["error"]["message"], retry.text
        assert retry.status_code == 200, retry.text
        out = retry.json()
        assert out["meta_info"]["finish_reason"]["type"] == "length", out["meta_info"]
        assert out["output_ids"] == own["output_ids"]
    assert_pool_intact(server)


def test_a_client_gone_mid_body_is_no_server_error(server):
    port = int(server.base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"text\": ")  # fmt: skip
    assert requests.get(server.base_url + "/v1/models/default", timeout=30).status_code == 200
    assert "ERROR" not in server.log()
    assert_healthy(server)


def test_out_of_vocab_and_empty_prompts_are_400(server):
    bad_ids = post(server, "/generate", {"input_ids": [1, 10**7], "sampling_params": GREEDY})
    assert bad_ids.status_code == 400 and bad_ids.json()["error"]["param"] == "input_ids"
    empty = post(server, "/generate", {"text": "", "sampling_params": GREEDY})
    assert empty.status_code == 400 and "empty" in empty.json()["error"]["message"]
    chat = post(server, "/v1/chat/completions", {"model": "default", "messages": []})
    assert chat.status_code == 400
    long_prompt = post(server, "/v1/completions", {"model": "default", "prompt": [5] * 5000})
    assert long_prompt.status_code == 400
    assert "context length" in long_prompt.json()["error"]["message"]


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/generate", {"text": ["x"] * 193, "sampling_params": GREEDY}, "text"),
        ("/generate", {"input_ids": [[5]] * 97, "sampling_params": {**GREEDY, "n": 2}}, "input_ids"),
        ("/generate", {"text": ["x", "y"], "sampling_params": {**GREEDY, "n": 100}}, "text"),
        ("/v1/completions", {"model": "default", "prompt": ["x"] * 193, "max_tokens": 2}, "prompt"),
        ("/v1/completions", {"model": "default", "prompt": ["x", "y"], "n": 100, "max_tokens": 2},
         "prompt"),
    ],
)  # fmt: skip
def test_a_request_larger_than_slots_and_queue_is_400_not_429(server, path, body, param):
    """More generations than 64 running slots + 128 queued hold at once: no retry can fit
    it. A prompt list was a 429 with Retry-After on every try (a loop for a retrying
    client); now a 400 naming the field, idle or not."""
    response = post(server, path, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and "more than the server holds" in error["message"]


async def _generate_all(server, bodies: list[dict]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120, limits=limits) as client:
        return await asyncio.gather(*(client.post("/generate", json=b) for b in bodies))


@pytest.mark.parametrize("marker", [FORWARD_MARKER, DETOK_MARKER])
def test_a_fault_fails_only_its_request(server, marker):
    """64 concurrent requests, one of which makes the forward (or the detokenizer)
    raise: it gets a 500 with the error, the 63 others get exactly the tokens they
    get alone, the pool is intact, and the server keeps serving."""
    prompts = [f"x = {i} + " for i in range(64)]
    alone = [post(server, "/generate", {"text": p, "sampling_params": GREEDY}) for p in prompts]
    expected = [r.json()["output_ids"] for r in alone]
    bodies = [
        {"text": p, "sampling_params": GREEDY, "rid": f"{marker}-{i}" if i == 17 else f"ok-{i}"}
        for i, p in enumerate(prompts)
    ]
    responses = asyncio.run(_generate_all(server, bodies))
    for i, response in enumerate(responses):
        if i == 17:
            assert response.status_code == 500, response.text
            assert "injected" in response.json()["error"]["message"]
        else:
            assert response.status_code == 200, response.text
            assert response.json()["output_ids"] == expected[i], i
    assert_pool_intact(server)
    assert_healthy(server)


def test_burst_is_served_or_refused_never_frozen(server):
    """2,000 requests at once: each is answered 200 or 429 (with Retry-After), /health
    answers meanwhile, and the pool is intact after."""
    bodies = [
        {
            "text": f"burst {i}",
            "sampling_params": {"max_new_tokens": 2, "temperature": 0.0},
            "stream": i % 2 == 1,  # a refused stream is a plain 429 too, not an SSE body
        }
        for i in range(2000)
    ]

    probe_s: list[float] = []
    probe_codes: list[int] = []
    done = threading.Event()

    def probe() -> None:  # its own thread and connection: not queued behind the burst
        while not done.is_set():
            t0 = time.monotonic()
            probe_codes.append(requests.get(server.base_url + "/health", timeout=60).status_code)
            probe_s.append(time.monotonic() - t0)
            done.wait(0.5)

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        responses = asyncio.run(_generate_all(server, bodies))
    finally:
        done.set()
        prober.join()
    codes = [r.status_code for r in responses]
    assert set(codes) <= {200, 429}, sorted(set(codes))
    refused = [r for r in responses if r.status_code == 429]
    assert refused and codes.count(200) >= MAX_QUEUED
    assert refused[0].headers["Retry-After"] == "1"
    assert refused[0].json()["error"]["type"] == "rate_limit_error"
    refused_streams = [r for i, r in enumerate(responses) if r.status_code == 429 and i % 2]
    assert refused_streams and refused_streams[0].json()["error"]["code"] == "server_overloaded"
    served_streams = [r for i, r in enumerate(responses) if r.status_code == 200 and i % 2]
    assert served_streams and all(r.text.endswith("data: [DONE]\n\n") for r in served_streams)
    assert probe_codes and set(probe_codes) == {200}
    assert max(probe_s) < HEALTH_TIMEOUT_S, probe_s
    assert_pool_intact(server)
    assert_healthy(server)


# CI runs a fixed sample; FUZZ_EXAMPLES=2000 FUZZ_DERANDOMIZE=0 explores further.
FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "150"))
FUZZ_DERANDOMIZE = os.environ.get("FUZZ_DERANDOMIZE", "1") == "1"
FUZZ_ROUTES = {
    "/generate": fuzz_bodies.generate_bodies(),
    "/v1/completions": fuzz_bodies.completion_bodies(),
    "/v1/chat/completions": fuzz_bodies.chat_bodies(),
}


@pytest.mark.parametrize("path", list(FUZZ_ROUTES))
def test_fuzzed_bodies_get_2xx_or_4xx(server, path):
    """Hypothesis-generated bodies (wrong types, out-of-range numbers, unicode, huge
    lists, missing and unknown fields): every answer is 2xx or 4xx, never a 5xx or a
    dropped connection; the server stays healthy and the pool intact."""
    seen: dict[int, int] = {}

    @hypothesis.settings(
        max_examples=FUZZ_EXAMPLES, deadline=None, database=None, derandomize=FUZZ_DERANDOMIZE,
        suppress_health_check=list(hypothesis.HealthCheck),
    )  # fmt: skip
    @hypothesis.given(body=FUZZ_ROUTES[path])
    def check(body: dict) -> None:
        raw = json.dumps(body).encode()  # NaN / Infinity go out as JSON can't say them
        response = requests.post(server.base_url + path, data=raw, timeout=60,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        assert response.status_code < 500, (body, response.text)
        if response.status_code >= 400:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}

    check()
    assert any(code < 300 for code in seen) and any(code >= 400 for code in seen), seen
    assert_pool_intact(server)
    assert_healthy(server)


def test_huge_text_prompts_are_refused_without_stalling(server):
    """A 5 MB text is refused before tokenizing (it cannot fit the context); a 100 KB
    one is tokenized off the event loop and refused for its token count."""
    huge = post(server, "/generate", {"text": "x" * 5_000_000, "sampling_params": GREEDY})
    assert huge.status_code == 400 and huge.json()["error"]["param"] == "text"
    assert huge.json()["error"]["code"] == "context_length_exceeded"
    assert "characters" in huge.json()["error"]["message"]
    long = post(server, "/generate", {"text": "word " * 20_000, "sampling_params": GREEDY})
    assert long.status_code == 400 and long.json()["error"]["code"] == "context_length_exceeded"
    assert "tokens" in long.json()["error"]["message"]
    chat = post(server, "/v1/chat/completions",
                {"model": "default", "messages": [{"role": "user", "content": "y" * 5_000_000}]})  # fmt: skip
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
    assert chat.json()["error"]["code"] == "context_length_exceeded"
    assert_healthy(server)
