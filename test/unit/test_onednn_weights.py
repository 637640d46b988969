"""bf16 linears on oneDNN's GEMM over weights reordered at load (layers/onednn_weights.py),
as on CPUs with AMX tiles; forced on with SGLANG_CPU_ONEDNN_BF16=on so every CPU the
suite runs on checks the path (oneDNN runs bf16 without AMX too, only slower).

The loader reorders every linear weight and the lm_head of a bf16 model, and packs no
panels (nothing reads them); linear() takes the small-M kernel below ONEDNN_MIN_ROWS rows
and oneDNN over the reorder from there (F.linear without one), within bf16 rounding of
float32's result; off, or with float32 compute, nothing is reordered. Whole models on
this path against HF: test_bf16_parity.py; the C++ decoder layer: test_fused_decode.py.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang.demo_models import demo_target_path
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers import cpu_kernels
from sglang.srt.layers.linear import ONEDNN_ATTR, ONEDNN_MIN_ROWS, LinearBase, linear
from sglang.srt.layers.onednn_weights import reordered_of
from sglang.srt.layers.weight_panels import panels_of
from sglang.srt.model_loader.loader import get_model

BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}


@pytest.fixture(scope="module")
def kernels():
    module = cpu_kernels.load()
    assert module is not None, "the CPU kernels must build here"
    return module


def _bf16_linears(model) -> list[torch.Tensor]:
    return [m.weight for m in model.modules() if isinstance(m, LinearBase)]


def test_loader_reorders_a_bf16_models_linears_and_lm_head(kernels, onednn_bf16):
    onednn_bf16("on")
    model = get_model(ModelConfig(str(demo_target_path()), dtype=torch.bfloat16), "cpu")
    weights = [*_bf16_linears(model), model.lm_head.weight]
    assert weights and all(reordered_of(w) is not None for w in weights)
    assert all(panels_of(w) is None for w in weights)  # linear_packed never runs here


@pytest.mark.parametrize("choice,dtype", [("off", torch.bfloat16), ("on", torch.float32)])
def test_nothing_is_reordered_when_off_or_for_float32_compute(kernels, onednn_bf16, choice, dtype):
    onednn_bf16(choice)
    model = get_model(ModelConfig(str(demo_target_path()), dtype=dtype), "cpu")
    assert all(reordered_of(w) is None for w in [*_bf16_linears(model), model.lm_head.weight])


@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_takes_the_small_m_kernel_then_onednn(kernels, onednn_bf16, monkeypatch, with_bias):
    """Rows below ONEDNN_MIN_ROWS: linear_small_m; from there, oneDNN over the reorder
    (the same bits as calling it directly), or F.linear without one; never linear_packed.
    Each within bf16 rounding of float32's result."""
    onednn_bf16("on")
    small, packed = [], []
    real_small, real_packed = kernels.linear_small_m, kernels.linear_packed
    monkeypatch.setattr(kernels, "linear_small_m", lambda *a: small.append(a[1].shape[0]) or real_small(*a))
    monkeypatch.setattr(kernels, "linear_packed", lambda *a: packed.append(a[1].shape[0]) or real_packed(*a))
    w = (torch.randn(72, 96) / 10).bfloat16()
    b = torch.randn(72).bfloat16() if with_bias else None
    reordered = torch.ops.mkldnn._reorder_linear_weight(w)
    for rows in (1, ONEDNN_MIN_ROWS - 1, ONEDNN_MIN_ROWS, 40, 300):
        x = torch.randn(rows, 96).bfloat16()
        want = F.linear(x.float(), w.float(), None if b is None else b.float())
        plain = linear(x, w, b)
        torch.testing.assert_close(plain.float(), want, **BF16_TOL)
        setattr(w, ONEDNN_ATTR, reordered)
        out = linear(x, w, b)
        delattr(w, ONEDNN_ATTR)
        torch.testing.assert_close(out.float(), want, **BF16_TOL)
        if rows >= ONEDNN_MIN_ROWS:
            assert torch.equal(plain, F.linear(x, w, b))
            assert torch.equal(out, torch.ops.mkldnn._linear_pointwise(x, reordered, b, "none", [], ""))
    assert small == [1, 1, ONEDNN_MIN_ROWS - 1, ONEDNN_MIN_ROWS - 1]  # without, with the reorder
    assert packed == []


def test_the_kernels_off_keep_f_linear(kernels, onednn_bf16):
    """Inside cpu_kernels.disabled() (the torch reference), linear() is F.linear even over
    a reordered weight."""
    onednn_bf16("on")
    w = (torch.randn(40, 64) / 8).bfloat16()
    setattr(w, ONEDNN_ATTR, torch.ops.mkldnn._reorder_linear_weight(w))
    x = torch.randn(32, 64).bfloat16()
    with cpu_kernels.disabled():
        assert torch.equal(linear(x, w), F.linear(x, w))
