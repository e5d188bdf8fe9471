// The shared-memory tile layout that TMA writes with 128-byte swizzle and that wgmma reads through
// 128-byte-swizzle descriptors: one layout for every operand of the Hopper forward.
//
// A kRows x kCols tile of 16-bit elements is stored as ceil(kCols / 64) column blocks, each the
// kRows x 64 box of one TMA copy: row r of a block is 128 bytes at r * 128, and its eight 16-byte
// chunks are XOR-swizzled by the row within its 8-row group, chunk c at ((c ^ (r % 8)) * 16).
// Equivalently, on byte offsets within a 1024-byte-aligned block: bits 4..6 ^= bits 7..9. The
// swizzle is applied to the address, so every block must start 1024-byte aligned (kRows % 8 == 0
// keeps each block a whole number of 1024-byte atoms; the tile base is the caller's to align).
#pragma once

#include <cstdint>

namespace flashattn::cuda::sm90 {

inline constexpr int kSw128Bytes = 128;        // bytes in one swizzled row
inline constexpr int kSw128Cols = 64;          // 16-bit elements in one swizzled row
inline constexpr int kSw128AtomBytes = 1024;   // 8 rows: the period of the swizzle pattern
inline constexpr int kSw128Alignment = 1024;   // of every column block in shared memory

template <int kRows, int kCols>
struct Sw128Tile {
  static_assert(kRows % 8 == 0, "a column block is a whole number of 8-row swizzle atoms");
  static constexpr int kColBlocks = (kCols + kSw128Cols - 1) / kSw128Cols;
  static constexpr int kColBlockBytes = kRows * kSw128Bytes;
  static constexpr int kBytes = kColBlocks * kColBlockBytes;

  // Byte offset of element (row, col) from the tile base.
  __host__ __device__ static constexpr uint32_t offset(int row, int col) {
    return static_cast<uint32_t>((col / kSw128Cols) * kColBlockBytes + row * kSw128Bytes +
                                 ((((col % kSw128Cols) / 8) ^ (row % 8)) * 16) + (col % 8) * 2);
  }

  // Byte offset of column block `block` (the destination of the TMA box with columns 64 block ..).
  __host__ __device__ static constexpr uint32_t col_block_offset(int block) {
    return static_cast<uint32_t>(block * kColBlockBytes);
  }
};

}  // namespace flashattn::cuda::sm90
