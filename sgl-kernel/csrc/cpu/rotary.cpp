// Rotary position embedding (neox layout: the two halves of the rotated dims pair up),
// in place on a [T, H * D] row-major view, e.g. the q and k columns of a fused qkv output.
#include "common.h"

namespace sgl_cpu {

// x: [T, H * D] (rows may be strided); positions: int64[T]; cos_cache, sin_cache:
// float32[max_pos, rot / 2]. Rotates the first `rot` dims of each head:
//   x1' = x1 cos - x2 sin,  x2' = x2 cos + x1 sin   (x1 = x[:rot/2], x2 = x[rot/2:rot])
void rotary_neox_(at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_cache,
                  const at::Tensor& sin_cache, int64_t head_dim) {
  check_rows(x, "x");
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.is_contiguous() &&
                  positions.numel() == x.size(0),
              "positions must be a contiguous int64[T]");
  TORCH_CHECK(cos_cache.scalar_type() == at::kFloat && cos_cache.is_contiguous() &&
                  sin_cache.sizes() == cos_cache.sizes() && sin_cache.is_contiguous() &&
                  sin_cache.scalar_type() == at::kFloat,
              "cos_cache and sin_cache must be contiguous float32 [max_pos, rot / 2]");
  TORCH_CHECK(x.size(1) % head_dim == 0, "x's width must be a multiple of head_dim");
  const int64_t rows = x.size(0), heads = x.size(1) / head_dim, stride = x.stride(0);
  const int64_t half = cos_cache.size(1), max_pos = cos_cache.size(0);
  TORCH_CHECK(2 * half <= head_dim, "rotary dims exceed head_dim");
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(pos[r] >= 0 && pos[r] < max_pos, "position ", pos[r], " outside the cache");
  }
  const float* cos_p = cos_cache.data_ptr<float>();
  const float* sin_p = sin_cache.data_ptr<float>();
  SGL_DISPATCH_FLOATS(x.scalar_type(), "rotary_neox_", [&] {
    scalar_t* xp = x.data_ptr<scalar_t>();
    sgl_cpu::parallel_for(0, rows, heads * 2 * half, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const float* c = cos_p + pos[r] * half;
        const float* s = sin_p + pos[r] * half;
        for (int64_t h = 0; h < heads; ++h) {
          scalar_t* x1 = xp + r * stride + h * head_dim;
          scalar_t* x2 = x1 + half;
          for (int64_t i = 0; i < half; ++i) {
            float a = static_cast<float>(x1[i]), b = static_cast<float>(x2[i]);
            x1[i] = static_cast<scalar_t>(a * c[i] - b * s[i]);
            x2[i] = static_cast<scalar_t>(b * c[i] + a * s[i]);
          }
        }
      }
    });
  });
}

}  // namespace sgl_cpu
