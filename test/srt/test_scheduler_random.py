"""Random workloads through the in-process Scheduler, against the same requests run
with a large pool and no chunking.

Each seed draws greedy requests (some sharing a prefix, some asking input logprobs from
a random position, top logprobs, EOS or not, stop token ids, min_new_tokens, frequency
and repetition penalties, streaming), a configuration (pool size, chunk size, page size,
mixed chunks, policy, stream interval), arrival steps and client aborts. Every request that
is not aborted by its client and fits the pool alone must get the reference's tokens
and logprobs; the pool must be intact when idle.
"""

from __future__ import annotations

import random

import pytest
from test_scheduler import assert_idle_and_intact, drain_outputs, make_scheduler

from sglang.srt.managers.io_struct import AbortReq, TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

MAX_STEPS = 5000
LOGPROB_TOLERANCE = 1e-3


def draw_requests(rng: random.Random) -> list[dict]:
    shared = [rng.randrange(16, 8000) for _ in range(60)]
    reqs = []
    for i in range(rng.randrange(3, 14)):
        if rng.random() < 0.4:
            ids = shared[: rng.randrange(1, 60)]
            ids += [rng.randrange(16, 8000) for _ in range(rng.randrange(0, 20))]
        else:
            ids = [rng.randrange(16, 8000) for _ in range(rng.randrange(1, 70))]
        reqs.append({
            "rid": str(i), "ids": ids, "max_new": rng.randrange(1, 60),
            "logprob_start": rng.choice([None, None, 0, rng.randrange(0, len(ids))]),
            "top": rng.choice([0, 0, 2]), "ignore_eos": rng.random() < 0.5,
            "stop_ids": rng.sample(range(16, 8000), 3) if rng.random() < 0.3 else None,
            "min_new": rng.choice([0, 0, 3]), "frequency_penalty": rng.choice([0.0, 0.5]),
            "repetition_penalty": rng.choice([1.0, 1.3]), "stream": rng.random() < 0.5,
        })  # fmt: skip
    return reqs


def draw_fields(rng: random.Random) -> dict:
    page_size = rng.choice([1, 1, 4])
    return {
        "max_total_tokens": rng.choice([96, 128, 192, 256, 4096]),
        "chunked_prefill_size": rng.choice([page_size, 8, 16, -1, 2048]),
        "page_size": page_size,
        "enable_mixed_chunk": rng.random() < 0.5,
        "schedule_policy": rng.choice(["fcfs", "lpm", "dfs-weight"]),
        "stream_interval": rng.choice([1, 3]),
    }


def tokenized(req: dict) -> TokenizedGenerateReqInput:
    params = SamplingParams(
        max_new_tokens=req["max_new"], temperature=0.0, ignore_eos=req["ignore_eos"],
        stop_token_ids=req["stop_ids"], min_new_tokens=min(req["min_new"], req["max_new"]),
        frequency_penalty=req["frequency_penalty"],
        repetition_penalty=req["repetition_penalty"],
    )  # fmt: skip
    params.normalize()
    start = req["logprob_start"]
    return TokenizedGenerateReqInput(
        rid=req["rid"], input_text=None, input_ids=req["ids"], sampling_params=params,
        return_logprob=start is not None, logprob_start_len=-1 if start is None else start,
        top_logprobs_num=req["top"], stream=req["stream"],
    )  # fmt: skip


def run(model_dir: str, fields: dict, reqs: list[dict], arrivals: dict, aborts: dict) -> dict:
    """Step until every request has arrived and the scheduler is idle; rid -> outputs."""
    sched, ctx = make_scheduler(model_dir, **fields)
    got: dict[str, dict] = {}
    try:
        for step in range(MAX_STEPS):
            for req in reqs:
                if arrivals[req["rid"]] == step:
                    sched.recv_from_tokenizer.send(tokenized(req))
            for rid, abort_step in aborts.items():
                if abort_step == step:
                    sched.recv_from_tokenizer.send(AbortReq(rid))
            sched.step()
            drain_outputs(sched, got)
            if step > max(arrivals.values()) and sched.is_idle():
                break
        assert_idle_and_intact(sched)
    finally:
        ctx.restore()
    assert len(got) == len(reqs)
    return got


def assert_close_logprobs(got: list, expected: list, what: str) -> None:
    assert [t for _, t in got] == [t for _, t in expected], what
    for (a, _), (b, _) in zip(got, expected):
        assert (a is None) == (b is None), what
        assert a is None or abs(a - b) < LOGPROB_TOLERANCE, what


@pytest.mark.parametrize("seed", range(32))
def test_random_workload_matches_the_unconstrained_run(tiny_llama_dir, seed):
    rng = random.Random(seed)
    reqs = draw_requests(rng)
    fields = draw_fields(rng)
    model_dir = str(tiny_llama_dir)
    reference = run(model_dir, {}, reqs, {r["rid"]: 0 for r in reqs}, {})
    arrivals = {r["rid"]: rng.randrange(0, 30) for r in reqs}
    aborts = {r["rid"]: rng.randrange(0, 60) for r in reqs if rng.random() < 0.25}
    got = run(model_dir, fields, reqs, arrivals, aborts)
    for req in reqs:
        rid, out, ref = req["rid"], got[req["rid"]], reference[req["rid"]]
        if rid in aborts:
            continue
        fits_alone = len(req["ids"]) + req["max_new"] <= fields["max_total_tokens"] - 4
        if out["finish"]["type"] == "abort":
            assert not fits_alone, (rid, fields, out["finish"])
            continue
        assert out["ids"] == ref["ids"], (rid, fields)
        if req["logprob_start"] is not None:
            assert_close_logprobs(out["input"], ref["input"], f"input logprobs of {rid}")
            assert_close_logprobs(out["output"], ref["output"], f"output logprobs of {rid}")
