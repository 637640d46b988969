"""The Scheduler in-process (no child processes): fake queues, a real TpModelWorker.

Covers what is awkward through the Engine: abort at every stage, stream
intervals, page_size > 1, and the idle integrity check after each scenario.
"""

from __future__ import annotations

import random

import pytest

from sglang.srt.managers.io_struct import (
    AbortReq,
    BatchTokenIDOutput,
    FlushCacheReqInput,
    TokenizedGenerateReqInput,
)
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.test.fake_queue import FakeQueue

pytestmark = pytest.mark.slow


def make_scheduler(model_dir: str, tokenizer=None, **fields):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.runtime_context import get_context

    base = dict(num_threads=1, max_total_tokens=4096, max_running_requests=16)
    ctx = get_context().override_server_args(
        model_path=model_dir, device="cpu", **{**base, **fields}
    )
    ctx.install()
    config = ModelConfig(model_dir)
    sched = Scheduler(TpModelWorker(config), config, tokenizer, FakeQueue(), FakeQueue(), FakeQueue())
    return sched, ctx


def request(rid: str, ids: list[int], max_new: int = 5, stream: bool = False):
    params = SamplingParams(max_new_tokens=max_new, temperature=0.0, ignore_eos=True)
    params.normalize()
    return TokenizedGenerateReqInput(
        rid=rid, input_text=None, input_ids=ids, sampling_params=params, stream=stream
    )


def run_until_idle(sched, max_steps: int = 500) -> dict[str, list]:
    """Step to idle; returns rid -> list of (new ids, finish reason) messages."""
    got: dict[str, list] = {}
    for _ in range(max_steps):
        sched.step()
        for msg in sched.send_to_detokenizer.recv_all_nowait():
            assert isinstance(msg, BatchTokenIDOutput)
            for rid, ids, fin in zip(msg.rids, msg.new_output_ids, msg.finished_reasons):
                got.setdefault(rid, []).append((ids, fin))
        if sched.is_idle():
            break
    assert_idle_and_intact(sched)
    return got


def assert_idle_and_intact(sched) -> None:
    sched.step()  # an idle step runs the integrity check
    assert sched.integrity_error is None
    sched.check_memory_integrity()


def drain_outputs(sched, got: dict[str, dict]) -> None:
    """Add the scheduler's outputs so far to `got`: rid -> its output ids, input and
    output logprobs, output top logprobs, finish reason."""
    for msg in sched.send_to_detokenizer.recv_all_nowait():
        for i, rid in enumerate(msg.rids):
            out = got.setdefault(rid, {"ids": [], "input": [], "output": [], "tops": [],
                                       "finish": None})  # fmt: skip
            out["ids"] += msg.new_output_ids[i]
            out["finish"] = msg.finished_reasons[i] or out["finish"]
            if msg.input_token_logprobs is not None:
                out["input"] += msg.input_token_logprobs[i]
                out["output"] += msg.output_token_logprobs[i]
                out["tops"] += msg.output_top_logprobs[i]


def run_collecting(sched, max_steps: int = 3000) -> dict[str, dict]:
    """Step to idle (integrity checked); rid -> its outputs (drain_outputs)."""
    got: dict[str, dict] = {}
    for _ in range(max_steps):
        sched.step()
        drain_outputs(sched, got)
        if sched.is_idle():
            break
    assert_idle_and_intact(sched)
    return got


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(3)
    return [[rng.randrange(16, 8000) for _ in range(rng.randrange(3, 40))] for _ in range(12)]


@pytest.fixture(scope="module")
def reference(tiny_llama_dir, prompts):
    sched, ctx = make_scheduler(str(tiny_llama_dir))
    try:
        for i, p in enumerate(prompts):
            sched.recv_from_tokenizer.send(request(str(i), p))
        got = run_until_idle(sched)
        return [sum((ids for ids, _ in got[str(i)]), []) for i in range(len(prompts))]
    finally:
        ctx.restore()


@pytest.mark.parametrize(
    "fields",
    [
        {"page_size": 4},
        {"page_size": 4, "chunked_prefill_size": 8},
        {"schedule_policy": "lpm"},
        {"schedule_policy": "dfs-weight", "chunked_prefill_size": 16},
        {"schedule_policy": "random", "max_total_tokens": 256},
        {"enable_mixed_chunk": True, "chunked_prefill_size": 8},
        {"enable_mixed_chunk": True, "page_size": 4, "chunked_prefill_size": 8},
        {"enable_mixed_chunk": True, "max_total_tokens": 128, "chunked_prefill_size": 16},
    ],
    ids=[
        "page4",
        "page4-chunk8",
        "lpm",
        "dfs-weight-chunk16",
        "random-small-pool",
        "mixed-chunk8",
        "mixed-page4-chunk8",
        "mixed-small-pool-chunk16",
    ],
)
def test_outputs_match_across_configurations(tiny_llama_dir, prompts, reference, fields):
    sched, ctx = make_scheduler(str(tiny_llama_dir), **fields)
    try:
        for rnd in range(2):  # the second round hits the prefix cache
            for i, p in enumerate(prompts):
                sched.recv_from_tokenizer.send(request(f"{rnd}-{i}", p))
            got = run_until_idle(sched)
            outs = [sum((ids for ids, _ in got[f"{rnd}-{i}"]), []) for i in range(len(prompts))]
            assert outs == reference
    finally:
        ctx.restore()


def test_abort_at_every_stage_and_stream_interval(tiny_llama_dir, prompts):
    # 2 running slots and a queue of 1 beyond them: the 4th arrival finds it full
    sched, ctx = make_scheduler(
        str(tiny_llama_dir), chunked_prefill_size=8, stream_interval=2, max_queued_requests=1,
        max_running_requests=2,
    )
    q = sched.recv_from_tokenizer
    try:
        long_prompt = prompts[0] * 4
        q.send(request("chunked", long_prompt, max_new=4))
        q.send(request("running", prompts[1], max_new=50, stream=True))
        q.send(request("waiting", prompts[2], max_new=4))
        q.send(request("rejected", prompts[3]))
        sched.step()  # first chunk of "chunked" runs
        assert sched.chunked_req is not None and sched.chunked_req.rid == "chunked"
        q.send(AbortReq("chunked"))
        q.send(AbortReq("waiting"))
        for _ in range(4):
            sched.step()
        q.send(AbortReq("running"))
        got = run_until_idle(sched)
        assert got["rejected"][-1][1]["status_code"] == 429
        for rid in ("chunked", "waiting", "running"):
            assert got[rid][-1][1]["type"] == "abort", rid
        streamed = [len(ids) for ids, fin in got["running"] if fin is None]
        assert streamed[0] == 1 and len(streamed) > 1 and all(n == 2 for n in streamed[1:])
        q.send(FlushCacheReqInput())
        sched.step()
        assert sched.send_to_tokenizer.items[-1].success
        assert sched.tree_cache.total_size() == 0
    finally:
        ctx.restore()


class _FailAfter:
    """A fault hook: the forward of any batch holding `rid` fails from call `after` on
    (0: its prefill; 2: a decode step after it started generating)."""

    def __init__(self, rid: str, after: int) -> None:
        self.rid, self.after, self.calls = rid, after, 0

    def check(self, site: str, rids: list[str]) -> None:
        if self.rid in rids:
            self.calls += 1
            if self.calls > self.after:
                raise RuntimeError(f"boom in {self.rid}")

    def stall(self, rids: list[str]) -> None:  # FaultInjector's other hook: no stall here
        pass


@pytest.mark.parametrize("after", [0, 2], ids=["in-prefill", "in-decode"])
@pytest.mark.parametrize(
    "fields",
    [{}, {"page_size": 4, "chunked_prefill_size": 8},
     {"enable_mixed_chunk": True, "chunked_prefill_size": 8}],
    ids=["page1", "page4-chunk8", "mixed-chunk8"],
)  # fmt: skip
def test_a_failing_forward_fails_only_its_request(
    tiny_llama_dir, prompts, reference, after, fields
):
    """The faulty request ends with a 500 abort; the others get exactly the reference
    tokens; no KV slot or request row leaks (run_until_idle checks integrity)."""
    sched, ctx = make_scheduler(str(tiny_llama_dir), **fields)
    try:
        sched.fault_injector = _FailAfter("3", after)
        for i, p in enumerate(prompts):
            sched.recv_from_tokenizer.send(request(str(i), p))
        got = run_until_idle(sched)
        fin = got["3"][-1][1]
        assert fin["type"] == "abort" and fin["status_code"] == 500 and "boom" in fin["message"]
        for i in range(len(prompts)):
            if i != 3:
                assert sum((ids for ids, _ in got[str(i)]), []) == reference[i], i
    finally:
        ctx.restore()


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "not-mixed"])
def test_mixed_chunk_keeps_decoding_while_a_long_prompt_prefills(
    tiny_llama_dir, prompts, reference, mixed
):
    """With --enable-mixed-chunk a running stream gets a token in every step of another
    request's chunked prefill (without it, none until the prompt is done), and its tokens
    are the reference's; the chunk rows plus the decode row keep to the chunk size."""
    sched, ctx = make_scheduler(
        str(tiny_llama_dir), enable_mixed_chunk=mixed, chunked_prefill_size=8
    )
    q = sched.recv_from_tokenizer
    try:
        q.send(request("running", prompts[1], max_new=40, stream=True))
        sched.step()  # its prefill: the first token
        first = [
            ids for m in sched.send_to_detokenizer.recv_all_nowait() for ids in m.new_output_ids
        ]
        q.send(request("long", prompts[0] * 4, max_new=3))
        got = run_until_idle_with_steps(sched)
        prefill_steps = [s for s in got if s["long_prefilling"]]
        assert len(prefill_steps) >= 4
        streamed = [s["running_tokens"] for s in prefill_steps]
        assert streamed == ([1] * len(streamed) if mixed else [0] * len(streamed))
        assert all(s["rows"] <= 8 for s in prefill_steps)
        running = sum(first, []) + sum((s["running_ids"] for s in got), [])
        assert len(running) == 40 and running[:5] == reference[1]
    finally:
        ctx.restore()


def run_until_idle_with_steps(sched, max_steps: int = 500) -> list[dict]:
    """Per step: the tokens streamed to "running", whether "long" was still prefilling
    when the step began, and the rows of the step's forward."""
    steps: list[dict] = []
    rows: list[int] = []
    forward = sched.forward

    def counting_forward(reqs, worker_batch):
        rows.append(int(worker_batch.input_ids.numel()))
        return forward(reqs, worker_batch)

    sched.forward = counting_forward
    for _ in range(max_steps):
        long_waiting = any(r.rid == "long" for r in sched.waiting_queue)
        chunked = sched.chunked_req is not None and sched.chunked_req.rid == "long"
        rows.clear()
        sched.step()
        ids: list[int] = []
        for msg in sched.send_to_detokenizer.recv_all_nowait():
            for rid, new_ids in zip(msg.rids, msg.new_output_ids):
                if rid == "running":
                    ids.extend(new_ids)
        steps.append({"long_prefilling": long_waiting or chunked, "running_tokens": len(ids),
                      "running_ids": ids, "rows": sum(rows)})  # fmt: skip
        if sched.is_idle():
            break
    assert_idle_and_intact(sched)
    return steps


def test_mixed_rows_sample_as_decode_steps_do(tiny_llama_dir, prompts):
    """Seeded sampling with penalties, logprobs and top logprobs of a running request
    come out the same whether its tokens ride along a chunked prefill or run in decode
    steps of their own."""
    params = SamplingParams(max_new_tokens=24, temperature=0.8, seed=7, ignore_eos=True,
                            frequency_penalty=0.5, repetition_penalty=1.2)  # fmt: skip
    params.normalize()
    runs = []
    for mixed in (False, True):
        sched, ctx = make_scheduler(
            str(tiny_llama_dir), enable_mixed_chunk=mixed, chunked_prefill_size=8
        )
        q = sched.recv_from_tokenizer
        try:
            q.send(TokenizedGenerateReqInput(
                rid="sampled", input_text=None, input_ids=prompts[2], sampling_params=params,
                return_logprob=True, top_logprobs_num=3, stream=True))  # fmt: skip
            sched.step()
            q.send(request("long", prompts[0] * 4, max_new=2))
            rode = count_prefill_rides(sched, "sampled")
            got = run_collecting(sched)
            runs.append((got["sampled"], rode[0]))
        finally:
            ctx.restore()
    (plain, _), (mixed, rode) = runs
    assert rode >= 4  # the mixed run's request took tokens inside prefill batches
    assert len(plain["ids"]) == 24 and mixed["ids"] == plain["ids"]
    assert [t for _, t in mixed["output"]] == plain["ids"]
    assert max(abs(a[0] - b[0]) for a, b in zip(mixed["output"], plain["output"])) < 1e-4
    for top_m, top_p in zip(mixed["tops"], plain["tops"]):
        assert [t for _, t in top_m] == [t for _, t in top_p]


def count_prefill_rides(sched, rid: str) -> list[int]:
    """A counter ([n]) of the forwards from now on in which `rid` rides along a prefill
    batch of several requests."""
    rides = [0]
    forward = sched.forward

    def watching_forward(reqs, worker_batch):
        in_prefill = worker_batch.extend_seq_lens is not None and len(reqs) > 1
        rides[0] += in_prefill and any(r.rid == rid for r in reqs)
        return forward(reqs, worker_batch)

    sched.forward = watching_forward
    return rides


def open_request(rid: str, ids: list[int], max_new: int, input_logprobs: bool = False):
    """Greedy, ending at EOS or max_new (its output length is open: admission guesses);
    with input_logprobs, every prompt position's logprob is asked for."""
    params = SamplingParams(max_new_tokens=max_new, temperature=0.0)
    params.normalize()
    return TokenizedGenerateReqInput(
        rid=rid, input_text=None, input_ids=ids, sampling_params=params,
        return_logprob=input_logprobs, logprob_start_len=0 if input_logprobs else -1,
    )  # fmt: skip


def assert_same_input_logprobs(got: list, expected: list) -> None:
    assert [t for _, t in got] == [t for _, t in expected]
    assert got[0][0] is None and all(v is not None for v, _ in got[1:]), got
    assert max(abs(a - b) for (a, _), (b, _) in zip(got[1:], expected[1:])) < 1e-4


def test_input_logprobs_across_chunks_of_a_cached_prompt(tiny_llama_dir, prompts):
    """A prompt served once without logprobs sits in the prefix cache; asked again with
    every input logprob and prefilled in chunks, its chunks' KV is swapped for the
    cache's copy: the logprob at each chunk's first position is still there, the same
    as without chunking."""
    long_prompt = prompts[0] * 3
    expected = None
    for fields in ({}, {"chunked_prefill_size": 8}):
        sched, ctx = make_scheduler(str(tiny_llama_dir), **fields)
        try:
            sched.recv_from_tokenizer.send(open_request("plain", long_prompt, 2))
            run_collecting(sched)
            sched.recv_from_tokenizer.send(open_request("scored", long_prompt, 2, True))
            got = run_collecting(sched)["scored"]["input"]
        finally:
            ctx.restore()
        assert len(got) == len(long_prompt)
        expected = expected or got
        assert_same_input_logprobs(got, expected)


@pytest.mark.parametrize(
    "fields, max_new",
    [({"max_total_tokens": 128, "chunked_prefill_size": 8}, 80),
     ({"max_total_tokens": 160, "chunked_prefill_size": 16, "page_size": 4}, 100),
     ({"max_total_tokens": 160, "chunked_prefill_size": 16, "enable_mixed_chunk": True}, 100)],
    ids=["pool128-chunk8", "pool160-page4-chunk16", "pool160-mixed-chunk16"],
)  # fmt: skip
def test_a_prompt_prefilled_in_part_yields_its_kv_to_running_requests(
    tiny_llama_dir, prompts, fields, max_new
):
    """Each request fits the pool alone, but a prompt's first chunks hold the slots a
    running request needs next: the prompt goes back to the queue (its chunks left to the
    prefix cache), nobody is aborted, and every request gets its own greedy tokens. Every
    other request asks for its input logprobs: the retracted prompt's are made again,
    once each, the same as alone."""

    def send_all(sched) -> None:
        for i, p in enumerate(prompts):
            sched.recv_from_tokenizer.send(open_request(str(i), p, max_new, i % 2 == 1))

    alone, ctx = make_scheduler(str(tiny_llama_dir))
    try:
        send_all(alone)
        expected = run_collecting(alone)
    finally:
        ctx.restore()
    sched, ctx = make_scheduler(str(tiny_llama_dir), **fields)
    retracted_chunked = []
    retract = sched._retract_chunked
    sched._retract_chunked = lambda: retracted_chunked.append(retract()) or retracted_chunked[-1]
    try:
        send_all(sched)
        got = run_collecting(sched)
    finally:
        ctx.restore()
    assert retracted_chunked  # the scenario this test is about happened
    for i in range(len(prompts)):
        out, ref = got[str(i)], expected[str(i)]
        assert out["finish"]["type"] != "abort", out["finish"]
        assert out["ids"] == ref["ids"], i
        if i % 2:
            assert_same_input_logprobs(out["input"], ref["input"])


def test_throughput_window_starts_with_the_first_batch_after_idle(tiny_llama_dir, prompts):
    """An idle gap is not counted into the next gen_throughput window (it read 0.1 tok/s
    while decoding, after a pause)."""
    import time

    sched, ctx = make_scheduler(str(tiny_llama_dir))
    try:
        sched.recv_from_tokenizer.send(request("a", prompts[0]))
        run_until_idle(sched)
        sched._tput_t0 -= 100.0  # as if the server had idled for 100 s since
        sched.recv_from_tokenizer.send(request("b", prompts[1], max_new=3))
        sched.step()
        assert time.perf_counter() - sched._tput_t0 < 10.0
        run_until_idle(sched)
        # idle: the figure reads 0 (it kept the last window's value), as the other gauges
        sched.last_gen_throughput = 1234.0
        assert sched.live_figures()["last_gen_throughput"] == 0.0
    finally:
        ctx.restore()


def test_cache_hit_rate_counts_a_waiting_prompt_once(tiny_llama_dir):
    """A prompt that waits for room is tried at every step: its cached prefix counted
    into cache_hit_rate each time (0.47 where 48 of 210 prompt tokens hit)."""
    sched, ctx = make_scheduler(str(tiny_llama_dir), max_total_tokens=256)
    try:
        shared = [5 + i % 50 for i in range(48)]
        sched.recv_from_tokenizer.send(request("a", shared + [60] * 12, max_new=1))
        run_until_idle(sched)
        sched.recv_from_tokenizer.send(request("b", [70] * 50, max_new=150))
        sched.step()
        sched.recv_from_tokenizer.send(request("c", shared + [80] * 52, max_new=1))
        waits = 0
        while not sched.is_idle():
            waits += any(r.rid == "c" for r in sched.waiting_queue)
            sched.step()
            sched.send_to_detokenizer.recv_all_nowait()
        assert waits > 10  # the scenario: "c" waited while "b" decoded
        assert sched.live_figures()["cache_hit_rate"] == round(48 / 210, 4)
    finally:
        ctx.restore()


def test_require_reasoning_constrains_only_after_the_end_token(tiny_llama_dir, prompts):
    """A grammar gated by the think block's end token: the tokens before it are the
    model's own (greedy: the unconstrained output's), the ones after follow the
    grammar. The end token here is the unconstrained output's third token."""

    def gated(rid: str, end: int | None, schema: str | None):
        msg = request(rid, prompts[0], max_new=12)
        msg.sampling_params.json_schema = schema
        msg.reasoning_end_token_id = end
        return msg

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    sched, ctx = make_scheduler(str(tiny_llama_dir), tokenizer)
    try:
        sched.recv_from_tokenizer.send(gated("free", None, None))
        free = [t for ids, _ in run_until_idle(sched)["free"] for t in ids]
        end = free[2]
        schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
        sched.recv_from_tokenizer.send(gated("gated", end, schema))
        sched.recv_from_tokenizer.send(gated("plain", None, schema))
        got = run_until_idle(sched)
    finally:
        ctx.restore()
    assert got["gated"][-1][1]["type"] != "abort", got["gated"][-1]
    gated_ids = [t for ids, _ in got["gated"] for t in ids]
    plain_ids = [t for ids, _ in got["plain"] for t in ids]
    assert gated_ids[:3] == free[:3]  # free up to and with the end token
    assert gated_ids[3:] != free[3 : len(gated_ids)]  # then the grammar's
    assert plain_ids[:3] != free[:3]  # a grammar from the first token shapes those too
    assert sched.tokenizer.decode(gated_ids[3:4]).lstrip().startswith("{")


def test_the_tokenizers_eos_ends_a_generation_the_config_names_another(tiny_llama_dir, tmp_path):
    # config.json names <|endoftext|> and no generation_config.json names more: a chat
    # model's turns end with the tokenizer's eos (<|im_end|>), which ran on to `length`
    import json
    import shutil

    from transformers import AutoTokenizer

    model_dir = tmp_path / "eos0"
    shutil.copytree(tiny_llama_dir, model_dir)
    (model_dir / "generation_config.json").unlink(missing_ok=True)
    config = json.loads((model_dir / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    config["eos_token_id"] = 0
    assert tokenizer.eos_token_id not in (None, 0)
    (model_dir / "config.json").write_text(json.dumps(config))
    sched, ctx = make_scheduler(str(model_dir), tokenizer=tokenizer)
    try:
        params = SamplingParams(max_new_tokens=5, temperature=0.0,
                                logit_bias={str(tokenizer.eos_token_id): 100.0})  # fmt: skip
        params.normalize()
        sched.recv_from_tokenizer.send(TokenizedGenerateReqInput(
            rid="eos", input_text=None, input_ids=[5, 6, 7], sampling_params=params))  # fmt: skip
        got = run_until_idle(sched)
        ids = [i for chunk, _ in got["eos"] for i in chunk]
        assert ids == [tokenizer.eos_token_id]
        assert got["eos"][-1][1] == {"type": "stop", "matched": tokenizer.eos_token_id}
    finally:
        ctx.restore()
