"""Fused decoder layers (layers/fused_decode.py): on CPU a decode or extend step whose
attention the paged kernel serves (decode, short extends; long ones where the build tiles
them) of a Llama-family model runs each layer as one C++ call, with the same kernels in the same
order as the module path, so tokens and logprobs are the module path's exactly.

Per architecture (Llama; Qwen2 with a qkv bias; Qwen3 with q/k norms; Mistral with a
sliding window shorter than the prompts): prefill, a short extend over the cached prefix
(the verify-sized path), then decode steps over a batch of mixed lengths, once fused and
once with the fused path off; and which layers the C++ layer refuses (MoE, TP > 1).
"""

from __future__ import annotations

import pytest

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers import cpu_kernels, fused_decode, linear
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.runtime_context import get_context
from sglang.test.runner_utils import MiniReq, MiniScheduler

PROMPTS = [[5 + i, 17, 33 + 2 * i, 9, 41, 12 + i] * (2 + i) for i in range(3)]  # 12/18/24
SHORT_EXTEND = [4, 9, 16]  # new tokens per request after the prompt: the kernel's extends
DECODE_STEPS = 12


def _worker(model_dir: str, dtype: str = "float32") -> TpModelWorker:
    with get_context().override_server_args(
        model_path=model_dir, device="cpu", max_total_tokens=4096, max_running_requests=8
    ):
        return TpModelWorker(ModelConfig(model_dir, dtype=dtype))


def _run(worker) -> tuple[list[list[int]], list[list[float]]]:
    """Prefill, one short extend, decode: each step's tokens and their logprobs."""
    sched = MiniScheduler(worker)
    reqs = [MiniReq(list(p)) for p in PROMPTS]
    tokens, logprobs = [], []

    def step(batch) -> None:
        result = sched.run(reqs, batch)
        tokens.append(result.next_token_ids)
        logprobs.append(result.next_token_logprobs)

    step(sched.build_extend(reqs, return_logprob=True))
    for req, n in zip(reqs, SHORT_EXTEND):  # n uncached tokens: the sampled one + drafts
        req.output_ids.extend(7 + k for k in range(n - 1))
    step(sched.build_extend(reqs, chunk_lens=SHORT_EXTEND, return_logprob=True))
    for _ in range(DECODE_STEPS):
        step(sched.build_decode(reqs, return_logprob=True))
    sched.release(reqs)
    return tokens, logprobs


@pytest.mark.parametrize(
    "arch,dtype",
    [("llama", "float32"), ("qwen2", "float32"), ("qwen3", "float32"), ("mistral_swa", "float32"),
     ("qwen2", "bfloat16")],
)
def test_fused_layers_equal_the_module_path(tiny_model_dir, arch, dtype, monkeypatch):
    """bfloat16: all-bf16 linears, where the CPU has AMX tiles from 2 rows on them (the
    3-row decode steps too), from C++ and from Python alike; elsewhere the dot product."""
    if dtype == "bfloat16":
        for module in (linear, fused_decode):
            monkeypatch.setattr(module, "AMX_MIN_ROWS", 2)
    worker = _worker(str(tiny_model_dir(arch)), dtype)
    calls = []
    real_run_layer = fused_decode.run_layer
    monkeypatch.setattr(
        fused_decode, "run_layer", lambda *a: calls.append(1) or real_run_layer(*a)
    )
    fused_tokens, fused_logprobs = _run(worker)
    config = worker.model_runner.model_config
    # the short extend and every decode; the prefill too where the kernels tile it
    prefill_fused = cpu_kernels.load().extend_tiled(max(map(len, PROMPTS)), config.head_dim)
    assert len(calls) == (1 + prefill_fused + DECODE_STEPS) * config.num_hidden_layers
    monkeypatch.setattr(fused_decode, "decode_step", lambda *a: None)
    module_tokens, module_logprobs = _run(worker)
    assert fused_tokens == module_tokens
    assert fused_logprobs == module_logprobs  # same kernels, same order: bit for bit
    worker.token_to_kv_pool_allocator.check_integrity()


def test_layers_the_c_plus_plus_layer_does_not_take(tiny_model_dir):
    moe = _worker(str(tiny_model_dir("mixtral"))).model_runner.model
    assert not any(fused_decode.fusable(layer) for layer in moe.model.layers)
    dense = _worker(str(tiny_model_dir("llama"))).model_runner.model
    layer = dense.model.layers[0]
    assert fused_decode.fusable(layer)
    del layer._fusable
    layer.self_attn.o_proj.tp_size = 2  # a tensor-parallel layer all-reduces in Python
    assert not fused_decode.fusable(layer)
    layer.self_attn.o_proj.tp_size = 1
    del layer._fusable
