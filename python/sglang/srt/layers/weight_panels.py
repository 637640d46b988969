"""bf16 linear weights re-laid out once at load for the many-row CPU linear
(`linear_packed`): each call otherwise packs every 16-column panel of the weight again
(widened and transposed), which at a 32-stream decode step was 12% of the served
scheduler's samples on a 2-core Zen 2 (benchmark/RESULTS.md, twelfth session).

The panels (`kernels.pack_weight_panels`, layout in sgl-kernel/csrc/cpu/gemm_packed.cpp)
hang off the weight tensor as `weight.cpu_panels`, so every caller of `linear` (the
modules, the logits' lm_head, the fused decode layers) finds them without a new argument.
The bf16 dot-product path (all-bf16 compute on CPUs with avx512_bf16) packs the same
layout per call (gemm_packed_bf16.cpp): 9% of the served scheduler's samples at 32
streams on a 2-core AVX-512 EPYC, so it reads these panels too.

They are a second copy of the weight's bytes: built only where they are read (a bf16
checkpoint run in float32 on a vector build of the kernels, or in bf16 where the kernels
have the bf16 dot product; SGLANG_CPU_WEIGHT_PANELS on), at load time, when the weights
are final; a weight update builds a new model and so new panels.
"""

from __future__ import annotations

import logging

import psutil
import torch
from torch import nn

from sglang.srt.environ import envs
from sglang.srt.layers import cpu_kernels
from sglang.srt.layers.linear import PANELS_ATTR, LinearBase

logger = logging.getLogger(__name__)

# The panels are a second copy of the linear weights: packed only while they take at most
# this share of the memory available at load (a large model on a small machine keeps
# packing per call rather than risk running out of memory).
MAX_AVAILABLE_FRACTION = 0.25


def panels_of(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight's panels packed at load, or None."""
    return getattr(weight, PANELS_ATTR, None)


def attach(model: nn.Module, compute_dtype: torch.dtype) -> None:
    """Pack the panels of the model's bf16 linear weights (and its lm_head's) when the
    kernels will read them: float32 compute over bf16 weights on a vector build, or bf16
    compute where the kernels have the bf16 dot product."""
    if compute_dtype not in (torch.float32, torch.bfloat16):
        return
    if not envs.SGLANG_CPU_WEIGHT_PANELS.get():
        return
    kernels = cpu_kernels.load()
    if kernels is None or kernels.weight_panel_width == 0:
        return
    if compute_dtype == torch.bfloat16 and not kernels.bf16_dot:
        return
    weights = [
        w
        for w in _linear_weights(model)
        if w.dtype == torch.bfloat16 and w.dim() == 2 and w.is_contiguous()
    ]
    width = kernels.weight_panel_width
    total_bytes = sum(_panel_bytes(w, width) for w in weights)
    budget_bytes = int(psutil.virtual_memory().available * MAX_AVAILABLE_FRACTION)
    if total_bytes > budget_bytes:
        logger.info(
            "linear weight panels not packed: %.1f MiB is over %.0f%% of the available "
            "memory (%.1f MiB); each call packs its own (SGLANG_CPU_WEIGHT_PANELS=0 skips "
            "this check)",
            total_bytes / 2**20, 100 * MAX_AVAILABLE_FRACTION, budget_bytes / 2**20,
        )  # fmt: skip
        return
    for weight in weights:
        setattr(weight, PANELS_ATTR, kernels.pack_weight_panels(weight))
    if total_bytes:
        logger.info("linear weight panels packed at load: %.1f MiB", total_bytes / 2**20)


def _panel_bytes(weight: torch.Tensor, width: int) -> int:
    """Bytes of pack_weight_panels(weight): [ceil(N / width), ceil(K / 2), width] int32."""
    n, k = weight.shape
    return -(-n // width) * ((k + 1) // 2) * width * 4


def _linear_weights(model: nn.Module) -> list[torch.Tensor]:
    """Each linear layer's weight and the lm_head's (a tied embedding's too), once each."""
    weights = [m.weight for m in model.modules() if isinstance(m, LinearBase)]
    lm_head = getattr(model, "lm_head", None)
    if lm_head is not None and isinstance(getattr(lm_head, "weight", None), torch.Tensor):
        weights.append(lm_head.weight)
    unique: dict[int, torch.Tensor] = {}
    for w in weights:
        unique.setdefault(id(w), w)
    return list(unique.values())
