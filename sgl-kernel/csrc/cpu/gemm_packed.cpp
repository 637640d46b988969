// y = x W^T (+ b) for many rows (a decode batch past linear_small_m's range, a prefill
// chunk) over a weight kept in bf16/fp16 under float32 compute, without widening the
// whole weight first (what F.linear needs: a copy of 2x the weight's bytes per call).
//
// Shapes: x [M, K] float32 (rows contiguous, any row stride), W [N, K] contiguous bf16,
// fp16 or float32, b [N] float32 or none, out [M, N] float32 contiguous.
//
// Each work item is a panel of kPanel output columns: its W rows are widened and
// transposed once into a thread-local [K, kPanel] float32 buffer, then every row of x
// runs over it in register tiles of kTileRows rows x kPanel columns, the broadcast form
// of a GEMM micro-kernel (one x value times a vector of W columns: no horizontal sums).
// Packing costs K x kPanel conversions per panel against M x K x kPanel multiply-adds.
// A call with many panels also packs x once, in tiles (see pack_x).
//
// A bf16 weight may come with its panels packed once at load (pack_weight_panels, kept
// beside the weight by the model loader): each panel [ceil(K / 2), kPanel] of 32-bit
// words, word (q, j) holding W[n0 + j, 2q] in its low half and W[n0 + j, 2q + 1] in its
// high half. A bf16 value is a float32's upper half, so the tile widens a word into two
// K rows with one shift or one mask (vpair_low / vpair_high) and no call packs: at 32
// rows the per-call packing was 12% of a served decode step's samples (2-core Zen 2).
// Same multiply-adds in the same order, so the same results as the per-call panels.
// Without vector instructions the call widens W and runs at::linear.
#include <ATen/ATen.h>

#include <memory>
#include <type_traits>

#include "common.h"
#include "gemm_packed_bf16.h"
#include "kernels.h"
#include "vec.h"

namespace sgl_cpu {
namespace {

#if defined(SGL_HAVE_VEC)
constexpr int64_t kPanel = 2 * kVecWidth;  // output columns per panel: two vectors
// rows per tile: 2 x kTileRows accumulators + 2 W vectors + 1 x broadcast registers
constexpr int kTileRows = kVecRegisters == 32 ? 12 : 6;
// panel rows per K block: 16 KiB of panel (256 rows on AVX2, 128 on AVX-512), which stays
// in L1 beside a tile's x. 128 rows on AVX2 (8 KiB) ran the demo model's linears 5-6%
// slower (AVX2 EPYC, one thread and two, A/B alternating): twice the tile set-ups and
// the out tile stored and loaded again between the K blocks.
constexpr int64_t kKBlock = (16 << 10) / (kPanel * int64_t(sizeof(float)));
static_assert(kKBlock % 2 == 0, "pair_tile's K blocks are whole word rows");
// The same 16 KiB of L1 holds twice the K rows of a panel packed at load (two bf16 values
// per 32-bit word): the K = 704 down projection then takes 2 blocks instead of 3, 2-3%
// faster at 32-256 rows (AVX2 EPYC, 2 threads, A/B alternating); bitwise the same sums.
constexpr int64_t kWordKBlock = 2 * kKBlock;
// x is packed (pack_x) when a call has at least this many panels (N >= 2048 on AVX2):
// the copy of x is then paid back over the panels. Measured on the AVX2 EPYC, A/B, two
// threads: M 256 x N 8192 (the demo's lm_head) +6%, M 1024 x N 2048 +11%, but N 256 x
// K 704 -13% (16 panels do not pay for the copy).
constexpr int64_t kPackXMinPanels = 128;
constexpr int64_t kXBlockBytes = 256 << 10;  // see m_block_rows

struct PackedCall {
  int64_t m, n, k, x_stride;
  const float* bias;  // [N] or nullptr
};

// panel [K, kPanel] <- W rows n0 .. n0 + cols, widened and transposed; columns past
// `cols` are zero (the N tail). Square blocks of kVecWidth rows x kVecWidth k go through
// registers (vtranspose): a scalar loop writing the panel a column at a time cost as much
// as the multiply-adds of a 32-row call.
template <typename W>
void pack_panel(float* panel, const W* w, int64_t n0, int64_t cols, int64_t k) {
  const int64_t k_vec = k - k % kVecWidth;
  vfloat block[kVecWidth];
  for (int64_t half = 0; half < kPanel; half += kVecWidth) {
    for (int64_t k0 = 0; k0 < k_vec; k0 += kVecWidth) {
      for (int64_t j = 0; j < kVecWidth; ++j) {
        block[j] = half + j < cols ? vload(w + (n0 + half + j) * k + k0) : vzero();
      }
      vtranspose(block);
      for (int64_t t = 0; t < kVecWidth; ++t) vstore(panel + (k0 + t) * kPanel + half, block[t]);
    }
  }
  for (int64_t j = 0; j < kPanel; ++j) {  // the K tail
    for (int64_t kk = k_vec; kk < k; ++kk) {
      panel[kk * kPanel + j] = j < cols ? static_cast<float>(w[(n0 + j) * k + kk]) : 0.f;
    }
  }
}

// x value (row r, column kk) of a tile: x rows as given (PACKED false: row stride
// c.x_stride) or a tile packed by pack_x ([K, R]: the R values of a column together).
template <int R, bool PACKED>
inline float tile_x(const float* x, int r, int64_t kk, const PackedCall& c) {
  return PACKED ? x[kk * R + r] : x[r * c.x_stride + kk];
}

// out rows [0, R) x columns [n0, n0 + cols) <- a tile's sums (lo: the panel's first
// vector of columns, hi: its second), plus the bias after the last K block.
template <int R>
inline void store_tile(const vfloat* lo, const vfloat* hi, float* out, int64_t n0, int64_t cols,
                       const PackedCall& c, bool last) {
  if (cols == kPanel) {  // a whole panel: vector stores (bias added as vectors)
    const bool bias = last && c.bias != nullptr;
    const vfloat b_lo = bias ? vload(c.bias + n0) : vzero();
    const vfloat b_hi = bias ? vload(c.bias + n0 + kVecWidth) : vzero();
    for (int r = 0; r < R; ++r) {
      vstore(out + r * c.n + n0, vadd(lo[r], b_lo));
      vstore(out + r * c.n + n0 + kVecWidth, vadd(hi[r], b_hi));
    }
    return;
  }
  alignas(64) float row[kPanel];  // a partial panel comes in one K block: last is true
  for (int r = 0; r < R; ++r) {
    vstore(row, lo[r]);
    vstore(row + kVecWidth, hi[r]);
    float* o = out + r * c.n + n0;
    for (int64_t j = 0; j < cols; ++j) o[j] = row[j] + (c.bias ? c.bias[n0 + j] : 0.f);
  }
}

// out rows [0, R) x columns [n0, n0 + cols) (+)= x rows [0, R) over panel rows [k0, k1):
// the first K block starts the sums, later ones add to what `out` holds, the last adds the
// bias. A partial panel (the N tail, cols < kPanel) comes in one block.
template <int R, bool PACKED>
void panel_tile(const float* x, const float* panel, float* out, int64_t n0, int64_t cols,
                const PackedCall& c, int64_t k0, int64_t k1) {
  const bool first = k0 == 0, last = k1 == c.k;
  // The first K block starts its sums with a multiply (k0 < k1 always): zeroing the
  // accumulators first made GCC turn the zeroing loop into two memset calls per tile
  // on stack copies of lo and hi (perf: memset 4.4% of the batch-256 offline run).
  vfloat lo[R], hi[R];
  int64_t k_from = k0;
  if (first) {
    const vfloat w_lo = vload(panel + k0 * kPanel);
    const vfloat w_hi = vload(panel + k0 * kPanel + kVecWidth);
    for (int r = 0; r < R; ++r) {
      const vfloat xv = vset1(tile_x<R, PACKED>(x, r, k0, c));
      lo[r] = vmul(xv, w_lo);
      hi[r] = vmul(xv, w_hi);
    }
    ++k_from;
  } else {
    for (int r = 0; r < R; ++r) {
      lo[r] = vload(out + r * c.n + n0);
      hi[r] = vload(out + r * c.n + n0 + kVecWidth);
    }
  }
  for (int64_t kk = k_from; kk < k1; ++kk) {
    const vfloat w_lo = vload(panel + kk * kPanel);
    const vfloat w_hi = vload(panel + kk * kPanel + kVecWidth);
    for (int r = 0; r < R; ++r) {
      const vfloat xv = vset1(tile_x<R, PACKED>(x, r, kk, c));
      lo[r] = vfma(xv, w_lo, lo[r]);
      hi[r] = vfma(xv, w_hi, hi[r]);
    }
  }
  store_tile<R>(lo, hi, out, n0, cols, c, last);
}

// panel_tile over a panel packed at load (`words`: the panel's [ceil(K / 2), kPanel]
// words); k0 is even (K blocks are whole pairs), so word row k / 2 holds rows k and k + 1.
template <int R, bool PACKED>
void pair_tile(const float* x, const uint32_t* words, float* out, int64_t n0, int64_t cols,
               const PackedCall& c, int64_t k0, int64_t k1) {
  const bool first = k0 == 0, last = k1 == c.k;
  vfloat lo[R], hi[R];  // started with a multiply, as in panel_tile (no memset)
  int64_t kk = k0;
  const uint32_t* w = words + (k0 / 2) * kPanel;
  if (first) {
    const vfloat w_lo = vpair_low(w), w_hi = vpair_low(w + kVecWidth);
    for (int r = 0; r < R; ++r) {
      const vfloat xv = vset1(tile_x<R, PACKED>(x, r, kk, c));
      lo[r] = vmul(xv, w_lo);
      hi[r] = vmul(xv, w_hi);
    }
    if (kk + 1 < k1) {
      const vfloat v_lo = vpair_high(w), v_hi = vpair_high(w + kVecWidth);
      for (int r = 0; r < R; ++r) {
        const vfloat xv = vset1(tile_x<R, PACKED>(x, r, kk + 1, c));
        lo[r] = vfma(xv, v_lo, lo[r]);
        hi[r] = vfma(xv, v_hi, hi[r]);
      }
    }
    kk += 2;
    w += kPanel;
  } else {
    for (int r = 0; r < R; ++r) {
      lo[r] = vload(out + r * c.n + n0);
      hi[r] = vload(out + r * c.n + n0 + kVecWidth);
    }
  }
  // Even rows then odd rows of each word row: two W vectors live at a time, so R = 6 on
  // AVX2 keeps 12 sums + 2 W + 1 x in the 16 ymm registers (the word row is read twice,
  // from L1).
  for (; kk + 1 < k1; kk += 2, w += kPanel) {
    const vfloat e_lo = vpair_low(w), e_hi = vpair_low(w + kVecWidth);
    for (int r = 0; r < R; ++r) {
      const vfloat xv = vset1(tile_x<R, PACKED>(x, r, kk, c));
      lo[r] = vfma(xv, e_lo, lo[r]);
      hi[r] = vfma(xv, e_hi, hi[r]);
    }
    const vfloat o_lo = vpair_high(w), o_hi = vpair_high(w + kVecWidth);
    for (int r = 0; r < R; ++r) {
      const vfloat xv = vset1(tile_x<R, PACKED>(x, r, kk + 1, c));
      lo[r] = vfma(xv, o_lo, lo[r]);
      hi[r] = vfma(xv, o_hi, hi[r]);
    }
  }
  if (kk < k1) {  // an odd K's last row (the word's high half is the zero pad)
    const vfloat e_lo = vpair_low(w), e_hi = vpair_low(w + kVecWidth);
    for (int r = 0; r < R; ++r) {
      const vfloat xv = vset1(tile_x<R, PACKED>(x, r, kk, c));
      lo[r] = vfma(xv, e_lo, lo[r]);
      hi[r] = vfma(xv, e_hi, hi[r]);
    }
  }
  store_tile<R>(lo, hi, out, n0, cols, c, last);
}

// x rows per M block: a block of x (<= kXBlockBytes) stays in L2 while the thread's
// panels pass over it; past it (a 2048-row prefill chunk is 2 MiB of x at K = 256) every
// panel would stream all of x from L3. A panel is packed again for each M block.
int64_t m_block_rows(const PackedCall& c) {
  const int64_t rows = kXBlockBytes / (c.k * int64_t(sizeof(float)));
  return std::max<int64_t>(kTileRows, rows - rows % kTileRows);
}

// tile(rows, r, k0, k1) for every register tile of x rows [m0, m1) over one panel (rows
// an std::integral_constant: kTileRows, then the M tail), K block by K block: each block
// of kKBlock panel rows stays in L1 while every tile of x passes over it (a whole K = 704
// panel plus a tile's x rows is more than L1 holds). A partial panel (the N tail) comes
// in one block. Word panels (packed at load) pass full_k_block = kWordKBlock; both are
// even, so a block is whole word rows.
template <typename Tile>
inline void for_each_tile(const PackedCall& c, int64_t cols, int64_t m0, int64_t m1,
                          const Tile& tile, int64_t full_k_block = kKBlock) {
  const int64_t k_block = cols == kPanel ? full_k_block : c.k;
  for (int64_t k0 = 0; k0 < c.k; k0 += k_block) {
    const int64_t k1 = std::min(c.k, k0 + k_block);
    int64_t r = m0;
    for (; r + kTileRows <= m1; r += kTileRows) {
      tile(std::integral_constant<int, kTileRows>{}, r, k0, k1);
    }
    with_rows<kTileRows - 1>(int(m1 - r), [&](auto rows) { tile(rows, r, k0, k1); });
  }
}

// Panels [begin, end) for x rows [m0, m1) over the panels packed at load (`words`:
// [panels, ceil(K / 2), kPanel]); x as given or packed, as run_panels.
template <bool PACKED>
void run_pair_panels(float* out, const float* x, const uint32_t* words, const PackedCall& c,
                     int64_t begin, int64_t end, int64_t m0, int64_t m1) {
  const int64_t tile_stride = PACKED ? c.k : c.x_stride;
  const int64_t panel_words = ((c.k + 1) / 2) * kPanel;
  for (int64_t p = begin; p < end; ++p) {
    const int64_t n0 = p * kPanel, cols = std::min(kPanel, c.n - n0);
    const uint32_t* panel = words + p * panel_words;
    for_each_tile(c, cols, m0, m1, [&](auto rows, int64_t r, int64_t k0, int64_t k1) {
      pair_tile<decltype(rows)::value, PACKED>(x + r * tile_stride, panel, out + r * c.n, n0,
                                               cols, c, k0, k1);
    }, kWordKBlock);
  }
}

// Panels [begin, end) for x rows [m0, m1); x as given (PACKED false) or packed by pack_x.
template <bool PACKED, typename W>
void run_panels(float* out, const float* x, const W* w, const PackedCall& c, float* panel,
                int64_t begin, int64_t end, int64_t m0, int64_t m1) {
  // where the tile of rows from r starts: both layouts keep a row's K values at r * K
  // offsets (packed: a tile [K, rows] fills rows r .. r + rows - 1's share)
  const int64_t tile_stride = PACKED ? c.k : c.x_stride;
  for (int64_t p = begin; p < end; ++p) {
    const int64_t n0 = p * kPanel, cols = std::min(kPanel, c.n - n0);
    pack_panel(panel, w, n0, cols, c.k);
    for_each_tile(c, cols, m0, m1, [&](auto rows, int64_t r, int64_t k0, int64_t k1) {
      panel_tile<decltype(rows)::value, PACKED>(x + r * tile_stride, panel, out + r * c.n, n0,
                                                cols, c, k0, k1);
    });
  }
}

// xt [M * K] <- x in tiles of kTileRows rows (the last one shorter when M is not a
// multiple), tile t at xt + t * kTileRows * K holding [K, rows]: the tile's broadcasts
// then read one contiguous stream instead of one per row (M blocks are whole tiles).
void pack_x(float* xt, const float* x, const PackedCall& c) {
  const int64_t tiles = (c.m + kTileRows - 1) / kTileRows;
  sgl_cpu::parallel_for(0, tiles, c.k * kTileRows, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r0 = t * kTileRows, rows = std::min<int64_t>(kTileRows, c.m - r0);
      float* tile = xt + r0 * c.k;
      for (int64_t r = 0; r < rows; ++r) {
        const float* src = x + (r0 + r) * c.x_stride;
        for (int64_t kk = 0; kk < c.k; ++kk) tile[kk * rows + r] = src[kk];
      }
    }
  });
}

// Panels [p0, p1) for x rows [m0, m1): over the load-time `words` when given, else
// packing each panel of `w` into `panel`; x packed by pack_x when `packed`.
template <typename W>
void run_chunk(float* out, const float* x, const W* w, const uint32_t* words,
               const PackedCall& c, float* panel, bool packed, int64_t p0, int64_t p1,
               int64_t m0, int64_t m1) {
  if (words != nullptr) {
    if (packed) {
      run_pair_panels<true>(out, x, words, c, p0, p1, m0, m1);
    } else {
      run_pair_panels<false>(out, x, words, c, p0, p1, m0, m1);
    }
  } else if (packed) {
    run_panels<true>(out, x, w, c, panel, p0, p1, m0, m1);
  } else {
    run_panels<false>(out, x, w, c, panel, p0, p1, m0, m1);
  }
}

// Work units are (M block, panel) pairs, M block major, claimed in chunks: a thread's
// chunk mostly stays in one M block, so its x rows stay in L2 across the chunk's panels.
// `words`: the weight's panels packed at load, or nullptr (each call packs its own).
template <typename W>
void run_packed(float* out, const float* x, const W* w, const PackedCall& c,
                const uint32_t* words = nullptr) {
  const int64_t panels = (c.n + kPanel - 1) / kPanel;
  const int64_t m_block = m_block_rows(c);
  const int64_t m_blocks = (c.m + m_block - 1) / m_block;
  const int64_t work_per_unit = kPanel * c.k * std::min(c.m, m_block);
  const bool pack = panels >= kPackXMinPanels;
  std::unique_ptr<float[]> xt(pack ? new float[c.m * c.k] : nullptr);  // written before read
  if (pack) pack_x(xt.get(), x, c);
  const float* xs = pack ? xt.get() : x;
  sgl_cpu::parallel_for_claimed(0, m_blocks * panels, work_per_unit, [&](int64_t begin, int64_t end) {
    // the per-call path's panel buffer: every entry is written by pack_panel before it
    // is read (no zero fill); none when the panels were packed at load
    std::unique_ptr<float[]> panel(words == nullptr ? new float[c.k * kPanel] : nullptr);
    for (int64_t u = begin; u < end;) {
      const int64_t m0 = (u / panels) * m_block, p0 = u % panels;
      const int64_t p1 = std::min(panels, p0 + (end - u)), m1 = std::min(c.m, m0 + m_block);
      run_chunk(out, xs, w, words, c, panel.get(), pack, p0, p1, m0, m1);
      u += p1 - p0;
    }
  });
}

// The decode-size GEMV over the load-time panels (float32 x and out): each panel streams
// from memory once per call, for all the call's rows (a pass of up to kGemvMaxRows rows
// at a time while the panel sits in L1/L2), no K blocks, the panel prefetched ahead.
// Rows per pass: one chain per sum holds 2R sums + 2 W + 1 x registers (the word's low
// rows, then its high rows, as pair_tile).
constexpr int kGemvMaxRows = kVecRegisters == 32 ? 4 : 6;
// Panel bytes prefetched ahead, split over a panel's streams (gemv_streams: 2 KiB ahead
// of each of 4, 8 KiB of one). Qwen3-0.6B's projections, cold, 2 threads, 1-4 rows (Xeon,
// the AVX2 and AVX-512 builds): 4 streams 2 KiB ahead ran 0.87-1.10x the small-M
// kernel's time over the row-major weight, 8 KiB each 1.0-1.24x on AVX2, none 1.14-1.65x.
constexpr int64_t kGemvAheadBytes = 8 << 10;
constexpr int64_t kWordRowBytes = kPanel * int64_t(sizeof(uint32_t));

// sums (lo, hi) of rows [0, R) += x rows [0, R) (from xs: x's columns 2p and 2p + 1) over
// one word row `w` of a panel: its low halves (K row 2p), then its high halves (2p + 1).
template <int R>
inline void add_word_row(const float* xs, const uint32_t* w, vfloat* lo, vfloat* hi,
                         const PackedCall& c) {
  const vfloat e_lo = vpair_low(w), e_hi = vpair_low(w + kVecWidth);
  for (int r = 0; r < R; ++r) {
    const vfloat xv = vset1(xs[r * c.x_stride]);
    lo[r] = vfma(xv, e_lo, lo[r]);
    hi[r] = vfma(xv, e_hi, hi[r]);
  }
  const vfloat o_lo = vpair_high(w), o_hi = vpair_high(w + kVecWidth);
  for (int r = 0; r < R; ++r) {
    const vfloat xv = vset1(xs[r * c.x_stride + 1]);
    lo[r] = vfma(xv, o_lo, lo[r]);
    hi[r] = vfma(xv, o_hi, hi[r]);
  }
}

// Streams a panel is read in (its word rows split into this many equal parts, each with
// its own sums): one sequential stream per thread leaves the memory system idle between
// its prefetches. 4 streams of 2 vectors of R rows' sums: 8R (+ 4 W + 1 x) registers.
template <int R>
constexpr int gemv_streams() {
  return 8 * R + 5 <= kVecRegisters ? 4 : (4 * R + 5 <= kVecRegisters ? 2 : 1);
}

// out rows [0, R) x columns [n0, n0 + cols) <- x rows [0, R) (row stride c.x_stride) over
// one panel of words [ceil(K / 2), kPanel] (an odd K's last word holds a zero pad), read
// as gemv_streams<R>() streams.
template <int R>
void panel_gemv(const float* x, const uint32_t* panel, float* out, int64_t n0, int64_t cols,
                const PackedCall& c) {
  constexpr int S = gemv_streams<R>();
  constexpr int64_t kAheadWords = (kGemvAheadBytes / S / kWordRowBytes) * kPanel;
  vfloat lo[S][R], hi[S][R];
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < R; ++r) lo[s][r] = hi[s][r] = vzero();
  const int64_t full_pairs = c.k / 2, part = full_pairs / S;
  for (int64_t p = 0; p < part; ++p) {
    for (int s = 0; s < S; ++s) {
      const uint32_t* w = panel + (s * part + p) * kPanel;
      for (int64_t b = 0; b < kWordRowBytes; b += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(w + kAheadWords) + b, _MM_HINT_T0);
      }
    }
    for (int s = 0; s < S; ++s) {
      const int64_t q = s * part + p;
      add_word_row<R>(x + 2 * q, panel + q * kPanel, lo[s], hi[s], c);
    }
  }
  for (int64_t q = S * part; q < full_pairs; ++q) {  // the parts' rest
    add_word_row<R>(x + 2 * q, panel + q * kPanel, lo[S - 1], hi[S - 1], c);
  }
  if (c.k % 2 != 0) {  // an odd K's last row: the word's low half (x past K is not read)
    const uint32_t* w = panel + full_pairs * kPanel;
    const vfloat e_lo = vpair_low(w), e_hi = vpair_low(w + kVecWidth);
    for (int r = 0; r < R; ++r) {
      const vfloat xv = vset1(x[r * c.x_stride + c.k - 1]);
      lo[0][r] = vfma(xv, e_lo, lo[0][r]);
      hi[0][r] = vfma(xv, e_hi, hi[0][r]);
    }
  }
  const int64_t hi_cols = cols - kVecWidth;
  const vfloat b_lo = c.bias ? vload_first(c.bias + n0, cols, 0.f) : vzero();
  const vfloat b_hi = c.bias && hi_cols > 0 ? vload_first(c.bias + n0 + kVecWidth, hi_cols, 0.f)
                                            : vzero();
  for (int r = 0; r < R; ++r) {
    vfloat sum_lo = lo[0][r], sum_hi = hi[0][r];
    for (int s = 1; s < S; ++s) {
      sum_lo = vadd(sum_lo, lo[s][r]);
      sum_hi = vadd(sum_hi, hi[s][r]);
    }
    vstore_first(out + r * c.n + n0, cols, vadd(sum_lo, b_lo));
    if (hi_cols > 0) vstore_first(out + r * c.n + n0 + kVecWidth, hi_cols, vadd(sum_hi, b_hi));
  }
}

// out rows [0, M) x panel p's columns, kGemvMaxRows rows of x at a time.
void gemv_panel(float* out, const float* x, const uint32_t* words, int64_t p,
                const PackedCall& c) {
  const int64_t n0 = p * kPanel, cols = std::min(kPanel, c.n - n0);
  const uint32_t* panel = words + p * ((c.k + 1) / 2) * kPanel;
  for (int64_t m0 = 0; m0 < c.m; m0 += kGemvMaxRows) {
    with_rows<kGemvMaxRows>(int(std::min<int64_t>(kGemvMaxRows, c.m - m0)), [&](auto r) {
      panel_gemv<decltype(r)::value>(x + m0 * c.x_stride, panel, out + m0 * c.n, n0, cols, c);
    });
  }
}
#endif

}  // namespace

int64_t weight_panel_width() {
#if defined(SGL_HAVE_VEC)
  return kPanel;
#else
  return 0;
#endif
}

// [ceil(N / kPanel), ceil(K / 2), kPanel] int32 words of a bf16 weight [N, K] (see the
// header): built once at load, read by linear_packed in place of its per-call panels.
at::Tensor pack_weight_panels(const at::Tensor& w) {
  TORCH_CHECK(weight_panel_width() > 0, "weight panels need the AVX2/AVX-512 build");
  TORCH_CHECK(w.device().is_cpu() && w.dim() == 2 && w.is_contiguous() &&
                  w.scalar_type() == at::kBFloat16,
              "w must be a contiguous 2-D bfloat16 CPU tensor [N, K]");
  const int64_t n = w.size(0), k = w.size(1), width = weight_panel_width();
  const int64_t panels = (n + width - 1) / width, pairs = (k + 1) / 2;
  at::Tensor packed = at::zeros({panels, pairs, width}, at::kInt);  // the N tail and K pad: 0
  auto* words = reinterpret_cast<uint32_t*>(packed.data_ptr<int32_t>());
  const auto* bits = reinterpret_cast<const uint16_t*>(w.data_ptr<c10::BFloat16>());
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n0 = p * width, cols = std::min(width, n - n0);
      uint32_t* panel = words + p * pairs * width;
      for (int64_t j = 0; j < cols; ++j) {
        const uint16_t* row = bits + (n0 + j) * k;
        for (int64_t q = 0; q < pairs; ++q) {
          const uint32_t high = 2 * q + 1 < k ? row[2 * q + 1] : 0u;
          panel[q * width + j] = uint32_t(row[2 * q]) | (high << 16);
        }
      }
    }
  });
  return packed;
}

// w's panels as 32-bit words, checked to be pack_weight_panels(w) at `width`.
static const uint32_t* panel_words(const at::Tensor& panels, const at::Tensor& w, int64_t width) {
  TORCH_CHECK(panels.device().is_cpu() && panels.scalar_type() == at::kInt &&
                  panels.is_contiguous() && panels.dim() == 3 &&
                  panels.size(0) == (w.size(0) + width - 1) / width &&
                  panels.size(1) == (w.size(1) + 1) / 2 && panels.size(2) == width,
              "panels must be pack_weight_panels(w)");
  return reinterpret_cast<const uint32_t*>(panels.data_ptr<int32_t>());
}

// out [M, N] <- x [M, K] @ w [N, K]^T (+ bias [N]): float32 x, out and bias with w bf16,
// fp16 or float32; or all bf16 (the bf16 dot product where the build has it, else
// at::linear). `panels`: w's panels from pack_weight_panels (a bf16 w under float32 x, or
// all bf16 on the bf16 dot-product build), read in place of the per-call packing.
void linear_packed(at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                   const std::optional<at::Tensor>& bias, const std::optional<at::Tensor>& panels) {
  check_rows(x, "x");
  const bool all_bf16 = x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16;
  TORCH_CHECK((x.scalar_type() == at::kFloat || all_bf16) && out.scalar_type() == x.scalar_type(),
              "x and out must be float32 (or x, w and out all bfloat16)");
  // a shape-only (meta) w: its values live only in `panels` (layers/weight_panels.py)
  const bool w_values = w.device().is_cpu() || (panels.has_value() && w.is_meta());
  TORCH_CHECK(w_values && w.dim() == 2 && w.is_contiguous() && w.size(1) == x.size(1),
              "w must be a contiguous 2-D CPU tensor [N, K] with K = x's columns (or a "
              "shape-only one with its panels)");
  TORCH_CHECK(w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16 ||
                  w.scalar_type() == at::kHalf,
              "w must be float32, bfloat16 or float16");
  const bool has_bias = check_linear_out_bias(out, x, w, bias);  // bias in x's dtype
  if (x.size(0) == 0 || w.size(0) == 0) return;
  if (x.size(1) == 0) {  // empty sums: the bias alone
    has_bias ? out.copy_(bias->expand_as(out)) : out.zero_();
    return;
  }
  const uint32_t* words = nullptr;
  if (panels.has_value()) {
    const int64_t width = weight_panel_width();
    TORCH_CHECK(width > 0 && (x.scalar_type() == at::kFloat || all_bf16) &&
                    w.scalar_type() == at::kBFloat16,
                "panels are for a bfloat16 w under float32 or bfloat16 x on the AVX2/AVX-512 "
                "build");
    words = panel_words(*panels, w, width);
  }
  TORCH_CHECK(words != nullptr || !w.is_meta(), "a shape-only w needs its panels");
  if (all_bf16) {
#if defined(SGL_HAVE_BF16_DOT)
    TORCH_CHECK(words == nullptr || bf16_dot_panel_width() == weight_panel_width(),
                "the bf16 dot product's panels are not pack_weight_panels' width");
    linear_packed_bf16_dot(out, x, w, has_bias ? bias->data_ptr<c10::BFloat16>() : nullptr,
                           words);
#else  // at::linear: panels, if any, are not read
    out.copy_(at::linear(x, w, has_bias ? *bias : at::Tensor()));
#endif
    return;
  }
#if defined(SGL_HAVE_VEC)
  const PackedCall call{x.size(0), w.size(0), x.size(1), x.stride(0),
                        has_bias ? bias->data_ptr<float>() : nullptr};
  float* op = out.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  switch (w.scalar_type()) {
    case at::kBFloat16: {  // with the panels w is not read (it may be shape-only)
      const c10::BFloat16* wp = words == nullptr ? w.data_ptr<c10::BFloat16>() : nullptr;
      run_packed(op, xp, wp, call, words);
      break;
    }
    case at::kHalf: run_packed(op, xp, w.data_ptr<c10::Half>(), call); break;
    default: run_packed(op, xp, w.data_ptr<float>(), call);
  }
#else
  out.copy_(at::linear(x, w.to(at::kFloat), has_bias ? *bias : at::Tensor()));
#endif
}

// out [M, N] <- x [M, K] @ w [N, K]^T (+ bias [N]), read from w's bf16 panels only (w may
// be shape-only): the decode-size GEMV. All bf16 on the bf16 dot product
// (gemm_packed_bf16.cpp), or float32 x, out and bias on a vector build (panel_gemv).
void linear_panels_small_m(at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                           const std::optional<at::Tensor>& bias, const at::Tensor& panels) {
  check_rows(x, "x");
  const bool all_bf16 = x.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kBFloat16;
  const bool float_x = x.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat;
  TORCH_CHECK((all_bf16 || float_x) && w.scalar_type() == at::kBFloat16,
              "w must be bfloat16, with x and out both bfloat16 or both float32");
  TORCH_CHECK(w.dim() == 2 && w.size(1) == x.size(1), "w must be [N, K] with K = x's columns");
  const bool has_bias = check_linear_out_bias(out, x, w, bias);
  if (all_bf16) {
#if defined(SGL_HAVE_BF16_DOT)
    const uint32_t* words = panel_words(panels, w, bf16_dot_panel_width());
    if (x.size(0) == 0 || w.size(0) == 0) return;
    linear_panels_gemv_bf16(out, x, has_bias ? bias->data_ptr<c10::BFloat16>() : nullptr,
                            words, w.size(0));
    return;
#else
    TORCH_CHECK(false, "linear_panels_small_m over bf16 x needs the AVX-512 bf16 dot product");
#endif
  }
#if defined(SGL_HAVE_VEC)
  const uint32_t* words = panel_words(panels, w, kPanel);
  if (x.size(0) == 0 || w.size(0) == 0) return;
  if (x.size(1) == 0) {  // empty sums: the bias alone
    has_bias ? out.copy_(bias->expand_as(out)) : out.zero_();
    return;
  }
  const PackedCall c{x.size(0), w.size(0), x.size(1), x.stride(0),
                     has_bias ? bias->data_ptr<float>() : nullptr};
  float* op = out.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  const int64_t panels_n = (c.n + kPanel - 1) / kPanel;
  sgl_cpu::parallel_for(0, panels_n, kPanel * c.k * c.m, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) gemv_panel(op, xp, words, p, c);
  });
#else
  TORCH_CHECK(false, "linear_panels_small_m over float32 x needs the AVX2/AVX-512 build");
#endif
}

}  // namespace sgl_cpu
