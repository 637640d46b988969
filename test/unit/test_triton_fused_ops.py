"""The fused-op Triton kernels against the torch layers, in the Triton interpreter on CPU.

Each kernel (RMSNorm with and without the fused residual add, Gemma's RMSNorm,
SiLU / GELU-and-mul, neox rotary under every scaling the models use, partial rotary)
must match the layer's torch path to 1e-4 in float32, over hidden sizes that are and
are not powers of two and token counts 0, 1 and more. Then the tiny Llama and Qwen3, with the
layers' dispatch forced onto the kernels on cpu, give the torch path's greedy tokens.

TRITON_INTERPRET must be set before a kernel module is imported (kernels are built at
import); the layers import them only when `fused_ops_enabled` says yes.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

from sglang.srt.layers import cpu_kernels, triton_ops  # noqa: E402
from sglang.srt.layers.activation import GeluAndMul, SiluAndMul  # noqa: E402
from sglang.srt.layers.layernorm import GemmaRMSNorm, RMSNorm  # noqa: E402
from sglang.srt.layers.rotary_embedding import get_rope  # noqa: E402
from sglang.srt.layers.triton_ops import activation, rmsnorm, rotary  # noqa: E402

TOL = 1e-4
HIDDEN = [48, 64, 128, 256, 257]
TOKENS = [0, 1, 7]


@pytest.fixture(autouse=True)
def _torch_reference():
    """The layers' torch ops are the reference here: our CPU kernels (which rotate and
    normalize in place) stay out of it; test_cpu_kernels.py checks them."""
    with cpu_kernels.disabled():
        yield


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, atol=TOL, rtol=TOL)


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_cpu_never_dispatches_unless_forced():
    assert not triton_ops.fused_ops_enabled(torch.zeros(2))


# ---- norms -----------------------------------------------------------------------


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("tokens", TOKENS)
def test_rms_norm(hidden, tokens):
    norm = RMSNorm(hidden, eps=1e-5)
    norm.weight.copy_(randn(hidden, seed=1))
    x, residual = randn(tokens, hidden), randn(tokens, hidden, seed=2)
    close(rmsnorm.rms_norm(x, norm.weight, 1e-5), norm(x))
    out, summed = rmsnorm.fused_add_rms_norm(x, residual, norm.weight, 1e-5)
    expected_out, expected_sum = norm(x, residual)
    close(out, expected_out)
    close(summed, expected_sum)


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("tokens", TOKENS)
def test_gemma_rms_norm(hidden, tokens):
    norm = GemmaRMSNorm(hidden, eps=1e-6)
    norm.weight.copy_(randn(hidden, seed=1))
    x = randn(tokens, hidden)
    close(rmsnorm.gemma_rms_norm(x, norm.weight, 1e-6), norm(x))


def test_norms_take_leading_dims_and_strided_rows():
    """Per-head q/k norms: [T, H, D] and a [T, H * D] column slice of a wider row."""
    norm = RMSNorm(64)
    norm.weight.copy_(randn(64, seed=1))
    wide = RMSNorm(256)
    wide.weight.copy_(randn(256, seed=4))
    q = randn(5, 6 * 64)[:, : 4 * 64]  # row stride 384
    close(rmsnorm.rms_norm(q, wide.weight, 1e-6), wide(q))
    x, residual = randn(2, 3, 64), randn(2, 3, 64, seed=3)
    out, summed = rmsnorm.fused_add_rms_norm(x, residual, norm.weight, 1e-6)
    expected_out, expected_sum = norm(x, residual)
    close(out, expected_out)
    close(summed, expected_sum)
    gemma = GemmaRMSNorm(64)
    close(rmsnorm.gemma_rms_norm(x, gemma.weight, 1e-6), gemma(x))


def test_fused_add_leaves_its_inputs_unchanged():
    x, residual = randn(3, 48), randn(3, 48, seed=1)
    before = (x.clone(), residual.clone())
    rmsnorm.fused_add_rms_norm(x, residual, torch.ones(48), 1e-6)
    assert torch.equal(x, before[0]) and torch.equal(residual, before[1])


# ---- gated activations -------------------------------------------------------------


@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("tokens", TOKENS)
def test_act_and_mul(hidden, tokens):
    x = randn(tokens, 2 * hidden) * 3
    close(activation.act_and_mul(x, "silu"), SiluAndMul()(x))
    close(activation.act_and_mul(x, "gelu_tanh"), GeluAndMul("tanh")(x))
    close(activation.act_and_mul(x, "gelu"), GeluAndMul("none")(x))


def test_act_and_mul_wider_than_one_program_and_leading_dims():
    x = randn(3, 2, 2 * 1500)  # d = 1500: two column blocks, the second part-masked
    close(activation.act_and_mul(x, "silu"), SiluAndMul()(x))
    wide = randn(4, 2 * 48 + 5)[:, : 2 * 48]  # rows with a stride past their width
    close(activation.act_and_mul(wide, "gelu_tanh"), GeluAndMul("tanh")(wide))


# ---- rotary ------------------------------------------------------------------------

SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64},
    "llama3": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
}  # fmt: skip


def positions_for(tokens: int, max_position: int) -> torch.Tensor:
    """Mixed requests' positions: shuffled, repeated, including 0 and the last one."""
    gen = torch.Generator().manual_seed(tokens)
    pos = torch.randint(0, max_position, (tokens,), generator=gen, dtype=torch.int64)
    if tokens >= 2:
        pos[0], pos[1] = 0, max_position - 1
    return pos


@pytest.mark.parametrize("scaling", list(SCALINGS))
@pytest.mark.parametrize("head_dim", [48, 64, 128])
@pytest.mark.parametrize("tokens", TOKENS)
def test_rotary(scaling, head_dim, tokens):
    rope = get_rope(head_dim, 128, 10000.0, SCALINGS[scaling])
    pos = positions_for(tokens, 128)
    q, k = randn(tokens, 4 * head_dim), randn(tokens, 2 * head_dim, seed=1)
    rotated_q = rotary.rotary_neox(pos, q, rope.cos_cache, rope.sin_cache, head_dim)
    rotated_k = rotary.rotary_neox(pos, k, rope.cos_cache, rope.sin_cache, head_dim)
    if tokens == 0:  # the torch path cannot view an empty batch per head; models never ask
        assert rotated_q.shape == (0, 4, head_dim) and rotated_k.shape == (0, 2, head_dim)
        return
    expected_q, expected_k = rope(pos, q, k)
    close(rotated_q.view(q.shape), expected_q)
    close(rotated_k.view(k.shape), expected_k)


@pytest.mark.parametrize("factor", [0.5, 0.25])
@pytest.mark.parametrize("head_dim", [48, 64, 128])
def test_partial_rotary(factor, head_dim):
    rope = get_rope(head_dim, 64, 10000.0, None, partial_rotary_factor=factor)
    pos = positions_for(9, 64)
    x = randn(9, 3 * head_dim)
    expected = rope.rotate_heads(pos, x)
    close(rotary.rotary_neox(pos, x, rope.cos_cache, rope.sin_cache, head_dim), expected)


def test_rotary_reads_q_and_k_side_by_side_from_qkv():
    """The Llama path rotates qkv[:, :qk_size], a column slice with qkv's row stride."""
    rope = get_rope(64, 32, 500000.0, SCALINGS["llama3"])
    pos = positions_for(6, 32)
    qkv = randn(6, (4 + 2 + 2) * 64)
    qk = qkv[:, : 6 * 64]
    expected = rope.rotate_heads(pos, qk)
    close(rotary.rotary_neox(pos, qk, rope.cos_cache, rope.sin_cache, 64), expected)
    assert torch.equal(qkv, randn(6, 8 * 64))  # the input is left unchanged


# ---- the layers' dispatch, through a whole model ----------------------------------


def greedy_tokens(model_dir: str) -> list[list[int]]:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.tp_worker import TpModelWorker
    from sglang.srt.runtime_context import get_context
    from sglang.test.runner_utils import MiniReq, MiniScheduler

    with get_context().override_server_args(
        model_path=model_dir, device="cpu", max_total_tokens=512
    ):
        worker = TpModelWorker(ModelConfig(model_dir))
    prompts = [list(range(10, 30)), [7, 8, 9]]
    tokens = MiniScheduler(worker).generate([MiniReq(p) for p in prompts], 4)
    worker.token_to_kv_pool_allocator.check_integrity()
    return tokens


@pytest.mark.parametrize("arch", ["llama", "qwen3"])  # qwen3: per-head q/k norms, then rotary
def test_tiny_model_greedy_matches_with_the_kernels_forced_on_cpu(
    arch, tiny_model_dir, monkeypatch
):
    model_dir = str(tiny_model_dir(arch))
    calls = {"rms_norm": 0, "fused_add_rms_norm": 0, "act_and_mul": 0, "rotary_neox": 0}
    for module, name in [(rmsnorm, "rms_norm"), (rmsnorm, "fused_add_rms_norm"),
                         (activation, "act_and_mul"), (rotary, "rotary_neox")]:  # fmt: skip
        monkeypatch.setattr(module, name, _counted(getattr(module, name), calls, name))
    torch_tokens = greedy_tokens(model_dir)
    assert not any(calls.values())
    monkeypatch.setattr(triton_ops, "fused_ops_enabled", lambda x: True)
    assert greedy_tokens(model_dir) == torch_tokens
    assert all(calls.values()), calls


def _counted(fn, calls: dict[str, int], name: str):
    def wrapper(*args, **kwargs):
        calls[name] += 1
        return fn(*args, **kwargs)

    return wrapper
