// AMX tiles (amx_bf16 CPUs): the one tile configuration the kernels use, and the switch
// that turns them on. Tiles 0-7 are all 16 rows x 64 bytes: a float32 C tile of 16 x 16,
// a bf16 A tile of 16 rows x 32, or a B tile of 16 bf16 pairs x 16 columns (TDPBF16PS
// multiplies A [16, 32] by B [32, 16] into C). gemm_amx.cpp (linears) and
// extend_attention.cpp (prefill attention) share it.
#pragma once

#include <cstdint>

#include "vec.h"

namespace sgl_cpu {

// Whether bf16 kernels multiply on AMX tiles: a build with them, the OS granting the tile
// state, and use_amx_tiles not turned off (gemm_amx.cpp; every build).
bool amx_tiles();
void use_amx_tiles(bool on);

#if defined(SGL_HAVE_AMX_BF16)
// Whether the OS granted this process the AMX tile state (asked once).
bool amx_tiles_usable();

// ldtilecfg's 64-byte operand: palette 1, each tile's rows and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// This thread's tiles 0-7 as 16 rows x 64 bytes (undo with _tile_release()).
inline void configure_amx_tiles() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// One K step of a 2 x 2 tile product: A tiles 4, 5 <- a0, a1 (row stride a_ld bytes);
// B tiles 6, 7 <- b0, b1 (stride b_ld); C tiles 0-3 += (4, 6), (4, 7), (5, 6), (5, 7).
// Two A and two B tiles feed four products, so no tile is reloaded while a product
// still reads it.
inline void tile_step_2x2(const void* a0, const void* a1, int64_t a_ld, const void* b0,
                          const void* b1, int64_t b_ld) {
  _tile_loadd(4, a0, a_ld);
  _tile_loadd(5, a1, a_ld);
  _tile_loadd(6, b0, b_ld);
  _tile_loadd(7, b1, b_ld);
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}
#endif

}  // namespace sgl_cpu
