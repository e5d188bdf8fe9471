// Global -> shared tile loads through cp.async, 16 bytes per thread per step. A thread keeps one
// chunk column and walks down the rows, so its source address advances by one fixed stride per
// step. Rows past the sequence end and columns past the runtime head dim are zero-filled: V rows
// must be finite (P is 0 there, and 0 * NaN would poison O), and zero columns add nothing to QK^T.
#pragma once

#include <cstdint>

#include "cuda/primitives/cp_async.cuh"
#include "cuda/primitives/smem_tile.cuh"

namespace flashattn::detail::sm80 {

constexpr int next_power_of_two(int x) {
  int p = 1;
  while (p < x) p *= 2;
  return p;
}

template <class T, int kRows, int kHeadDim, int kThreads>
struct TileLoad {
  using Tile = cuda::SwizzledTile<kRows, kHeadDim>;
  static constexpr int kChunksPerRow = kHeadDim / 8;  // chunks holding data; the padding stays unwritten
  // Threads per row: a power of two, so that every step covers whole rows (head dims 96 and 192
  // leave a quarter of the threads idle, a small cost next to the GEMMs).
  static constexpr int kLanesPerRow = next_power_of_two(kChunksPerRow);
  static constexpr int kRowsPerStep = kThreads / kLanesPerRow;
  static_assert(kThreads % kLanesPerRow == 0 && kRows % kRowsPerStep == 0, "steps must cover whole tiles");

  // Copies rows [0, kRows) of a strided [rows, head_dim] view starting at `rows0` into `smem`.
  // rows_valid: rows that exist (the rest become zeros); head_dim: the runtime head dim.
  __device__ __forceinline__ static void issue(uint32_t smem, const T* rows0, int64_t row_stride,
                                               int rows_valid, int head_dim, int tid) {
    const int chunk = tid % kLanesPerRow, row0 = tid / kLanesPerRow;
    if (chunk >= kChunksPerRow) return;
    const bool column_valid = chunk * 8 < head_dim;
    const T* src = rows0 + row0 * row_stride + chunk * 8;
    const int64_t step_stride = kRowsPerStep * row_stride;
    const uint32_t dst = smem + Tile::offset(row0, chunk);
#pragma unroll
    for (int step = 0; step < kRows / kRowsPerStep; ++step) {
      const bool valid = column_valid && row0 + step * kRowsPerStep < rows_valid;
      // Steps of 8 rows keep the swizzle: the destination moves by a constant.
      const uint32_t to = kRowsPerStep % 8 == 0 ? dst + step * kRowsPerStep * Tile::kChunksPerRow * 16
                                                : smem + Tile::offset(row0 + step * kRowsPerStep, chunk);
      cuda::cp_async_16_or_zero(to, valid ? src : rows0, valid);
      src += step_stride;
    }
  }
};

}  // namespace flashattn::detail::sm80
