"""bf16 linear weights re-laid out once at load for the many-row CPU linear
(`linear_packed`): each call otherwise packs every 16-column panel of the weight again
(widened and transposed), which at a 32-stream decode step was 12% of the served
scheduler's samples on a 2-core Zen 2 (benchmark/RESULTS.md, twelfth session).

The panels (`kernels.pack_weight_panels`, layout in sgl-kernel/csrc/cpu/gemm_packed.cpp)
hang off the weight tensor as `weight.cpu_panels`, so every caller of `linear` (the
modules, the logits' lm_head, the fused decode layers) finds them without a new argument.
They are a second copy of the weight's bytes: built only where they are read (a bf16
checkpoint run in float32 on a vector build of the kernels, SGLANG_CPU_WEIGHT_PANELS on),
at load time, when the weights are final; a weight update builds a new model and so new
panels.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from sglang.srt.environ import envs
from sglang.srt.layers import cpu_kernels
from sglang.srt.layers.linear import PANELS_ATTR, LinearBase

logger = logging.getLogger(__name__)


def panels_of(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight's panels packed at load, or None."""
    return getattr(weight, PANELS_ATTR, None)


def attach(model: nn.Module, compute_dtype: torch.dtype) -> None:
    """Pack the panels of the model's bf16 linear weights (and its lm_head's) when the
    kernels will read them: float32 compute over bf16 weights on a vector build."""
    if compute_dtype != torch.float32 or not envs.SGLANG_CPU_WEIGHT_PANELS.get():
        return
    kernels = cpu_kernels.load()
    if kernels is None or kernels.weight_panel_width == 0:
        return
    total_bytes = 0
    for weight in _linear_weights(model):
        if weight.dtype == torch.bfloat16 and weight.dim() == 2 and weight.is_contiguous():
            panels = kernels.pack_weight_panels(weight)
            setattr(weight, PANELS_ATTR, panels)
            total_bytes += panels.numel() * panels.element_size()
    if total_bytes:
        logger.info("linear weight panels packed at load: %.1f MiB", total_bytes / 2**20)


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
