// DecoderLayer: the ops of LlamaDecoderLayer.forward on the kernels' path, in order, in
// C++ (see decoder_layer.h). Same kernels as the Python path, so the same results.
#include "decoder_layer.h"

#include <ATen/ATen.h>

#include "kernels.h"
#include "vec.h"

namespace sgl_cpu {

DecoderLayer::DecoderLayer(DecoderLayerWeights weights, DecoderLayerShape shape)
    : w_(std::move(weights)), s_(shape) {
  TORCH_CHECK(w_.qkv.size(0) == (s_.num_heads + 2 * s_.num_kv_heads) * s_.head_dim,
              "qkv weight rows must be (num_heads + 2 num_kv_heads) head_dim");
  TORCH_CHECK(w_.q_norm.has_value() == w_.k_norm.has_value(), "q_norm and k_norm go together");
}

at::Tensor DecoderLayer::linear(const at::Tensor& x, const at::Tensor& w,
                                const std::optional<at::Tensor>& bias,
                                const std::optional<at::Tensor>& panels) const {
  const int64_t rows = x.size(0);
  const bool half_w = w.scalar_type() != x.scalar_type();  // bf16/fp16 under float32
  const bool all_bf16 = x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16;
  if (s_.amx_min_rows > 0 && all_bf16 && panels.has_value() && x.size(1) % 32 == 0) {
    at::Tensor out = at::empty({rows, w.size(0)}, x.options());  // as linear.py amx_rows
    if (rows < s_.amx_min_rows) {
      linear_panels_small_m(out, x, w, bias, *panels);  // w may be shape-only
    } else {
      linear_packed(out, x, w, bias, panels);  // AMX tiles over the panels
    }
    return out;
  }
  const bool small = rows <= s_.small_m_rows || (x.size(1) >= s_.long_k && rows <= s_.long_k_rows) ||
                     (half_w && rows <= s_.half_weight_rows);
  if (small) {  // a bf16 w with panels (all bf16, or under float32): their GEMV (w may be
                // shape-only), as linear.py panels_kernel
    at::Tensor out = at::empty({rows, w.size(0)}, x.options());
    if ((all_bf16 || half_w) && panels.has_value()) {
      linear_panels_small_m(out, x, w, bias, *panels);
    } else {
      linear_small_m(out, x, w, bias);
    }
    return out;
  }
  // half_w: widened a panel at a time, not the whole weight per call; all bf16: the
  // bf16 dot product where the build has it (linear_packed falls back to at::linear)
  if (half_w || (kHasBf16Dot && x.scalar_type() == at::kBFloat16 &&
                 w.scalar_type() == at::kBFloat16)) {
    at::Tensor out = at::empty({rows, w.size(0)}, x.options());
    linear_packed(out, x, w, bias, panels);  // both paths read load-time panels
    return out;
  }
  return at::linear(x, w, bias);
}

// (q, k, v) [T, heads * D] each, q and k rotated (views of the qkv output, or new
// tensors when the q/k norms apply).
std::tuple<at::Tensor, at::Tensor, at::Tensor> DecoderLayer::qkv_rotated(
    const at::Tensor& h, const DecodeStep& step) const {
  at::Tensor qkv = linear(h, w_.qkv, w_.qkv_bias, w_.qkv_panels);
  const int64_t t = qkv.size(0), d = s_.head_dim;
  const int64_t q_size = s_.num_heads * d, kv_size = s_.num_kv_heads * d;
  at::Tensor v = qkv.narrow(1, q_size + kv_size, kv_size);
  if (!w_.q_norm.has_value()) {  // q and k rotated together, in place
    at::Tensor qk = qkv.narrow(1, 0, q_size + kv_size);
    rotary_neox_(qk, step.positions, step.cos_cache, step.sin_cache, d);
    return {qkv.narrow(1, 0, q_size), qkv.narrow(1, q_size, kv_size), v};
  }
  at::Tensor q = at::empty({t, q_size}, qkv.options());
  at::Tensor k = at::empty({t, kv_size}, qkv.options());
  at::Tensor q_rows = q.view({-1, d}), k_rows = k.view({-1, d});
  rmsnorm_out(q_rows, qkv.narrow(1, 0, q_size).reshape({-1, d}), *w_.q_norm, s_.rms_eps);
  rmsnorm_out(k_rows, qkv.narrow(1, q_size, kv_size).reshape({-1, d}), *w_.k_norm, s_.rms_eps);
  rotary_neox_(q, step.positions, step.cos_cache, step.sin_cache, d);
  rotary_neox_(k, step.positions, step.cos_cache, step.sin_cache, d);
  return {q, k, v};
}

std::tuple<at::Tensor, at::Tensor> DecoderLayer::forward(at::Tensor hidden,
                                                         std::optional<at::Tensor> residual,
                                                         const DecodeStep& step,
                                                         at::Tensor kv_pool) const {
  TORCH_CHECK(hidden.dim() == 2 && hidden.is_contiguous(), "hidden must be a contiguous [T, H]");
  at::Tensor res;
  at::Tensor h;
  if (residual.has_value()) {  // residual <- hidden + residual; hidden <- norm(residual)
    res = *residual;
    fused_add_rmsnorm_(hidden, res, w_.input_norm, s_.rms_eps);
    h = hidden;
  } else {
    res = hidden;
    h = at::empty_like(hidden);
    rmsnorm_out(h, hidden, w_.input_norm, s_.rms_eps);
  }
  auto [q, k, v] = qkv_rotated(h, step);
  at::Tensor attn = at::empty({q.size(0), s_.num_heads * s_.head_dim}, q.options());
  paged_attention(attn, q, k, v, kv_pool, step.out_cache_loc, step.req_to_token,
                  step.req_pool_indices, step.seq_lens, step.extend_lens, s_.scale, s_.logit_cap,
                  s_.window, true);
  at::Tensor o = linear(attn, w_.o, w_.o_bias, w_.o_panels);
  fused_add_rmsnorm_(o, res, w_.post_attention_norm, s_.rms_eps);
  at::Tensor gate_up = linear(o, w_.gate_up, std::nullopt, w_.gate_up_panels);
  at::Tensor act = at::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
  silu_and_mul_out(act, gate_up);
  return {linear(act, w_.down, std::nullopt, w_.down_panels), res};
}

}  // namespace sgl_cpu
