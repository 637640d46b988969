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


def _half_bad_copy(model_dir, tmp_path) -> str:
    """The checkpoint with layer 0's gate_proj cut to 3/4 of its rows: TP rank 0's half
    loads, rank 1's is out of range."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    bad = tmp_path / "half-bad"
    shutil.copytree(model_dir, bad)
    width = json.loads((bad / "config.json").read_text())["intermediate_size"]
    weights = load_file(bad / "model.safetensors")
    name = "model.layers.0.mlp.gate_proj.weight"
    weights[name] = weights[name][: width * 3 // 4].clone()
    save_file(weights, bad / "model.safetensors", metadata={"format": "pt"})
    return str(bad)


def test_tp2_matches_single_rank_and_survives_flush(tiny_llama_dir, tmp_path):
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

        # an update only rank 1 cannot load: refused, and both ranks keep the old weights
        # (it was a success, with the ranks on different weights)
        ok, message = llm.update_weights_from_disk(_half_bad_copy(tiny_llama_dir, tmp_path))
        assert not ok and "another tensor-parallel rank" in message, message
        again = llm.generate(input_ids=PROMPTS, sampling_params=GREEDY)
        assert [o["output_ids"] for o in again] == refs

        rank1 = llm.child_pids()["scheduler (tp rank 1)"]
        os.kill(rank1, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while llm.tokenizer_manager.is_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not llm.tokenizer_manager.is_alive()
        with pytest.raises(RuntimeError, match=r"scheduler \(tp rank 1\).*SIGKILL"):  # the killed one
            llm.generate(input_ids=PROMPTS[:1], sampling_params=GREEDY)
