"""Vocabulary-parallel embedding and LM head: each TP rank holds a slice of the vocab."""

from __future__ import annotations

import torch
from torch import nn

from sglang.srt.layers.linear import embedding_rows, tensor_parallel_all_reduce


class VocabParallelEmbedding(nn.Module):
    def __init__(
        self, num_embeddings: int, embedding_dim: int, tp_rank: int = 0, tp_size: int = 1
    ) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.tp_rank, self.tp_size = tp_rank, tp_size
        per_rank = -(-num_embeddings // tp_size)  # ceil; the last shard may be padded
        self.vocab_start = tp_rank * per_rank
        self.vocab_end = min(num_embeddings, self.vocab_start + per_rank)
        self.weight = nn.Parameter(torch.empty(per_rank, embedding_dim), requires_grad=False)
        # the model's compute dtype (built under it as the default dtype); the weight may be
        # kept in a half checkpoint dtype (model_loader.loader.half_weight_dtype)
        self.compute_dtype = torch.get_default_dtype()
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        shard = loaded[self.vocab_start : self.vocab_end]
        if loaded.shape[1] != param.shape[1]:
            raise ValueError(
                f"embedding width mismatch: model {param.shape[1]}, checkpoint {loaded.shape[1]}"
            )
        param.data[: shard.shape[0]].copy_(shard)
        param.data[shard.shape[0] :].zero_()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: int64[T] -> [T, H]."""
        if self.tp_size == 1:
            return embedding_rows(input_ids, self.weight).to(self.compute_dtype)
        in_shard = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local_ids = torch.where(in_shard, input_ids - self.vocab_start, 0)
        rows = embedding_rows(local_ids, self.weight).to(self.compute_dtype)
        out = rows * in_shard.unsqueeze(-1).to(self.compute_dtype)
        return tensor_parallel_all_reduce(out, self.tp_size)


class ParallelLMHead(VocabParallelEmbedding):
    """Holds the output projection; the LogitsProcessor applies it."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("ParallelLMHead is applied by LogitsProcessor, not called directly")
