"""Activations."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sglang.srt.layers import cpu_kernels, triton_ops


class SiluAndMul(nn.Module):
    """x: [T, 2 * d] laid out as [gate | up] -> silu(gate) * up: [T, d]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if triton_ops.fused_ops_enabled(x):
            from sglang.srt.layers.triton_ops.activation import act_and_mul

            return act_and_mul(x, "silu")
        d = x.shape[-1] // 2
        if cpu_kernels.usable(x) and x.dim() == 2:
            out = x.new_empty(x.shape[0], d)
            cpu_kernels.load().silu_and_mul_out(out, x)
            return out
        return F.silu(x[..., :d]) * x[..., d:]


class GeluAndMul(nn.Module):
    """x: [T, 2 * d] laid out as [gate | up] -> gelu(gate) * up: [T, d] (Gemma: tanh gelu)."""

    def __init__(self, approximate: str = "tanh") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if triton_ops.fused_ops_enabled(x) and self.approximate in ("tanh", "none"):
            from sglang.srt.layers.triton_ops.activation import act_and_mul

            return act_and_mul(x, "gelu_tanh" if self.approximate == "tanh" else "gelu")
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d], approximate=self.approximate) * x[..., d:]
