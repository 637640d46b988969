"""Acceptance: greedy outputs through the Engine equal single-request runner outputs.

One Engine per configuration (module-scoped, parametrized): default (radix
cache), radix cache disabled, chunked prefill of 16 tokens, and a KV pool small
enough to force retraction. After every test: no leaked KV or request slots.
"""

from __future__ import annotations

import random
import time

import pytest

from sglang.test.pool_checks import idle_pool_problems, stop_id_never_generated

pytestmark = pytest.mark.slow

NUM_REQS = 64
MAX_NEW = 6
COMMON = dict(num_threads=1, log_level="warning", max_running_requests=32, random_seed=0)
CONFIGS = {
    "radix": dict(max_total_tokens=8192),
    "no_radix": dict(max_total_tokens=8192, disable_radix_cache=True),
    "chunked16": dict(max_total_tokens=8192, chunked_prefill_size=16),
    "small_pool": dict(max_total_tokens=640, chunked_prefill_size=64),
}


def mixed_prompts(vocab_size: int) -> list[list[int]]:
    rng = random.Random(7)
    return [
        [rng.randrange(16, vocab_size) for _ in range(rng.randrange(4, 60))]
        for _ in range(NUM_REQS)
    ]


def shared_prefix_prompts(vocab_size: int) -> list[list[int]]:
    rng = random.Random(11)
    prefix = [rng.randrange(16, vocab_size) for _ in range(40)]
    return [
        prefix + [rng.randrange(16, vocab_size) for _ in range(rng.randrange(1, 12))]
        for _ in range(12)
    ]


def reference_outputs(model_dir: str, prompts: list[list[int]]) -> list[list[int]]:
    """Each prompt alone through TpModelWorker (no scheduler, no batching)."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.runtime_context import get_context
    from sglang.test.runner_utils import MiniReq, MiniScheduler

    with get_context().override_server_args(
        model_path=model_dir,
        device="cpu",
        max_total_tokens=2048,
        max_running_requests=4,
        num_threads=1,
    ):
        worker = TpModelWorker(ModelConfig(model_dir))
        sched = MiniScheduler(worker)
        return [sched.generate([MiniReq(list(p))], MAX_NEW)[0] for p in prompts]


@pytest.fixture(scope="module")
def workload(tiny_llama_dir):
    from sglang.srt.configs.model_config import ModelConfig

    vocab = ModelConfig(str(tiny_llama_dir)).vocab_size
    prompts = mixed_prompts(vocab)
    shared = shared_prefix_prompts(vocab)
    refs = reference_outputs(str(tiny_llama_dir), prompts + shared)
    return prompts, refs[: len(prompts)], shared, refs[len(prompts) :]


@pytest.fixture(scope="module", params=list(CONFIGS))
def engine(request, tiny_llama_dir, workload):
    import sglang as sgl

    llm = sgl.Engine(model_path=str(tiny_llama_dir), **COMMON, **CONFIGS[request.param])
    llm.config_name = request.param
    yield llm
    llm.shutdown()


@pytest.fixture(autouse=True)
def no_leaks(request):
    yield
    if "engine" in request.fixturenames:
        assert_no_leaks(request.getfixturevalue("engine"))


def assert_no_leaks(llm, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        state = llm.get_server_info()["internal_states"][0]
        idle = state["num_running_reqs"] == 0 and state["num_queued_reqs"] == 0
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not idle_pool_problems(state), (idle_pool_problems(state), state)


GREEDY = {"max_new_tokens": MAX_NEW, "temperature": 0.0, "ignore_eos": True}


def test_concurrent_greedy_matches_single_request_runner(engine, workload, tiny_llama_dir):
    from sglang.srt.configs.model_config import ModelConfig

    prompts, refs, _, _ = workload
    params = GREEDY
    if engine.config_name == "small_pool":
        # ignore_eos alone: each output is reserved in full and nothing retracts
        vocab = ModelConfig(str(tiny_llama_dir)).vocab_size
        params = {**GREEDY, "stop_token_ids": [stop_id_never_generated(refs, vocab)]}
    outs = engine.generate(input_ids=prompts, sampling_params=params)
    assert [o["output_ids"] for o in outs] == refs
    assert all(o["meta_info"]["finish_reason"]["type"] == "length" for o in outs)
    assert [o["meta_info"]["prompt_tokens"] for o in outs] == [len(p) for p in prompts]
    if engine.config_name == "small_pool":
        state = engine.get_server_info()["internal_states"][0]
        assert state["num_retracted_reqs"] > 0, "the small pool should force retraction"


def test_shared_prefix_reports_cached_tokens(engine, workload):
    _, _, shared, refs = workload
    first = engine.generate(input_ids=shared[:1], sampling_params=GREEDY)
    rest = engine.generate(input_ids=shared[1:], sampling_params=GREEDY)
    outs = first + rest
    assert [o["output_ids"] for o in outs] == refs
    cached = [o["meta_info"]["cached_tokens"] for o in rest]
    if engine.config_name == "no_radix":
        assert cached == [0] * len(rest)
    else:
        assert min(cached) > 0, cached
