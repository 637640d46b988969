// y = x W^T (+ b) for many rows with x, W, b and y all bf16, on CPUs with the AVX-512 bf16
// dot product (vdpbf16ps: 16 float32 lanes, each adding the products of one pair of bf16
// values, 32 multiply-adds per instruction against an FMA's 16). linear_packed's entry
// point calls this for bf16 x over bf16 W where the build has the instruction.
//
// Shapes: x [M, K] bf16 (rows contiguous, any row stride), W [N, K] contiguous bf16,
// b [N] bf16 or none, out [M, N] bf16 contiguous.
//
// A work item is a panel of kPanel output columns. Its W rows are packed once per M block
// into a thread-local [ceil(K / 2), kPanel] array of bf16 pairs (pair p of column j holds
// W[j, 2p] and W[j, 2p + 1]; an odd K's last pair is padded with a zero), which is the
// 16 x 16 transpose of 32-bit words of W's rows, done in registers. Register tiles of
// kTileRows rows x kPanel columns then broadcast one pair of x per row against each
// vector of pairs. Sums are float32 over the whole K (no K blocks: the panel, 64 bytes per
// K element, stays in L2 up to K = 16384), rounded to bf16 (nearest even) once. The
// layout is pack_weight_panels' (gemm_packed.cpp) at the same width, so a weight packed
// once at load (layers/weight_panels.py) is read in place of the per-call panels: the
// same words, so the same results.
#include <ATen/ATen.h>

#include <cstring>
#include <vector>

#include "common.h"
#include "gemm_packed_bf16.h"
#include "vec.h"

namespace sgl_cpu {

#if defined(SGL_HAVE_BF16_DOT)
namespace {

constexpr int64_t kPanel = 2 * kVecWidth;  // output columns per panel: two vectors of lanes
constexpr int kTileRows = 12;              // 24 accumulators + 2 W + 1 x of 32 zmm
constexpr int64_t kXBlockBytes = 256 << 10;

struct Bf16Call {
  int64_t m, n, k, pairs, x_stride;
  const c10::BFloat16* bias;  // [N] or nullptr
};

// The pair of x[row] at `pair` as one 32-bit word, zero-padded past K.
inline int32_t x_pair(const c10::BFloat16* row, int64_t pair, int64_t k) {
  const int64_t i = 2 * pair;
  if (i + 1 < k) {
    int32_t word;
    std::memcpy(&word, row + i, sizeof(word));
    return word;
  }
  uint16_t lo;
  std::memcpy(&lo, row + i, sizeof(lo));
  return int32_t(lo);  // the odd K's last element, paired with zero
}

// panel [pairs, kPanel] of 32-bit words <- W rows n0 .. n0 + cols; columns past `cols`
// (the N tail) and the pad of an odd K are zero.
void pack_panel(uint32_t* panel, const c10::BFloat16* w, int64_t n0, int64_t cols,
                const Bf16Call& c) {
  const int64_t full_pairs = c.k / 2;
  const int64_t pairs_vec = full_pairs - full_pairs % kVecWidth;
  vfloat block[kVecWidth];
  for (int64_t half = 0; half < kPanel; half += kVecWidth) {
    for (int64_t p0 = 0; p0 < pairs_vec; p0 += kVecWidth) {
      for (int64_t j = 0; j < kVecWidth; ++j) {  // 16 pairs (32 bf16) of one W row
        block[j] = half + j < cols
                       ? _mm512_castsi512_ps(_mm512_loadu_si512(w + (n0 + half + j) * c.k + 2 * p0))
                       : vzero();
      }
      vtranspose(block);  // 32-bit words: block[t] = pair p0 + t of the 16 columns
      for (int64_t t = 0; t < kVecWidth; ++t) {
        vstore(reinterpret_cast<float*>(panel + (p0 + t) * kPanel + half), block[t]);
      }
    }
  }
  for (int64_t j = 0; j < kPanel; ++j) {  // the pairs past the last 16, and an odd K's pad
    for (int64_t p = pairs_vec; p < c.pairs; ++p) {
      panel[p * kPanel + j] = j < cols ? uint32_t(x_pair(w + (n0 + j) * c.k, p, c.k)) : 0u;
    }
  }
}

// out rows [0, R) x columns [n0, n0 + cols) <- x rows [0, R) over the whole panel.
template <int R>
void panel_tile(const c10::BFloat16* x, const uint32_t* panel, c10::BFloat16* out, int64_t n0,
                int64_t cols, const Bf16Call& c) {
  __m512 lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < c.pairs; ++p) {
    const __m512bh w_lo = (__m512bh)_mm512_loadu_si512(panel + p * kPanel);
    const __m512bh w_hi = (__m512bh)_mm512_loadu_si512(panel + p * kPanel + kVecWidth);
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(x_pair(x + r * c.x_stride, p, c.k));
      lo[r] = _mm512_dpbf16_ps(lo[r], xv, w_lo);
      hi[r] = _mm512_dpbf16_ps(hi[r], xv, w_hi);
    }
  }
  const __m512 b_lo = load_bias(c.bias, n0, cols);
  const __m512 b_hi = load_bias(c.bias, n0 + kVecWidth, cols - kVecWidth);
  for (int r = 0; r < R; ++r) {
    store_bf16(out + r * c.n + n0, _mm512_add_ps(lo[r], b_lo), cols);
    store_bf16(out + r * c.n + n0 + kVecWidth, _mm512_add_ps(hi[r], b_hi), cols - kVecWidth);
  }
}

// Panels [begin, end) for x rows [m0, m1): each packed into `scratch`, or read from
// `packed` (all of w's panels, packed at load) when given.
void run_panels(c10::BFloat16* out, const c10::BFloat16* x, const c10::BFloat16* w,
                const Bf16Call& c, uint32_t* scratch, const uint32_t* packed, int64_t begin,
                int64_t end, int64_t m0, int64_t m1) {
  for (int64_t p = begin; p < end; ++p) {
    const int64_t n0 = p * kPanel, cols = std::min(kPanel, c.n - n0);
    const uint32_t* panel = scratch;
    if (packed != nullptr) {
      panel = packed + p * c.pairs * kPanel;
    } else {
      pack_panel(scratch, w, n0, cols, c);
    }
    int64_t r = m0;
    for (; r + kTileRows <= m1; r += kTileRows) {
      panel_tile<kTileRows>(x + r * c.x_stride, panel, out + r * c.n, n0, cols, c);
    }
    with_rows<kTileRows - 1>(int(m1 - r), [&](auto rows) {
      panel_tile<decltype(rows)::value>(x + r * c.x_stride, panel, out + r * c.n, n0, cols, c);
    });
  }
}

// x rows [0, R) as 32-bit pairs, R rows of `pairs` words (an odd K's last pair
// zero-padded), so the GEMV's inner loop broadcasts a word with no tail test.
std::vector<uint32_t> x_words(const c10::BFloat16* x, int rows, const Bf16Call& c) {
  std::vector<uint32_t> words(size_t(rows) * size_t(c.pairs));
  for (int r = 0; r < rows; ++r) {
    for (int64_t p = 0; p < c.pairs; ++p) {
      words[r * c.pairs + p] = uint32_t(x_pair(x + r * c.x_stride, p, c.k));
    }
  }
  return words;
}

// Rows of x per GEMV pass (a call of more rows runs several): 7 rows x 2 streams x 2
// sums + 2 W + 1 x of 32 zmm.
constexpr int kGemvMaxRows = 7;
// Panel bytes prefetched ahead, split over a panel's streams (8 KiB ahead of one stream,
// 2 KiB of each of 4). Qwen3-0.6B's projections and its lm_head, cold, 2 threads (AMX
// Xeon): 4 streams 2 KiB ahead ran 1 row in 0.82-0.88x the time of one stream 8 KiB
// ahead, 2-7 rows in 0.86-0.97x; 4 KiB each the same or slower. The demo model's
// weights (in L3) ran 4 rows 1.1x slower on one stream 2 KiB ahead than 8 KiB.
constexpr int64_t kGemvAheadBytes = 8 << 10;

// Streams a panel is read in (its pairs split into this many equal parts, each with its
// own sums): one sequential stream per thread leaves the memory system idle between its
// prefetches. 4 streams x R rows x 2 sums + 2 W + 1 x registers up to 3 rows.
template <int R>
constexpr int gemv_streams() {
  return 8 * R + 3 <= 32 ? 4 : (4 * R + 3 <= 32 ? 2 : 1);
}

// Panels of fewer pairs (K < 1024) are read as 2 streams up to 3 rows and 1 from 4 (as
// the GEMV with one stream and two chains was): the demo model's weights (K 256-704, in
// L3) ran 2-7 rows up to 1.19x slower on 4 streams and 4-7 rows up to 1.2x on 2; only
// the larger ones (Qwen3-0.6B's, K >= 1024) were measured faster.
constexpr int64_t kGemvFourStreamMinPairs = 512;

// sums (lo, hi) of rows [0, R) += x rows [0, R) (as words) . the panel's pair q.
template <int R>
inline void add_pair(const uint32_t* xw, const uint32_t* panel, int64_t q, __m512* lo,
                     __m512* hi, const Bf16Call& c) {
  const __m512bh w_lo = (__m512bh)_mm512_loadu_si512(panel + q * kPanel);
  const __m512bh w_hi = (__m512bh)_mm512_loadu_si512(panel + q * kPanel + kVecWidth);
  for (int r = 0; r < R; ++r) {
    const __m512bh xv = (__m512bh)_mm512_set1_epi32(int32_t(xw[r * c.pairs + q]));
    lo[r] = _mm512_dpbf16_ps(lo[r], xv, w_lo);
    hi[r] = _mm512_dpbf16_ps(hi[r], xv, w_hi);
  }
}

// out rows [0, R) x columns [n0, n0 + cols) <- the R rows of x (as words) over one
// load-time panel, read as S streams.
template <int R, int S>
void panel_gemv(const uint32_t* xw, const uint32_t* panel, c10::BFloat16* out, int64_t n0,
                int64_t cols, const Bf16Call& c) {
  constexpr int64_t kAheadPairs = kGemvAheadBytes / S / (kPanel * 4);
  __m512 lo[S][R], hi[S][R];
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < R; ++r) lo[s][r] = hi[s][r] = _mm512_setzero_ps();
  const int64_t part = c.pairs / S;
  for (int64_t p = 0; p < part; ++p) {
    for (int s = 0; s < S; ++s) {
      const uint32_t* w = panel + (s * part + p + kAheadPairs) * kPanel;
      _mm_prefetch(reinterpret_cast<const char*>(w), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w + kVecWidth), _MM_HINT_T0);
    }
    for (int s = 0; s < S; ++s) add_pair<R>(xw, panel, s * part + p, lo[s], hi[s], c);
  }
  for (int64_t q = S * part; q < c.pairs; ++q) {  // the parts' rest
    add_pair<R>(xw, panel, q, lo[S - 1], hi[S - 1], c);
  }
  const __m512 b_lo = load_bias(c.bias, n0, cols);
  const __m512 b_hi = load_bias(c.bias, n0 + kVecWidth, cols - kVecWidth);
  for (int r = 0; r < R; ++r) {
    __m512 sum_lo = lo[0][r], sum_hi = hi[0][r];
    for (int s = 1; s < S; ++s) {
      sum_lo = _mm512_add_ps(sum_lo, lo[s][r]);
      sum_hi = _mm512_add_ps(sum_hi, hi[s][r]);
    }
    store_bf16(out + r * c.n + n0, _mm512_add_ps(sum_lo, b_lo), cols);
    store_bf16(out + r * c.n + n0 + kVecWidth, _mm512_add_ps(sum_hi, b_hi), cols - kVecWidth);
  }
}

// out rows [0, M) x panel p's columns, kGemvMaxRows rows of x at a time while the
// panel stays in L1/L2 (a weight past the caches is read from memory once per call).
void gemv_panel(c10::BFloat16* out, const uint32_t* xw, const uint32_t* packed, int64_t p,
                const Bf16Call& c) {
  const int64_t n0 = p * kPanel, cols = std::min(kPanel, c.n - n0);
  const uint32_t* panel = packed + p * c.pairs * kPanel;
  for (int64_t m0 = 0; m0 < c.m; m0 += kGemvMaxRows) {
    with_rows<kGemvMaxRows>(int(std::min<int64_t>(kGemvMaxRows, c.m - m0)), [&](auto r) {
      constexpr int R = decltype(r)::value;
      constexpr int kMost = gemv_streams<R>(), kFew = R <= 3 ? 2 : 1;
      if (c.pairs >= kGemvFourStreamMinPairs) {
        panel_gemv<R, kMost>(xw + m0 * c.pairs, panel, out + m0 * c.n, n0, cols, c);
      } else {
        panel_gemv<R, kFew>(xw + m0 * c.pairs, panel, out + m0 * c.n, n0, cols, c);
      }
    });
  }
}

}  // namespace

int64_t bf16_dot_panel_width() { return kPanel; }

void linear_panels_gemv_bf16(at::Tensor& out, const at::Tensor& x, const c10::BFloat16* bias,
                             const uint32_t* packed, int64_t n) {
  const int64_t k = x.size(1);
  const Bf16Call c{x.size(0), n, k, (k + 1) / 2, x.stride(0), bias};
  const std::vector<uint32_t> xw = x_words(x.data_ptr<c10::BFloat16>(), int(c.m), c);
  auto* op = out.data_ptr<c10::BFloat16>();
  const int64_t panels = (c.n + kPanel - 1) / kPanel;
  sgl_cpu::parallel_for(0, panels, kPanel * c.k * c.m, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) gemv_panel(op, xw.data(), packed, p, c);
  });
}

void linear_packed_bf16_dot(at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                            const c10::BFloat16* bias, const uint32_t* packed) {
  const int64_t k = x.size(1);
#if defined(SGL_HAVE_AMX_BF16)
  if (packed != nullptr && amx_serves(k)) {  // AMX tiles over the load-time panels
    linear_amx_bf16(out, x, bias, packed, w.size(0));
    return;
  }
#endif
  const Bf16Call c{x.size(0), w.size(0), k, (k + 1) / 2, x.stride(0), bias};
  const int64_t panels = (c.n + kPanel - 1) / kPanel;
  const int64_t x_rows = kXBlockBytes / std::max<int64_t>(1, c.k * int64_t(sizeof(c10::BFloat16)));
  const int64_t m_block = std::max<int64_t>(kTileRows, x_rows - x_rows % kTileRows);
  auto* op = out.data_ptr<c10::BFloat16>();
  const auto* xp = x.data_ptr<c10::BFloat16>();
  // with the panels W itself is not read (it may be shape-only: layers/weight_panels.py)
  const c10::BFloat16* wp = packed == nullptr ? w.data_ptr<c10::BFloat16>() : nullptr;
  sgl_cpu::parallel_for(0, panels, kPanel * c.k * c.m, [&](int64_t begin, int64_t end) {
    std::vector<uint32_t> scratch(packed == nullptr ? c.pairs * kPanel : 0);
    for (int64_t m0 = 0; m0 < c.m; m0 += m_block) {
      run_panels(op, xp, wp, c, scratch.data(), packed, begin, end, m0,
                 std::min(c.m, m0 + m_block));
    }
  });
}
#endif

}  // namespace sgl_cpu
