// Python bindings of the CPU kernels (loaded by sglang.srt.layers.cpu_kernels).
#include <torch/extension.h>

namespace sgl_cpu {
void rmsnorm_out(at::Tensor& out, const at::Tensor& x, const at::Tensor& w, double eps);
void fused_add_rmsnorm_(at::Tensor& x, at::Tensor& residual, const at::Tensor& w, double eps);
void silu_and_mul_out(at::Tensor& out, const at::Tensor& x);
void rotary_neox_(at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_cache,
                  const at::Tensor& sin_cache, int64_t head_dim);
void paged_attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k,
                     const at::Tensor& v, at::Tensor& kv_pool, const at::Tensor& loc,
                     const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                     const at::Tensor& seq_lens, const at::Tensor& extend_lens, double scale,
                     double logit_cap, int64_t window, bool save_kv);
void argmax_rows(at::Tensor& out, const at::Tensor& x);
void linear_small_m(at::Tensor& out, const at::Tensor& x, const at::Tensor& w,
                    const std::optional<at::Tensor>& bias);
}  // namespace sgl_cpu

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rmsnorm_out", &sgl_cpu::rmsnorm_out, "out <- rmsnorm(x) * w");
  m.def("fused_add_rmsnorm_", &sgl_cpu::fused_add_rmsnorm_,
        "residual <- x + residual; x <- rmsnorm(residual) * w, in place");
  m.def("silu_and_mul_out", &sgl_cpu::silu_and_mul_out, "out <- silu(gate) * up");
  m.def("rotary_neox_", &sgl_cpu::rotary_neox_, "neox rotary embedding, in place");
  m.def("paged_attention", &sgl_cpu::paged_attention,
        "causal attention of new tokens over the paged KV pool (writes their K/V first)");
  m.def("linear_small_m", &sgl_cpu::linear_small_m,
        "out <- x @ w^T (+ bias), reading w once for all rows (decode-size M)",
        py::arg("out"), py::arg("x"), py::arg("w"), py::arg("bias") = py::none());
  m.def("argmax_rows", &sgl_cpu::argmax_rows, "out <- argmax of each row (first max; NaN first)");
}
