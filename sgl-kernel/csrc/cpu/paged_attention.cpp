// Paged attention for decode and small extends (speculative verify, short chunks): each
// new token attends causally over its request's KV, read straight from the pool through
// req_to_token (no gathered copy), after the new tokens' K/V are written into the pool.
// GQA/MQA, sliding windows, logit soft-capping.
#include <vector>

#include "common.h"
#include "paged.h"
#include "vec.h"

namespace sgl_cpu {
namespace {

// Writes k, v ([T, Hkv * D], rows may be strided) into pool slots `loc`, converted to the
// pool's dtype P (to_pool: fp8, and float16 under wider compute, saturate).
template <typename T, typename P>
void write_kv(P* pool, const T* k, const T* v, const int64_t* loc, int64_t rows,
              int64_t k_stride, int64_t v_stride, int64_t slot_stride, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    P* slot = pool + loc[r] * slot_stride;  // [2, Hkv, D]: K then V
    const T* k_row = k + r * k_stride;
    const T* v_row = v + r * v_stride;
    if constexpr (kStoreSaturates<P, T>) {
      for (int64_t i = 0; i < width; ++i) slot[i] = to_pool<P>(k_row[i]);
      for (int64_t i = 0; i < width; ++i) slot[width + i] = to_pool<P>(v_row[i]);
    } else {
      std::copy(k_row, k_row + width, slot);
      std::copy(v_row, v_row + width, slot + width);
    }
  }
}

// One request, one KV head: the `group` query heads that share it, each key and value
// row read once for all of them.
//   q: [group, D]; out: [group, D]; keys/values of the kv_len slots listed in `slots`.
//   scores: [group, kv_len] and acc: [group, D], scratch.
template <typename T, typename P>
void attend_one(const T* q, T* out, const P* pool, const int32_t* slots, int64_t kv_len,
                int64_t kv_head, int64_t group, const DecodeShape& s, std::vector<float>& scores,
                std::vector<float>& acc) {
  const int64_t d = s.head_dim, width = s.kv_heads * d;
  scores.resize(group * kv_len);
  acc.assign(group * d, 0.f);
  for (int64_t j = 0; j < kv_len; ++j) {
    const P* key = pool + int64_t(slots[j]) * s.slot_stride + kv_head * d;
    for (int64_t g = 0; g < group; ++g) {
      float score = dot(q + g * d, key, d) * s.scale;
      if (s.logit_cap > 0.f) score = s.logit_cap * std::tanh(score / s.logit_cap);
      scores[g * kv_len + j] = score;
    }
  }
  for (int64_t g = 0; g < group; ++g) {  // softmax of each row, normalised at the end
    float* row = scores.data() + g * kv_len;
    const float max_score = *std::max_element(row, row + kv_len);
    for (int64_t j = 0; j < kv_len; ++j) row[j] = exp_f32(row[j] - max_score);
  }
  for (int64_t j = 0; j < kv_len; ++j) {
    const P* value = pool + int64_t(slots[j]) * s.slot_stride + width + kv_head * d;
    for (int64_t g = 0; g < group; ++g) {
      const float p = scores[g * kv_len + j];
      float* a = acc.data() + g * d;
      for (int64_t i = 0; i < d; ++i) a[i] += p * static_cast<float>(value[i]);
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    const float* row = scores.data() + g * kv_len;
    float denom = 0.f;
    for (int64_t j = 0; j < kv_len; ++j) denom += row[j];
    const float inv = 1.f / denom;
    for (int64_t i = 0; i < d; ++i) out[g * d + i] = static_cast<T>(acc[g * d + i] * inv);
  }
}

// The new tokens' places: token t of the batch belongs to request token_req[t] and sees
// the keys at positions [0, token_end[t]) of that request (token_end = its position + 1).
struct TokenPlaces {
  std::vector<int64_t> token_req, token_end;
  int64_t mean_kv_len = 1;
};

// extend_lens empty: decode, one new token per request (the last of its seq_len).
TokenPlaces token_places(const int64_t* seq_lens, const at::Tensor& extend_lens, int64_t bs,
                         int64_t rows) {
  TokenPlaces places;
  places.token_req.reserve(rows);
  places.token_end.reserve(rows);
  const int64_t* ext = extend_lens.numel() ? extend_lens.data_ptr<int64_t>() : nullptr;
  int64_t total = 0;
  for (int64_t b = 0; b < bs; ++b) {
    const int64_t n = ext ? ext[b] : 1;
    TORCH_CHECK(n >= 1 && n <= seq_lens[b], "extend_len out of range for request ", b);
    for (int64_t i = 0; i < n; ++i) {
      places.token_req.push_back(b);
      places.token_end.push_back(seq_lens[b] - n + i + 1);
      total += seq_lens[b] - n + i + 1;
    }
  }
  TORCH_CHECK(int64_t(places.token_req.size()) == rows, "q has ", rows,
              " rows but the batch has ", places.token_req.size(), " new tokens");
  places.mean_kv_len = std::max<int64_t>(1, total / std::max<int64_t>(1, rows));
  return places;
}

#if defined(SGL_HAVE_VEC)
// The vector path: one work item is one new token's keys [begin, end) for all its heads,
// read slot by slot (a slot's K then V rows, all heads, so a request's slots stream through
// the cache in order), in blocks of kKeyBlock keys with an online softmax. A token's keys
// are split over several items when the batch has fewer tokens than threads; the items'
// partial results are merged after (flash-decoding). head_dim: a multiple of kVecWidth,
// <= 256.
constexpr int64_t kMaxVecDim = 256;
constexpr int64_t kKeyBlock = 32;
constexpr int64_t kMinSplitKeys = 64;  // fewer keys per item cost more than they save

// One item's partial result per query head: the running max score m, the sum l of
// exp(score - m), and acc [D] = sum of exp(score - m) * value.
struct Partial {
  float* m;    // [Hq]
  float* l;    // [Hq]
  float* acc;  // [Hq, D]
};

// max of x[0, n)
inline float block_max(const float* x, int64_t n) {
  vfloat best = vset1(-INFINITY);
  for (int64_t j = 0; j < n; j += kVecWidth) best = vmax(best, vload_first(x + j, n - j, -INFINITY));
  return vreduce_max(best);
}

// x[0, n) <- exp(x - shift); returns their sum.
inline float exp_in_place(float* x, int64_t n, float shift) {
  const vfloat vshift = vset1(shift);
  vfloat vsum = vzero();
  for (int64_t j = 0; j < n; j += kVecWidth) {
    const vfloat e = vexp(vsub(vload_first(x + j, n - j, 0.f), vshift));
    vstore_first(x + j, n - j, e);
    vsum = vadd(vsum, vkeep_first(e, n - j));
  }
  return vreduce_add(vsum);
}

constexpr int64_t kKeysPerStep = 4;  // keys whose scores one vreduce4 finishes
// Query heads of one KV head handled per pass over its key (value) rows: each row vector is
// loaded, and a bf16/fp16 row widened, once per pass instead of once per query head.
// Registers (AVX2's 16): 2 heads x 4 keys accumulators + a key vector + 2 q vectors.
constexpr int64_t kHeadsPerPass = 2;

// How far ahead of the key loop the K and V rows of a slot are prefetched. The pool of a
// large batch does not stay cached between steps, and the hardware prefetcher misses the
// pattern (a slot's K rows read in the score pass, its V rows a pass later, slots
// scattered): prefetching 8 keys ahead made a batch-256 x 192-key bf16 call 15-21% faster
// (AVX2 EPYC, A/B alternating); 4, 12 and 16 keys ahead measured the same as 8.
constexpr int64_t kPrefetchKeys = 8;

// K and V rows of the slots of keys [j, j + kKeysPerStep), where they exist, into L1.
template <typename T>
inline void prefetch_slots(const T* pool, const int32_t* slots, int64_t j, int64_t n,
                           int64_t slot_stride) {
  const int64_t bytes = slot_stride * int64_t(sizeof(T));
  for (int64_t kk = j; kk < std::min(n, j + kKeysPerStep); ++kk) {
    const char* p = reinterpret_cast<const char*>(pool + int64_t(slots[kk]) * slot_stride);
    for (int64_t off = 0; off < bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
  }
}

// scores[qh * kKeyBlock + 0..3] of query heads qh0 .. qh0 + G - 1 (sharing KV head h): the
// scaled (capped) dot products with 4 keys, reduced together (one horizontal reduction per
// 4 keys, not per key).
template <int G, typename T>
inline void scores4_heads(const float* qf, const T* const* keys, int64_t h, int64_t qh0,
                          const DecodeShape& s, int64_t nvec, float* scores) {
  const int64_t d = s.head_dim;
  vfloat sum[G][kKeysPerStep];
  for (int g = 0; g < G; ++g) {
    for (int64_t kk = 0; kk < kKeysPerStep; ++kk) sum[g][kk] = vzero();
  }
  // Unrolled by 2, not fully: fully unrolled (nvec known), GCC loaded and widened all 4
  // keys' rows up front and spilled them to the stack (the 256-token decode call 15% slower).
#pragma GCC unroll 2
  for (int64_t i = 0; i < nvec; ++i) {
    vfloat qv[G];
    for (int g = 0; g < G; ++g) qv[g] = vload(qf + (qh0 + g) * d + i * kVecWidth);
    for (int64_t kk = 0; kk < kKeysPerStep; ++kk) {
      const vfloat kv = vload_unscaled(keys[kk] + h * d + i * kVecWidth);
      for (int g = 0; g < G; ++g) sum[g][kk] = vfma(kv, qv[g], sum[g][kk]);
    }
  }
  const __m128 scale = _mm_set1_ps(s.scale);
  for (int g = 0; g < G; ++g) {
    // the 4 keys' scores of head qh0 + g are adjacent in `scores`: one vector store
    float* out = scores + (qh0 + g) * kKeyBlock;
    _mm_storeu_ps(out, _mm_mul_ps(vreduce4(sum[g][0], sum[g][1], sum[g][2], sum[g][3]), scale));
    if (s.logit_cap > 0.f) {
      for (int64_t kk = 0; kk < kKeysPerStep; ++kk) {
        out[kk] = s.logit_cap * std::tanh(out[kk] / s.logit_cap);
      }
    }
  }
}

// scores[qh * kKeyBlock + 0..3] <- the scores of 4 keys for every query head.
template <typename T>
inline void scores4(const float* qf, const T* pool, const int32_t* slots, const DecodeShape& s,
                    int64_t nvec, float* scores) {
  const int64_t group = s.q_heads / s.kv_heads;
  const T* keys[kKeysPerStep];
  for (int64_t kk = 0; kk < kKeysPerStep; ++kk) keys[kk] = pool + int64_t(slots[kk]) * s.slot_stride;
  for (int64_t h = 0; h < s.kv_heads; ++h) {
    int64_t g = 0;
    for (; g + kHeadsPerPass <= group; g += kHeadsPerPass) {
      scores4_heads<kHeadsPerPass>(qf, keys, h, h * group + g, s, nvec, scores);
    }
    for (; g < group; ++g) scores4_heads<1>(qf, keys, h, h * group + g, s, nvec, scores);
  }
}

// acc[qh] += sum over 4 values of p[qh, key] * value[key] for query heads qh0 .. qh0 + G - 1
// (sharing KV head h): each accumulator row is loaded and stored once per 4 values.
template <int G, typename T>
inline void accumulate4_heads(const T* const* values, int64_t h, int64_t qh0,
                              const DecodeShape& s, int64_t nvec, const float* probs,
                              float* acc) {
  const int64_t d = s.head_dim;
  vfloat p[G][kKeysPerStep];
  for (int g = 0; g < G; ++g) {
    for (int64_t kk = 0; kk < kKeysPerStep; ++kk) p[g][kk] = vset1(probs[(qh0 + g) * kKeyBlock + kk]);
  }
#pragma GCC unroll 2  // as in scores4_heads
  for (int64_t i = 0; i < nvec; ++i) {
    vfloat a[G];
    for (int g = 0; g < G; ++g) a[g] = vload(acc + (qh0 + g) * d + i * kVecWidth);
    for (int64_t kk = 0; kk < kKeysPerStep; ++kk) {
      const vfloat v = vload_unscaled(values[kk] + h * d + i * kVecWidth);
      for (int g = 0; g < G; ++g) a[g] = vfma(p[g][kk], v, a[g]);
    }
    for (int g = 0; g < G; ++g) vstore(acc + (qh0 + g) * d + i * kVecWidth, a[g]);
  }
}

// acc[qh] += sum over 4 keys of p[qh, key] * value[key], every query head.
template <typename T>
inline void accumulate4(const T* pool, const int32_t* slots, const DecodeShape& s, int64_t nvec,
                        const float* probs, float* acc) {
  const int64_t group = s.q_heads / s.kv_heads, width = s.kv_heads * s.head_dim;
  const T* values[kKeysPerStep];
  for (int64_t kk = 0; kk < kKeysPerStep; ++kk) {
    values[kk] = pool + int64_t(slots[kk]) * s.slot_stride + width;
  }
  for (int64_t h = 0; h < s.kv_heads; ++h) {
    int64_t g = 0;
    for (; g + kHeadsPerPass <= group; g += kHeadsPerPass) {
      accumulate4_heads<kHeadsPerPass>(values, h, h * group + g, s, nvec, probs, acc);
    }
    for (; g < group; ++g) accumulate4_heads<1>(values, h, h * group + g, s, nvec, probs, acc);
  }
}

// acc[qh] += sum over the block's n keys of p[qh, key] * value[key] for query heads
// qh0 .. qh0 + G - 1 (sharing KV head h), kAccVecs vectors of D at a time: the G x
// kAccVecs accumulators stay in registers across all n keys (no load and store of the
// accumulator rows per 4 keys, as accumulate4 does), each value vector widened once for
// the G heads. With the scores' vector epilogue (scores4_heads) it took a batch-256 x
// 192-key bf16 call from 138-149 to 121-133 cycles per key in cache (one thread) and
// from 2.02 to 1.92 ms per layer from memory (two threads; AVX2 EPYC, A/B alternating).
// Registers: G x kAccVecs accumulators + kAccVecs values + one probability (14 of
// AVX2's 16 at G = 2).
constexpr int64_t kAccVecs = 4;
template <int G, typename T>
inline void accumulate_block_heads(const T* pool, const int32_t* slots, int64_t n, int64_t h,
                                   int64_t qh0, const DecodeShape& s, int64_t nvec,
                                   const float* probs, float* acc) {
  const int64_t d = s.head_dim, offset = s.kv_heads * d + h * d;  // V rows of KV head h
  for (int64_t i0 = 0; i0 < nvec; i0 += kAccVecs) {
    vfloat a[G][kAccVecs];
    for (int g = 0; g < G; ++g) {
      for (int64_t ii = 0; ii < kAccVecs; ++ii) {
        a[g][ii] = vload(acc + (qh0 + g) * d + (i0 + ii) * kVecWidth);
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      const T* value = pool + int64_t(slots[j]) * s.slot_stride + offset + i0 * kVecWidth;
      vfloat v[kAccVecs];
      for (int64_t ii = 0; ii < kAccVecs; ++ii) v[ii] = vload_unscaled(value + ii * kVecWidth);
      for (int g = 0; g < G; ++g) {
        const vfloat p = vset1(probs[(qh0 + g) * kKeyBlock + j]);
        for (int64_t ii = 0; ii < kAccVecs; ++ii) a[g][ii] = vfma(p, v[ii], a[g][ii]);
      }
    }
    for (int g = 0; g < G; ++g) {
      for (int64_t ii = 0; ii < kAccVecs; ++ii) {
        vstore(acc + (qh0 + g) * d + (i0 + ii) * kVecWidth, a[g][ii]);
      }
    }
  }
}

// NVEC: head_dim / kVecWidth when known at compile time (rows stay in registers), else 0.
template <typename T, int64_t NVEC>
void attend_range_vec(const float* qf, const T* pool, const int32_t* slots, int64_t n,
                      const DecodeShape& shape, Partial part) {
  // K and V are read unscaled (vload_unscaled): their unit goes into the score scale
  // here and into acc at the end
  DecodeShape s = shape;
  s.scale *= kPoolUnit<T>;
  const int64_t d = s.head_dim, group = s.q_heads / s.kv_heads;
  const int64_t nvec = NVEC > 0 ? NVEC : d / kVecWidth;
  const int64_t width = s.kv_heads * d;
  float scores[kKeyBlock * 64];  // [Hq, kKeyBlock]; Hq <= 64 checked by the caller
  vfloat row[kMaxVecDim / kVecWidth];
  std::fill(part.m, part.m + s.q_heads, -INFINITY);
  std::fill(part.l, part.l + s.q_heads, 0.f);
  std::fill(part.acc, part.acc + s.q_heads * d, 0.f);
  for (int64_t b0 = 0; b0 < n; b0 += kKeyBlock) {
    const int64_t bn = std::min(kKeyBlock, n - b0);
    int64_t jj = 0;
    for (; jj + kKeysPerStep <= bn; jj += kKeysPerStep) {
      prefetch_slots(pool, slots, b0 + jj + kPrefetchKeys, n, s.slot_stride);
      scores4(qf, pool, slots + b0 + jj, s, nvec, scores + jj);
    }
    for (; jj < bn; ++jj) {
      const T* key = pool + int64_t(slots[b0 + jj]) * s.slot_stride;
      for (int64_t h = 0; h < s.kv_heads; ++h) {
        for (int64_t i = 0; i < nvec; ++i) row[i] = vload_unscaled(key + h * d + i * kVecWidth);
        for (int64_t g = 0; g < group; ++g) {
          const float* qg = qf + (h * group + g) * d;
          vfloat sum = vmul(row[0], vload(qg));
          for (int64_t i = 1; i < nvec; ++i) sum = vfma(row[i], vload(qg + i * kVecWidth), sum);
          float score = vreduce_add(sum) * s.scale;
          if (s.logit_cap > 0.f) score = s.logit_cap * std::tanh(score / s.logit_cap);
          scores[(h * group + g) * kKeyBlock + jj] = score;
        }
      }
    }
    for (int64_t qh = 0; qh < s.q_heads; ++qh) {  // online softmax: rescale what came before
      float* sr = scores + qh * kKeyBlock;
      const float new_m = std::max(part.m[qh], block_max(sr, bn));
      const float alpha = exp_f32(part.m[qh] - new_m);  // 0 on the first block
      const float block_sum = exp_in_place(sr, bn, new_m);
      part.l[qh] = part.l[qh] * alpha + block_sum;
      part.m[qh] = new_m;
      if (alpha != 1.f) {
        const vfloat a = vset1(alpha);
        float* acc = part.acc + qh * d;
        for (int64_t i = 0; i < nvec; ++i) {
          vstore(acc + i * kVecWidth, vmul(a, vload(acc + i * kVecWidth)));
        }
      }
    }
    jj = 0;
    if (nvec % kAccVecs == 0) {  // head_dim 32, 64, 128, ... on AVX2 (64, 128 on AVX-512)
      for (int64_t h = 0; h < s.kv_heads; ++h) {
        int64_t g = 0;
        for (; g + kHeadsPerPass <= group; g += kHeadsPerPass) {
          accumulate_block_heads<kHeadsPerPass>(pool, slots + b0, bn, h, h * group + g, s,
                                                nvec, scores, part.acc);
        }
        for (; g < group; ++g) {
          accumulate_block_heads<1>(pool, slots + b0, bn, h, h * group + g, s, nvec, scores,
                                    part.acc);
        }
      }
      jj = bn;
    }
    for (; jj + kKeysPerStep <= bn; jj += kKeysPerStep) {
      accumulate4(pool, slots + b0 + jj, s, nvec, scores + jj, part.acc);
    }
    for (; jj < bn; ++jj) {
      const T* value = pool + int64_t(slots[b0 + jj]) * s.slot_stride + width;
      for (int64_t h = 0; h < s.kv_heads; ++h) {
        for (int64_t i = 0; i < nvec; ++i) row[i] = vload_unscaled(value + h * d + i * kVecWidth);
        for (int64_t g = 0; g < group; ++g) {
          const int64_t qh = h * group + g;
          const vfloat p = vset1(scores[qh * kKeyBlock + jj]);
          float* acc = part.acc + qh * d;
          for (int64_t i = 0; i < nvec; ++i) {
            vstore(acc + i * kVecWidth, vfma(p, row[i], vload(acc + i * kVecWidth)));
          }
        }
      }
    }
  }
  if constexpr (kPoolUnit<T> != 1.f) {
    const vfloat unit = vset1(kPoolUnit<T>);
    for (int64_t i = 0; i < s.q_heads * d; i += kVecWidth) {
      vstore(part.acc + i, vmul(unit, vload(part.acc + i)));
    }
  }
}

// out row of one token <- the merge of its `splits` partials (softmax over all its keys).
template <typename T>
void merge_partials(T* out, const float* m, const float* l, const float* acc, int64_t splits,
                    int64_t q_heads, int64_t d) {
  for (int64_t qh = 0; qh < q_heads; ++qh) {
    float max_m = -INFINITY;
    for (int64_t k = 0; k < splits; ++k) max_m = std::max(max_m, m[k * q_heads + qh]);
    float denom = 0.f;
    float merged[kMaxVecDim] = {0.f};
    for (int64_t k = 0; k < splits; ++k) {
      const float w = exp_f32(m[k * q_heads + qh] - max_m);
      denom += w * l[k * q_heads + qh];
      const float* a = acc + (k * q_heads + qh) * d;
      for (int64_t i = 0; i < d; ++i) merged[i] += w * a[i];
    }
    const float inv = 1.f / denom;
    for (int64_t i = 0; i < d; ++i) out[qh * d + i] = static_cast<T>(merged[i] * inv);
  }
}

// All tokens' attention on the vector path (see above): out rows <- attention of q rows.
template <typename T, typename P>
void attend_tokens_vec(const T* qp, T* op, const P* pool, const int32_t* table,
                       const int64_t* pool_idx, const TokenPlaces& places, int64_t rows,
                       const DecodeShape& s) {
  const int64_t hq = s.q_heads, d = s.head_dim;
  // splits per token: enough items for every thread, none under kMinSplitKeys keys
  const int64_t want = std::max<int64_t>(1, 2 * parallel_threads() / std::max<int64_t>(1, rows));
  std::vector<int64_t> first_item(rows + 1, 0), kv_len(rows);
  for (int64_t t = 0; t < rows; ++t) {
    const int64_t end = places.token_end[t];
    kv_len[t] = s.window > 0 ? std::min(end, s.window) : end;
    const int64_t splits = std::min(want, std::max<int64_t>(1, kv_len[t] / kMinSplitKeys));
    first_item[t + 1] = first_item[t] + splits;
  }
  const int64_t items = first_item[rows];
  std::vector<float> m(items * hq), l(items * hq), acc(items * hq * d);
  const int64_t work_per_item = 2 * hq * d * std::max<int64_t>(1, places.mean_kv_len);
  sgl_cpu::parallel_for_claimed(0, items, work_per_item, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(hq * d);
    int64_t t = std::upper_bound(first_item.begin(), first_item.end(), begin) - first_item.begin() - 1;
    int64_t widened = -1;
    for (int64_t item = begin; item < end; ++item) {
      while (item >= first_item[t + 1]) ++t;
      if (widened != t) {  // q of token t widened to float32 once per thread
        for (int64_t i = 0; i < hq * d; ++i) qf[i] = static_cast<float>(qp[t * s.q_stride + i]);
        widened = t;
      }
      const int64_t splits = first_item[t + 1] - first_item[t], k = item - first_item[t];
      const int64_t per = (kv_len[t] + splits - 1) / splits;
      const int64_t k0 = k * per, k1 = std::min(kv_len[t], k0 + per);
      const int32_t* slots = table + pool_idx[places.token_req[t]] * s.table_stride +
                             (places.token_end[t] - kv_len[t]) + k0;
      const Partial part{&m[item * hq], &l[item * hq], &acc[item * hq * d]};
      switch (d) {
        case 64: attend_range_vec<P, 64 / kVecWidth>(qf.data(), pool, slots, k1 - k0, s, part); break;
        case 128: attend_range_vec<P, 128 / kVecWidth>(qf.data(), pool, slots, k1 - k0, s, part); break;
        default: attend_range_vec<P, 0>(qf.data(), pool, slots, k1 - k0, s, part);
      }
    }
  });
  sgl_cpu::parallel_for(0, rows, hq * d * 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t i0 = first_item[t];
      merge_partials(op + t * s.out_stride, &m[i0 * hq], &l[i0 * hq], &acc[i0 * hq * d],
                     first_item[t + 1] - i0, hq, d);
    }
  });
}
#endif

// One paged_attention call's checked arguments (see paged_attention).
struct PagedCall {
  const at::Tensor &q, &k, &v, &kv_pool, &loc, &req_to_token;
  const int64_t* pool_idx;
  const int64_t* seq_lens;
  const int64_t* extend_lens;  // nullptr: decode
  int64_t bs, max_extend;      // max_extend 0: decode
  const TokenPlaces& places;
  const DecodeShape& s;
  int64_t rows;
  bool save_kv;
};

// q, k, v, out of dtype T; the pool of dtype P (T, or bf16/fp16 under a float32 model).
template <typename T, typename P>
void run_paged_attention(const PagedCall& c, at::Tensor& out) {
  const DecodeShape& s = c.s;
  const int64_t kv_heads = s.kv_heads, d = s.head_dim, group = s.q_heads / s.kv_heads;
  P* pool = c.kv_pool.data_ptr<P>();
  if (c.save_kv) {
    check_rows(c.k, "k");
    check_rows(c.v, "v");
    TORCH_CHECK(c.k.scalar_type() == c.q.scalar_type() && c.v.scalar_type() == c.q.scalar_type(),
                "k and v must have q's dtype");
    TORCH_CHECK(c.k.size(0) == c.rows && c.v.size(0) == c.rows && c.k.size(1) == kv_heads * d &&
                    c.v.size(1) == kv_heads * d,
                "k, v: [T, Hkv * D]");
    write_kv(pool, c.k.data_ptr<T>(), c.v.data_ptr<T>(), c.loc.data_ptr<int64_t>(), c.rows,
             c.k.stride(0), c.v.stride(0), s.slot_stride, kv_heads * d);
  }
  const T* qp = c.q.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int32_t* table = c.req_to_token.data_ptr<int32_t>();
#if defined(SGL_HAVE_VEC)
  if constexpr (kHasVecLoad<T> && kHasVecLoad<P>) {
    if (extend_tiled_serves(c.max_extend, d)) {
      const NewKV<T> fresh = c.save_kv ? NewKV<T>{c.k.data_ptr<T>(), c.v.data_ptr<T>(),
                                                   c.k.stride(0), c.v.stride(0)}
                                       : NewKV<T>{nullptr, nullptr, 0, 0};
      attend_extend_tiled(qp, op, pool, fresh, table, c.pool_idx, c.seq_lens, c.extend_lens,
                          c.bs, s);
      return;
    }
    if (d % kVecWidth == 0 && d <= kMaxVecDim && s.q_heads <= 64) {
      attend_tokens_vec(qp, op, pool, table, c.pool_idx, c.places, c.rows, s);
      return;
    }
  }
#endif
  const TokenPlaces& places = c.places;
  sgl_cpu::parallel_for(0, c.rows * kv_heads, 2 * places.mean_kv_len * d * group,
                   [&](int64_t begin, int64_t end) {
    std::vector<float> scores, acc;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / kv_heads, h = item % kv_heads;
      const int64_t b = places.token_req[t], kv_end = places.token_end[t];
      const int64_t kv_len = s.window > 0 ? std::min(kv_end, s.window) : kv_end;
      const int32_t* slots = table + c.pool_idx[b] * s.table_stride + (kv_end - kv_len);
      attend_one(qp + t * s.q_stride + h * group * d, op + t * s.out_stride + h * group * d,
                 pool, slots, kv_len, h, group, s, scores, acc);
    }
  });
}

// An fp8 pool under a float32 or bfloat16 q (checked by the caller).
void run_fp8_paged_attention(const PagedCall& c, at::Tensor& out, at::ScalarType q_type,
                             at::ScalarType pool_type) {
  const bool e4m3 = pool_type == at::kFloat8_e4m3fn;
  if (q_type == at::kFloat) {
    e4m3 ? run_paged_attention<float, c10::Float8_e4m3fn>(c, out)
         : run_paged_attention<float, c10::Float8_e5m2>(c, out);
  } else {
    e4m3 ? run_paged_attention<c10::BFloat16, c10::Float8_e4m3fn>(c, out)
         : run_paged_attention<c10::BFloat16, c10::Float8_e5m2>(c, out);
  }
}

}  // namespace

// Attention of a batch's new tokens over the paged KV pool, each causal over its own
// request: q: [T, Hq * D]; k, v: [T, Hkv * D] (rows may be strided); kv_pool:
// [slots, 2, Hkv, D] contiguous, of q's dtype, bf16/fp16 under a float32 q, or fp8 (e4m3fn,
// e5m2) under a float32 or bf16 q; loc: int64[T] (the new tokens' slots,
// already in req_to_token); req_to_token: int32[R, L]; req_pool_indices, seq_lens:
// int64[bs] (seq_lens count the new tokens); extend_lens: int64[bs] new tokens per
// request (empty: decode, one each); out: [T, Hq * D]. A token at position p sees the
// keys at positions (p - window, p] (all of [0, p] when window is 0).
void paged_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v, at::Tensor& kv_pool, const at::Tensor& loc,
                     const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                     const at::Tensor& seq_lens, const at::Tensor& extend_lens, double scale,
                     double logit_cap, int64_t window, bool save_kv) {
  check_rows(q, "q");
  check_rows(out, "out");
  TORCH_CHECK(kv_pool.dim() == 4 && kv_pool.size(1) == 2 && kv_pool.is_contiguous(),
              "kv_pool must be a contiguous [slots, 2, Hkv, D]");
  TORCH_CHECK(out.scalar_type() == q.scalar_type(), "out must have q's dtype");
  const auto q_type = q.scalar_type(), pool_type = kv_pool.scalar_type();
  const bool fp8_pool = pool_type == at::kFloat8_e4m3fn || pool_type == at::kFloat8_e5m2;
  TORCH_CHECK(pool_type == q_type ||
                  (q_type == at::kFloat && (pool_type == at::kBFloat16 || pool_type == at::kHalf)) ||
                  (fp8_pool && (q_type == at::kFloat || q_type == at::kBFloat16)),
              "kv_pool must have q's dtype, be bfloat16/float16 under a float32 q, or be "
              "float8 (e4m3fn, e5m2) under a float32 or bfloat16 q");
  TORCH_CHECK(req_to_token.scalar_type() == at::kInt && req_to_token.stride(1) == 1,
              "req_to_token must be int32 with contiguous rows");
  const int64_t rows = q.size(0), bs = seq_lens.numel();
  TORCH_CHECK(loc.scalar_type() == at::kLong && loc.is_contiguous() && loc.numel() == rows,
              "loc must be a contiguous int64[T]");
  for (const at::Tensor* t : {&req_pool_indices, &seq_lens}) {
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous() && t->numel() == bs,
                "req_pool_indices and seq_lens must be contiguous int64[bs]");
  }
  TORCH_CHECK(extend_lens.numel() == 0 ||
                  (extend_lens.scalar_type() == at::kLong && extend_lens.is_contiguous() &&
                   extend_lens.numel() == bs),
              "extend_lens must be empty or a contiguous int64[bs]");
  const int64_t kv_heads = kv_pool.size(2), d = kv_pool.size(3);
  TORCH_CHECK(q.size(1) % (kv_heads * d) == 0, "q heads must be a multiple of the KV heads");
  const int64_t group = q.size(1) / (kv_heads * d);
  DecodeShape s{group * kv_heads, kv_heads, d, q.stride(0), out.stride(0),
                2 * kv_heads * d, req_to_token.stride(0), float(scale), float(logit_cap),
                window};
  const int64_t* pool_idx = req_pool_indices.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < bs; ++b) {
    TORCH_CHECK(lens[b] >= 1 && lens[b] <= req_to_token.size(1), "seq_len out of range");
    TORCH_CHECK(pool_idx[b] >= 0 && pool_idx[b] < req_to_token.size(0), "bad req_pool_index");
  }
  const TokenPlaces places = token_places(lens, extend_lens, bs, rows);
  const int64_t* ext = extend_lens.numel() ? extend_lens.data_ptr<int64_t>() : nullptr;
  const int64_t max_extend = ext ? *std::max_element(ext, ext + bs) : 0;
  const PagedCall call{q,    k,          v,  kv_pool,    loc,    req_to_token, pool_idx, lens,
                       ext,  bs,         max_extend, places, s,  rows,         save_kv};
  if (fp8_pool) {
    run_fp8_paged_attention(call, out, q_type, pool_type);
  } else if (q_type == at::kFloat && pool_type == at::kBFloat16) {
    run_paged_attention<float, c10::BFloat16>(call, out);
  } else if (q_type == at::kFloat && pool_type == at::kHalf) {
    run_paged_attention<float, c10::Half>(call, out);
  } else {
    SGL_DISPATCH_FLOATS(q_type, "paged_attention", [&] {
      run_paged_attention<scalar_t, scalar_t>(call, out);
    });
  }
}

}  // namespace sgl_cpu
