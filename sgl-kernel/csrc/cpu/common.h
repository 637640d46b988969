// Shared helpers of the CPU kernels: dtype dispatch, argument checks, work grains.
#pragma once

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>

#include "parallel.h"

namespace sgl_cpu {

// Float accumulators per reduction: enough lanes for the compiler to vectorize the loop.
constexpr int kLanes = 16;

template <typename T>
inline float sum_squares(const T* x, int64_t n) {
  float acc[kLanes] = {0.f};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      float v = static_cast<float>(x[i + j]);
      acc[j] += v * v;
    }
  }
  float total = 0.f;
  for (int j = 0; j < kLanes; ++j) total += acc[j];
  for (; i < n; ++i) {
    float v = static_cast<float>(x[i]);
    total += v * v;
  }
  return total;
}

template <typename TA, typename TB>
inline float dot(const TA* a, const TB* b, int64_t n) {
  float acc[kLanes] = {0.f};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      acc[j] += static_cast<float>(a[i + j]) * static_cast<float>(b[i + j]);
    }
  }
  float total = 0.f;
  for (int j = 0; j < kLanes; ++j) total += acc[j];
  for (; i < n; ++i) total += static_cast<float>(a[i]) * static_cast<float>(b[i]);
  return total;
}

// exp(x) for float32, vectorizable (plain arithmetic and bit operations, no libm call):
// Cephes' expf, range-reduced to r in [-ln2/2, ln2/2] and a degree-6 polynomial; within
// 2 ulp of std::exp over [-87, 88] (x below -87 gives ~0, above 88 saturates).
inline float exp_f32(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);  // round(x / ln2)
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;      // x - n ln2, in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

// f(std::integral_constant<int, n>{}) for a runtime 0 < n <= R: a register tile's row
// count as a template argument (the M tails of the matmul kernels).
template <int R, typename F>
inline void with_rows(int n, F&& f) {
  if constexpr (R > 0) {
    if (n == R) {
      f(std::integral_constant<int, R>{});
    } else {
      with_rows<R - 1>(n, f);
    }
  }
}

inline void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.dim() == 2, name, " must be 2-D [rows, width], got ", t.dim(), "-D");
  TORCH_CHECK(t.stride(1) == 1, name, " must have contiguous rows");
}

// A linear's out [M, N] (contiguous) and optional bias [N] (contiguous, x's dtype) for
// x [M, K] and w [N, K]; returns whether the bias is present.
inline bool check_linear_out_bias(const at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                                  const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(out.is_contiguous() && out.dim() == 2 && out.size(0) == x.size(0) &&
                  out.size(1) == w.size(0),
              "out must be a contiguous [M, N]");
  const bool has_bias = bias.has_value() && bias->defined();
  if (has_bias) {
    TORCH_CHECK(bias->is_contiguous() && bias->numel() == w.size(0) &&
                    bias->scalar_type() == x.scalar_type(),
                "bias must be a contiguous [N] of x's dtype");
  }
  return has_bias;
}

}  // namespace sgl_cpu

#define SGL_DISPATCH_FLOATS(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, TYPE, NAME, __VA_ARGS__)
