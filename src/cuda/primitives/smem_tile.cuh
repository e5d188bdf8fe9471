// Shared-memory tiles of 16-bit elements, stored as rows of 16-byte chunks with the chunk index
// XOR-swizzled by the row (chunk ^ (row % 8)). Eight consecutive rows at one logical chunk then
// fall in eight different 16-byte bank groups, so the ldmatrix of an 8x8 matrix (eight rows, one
// chunk), the cp.async of eight chunks of one row and the epilogue's 4-byte stores (eight rows,
// one chunk, four lanes each) are all free of bank conflicts.
#pragma once

#include <cstdint>

namespace flashattn::cuda {

// kRows x kCols elements; kCols is padded to a multiple of 64 (whole 128-byte swizzle groups), so
// a head dim of 96 occupies 128 columns: the padding is never read.
template <int kRows, int kCols>
struct SwizzledTile {
  static constexpr int kPaddedCols = (kCols + 63) / 64 * 64;
  static constexpr int kChunksPerRow = kPaddedCols / 8;
  static constexpr int kBytes = kRows * kPaddedCols * 2;

  // Byte offset of logical chunk `chunk` (elements 8 chunk .. 8 chunk + 7) of row `row`.
  __device__ __forceinline__ static uint32_t offset(int row, int chunk) {
    return static_cast<uint32_t>((row * kChunksPerRow + (chunk ^ (row & 7))) * 16);
  }

  // offset(row + row_step, chunk + chunk_step) from offset(row, chunk) without recomputing the
  // swizzle: an XOR and an add with constants, so unrolled loops keep one address register per
  // lane instead of one per step (the steps are constants of unrolled loops). Needs
  // row_step % 8 == 0 (same swizzle row) and no bit shared by chunk and chunk_step % 8 (then
  // chunk + chunk_step == chunk ^ chunk_step in the low three bits).
  __device__ __forceinline__ static uint32_t advance(uint32_t offset_row_chunk, int row_step, int chunk_step) {
    return (offset_row_chunk ^ static_cast<uint32_t>((chunk_step & 7) * 16)) +
           static_cast<uint32_t>(((chunk_step & ~7) + row_step * kChunksPerRow) * 16);
  }
};

}  // namespace flashattn::cuda
