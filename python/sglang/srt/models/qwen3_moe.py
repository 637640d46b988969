"""Qwen3-MoE: the Qwen3 layout with sparse expert blocks in place of (most) dense MLPs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from sglang.srt.layers.moe import moe_block_from_config
from sglang.srt.model_loader.weight_mapping import load_stacked_weights
from sglang.srt.models.llama import LlamaMLP, check_silu_mlp
from sglang.srt.models.qwen3 import Qwen3DecoderLayer, Qwen3ForCausalLM, Qwen3Model

if TYPE_CHECKING:
    from sglang.srt.configs.model_config import ModelConfig


def is_sparse_layer(config: ModelConfig, layer_id: int) -> bool:
    """HF's rule: every `decoder_sparse_step`-th layer is sparse, unless in `mlp_only_layers`."""
    step = int(config.raw.get("decoder_sparse_step") or 1)
    dense_only = config.raw.get("mlp_only_layers") or []
    return config.num_experts > 0 and layer_id not in dense_only and (layer_id + 1) % step == 0


class Qwen3MoeDecoderLayer(Qwen3DecoderLayer):
    def make_mlp(self, config: ModelConfig, layer_id: int, tp: dict[str, int]) -> nn.Module:
        if is_sparse_layer(config, layer_id):
            check_silu_mlp(config)  # the experts are SiLU gated MLPs too
            return moe_block_from_config(config, tp, renormalize=config.norm_topk_prob)
        return LlamaMLP(config, tp)


class Qwen3MoeModel(Qwen3Model):
    layer_cls = Qwen3MoeDecoderLayer


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    model_cls = Qwen3MoeModel
    # per-expert checkpoint projection -> (stacked expert parameter, part)
    expert_params_mapping = {
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
        "down_proj": ("down_proj", None),
    }

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_stacked_weights(
            self,
            weights,
            self.stacked_params_mapping,
            tied_embeddings=self.config.tie_word_embeddings,
            expert_params_mapping=self.expert_params_mapping,
            num_experts=self.config.num_experts,
        )


EntryClass = [Qwen3MoeForCausalLM]
