// 16-float AVX-512 vectors over float, bfloat16 and half storage: loads widen to float32,
// so a kernel computes in float whatever the pool's dtype. Compiled only where the build
// machine has AVX-512F (-march=native); kernels keep a portable path for the rest.
#pragma once

#if defined(__AVX512F__)
#define SGL_HAVE_AVX512 1
#include <immintrin.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <type_traits>

namespace sgl_cpu {

constexpr int64_t kVecWidth = 16;  // floats per __m512

// Storage types load_f32x16 reads (double keeps the portable path).
template <typename T>
constexpr bool kHasVecLoad = std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16> ||
                             std::is_same_v<T, c10::Half>;

inline __m512 load_f32x16(const float* p) { return _mm512_loadu_ps(p); }

inline __m512 load_f32x16(const c10::BFloat16* p) {  // bf16 is float32's upper half
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

inline __m512 load_f32x16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

}  // namespace sgl_cpu
#endif
