// RMSNorm and fused residual-add + RMSNorm (in place) over rows (Llama's formula: float32
// statistics, the normalized row cast to the input dtype before the weight multiplies it).
#include "common.h"
#include "vec.h"

namespace sgl_cpu {
namespace {

template <typename T>
inline void norm_row(T* x, const T* w, int64_t width, float eps) {
  float inv_rms = 1.f / std::sqrt(sum_squares(x, width) / static_cast<float>(width) + eps);
  int64_t i = 0;
#if defined(SGL_HAVE_VEC)
  if constexpr (kHasVecLoad<T>) {  // the same roundings as the scalar loop, in vectors
    const vfloat inv = vset1(inv_rms);
    for (; i + kVecWidth <= width; i += kVecWidth) {
      const vfloat normed = vround<T>(vmul(vload(x + i), inv));
      vstore(x + i, vmul(vload(w + i), normed));
    }
  }
#endif
  for (; i < width; ++i) {
    T normed = static_cast<T>(static_cast<float>(x[i]) * inv_rms);
    x[i] = static_cast<T>(static_cast<float>(w[i]) * static_cast<float>(normed));
  }
}

// residual <- x + residual, rounded to T; x <- residual.
template <typename T>
inline void add_residual_row(T* x, T* residual, int64_t width) {
  int64_t i = 0;
#if defined(SGL_HAVE_VEC)
  if constexpr (kHasVecLoad<T>) {
    for (; i + kVecWidth <= width; i += kVecWidth) {
      const vfloat sum = vadd(vload(x + i), vload(residual + i));
      vstore(residual + i, sum);
      vstore(x + i, sum);  // the same rounding
    }
  }
#endif
  for (; i < width; ++i) {
    residual[i] = static_cast<T>(static_cast<float>(x[i]) + static_cast<float>(residual[i]));
    x[i] = residual[i];
  }
}

}  // namespace

// out: [T, H] <- rmsnorm(x) * w (x unchanged).
void rmsnorm_out(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, double eps) {
  check_rows(x, "x");
  check_rows(out, "out");
  TORCH_CHECK(out.sizes() == x.sizes() && out.scalar_type() == x.scalar_type(),
              "out must match x in shape and dtype");
  TORCH_CHECK(w.is_contiguous() && w.numel() == x.size(1) && w.scalar_type() == x.scalar_type(),
              "w must be a contiguous [H] tensor of x's dtype");
  const int64_t rows = x.size(0), width = x.size(1);
  const int64_t x_stride = x.stride(0), o_stride = out.stride(0);
  SGL_DISPATCH_FLOATS(x.scalar_type(), "rmsnorm_out", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    const scalar_t* wp = w.data_ptr<scalar_t>();
    sgl_cpu::parallel_for(0, rows, width, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        std::copy(xp + r * x_stride, xp + r * x_stride + width, op + r * o_stride);
        norm_row(op + r * o_stride, wp, width, float(eps));
      }
    });
  });
}

// residual <- x + residual; x <- rmsnorm(residual) * w. Both [T, H], in place.
void fused_add_rmsnorm_(at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps) {
  check_rows(x, "x");
  check_rows(residual, "residual");
  TORCH_CHECK(x.sizes() == residual.sizes() && x.scalar_type() == residual.scalar_type(),
              "x and residual must agree in shape and dtype");
  TORCH_CHECK(w.is_contiguous() && w.numel() == x.size(1) && w.scalar_type() == x.scalar_type(),
              "w must be a contiguous [H] tensor of x's dtype");
  const int64_t rows = x.size(0), width = x.size(1);
  const int64_t x_stride = x.stride(0), r_stride = residual.stride(0);
  SGL_DISPATCH_FLOATS(x.scalar_type(), "fused_add_rmsnorm_", [&] {
    scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* rp = residual.data_ptr<scalar_t>();
    const scalar_t* wp = w.data_ptr<scalar_t>();
    sgl_cpu::parallel_for(0, rows, width, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        scalar_t* xr = xp + r * x_stride;
        scalar_t* rr = rp + r * r_stride;
        add_residual_row(xr, rr, width);
        norm_row(xr, wp, width, float(eps));
      }
    });
  });
}

}  // namespace sgl_cpu
