"""RMSNorm (Llama's, with an optional fused residual add; Gemma's, scaling by 1 + weight)."""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.layers import cpu_kernels, triton_ops


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.variance_epsilon = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x: [T, H]. With `residual`, returns (norm(x + residual), x + residual); on the
        CPU kernels' path those are x and residual themselves, updated in place."""
        if triton_ops.fused_ops_enabled(x):
            return self._forward_triton(x, residual)
        if cpu_kernels.usable(x) and x.dim() == 2:
            return self._forward_cpu_kernel(x, residual)
        if residual is not None:
            x = x + residual
            return self._norm(x), x
        return self._norm(x)

    def _forward_triton(self, x: torch.Tensor, residual: torch.Tensor | None):
        from sglang.srt.layers.triton_ops import rmsnorm

        if residual is None:
            return rmsnorm.rms_norm(x, self.weight, self.variance_epsilon)
        return rmsnorm.fused_add_rms_norm(x, residual, self.weight, self.variance_epsilon)

    def _forward_cpu_kernel(self, x: torch.Tensor, residual: torch.Tensor | None):
        kernels = cpu_kernels.load()
        if residual is None:
            out = torch.empty_like(x, memory_format=torch.contiguous_format)
            kernels.rmsnorm_out(out, x, self.weight, self.variance_epsilon)
            return out
        kernels.fused_add_rmsnorm_(x, residual, self.weight, self.variance_epsilon)
        return x, residual

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # HF's formula op for op (float32 statistics, cast back before the weight);
        # F.rms_norm is a slower composite of more ops on CPU
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * h.to(x.dtype)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: scales by (1 + weight), in float32, then casts back (HF op for op)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., H] -> [..., H]."""
        if triton_ops.fused_ops_enabled(x):
            from sglang.srt.layers.triton_ops import rmsnorm

            return rmsnorm.gemma_rms_norm(x, self.weight, self.variance_epsilon)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (h * (1.0 + self.weight.float())).to(x.dtype)
