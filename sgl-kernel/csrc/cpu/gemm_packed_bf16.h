// The bf16 dot-product GEMM behind linear_packed for bf16 x over bf16 W
// (gemm_packed_bf16.cpp); only on builds with the AVX-512 bf16 instructions.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include "amx.h"
#include "vec.h"

namespace sgl_cpu {
#if defined(SGL_HAVE_BF16_DOT)
// out [M, N] <- x [M, K] @ w [N, K]^T (+ bias [N] or nullptr), all bf16, arguments checked.
// `packed`: w's panels from pack_weight_panels (at bf16_dot_panel_width()), or nullptr to
// pack them per call.
void linear_packed_bf16_dot(at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                            const c10::BFloat16* bias, const uint32_t* packed);
int64_t bf16_dot_panel_width();  // output columns per panel
#endif
#if defined(SGL_HAVE_AMX_BF16)
// Whether linear_amx_bf16 serves an input K wide: a multiple of 32, amx_tiles().
bool amx_serves(int64_t k);
// out [M, N] <- x [M, K] @ W^T (+ bias [N] or nullptr), all bf16, W as its load-time
// panels (pack_weight_panels at width 32), K a multiple of 32 (gemm_amx.cpp).
void linear_amx_bf16(at::Tensor& out, const at::Tensor& x, const c10::BFloat16* bias,
                     const uint32_t* panels, int64_t n);
#endif
}  // namespace sgl_cpu
