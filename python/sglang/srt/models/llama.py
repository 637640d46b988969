"""Llama (and Mistral-style configs: same layout, GQA, optional explicit head_dim, sliding
windows per `ModelConfig.layer_windows`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from sglang.srt.layers import fused_decode
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from sglang.srt.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from sglang.srt.layers.pooler import EmbeddingPoolerOutput, Pooler
from sglang.srt.layers.radix_attention import RadixAttention
from sglang.srt.layers.rotary_embedding import RotaryEmbedding, get_rope
from sglang.srt.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from sglang.srt.model_loader.weight_mapping import load_stacked_weights

if TYPE_CHECKING:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


def check_silu_mlp(config: ModelConfig) -> None:
    """The gated MLP here (and the fused decode layers) is SiLU without biases: a config
    asking for another activation or for MLP biases is refused by name, not run wrong."""
    act = config.raw.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(
            f"hidden_act={act!r} in config.json is not supported for "
            f"{config.architectures[0]} (supported: 'silu')"
        )
    if config.raw.get("mlp_bias"):
        raise ValueError(
            f"mlp_bias=true in config.json is not supported for {config.architectures[0]}"
        )


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig, tp: dict[str, int]) -> None:
        super().__init__()
        check_silu_mlp(config)
        h, i = config.hidden_size, config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(h, [i, i], bias=False, **tp)
        self.down_proj = RowParallelLinear(i, h, bias=False, **tp)
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class LlamaAttention(nn.Module):
    qkv_bias = False  # Qwen2 sets True
    qk_norm = False  # Qwen3 sets True

    def __init__(
        self, config: ModelConfig, layer_id: int, tp: dict[str, int], rotary_emb: RotaryEmbedding
    ) -> None:
        super().__init__()
        tp_size = tp["tp_size"]
        self.head_dim = d = config.head_dim
        self.num_heads = config.num_attention_heads // tp_size
        self.num_kv_heads = config.get_num_kv_heads(tp_size)
        self.q_size, self.kv_size = self.num_heads * d, self.num_kv_heads * d
        bias = self.qkv_bias or config.attention_bias
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            d,
            config.num_attention_heads,
            config.num_key_value_heads,
            bias=bias,
            **tp,
        )
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * d, config.hidden_size, bias=config.attention_bias, **tp
        )
        self.rotary_emb = rotary_emb  # shared by all layers; cos/sin built once per forward
        if self.qk_norm:
            self.q_norm = RMSNorm(d, eps=config.rms_norm_eps)
            self.k_norm = RMSNorm(d, eps=config.rms_norm_eps)
        self.attn = RadixAttention(
            self.num_heads,
            d,
            d**-0.5,
            self.num_kv_heads,
            layer_id,
            sliding_window_size=config.layer_windows[layer_id],
        )

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """hidden_states: [T, H] -> [T, H]."""
        qkv = self.qkv_proj(hidden_states)  # [T, (Hq + 2 Hkv) * D]
        t, qk_size = qkv.shape[0], self.q_size + self.kv_size
        if self.qk_norm:
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q, k = self._norm_heads(q, self.q_norm), self._norm_heads(k, self.k_norm)
            q, k = self.rotary_emb(positions, q, k)
        else:  # q and k rotated together: [T, Hq + Hkv, D]
            qk = self.rotary_emb.rotate_heads(positions, qkv[:, :qk_size]).view(t, qk_size)
            q, k, v = qk[:, : self.q_size], qk[:, self.q_size :], qkv[:, qk_size:]
        return self.o_proj(self.attn(q, k, v, forward_batch))

    def _norm_heads(self, x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        shape = x.shape
        return norm(x.reshape(-1, self.head_dim)).view(shape)


class LlamaDecoderLayer(nn.Module):
    attention_cls = LlamaAttention

    def __init__(
        self, config: ModelConfig, layer_id: int, tp: dict[str, int], rotary_emb: RotaryEmbedding
    ) -> None:
        super().__init__()
        self.self_attn = self.attention_cls(config, layer_id, tp, rotary_emb)
        self.mlp = self.make_mlp(config, layer_id, tp)
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def make_mlp(self, config: ModelConfig, layer_id: int, tp: dict[str, int]) -> nn.Module:
        """The layer's feed-forward block, [T, H] -> [T, H] (MoE models override)."""
        return LlamaMLP(config, tp)

    def forward(
        self,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        forward_batch: ForwardBatch,
        residual: torch.Tensor | None,
    ):
        """Returns (hidden_states, residual), both [T, H]; the add is fused into the norms."""
        if residual is None:
            residual = hidden_states
            hidden_states = self.input_layernorm(hidden_states)
        else:
            hidden_states, residual = self.input_layernorm(hidden_states, residual)
        hidden_states = self.self_attn(positions, hidden_states, forward_batch)
        hidden_states, residual = self.post_attention_layernorm(hidden_states, residual)
        return self.mlp(hidden_states), residual


class LlamaModel(nn.Module):
    layer_cls = LlamaDecoderLayer

    def __init__(self, config: ModelConfig, tp: dict[str, int]) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, **tp)
        # every head dim rotates: transformers' Llama-family rope reads no
        # partial_rotary_factor (ModelConfig warns when a config.json sets one)
        self.rotary_emb = get_rope(
            config.head_dim,
            config.max_position_embeddings,
            config.rope_theta,
            config.rope_scaling,
            cache_len=config.context_len,
        )
        self.layers = nn.ModuleList(
            [
                self.layer_cls(config, i, tp, self.rotary_emb)
                for i in range(config.num_hidden_layers)
            ]
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """input_ids, positions: int64[T] -> hidden states [T, H]."""
        hidden_states, residual = self.embed_tokens(input_ids), None
        self.rotary_emb.prepare(positions)
        step = fused_decode.decode_step(self.layers, self.rotary_emb, positions, forward_batch)
        for layer in self.layers:
            if step is not None:  # decode on CPU: one C++ call per layer
                hidden_states, residual = fused_decode.run_layer(
                    layer, hidden_states, residual, step, forward_batch
                )
            else:
                hidden_states, residual = layer(positions, hidden_states, forward_batch, residual)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class LlamaForCausalLM(nn.Module):
    model_cls = LlamaModel
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
        if config.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, **tp)
        self.logits_processor = LogitsProcessor(config.vocab_size, tp_size)
        self.pooler = Pooler(normalize=True)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: ForwardBatch,
        get_embedding: bool = False,
    ) -> LogitsProcessorOutput | EmbeddingPoolerOutput:
        """Logits of each request's next token, or (get_embedding) its pooled embedding."""
        hidden_states = self.model(input_ids, positions, forward_batch)
        if get_embedding:
            return self.pooler(hidden_states, forward_batch)
        return self.logits_processor(hidden_states, self.lm_head, forward_batch)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy checkpoint tensors into the (stacked, TP-sharded) parameters.

        A headless checkpoint (the base model's tensors without the `model.` prefix and
        no lm_head, as embedding checkpoints such as Qwen3-Embedding are saved) loads
        too; `has_lm_head` then says whether it can generate."""
        loaded = load_stacked_weights(
            self,
            _with_model_prefix(weights),
            self.stacked_params_mapping,
            tied_embeddings=self.config.tie_word_embeddings,
            optional=("lm_head.weight",),
        )
        self.has_lm_head = self.config.tie_word_embeddings or "lm_head.weight" in loaded


def _with_model_prefix(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterable[tuple[str, torch.Tensor]]:
    for name, tensor in weights:
        if not name.startswith(("model.", "lm_head.")):
            name = "model." + name
        yield name, tensor


EntryClass = [LlamaForCausalLM]
EntryClassAliases = {"MistralForCausalLM": LlamaForCausalLM}
