"""Issue 9 (part 4) regressions: paged admission, multi-token stop strings,
--skip-tokenizer-init, n samples with seeds, batch failure and abort replies."""

from __future__ import annotations

import asyncio
import re
import time

import pytest
from test_scheduler import make_scheduler, request, run_until_idle

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------- 1. page_size > 1


def _six_prompts() -> list[list[int]]:
    return [[100 + 7 * i + k for k in range(5)] for i in range(6)]


@pytest.mark.parametrize("max_new", [0, 6])
def test_paged_pool_queues_instead_of_over_committing(tiny_llama_dir, max_new):
    """8 pages of 4 slots; six 5-token prompts need 12 pages: admit 4, queue 2."""
    outputs = {}
    for fields in ({"page_size": 4, "max_total_tokens": 32}, {}):
        sched, ctx = make_scheduler(str(tiny_llama_dir), **fields)
        try:
            for i, ids in enumerate(_six_prompts()):
                sched.recv_from_tokenizer.send(request(str(i), ids, max_new=max_new))
            got = run_until_idle(sched)  # asserts pool integrity once idle
        finally:
            ctx.restore()
        assert sorted(got) == [str(i) for i in range(6)]
        for msgs in got.values():
            assert msgs[-1][1]["type"] == "length"
        outputs[len(fields)] = {r: sum((ids for ids, _ in m), []) for r, m in got.items()}
    assert outputs[2] == outputs[0]  # the small paged pool changes nothing but timing
    assert all(len(ids) == max_new for ids in outputs[2].values())


# ---------------------------------------------------------------- one Engine


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    import sglang as sgl

    llm = sgl.Engine(
        model_path=str(tiny_llama_dir),
        num_threads=1,
        log_level="warning",
        max_total_tokens=4096,
        context_length=256,
    )
    yield llm
    llm.shutdown()


def wait_idle(engine, timeout_s: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        state = engine.get_server_info()["internal_states"][0]
        if state["num_running_reqs"] == state["num_queued_reqs"] == 0:
            return state
        assert time.monotonic() < deadline, state
        time.sleep(0.05)


# ---------------------------------------------------------------- 2. stop strings

# With a strong bias on the three byte tokens of "中" and a frequency penalty that
# rotates among them, the tiny model writes "中中中..." (3 byte tokens per character).
ZHONG_BIAS = {"temperature": 0.0, "ignore_eos": True, "frequency_penalty": 2.0}
PROMPT = "def add(a, b):"


def completing_token_count(tokenizer, ids: list[int], stop: str) -> int:
    """Tokens up to and including the one that completes the first `stop`."""
    return next(k for k in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:k]))


def check_stop_run(engine, params: dict, stop: str, base: dict) -> None:
    tokenizer = engine.tokenizer_manager.tokenizer
    idx = base["text"].index(stop)
    out = engine.generate(PROMPT, {**params, "stop": [stop]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == base["text"][:idx]
    n = completing_token_count(tokenizer, base["output_ids"], stop)
    assert out["output_ids"] == base["output_ids"][:n]
    chunks = list(engine.generate(PROMPT, {**params, "stop": [stop]}, stream=True))
    assert "".join(c["text"] for c in chunks) == base["text"][:idx]
    assert chunks[-1]["meta_info"]["finish_reason"]["matched"] == stop
    kept = engine.generate(PROMPT, {**params, "stop": [stop], "no_stop_trim": True})
    assert kept["text"] == base["text"][: idx + len(stop)]


def test_multibyte_cjk_stop_string_ends_generation(engine):
    tokenizer = engine.tokenizer_manager.tokenizer
    zhong = tokenizer.encode("中", add_special_tokens=False)
    params = {**ZHONG_BIAS, "max_new_tokens": 30, "logit_bias": {t: 10.0 for t in zhong}}
    base = engine.generate(PROMPT, params)
    run = re.search("[\u4e00-\u9fff]{2,}", base["text"])
    assert run is not None, f"precondition: no CJK run in {base['text']!r}"
    stop = run.group()[:2]
    assert len(tokenizer.encode(stop, add_special_tokens=False)) > len(stop) + 2
    check_stop_run(engine, params, stop, base)
    wait_idle(engine)


def test_multi_token_ascii_stop_string(engine):
    params = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 24}
    base = engine.generate(PROMPT, params)
    tokenizer = engine.tokenizer_manager.tokenizer
    stop = tokenizer.decode(base["output_ids"][6:10]).strip()
    assert len(tokenizer.encode(stop, add_special_tokens=False)) > 1 and stop
    check_stop_run(engine, params, stop, base)


# ---------------------------------------------------------------- 4. n with seed, batch failure


def test_n_samples_with_seed_differ_and_match_seed_plus_k(engine):
    params = {"n": 3, "seed": 11, "temperature": 1.0, "max_new_tokens": 8, "ignore_eos": True}
    outs = engine.generate(PROMPT, params)
    ids = [tuple(o["output_ids"]) for o in outs]
    assert len(set(ids)) == 3, ids
    assert [o["output_ids"] for o in engine.generate(PROMPT, params)] == [list(i) for i in ids]
    single = {**params, "n": 1, "seed": 12}
    assert engine.generate(PROMPT, single)["output_ids"] == list(ids[1])


@pytest.mark.parametrize("use_async", [False, True])
def test_one_failing_prompt_aborts_the_others(engine, use_async):
    from sglang.srt.sampling.param_types import InvalidParamError

    long_prompt = "x " * 400  # longer than context_length=256
    params = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 200}
    prompts, rids = ["def a():", long_prompt], [f"keep-{use_async}", f"bad-{use_async}"]
    with pytest.raises(InvalidParamError, match="context length"):
        if use_async:
            asyncio.run(engine.async_generate(prompts, params, rid=rids))
        else:
            engine.generate(prompts, params, rid=rids)
    # the surviving request was cancelled and aborted, not left running
    assert engine.abort_request(rids[0]) is False
    state = wait_idle(engine, timeout_s=5.0)
    assert state["memory_integrity"] == "ok"


# ---------------------------------------------------------------- 5. abort reply


def test_engine_abort_request_reports_whether_found(engine):
    assert engine.abort_request("no-such-request") is False
    params = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 200, "n": 2}
    chunks = []
    for chunk in engine.generate(PROMPT, params, stream=True, rid="fan"):
        if not chunks:
            assert engine.abort_request("fan") is True  # its samples fan-0, fan-1
        chunks.append(chunk)
    finals = [c for c in chunks if c["meta_info"]["finish_reason"] is not None]
    assert sorted(c["index"] for c in finals) == [0, 1]
    assert all(c["meta_info"]["finish_reason"]["type"] == "abort" for c in finals)
    wait_idle(engine)


# ---------------------------------------------------------------- 3. --skip-tokenizer-init

IDS = [501, 77, 1203, 9, 3300, 42]
GREEDY_IDS = {"temperature": 0.0, "ignore_eos": True, "max_new_tokens": 6}


def test_engine_skip_tokenizer_init_serves_token_ids(tiny_llama_dir, engine):
    import sglang as sgl
    from sglang.srt.sampling.param_types import InvalidParamError

    expected = engine.generate(input_ids=IDS, sampling_params=GREEDY_IDS)["output_ids"]
    with sgl.Engine(
        model_path=str(tiny_llama_dir),
        skip_tokenizer_init=True,
        num_threads=1,
        log_level="warning",
        max_total_tokens=4096,
        context_length=256,
    ) as llm:
        out = llm.generate(input_ids=IDS, sampling_params=GREEDY_IDS)
        assert out["output_ids"] == expected and out["text"] == ""
        assert out["meta_info"]["finish_reason"]["type"] == "length"
        with pytest.raises(InvalidParamError, match="skip-tokenizer-init"):
            llm.generate("text needs a tokenizer", GREEDY_IDS)
        # stop strings are matched on decoded text: refused, not ignored
        with pytest.raises(InvalidParamError, match="stop strings need a tokenizer") as refused:
            llm.generate(input_ids=IDS, sampling_params={**GREEDY_IDS, "stop": " # "})
        assert refused.value.param == "sampling_params.stop"
        # so are token texts in logprobs: there is no tokenizer to decode them
        with pytest.raises(InvalidParamError, match="return_text_in_logprobs needs a tokenizer"):
            llm.generate(input_ids=IDS, sampling_params=GREEDY_IDS, return_logprob=True,
                         return_text_in_logprobs=True)  # fmt: skip


@pytest.fixture(scope="module")
def no_tokenizer_server(tiny_llama_dir, tmp_path_factory):
    from http_server_fixture import start_server

    log_path = tmp_path_factory.mktemp("skip-tok-server") / "server.log"
    srv = start_server(tiny_llama_dir, log_path, "--skip-tokenizer-init", "--context-length", "256")
    yield srv
    srv.stop()


def test_http_server_skip_tokenizer_init_warms_up_and_serves_ids(no_tokenizer_server, engine):
    import requests

    url = no_tokenizer_server.base_url
    assert requests.get(url + "/health", timeout=30).status_code == 200
    assert "warmup failed" not in no_tokenizer_server.log()
    out = requests.post(
        url + "/generate", json={"input_ids": IDS, "sampling_params": GREEDY_IDS}, timeout=60
    ).json()
    expected = engine.generate(input_ids=IDS, sampling_params=GREEDY_IDS)["output_ids"]
    assert out["output_ids"] == expected and out["text"] == ""
    # n samples with a seed: the HTTP path and the Engine agree (seed + k for sample k)
    sampled = {"n": 3, "seed": 5, "temperature": 1.0, "max_new_tokens": 6, "ignore_eos": True}
    http_outs = requests.post(
        url + "/generate", json={"input_ids": IDS, "sampling_params": sampled}, timeout=60
    ).json()
    engine_outs = engine.generate(input_ids=IDS, sampling_params=sampled)
    assert [o["output_ids"] for o in http_outs] == [o["output_ids"] for o in engine_outs]
    # completions logprobs of a token-id prompt: served, with no token texts to decode
    body = {"model": "default", "prompt": IDS, "max_tokens": 3, "logprobs": 1,
            "temperature": 0, "ignore_eos": True}  # fmt: skip
    reply = requests.post(url + "/v1/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    assert len(reply.json()["choices"][0]["logprobs"]["token_logprobs"]) == 3
    # echo has no text to echo: a 400 naming it (it was a 500)
    reply = requests.post(url + "/v1/completions", json={**body, "echo": True}, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "echo", reply.text


def test_http_abort_request_reports_whether_found(no_tokenizer_server):
    import httpx

    url = no_tokenizer_server.base_url
    missing = httpx.post(url + "/abort_request", json={"rid": "nobody"}, timeout=30)
    assert missing.status_code == 200
    assert missing.json() == {"success": False, "rid": "nobody"}
    body = {"input_ids": IDS, "rid": "fan", "sampling_params": {**GREEDY_IDS, "n": 2,
            "max_new_tokens": 240}}  # fmt: skip

    async def run() -> tuple[dict, list]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as http:
            pending = asyncio.create_task(http.post("/generate", json=body))
            for _ in range(200):
                await asyncio.sleep(0.05)
                reply = (await http.post("/abort_request", json={"rid": "fan"})).json()
                if reply["success"]:
                    break
            return reply, (await pending).json()

    reply, outs = asyncio.run(run())
    assert reply == {"success": True, "rid": "fan"}
    assert [o["meta_info"]["finish_reason"]["type"] for o in outs] == ["abort", "abort"]
