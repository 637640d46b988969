// Paged attention for decode and small extends (speculative verify, short chunks): each
// new token attends causally over its request's KV, read straight from the pool through
// req_to_token (no gathered copy), after the new tokens' K/V are written into the pool.
// GQA/MQA, sliding windows, logit soft-capping.
#include <vector>

#include "common.h"

namespace sgl_cpu {
namespace {

struct DecodeShape {
  int64_t q_heads, kv_heads, head_dim;
  int64_t q_stride, out_stride;  // row strides of q and out
  int64_t slot_stride;           // elements per pool slot: 2 * kv_heads * head_dim
  int64_t table_stride;          // req_to_token row stride
  float scale, logit_cap;        // logit_cap 0: none
  int64_t window;                // 0: full attention
};

// Writes k, v ([T, Hkv * D], rows may be strided) into pool slots `loc`.
template <typename T>
void write_kv(T* pool, const T* k, const T* v, const int64_t* loc, int64_t rows,
              int64_t k_stride, int64_t v_stride, int64_t slot_stride, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    T* slot = pool + loc[r] * slot_stride;  // [2, Hkv, D]: K then V
    std::copy(k + r * k_stride, k + r * k_stride + width, slot);
    std::copy(v + r * v_stride, v + r * v_stride + width, slot + width);
  }
}

// One request, one KV head: the `group` query heads that share it, each key and value
// row read once for all of them.
//   q: [group, D]; out: [group, D]; keys/values of the kv_len slots listed in `slots`.
//   scores: [group, kv_len] and acc: [group, D], scratch.
template <typename T>
void attend_one(const T* q, T* out, const T* pool, const int32_t* slots, int64_t kv_len,
                int64_t kv_head, int64_t group, const DecodeShape& s, std::vector<float>& scores,
                std::vector<float>& acc) {
  const int64_t d = s.head_dim, width = s.kv_heads * d;
  scores.resize(group * kv_len);
  acc.assign(group * d, 0.f);
  for (int64_t j = 0; j < kv_len; ++j) {
    const T* key = pool + int64_t(slots[j]) * s.slot_stride + kv_head * d;
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
    const T* value = pool + int64_t(slots[j]) * s.slot_stride + width + kv_head * d;
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

}  // namespace

// Attention of a batch's new tokens over the paged KV pool, each causal over its own
// request: q: [T, Hq * D]; k, v: [T, Hkv * D] (rows may be strided); kv_pool:
// [slots, 2, Hkv, D] contiguous, of q's dtype; loc: int64[T] (the new tokens' slots,
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
  TORCH_CHECK(kv_pool.scalar_type() == q.scalar_type() && out.scalar_type() == q.scalar_type(),
              "kv_pool and out must have q's dtype");
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
  SGL_DISPATCH_FLOATS(q.scalar_type(), "paged_attention", [&] {
    scalar_t* pool = kv_pool.data_ptr<scalar_t>();
    if (save_kv) {
      check_rows(k, "k");
      check_rows(v, "v");
      TORCH_CHECK(k.size(0) == rows && v.size(0) == rows && k.size(1) == kv_heads * d &&
                      v.size(1) == kv_heads * d,
                  "k, v: [T, Hkv * D]");
      write_kv(pool, k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(), loc.data_ptr<int64_t>(),
               rows, k.stride(0), v.stride(0), s.slot_stride, kv_heads * d);
    }
    const scalar_t* qp = q.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const int32_t* table = req_to_token.data_ptr<int32_t>();
    at::parallel_for(0, rows * kv_heads, grain_for(2 * places.mean_kv_len * d * group),
                     [&](int64_t begin, int64_t end) {
      std::vector<float> scores, acc;
      for (int64_t item = begin; item < end; ++item) {
        const int64_t t = item / kv_heads, h = item % kv_heads;
        const int64_t b = places.token_req[t], kv_end = places.token_end[t];
        const int64_t kv_len = window > 0 ? std::min(kv_end, window) : kv_end;
        const int32_t* slots = table + pool_idx[b] * s.table_stride + (kv_end - kv_len);
        attend_one(qp + t * s.q_stride + h * group * d, op + t * s.out_stride + h * group * d,
                   pool, slots, kv_len, h, group, s, scores, acc);
      }
    });
  });
}

}  // namespace sgl_cpu
