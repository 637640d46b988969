// y = x W^T (+ b) for bf16 x over bf16 W on CPUs with AMX tiles (amx_bf16: Intel Sapphire
// Rapids and later), reading W's load-time panels (pack_weight_panels, gemm_packed.cpp).
// linear_packed's bf16 path (gemm_packed_bf16.cpp) calls this where the tiles serve.
//
// A panel is [ceil(K / 2), 32] 32-bit words, word (p, j) holding W[j, 2p] and W[j, 2p + 1]:
// rows of 128 bytes, the two halves of which are AMX's B-tile layout for 16 columns (16
// pairs per tile, one per row, 64 bytes each). A tile step multiplies a 16-row x 32-K A
// tile of x by such a B tile into a 16 x 16 float32 C tile (TDPBF16PS, 16 x 16 x 32
// multiply-adds). A work item is 32 rows x one panel: 4 C tiles, 2 A tiles and 2 B tiles
// (the 8 tiles there are), the K loop in steps of 32; C is stored to a float32 scratch,
// the bias added and the sums rounded to bf16 once (nearest even), as the dot-product path.
// Against that path the float32 sums differ in association only.
//
// Shapes: x [M, K] bf16 (rows contiguous, any row stride), K a multiple of 32; panels of W
// [N, K]; b [N] bf16 or none; out [M, N] bf16 contiguous. The last block's rows past M are
// read from a zero-padded copy of those rows (the tile loads whole 16-row blocks).
#include "gemm_packed_bf16.h"

#include <atomic>

#include "amx.h"

namespace sgl_cpu {
namespace {
std::atomic<bool> amx_wanted{true};  // SGLANG_CPU_AMX, set at load (cpu_kernels.py)
}  // namespace

void use_amx_tiles(bool on) { amx_wanted.store(on); }

bool amx_tiles() {
#if defined(SGL_HAVE_AMX_BF16)
  return amx_wanted.load() && amx_tiles_usable();
#else
  return false;
#endif
}
}  // namespace sgl_cpu

#if defined(SGL_HAVE_AMX_BF16)
#include <ATen/ATen.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "common.h"
#include "parallel.h"

namespace sgl_cpu {
namespace {

constexpr int64_t kPanel = 32;      // panel columns: two B tiles of 16
constexpr int64_t kBlockRows = 32;  // rows per work item: two A tiles of 16
constexpr int64_t kTileRows = 16;
constexpr int64_t kPanelRowBytes = kPanel * 4;
constexpr int64_t kXBlockBytes = 256 << 10;  // x rows per pass over the panels (L2)

struct AmxCall {
  int64_t m, n, k, x_stride;
  const c10::BFloat16* bias;  // [N] or nullptr
};

// out rows [r0, r0 + rows) x columns [n0, n0 + cols) <- 32 rows of x (from `x_rows`, row
// stride `stride` elements) over one panel.
void block(const c10::BFloat16* x_rows, int64_t stride, const uint32_t* panel,
           c10::BFloat16* out, int64_t rows, int64_t n0, int64_t cols, const AmxCall& c,
           float* scratch) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int64_t stride_bytes = stride * int64_t(sizeof(c10::BFloat16));
  for (int64_t k0 = 0; k0 < c.k; k0 += 32) {
    const uint32_t* b = panel + (k0 / 2) * kPanel;
    tile_step_2x2(x_rows + k0, x_rows + kTileRows * stride + k0, stride_bytes, b, b + 16,
                  kPanelRowBytes);
  }
  constexpr int64_t ld = kPanel * int64_t(sizeof(float));  // scratch [32, 32]
  _tile_stored(0, scratch, ld);
  _tile_stored(1, scratch + 16, ld);
  _tile_stored(2, scratch + kTileRows * kPanel, ld);
  _tile_stored(3, scratch + kTileRows * kPanel + 16, ld);
  const __m512 b_lo = load_bias(c.bias, n0, cols);
  const __m512 b_hi = load_bias(c.bias, n0 + 16, cols - 16);
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = scratch + r * kPanel;
    store_bf16(out + r * c.n + n0, _mm512_add_ps(_mm512_loadu_ps(s), b_lo), cols);
    store_bf16(out + r * c.n + n0 + 16, _mm512_add_ps(_mm512_loadu_ps(s + 16), b_hi), cols - 16);
  }
}

}  // namespace

bool amx_tiles_usable() {
  // Linux hands a process the tile state only on request (arch_prctl
  // ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); a tile instruction before that faults.
  static const bool granted = [] {
    constexpr int kArchReqXcompPerm = 0x1023;
    constexpr int kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
}

bool amx_serves(int64_t k) { return k > 0 && k % 32 == 0 && amx_tiles(); }

void linear_amx_bf16(at::Tensor& out, const at::Tensor& x, const c10::BFloat16* bias,
                     const uint32_t* panels, int64_t n) {
  const AmxCall c{x.size(0), n, x.size(1), x.stride(0), bias};
  const int64_t num_panels = (c.n + kPanel - 1) / kPanel;
  const int64_t full_blocks = c.m / kBlockRows, tail_rows = c.m % kBlockRows;
  const auto* xp = x.data_ptr<c10::BFloat16>();
  auto* op = out.data_ptr<c10::BFloat16>();
  // the last block's rows, zero-padded to 32 (a tile load reads whole rows)
  std::vector<c10::BFloat16> tail(tail_rows > 0 ? kBlockRows * c.k : 0, c10::BFloat16(0.0f));
  for (int64_t r = 0; r < tail_rows; ++r) {
    std::memcpy(tail.data() + r * c.k, xp + (full_blocks * kBlockRows + r) * c.x_stride,
                c.k * sizeof(c10::BFloat16));
  }
  const int64_t blocks = full_blocks + (tail_rows > 0);
  const int64_t x_blocks = std::max<int64_t>(1, kXBlockBytes / (kBlockRows * c.k * 2));
  sgl_cpu::parallel_for(0, num_panels, kPanel * c.k * c.m, [&](int64_t begin, int64_t end) {
    configure_amx_tiles();
    alignas(64) float scratch[kBlockRows * kPanel];
    for (int64_t b0 = 0; b0 < blocks; b0 += x_blocks) {
      const int64_t b1 = std::min(blocks, b0 + x_blocks);
      for (int64_t p = begin; p < end; ++p) {
        const int64_t n0 = p * kPanel, cols = std::min(kPanel, c.n - n0);
        const uint32_t* panel = panels + p * (c.k / 2) * kPanel;
        for (int64_t bi = b0; bi < b1; ++bi) {
          const int64_t r0 = bi * kBlockRows;
          const bool is_tail = bi == full_blocks;
          block(is_tail ? tail.data() : xp + r0 * c.x_stride, is_tail ? c.k : c.x_stride, panel,
                op + r0 * c.n, is_tail ? tail_rows : kBlockRows, n0, cols, c, scratch);
        }
      }
    }
    _tile_release();
  });
}

}  // namespace sgl_cpu
#endif
