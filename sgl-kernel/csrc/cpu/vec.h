// One float32 SIMD vector type for the kernels, over float, bfloat16 and half storage:
// loads widen to float32, so a kernel computes in float whatever the pool's dtype.
//   AVX-512F:          vfloat = __m512, kVecWidth 16
//   AVX2 + FMA + F16C: vfloat = __m256, kVecWidth 8  (AMD Zen 1-3, Intel Haswell-Skylake)
// picked at compile time (-march=native). SGL_HAVE_VEC is defined on either; kernels keep
// a portable scalar path for the rest (aarch64, and builds with -DSGL_FORCE_SCALAR).
// A kernel written against these helpers runs on both ISAs with the same arithmetic per
// lane (sums may group differently).
#pragma once

#if !defined(SGL_FORCE_SCALAR) && \
    (defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)))
#define SGL_HAVE_VEC 1
#include <immintrin.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace sgl_cpu {

// Storage types vload reads (double keeps the portable path).
template <typename T>
constexpr bool kHasVecLoad = std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16> ||
                             std::is_same_v<T, c10::Half> ||
                             std::is_same_v<T, c10::Float8_e4m3fn> ||
                             std::is_same_v<T, c10::Float8_e5m2>;

// fp8 (a KV pool's --kv-cache-dtype fp8_e4m3 / fp8_e5m2) widened exactly through half
// precision (F16C), as two or five instructions per vector:
// - e5m2 is the upper byte of a float16 (same sign, exponent and bias);
// - e4m3fn's byte, sign-extended to 16 bits and shifted left by 7, puts its 4 exponent
//   and 3 mantissa bits in float16's exponent's low 4 and mantissa's top 3 bits and its
//   sign in bit 15 (bit 14 cleared): the float16 value is the fp8 value times 2^-8
//   (bias 15 vs 7; denormals included, largest 448 -> 1.75), undone by one multiply
//   (or by the caller: vload_unscaled, kPoolUnit below).
// The pool holds no inf or NaN (writes saturate): an e4m3fn NaN would read as 480.
#if defined(__AVX512F__)
#define SGL_VEC_ISA "avx512"
#if defined(__AVX512BF16__)
#define SGL_HAVE_BF16_DOT 1  // vdpbf16ps: bf16 pairs multiplied into float32 lanes
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define SGL_HAVE_AMX_BF16 1  // AMX tiles: TDPBF16PS, 16 x 16 x 32 bf16 multiply-adds (gemm_amx.cpp)
#endif
#endif
using vfloat = __m512;
constexpr int64_t kVecWidth = 16;     // floats per vector
constexpr int kVecRegisters = 32;     // zmm registers: sizes register tiles

inline vfloat vload(const float* p) { return _mm512_loadu_ps(p); }
inline vfloat vload(const c10::BFloat16* p) {  // bf16 is float32's upper half
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline vfloat vload(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline vfloat vload(const c10::Float8_e5m2* p) {  // 16 bytes
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b), 8));
}
inline vfloat vload_unscaled(const c10::Float8_e4m3fn* p) {  // 16 bytes, x 2^-8
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b), 7),
                                     _mm256_set1_epi16(int16_t(0xBFFF)));
  return _mm512_cvtph_ps(h);
}
inline void vstore(float* p, vfloat v) { _mm512_storeu_ps(p, v); }
// A 32-bit word holding two bf16 values (low half first): its low value (shifted into
// the upper half) and its high value (the upper half kept), as float32 lanes.
inline vfloat vpair_low(const uint32_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_loadu_si512(p), 16));
}
inline vfloat vpair_high(const uint32_t* p) {
  return _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_loadu_si512(p), _mm512_set1_epi32(int32_t(0xffff0000u))));
}
inline vfloat vset1(float x) { return _mm512_set1_ps(x); }
inline vfloat vzero() { return _mm512_setzero_ps(); }
inline vfloat vadd(vfloat a, vfloat b) { return _mm512_add_ps(a, b); }
inline vfloat vsub(vfloat a, vfloat b) { return _mm512_sub_ps(a, b); }
inline vfloat vmul(vfloat a, vfloat b) { return _mm512_mul_ps(a, b); }
inline vfloat vdiv(vfloat a, vfloat b) { return _mm512_div_ps(a, b); }
inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return _mm512_fmadd_ps(a, b, c); }  // a*b+c
inline vfloat vfnma(vfloat a, vfloat b, vfloat c) { return _mm512_fnmadd_ps(a, b, c); }  // c-a*b
inline vfloat vmax(vfloat a, vfloat b) { return _mm512_max_ps(a, b); }
inline vfloat vmin(vfloat a, vfloat b) { return _mm512_min_ps(a, b); }
inline vfloat vfloor(vfloat x) {
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}
inline vfloat vpow2i(vfloat n) {  // 2^n for integral n in [-127, 128)
  const __m512i e = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
  return _mm512_castsi512_ps(_mm512_slli_epi32(e, 23));
}
inline float vreduce_add(vfloat v) { return _mm512_reduce_add_ps(v); }
inline float vreduce_max(vfloat v) { return _mm512_reduce_max_ps(v); }

inline __mmask16 first_lanes(int64_t n) {  // lanes [0, n); all of them for n >= 16
  return n >= kVecWidth ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
}
// p[0, min(n, 16)) into the first lanes, `fill` in the others (p past n is not read).
inline vfloat vload_first(const float* p, int64_t n, float fill) {
  return _mm512_mask_loadu_ps(_mm512_set1_ps(fill), first_lanes(n), p);
}
inline void vstore_first(float* p, int64_t n, vfloat v) {
  _mm512_mask_storeu_ps(p, first_lanes(n), v);
}
inline vfloat vkeep_first(vfloat v, int64_t n) { return _mm512_maskz_mov_ps(first_lanes(n), v); }

// Whether any lane seen by add() was NaN.
struct NanLanes {
  __mmask16 lanes = 0;
  void add(vfloat v) { lanes |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q); }
  bool any() const { return lanes != 0; }
};

// Lanes 0..3 of the result: the totals of a, b, c and d.
inline __m128 vreduce4(vfloat a, vfloat b, vfloat c, vfloat d) {
  const __m512 ab = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 cd = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  const __m512 abcd = _mm512_add_ps(
      _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))),
      _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(ab), _mm512_castps_pd(cd))));
  // each 128-bit lane now holds [a, b, c, d] partial sums: add the four lanes
  const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(abcd),
                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(abcd), 1)));
  return _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
}

// rows[i][j] <- rows[j][i]: a 16 x 16 float block transposed in registers (64 shuffles).
inline void vtranspose(vfloat* rows) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {  // 32-bit interleave of row pairs
    t[i] = _mm512_unpacklo_ps(rows[i], rows[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(rows[i], rows[i + 1]);
  }
  // u[4g + c], lane l: column 4l + c of rows 4g .. 4g + 3
  __m512 u[16];
  for (int g = 0; g < 16; g += 4) {
    const __m512d a = _mm512_castps_pd(t[g]), b = _mm512_castps_pd(t[g + 1]);
    const __m512d c = _mm512_castps_pd(t[g + 2]), d = _mm512_castps_pd(t[g + 3]);
    u[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    u[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    u[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    u[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
  for (int c = 0; c < 4; ++c) {  // gather lane l of u[c], u[4 + c], u[8 + c], u[12 + c]
    const __m512 x_lo = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x44);
    const __m512 x_hi = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xEE);
    const __m512 y_lo = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x44);
    const __m512 y_hi = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xEE);
    rows[c] = _mm512_shuffle_f32x4(x_lo, y_lo, 0x88);
    rows[4 + c] = _mm512_shuffle_f32x4(x_lo, y_lo, 0xDD);
    rows[8 + c] = _mm512_shuffle_f32x4(x_hi, y_hi, 0x88);
    rows[12 + c] = _mm512_shuffle_f32x4(x_hi, y_hi, 0xDD);
  }
}

#else  // AVX2 + FMA + F16C
#define SGL_VEC_ISA "avx2"
using vfloat = __m256;
constexpr int64_t kVecWidth = 8;
constexpr int kVecRegisters = 16;  // ymm registers

inline vfloat vload(const float* p) { return _mm256_loadu_ps(p); }
inline vfloat vload(const c10::BFloat16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline vfloat vload(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline vfloat vload(const c10::Float8_e5m2* p) {  // 8 bytes
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtph_ps(_mm_unpacklo_epi8(_mm_setzero_si128(), b));
}
inline vfloat vload_unscaled(const c10::Float8_e4m3fn* p) {  // 8 bytes, x 2^-8
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m128i h = _mm_and_si128(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 7),
                                  _mm_set1_epi16(int16_t(0xBFFF)));
  return _mm256_cvtph_ps(h);
}
inline void vstore(float* p, vfloat v) { _mm256_storeu_ps(p, v); }
// A 32-bit word holding two bf16 values (low half first): its low value (shifted into
// the upper half) and its high value (the upper half kept), as float32 lanes.
inline vfloat vpair_low(const uint32_t* p) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
inline vfloat vpair_high(const uint32_t* p) {
  const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(int32_t(0xffff0000u))));
}
inline vfloat vset1(float x) { return _mm256_set1_ps(x); }
inline vfloat vzero() { return _mm256_setzero_ps(); }
inline vfloat vadd(vfloat a, vfloat b) { return _mm256_add_ps(a, b); }
inline vfloat vsub(vfloat a, vfloat b) { return _mm256_sub_ps(a, b); }
inline vfloat vmul(vfloat a, vfloat b) { return _mm256_mul_ps(a, b); }
inline vfloat vdiv(vfloat a, vfloat b) { return _mm256_div_ps(a, b); }
inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return _mm256_fmadd_ps(a, b, c); }
inline vfloat vfnma(vfloat a, vfloat b, vfloat c) { return _mm256_fnmadd_ps(a, b, c); }
inline vfloat vmax(vfloat a, vfloat b) { return _mm256_max_ps(a, b); }
inline vfloat vmin(vfloat a, vfloat b) { return _mm256_min_ps(a, b); }
inline vfloat vfloor(vfloat x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
inline vfloat vpow2i(vfloat n) {
  const __m256i e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_castsi256_ps(_mm256_slli_epi32(e, 23));
}
inline float vreduce_add(vfloat v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
inline float vreduce_max(vfloat v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

inline __m256i first_lanes(int64_t n) {  // all-ones in lanes [0, n)
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int32_t k = n >= kVecWidth ? int32_t(kVecWidth) : int32_t(n);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), iota);
}
// Full vectors take plain loads and stores: vmaskmovps is slow on AMD before Zen 4 (the
// masked store microcoded), and decode attention's softmax runs these on every vector of
// a key block: plain ones took its in-cache cost from 149-162 to 138-149 cycles per key
// (batch 256, one thread, AVX2 EPYC, A/B alternating).
inline vfloat vload_first(const float* p, int64_t n, float fill) {
  if (n >= kVecWidth) return _mm256_loadu_ps(p);
  const __m256i lanes = first_lanes(n);
  return _mm256_blendv_ps(_mm256_set1_ps(fill), _mm256_maskload_ps(p, lanes),
                          _mm256_castsi256_ps(lanes));
}
inline void vstore_first(float* p, int64_t n, vfloat v) {
  if (n >= kVecWidth) {
    _mm256_storeu_ps(p, v);
    return;
  }
  _mm256_maskstore_ps(p, first_lanes(n), v);
}
inline vfloat vkeep_first(vfloat v, int64_t n) {
  return _mm256_and_ps(v, _mm256_castsi256_ps(first_lanes(n)));
}

struct NanLanes {
  __m256 lanes = _mm256_setzero_ps();
  void add(vfloat v) { lanes = _mm256_or_ps(lanes, _mm256_cmp_ps(v, v, _CMP_UNORD_Q)); }
  bool any() const { return _mm256_movemask_ps(lanes) != 0; }
};

inline __m128 vreduce4(vfloat a, vfloat b, vfloat c, vfloat d) {
  const __m256 ab = _mm256_hadd_ps(a, b);  // [a01 a23 b01 b23 | a45 a67 b45 b67]
  const __m256 cd = _mm256_hadd_ps(c, d);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // [a0-3 b0-3 c0-3 d0-3 | a4-7 ...]
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// rows[i][j] <- rows[j][i]: an 8 x 8 float block transposed in registers (24 shuffles).
inline void vtranspose(vfloat* rows) {
  __m256 t[8], s[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(rows[i], rows[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(rows[i], rows[i + 1]);
  }
  for (int g = 0; g < 8; g += 4) {
    s[g] = _mm256_shuffle_ps(t[g], t[g + 2], 0x44);
    s[g + 1] = _mm256_shuffle_ps(t[g], t[g + 2], 0xEE);
    s[g + 2] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0x44);
    s[g + 3] = _mm256_shuffle_ps(t[g + 1], t[g + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {
    rows[c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x20);
    rows[4 + c] = _mm256_permute2f128_ps(s[c], s[4 + c], 0x31);
  }
}
#endif

// What vload_unscaled<P> reads is 1 / kPoolUnit<P> of each value: e4m3fn's re-biasing
// multiply (see the fp8 note above) left to vload, or to a caller that folds it.
template <typename P>
constexpr float kPoolUnit = std::is_same_v<P, c10::Float8_e4m3fn> ? 256.f : 1.f;
inline vfloat vload(const c10::Float8_e4m3fn* p) {
  return vmul(vload_unscaled(p), vset1(kPoolUnit<c10::Float8_e4m3fn>));
}

// bf16 rounding of each lane as static_cast<c10::BFloat16> rounds (nearest even on the
// bits, any NaN -> 0x7FC0, denormals kept): the bf16 bits in the low 16 of each 32.
#if defined(__AVX512F__)
using vbits = __m512i;
inline vbits vbf16_bits(vfloat v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i bias = _mm512_add_epi32(
      _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1)), _mm512_set1_epi32(0x7FFF));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, bias), 16);
  return _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                               _mm512_set1_epi32(0x7FC0));
}
inline vfloat vbits_to_float(vbits b) { return _mm512_castsi512_ps(_mm512_slli_epi32(b, 16)); }
inline void vstore(c10::BFloat16* p, vfloat v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(vbf16_bits(v)));
}
#else
using vbits = __m256i;
inline vbits vbf16_bits(vfloat v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i bias = _mm256_add_epi32(
      _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1)), _mm256_set1_epi32(0x7FFF));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0),
                            _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}
inline vfloat vbits_to_float(vbits b) { return _mm256_castsi256_ps(_mm256_slli_epi32(b, 16)); }
inline void vstore(c10::BFloat16* p, vfloat v) {
  const vbits b = vbf16_bits(v);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(b),  // < 2^16: exact
                                          _mm256_extracti128_si256(b, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
#endif

// Stores a vector as T (half rounded as static_cast<T> rounds).
template <typename T>
inline void vstore(T* p, vfloat v) {
  alignas(64) float tmp[kVecWidth];
  vstore(tmp, v);
  for (int64_t i = 0; i < kVecWidth; ++i) p[i] = static_cast<T>(tmp[i]);
}

// Each lane rounded to T and widened back: the float value static_cast<T> would store.
template <typename T>
inline vfloat vround(vfloat v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, c10::BFloat16>) {
    return vbits_to_float(vbf16_bits(v));
  } else {
    alignas(64) T tmp[kVecWidth];
    vstore(tmp, v);
    return vload(tmp);
  }
}

// A pool value as the decode attention reads it: vload's, except e4m3fn's, left at 2^-8
// of its value (vload_unscaled above); the caller applies kPoolUnit<P> once instead (to
// the score scale and the output). Powers of two scale every product and sum exactly,
// so the results are vload's, bit for bit.
template <typename P>
inline vfloat vload_unscaled(const P* p) {
  return vload(p);
}

// exp lane by lane: exp_f32's algorithm (Cephes, common.h).
inline vfloat vexp(vfloat x) {
  x = vmin(vmax(x, vset1(-87.0f)), vset1(88.0f));
  const vfloat n = vfloor(vfma(x, vset1(1.44269504088896341f), vset1(0.5f)));  // round(x / ln2)
  vfloat r = vfnma(n, vset1(0.693359375f), x);
  r = vfma(n, vset1(2.12194440e-4f), r);
  vfloat p = vset1(1.9875691500e-4f);
  p = vfma(p, r, vset1(1.3981999507e-3f));
  p = vfma(p, r, vset1(8.3334519073e-3f));
  p = vfma(p, r, vset1(4.1665795894e-2f));
  p = vfma(p, r, vset1(1.6666665459e-1f));
  p = vfma(p, r, vset1(5.0000001201e-1f));
  const vfloat y = vadd(vfma(p, vmul(r, r), r), vset1(1.0f));
  return vmul(y, vpow2i(n));  // y * 2^n
}

}  // namespace sgl_cpu
#endif

namespace sgl_cpu {
// Whether bf16 x bf16 linears take the AVX-512 bf16 dot product (SGL_HAVE_BF16_DOT above;
// false on every other build): linear_packed then runs gemm_packed_bf16.cpp, not at::linear.
#if defined(SGL_HAVE_BF16_DOT)
constexpr bool kHasBf16Dot = true;
#else
constexpr bool kHasBf16Dot = false;
#endif
}  // namespace sgl_cpu
