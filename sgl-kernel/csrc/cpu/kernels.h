// The kernels' entry points (one definition each in its .cpp), for the bindings and for
// the kernels composed of others (decoder_layer.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace sgl_cpu {
void rmsnorm_out(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, double eps);
void fused_add_rmsnorm_(at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps);
void silu_and_mul_out(at::Tensor& out, const at::Tensor& x);
void rotary_neox_(at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_cache,
                  const at::Tensor& sin_cache, int64_t head_dim);
void paged_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v, at::Tensor& kv_pool, const at::Tensor& loc,
                     const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                     const at::Tensor& seq_lens, const at::Tensor& extend_lens, double scale,
                     double logit_cap, int64_t window, bool save_kv);
void argmax_rows(at::Tensor& out, const at::Tensor& x);
void linear_small_m(at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                    const std::optional<at::Tensor>& bias);
void linear_packed(at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                   const std::optional<at::Tensor>& bias,
                   const std::optional<at::Tensor>& panels = std::nullopt);
void linear_panels_small_m(at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                           const std::optional<at::Tensor>& bias, const at::Tensor& panels);
at::Tensor pack_weight_panels(const at::Tensor& w);
int64_t weight_panel_width();  // output columns per weight panel; 0 without vectors
}  // namespace sgl_cpu
