"""Mixtral: the Llama/Mistral layout with a sparse expert block (`block_sparse_moe`) per layer."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from sglang.srt.layers.moe import moe_block_from_config
from sglang.srt.model_loader.weight_mapping import load_stacked_weights
from sglang.srt.models.llama import (
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    check_silu_mlp,
)

if TYPE_CHECKING:
    from sglang.srt.configs.model_config import ModelConfig


class MixtralDecoderLayer(LlamaDecoderLayer):
    def make_mlp(self, config: ModelConfig, layer_id: int, tp: dict[str, int]) -> nn.Module:
        check_silu_mlp(config)  # its experts are SiLU gated MLPs
        return moe_block_from_config(config, tp, renormalize=True)  # Mixtral always renormalises


class MixtralModel(LlamaModel):
    layer_cls = MixtralDecoderLayer


class MixtralForCausalLM(LlamaForCausalLM):
    model_cls = MixtralModel
    # w1 = gate, w3 = up, w2 = down
    expert_params_mapping = {
        "w1": ("gate_up_proj", 0),
        "w3": ("gate_up_proj", 1),
        "w2": ("down_proj", None),
    }

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_stacked_weights(
            self,
            _block_sparse_moe_as_mlp(weights),
            self.stacked_params_mapping,
            tied_embeddings=self.config.tie_word_embeddings,
            expert_params_mapping=self.expert_params_mapping,
            num_experts=self.config.num_experts,
        )


def _block_sparse_moe_as_mlp(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[tuple[str, torch.Tensor]]:
    """The layer's feed-forward is `mlp` here, `block_sparse_moe` in checkpoints."""
    for name, tensor in weights:
        yield name.replace(".block_sparse_moe.", ".mlp."), tensor


EntryClass = [MixtralForCausalLM]
