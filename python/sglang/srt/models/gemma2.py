"""Gemma 2: sliding-window and global attention layers interleaved (`layer_types`),
tanh soft-capped attention scores and final logits, (1 + weight) RMSNorm before and
after both sublayers, embeddings scaled by sqrt(hidden_size), queries scaled by
query_pre_attn_scalar ** -0.5, tanh-GELU MLP, tied embeddings.

Sliding layers attend within their window (the attention backend masks or gathers the
last `sliding_window` keys); KV outside every window is not freed (see
torch_native_backend).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from sglang.srt.layers.activation import GeluAndMul
from sglang.srt.layers.layernorm import GemmaRMSNorm
from sglang.srt.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from sglang.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import RotaryEmbedding, get_rope
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.model_loader.weight_mapping import load_stacked_weights

if TYPE_CHECKING:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

_GELU_TANH = ("gelu_pytorch_tanh", "gelu_tanh")


def gemma_tied_embeddings(config: ModelConfig) -> bool:
    """Gemma ties its LM head to the embeddings unless config.json says otherwise."""
    return bool(config.raw.get("tie_word_embeddings", True))


class GemmaMLP(nn.Module):
    def __init__(self, config: ModelConfig, tp: dict[str, int]) -> None:
        super().__init__()
        act = config.raw.get("hidden_activation") or config.raw.get("hidden_act")
        if act not in _GELU_TANH:
            raise ValueError(f"unsupported Gemma activation {act!r}; supported: {_GELU_TANH}")
        h, i = config.hidden_size, config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(h, [i, i], bias=False, **tp)
        self.down_proj = RowParallelLinear(i, h, bias=False, **tp)
        self.act_fn = GeluAndMul("tanh")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class Gemma2Attention(nn.Module):
    qk_norm = False  # Gemma 3 sets True
    attn_softcap = True  # Gemma 3 keeps attn_logit_softcapping in its config but, as in
    # HF's Gemma3Attention, does not apply it

    def __init__(
        self, config: ModelConfig, layer_id: int, tp: dict[str, int], rotary_emb: RotaryEmbedding
    ) -> None:
        super().__init__()
        raw, tp_size = config.raw, tp["tp_size"]
        self.head_dim = d = config.head_dim
        self.num_heads = config.num_attention_heads // tp_size
        self.num_kv_heads = config.get_num_kv_heads(tp_size)
        self.q_size, self.kv_size = self.num_heads * d, self.num_kv_heads * d
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            d,
            config.num_attention_heads,
            config.num_key_value_heads,
            bias=config.attention_bias,
            **tp,
        )
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * d, config.hidden_size, bias=config.attention_bias, **tp
        )
        self.rotary_emb = rotary_emb  # shared by the layers of one type
        if self.qk_norm:
            self.q_norm = GemmaRMSNorm(d, eps=config.rms_norm_eps)
            self.k_norm = GemmaRMSNorm(d, eps=config.rms_norm_eps)
        self.attn = RadixAttention(
            self.num_heads,
            d,
            float(raw.get("query_pre_attn_scalar") or d) ** -0.5,
            self.num_kv_heads,
            layer_id,
            sliding_window_size=config.layer_windows[layer_id],
            logit_cap=raw.get("attn_logit_softcapping") if self.attn_softcap else None,
        )

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """hidden_states: [T, H] -> [T, H]."""
        qkv = self.qkv_proj(hidden_states)  # [T, (Hq + 2 Hkv) * D]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm:  # per head, before rotary
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(q.shape)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(k.shape)
        q, k = self.rotary_emb(positions, q, k)
        return self.o_proj(self.attn(q, k, v, forward_batch))


class Gemma2DecoderLayer(nn.Module):
    attention_cls = Gemma2Attention

    def __init__(
        self, config: ModelConfig, layer_id: int, tp: dict[str, int], rotary_emb: RotaryEmbedding
    ) -> None:
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = self.attention_cls(config, layer_id, tp, rotary_emb)
        self.mlp = GemmaMLP(config, tp)
        self.input_layernorm = GemmaRMSNorm(h, eps=eps)
        self.post_attention_layernorm = GemmaRMSNorm(h, eps=eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(h, eps=eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(h, eps=eps)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """[T, H] -> [T, H]; each sublayer is normed on the way in and out, then added."""
        attn = self.self_attn(positions, self.input_layernorm(hidden_states), forward_batch)
        hidden_states = hidden_states + self.post_attention_layernorm(attn)
        mlp = self.mlp(self.pre_feedforward_layernorm(hidden_states))
        return hidden_states + self.post_feedforward_layernorm(mlp)


class Gemma2Model(nn.Module):
    layer_cls = Gemma2DecoderLayer

    def __init__(self, config: ModelConfig, tp: dict[str, int]) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, **tp)
        self.normalizer = config.hidden_size**0.5
        ropes = self.make_ropes(config)
        self.rotary_embs = nn.ModuleList({id(r): r for r in ropes.values()}.values())
        self.layers = nn.ModuleList(
            [
                self.layer_cls(config, i, tp, ropes[config.layer_types[i]])
                for i in range(config.num_hidden_layers)
            ]
        )
        self.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    @staticmethod
    def make_ropes(config: ModelConfig) -> dict[str, RotaryEmbedding]:
        """The rotary embedding of each layer type (Gemma 2: one for all layers)."""
        rope = get_rope(
            config.head_dim,
            config.max_position_embeddings,
            config.rope_theta,
            config.rope_scaling,
            cache_len=config.context_len,
        )
        return {t: rope for t in set(config.layer_types)}

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """input_ids, positions: int64[T] -> hidden states [T, H]."""
        hidden_states = self.embed_tokens(input_ids)
        # HF casts the scale to the weights' dtype before multiplying
        hidden_states = hidden_states * torch.tensor(self.normalizer, dtype=hidden_states.dtype)
        for rope in self.rotary_embs:
            rope.prepare(positions)
        for layer in self.layers:
            hidden_states = layer(positions, hidden_states, forward_batch)
        return self.norm(hidden_states)


class Gemma2ForCausalLM(nn.Module):
    model_cls = Gemma2Model
    # checkpoint name fragment -> (param name fragment, shard id)
    stacked_params_mapping = [
        ("q_proj", "qkv_proj", "q"),
        ("k_proj", "qkv_proj", "k"),
        ("v_proj", "qkv_proj", "v"),
        ("gate_proj", "gate_up_proj", 0),
        ("up_proj", "gate_up_proj", 1),
    ]

    def __init__(self, config: ModelConfig, tp_rank: int = 0, tp_size: int = 1) -> None:
        super().__init__()
        self.config = config
        tp = {"tp_rank": tp_rank, "tp_size": tp_size}
        self.model = self.model_cls(config, tp)
        self.tied = gemma_tied_embeddings(config)
        if self.tied:
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, **tp)
        self.logits_processor = LogitsProcessor(
            config.vocab_size, tp_size, config.raw.get("final_logit_softcapping")
        )

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> LogitsProcessorOutput:
        hidden_states = self.model(input_ids, positions, forward_batch)
        return self.logits_processor(hidden_states, self.lm_head, forward_batch)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors into the (stacked, TP-sharded) parameters."""
        load_stacked_weights(self, weights, self.stacked_params_mapping, tied_embeddings=self.tied)


EntryClass = [Gemma2ForCausalLM]
