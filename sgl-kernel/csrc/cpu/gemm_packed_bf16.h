// The bf16 dot-product GEMM behind linear_packed for bf16 x over bf16 W
// (gemm_packed_bf16.cpp); only on builds with the AVX-512 bf16 instructions.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>

#include "amx.h"
#include "vec.h"

namespace sgl_cpu {
#if defined(SGL_HAVE_BF16_DOT)
// out[0, cols) <- v rounded to bf16 (nearest even); all 16 lanes when cols >= 16, none
// when cols <= 0 (an N tail's second vector). The epilogue of both bf16 GEMMs.
inline void store_bf16(c10::BFloat16* out, __m512 v, int64_t cols) {
  const __m256i h = (__m256i)_mm512_cvtneps_pbh(v);
  if (cols >= kVecWidth) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), h);
  } else if (cols > 0) {
    _mm256_mask_storeu_epi16(out, first_lanes(cols), h);
  }
}

// bias[n0, n0 + cols) widened to float32 (zero past cols, or without a bias).
inline __m512 load_bias(const c10::BFloat16* bias, int64_t n0, int64_t cols) {
  if (bias == nullptr || cols <= 0) return _mm512_setzero_ps();
  const __m256i raw = _mm256_maskz_loadu_epi16(first_lanes(cols), bias + n0);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// out [M, N] <- x [M, K] @ w [N, K]^T (+ bias [N] or nullptr), all bf16, arguments checked.
// `packed`: w's panels from pack_weight_panels (at bf16_dot_panel_width()), or nullptr to
// pack them per call.
void linear_packed_bf16_dot(at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                            const c10::BFloat16* bias, const uint32_t* packed);
int64_t bf16_dot_panel_width();  // output columns per panel
// out [M, N] <- x [M, K] @ W^T (+ bias [N] or nullptr), all bf16, W as its load-time
// panels (pack_weight_panels), for the few rows of a decode step: bound by reading the
// panels, each a sequential stream, with dot products in a few float32 chains per row.
void linear_panels_gemv_bf16(at::Tensor& out, const at::Tensor& x, const c10::BFloat16* bias,
                             const uint32_t* packed, int64_t n);
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
