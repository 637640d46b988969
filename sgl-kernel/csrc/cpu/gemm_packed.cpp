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
// Without vector instructions the call widens W and runs at::linear.
#include <ATen/ATen.h>

#include <vector>

#include "common.h"
#include "kernels.h"
#include "vec.h"

namespace sgl_cpu {
namespace {

#if defined(SGL_HAVE_VEC)
constexpr int64_t kPanel = 2 * kVecWidth;  // output columns per panel: two vectors
// rows per tile: 2 x kTileRows accumulators + 2 W vectors + 1 x broadcast registers
constexpr int kTileRows = kVecRegisters == 32 ? 12 : 6;

struct PackedCall {
  int64_t m, n, k, x_stride;
  const float* bias;  // [N] or nullptr
};

// panel [K, kPanel] <- W rows n0 .. n0 + cols, widened and transposed; columns past
// `cols` are zero (the N tail).
template <typename W>
void pack_panel(float* panel, const W* w, int64_t n0, int64_t cols, int64_t k) {
  for (int64_t j = 0; j < kPanel; ++j) {
    if (j >= cols) {
      for (int64_t kk = 0; kk < k; ++kk) panel[kk * kPanel + j] = 0.f;
      continue;
    }
    const W* row = w + (n0 + j) * k;
    for (int64_t kk = 0; kk < k; ++kk) panel[kk * kPanel + j] = static_cast<float>(row[kk]);
  }
}

// out rows [0, R) x columns [n0, n0 + cols) <- x rows [0, R) over the packed panel.
template <int R>
void panel_tile(const float* x, const float* panel, float* out, int64_t n0, int64_t cols,
                const PackedCall& c) {
  vfloat lo[R], hi[R];
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = vzero();
  for (int64_t kk = 0; kk < c.k; ++kk) {
    const vfloat w_lo = vload(panel + kk * kPanel);
    const vfloat w_hi = vload(panel + kk * kPanel + kVecWidth);
    for (int r = 0; r < R; ++r) {
      const vfloat xv = vset1(x[r * c.x_stride + kk]);
      lo[r] = vfma(xv, w_lo, lo[r]);
      hi[r] = vfma(xv, w_hi, hi[r]);
    }
  }
  alignas(64) float row[kPanel];
  for (int r = 0; r < R; ++r) {
    vstore(row, lo[r]);
    vstore(row + kVecWidth, hi[r]);
    float* o = out + r * c.n + n0;
    for (int64_t j = 0; j < cols; ++j) o[j] = row[j] + (c.bias ? c.bias[n0 + j] : 0.f);
  }
}

template <typename W>
void run_packed(float* out, const float* x, const W* w, const PackedCall& c) {
  const int64_t panels = (c.n + kPanel - 1) / kPanel;
  at::parallel_for(0, panels, grain_for(kPanel * c.k * c.m), [&](int64_t begin, int64_t end) {
    std::vector<float> panel(c.k * kPanel);
    for (int64_t p = begin; p < end; ++p) {
      const int64_t n0 = p * kPanel, cols = std::min(kPanel, c.n - n0);
      pack_panel(panel.data(), w, n0, cols, c.k);
      int64_t r = 0;
      for (; r + kTileRows <= c.m; r += kTileRows) {
        panel_tile<kTileRows>(x + r * c.x_stride, panel.data(), out + r * c.n, n0, cols, c);
      }
      with_rows<kTileRows - 1>(int(c.m - r), [&](auto rows) {
        panel_tile<decltype(rows)::value>(x + r * c.x_stride, panel.data(), out + r * c.n, n0,
                                          cols, c);
      });
    }
  });
}
#endif

}  // namespace

// out [M, N] <- x [M, K] @ w [N, K]^T (+ bias [N]): float32 x, out and bias; w bf16,
// fp16 or float32.
void linear_packed(at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                   const std::optional<at::Tensor>& bias) {
  check_rows(x, "x");
  TORCH_CHECK(x.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat,
              "x and out must be float32");
  TORCH_CHECK(w.device().is_cpu() && w.dim() == 2 && w.is_contiguous() && w.size(1) == x.size(1),
              "w must be a contiguous 2-D CPU tensor [N, K] with K = x's columns");
  TORCH_CHECK(w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16 ||
                  w.scalar_type() == at::kHalf,
              "w must be float32, bfloat16 or float16");
  const bool has_bias = check_linear_out_bias(out, x, w, bias);  // x is float32
  if (x.size(0) == 0 || w.size(0) == 0) return;
#if defined(SGL_HAVE_VEC)
  const PackedCall call{x.size(0), w.size(0), x.size(1), x.stride(0),
                        has_bias ? bias->data_ptr<float>() : nullptr};
  float* op = out.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  switch (w.scalar_type()) {
    case at::kBFloat16: run_packed(op, xp, w.data_ptr<c10::BFloat16>(), call); break;
    case at::kHalf: run_packed(op, xp, w.data_ptr<c10::Half>(), call); break;
    default: run_packed(op, xp, w.data_ptr<float>(), call);
  }
#else
  out.copy_(at::linear(x, w.to(at::kFloat), has_bias ? *bias : at::Tensor()));
#endif
}

}  // namespace sgl_cpu
