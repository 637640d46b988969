// SiLU-and-mul: [T, 2d] laid out as [gate | up] -> silu(gate) * up, [T, d].
#include "common.h"
#include "vec.h"

namespace sgl_cpu {
namespace {

#if defined(SGL_HAVE_VEC)
// The row's first multiple of kVecWidth elements in vectors; returns how many it did.
template <typename T>
int64_t silu_and_mul_vec(const T* gate, const T* up, T* out, int64_t d) {
  int64_t i = 0;
  for (; i + kVecWidth <= d; i += kVecWidth) {
    const vfloat g = vload(gate + i);
    const vfloat e = vexp(vsub(vzero(), g));
    alignas(64) T act[kVecWidth];  // silu rounded to the dtype before the multiply
    vstore(act, vdiv(g, vadd(vset1(1.f), e)));
    vstore(out + i, vmul(vload(act), vload(up + i)));
  }
  return i;
}
#endif

}  // namespace

// out: [T, d] (contiguous rows) <- silu(x[:, :d]) * x[:, d:]; silu in float32 and cast to
// the dtype before the multiply, as torch's F.silu(gate) * up rounds.
void silu_and_mul_out(at::Tensor& out, const at::Tensor& x) {
  check_rows(x, "x");
  check_rows(out, "out");
  const int64_t rows = x.size(0), d = x.size(1) / 2;
  TORCH_CHECK(x.size(1) == 2 * d && out.size(0) == rows && out.size(1) == d,
              "x must be [T, 2d] and out [T, d]");
  TORCH_CHECK(out.scalar_type() == x.scalar_type(), "out must have x's dtype");
  const int64_t x_stride = x.stride(0), o_stride = out.stride(0);
  SGL_DISPATCH_FLOATS(x.scalar_type(), "silu_and_mul", [&] {
    const scalar_t* xp = x.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    sgl_cpu::parallel_for(0, rows, 8 * d, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const scalar_t* gate = xp + r * x_stride;
        const scalar_t* up = gate + d;
        scalar_t* o = op + r * o_stride;
        int64_t i = 0;
#if defined(SGL_HAVE_VEC)
        if constexpr (kHasVecLoad<scalar_t>) i = silu_and_mul_vec(gate, up, o, d);
#endif
        for (; i < d; ++i) {
          float g = static_cast<float>(gate[i]);
          scalar_t act = static_cast<scalar_t>(g / (1.f + exp_f32(-g)));
          o[i] = static_cast<scalar_t>(static_cast<float>(act) * static_cast<float>(up[i]));
        }
      }
    });
  });
}

}  // namespace sgl_cpu
