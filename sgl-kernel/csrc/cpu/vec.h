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

// Stores 16 floats as T (bf16/half rounded as static_cast<T> rounds).
inline void store_f32x16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }

template <typename T>
inline void store_f32x16(T* p, __m512 v) {
  alignas(64) float tmp[kVecWidth];
  _mm512_store_ps(tmp, v);
  for (int64_t i = 0; i < kVecWidth; ++i) p[i] = static_cast<T>(tmp[i]);
}

// exp of 16 floats: exp_f32's algorithm (Cephes, common.h) lane by lane.
inline __m512 exp_f32x16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(
      _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);  // round(x / ln2)
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  const __m512i bits =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(bits));  // y * 2^n
}

}  // namespace sgl_cpu
#endif
