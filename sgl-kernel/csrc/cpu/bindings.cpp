// Python bindings of the CPU kernels (loaded by sglang.srt.layers.cpu_kernels).
#include <torch/extension.h>

#include "decoder_layer.h"
#include "gemm_packed_bf16.h"
#include "kernels.h"
#include "paged.h"
#include "parallel.h"
#include "vec.h"

#if defined(SGL_HAVE_VEC)
constexpr const char* kVectorIsa = SGL_VEC_ISA;
#else
constexpr const char* kVectorIsa = "scalar";
#endif

namespace {
// For the tests of parallel_for: how many times each index in [0, n) was visited (each
// must be once), and which thread ran it; a chunk holding `throw_at` raises instead.
std::tuple<at::Tensor, at::Tensor> parallel_for_visits(int64_t n, int64_t grain, int64_t threads,
                                                       int64_t throw_at) {
  at::Tensor visits = at::zeros({n}, at::kInt), runner = at::zeros({n}, at::kLong);
  int32_t* v = visits.data_ptr<int32_t>();
  int64_t* r = runner.data_ptr<int64_t>();
  sgl_cpu::pool_parallel_for(0, n, grain, threads, [&](int64_t begin, int64_t end) {
    TORCH_CHECK(throw_at < begin || throw_at >= end, "chunk [", begin, ", ", end, ") raised");
    const auto self = static_cast<int64_t>(std::hash<std::thread::id>{}(std::this_thread::get_id()));
    for (int64_t i = begin; i < end; ++i) {
      ++v[i];  // one chunk per index: no two threads write the same element
      r[i] = self;
    }
  });
  return {visits, runner};
}

// For the tests of parallel_for_claimed under OpenMP (torch's threads, the pool off): how
// many times each index in [0, n) was visited, items of `work_per_item` multiply-adds.
at::Tensor parallel_for_claimed_visits(int64_t n, int64_t work_per_item) {
  at::Tensor visits = at::zeros({n}, at::kInt);
  int32_t* v = visits.data_ptr<int32_t>();
  sgl_cpu::parallel_for_claimed(0, n, work_per_item, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) ++v[i];  // one chunk per index, as above
  });
  return visits;
}
}  // namespace

// Classes are module_local: a second build of these sources (the portable one the tests
// load beside the native) registers its own copies of the types.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rmsnorm_out", &sgl_cpu::rmsnorm_out, "out <- rmsnorm(x) * w");
  m.def("fused_add_rmsnorm_", &sgl_cpu::fused_add_rmsnorm_,
        "residual <- x + residual; x <- rmsnorm(residual) * w, in place");
  m.def("silu_and_mul_out", &sgl_cpu::silu_and_mul_out, "out <- silu(gate) * up");
  m.def("rotary_neox_", &sgl_cpu::rotary_neox_, "neox rotary embedding, in place");
  m.def("paged_attention", &sgl_cpu::paged_attention,
        "causal attention of new tokens over the paged KV pool (writes their K/V first)");
  m.def("extend_tiled", &sgl_cpu::extend_tiled_serves,
        "whether paged_attention takes its tiled path for this longest extend and head_dim",
        py::arg("max_extend"), py::arg("head_dim"));
  m.def("linear_small_m", &sgl_cpu::linear_small_m,
        "out <- x @ w^T (+ bias), reading w once for all rows (decode-size M)",
        py::arg("out"), py::arg("x"), py::arg("w"), py::arg("bias") = py::none());
  m.def("linear_packed", &sgl_cpu::linear_packed,
        "out <- x @ w^T (+ bias) for many rows over a bf16/fp16 (or float32) w, float32 x",
        py::arg("out"), py::arg("x"), py::arg("w"), py::arg("bias") = py::none(),
        py::arg("panels") = py::none());
  m.def("linear_panels_small_m", &sgl_cpu::linear_panels_small_m,
        "out <- x @ w^T (+ bias) for a few rows of bf16 or float32 x over a bf16 w, from w's "
        "load-time panels only (w may be shape-only, on the meta device)",
        py::arg("out"), py::arg("x"), py::arg("w"), py::arg("bias") = py::none(),
        py::arg("panels"));
  m.def("pack_weight_panels", &sgl_cpu::pack_weight_panels,
        "a bf16 weight [N, K] packed once for linear_packed (int32 words, see gemm_packed.cpp)",
        py::arg("w"));
  m.attr("weight_panel_width") = sgl_cpu::weight_panel_width();  // 0: no weight panels
  m.def("argmax_rows", &sgl_cpu::argmax_rows, "out <- argmax of each row (first max; NaN first)");
  m.def("parallel_for_claimed_visits", &parallel_for_claimed_visits,
        "test hook of parallel_for_claimed (see above)");
  m.def("parallel_for_visits", &parallel_for_visits, "test hook of parallel_for (see above)",
        py::call_guard<py::gil_scoped_release>());
  m.def("pool_workers", &sgl_cpu::pool_workers, "worker threads of the kernels' pool");
  m.def("set_pool_threads", &sgl_cpu::set_pool_threads,
        "run the kernels on the pool with this many threads (0: on torch's OpenMP team)");
  m.def("pool_threads", &sgl_cpu::pool_threads, "the pool's threads while it serves, else 0");
  m.attr("vector_isa") = kVectorIsa;  // the vector path the kernels were built with
  m.attr("bf16_dot") = sgl_cpu::kHasBf16Dot;  // bf16 x bf16 linears use the AVX-512 bf16 dot product
  m.def("amx_tiles", &sgl_cpu::amx_tiles,
        "whether bf16 linears over load-time panels multiply on AMX tiles (built, granted, on)");
  m.def("use_amx_tiles", &sgl_cpu::use_amx_tiles, "turn the AMX tile path on or off (SGLANG_CPU_AMX)",
        py::arg("on"));

  py::class_<sgl_cpu::DecoderLayerWeights>(m, "DecoderLayerWeights", py::module_local())
      .def(py::init<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                    std::optional<at::Tensor>, std::optional<at::Tensor>,
                    std::optional<at::Tensor>, std::optional<at::Tensor>,
                    std::optional<at::Tensor>, std::optional<at::Tensor>,
                    std::optional<at::Tensor>, std::optional<at::Tensor>>(),
           py::arg("input_norm"), py::arg("post_attention_norm"), py::arg("qkv"), py::arg("o"),
           py::arg("gate_up"), py::arg("down"), py::arg("qkv_bias") = py::none(),
           py::arg("o_bias") = py::none(), py::arg("q_norm") = py::none(),
           py::arg("k_norm") = py::none(), py::arg("qkv_panels") = py::none(),
           py::arg("o_panels") = py::none(), py::arg("gate_up_panels") = py::none(),
           py::arg("down_panels") = py::none());
  py::class_<sgl_cpu::DecoderLayerShape>(m, "DecoderLayerShape", py::module_local())
      .def(py::init<int64_t, int64_t, int64_t, double, double, double, int64_t, int64_t, int64_t,
                    int64_t, int64_t, int64_t>(),
           py::arg("num_heads"), py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("rms_eps"),
           py::arg("scale"), py::arg("logit_cap"), py::arg("window"), py::arg("small_m_rows"),
           py::arg("long_k"), py::arg("long_k_rows"), py::arg("half_weight_rows"),
           py::arg("amx_min_rows") = 0);
  py::class_<sgl_cpu::DecodeStep>(m, "DecodeStep", py::module_local())
      .def(py::init<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor,
                    at::Tensor, at::Tensor>(),
           py::arg("positions"), py::arg("cos_cache"), py::arg("sin_cache"),
           py::arg("out_cache_loc"), py::arg("req_to_token"), py::arg("req_pool_indices"),
           py::arg("seq_lens"), py::arg("extend_lens"));
  py::class_<sgl_cpu::DecoderLayer>(m, "DecoderLayer", py::module_local())
      .def(py::init<sgl_cpu::DecoderLayerWeights, sgl_cpu::DecoderLayerShape>())
      .def("forward", &sgl_cpu::DecoderLayer::forward,
           "(hidden, residual) of the next layer, as LlamaDecoderLayer.forward");
}
