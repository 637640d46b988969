// Tiled attention for long extends (prefill chunks, prompts over a cached prefix): the
// tokens of a block and the query heads that share a KV head form the rows of a small
// GEMM against blocks of the request's keys, read from the pool through req_to_token (no
// gathered copy, no padding), with an online softmax (flash attention).
//
// One work item is (request, KV head, block of up to kBlockTokens new tokens): rows
// R = tokens x group, row r = token r / group, query head r % group. For each block of
// kKeyBlock keys that some row sees:
//   kt [D, kKeyBlock] <- the keys, widened and transposed (zero past the block's keys)
//   vf [kKeyBlock, D] <- the values, widened
//   sc [R, kKeyBlock] <- (q * scale) kt, in register tiles of the broadcast form
//   each row's scores outside its keys (causal, window) -> probability 0, the rest
//   exp(score - running max), the running max and sum updated, o rescaled
//   o  [R, D] += sc vf, in register tiles
// and at the end out <- o / sum. Packing a key block costs 2 x kKeyBlock x D conversions
// against 2 x R x kKeyBlock x D multiply-adds.
#include <cstring>
#include <type_traits>
#include <vector>

#include "amx.h"
#include "common.h"
#include "paged.h"
#include "vec.h"

namespace sgl_cpu {

#if defined(SGL_HAVE_VEC)
namespace {

constexpr int64_t kMaxDim = 256;
constexpr int64_t kKeyBlock = 64;  // a multiple of 2 vectors on both ISAs
// rows per item: tokens x group up to this (at least one token)
constexpr int64_t kTargetRows = 64;
constexpr int64_t kBlockTokens = 32;
// rows per register tile: 2 x kTileRows accumulators + 2 operand vectors + 1 broadcast
constexpr int kTileRows = kVecRegisters == 32 ? 12 : 6;

struct Item {
  int64_t req, kv_head, token0, tokens;  // token0: the block's first new token of req
};

// The work: every request's new tokens in blocks, for each KV head.
std::vector<Item> make_items(const int64_t* extend_lens, int64_t bs, int64_t kv_heads,
                             int64_t block_tokens) {
  std::vector<Item> items;
  for (int64_t b = 0; b < bs; ++b) {
    for (int64_t h = 0; h < kv_heads; ++h) {
      for (int64_t t0 = 0; t0 < extend_lens[b]; t0 += block_tokens) {
        items.push_back({b, h, t0, std::min(block_tokens, extend_lens[b] - t0)});
      }
    }
  }
  return items;
}

// sc rows [0, R) x columns [c0, c0 + 2 vectors) <- qf rows . kt columns, over all D.
template <int R>
inline void score_tile(const float* qf, int64_t d, const float* kt, float* sc, int64_t c0) {
  vfloat lo[R], hi[R];
  {  // the first d step starts the sums with a multiply (no zeroing: see gemm_packed.cpp)
    const vfloat w_lo = vload(kt + c0), w_hi = vload(kt + c0 + kVecWidth);
    for (int r = 0; r < R; ++r) {
      const vfloat x = vset1(qf[r * d]);
      lo[r] = vmul(x, w_lo);
      hi[r] = vmul(x, w_hi);
    }
  }
  for (int64_t i = 1; i < d; ++i) {
    const float* w = kt + i * kKeyBlock + c0;
    const vfloat w_lo = vload(w), w_hi = vload(w + kVecWidth);
    for (int r = 0; r < R; ++r) {
      const vfloat x = vset1(qf[r * d + i]);
      lo[r] = vfma(x, w_lo, lo[r]);
      hi[r] = vfma(x, w_hi, hi[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    vstore(sc + r * kKeyBlock + c0, lo[r]);
    vstore(sc + r * kKeyBlock + c0 + kVecWidth, hi[r]);
  }
}

// o rows [0, R) x columns [c0, c0 + NV vectors) += sc rows [0, R) (first n) . vf rows.
template <int R, int NV>
inline void value_tile(const float* sc, int64_t n, const float* vf, int64_t d, float* o,
                       int64_t c0) {
  vfloat acc[R][NV];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < NV; ++v) acc[r][v] = vload(o + r * d + c0 + v * kVecWidth);
  }
  for (int64_t j = 0; j < n; ++j) {
    vfloat val[NV];
    for (int v = 0; v < NV; ++v) val[v] = vload(vf + j * d + c0 + v * kVecWidth);
    for (int r = 0; r < R; ++r) {
      const vfloat p = vset1(sc[r * kKeyBlock + j]);
      for (int v = 0; v < NV; ++v) acc[r][v] = vfma(p, val[v], acc[r][v]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < NV; ++v) vstore(o + r * d + c0 + v * kVecWidth, acc[r][v]);
  }
}

// f(tile's first row, row count as a template argument) over rows [0, rows).
template <typename F>
inline void for_row_tiles(int64_t rows, F&& f) {
  int64_t r = 0;
  for (; r + kTileRows <= rows; r += kTileRows) f(r, std::integral_constant<int, kTileRows>{});
  with_rows<kTileRows - 1>(int(rows - r), [&](auto n) { f(r, n); });
}

// Per-thread buffers of the items (sized for the largest item).
struct Scratch {
  std::vector<float> qf, kt, vf, sc, o, m, l;
  Scratch(int64_t rows, int64_t d)
      : qf(rows * d), kt(d * kKeyBlock), vf(kKeyBlock * d), sc(rows * kKeyBlock), o(rows * d),
        m(rows), l(rows) {}
};

// Where key j of an item's request is: the pool slot of a cached key, or the new
// tokens' rows (from `prefix` on) when they came with the call.
template <typename T, typename P>
struct KeySource {
  const P* pool;
  const int32_t* slots;  // the request's req_to_token row
  NewKV<T> fresh;        // fresh.k == nullptr: every key from the pool
  int64_t prefix, first_row;  // the request's cached keys; its first row of k and v

  template <typename F>
  void visit(int64_t j, int64_t h, const DecodeShape& s, F&& f) const {
    const int64_t d = s.head_dim;
    if (fresh.k != nullptr && j >= prefix) {
      const int64_t row = first_row + j - prefix;
      f(fresh.k + row * fresh.k_stride + h * d, fresh.v + row * fresh.v_stride + h * d);
    } else {
      const P* slot = pool + int64_t(slots[j]) * s.slot_stride + h * d;
      f(slot, slot + s.kv_heads * d);
    }
  }
};

// kt, vf <- keys and values [j0, j0 + n) of KV head h.
template <typename T, typename P>
void pack_keys(const KeySource<T, P>& src, int64_t j0, int64_t n, int64_t h,
               const DecodeShape& s, float* kt, float* vf) {
  const int64_t d = s.head_dim;
  vfloat block[kVecWidth];
  // columns up to the score tiles' width (2 vectors) are written: zero past the n keys
  const int64_t width = std::min(kKeyBlock, (n + 2 * kVecWidth - 1) / (2 * kVecWidth) * 2 * kVecWidth);
  for (int64_t jj = 0; jj < width; jj += kVecWidth) {
    for (int64_t d0 = 0; d0 < d; d0 += kVecWidth) {
      for (int64_t t = 0; t < kVecWidth; ++t) {
        block[t] = vzero();
        if (jj + t < n) {
          src.visit(j0 + jj + t, h, s, [&](const auto* key, const auto*) { block[t] = vload(key + d0); });
        }
      }
      vtranspose(block);
      for (int64_t t = 0; t < kVecWidth; ++t) vstore(kt + (d0 + t) * kKeyBlock + jj, block[t]);
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    src.visit(j0 + j, h, s, [&](const auto*, const auto* value) {
      for (int64_t d0 = 0; d0 < d; d0 += kVecWidth) vstore(vf + j * d + d0, vload(value + d0));
    });
  }
}

// Row r's scores [0, n) of the block starting at key j0 -> probabilities against its
// running max and sum; keys outside [first, end) -> 0. o's row rescaled when the max moves.
inline void softmax_row(float* sc, int64_t n, int64_t j0, int64_t first, int64_t end,
                        const DecodeShape& s, float& m, float& l, float* o_row) {
  const int64_t a = std::max<int64_t>(first - j0, 0), z = std::min<int64_t>(end - j0, n);
  if (a >= z) {  // none of this row's keys in the block
    std::fill(sc, sc + n, 0.f);
    return;
  }
  if (s.logit_cap > 0.f) {
    for (int64_t j = a; j < z; ++j) sc[j] = s.logit_cap * std::tanh(sc[j] / s.logit_cap);
  }
  float best = -INFINITY;
  for (int64_t j = a; j < z; j += kVecWidth) {
    best = std::max(best, vreduce_max(vload_first(sc + j, z - j, -INFINITY)));
  }
  const float new_m = std::max(m, best);
  const float alpha = exp_f32(m - new_m);  // ~0 on the row's first block (m = -inf)
  const vfloat shift = vset1(new_m);
  vfloat vsum = vzero();
  for (int64_t j = a; j < z; j += kVecWidth) {
    const vfloat e = vexp(vsub(vload_first(sc + j, z - j, 0.f), shift));
    vstore_first(sc + j, z - j, e);
    vsum = vadd(vsum, vkeep_first(e, z - j));
  }
  std::fill(sc, sc + a, 0.f);
  std::fill(sc + z, sc + n, 0.f);
  l = l * alpha + vreduce_add(vsum);
  m = new_m;
  if (alpha != 1.f) {
    const vfloat va = vset1(alpha);
    for (int64_t i = 0; i < s.head_dim; i += kVecWidth) vstore(o_row + i, vmul(va, vload(o_row + i)));
  }
}

// One item: out rows of its tokens and query heads.
template <typename T, typename P>
void attend_item(const Item& it, const T* q, T* out, const P* pool, NewKV<T> fresh,
                 const int32_t* table, const int64_t* pool_idx, const int64_t* seq_lens,
                 const int64_t* extend_lens, const int64_t* token_start, const DecodeShape& s,
                 Scratch& w) {
  const int64_t d = s.head_dim, group = s.q_heads / s.kv_heads, rows = it.tokens * group;
  const int64_t prefix = seq_lens[it.req] - extend_lens[it.req];
  const int64_t first_pos = prefix + it.token0, last_pos = first_pos + it.tokens - 1;
  const KeySource<T, P> keys{pool, table + pool_idx[it.req] * s.table_stride, fresh, prefix,
                             token_start[it.req]};
  // the keys a token at position p sees: [lowest(p), p]
  auto lowest = [&](int64_t p) { return s.window > 0 ? std::max<int64_t>(0, p - s.window + 1) : 0; };
  const vfloat scale = vset1(s.scale);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t tok = token_start[it.req] + it.token0 + r / group;
    const T* src = q + tok * s.q_stride + (it.kv_head * group + r % group) * d;
    for (int64_t i = 0; i < d; i += kVecWidth) vstore(&w.qf[r * d + i], vmul(scale, vload(src + i)));
  }
  std::fill(w.o.begin(), w.o.begin() + rows * d, 0.f);
  std::fill(w.m.begin(), w.m.begin() + rows, -INFINITY);
  std::fill(w.l.begin(), w.l.begin() + rows, 0.f);
  for (int64_t j0 = lowest(first_pos); j0 <= last_pos; j0 += kKeyBlock) {
    const int64_t n = std::min(kKeyBlock, last_pos + 1 - j0);
    pack_keys(keys, j0, n, it.kv_head, s, w.kt.data(), w.vf.data());
    for_row_tiles(rows, [&](int64_t r0, auto tile) {
      constexpr int R = decltype(tile)::value;
      for (int64_t c0 = 0; c0 < n; c0 += 2 * kVecWidth) {
        score_tile<R>(&w.qf[r0 * d], d, w.kt.data(), &w.sc[r0 * kKeyBlock], c0);
      }
    });
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p = first_pos + r / group;
      softmax_row(&w.sc[r * kKeyBlock], n, j0, lowest(p), p + 1, s, w.m[r], w.l[r], &w.o[r * d]);
    }
    for_row_tiles(rows, [&](int64_t r0, auto tile) {
      constexpr int R = decltype(tile)::value;
      int64_t c0 = 0;
      for (; c0 + 2 * kVecWidth <= d; c0 += 2 * kVecWidth) {
        value_tile<R, 2>(&w.sc[r0 * kKeyBlock], n, w.vf.data(), d, &w.o[r0 * d], c0);
      }
      if (c0 < d) value_tile<R, 1>(&w.sc[r0 * kKeyBlock], n, w.vf.data(), d, &w.o[r0 * d], c0);
    });
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t tok = token_start[it.req] + it.token0 + r / group;
    T* dst = out + tok * s.out_stride + (it.kv_head * group + r % group) * d;
    const vfloat inv = vset1(1.f / w.l[r]);  // l >= 1: every row sees its own key
    for (int64_t i = 0; i < d; i += kVecWidth) vstore(dst + i, vmul(inv, vload(&w.o[r * d + i])));
  }
}

#if defined(SGL_HAVE_AMX_BF16)
// The same item on AMX tiles, for bf16 q over a bf16 pool with head_dim a multiple of 32:
// scores = q k^T and o += p v as tile products (TDPBF16PS, float32 sums), the online
// softmax as above in float32 vectors. q stays bf16 (the scale multiplies the float32
// scores), and the probabilities are rounded to bf16 for p v, as flash attention does on
// GPUs. Rows are padded to whole 32-row pairs of tiles with zeros.
// Each key block (64 keys from a multiple of 64, of one request and KV head) is packed
// once per call, before the items, which then share it (an item of a long prompt's last
// tokens sees every block of it):
//   ktw [D / 2, kKeyBlock] words  B tiles of q k^T: word (p, j) = key j's d pair p
//   vbw [kKeyBlock / 2, D] words  B tiles of p v: word (p, i) = value i of keys 2p, 2p + 1
// and per item:
//   qb  [R32, D] bf16             A tiles of q k^T
//   pb  [R32, kKeyBlock] bf16     A tiles of p v (zero past the block's keys)
struct AmxScratch {
  std::vector<c10::BFloat16> qb, pb;
  AmxScratch(int64_t rows32, int64_t d) : qb(rows32 * d), pb(rows32 * kKeyBlock) {}
};

// Where the packed key blocks of the call are: request b's block i of KV head h at
// words (first_block[b] + i) * kv_heads + h times block_words.
struct PackedKeys {
  std::vector<int64_t> first_block;  // [bs + 1]: blocks of requests before b
  int64_t kv_heads, block_words;     // block_words: ktw's then vbw's words (D * kKeyBlock)
  uint32_t* words;
  std::vector<uint32_t> owned;  // a call past kKeptPackWords packs here, freed after it

  uint32_t* block(int64_t b, int64_t i, int64_t h) const {
    return words + ((first_block[b] + i) * kv_heads + h) * block_words;
  }
};

constexpr int64_t kAmxRows = 16;
static_assert(kKeyBlock == 64, "the score tiles below are 4 x 16 keys");

inline int64_t round_up32(int64_t n) { return (n + 31) / 32 * 32; }

// ktw, vbw <- keys and values [j0, j0 + n) of KV head h (zero past n).
template <typename P>
void pack_keys_amx(const KeySource<c10::BFloat16, P>& src, int64_t j0, int64_t n, int64_t h,
                   const DecodeShape& s, uint32_t* ktw, uint32_t* vbw) {
  const int64_t d = s.head_dim, words = d / 2;
  __m512 block[16];
  for (int64_t jj = 0; jj < kKeyBlock; jj += 16) {  // 16 keys' words, transposed
    for (int64_t w0 = 0; w0 < words; w0 += 16) {
      for (int64_t t = 0; t < 16; ++t) {
        block[t] = _mm512_setzero_ps();
        if (jj + t < n) {
          src.visit(j0 + jj + t, h, s, [&](const auto* key, const auto*) {
            block[t] = _mm512_loadu_ps(reinterpret_cast<const float*>(key) + w0);
          });
        }
      }
      vtranspose(block);
      for (int64_t t = 0; t < 16; ++t) {
        _mm512_storeu_ps(reinterpret_cast<float*>(ktw + (w0 + t) * kKeyBlock + jj), block[t]);
      }
    }
  }
  // value pairs: 16 values of key 2p and of key 2p + 1 interleaved into 16 words
  const __m512i interleave = _mm512_set_epi16(
      47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
      39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  for (int64_t p = 0; p < kKeyBlock / 2; ++p) {
    const c10::BFloat16* rows[2] = {nullptr, nullptr};
    for (int64_t e = 0; e < 2; ++e) {
      if (2 * p + e < n) {
        src.visit(j0 + 2 * p + e, h, s, [&](const auto*, const auto* value) { rows[e] = value; });
      }
    }
    for (int64_t i = 0; i < d; i += 16) {
      const __m512i a = rows[0] ? _mm512_castsi256_si512(_mm256_loadu_si256(
                                      reinterpret_cast<const __m256i*>(rows[0] + i)))
                                : _mm512_setzero_si512();
      const __m512i b = rows[1] ? _mm512_castsi256_si512(_mm256_loadu_si256(
                                      reinterpret_cast<const __m256i*>(rows[1] + i)))
                                : _mm512_setzero_si512();
      _mm512_storeu_si512(vbw + p * d + i, _mm512_permutex2var_epi16(a, interleave, b));
    }
  }
}

// The products below run 2 x 2 tiles at a time (tile_step_2x2: rows r0 and r0 + 16, two
// 16-column groups; one B tile reused for four products serialized them, ~8x slower).
// Rows are padded to multiples of 32.

// sc rows [0, R32) x the block's 64 keys <- (qb . ktw) * scale.
void scores_amx(const c10::BFloat16* qb, const uint32_t* ktw, float* sc, int64_t rows32,
                int64_t d, float scale) {
  constexpr int64_t ktw_ld = kKeyBlock * 4, sc_ld = kKeyBlock * 4;
  const int64_t q_ld = d * 2;
  for (int64_t r0 = 0; r0 < rows32; r0 += 2 * kAmxRows) {
    for (int64_t c0 = 0; c0 < kKeyBlock; c0 += 32) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t d0 = 0; d0 < d; d0 += 32) {
        const uint32_t* b = ktw + (d0 / 2) * kKeyBlock + c0;
        tile_step_2x2(qb + r0 * d + d0, qb + (r0 + kAmxRows) * d + d0, q_ld, b, b + 16, ktw_ld);
      }
      float* out = sc + r0 * kKeyBlock + c0;
      _tile_stored(0, out, sc_ld);
      _tile_stored(1, out + 16, sc_ld);
      _tile_stored(2, out + kAmxRows * kKeyBlock, sc_ld);
      _tile_stored(3, out + kAmxRows * kKeyBlock + 16, sc_ld);
    }
  }
  const __m512 vs = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < rows32 * kKeyBlock; i += 16) {
    _mm512_storeu_ps(sc + i, _mm512_mul_ps(vs, _mm512_loadu_ps(sc + i)));
  }
}

// o rows [0, R32) += pb . vbw, 32 columns of o at a time.
void values_amx(const c10::BFloat16* pb, const uint32_t* vbw, float* o, int64_t rows32,
                int64_t d) {
  constexpr int64_t pb_ld = kKeyBlock * 2;
  const int64_t o_ld = d * 4, v_ld = d * 4;
  for (int64_t r0 = 0; r0 < rows32; r0 += 2 * kAmxRows) {
    for (int64_t c0 = 0; c0 < d; c0 += 32) {
      float* oc = o + r0 * d + c0;
      float* oc_lower = oc + kAmxRows * d;
      _tile_loadd(0, oc, o_ld);
      _tile_loadd(1, oc + 16, o_ld);
      _tile_loadd(2, oc_lower, o_ld);
      _tile_loadd(3, oc_lower + 16, o_ld);
      for (int64_t k0 = 0; k0 < kKeyBlock; k0 += 32) {
        const uint32_t* b = vbw + (k0 / 2) * d + c0;
        tile_step_2x2(pb + r0 * kKeyBlock + k0, pb + (r0 + kAmxRows) * kKeyBlock + k0, pb_ld, b,
                      b + 16, v_ld);
      }
      _tile_stored(0, oc, o_ld);
      _tile_stored(1, oc + 16, o_ld);
      _tile_stored(2, oc_lower, o_ld);
      _tile_stored(3, oc_lower + 16, o_ld);
    }
  }
}

// attend_item on the tiles (head_dim a multiple of 32; 64 is asked for, as the tiles pay
// off only from there).
void attend_item_amx(const Item& it, const c10::BFloat16* q, c10::BFloat16* out,
                     const int64_t* seq_lens, const int64_t* extend_lens,
                     const int64_t* token_start, const DecodeShape& s, Scratch& w,
                     AmxScratch& a, const PackedKeys& packed) {
  const int64_t d = s.head_dim, group = s.q_heads / s.kv_heads, rows = it.tokens * group;
  const int64_t rows32 = round_up32(rows);
  const int64_t prefix = seq_lens[it.req] - extend_lens[it.req];
  const int64_t first_pos = prefix + it.token0, last_pos = first_pos + it.tokens - 1;
  auto lowest = [&](int64_t p) { return s.window > 0 ? std::max<int64_t>(0, p - s.window + 1) : 0; };
  for (int64_t r = 0; r < rows32; ++r) {
    c10::BFloat16* dst = a.qb.data() + r * d;
    if (r < rows) {
      const int64_t tok = token_start[it.req] + it.token0 + r / group;
      std::memcpy(dst, q + tok * s.q_stride + (it.kv_head * group + r % group) * d, d * 2);
    } else {
      std::memset(dst, 0, d * 2);
    }
  }
  std::fill(w.o.begin(), w.o.begin() + rows32 * d, 0.f);
  std::fill(w.m.begin(), w.m.begin() + rows, -INFINITY);
  std::fill(w.l.begin(), w.l.begin() + rows, 0.f);
  std::fill(a.pb.begin(), a.pb.end(), c10::BFloat16(0.f));
  // whole packed blocks: keys before a row's window in the first one are masked off
  for (int64_t j0 = lowest(first_pos) / kKeyBlock * kKeyBlock; j0 <= last_pos; j0 += kKeyBlock) {
    const int64_t n = std::min(kKeyBlock, last_pos + 1 - j0);
    const uint32_t* ktw = packed.block(it.req, j0 / kKeyBlock, it.kv_head);
    const uint32_t* vbw = ktw + d / 2 * kKeyBlock;
    scores_amx(a.qb.data(), ktw, w.sc.data(), rows32, d, s.scale);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p = first_pos + r / group;
      float* sc = &w.sc[r * kKeyBlock];
      softmax_row(sc, n, j0, lowest(p), p + 1, s, w.m[r], w.l[r], &w.o[r * d]);
      c10::BFloat16* pr = &a.pb[r * kKeyBlock];
      for (int64_t j = 0; j < kKeyBlock; j += 16) {  // bf16 probabilities, zero past n
        const __m512 v = j < n ? vload_first(sc + j, n - j, 0.f) : _mm512_setzero_ps();
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(pr + j), (__m256i)_mm512_cvtneps_pbh(v));
      }
    }
    values_amx(a.pb.data(), vbw, w.o.data(), rows32, d);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t tok = token_start[it.req] + it.token0 + r / group;
    c10::BFloat16* dst = out + tok * s.out_stride + (it.kv_head * group + r % group) * d;
    const vfloat inv = vset1(1.f / w.l[r]);
    for (int64_t i = 0; i < d; i += kVecWidth) vstore(dst + i, vmul(inv, vload(&w.o[r * d + i])));
  }
}

// Every key block the call's items read, packed once (in parallel) into a buffer of the
// calling thread that grows to the largest call and is kept (a prefill's layers reuse
// it), up to this many words (64 MiB: 4,096 keys of 8 KV heads of 128); a larger call
// (a chunk over a long cached prefix) packs into its own buffer, freed after it.
constexpr int64_t kKeptPackWords = int64_t(16) << 20;

template <typename P>
PackedKeys pack_all_keys(const P* pool, NewKV<c10::BFloat16> fresh, const int32_t* table,
                         const int64_t* pool_idx, const int64_t* seq_lens,
                         const int64_t* extend_lens, const int64_t* token_start, int64_t bs,
                         const DecodeShape& s) {
  thread_local std::vector<uint32_t> buffer;
  PackedKeys packed{std::vector<int64_t>(bs + 1, 0), s.kv_heads, s.head_dim * kKeyBlock, nullptr};
  for (int64_t b = 0; b < bs; ++b) {
    packed.first_block[b + 1] = packed.first_block[b] + (seq_lens[b] + kKeyBlock - 1) / kKeyBlock;
  }
  const int64_t blocks = packed.first_block[bs] * s.kv_heads;
  const int64_t words = blocks * packed.block_words;
  if (words > kKeptPackWords) {
    packed.owned.resize(words);
    packed.words = packed.owned.data();
  } else {
    if (int64_t(buffer.size()) < words) buffer.resize(words);
    packed.words = buffer.data();
  }
  sgl_cpu::parallel_for(0, blocks, 4 * kKeyBlock * s.head_dim, [&](int64_t begin, int64_t end) {
    int64_t b = 0;
    for (int64_t g = begin; g < end; ++g) {
      const int64_t block = g / s.kv_heads, h = g % s.kv_heads;
      while (packed.first_block[b + 1] <= block) ++b;
      const int64_t i = block - packed.first_block[b], j0 = i * kKeyBlock;
      const KeySource<c10::BFloat16, P> keys{pool, table + pool_idx[b] * s.table_stride, fresh,
                                             seq_lens[b] - extend_lens[b], token_start[b]};
      uint32_t* ktw = packed.block(b, i, h);
      pack_keys_amx(keys, j0, std::min(kKeyBlock, seq_lens[b] - j0), h, s, ktw,
                    ktw + s.head_dim / 2 * kKeyBlock);
    }
  });
  return packed;
}
#endif
}  // namespace

bool extend_tiled_serves(int64_t max_extend, int64_t head_dim) {
  return max_extend > kPerTokenMaxExtend && head_dim % kVecWidth == 0 && head_dim <= kMaxDim;
}

template <typename T, typename P>
void attend_extend_tiled(const T* q, T* out, const P* pool, NewKV<T> fresh, const int32_t* table,
                         const int64_t* pool_idx, const int64_t* seq_lens,
                         const int64_t* extend_lens, int64_t bs, const DecodeShape& s) {
  const int64_t group = s.q_heads / s.kv_heads, d = s.head_dim;
  const int64_t block_tokens = std::clamp<int64_t>(kTargetRows / group, 1, kBlockTokens);
  std::vector<int64_t> token_start(bs + 1, 0);
  int64_t mean_keys = 0;
  for (int64_t b = 0; b < bs; ++b) {
    token_start[b + 1] = token_start[b] + extend_lens[b];
    mean_keys += seq_lens[b];
  }
  mean_keys = std::max<int64_t>(1, mean_keys / std::max<int64_t>(1, bs));
  const std::vector<Item> items = make_items(extend_lens, bs, s.kv_heads, block_tokens);
  const int64_t work_per_item = 2 * block_tokens * group * d * mean_keys;
#if defined(SGL_HAVE_AMX_BF16)
  if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<P, c10::BFloat16>) {
    if (d % 64 == 0 && amx_tiles()) {  // q k^T and p v on the tiles
      const int64_t rows32 = round_up32(block_tokens * group);
      const PackedKeys packed = pack_all_keys(pool, fresh, table, pool_idx, seq_lens, extend_lens,
                                              token_start.data(), bs, s);
      sgl_cpu::parallel_for_claimed(0, int64_t(items.size()), work_per_item, [&](int64_t begin, int64_t end) {
        configure_amx_tiles();
        Scratch w(rows32, d);
        AmxScratch a(rows32, d);
        for (int64_t i = begin; i < end; ++i) {
          attend_item_amx(items[i], q, out, seq_lens, extend_lens, token_start.data(), s, w, a,
                          packed);
        }
        _tile_release();
      });
      return;
    }
  }
#endif
  sgl_cpu::parallel_for_claimed(0, int64_t(items.size()), work_per_item, [&](int64_t begin, int64_t end) {
    Scratch w(block_tokens * group, d);
    for (int64_t i = begin; i < end; ++i) {
      attend_item(items[i], q, out, pool, fresh, table, pool_idx, seq_lens, extend_lens,
                  token_start.data(), s, w);
    }
  });
}

#define SGL_EXTEND_TILED(T, P)                                                              \
  template void attend_extend_tiled<T, P>(const T*, T*, const P*, NewKV<T>, const int32_t*, \
                                          const int64_t*, const int64_t*, const int64_t*,  \
                                          int64_t, const DecodeShape&);
SGL_EXTEND_TILED(float, float)
SGL_EXTEND_TILED(float, c10::BFloat16)
SGL_EXTEND_TILED(float, c10::Half)
SGL_EXTEND_TILED(c10::BFloat16, c10::BFloat16)
SGL_EXTEND_TILED(c10::Half, c10::Half)
SGL_EXTEND_TILED(float, c10::Float8_e4m3fn)
SGL_EXTEND_TILED(float, c10::Float8_e5m2)
SGL_EXTEND_TILED(c10::BFloat16, c10::Float8_e4m3fn)
SGL_EXTEND_TILED(c10::BFloat16, c10::Float8_e5m2)
#undef SGL_EXTEND_TILED

#else  // the portable build: the per-token path serves every extend

bool extend_tiled_serves(int64_t, int64_t) { return false; }

#endif

}  // namespace sgl_cpu
