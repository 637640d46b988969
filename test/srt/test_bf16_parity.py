"""bf16 on CPU vs HF transformers in bf16, on the tiny Llama and Qwen3 (qk-norm).

`dtype auto` keeps a bf16 checkpoint in bf16 on CPUs with native bf16 matmuls
(resolvers.cpu_native_half_flags); `--dtype bfloat16` runs it anywhere. Both sides
round every op to bf16 in their own order, so the tolerances are bf16's, documented
here and in docs/config.md:
- prompt logprobs: max |ours - HF| <= 0.1, mean <= 0.02 (fp32: 1e-3);
- greedy decode (the CPU kernels' path: fused norms, rotary, paged decode attention):
  at each step HF, teacher-forced on our tokens, ranks our token first or within 0.1
  logprob of its first (a near-tie that bf16 rounding may break either way).
Each model runs with its linears past a few rows on our bf16 dot-product kernel, and on
AMX tiles where the CPU has them (the same routing as the dot product elsewhere).
"""

from __future__ import annotations

import pytest
import torch

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.environ import envs
from sglang.srt.layers import cpu_kernels
from sglang.srt.layers.weight_panels import panels_of
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.runtime_context import get_context
from sglang.test.hf_reference import hf_logits, hf_prompt_logprobs, load_hf_model
from sglang.test.runner_utils import MiniReq, MiniScheduler, greedy_on_kernel_and_torch

MAX_LOGPROB_ERR, MEAN_LOGPROB_ERR = 0.1, 0.02
NEAR_TIE_LOGPROB = 0.1
GREEDY_TOKENS = 24
PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "The quick brown fox",
    "import os\nimport sys\n\nclass Config:\n    def __init__(self, path):",
    "for i in range(10):\n    print(i * i)",
]


# (arch, AMX tiles wanted): the linears past a few rows on our bf16 dot-product kernel,
# and on AMX tiles where the CPU has them
@pytest.fixture(
    scope="module",
    params=[("llama", False), ("qwen3", False), ("llama", True), ("qwen3", True)],
    ids=lambda p: f"{p[0]}-amx-{'on' if p[1] else 'off'}",
)
def setup(request, tiny_model_dir):
    arch, amx = request.param
    model_dir = str(tiny_model_dir(arch))
    kernels = cpu_kernels.load()
    kernels.use_amx_tiles(amx)
    with get_context().override_server_args(
        model_path=model_dir, device="cpu", max_total_tokens=4096, max_running_requests=8
    ):
        worker = TpModelWorker(ModelConfig(model_dir, dtype="bfloat16"))
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    prompts = [tokenizer.encode(p).ids for p in PROMPTS]
    yield worker, load_hf_model(model_dir, torch.bfloat16), prompts
    worker.token_to_kv_pool_allocator.check_integrity()
    kernels.use_amx_tiles(envs.SGLANG_CPU_AMX.get())


def test_runs_in_bf16(setup):
    worker, _, _ = setup
    assert worker.model_runner.model_config.dtype == torch.bfloat16
    assert worker.model_runner.token_to_kv_pool.dtype == torch.bfloat16
    qkv = worker.model_runner.model.model.layers[0].self_attn.qkv_proj.weight
    assert (panels_of(qkv) is not None) == cpu_kernels.load().bf16_dot  # read by both paths


def test_prompt_logprobs_within_bf16_tolerance(setup):
    worker, hf, prompts = setup
    sched = MiniScheduler(worker)
    reqs = [MiniReq(p) for p in prompts]
    batch = sched.build_extend(reqs, return_logprob=True, logprob_start_lens=[0] * len(reqs))
    result = sched.run(reqs, batch)
    errors = []
    for prompt, ours in zip(prompts, result.input_token_logprobs):
        ref = torch.tensor(hf_prompt_logprobs(hf, prompt))
        errors.append((torch.tensor(ours[1:]) - ref).abs())
    sched.release(reqs)
    err = torch.cat(errors)
    assert err.max() <= MAX_LOGPROB_ERR, f"max {err.max():.4f}"
    assert err.mean() <= MEAN_LOGPROB_ERR, f"mean {err.mean():.4f}"


def test_greedy_decode_agrees_with_hf_up_to_near_ties(setup):
    worker, hf, prompts = setup
    outputs = MiniScheduler(worker).generate([MiniReq(p) for p in prompts], GREEDY_TOKENS)
    for prompt, ours in zip(prompts, outputs):
        logprobs = torch.log_softmax(hf_logits(hf, prompt + ours)[len(prompt) - 1 : -1], -1)
        chosen = logprobs.gather(1, torch.tensor(ours).unsqueeze(1)).squeeze(1)
        gap = logprobs.max(-1).values - chosen  # 0 where HF agrees
        assert gap.max() <= NEAR_TIE_LOGPROB, f"step {int(gap.argmax())}: gap {gap.max():.3f}"


def test_float32_model_over_a_bf16_kv_pool(tiny_model_dir, monkeypatch):
    """--kv-cache-dtype bfloat16 under a float32 model (half the KV memory and bytes to
    read): decode takes the CPU attention kernel, whose greedy tokens equal the torch
    path's over the same bf16 pool."""
    model_dir = str(tiny_model_dir("llama"))
    with get_context().override_server_args(
        model_path=model_dir, device="cpu", max_total_tokens=4096, kv_cache_dtype="bfloat16"
    ):
        worker = TpModelWorker(ModelConfig(model_dir, dtype="float32"))
    assert worker.model_runner.token_to_kv_pool.dtype == torch.bfloat16
    prompts = [[5 + i, 17, 33 + 2 * i, 9, 41, 12 + i] * 4 for i in range(3)]
    with_kernel, torch_path = greedy_on_kernel_and_torch(worker, prompts, GREEDY_TOKENS, monkeypatch)
    assert with_kernel == torch_path
    worker.token_to_kv_pool_allocator.check_integrity()
