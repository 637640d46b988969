// A Llama-family decoder layer (Llama, Mistral, Qwen2 with its qkv bias, Qwen3 with its
// q/k norms) run in one call for the few tokens of a decode or verify step: the ~20
// Python module calls and kernel bindings a layer costs otherwise (~0.1 ms) are the
// largest part of a small model's decode step.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace sgl_cpu {

struct DecoderLayerWeights {
  at::Tensor input_norm, post_attention_norm;  // [H]
  at::Tensor qkv, o, gate_up, down;            // [out, in], the model's dtype or bf16/fp16
  std::optional<at::Tensor> qkv_bias, o_bias;  // [out]
  std::optional<at::Tensor> q_norm, k_norm;    // [D] (Qwen3), else none
  // pack_weight_panels of qkv, o, gate_up, down (bf16 weights under float32, or all bf16
  // on the bf16 dot-product build), else none
  std::optional<at::Tensor> qkv_panels, o_panels, gate_up_panels, down_panels;
};

struct DecoderLayerShape {
  int64_t num_heads, num_kv_heads, head_dim;
  double rms_eps, scale, logit_cap;  // logit_cap 0: none
  int64_t window;                    // sliding window in keys; 0: full attention
  // rows that take linear_small_m (as layers/linear.py small_m_rows): <= small_m_rows,
  // or <= long_k_rows when the input is at least long_k wide, or <= half_weight_rows
  // for a bf16/fp16 weight under float32; other calls at::linear
  int64_t small_m_rows, long_k, long_k_rows, half_weight_rows;
  // > 0 where bf16 linears take AMX tiles (linear.py AMX_MIN_ROWS, amx_rows): all-bf16
  // calls over panels with K a multiple of 32 take linear_small_m below it, else
  // linear_packed (the tiles)
  int64_t amx_min_rows;
};

// Per-forward attention inputs, shared by every layer of the step.
struct DecodeStep {
  at::Tensor positions, cos_cache, sin_cache;                  // rotary
  at::Tensor out_cache_loc, req_to_token, req_pool_indices;    // paged KV
  at::Tensor seq_lens, extend_lens;                            // extend_lens empty: decode
};

class DecoderLayer {
 public:
  DecoderLayer(DecoderLayerWeights weights, DecoderLayerShape shape);

  // hidden [T, H], residual [T, H] or none (first layer) -> (hidden, residual) for the
  // next layer, as LlamaDecoderLayer.forward returns them; kv_pool is this layer's.
  std::tuple<at::Tensor, at::Tensor> forward(at::Tensor hidden,
                                             std::optional<at::Tensor> residual,
                                             const DecodeStep& step, at::Tensor kv_pool) const;

 private:
  at::Tensor linear(const at::Tensor& x, const at::Tensor& w,
                    const std::optional<at::Tensor>& bias,
                    const std::optional<at::Tensor>& panels) const;
  std::tuple<at::Tensor, at::Tensor, at::Tensor> qkv_rotated(const at::Tensor& h,
                                                             const DecodeStep& step) const;

  DecoderLayerWeights w_;
  DecoderLayerShape s_;
};

}  // namespace sgl_cpu
