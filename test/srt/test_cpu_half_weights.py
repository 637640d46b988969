"""A bf16 checkpoint run in float32 on CPU keeps its linear and embedding weights in bf16
(SGLANG_CPU_HALF_WEIGHTS, default on): half the weight memory and bytes per decode step,
and float32's results, since widening bf16 is exact.

On the bundled demo model (a bf16 checkpoint): the weights are stored bf16 and the norms
float32; prompt logprobs agree with HF run in float32 as float32 runs do; greedy tokens
and logprobs equal those of the same model with float32 weights (SGLANG_CPU_HALF_WEIGHTS=0),
through decode (the GEMV over the load-time panels) and a long prefill chunk, also where
the weights are kept only as their panels (the AVX2 build's rule, layers/weight_panels.py).
"""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from sglang.demo_models import demo_target_path
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers import cpu_kernels
from sglang.srt.layers.linear import embedding_rows
from sglang.srt.managers.tp_worker import TpModelWorker
from sglang.srt.model_loader.loader import half_weight_dtype
from sglang.srt.runtime_context import get_context
from sglang.test.hf_reference import hf_prompt_logprobs, load_hf_model
from sglang.test.runner_utils import MiniReq, MiniScheduler

FP32_LOGPROB_TOL = 1e-3  # ours vs HF, both float32 (test_model_parity's tolerance)
SAME_MODEL_LOGPROB_TOL = 1e-5  # bf16-stored vs float32-stored weights: one math, two orders
GREEDY_TOKENS = 16
PROMPTS = [
    [5, 17, 33, 9, 41, 12] * 3,
    [100, 7, 250, 31, 8] * 2,
    list(range(40, 140)),  # 100 rows: F.linear with the weights widened
]


def _worker(model_dir: str, half_weights: bool, monkeypatch, vector_isa: str = "") -> TpModelWorker:
    """A float32 worker; `vector_isa`: load as on that build of the kernels (the rule for
    which weights keep only their panels reads it)."""
    monkeypatch.setenv("SGLANG_CPU_HALF_WEIGHTS", "1" if half_weights else "0")
    if vector_isa:
        monkeypatch.setattr(cpu_kernels.load(), "vector_isa", vector_isa)
    with get_context().override_server_args(
        model_path=model_dir, device="cpu", max_total_tokens=4096, max_running_requests=8
    ):
        return TpModelWorker(ModelConfig(model_dir, dtype="float32"))


@pytest.fixture(scope="module")
def demo_dir() -> str:
    path = demo_target_path()
    assert path is not None, "the bundled demo model is not installed"
    assert json.loads((path / "config.json").read_text())["dtype"] == "bfloat16"
    return str(path)


@pytest.fixture(scope="module")
def workers(demo_dir):
    with pytest.MonkeyPatch.context() as mp:
        half, full = _worker(demo_dir, True, mp), _worker(demo_dir, False, mp)
    with pytest.MonkeyPatch.context() as mp:
        panels_only = _worker(demo_dir, True, mp, vector_isa="avx2")
    yield half, full, panels_only
    for w in (half, full, panels_only):
        w.token_to_kv_pool_allocator.check_integrity()


def _values(param: torch.Tensor) -> torch.Tensor:
    """A weight's values, also for one kept only as its panels (gathered from them)."""
    return embedding_rows(torch.arange(param.shape[0]), param) if param.is_meta else param


@pytest.mark.parametrize("which", [0, 2])
def test_weights_are_stored_in_the_checkpoint_dtype(workers, which):
    half, full = workers[which], workers[1]
    params = dict(half.model_runner.model.named_parameters())
    assert params["model.layers.0.self_attn.qkv_proj.weight"].dtype == torch.bfloat16
    assert params["model.embed_tokens.weight"].dtype == torch.bfloat16  # also the tied head
    assert params["model.layers.0.input_layernorm.weight"].dtype == torch.float32
    assert half.model_runner.model_config.dtype == torch.float32
    full_params = dict(full.model_runner.model.named_parameters())
    assert full_params["model.layers.0.self_attn.qkv_proj.weight"].dtype == torch.float32
    for name, p in params.items():  # the same values, widened
        assert torch.equal(_values(p).float(), full_params[name].float()), name
    if which == 2:  # kept only as their panels
        assert params["model.layers.0.self_attn.qkv_proj.weight"].is_meta
        assert params["model.embed_tokens.weight"].is_meta


def _generate(worker, max_new_tokens: int = GREEDY_TOKENS):
    sched = MiniScheduler(worker)
    reqs = [MiniReq(list(p)) for p in PROMPTS]
    batch = sched.build_extend(reqs, return_logprob=True, logprob_start_lens=[0] * len(reqs))
    prompt_logprobs = sched.run(reqs, batch).input_token_logprobs
    for _ in range(max_new_tokens - 1):
        sched.run(reqs, sched.build_decode(reqs))
    sched.release(reqs)
    return [r.output_ids for r in reqs], prompt_logprobs


@pytest.mark.parametrize("which", [0, 2])
def test_same_tokens_and_logprobs_as_float32_weights(workers, which):
    half, full = workers[which], workers[1]
    half_tokens, half_logprobs = _generate(half)
    full_tokens, full_logprobs = _generate(full)
    assert half_tokens == full_tokens
    for a, b in zip(half_logprobs, full_logprobs):
        diff = (torch.tensor(a[1:]) - torch.tensor(b[1:])).abs().max()
        assert diff <= SAME_MODEL_LOGPROB_TOL, diff


@pytest.mark.parametrize("which", [0, 2])
def test_prompt_logprobs_match_hf_in_float32(workers, demo_dir, which):
    half = workers[which]
    hf = load_hf_model(demo_dir, torch.float32)
    _, logprobs = _generate(half, max_new_tokens=1)
    for prompt, ours in zip(PROMPTS, logprobs):
        ref = torch.tensor(hf_prompt_logprobs(hf, prompt))
        assert (torch.tensor(ours[1:]) - ref).abs().max() <= FP32_LOGPROB_TOL


@pytest.mark.parametrize(
    "checkpoint,compute,device,env,expected",
    [
        ("bfloat16", "float32", "cpu", "1", torch.bfloat16),
        ("float16", "float32", "cpu", "1", torch.float16),
        ("bfloat16", "float32", "cpu", "0", None),  # switched off
        ("float32", "float32", "cpu", "1", None),  # nothing to keep
        ("bfloat16", "bfloat16", "cpu", "1", None),  # already the compute dtype
        ("bfloat16", "float32", "cuda", "1", None),  # CPU only
    ],
)
def test_which_runs_keep_half_weights(
    tmp_path, monkeypatch, checkpoint, compute, device, env, expected
):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                    "hidden_size": 64, "num_attention_heads": 2, "num_hidden_layers": 1,
                    "intermediate_size": 128, "vocab_size": 100, "torch_dtype": checkpoint})
    )  # fmt: skip
    monkeypatch.setenv("SGLANG_CPU_HALF_WEIGHTS", env)
    assert half_weight_dtype(ModelConfig(str(tmp_path), dtype=compute), device) == expected


@pytest.mark.parametrize("stored,expected", [(torch.bfloat16, torch.bfloat16),
                                             (torch.float32, None)])  # fmt: skip
def test_the_stored_tensors_decide_not_the_config(tmp_path, stored, expected):
    """A config.json that says bfloat16 over float32 tensors: keeping them in bf16 would
    round them, so they stay float32 (a .bin checkpoint is not read twice: float32)."""
    from safetensors.torch import save_file

    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                    "hidden_size": 64, "num_attention_heads": 2, "num_hidden_layers": 1,
                    "intermediate_size": 128, "vocab_size": 100, "dtype": "bfloat16"})
    )  # fmt: skip
    weights = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(4, 4, dtype=stored), "norm": torch.ones(4)}, str(weights))
    config = ModelConfig(str(tmp_path), dtype="float32")
    assert half_weight_dtype(config, "cpu", [weights]) == expected
    assert half_weight_dtype(config, "cpu", []) is None


def test_weights_updated_from_a_float32_checkpoint_are_not_rounded(demo_dir, tmp_path, monkeypatch):
    """update_weights_from_disk builds the new model by the new checkpoint's dtype: float32
    weights stay float32 (storing them bf16 would round them)."""
    worker = _worker(demo_dir, True, monkeypatch)
    hf = AutoModelForCausalLM.from_pretrained(demo_dir, dtype=torch.float32)  # not the cached one
    with torch.no_grad():
        hf.model.layers[0].mlp.down_proj.weight.add_(1e-4)  # not representable in bf16
    hf.save_pretrained(tmp_path)  # config.json says float32
    worker.model_runner.update_weights_from_disk(str(tmp_path))
    params = dict(worker.model_runner.model.named_parameters())
    down = params["model.layers.0.mlp.down_proj.weight"]
    assert down.dtype == torch.float32
    assert torch.equal(down, hf.model.layers[0].mlp.down_proj.weight)
