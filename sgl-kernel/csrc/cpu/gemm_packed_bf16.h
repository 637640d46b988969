// The bf16 dot-product GEMM behind linear_packed for bf16 x over bf16 W
// (gemm_packed_bf16.cpp); only on builds with the AVX-512 bf16 instructions.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

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
}  // namespace sgl_cpu
