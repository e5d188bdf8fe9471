// Epilogue: the normalised output goes from the mma accumulators through shared memory to global
// memory in coalesced 16-byte stores; each row's lse is written by one lane of its quad. Each warp
// stages its own rows of an O tile laid over the Q region (sized for the wider of Q and O): every
// warp has passed its last QK^T before any warp gets here (the barrier before the last P·V), and
// the region holds no K or V, so with V head dims other than Q's the rows may overlap other
// warps' Q rows without a race.
#pragma once

#include <cstdint>

#include "cuda/primitives/mma.cuh"
#include "cuda/primitives/smem_tile.cuh"

namespace flashattn::detail::sm80 {

// The warp's o covers kMTiles * 16 rows from rows0 and kDTiles * 8 columns from 8 chunk0 (all of
// them, or its half where a pair of warps shares the rows); it stages and copies only those.
template <class T, int kMTiles, int kDTiles, class Tile>
__device__ __forceinline__ void store_output(const cuda::FragC (&o)[kMTiles][kDTiles], char* tile_smem, int rows0,
                                             T* o_rows0, int64_t o_row_stride, int rows_valid, int head_dim_v,
                                             int lane, int chunk0 = 0) {
  constexpr int kRows = kMTiles * 16;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int row = rows0 + mt * 16 + g + 8 * r;
        const uint32_t packed = cuda::MmaType<T>::pack(o[mt][dt].x[2 * r], o[mt][dt].x[2 * r + 1]);
        *reinterpret_cast<uint32_t*>(tile_smem + Tile::offset(row, chunk0 + dt) + 4 * t) = packed;
      }
  __syncwarp();

  constexpr int kChunksPerRow = kDTiles;
  static_assert(kRows * kChunksPerRow % 32 == 0);
#pragma unroll
  for (int step = 0; step < kRows * kChunksPerRow / 32; ++step) {
    const int c = lane + step * 32;
    const int row = c / kChunksPerRow, chunk = chunk0 + c % kChunksPerRow;
    if (row < rows_valid && chunk * 8 < head_dim_v) {
      const uint4 value = *reinterpret_cast<const uint4*>(tile_smem + Tile::offset(rows0 + row, chunk));
      *reinterpret_cast<uint4*>(o_rows0 + row * o_row_stride + chunk * 8) = value;
    }
  }
}

// lse of the warp's rows; lse_rows0 points at the warp's first row, rows are contiguous.
template <int kMTiles>
__device__ __forceinline__ void store_lse(const float (&lse)[kMTiles][2], float* lse_rows0, int rows_valid,
                                          int lane) {
  if ((lane & 3) != 0) return;
  const int g = lane >> 2;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = mt * 16 + g + 8 * r;
      if (row < rows_valid) lse_rows0[row] = lse[mt][r];
    }
}

}  // namespace flashattn::detail::sm80
