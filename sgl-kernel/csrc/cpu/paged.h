// What the paged-attention paths share (paged_attention.cpp: the op, its checks and its
// per-token paths; extend_attention.cpp: the tiled path for long extends).
#pragma once

#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace sgl_cpu {

// The pool dtypes of an fp8 KV cache (--kv-cache-dtype fp8_e4m3 / fp8_e5m2).
template <typename P>
constexpr bool kIsFp8 =
    std::is_same_v<P, c10::Float8_e4m3fn> || std::is_same_v<P, c10::Float8_e5m2>;

// x as a pool of dtype P stores it. fp8 saturates at its largest finite value (448 for
// e4m3fn, 57344 for e5m2), as torch's cast to e4m3fn does, and so does a float16 pool
// under float32 or bf16 compute (65504): an overflow stored as inf or NaN would poison
// every later attention over the slot. A NaN stays NaN.
template <typename P, typename T>
constexpr bool kNarrowerHalf = std::is_same_v<P, c10::Half> && !std::is_same_v<T, c10::Half>;
template <typename P, typename T>
constexpr bool kStoreSaturates = kIsFp8<P> || kNarrowerHalf<P, T>;

template <typename P, typename T>
inline P to_pool(T x) {
  if constexpr (kStoreSaturates<P, T>) {
    constexpr float kMax = kNarrowerHalf<P, T> ? 65504.f
                           : std::is_same_v<P, c10::Float8_e4m3fn> ? 448.f : 57344.f;
    const float f = static_cast<float>(x);
    return P(f > kMax ? kMax : (f < -kMax ? -kMax : f));
  } else {
    return static_cast<P>(x);
  }
}

struct DecodeShape {
  int64_t q_heads, kv_heads, head_dim;
  int64_t q_stride, out_stride;  // row strides of q and out
  int64_t slot_stride;           // elements per pool slot: 2 * kv_heads * head_dim
  int64_t table_stride;          // req_to_token row stride
  float scale, logit_cap;        // logit_cap 0: none
  int64_t window;                // 0: full attention
};

// Extends of at most this many new tokens per request take the per-token paths (decode,
// speculative verify): one work item per new token. Longer ones take the tiled path
// where it serves (extend_tiled_serves).
constexpr int64_t kPerTokenMaxExtend = 16;

// Whether paged_attention takes the tiled path for a batch whose longest extend is
// `max_extend` new tokens (0: decode): the vector build, head_dim a multiple of its
// vector width and at most 256.
bool extend_tiled_serves(int64_t max_extend, int64_t head_dim);

// The new tokens' K/V as the model computed them ([T, Hkv * D] rows, T: q's dtype), or
// none (k == nullptr): then they are read from the pool like the cached prefix.
template <typename T>
struct NewKV {
  const T *k, *v;
  int64_t k_stride, v_stride;
};

// The tiled path (extend_attention.cpp): the extend_lens[b] new tokens of request b are
// rows [sum of earlier extends, + extend_lens[b]) of q and out, at positions
// [seq_lens[b] - extend_lens[b], seq_lens[b]); each sees its request's keys at
// (p - window, p]: the cached prefix's from the pool through req_to_token, the new
// tokens' from `fresh` when given (unrounded by a bf16/fp16 pool, as SDPA over the new
// k and v sees them). T: q, out and fresh; P: the pool.
template <typename T, typename P>
void attend_extend_tiled(const T* q, T* out, const P* pool, NewKV<T> fresh, const int32_t* table,
                         const int64_t* pool_idx, const int64_t* seq_lens,
                         const int64_t* extend_lens, int64_t bs, const DecodeShape& s);

}  // namespace sgl_cpu
