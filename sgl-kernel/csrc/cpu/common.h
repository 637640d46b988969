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

namespace sgl_cpu {

// Items per parallel task so that a task does at least this many multiply-adds: a call
// this small runs inline on the calling thread (waking the OpenMP team costs more).
constexpr int64_t kMinTaskWork = 1 << 15;

inline int64_t grain_for(int64_t work_per_item) {
  return std::max<int64_t>(1, kMinTaskWork / std::max<int64_t>(1, work_per_item));
}

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

inline void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.dim() == 2, name, " must be 2-D [rows, width], got ", t.dim(), "-D");
  TORCH_CHECK(t.stride(1) == 1, name, " must have contiguous rows");
}

}  // namespace sgl_cpu

#define SGL_DISPATCH_FLOATS(TYPE, NAME, ...) \
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, TYPE, NAME, __VA_ARGS__)
