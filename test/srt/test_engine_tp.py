"""Tensor parallelism through the Engine: two scheduler ranks (gloo on CPU)."""

from __future__ import annotations

import os
import signal
import time

import pytest

pytestmark = pytest.mark.slow

MAX_NEW = 5
GREEDY = {"max_new_tokens": MAX_NEW, "temperature": 0.0, "ignore_eos": True}
PROMPTS = [[100, 200, 300, 400, 500], [7, 8, 9], list(range(40, 90)), [4000, 12, 77, 5]]


def single_request_reference(model_dir: str) -> list[list[int]]:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.runtime_context import get_context
    from sglang.test.runner_utils import MiniReq, MiniScheduler

    with get_context().override_server_args(
        model_path=model_dir,
        device="cpu",
        max_total_tokens=1024,
        max_running_requests=2,
        num_threads=1,
    ):
        sched = MiniScheduler(TpModelWorker(ModelConfig(model_dir)))
        return [sched.generate([MiniReq(list(p))], MAX_NEW)[0] for p in PROMPTS]


def test_tp2_matches_single_rank_and_survives_flush(tiny_llama_dir):
    import sglang as sgl

    refs = single_request_reference(str(tiny_llama_dir))
    with sgl.Engine(
        model_path=str(tiny_llama_dir),
        tp_size=2,
        num_threads=1,
        log_level="warning",
        max_total_tokens=2048,
    ) as llm:
        outs = llm.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == refs
        assert llm.flush_cache()
        again = llm.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert [o["output_ids"] for o in again] == refs
        state = llm.get_server_info()["internal_states"][0]
        assert state["memory_integrity"] == "ok"
        assert state["tp_size"] == 2

        rank1 = llm.child_pids()["scheduler (tp rank 1)"]
        os.kill(rank1, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while llm.tokenizer_manager.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not llm.tokenizer_manager.is_alive()
        with pytest.raises(RuntimeError, match="scheduler"):
            llm.generate(input_ids=PROMPTS[:1], sampling_params=GREEDY)
