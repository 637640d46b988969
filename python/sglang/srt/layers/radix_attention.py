"""The attention layer models use; the backend in the ForwardBatch does the work."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class RadixAttention(nn.Module):
    def __init__(
        self,
        num_heads: int,
        head_dim: int,
        scaling: float,
        num_kv_heads: int,
        layer_id: int,
        *,
        sliding_window_size: int | None = None,
        logit_cap: float | None = None,
    ) -> None:
        """sliding_window_size: a query sees this many keys, itself included (HF's
        `sliding_window`); None = full causal attention. logit_cap: scores become
        cap * tanh(scores / cap) before masking and softmax; None = no cap."""
        super().__init__()
        if sliding_window_size is not None and sliding_window_size < 1:
            raise ValueError(f"sliding_window_size must be >= 1, got {sliding_window_size}")
        self.tp_q_head_num = num_heads
        self.tp_k_head_num = num_kv_heads
        self.head_dim = head_dim
        self.scaling = scaling
        self.layer_id = layer_id
        self.sliding_window_size = sliding_window_size
        self.logit_cap = logit_cap or None

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """q: [T, Hq * D]; k, v: [T, Hkv * D] -> [T, Hq * D]."""
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch, save_kv_cache)
