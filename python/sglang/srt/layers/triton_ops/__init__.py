"""Fused ops (RMSNorm, residual-add + RMSNorm, SiLU / GELU-and-mul, rotary) as Triton kernels.

The layer modules (`layernorm.py`, `activation.py`, `rotary_embedding.py`) ask
`fused_ops_enabled(x)` and call a kernel when it says yes: `x` on a cuda (or ROCm, which
torch also calls cuda) device and the triton package installed. Everywhere else, cpu
included, they keep their torch code unchanged. Nothing here imports triton; the kernel
modules (`rmsnorm.py`, `activation.py`, `rotary.py`) do, and are imported only on that
path, or by tests that set TRITON_INTERPRET=1 first to run them on cpu tensors.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

__all__ = ["fused_ops_enabled"]


@functools.cache
def _triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def fused_ops_enabled(x: torch.Tensor) -> bool:
    """Whether the layers run the Triton kernel for `x` (tests monkeypatch this on cpu)."""
    return x.is_cuda and _triton_installed()
