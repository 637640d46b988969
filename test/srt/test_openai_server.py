"""End to end: a real server on the tiny Llama, driven with the official openai client."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import openai
import pytest
import requests
from http_server_fixture import start_server
from transformers import AutoTokenizer

pytestmark = pytest.mark.slow

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime number."},
]


@pytest.fixture(scope="module")
def server(tiny_llama_dir, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("openai-server") / "server.log"
    srv = start_server(tiny_llama_dir, log_path, "--enable-metrics", "--served-model-name", "tiny")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    return AutoTokenizer.from_pretrained(tiny_llama_dir)


def chat(client, **kw):
    return client.chat.completions.create(model="tiny", messages=MESSAGES, **kw)


def test_chat_non_stream_and_stream_agree(client):
    full = chat(client, max_tokens=8, temperature=0)
    choice = full.choices[0]
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert full.usage.completion_tokens == 8
    assert full.usage.total_tokens == full.usage.prompt_tokens + 8
    assert full.usage.prompt_tokens_details.cached_tokens >= 0
    stream = chat(client, max_tokens=8, temperature=0, stream=True,
                  stream_options={"include_usage": True})  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert chunks[-1].usage.completion_tokens == 8
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_greedy_chat_equals_generate_on_templated_ids(client, server, tokenizer):
    chat_text = chat(client, max_tokens=12, temperature=0).choices[0].message.content
    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    params = {"max_new_tokens": 12, "temperature": 0}
    native = requests.post(server.base_url + "/generate",
                           json={"input_ids": ids, "sampling_params": params}).json()  # fmt: skip
    assert native["text"] == chat_text
    assert native["meta_info"]["prompt_tokens"] == len(ids)


def test_n3_and_seed_reproducible(client):
    first = chat(client, max_tokens=6, n=3, seed=11, temperature=1.0)
    second = chat(client, max_tokens=6, n=3, seed=11, temperature=1.0)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in second.choices]
    assert len(set(texts)) > 1
    assert first.usage.completion_tokens == 18


def test_stop_string(client):
    text = chat(client, max_tokens=16, temperature=0).choices[0].message.content
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), "greedy text too short to pick a stop string"
    stopped = chat(client, max_tokens=16, temperature=0, stop=[stop])
    choice = stopped.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content == text[: text.index(stop)]


def test_chat_logprobs(client):
    reply = chat(client, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == 4
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert item.logprob == pytest.approx(max(t.logprob for t in item.top_logprobs), abs=1e-4)


def test_streamed_logprobs_grow_as_prefixes_of_the_final_ones(server, tokenizer):
    """Each chunk of a native stream carries the logprob lists so far (kept, not rebuilt,
    between chunks): every chunk's lists are prefixes of the last one's, which equal the
    non-streamed answer's; each entry's text is its token's."""
    body = {"text": "def add(a, b):", "return_logprob": True, "top_logprobs_num": 3,
            "token_ids_logprob": [5, 9], "return_text_in_logprobs": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}}  # fmt: skip
    plain = requests.post(server.base_url + "/generate", json=body, timeout=60).json()["meta_info"]
    with requests.post(server.base_url + "/generate", json={**body, "stream": True},
                       stream=True, timeout=60) as r:  # fmt: skip
        metas = [json.loads(line[6:])["meta_info"] for line in r.iter_lines()
                 if line.startswith(b"data: {")]  # fmt: skip
    keys = ["output_token_logprobs", "output_top_logprobs", "input_token_logprobs",
            "output_token_ids_logprobs"]  # fmt: skip
    final = metas[-1]
    assert len(metas) > 1 and len(final["output_token_logprobs"]) == 24
    for meta in metas:
        for key in keys:
            assert meta[key] == final[key][: len(meta[key])], key
    for key in keys:
        got, want = _entries(final[key]), _entries(plain[key])
        assert [e[1:] for e in got] == [e[1:] for e in want], key
        assert [e[0] for e in got] == pytest.approx([e[0] for e in want], abs=1e-4, nan_ok=True)
    for _logprob, token_id, text in final["output_token_logprobs"]:
        assert text == tokenizer.decode([token_id])


def test_generate_token_ids_logprob_batch_and_errors(server):
    """/generate's token_ids_logprob: one list per prompt of a batch; the asked id's
    logprob is its top-1 entry's when greedy picks it. Bad values are 400s naming it."""
    url = server.base_url + "/generate"
    params = {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}
    plain = requests.post(url, json={"text": ["a b", "c d"], "sampling_params": params},
                          timeout=60).json()  # fmt: skip
    chosen = [o["output_ids"] for o in plain]
    body = {"text": ["a b", "c d"], "sampling_params": params, "return_logprob": True,
            "top_logprobs_num": 1, "token_ids_logprob": [[chosen[0][0]], [chosen[1][0], 3]]}  # fmt: skip
    outs = requests.post(url, json=body, timeout=60).json()
    for out, first in zip(outs, chosen):
        meta = out["meta_info"]
        assert out["output_ids"] == first
        asked = meta["output_token_ids_logprobs"][0]
        assert asked[0][1] == first[0]
        assert asked[0][0] == pytest.approx(meta["output_top_logprobs"][0][0][0], abs=1e-5)
    assert [len(e) for e in outs[1]["meta_info"]["output_token_ids_logprobs"]] == [2, 2, 2]
    for bad, message in [
        ({"token_ids_logprob": [[1]]}, "got 1 entries for 2 prompts"),
        ({"token_ids_logprob": [8192]}, "outside the vocabulary"),
        ({"token_ids_logprob": [1], "return_logprob": False}, "with return_logprob"),
        ({"token_ids_logprob": ["x"]}, "token_ids_logprob"),
    ]:
        r = requests.post(url, json={**body, **bad}, timeout=60)
        assert r.status_code == 400, (bad, r.text)
        error = r.json()["error"]
        assert message in error["message"] and "token_ids_logprob" in (error["param"] or ""), error


def _entries(items: list) -> list:
    """A logprob list's (logprob, id, text) entries, top lists flattened; None -> nan."""
    flat = []
    for item in items:
        for entry in item if item and isinstance(item[0], list) else [item]:
            flat.append([float("nan") if entry[0] is None else entry[0], *entry[1:]])
    return flat


def test_completions_prompts_and_echo(client, tokenizer):
    ids = tokenizer.encode("def add(a, b):\n    return", add_special_tokens=False)
    batch = client.completions.create(model="tiny", prompt=["x = 1", "y = 2"], max_tokens=3,
                                      temperature=0)  # fmt: skip
    assert len(batch.choices) == 2 and batch.usage.completion_tokens == 6
    by_ids = client.completions.create(model="tiny", prompt=[ids, ids[:3]], max_tokens=2)
    assert [c.index for c in by_ids.choices] == [0, 1]
    echoed = client.completions.create(model="tiny", prompt=ids, max_tokens=2, echo=True,
                                       logprobs=1, temperature=0)  # fmt: skip
    logprobs = echoed.choices[0].logprobs
    assert len(logprobs.token_logprobs) == len(ids) + 2 and logprobs.token_logprobs[0] is None
    assert echoed.choices[0].text.startswith(tokenizer.decode(ids))


def test_loglikelihood_shape_max_tokens_zero(client, tokenizer):
    """lm-evaluation-harness: score the prompt, generate nothing."""
    ids = tokenizer.encode("def add(a, b):\n    return", add_special_tokens=False)
    scored = client.completions.create(model="tiny", prompt=ids, max_tokens=0, echo=True,
                                       logprobs=1, temperature=0)  # fmt: skip
    logprobs = scored.choices[0].logprobs
    assert len(logprobs.token_logprobs) == len(ids)
    assert logprobs.token_logprobs[0] is None
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert scored.usage.completion_tokens == 0


def test_completion_stream_with_logprobs(client):
    stream = client.completions.create(model="tiny", prompt="import os", max_tokens=5,
                                       stream=True, logprobs=2, temperature=0)  # fmt: skip
    chunks = [c for c in stream if c.choices]
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert len(tokens) == 5
    assert chunks[-1].choices[0].finish_reason == "length"


def test_completion_default_max_tokens_is_cut_to_the_room_left(client, server):
    """OpenAI's default 16 is the route's, not the client's: a prompt 5 tokens short of
    the context gets those 5 (a 400 blamed a max_tokens the client never sent)."""
    context = requests.get(server.base_url + "/v1/models", timeout=30).json()["data"][0]["max_model_len"]
    out = client.completions.create(model="tiny", prompt=[7] * (context - 5), temperature=0,
                                    extra_body={"ignore_eos": True})  # fmt: skip
    assert out.usage.completion_tokens == 5 and out.choices[0].finish_reason == "length"


def test_bad_requests_answered_and_server_keeps_serving(client, server):
    with pytest.raises(openai.BadRequestError):
        chat(client, max_tokens=2, temperature=-1)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=MESSAGES, max_tokens=2)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="word " * 5000, max_tokens=2)
    assert info.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, max_tokens=2, extra_body={"regex": "(unclosed"})
    assert info.value.body["param"] == "regex" and "invalid regex" in info.value.body["message"]
    malformed = requests.post(server.base_url + "/v1/chat/completions", data=b"{oops")
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "invalid_json"
    assert chat(client, max_tokens=1).choices[0].finish_reason == "length"


def test_64_concurrent_streams(server, client):
    prompts = [f"Count to {k}:" for k in range(4)]
    expected = [
        client.completions.create(model="tiny", prompt=p, max_tokens=6, temperature=0)
        .choices[0].text
        for p in prompts
    ]  # fmt: skip

    async def one(aclient: openai.AsyncOpenAI, k: int) -> str:
        stream = await aclient.completions.create(model="tiny", prompt=prompts[k % 4],
                                                  max_tokens=6, temperature=0, stream=True)  # fmt: skip
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def run() -> list[str]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(limits=limits, timeout=300) as http:
            aclient = openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key="none",
                                         http_client=http, max_retries=0)  # fmt: skip
            return await asyncio.gather(*(one(aclient, k) for k in range(64)))

    outputs = asyncio.run(run())
    assert outputs == [expected[k % 4] for k in range(64)]


def _running(server) -> int:
    states = requests.get(server.base_url + "/server_info").json()["internal_states"]
    return sum(s["num_running_reqs"] + s["num_queued_reqs"] for s in states)


def test_disconnect_mid_stream_frees_request(server):
    body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 3000,
            "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        for _ in range(3):
            next(lines)
        assert _running(server) == 1
    deadline = time.time() + 20
    while _running(server) and time.time() < deadline:
        time.sleep(0.2)
    assert _running(server) == 0
    state = requests.get(server.base_url + "/server_info").json()["internal_states"][0]
    assert state["num_used_tokens"] == 0  # everything is free or evictable cache
    assert requests.post(server.base_url + "/flush_cache").status_code == 200
    state = requests.get(server.base_url + "/server_info").json()["internal_states"][0]
    assert state["available_kv_tokens"] == state["max_total_num_tokens"]


def test_embeddings_on_a_generation_server_are_400(client):
    with pytest.raises(openai.BadRequestError, match="--is-embedding"):
        client.embeddings.create(model="tiny", input="x")


def test_models_health_info_metrics(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    assert requests.get(server.base_url + "/health_generate").status_code == 200
    info = requests.get(server.base_url + "/get_model_info").json()
    assert info["served_model_name"] == "tiny" and info["is_generation"] is True
    metrics = requests.get(server.base_url + "/metrics").text
    for name in ("num_requests_total", "generation_tokens_total", "prompt_tokens_total",
                 "time_to_first_token_seconds_count", "e2e_request_latency_seconds_count",
                 "num_running_reqs", "token_usage", "cache_hit_rate"):  # fmt: skip
        assert f"sglang:{name}" in metrics
    # the runtime's meta_info carries queue_time, so the histogram is filled
    queued = re.search(r"^sglang:queue_time_seconds_count(?:\{[^}]*\})? (\S+)$", metrics, re.M)
    assert queued is not None and float(queued.group(1)) > 0


def _wait_idle(server, timeout_s: float = 20) -> int:
    deadline = time.time() + timeout_s
    while _running(server) and time.time() < deadline:
        time.sleep(0.2)
    return _running(server)


def test_disconnect_while_waiting_non_stream_frees_request(server):
    body = {"model": "tiny", "prompt": "Once", "max_tokens": 3000, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base_url + "/v1/completions", json=body, timeout=2)
    assert _wait_idle(server) == 0


def test_abort_request_finishes_with_abort(server):
    body = {"text": "Once", "rid": "to-abort",
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}  # fmt: skip

    async def run() -> dict:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
            pending = asyncio.create_task(http.post("/generate", json=body))
            while _running(server) == 0:
                await asyncio.sleep(0.1)
            await http.post("/abort_request", json={"rid": "to-abort"})
            return (await pending).json()

    out = asyncio.run(run())
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert _wait_idle(server) == 0


def test_greedy_chat_equals_engine_generate(client, tiny_llama_dir, tokenizer):
    import sglang as sgl

    chat_text = chat(client, max_tokens=12, temperature=0).choices[0].message.content
    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    params = {"max_new_tokens": 12, "temperature": 0}
    with sgl.Engine(model_path=str(tiny_llama_dir), max_total_tokens=4096, num_threads=1,
                    log_level="warning") as engine:  # fmt: skip
        assert engine.generate(prompt, params)["text"] == chat_text


def test_tokenize_counts_what_a_completion_is_charged(server, client, tokenizer):
    text = "The quick brown fox jumps over the lazy dog."
    url = server.base_url
    got = requests.post(f"{url}/v1/tokenize", json={"model": "tiny", "prompt": text}).json()
    assert got["tokens"] == tokenizer.encode(text) and got["max_model_len"] > 0
    usage = client.completions.create(model="tiny", prompt=text, max_tokens=1).usage
    assert got["count"] == usage.prompt_tokens
    bare = requests.post(f"{url}/tokenize", json={"prompt": [text], "add_special_tokens": False})
    assert bare.json()["tokens"] == [tokenizer.encode(text, add_special_tokens=False)]
    ids = got["tokens"] + [tokenizer.eos_token_id]  # a special token: skipped by default
    default = requests.post(f"{url}/v1/detokenize", json={"tokens": ids}).json()["text"]
    kept = requests.post(f"{url}/detokenize", json={"tokens": [ids], "skip_special_tokens": False})
    assert default == text == tokenizer.decode(ids, skip_special_tokens=True)
    assert kept.json()["text"] == [text + tokenizer.eos_token]
