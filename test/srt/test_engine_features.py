"""Engine API features on one Engine: streaming, n, stops, logprobs, abort, limits, control."""

from __future__ import annotations

import asyncio
import atexit
import gc
import os
import signal
import threading
import time

import pytest
import torch

from sglang.srt.managers.request_errors import ServerOverloadedError
from sglang.test.pool_checks import idle_pool_problems

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0.0, "ignore_eos": True}
PROMPT = "def add(a, b):\n    return"


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    import sglang as sgl

    llm = sgl.Engine(
        model_path=str(tiny_llama_dir),
        num_threads=1,
        log_level="warning",
        max_total_tokens=4096,
        max_running_requests=4,
        max_queued_requests=6,
        context_length=256,
    )
    yield llm
    llm.shutdown()


@pytest.fixture(autouse=True)
def no_leaks(engine):
    yield
    deadline = time.monotonic() + 10
    while True:
        state = engine.get_server_info()["internal_states"][0]
        if state["num_running_reqs"] == state["num_queued_reqs"] == 0:
            break
        assert time.monotonic() < deadline, state
        time.sleep(0.1)
    assert not idle_pool_problems(state), (idle_pool_problems(state), state)


def greedy(num_tokens: int, **extra) -> dict:
    return {**GREEDY, "max_new_tokens": num_tokens, **extra}


def test_single_and_batch_shapes(engine):
    one = engine.generate(PROMPT, greedy(5))
    assert set(one) == {"text", "output_ids", "meta_info"}
    assert len(one["output_ids"]) == 5 and one["meta_info"]["completion_tokens"] == 5
    assert 0.0 <= one["meta_info"]["queue_time"] < 60.0  # arrival -> first prefill, seconds
    # SGLang's e2e_latency: arrival -> finish, seconds (set once the request finished)
    assert one["meta_info"]["queue_time"] < one["meta_info"]["e2e_latency"] < 60.0
    batch = engine.generate([PROMPT, "import os"], [greedy(3), greedy(4)])
    assert [len(o["output_ids"]) for o in batch] == [3, 4]
    assert batch[0]["output_ids"] == one["output_ids"][:3]


def test_stream_chunks_concatenate_to_full_output(engine):
    full = engine.generate(PROMPT, greedy(8))
    chunks = list(engine.generate(PROMPT, greedy(8), stream=True))
    assert len(chunks) >= 2
    assert "".join(c["text"] for c in chunks) == full["text"]
    assert sum((c["output_ids"] for c in chunks), []) == full["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_stream_chunks_carry_their_own_logprobs(engine):
    """Each chunk's logprob lists hold its new entries, as its text and ids do."""
    options = {"return_logprob": True, "top_logprobs_num": 2, "logprob_start_len": 0}
    full = engine.generate(PROMPT, greedy(8), **options)
    chunks = list(engine.generate(PROMPT, greedy(8), stream=True, **options))
    assert len(chunks) >= 2
    for key in ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs"):
        joined = [entry for c in chunks for entry in c["meta_info"][key]]
        assert joined == full["meta_info"][key], key
    for chunk in chunks:
        ids = [t for _, t, _ in chunk["meta_info"]["output_token_logprobs"]]
        assert ids == chunk["output_ids"]


def test_a_timed_out_async_stream_raises_the_timeout(engine):
    """asyncio.wait_for around a stream: the caller gets TimeoutError whatever the
    moment (not the stream's own RuntimeError), and the request is aborted."""

    async def consume() -> None:
        async for _ in await engine.async_generate(PROMPT, greedy(240), stream=True):
            pass

    async def main() -> list[str]:
        outcomes = []
        for step in range(8):
            try:
                await asyncio.wait_for(consume(), timeout=0.02 + 0.015 * step)
                outcomes.append("finished")
            except asyncio.TimeoutError:
                outcomes.append("timeout")
        return outcomes

    assert set(asyncio.run(main())) <= {"timeout", "finished"}


def test_ctrl_c_in_generate_aborts_its_requests(engine):
    """KeyboardInterrupt reaches the caller and the requests stop in the scheduler."""
    rids = [f"interrupted-{i}" for i in range(6)]  # 4 run, 2 wait: about 1 s of work
    timer = threading.Timer(0.15, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            engine.generate([PROMPT] * 6, greedy(240), rid=rids)
    finally:
        timer.cancel()
    engine._run(asyncio.sleep(0.05))  # the loop runs the cancellation
    assert not set(rids) & set(engine.tokenizer_manager.rid_to_state)
    stream = engine.generate(PROMPT, greedy(240), stream=True)
    next(stream)
    timer = threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            for _ in stream:
                pass
    finally:
        timer.cancel()


def test_n_expands_into_n_requests(engine):
    outs = engine.generate(PROMPT, greedy(4, n=3))
    assert len(outs) == 3
    assert outs[0]["output_ids"] == outs[1]["output_ids"] == outs[2]["output_ids"]


def test_stop_token_ids_and_stop_strings(engine):
    base = engine.generate(PROMPT, greedy(10))
    stop_id = base["output_ids"][3]
    out = engine.generate(PROMPT, greedy(10, stop_token_ids=[stop_id]))
    first = base["output_ids"].index(stop_id)
    assert out["output_ids"] == base["output_ids"][: first + 1]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}

    text = base["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    if not stop.strip():
        pytest.skip("degenerate stop string")
    trimmed = engine.generate(PROMPT, greedy(10, stop=stop))
    assert trimmed["meta_info"]["finish_reason"]["matched"] == stop
    assert trimmed["text"] == text[: text.index(stop)]
    kept = engine.generate(PROMPT, greedy(10, stop=stop, no_stop_trim=True))
    assert kept["text"] == text[: text.index(stop) + len(stop)]


def test_numpy_and_torch_token_ids(engine):
    import numpy as np
    import torch

    ids = [1, 5, 9, 13]
    expected = engine.generate(input_ids=ids, sampling_params=greedy(3))["output_ids"]
    for given in (np.array(ids), torch.tensor(ids), [np.int64(i) for i in ids]):
        out = engine.generate(input_ids=given, sampling_params=greedy(3))
        assert out["output_ids"] == expected
    batch = engine.generate(input_ids=np.array([ids, ids]), sampling_params=greedy(3))
    assert [o["output_ids"] for o in batch] == [expected, expected]
    with pytest.raises(ValueError, match="input_ids"):
        engine.generate(input_ids=np.array([1.5, 2.0]), sampling_params=greedy(3))


def test_logprobs(engine):
    out = engine.generate(
        PROMPT, greedy(4), return_logprob=True, top_logprobs_num=2, logprob_start_len=0
    )
    meta = out["meta_info"]
    assert [t for _, t, _ in meta["output_token_logprobs"]] == out["output_ids"]
    assert all(lp <= 0 for lp, _, _ in meta["output_token_logprobs"])
    assert len(meta["output_top_logprobs"]) == 4 and len(meta["output_top_logprobs"][0]) == 2
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"]
    assert meta["input_token_logprobs"][0][0] is None


def test_token_ids_logprob_matches_hf(engine, tiny_llama_dir):
    # SGLang's token_ids_logprob: the logprobs of chosen ids at every prompt and output
    # position, as log_softmax of HF's logits there (an id may repeat; order kept)
    from sglang.test.hf_reference import hf_logits, load_hf_model

    prompt_ids = [(29 * i) % 3000 + 40 for i in range(14)]
    asked = [7, 2999, 123, 7]
    out = engine.generate(input_ids=prompt_ids, sampling_params=greedy(5), return_logprob=True,
                          token_ids_logprob=asked, logprob_start_len=3)  # fmt: skip
    meta = out["meta_info"]
    assert len(meta["input_token_ids_logprobs"]) == len(prompt_ids) - 3
    assert len(meta["output_token_ids_logprobs"]) == 5
    assert meta["output_top_logprobs"] == []  # top_logprobs_num 0: no top lists
    full = prompt_ids + out["output_ids"]
    reference = torch.log_softmax(hf_logits(load_hf_model(str(tiny_llama_dir)), full), dim=-1)
    positions = meta["input_token_ids_logprobs"] + meta["output_token_ids_logprobs"]
    for position, entries in enumerate(positions, start=3):
        assert [t for _, t, _ in entries] == asked
        expected = reference[position - 1, asked].tolist()
        assert [v for v, _, _ in entries] == pytest.approx(expected, abs=1e-4)


def test_token_ids_logprob_per_prompt_and_bad_values(engine):
    outs = engine.generate([PROMPT, PROMPT], greedy(2), return_logprob=True,
                           token_ids_logprob=[[5], [6, 8]])  # fmt: skip
    assert [[[t for _, t, _ in e] for e in o["meta_info"]["output_token_ids_logprobs"]]
            for o in outs] == [[[5], [5]], [[6, 8], [6, 8]]]  # fmt: skip
    # one flat list is every prompt's; the ids' text comes with return_text_in_logprobs
    outs = engine.generate([PROMPT, PROMPT], greedy(1), return_logprob=True,
                           token_ids_logprob=[5], return_text_in_logprobs=True)  # fmt: skip
    for out in outs:
        [[(_, token, text)]] = out["meta_info"]["output_token_ids_logprobs"]
        assert token == 5 and text == engine.tokenizer_manager.tokenizer.decode([5])
    with pytest.raises(ValueError, match="token_ids_logprob.*return_logprob"):
        engine.generate(PROMPT, greedy(1), token_ids_logprob=[5])
    with pytest.raises(ValueError, match="token_ids_logprob: token id 1000000 is outside"):
        engine.generate(PROMPT, greedy(1), return_logprob=True, token_ids_logprob=[10**6])
    with pytest.raises(ValueError, match="token_ids_logprob: got 3 entries for 2 prompts"):
        engine.generate([PROMPT, PROMPT], greedy(1), return_logprob=True,
                        token_ids_logprob=[[1], [2], [3]])  # fmt: skip


def test_logprob_options_per_prompt(engine):
    # as SGLang's Engine: return_logprob / top_logprobs_num / logprob_start_len may be
    # a list, one per prompt
    outs = engine.generate([PROMPT, PROMPT], greedy(3), return_logprob=[True, True],
                           top_logprobs_num=[1, 3], logprob_start_len=[-1, 0])  # fmt: skip
    assert [len(o["meta_info"]["output_top_logprobs"][0]) for o in outs] == [1, 3]
    assert not outs[0]["meta_info"]["input_token_logprobs"]
    assert len(outs[1]["meta_info"]["input_token_logprobs"]) == outs[1]["meta_info"]["prompt_tokens"]
    with pytest.raises(ValueError, match="top_logprobs_num: got 3 entries for 2 prompts"):
        engine.generate([PROMPT, PROMPT], greedy(1), return_logprob=True, top_logprobs_num=[1, 2, 3])


@pytest.mark.parametrize("logprob_start_len", [0, 8, 11])
def test_prompt_logprobs_across_chunk_boundaries(engine, tiny_llama_dir, logprob_start_len):
    """Chunked prefill (8-token chunks) returns the same prompt logprobs as one
    chunk: a continuation chunk's first position is scored from the previous chunk's
    last row, never left None."""
    import sglang as sgl

    prompt_ids = [(37 * i) % 4000 + 20 for i in range(45)]  # 6 chunks of 8 (the last 5)
    kwargs = dict(input_ids=prompt_ids, sampling_params=greedy(2), return_logprob=True,
                  top_logprobs_num=2, token_ids_logprob=[3, 500],
                  logprob_start_len=logprob_start_len)  # fmt: skip
    whole = engine.generate(**kwargs)["meta_info"]
    chunked_engine = sgl.Engine(
        model_path=str(tiny_llama_dir), num_threads=1, log_level="warning",
        max_total_tokens=4096, chunked_prefill_size=8, context_length=256,
    )  # fmt: skip
    try:
        chunked = chunked_engine.generate(**kwargs)["meta_info"]
    finally:
        chunked_engine.shutdown()
    expected_len = len(prompt_ids) - logprob_start_len
    for meta in (whole, chunked):
        assert len(meta["input_token_logprobs"]) == expected_len
        assert [t for _, t, _ in meta["input_token_logprobs"]] == prompt_ids[logprob_start_len:]
    first_scored = 1 if logprob_start_len == 0 else 0  # prompt position 0 has no logprob
    values = [[lp for lp, _, _ in m["input_token_logprobs"]] for m in (whole, chunked)]
    assert all(v is None for v in values[1][:first_scored])
    assert None not in values[0][first_scored:] and None not in values[1][first_scored:]
    assert values[1][first_scored:] == pytest.approx(values[0][first_scored:], abs=1e-3)
    tops = [[[t for _, t, _ in top or []] for top in m["input_top_logprobs"][first_scored:]]
            for m in (whole, chunked)]  # fmt: skip
    assert tops[0] == tops[1]
    # the asked ids' logprobs too, the continuation chunks' first positions included
    asked = [[[v for v, _, _ in e] for e in m["input_token_ids_logprobs"][first_scored:]]
             for m in (whole, chunked)]  # fmt: skip
    assert len(asked[1]) == expected_len - first_scored
    assert sum(asked[1], []) == pytest.approx(sum(asked[0], []), abs=1e-3)
    assert [t for _, t, _ in chunked["output_token_logprobs"]] == [
        t for _, t, _ in whole["output_token_logprobs"]
    ]


def test_bad_input_raises_value_error(engine):
    with pytest.raises(ValueError, match="temperature"):
        engine.generate(PROMPT, {"temperature": -1.0})
    with pytest.raises(ValueError, match="context length|longer"):
        engine.generate(input_ids=[20] * 300, sampling_params=greedy(4))
    with pytest.raises(ValueError, match="sampling_params.max_tokens: unknown field"):
        engine.generate(PROMPT, {"max_tokens": 3})
    # The same rules as the HTTP routes (one definition): types are strict, n is capped.
    for bad, field in [({"seed": "x"}, "seed"), ({"n": 1000}, "n"), ({"stop": [1]}, "stop"),
                       ({"skip_special_tokens": "no"}, "skip_special_tokens")]:  # fmt: skip
        with pytest.raises(ValueError, match=f"sampling_params.{field}"):
            engine.generate(PROMPT, {"max_new_tokens": 2, **bad})
    with pytest.raises(ValueError, match="top_logprobs_num"):
        engine.generate(PROMPT, greedy(2), return_logprob=True, top_logprobs_num=10**6)
    # a start past the prompt scores nothing: refused, as SGLang does (-1 asks for none)
    with pytest.raises(ValueError, match=r"logprob_start_len \(50\) must be below"):
        engine.generate(input_ids=[20] * 10, sampling_params=greedy(2), return_logprob=True,
                        logprob_start_len=50)  # fmt: skip


def test_bad_seeds_and_token_ids_with_n_name_their_field(engine):
    outs = engine.generate(PROMPT, greedy(2, n=2, seed=None))  # unseeded, as with n = 1
    assert [len(o["output_ids"]) for o in outs] == [2, 2]
    for seed in ("5", [1]):
        with pytest.raises(ValueError, match="sampling_params.seed") as info:
            engine.generate(PROMPT, greedy(2, n=2, seed=seed))
        assert info.value.param == "sampling_params.seed"
    for ids in (5, torch.tensor(5), {1: 2}):
        with pytest.raises(ValueError, match="input_ids") as info:
            engine.generate(input_ids=ids, sampling_params=greedy(2))
        assert info.value.param == "input_ids"


def test_sglang_generate_keywords_are_taken_at_their_defaults(engine):
    """SGLang code passes its Engine.generate keywords as None / False: accepted; a value
    this server does not implement is refused naming it (as the HTTP 400), never a
    TypeError about an internal class. Unit cases: test/unit/test_engine_validation.py."""
    nulls = dict(image_data=None, audio_data=None, video_data=None, lora_path=None,
                 custom_logit_processor=None, return_hidden_states=False, bootstrap_host=None,
                 bootstrap_port=None, bootstrap_room=None, data_parallel_rank=None,
                 logprob_start_len=None, top_logprobs_num=None, token_ids_logprob=None)  # fmt: skip
    assert len(engine.generate(PROMPT, greedy(2), **nulls)["output_ids"]) == 2
    for name, value in [("lora_path", "adapter"), ("image_data", "x.png"),
                        ("data_parallel_rank", 1)]:  # fmt: skip
        with pytest.raises(ValueError, match=f"{name}: .*not supported") as info:
            engine.generate(PROMPT, greedy(2), **{name: value})
        assert info.value.param == name
    with pytest.raises(ValueError, match="every prompt's n must be the same"):
        engine.generate([PROMPT, PROMPT], [greedy(1, n=1), greedy(1, n=3)])
    # require_reasoning is SGLang's and served (constrained/reasoning_gate.py), given a
    # reasoning parser whose end tag is one token: refused naming it here, with none
    with pytest.raises(ValueError, match="require_reasoning needs a reasoning parser") as info:
        engine.generate(PROMPT, greedy(2), require_reasoning=True)
    assert info.value.param == "require_reasoning"
    assert len(engine.generate(PROMPT, greedy(2), require_reasoning=False)["output_ids"]) == 2


def test_an_unset_max_new_tokens_is_cut_to_the_room_left(engine):
    """SGLang's rule: the default 128 shrinks to what the context (256) leaves; only a
    max_new_tokens the caller set is refused for not fitting."""
    out = engine.generate(input_ids=[20] * 200, sampling_params=GREEDY)
    assert len(out["output_ids"]) == 56 and out["meta_info"]["finish_reason"]["type"] == "length"
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.generate(input_ids=[20] * 200, sampling_params=greedy(128))


def test_one_rid_for_a_batch_names_each_generation(engine):
    """As the HTTP routes: `<rid>-<k>`, k counting prompts x n."""
    outs = engine.generate([PROMPT, "x = 1"], greedy(2), rid="batch")
    assert [o["meta_info"]["id"] for o in outs] == ["batch-0", "batch-1"]
    outs = engine.generate([PROMPT, "x = 1"], greedy(2, n=2), rid="pair")
    assert [o["meta_info"]["id"] for o in outs] == [f"pair-{k}" for k in range(4)]


def wait_for_held(engine, count: int) -> None:
    """Until the engine's scheduler holds `count` requests, running or queued."""
    deadline = time.monotonic() + 30
    while True:
        state = engine.get_server_info()["internal_states"][0]
        if state["num_running_reqs"] + state["num_queued_reqs"] >= count:
            return
        assert time.monotonic() < deadline, state
        time.sleep(0.05)


def test_queue_limit_rejects_with_clear_error(engine):
    """A full queue is an exception (HTTP: 429), never an empty 'successful' output;
    the Engine keeps serving after it."""
    busy = engine.generate(["x = 1"] * 10, greedy(200), stream=True)  # 4 running, 6 queued
    next(busy)
    try:
        wait_for_held(engine, 10)
        with pytest.raises(ServerOverloadedError, match="queue is full"):
            engine.generate("x = 1", greedy(3))
    finally:
        busy.close()
    out = engine.generate("x = 1", greedy(3))
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    # More samples than the queue limit (6), not more than it plus the 4 free running
    # slots: an idle engine takes them all.
    outs = engine.generate("x = 1", greedy(3, n=9))
    assert [o["meta_info"]["finish_reason"]["type"] for o in outs] == ["length"] * 9


@pytest.mark.parametrize(
    "prompt,params,param",
    [
        ("x = 1", greedy(3, n=11), "n"),
        ("x = 1", {**greedy(3, n=11), "regex": "[a-z]+"}, "n"),  # compiling too
        (["x = 1"] * 11, greedy(3), "prompt"),  # a prompt list: it was a 429 when idle
        (["x = 1"] * 6, greedy(3, n=2), "prompt"),
    ],
)
def test_a_request_larger_than_slots_and_queue_is_invalid_even_when_busy(
    engine, prompt, params, param
):
    """More generations than running slots (4) and queue (6) hold: no retry can fit it,
    so a ValueError naming the field (HTTP: 400), never "retry later" (a 429), whether
    the engine is idle or not."""
    for busy in (False, True):
        stream = engine.generate("x = 1", greedy(200), stream=True) if busy else None
        try:
            if stream is not None:
                next(stream)
            with pytest.raises(ValueError, match="more than the server holds") as refused:
                engine.generate(prompt, params)
            assert refused.value.param == param
        finally:
            if stream is not None:
                stream.close()


def test_abort_by_rid_and_stream_close_free_resources(engine):
    chunks = []
    for chunk in engine.generate(PROMPT, greedy(240), stream=True, rid="to-abort"):
        if not chunks:
            engine.abort_request("to-abort")  # from another thread than the engine's loop
        chunks.append(chunk)
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert chunks[-1]["meta_info"]["completion_tokens"] < 240

    stream = engine.generate(PROMPT, greedy(200), stream=True)
    next(stream)
    stream.close()  # leaving a stream early aborts the request


def test_a_stream_collected_on_the_engines_loop_thread_is_aborted_not_hung(engine):
    """A half-read stream left in a reference cycle is finalized wherever a collection
    runs, the Engine's own loop thread included: its close waited for that loop, which
    then waited for itself, and every later call hung."""
    stream = engine.generate(PROMPT, greedy(200), stream=True)
    next(stream)
    holder = [stream]
    holder.append(holder)  # a cycle: only the collector frees it
    del stream, holder

    async def collect() -> int:
        return gc.collect()

    assert asyncio.run_coroutine_threadsafe(collect(), engine._loop).result(timeout=60) > 0
    assert len(engine.generate(PROMPT, greedy(3))["output_ids"]) == 3


def test_a_forked_child_that_exits_leaves_the_engine_serving(engine):
    """os.fork() copies the Engine's objects, not its processes: at the child's exit,
    multiprocessing SIGTERMed the parent's scheduler (it took the daemon children for
    its own) and the Engine's exit hook shut the parent's engine down."""
    pid = os.fork()
    if pid == 0:  # the child: exit as a script does (exit hooks, then gone)
        try:
            atexit._run_exitfuncs()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert len(engine.generate(PROMPT, greedy(3))["output_ids"]) == 3


def test_async_generate_and_sync_call_inside_event_loop(engine):
    expected = engine.generate(PROMPT, greedy(4))["output_ids"]

    async def main():
        out = await engine.async_generate(PROMPT, greedy(4))
        chunks = [c async for c in await engine.async_generate(PROMPT, greedy(4), stream=True)]
        sync_out = engine.generate(PROMPT, greedy(4))  # blocking call from a running loop
        return out, chunks, sync_out

    out, chunks, sync_out = asyncio.run(main())
    assert out["output_ids"] == expected == sync_out["output_ids"]
    assert sum((c["output_ids"] for c in chunks), []) == expected


def test_server_info_flush_cache_and_weight_update(engine, tiny_llama_dir):
    engine.generate(PROMPT, greedy(2))
    info = engine.get_server_info()
    assert info["model_path"] == str(tiny_llama_dir)
    state = info["internal_states"][0]
    for key in (
        "num_running_reqs",
        "num_queued_reqs",
        "token_usage",
        "cache_hit_rate",
        "chunked_prefill_size",
        "max_total_num_tokens",
    ):
        assert key in state
    assert engine.flush_cache() is True
    assert engine.get_server_info()["internal_states"][0]["cached_kv_tokens"] == 0
    expected = engine.generate(PROMPT, greedy(4))["output_ids"]
    ok, _ = engine.update_weights_from_disk(str(tiny_llama_dir), load_format="dummy")
    assert ok and engine.get_server_info()["load_format"] == "dummy"
    engine.generate(PROMPT, greedy(4))
    engine.generate(PROMPT, greedy(4))  # a cache hit
    assert engine.get_server_info()["internal_states"][0]["cache_hit_rate"] > 0
    ok, _ = engine.update_weights_from_disk(str(tiny_llama_dir))  # no format: "auto"
    assert ok
    info = engine.get_server_info()
    # the prefixes the hit rate described are gone with the old weights' KV
    assert info["internal_states"][0]["cache_hit_rate"] == 0
    assert info["internal_states"][0]["model_path"] == str(tiny_llama_dir)
    assert info["load_format"] == info["internal_states"][0]["load_format"] == "auto"
    assert engine.generate(PROMPT, greedy(4))["output_ids"] == expected  # the real weights
    bad, message = engine.update_weights_from_disk("/nonexistent/model")
    assert not bad and message


def test_max_new_tokens_zero_scores_the_prompt(engine):
    out = engine.generate(PROMPT, greedy(0), return_logprob=True, logprob_start_len=0)
    assert out["output_ids"] == [] and out["meta_info"]["completion_tokens"] == 0
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    assert len(out["meta_info"]["input_token_logprobs"]) == out["meta_info"]["prompt_tokens"]


def test_scheduler_forward_clock_reaches_the_tokenizer_manager(engine):
    """/health counts a scheduler inside a forward as answering: the clock the
    scheduler process writes is the one this process reads."""
    clock = engine.tokenizer_manager.forward_clock
    seen_busy = False
    for _chunk in engine.generate(PROMPT, greedy(200), stream=True):
        seen_busy = seen_busy or clock.busy_for_s() is not None
        if seen_busy:
            break
    assert seen_busy


def test_repetition_penalty_matches_hf_generate(engine, tiny_llama_dir):
    # HF's repetition penalty scales every token of the prompt and of the output so far;
    # greedy outputs under it must be HF's, for a batch of prompts decoding together.
    import torch
    from transformers import AutoModelForCausalLM

    bases = [[(53 * i + 7 * j) % 900 + 20 for i in range(12)] for j in range(3)]
    plain = engine.generate(input_ids=bases, sampling_params=greedy(12))
    # each prompt ends with the model's own greedy continuation, whose tokens it tends to
    # repeat: penalizing only the outputs would let it repeat them
    prompts = [base + out["output_ids"] for base, out in zip(bases, plain)]
    params = greedy(12, repetition_penalty=1.8)
    ours = [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]
    hf_model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype=torch.float32)
    hf = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=12, min_new_tokens=12, repetition_penalty=1.8,
                                    pad_token_id=0)  # fmt: skip
            hf.append(out[0, len(prompt) :].tolist())
    assert ours == hf


def test_a_minimum_past_the_context_with_no_maximum_is_refused(engine):
    """max_new_tokens null runs to the context's end (256 here): a min_new_tokens past
    it was accepted and silently unmet (`length` after the room)."""
    with pytest.raises(ValueError, match="min_new_tokens") as refused:
        engine.generate("x = 1", {"max_new_tokens": None, "min_new_tokens": 300})
    assert refused.value.param == "sampling_params.min_new_tokens"
    out = engine.generate("x = 1", {"max_new_tokens": None, "min_new_tokens": 200, "temperature": 0})
    assert out["meta_info"]["completion_tokens"] >= 200


def test_logprob_entries_are_bounded_over_a_requests_choices(engine):
    """positions x (1 + top + token ids) x n past 2,097,152: a ValueError naming
    return_logprob before anything runs (the answer is built in this process); one such
    choice alone is served."""
    heavy = dict(return_logprob=True, logprob_start_len=0, top_logprobs_num=100,
                 token_ids_logprob=list(range(1024)))  # fmt: skip
    with pytest.raises(ValueError, match="logprob entries") as refused:
        engine.generate("x = 1", greedy(240, n=8), **heavy)
    assert refused.value.param == "return_logprob"
    out = engine.generate("x = 1", greedy(4), **heavy)
    assert len(out["meta_info"]["output_token_ids_logprobs"][0]) == 1024
