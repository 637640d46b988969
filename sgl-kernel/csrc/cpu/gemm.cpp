// y = x W^T (+ b) for the few rows of a decode step: each weight row is read from memory
// once for all the rows of x. torch's CPU linear (MKL) re-reads W per row at small M on
// the [out, in] layout: [8, 1024] x [3072, 1024]^T takes ~3x the time of one row.
//
// Shapes: x [M, K] (rows contiguous, any row stride), W [N, K] contiguous, b [N] or none,
// out [M, N] contiguous. x, b and out share a dtype; W has it too, or is bf16/fp16 under
// float32 x (weights kept in a half checkpoint's dtype, widened as they are loaded). One work item is a block of kRowsPerTile weight rows; inside it
// the rows of x go kMaxXRows at a time, so the block (kRowsPerTile x K) stays in L1 while
// the x rows pass over it. Sums are float32 over vector-lane partial sums (a different order
// than MKL's: results agree to float rounding, not bit for bit).
#include <type_traits>

#include "common.h"
#include "vec.h"

namespace sgl_cpu {
namespace {

constexpr int kRowsPerTile = 4;  // weight rows per tile: 4 outputs reduced together
#if defined(SGL_HAVE_VEC)
// x rows per tile, sized to the vector registers: AVX-512 6 x 4 accumulators + 4 W + 1 x
// = 29 zmm; AVX2 (16 ymm) loads the x rows first and one W row at a time: 3 x + 1 W +
// 3 x 4 accumulators = 16 ymm.
constexpr bool kXFirst = kVecRegisters < 32;
constexpr int kMaxXRows = kXFirst ? 3 : 6;
#endif

struct GemmCall {
  int64_t m, n, k, x_stride;
};

// Scalar dot of the K tail (K % kVecWidth elements) and the portable path.
template <typename T, typename W>
inline float dot_range(const T* a, const W* b, int64_t begin, int64_t end) {
  float acc = 0.f;
  for (int64_t i = begin; i < end; ++i) acc += static_cast<float>(a[i]) * static_cast<float>(b[i]);
  return acc;
}

template <typename T>
inline void store_out(T* out, int64_t col, float value, const T* bias) {
  if (bias != nullptr) value += static_cast<float>(bias[col]);
  out[col] = static_cast<T>(value);
}

#if defined(SGL_HAVE_VEC)
// out[r, n0..n0+4) for the XR rows of x starting at x_rows (XR <= kMaxXRows). With
// `prefetch`, the next block's weight rows are prefetched a block ahead (prefetches past
// the weight's end do not fault): a decode-size call is bound by reading the weight, and
// its short rows give the hardware prefetcher little time to ramp up.
template <typename T, typename W, int XR>
void tile4(const T* x_rows, const W* w_rows, T* out_rows, const T* bias, int64_t n0,
           const GemmCall& c, bool prefetch) {
  const W* next = w_rows + kRowsPerTile * c.k;
  constexpr int64_t kLineElems = 64 / sizeof(W);
  vfloat acc[XR][kRowsPerTile];
  for (int r = 0; r < XR; ++r)
    for (int j = 0; j < kRowsPerTile; ++j) acc[r][j] = vzero();
  const int64_t k_vec = c.k - c.k % kVecWidth;
  for (int64_t i = 0; i < k_vec; i += kVecWidth) {
    if (prefetch && i % kLineElems == 0) {
      for (int j = 0; j < kRowsPerTile; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(next + j * c.k + i), _MM_HINT_T0);
      }
    }
    if constexpr (kXFirst) {  // XR x + 1 w + 4 XR acc registers
      vfloat xv[XR];
      for (int r = 0; r < XR; ++r) xv[r] = vload(x_rows + r * c.x_stride + i);
      for (int j = 0; j < kRowsPerTile; ++j) {
        const vfloat w = vload(w_rows + j * c.k + i);
        for (int r = 0; r < XR; ++r) acc[r][j] = vfma(xv[r], w, acc[r][j]);
      }
    } else {  // 4 w + 1 x + 4 XR acc registers
      vfloat w[kRowsPerTile];
      for (int j = 0; j < kRowsPerTile; ++j) w[j] = vload(w_rows + j * c.k + i);
      for (int r = 0; r < XR; ++r) {
        const vfloat xv = vload(x_rows + r * c.x_stride + i);
        for (int j = 0; j < kRowsPerTile; ++j) acc[r][j] = vfma(xv, w[j], acc[r][j]);
      }
    }
  }
  for (int r = 0; r < XR; ++r) {
    __m128 sums4 = vreduce4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
    if constexpr (std::is_same_v<T, float>) {
      // Without a K tail the 4 sums go out as one vector: at K = 256 a tile runs 16
      // vector steps, and 4 scalar tail-dot, bias and store sequences per row cost a
      // third as much again.
      if (k_vec == c.k) {
        if (bias != nullptr) sums4 = _mm_add_ps(sums4, _mm_loadu_ps(bias + n0));
        _mm_storeu_ps(out_rows + r * c.n + n0, sums4);
        continue;
      }
    }
    alignas(16) float sums[kRowsPerTile];
    _mm_store_ps(sums, sums4);
    const T* xr = x_rows + r * c.x_stride;
    for (int j = 0; j < kRowsPerTile; ++j) {
      const float tail = dot_range(xr, w_rows + j * c.k, k_vec, c.k);
      store_out(out_rows + r * c.n, n0 + j, sums[j] + tail, bias);
    }
  }
}

// One row of x over a weight streamed from memory with rows of under kGemvStreamMaxK: the
// rows one after another, a single sequential read (4 accumulators per row, the line
// kGemvStreamAheadBytes ahead prefetched). The 4-row tiles read 4 short rows at once, 4
// streams the hardware prefetcher ramps up on anew every 2-4 KiB: on Qwen3-0.6B's K = 1024
// projections (bf16 weights, float32 x, 28 layers' copies, 2 threads, AVX2 EPYC) qkv went
// 23.3 -> 31.8 GB/s and gate_up 23.3 -> 34.2; K = 2048 and 3072 measured 3-5% slower this
// way (32-33 vs 33-35 GB/s), so they keep the tiles. Sums differ from the tiles' order by
// float rounding.
constexpr int64_t kGemvStreamMaxK = 2048;
constexpr int64_t kGemvStreamMinBytes = 2 << 20;  // smaller weights stay cached between steps
constexpr int64_t kGemvStreamAheadBytes = 512;    // 256, 1024, 1536, 2048 measured slower
template <typename T, typename W>
void gemv_stream(const T* x, const W* w, T* out, const T* bias, int64_t n0, int64_t n1,
                 const GemmCall& c) {
  const int64_t k4 = c.k - c.k % (4 * kVecWidth);
  for (int64_t col = n0; col < n1; ++col) {
    const W* row = w + col * c.k;
    vfloat a0 = vzero(), a1 = vzero(), a2 = vzero(), a3 = vzero();
    for (int64_t i = 0; i < k4; i += 4 * kVecWidth) {  // bf16: one 64-byte line a step
      _mm_prefetch(reinterpret_cast<const char*>(row + i) + kGemvStreamAheadBytes, _MM_HINT_T0);
      a0 = vfma(vload(x + i), vload(row + i), a0);
      a1 = vfma(vload(x + i + kVecWidth), vload(row + i + kVecWidth), a1);
      a2 = vfma(vload(x + i + 2 * kVecWidth), vload(row + i + 2 * kVecWidth), a2);
      a3 = vfma(vload(x + i + 3 * kVecWidth), vload(row + i + 3 * kVecWidth), a3);
    }
    const float sum = vreduce_add(vadd(vadd(a0, a1), vadd(a2, a3))) + dot_range(x, row, k4, c.k);
    store_out(out, col, sum, bias);
  }
}

#if defined(SGL_HAVE_BF16_DOT)
// The tile for bf16 x over bf16 W on CPUs with the AVX-512 bf16 dot product (AMD Zen 4+,
// Intel Cooper Lake+): XR rows of x against WR weight rows (a multiple of 4). One vdpbf16ps
// multiplies 32 bf16 pairs and adds them pairwise into 16 float32 lanes, twice the
// multiply-adds of an FMA over widened vectors and no widening of either operand. Products
// of bf16 values are exact in float32; the instruction flushes denormals and rounds each
// accumulation (nearest even), so sums agree with the widening path to float32 rounding.
// The K tail (K % 32) is a scalar dot.
template <int XR, int WR = kRowsPerTile>
void tile_bf16_dot(const c10::BFloat16* x_rows, const c10::BFloat16* w_rows,
                   c10::BFloat16* out_rows, const c10::BFloat16* bias, int64_t n0,
                   const GemmCall& c, bool prefetch) {
  static_assert(WR % 4 == 0, "outputs are reduced and stored 4 at a time");
  constexpr int64_t kPairWidth = 2 * kVecWidth;  // bf16 elements per vdpbf16ps
  const c10::BFloat16* next = w_rows + WR * c.k;
  __m512 acc[XR][WR];
  for (int r = 0; r < XR; ++r)
    for (int j = 0; j < WR; ++j) acc[r][j] = _mm512_setzero_ps();
  const int64_t k_vec = c.k - c.k % kPairWidth;
  for (int64_t i = 0; i < k_vec; i += kPairWidth) {
    if (prefetch) {  // one 64-byte line of each next weight row per step
      for (int j = 0; j < WR; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(next + j * c.k + i), _MM_HINT_T0);
      }
    }
    __m512bh w[WR];
    for (int j = 0; j < WR; ++j) {
      w[j] = (__m512bh)_mm512_loadu_si512(w_rows + j * c.k + i);
    }
    for (int r = 0; r < XR; ++r) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x_rows + r * c.x_stride + i);
      for (int j = 0; j < WR; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], xv, w[j]);
    }
  }
  for (int r = 0; r < XR; ++r) {
    for (int j0 = 0; j0 < WR; j0 += 4) {
      const int64_t col = n0 + j0;
      __m128 sums4 = vreduce4(acc[r][j0], acc[r][j0 + 1], acc[r][j0 + 2], acc[r][j0 + 3]);
      if (k_vec == c.k) {  // no K tail: the 4 outputs rounded (nearest even) and stored at once
        if (bias != nullptr) {
          const __m128i b = _mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(bias + col)));
          sums4 = _mm_add_ps(sums4, _mm_castsi128_ps(_mm_slli_epi32(b, 16)));
        }
        _mm_storel_epi64(reinterpret_cast<__m128i*>(out_rows + r * c.n + col),
                         (__m128i)_mm_cvtneps_pbh(sums4));
        continue;
      }
      alignas(16) float sums[4];
      _mm_store_ps(sums, sums4);
      const c10::BFloat16* xr = x_rows + r * c.x_stride;
      for (int j = 0; j < 4; ++j) {
        const float tail = dot_range(xr, w_rows + (j0 + j) * c.k, k_vec, c.k);
        store_out(out_rows + r * c.n, col + j, sums[j] + tail, bias);
      }
    }
  }
}

// One row of bf16 x over long K (>= kGemvMinK) takes 8 weight rows a pass (8 read streams):
// a one-row call is bound by how many cache lines are in flight; 4 rows at a time reached
// 18-21 GB/s from memory on Qwen3-0.6B's shapes (2 threads), 8 rows 22-27. Shorter rows
// keep the 4-row blocks, whose prefetch of the next block serves them better (the demo
// model's K = 256, its weights in L3: 221.8 us at 8192 x 256 against 243.8 us for 8 rows).
constexpr int kGemvRows = 8;
#endif
constexpr int64_t kGemvMinK = 512;

// XR rows of x against the four weight rows at w_rows: the bf16 dot-product tile for bf16
// x and W where the CPU has it, else the widening FMA tile.
template <typename T, typename W, int XR>
void tile(const T* x_rows, const W* w_rows, T* out_rows, const T* bias, int64_t n0,
          const GemmCall& c, bool prefetch) {
#if defined(SGL_HAVE_BF16_DOT)
  if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<W, c10::BFloat16>) {
    tile_bf16_dot<XR>(x_rows, w_rows, out_rows, bias, n0, c, prefetch);
    return;
  }
#endif
  tile4<T, W, XR>(x_rows, w_rows, out_rows, bias, n0, c, prefetch);
}

// All rows of x against the four weight rows starting at n0.
template <typename T, typename W>
void block4(const T* x, const W* w_rows, T* out, const T* bias, int64_t n0, const GemmCall& c) {
  int64_t r = 0;
  for (; r + kMaxXRows <= c.m; r += kMaxXRows) {
    tile<T, W, kMaxXRows>(x + r * c.x_stride, w_rows, out + r * c.n, bias, n0, c, r == 0);
  }
  const bool prefetch = r == 0;  // the first pass over this block prefetches the next
  with_rows<kMaxXRows - 1>(int(c.m - r), [&](auto rows) {
    tile<T, W, decltype(rows)::value>(x + r * c.x_stride, w_rows, out + r * c.n, bias, n0, c,
                                      prefetch);
  });
}
#endif

// One weight row against all rows of x (the N tail, and the path without vectors).
template <typename T, typename W>
void row1(const T* x, const W* w_row, T* out, const T* bias, int64_t col, const GemmCall& c) {
  for (int64_t r = 0; r < c.m; ++r) {
    store_out(out + r * c.n, col, dot(x + r * c.x_stride, w_row, c.k), bias);
  }
}

template <typename T, typename W>
void run_gemm(T* out, const T* x, const W* w, const T* bias, const GemmCall& c) {
#if defined(SGL_HAVE_BF16_DOT)
  if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<W, c10::BFloat16>) {
    if (c.m == 1 && c.k >= kGemvMinK) {  // 8 rows a pass, then the rows past the last 8
      const int64_t passes = c.n / kGemvRows;
      sgl_cpu::parallel_for(0, passes, kGemvRows * c.k, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
          tile_bf16_dot<1, kGemvRows>(x, w + p * kGemvRows * c.k, out, bias, p * kGemvRows, c,
                                      /*prefetch=*/false);
        }
      });
      for (int64_t col = passes * kGemvRows; col < c.n; ++col) row1(x, w + col * c.k, out, bias, col, c);
      return;
    }
  }
#endif
#if defined(SGL_HAVE_VEC)
  if constexpr (kHasVecLoad<T> && kHasVecLoad<W>) {
    const int64_t w_bytes = c.n * c.k * int64_t(sizeof(W));
    if (c.m == 1 && c.k >= kGemvMinK && c.k < kGemvStreamMaxK && w_bytes >= kGemvStreamMinBytes) {
      sgl_cpu::parallel_for(0, c.n, c.k, [&](int64_t begin, int64_t end) {
        gemv_stream<T, W>(x, w, out, bias, begin, end, c);
      });
      return;
    }
  }
#endif
  const int64_t blocks = c.n / kRowsPerTile;
  sgl_cpu::parallel_for(0, blocks, kRowsPerTile * c.k * c.m, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t n0 = b * kRowsPerTile;
#if defined(SGL_HAVE_VEC)
      if constexpr (kHasVecLoad<T> && kHasVecLoad<W>) {
        block4(x, w + n0 * c.k, out, bias, n0, c);
        continue;
      }
#endif
      for (int j = 0; j < kRowsPerTile; ++j) row1(x, w + (n0 + j) * c.k, out, bias, n0 + j, c);
    }
  });
  for (int64_t col = blocks * kRowsPerTile; col < c.n; ++col) {
    row1(x, w + col * c.k, out, bias, col, c);
  }
}

}  // namespace

// out [M, N] <- x [M, K] @ w [N, K]^T (+ bias [N]); one dtype for all, or float32 x, out
// and bias over bf16/fp16 w.
void linear_small_m(at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                    const std::optional<at::Tensor>& bias) {
  check_rows(x, "x");
  TORCH_CHECK(w.device().is_cpu() && w.dim() == 2 && w.is_contiguous(),
              "w must be a contiguous 2-D CPU tensor [N, K]");
  TORCH_CHECK(w.size(1) == x.size(1), "x has ", x.size(1), " columns, w has ", w.size(1));
  const bool half_w_under_float = x.scalar_type() == at::kFloat &&
                                  (w.scalar_type() == at::kBFloat16 || w.scalar_type() == at::kHalf);
  TORCH_CHECK((w.scalar_type() == x.scalar_type() || half_w_under_float) &&
                  out.scalar_type() == x.scalar_type(),
              "x, w and out must share one dtype (or float32 x and out over a bf16/fp16 w)");
  const bool has_bias = check_linear_out_bias(out, x, w, bias);
  const GemmCall call{x.size(0), w.size(0), x.size(1), x.stride(0)};
  if (call.m == 0 || call.n == 0) return;
  if (half_w_under_float) {
    AT_DISPATCH_REDUCED_FLOATING_TYPES(w.scalar_type(), "linear_small_m", [&] {
      run_gemm<float, scalar_t>(out.data_ptr<float>(), x.data_ptr<float>(),
                                w.data_ptr<scalar_t>(),
                                has_bias ? bias->data_ptr<float>() : nullptr, call);
    });
    return;
  }
  SGL_DISPATCH_FLOATS(x.scalar_type(), "linear_small_m", [&] {
    run_gemm<scalar_t, scalar_t>(out.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                                 w.data_ptr<scalar_t>(),
                                 has_bias ? bias->data_ptr<scalar_t>() : nullptr, call);
  });
}

}  // namespace sgl_cpu
