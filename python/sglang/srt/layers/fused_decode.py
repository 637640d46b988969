"""Llama-family decoder layers in one C++ call each for decode and verify steps on CPU.

A small model's decode step is mostly Python: each layer is ~20 module calls and kernel
bindings (norms, linears, rotary, attention, SiLU), ~0.1 ms. On the kernels' path
(`cpu_kernels`) with the paged-attention kernel serving the step, `DecoderLayer`
(`sgl-kernel/csrc/cpu/decoder_layer.cpp`) runs those same kernels in the same order from
C++, so the results are the Python path's. Everything else (other devices, prefill
chunks, tensor parallelism, MoE layers, a backend other than torch_native) keeps the
module path.

The C++ layer holds the layer's parameter tensors (not copies): it is built on a layer's
first fused step, after the weights are loaded, and a weight update that builds a new
model builds new layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from sglang.srt.layers import cpu_kernels
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend, kernel_takes
from sglang.srt.layers.linear import (
    AMX_MIN_ROWS,
    HALF_WEIGHT_MAX_ROWS,
    LONG_K,
    LONG_K_MAX_ROWS,
    SMALL_M_MAX_ROWS,
)
from sglang.srt.layers.weight_panels import panels_of

if TYPE_CHECKING:
    from sglang.srt.layers.rotary_embedding import RotaryEmbedding
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


def decode_step(
    layers: nn.ModuleList, rotary: RotaryEmbedding, positions: torch.Tensor, fb: ForwardBatch
) -> Any | None:
    """The step's `DecodeStep` (attention and rotary inputs every layer shares) when the
    fused layers serve this forward, else None."""
    backend = fb.attn_backend
    if not isinstance(backend, TorchNativeAttnBackend) or not cpu_kernels.serves(positions):
        return None
    extend_lens = backend.kernel_extend_lens(fb)
    if extend_lens is None or not all(fusable(layer) for layer in layers):
        return None
    dtype = layers[0].input_layernorm.weight.dtype
    if not cpu_kernels.usable(layers[0].input_layernorm.weight):
        return None
    if not kernel_takes(dtype, fb.token_to_kv_pool.dtype):
        return None
    return cpu_kernels.load().DecodeStep(
        positions,
        rotary.cos_cache,
        rotary.sin_cache,
        fb.out_cache_loc,
        fb.req_to_token_pool.req_to_token,
        fb.req_pool_indices,
        fb.seq_lens,
        extend_lens,
    )


def fusable(layer: nn.Module) -> bool:
    """A Llama-family layer (dense MLP, one rank) whose forward the C++ layer reproduces."""
    verdict = getattr(layer, "_fusable", None)
    if verdict is None:
        verdict = layer._fusable = _check_fusable(layer)
    return verdict


def _check_fusable(layer: nn.Module) -> bool:
    from sglang.srt.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaMLP  # cycle

    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    return (
        isinstance(layer, LlamaDecoderLayer)
        and type(layer).forward is LlamaDecoderLayer.forward
        and type(mlp) is LlamaMLP
        and isinstance(attn, LlamaAttention)
        and type(attn).forward is LlamaAttention.forward
        and attn.qkv_proj.tp_size == 1
        and attn.o_proj.tp_size == 1
        and mlp.down_proj.tp_size == 1
        and attn.rotary_emb.cos_cache.dtype == torch.float32
        and _same_eps(layer)
    )


def _same_eps(layer: nn.Module) -> bool:
    """The C++ layer takes one RMSNorm epsilon (a Llama config has one)."""
    norms = [layer.input_layernorm, layer.post_attention_layernorm]
    if layer.self_attn.qk_norm:
        norms += [layer.self_attn.q_norm, layer.self_attn.k_norm]
    return len({n.variance_epsilon for n in norms}) == 1


def run_layer(
    layer: nn.Module,
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    step: Any,
    fb: ForwardBatch,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`layer(positions, hidden, fb, residual)` through its C++ layer."""
    fused = getattr(layer, "_fused", None)
    if fused is None:
        fused = layer._fused = _build(layer)
    pool = fb.token_to_kv_pool.get_kv_buffer(layer.self_attn.attn.layer_id)
    return fused.forward(hidden, residual, step, pool)


def _build(layer: nn.Module) -> Any:
    kernels = cpu_kernels.load()
    attn, mlp = layer.self_attn, layer.mlp
    radix = attn.attn
    weights = kernels.DecoderLayerWeights(
        layer.input_layernorm.weight,
        layer.post_attention_layernorm.weight,
        attn.qkv_proj.weight,
        attn.o_proj.weight,
        mlp.gate_up_proj.weight,
        mlp.down_proj.weight,
        qkv_bias=attn.qkv_proj.bias,
        o_bias=attn.o_proj.bias,
        q_norm=attn.q_norm.weight if attn.qk_norm else None,
        k_norm=attn.k_norm.weight if attn.qk_norm else None,
        qkv_panels=panels_of(attn.qkv_proj.weight),
        o_panels=panels_of(attn.o_proj.weight),
        gate_up_panels=panels_of(mlp.gate_up_proj.weight),
        down_panels=panels_of(mlp.down_proj.weight),
    )
    shape = kernels.DecoderLayerShape(
        radix.tp_q_head_num,
        radix.tp_k_head_num,
        radix.head_dim,
        layer.input_layernorm.variance_epsilon,
        radix.scaling,
        radix.logit_cap or 0.0,
        radix.sliding_window_size or 0,
        SMALL_M_MAX_ROWS,
        LONG_K,
        LONG_K_MAX_ROWS,
        HALF_WEIGHT_MAX_ROWS,
        AMX_MIN_ROWS if kernels.amx_tiles() else 0,
    )
    return kernels.DecoderLayer(weights, shape)
