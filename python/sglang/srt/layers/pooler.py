"""Hidden states -> one embedding per request (decoder embedding models, `--is-embedding`).

Last-token pooling, as Qwen3-Embedding and other decoder embedders do: a
request's embedding is the final hidden state (after the model's last norm) of
its last prompt token, L2-normalised. In an EXTEND step each request's tokens
are contiguous, so the last token of request i sits at row
cumsum(extend_seq_lens)[i] - 1. For a chunked request only the last chunk's
row is meaningful; the scheduler ignores the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


@dataclass
class EmbeddingPoolerOutput:
    embeddings: torch.Tensor  # float32[bs, H], on the runner's device


class Pooler(nn.Module):
    """Last-token pooling with optional L2 normalisation (no parameters)."""

    def __init__(self, normalize: bool = True) -> None:
        super().__init__()
        self.normalize = normalize

    def forward(
        self, hidden_states: torch.Tensor, forward_batch: ForwardBatch
    ) -> EmbeddingPoolerOutput:
        """hidden_states: [num_tokens, H] of an EXTEND step -> [bs, H] float32."""
        if not forward_batch.forward_mode.is_extend():
            raise ValueError("embeddings are pooled from a prefill (EXTEND) step only")
        lens = torch.tensor(forward_batch.extend_seq_lens_cpu, device=hidden_states.device)
        last_rows = lens.cumsum(0) - 1
        pooled = hidden_states[last_rows].float()
        if self.normalize:
            pooled = F.normalize(pooled, p=2, dim=-1)
        return EmbeddingPoolerOutput(pooled)
