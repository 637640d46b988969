"""bf16 linear weights reordered once at load into oneDNN's blocked layout, for the
many-row linears on CPUs where oneDNN serves bf16 GEMMs (`cpu_kernels.onednn_bf16_gemm`:
AMX tiles, or SGLANG_CPU_ONEDNN_BF16=on).

F.linear hands oneDNN the [out, in] weight, which it reorders into its tile layout on
every call; `torch.ops.mkldnn._reorder_linear_weight` does that once, and
`torch.ops.mkldnn._linear_pointwise` multiplies by the result (what inductor's freezing
does). On a 2-core AMX Xeon that was 1.1-1.8x F.linear at 8-256 rows and 2.5-10x our
bf16 dot-product kernel from 16 rows (benchmark/RESULTS.md).

The reorder is an opaque mkldnn tensor hung off the weight as `weight.cpu_onednn` (see
`linear.ONEDNN_ATTR`), so every caller of `linear` (the modules, the logits' lm_head, the
fused decode layers) finds it. It is a second copy of the weight's bytes (the small-M
kernel keeps reading the row-major weight at 1-4 rows, where it is 1.3-3.7x faster), so
it replaces the load-time panels, which only linear_packed reads; built at load, when
the weights are final; a weight update builds a new model and so new reorders.
"""

from __future__ import annotations

import logging

import psutil
import torch
from torch import nn

from sglang.srt.layers import cpu_kernels
from sglang.srt.layers.linear import ONEDNN_ATTR
from sglang.srt.layers.weight_panels import MAX_AVAILABLE_FRACTION, linear_weights

logger = logging.getLogger(__name__)


def reordered_of(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight's oneDNN reorder made at load, or None."""
    return getattr(weight, ONEDNN_ATTR, None)


def attach(model: nn.Module, compute_dtype: torch.dtype) -> bool:
    """Reorder the model's bf16 linear weights (and its lm_head's) for oneDNN when the
    compute is bf16 and oneDNN serves bf16 GEMMs here; whether it did."""
    if compute_dtype != torch.bfloat16 or not cpu_kernels.onednn_bf16_gemm():
        return False
    if cpu_kernels.load() is None:  # the routing in `linear` goes with the kernels
        return False
    weights = [
        w
        for w in linear_weights(model)
        if w.dtype == torch.bfloat16 and w.dim() == 2 and w.is_contiguous()
    ]
    total_bytes = sum(w.numel() * w.element_size() for w in weights)
    budget_bytes = int(psutil.virtual_memory().available * MAX_AVAILABLE_FRACTION)
    if total_bytes > budget_bytes:
        logger.info(
            "linear weights not reordered for oneDNN: %.1f MiB is over %.0f%% of the "
            "available memory (%.1f MiB); F.linear reorders per call",
            total_bytes / 2**20, 100 * MAX_AVAILABLE_FRACTION, budget_bytes / 2**20,
        )  # fmt: skip
        return False
    for weight in weights:
        setattr(weight, ONEDNN_ATTR, torch.ops.mkldnn._reorder_linear_weight(weight))
    if total_bytes:
        logger.info("linear weights reordered for oneDNN's bf16 GEMM: %.1f MiB", total_bytes / 2**20)
    return bool(weights)
