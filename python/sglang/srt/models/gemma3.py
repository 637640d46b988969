"""Gemma 3 (text, `Gemma3ForCausalLM`): Gemma 2's layout with per-head (1 + weight)
RMSNorm on q and k before rotary, and a rotary embedding per layer type (local theta
for sliding layers, global theta and scaling for full ones); soft-capping only where
the config sets it. Bidirectional (embedding) configs are refused.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.layers.rotary_embedding import RotaryEmbedding, get_rope
from sglang.srt.models.gemma2 import (
    Gemma2Attention,
    Gemma2DecoderLayer,
    Gemma2ForCausalLM,
    Gemma2Model,
)

_DEFAULT_THETA = {"full_attention": 1_000_000.0, "sliding_attention": 10_000.0}


class Gemma3Attention(Gemma2Attention):
    qk_norm = True
    attn_softcap = False


class Gemma3DecoderLayer(Gemma2DecoderLayer):
    attention_cls = Gemma3Attention


class Gemma3Model(Gemma2Model):
    layer_cls = Gemma3DecoderLayer

    @staticmethod
    def make_ropes(config: ModelConfig) -> dict[str, RotaryEmbedding]:
        ropes = {}
        for layer_type in set(config.layer_types):
            theta, scaling = _rope_params(config.raw, layer_type)
            ropes[layer_type] = get_rope(
                config.head_dim, config.max_position_embeddings, theta, scaling,
                cache_len=config.context_len,
            )  # fmt: skip
        return ropes


def _rope_params(raw: dict[str, Any], layer_type: str) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling or None) of a layer type, from transformers-5 `rope_parameters`
    ({layer_type: {...}}) or the transformers-4 keys (`rope_theta` and `rope_scaling` for
    full layers, `rope_local_base_freq` for sliding ones)."""
    params = dict((raw.get("rope_parameters") or {}).get(layer_type) or {})
    if layer_type == "full_attention":
        theta = params.get("rope_theta") or raw.get("rope_theta")
        if not params and raw.get("rope_scaling"):
            params = dict(raw["rope_scaling"])
    else:
        theta = params.get("rope_theta") or raw.get("rope_local_base_freq")
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    scaling.setdefault("rope_type", scaling.get("type", "default"))
    if scaling["rope_type"] == "default":
        scaling = None
    return float(theta or _DEFAULT_THETA[layer_type]), scaling


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    model_cls = Gemma3Model

    def __init__(self, config: ModelConfig, tp_rank: int = 0, tp_size: int = 1) -> None:
        if config.raw.get("use_bidirectional_attention"):
            raise ValueError("Gemma 3 with use_bidirectional_attention is not supported")
        super().__init__(config, tp_rank, tp_size)


EntryClass = [Gemma3ForCausalLM]
