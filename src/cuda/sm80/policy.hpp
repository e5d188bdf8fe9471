// Tile sizes of the sm80 forward kernel, one constexpr policy per head-dim instantiation, read by
// the host (dispatch, shared-memory size) and the device code alike. Changes speed only.
//
// Br query rows per thread block, split across the warps so that no warp needs another's softmax
// statistics; Bc keys per K/V tile. A warp owns 16 or 32 query rows (one or two m16 mma tiles).
// Two m16 tiles per warp halve the shared-memory traffic per tensor-core operation (each K and V
// fragment feeds two mma); above head dim 128 the output accumulators of 32 rows no longer fit in
// 255 registers, so those policies take 16-row warps.
#pragma once

namespace flashattn::detail::sm80 {

struct ForwardTiles {
  int head_dim;  // of q, k and v: the instantiation serves every multiple of 8 up to this
  int block_m;   // Br
  int block_n;   // Bc
  int warps;
  int min_blocks;  // resident blocks per multiprocessor asked of the compiler (caps registers)
  int stages;      // K/V buffers: 1 (V loads during QK^T, K during PV) or 2 (each a whole tile ahead)
  bool q_in_registers;  // Q fragments loaded once into registers instead of re-read from smem per tile

  constexpr int threads() const { return warps * 32; }
  constexpr int warp_rows() const { return block_m / warps; }
  constexpr int padded_head_dim() const { return (head_dim + 63) / 64 * 64; }
  // The Q tile and `stages` K and V tiles each.
  constexpr int smem_bytes() const { return (block_m + 2 * stages * block_n) * padded_head_dim() * 2; }
};

// Chosen on an H200 (bf16, docs/perf.md), among the shapes that ptxas compiles without spills:
// d = 64: Bc = 96 with two stages beat Bc = 64 (Bc = 128 spills); d = 96 and 128: one stage beat
// two; d = 192 and 256: 64x64 blocks of four 16-row warps, two per multiprocessor, beat 128x64
// blocks of eight warps. 16-row warps re-read Q from shared memory for every K tile; keeping Q in
// registers won 7-9% at d = 192, while at d = 256 it only fits with Bc = 32, which loses.
constexpr ForwardTiles forward_tiles(int head_dim) {
  switch (head_dim) {
    //               d   Br  Bc  warps blocks/SM stages Q in registers
    case 64: return {64, 128, 96, 4, 2, 2, false};
    case 96: return {96, 128, 64, 4, 2, 1, false};
    case 128: return {128, 128, 64, 4, 2, 1, false};
    case 192: return {192, 64, 64, 4, 2, 1, true};
    case 256: return {256, 64, 64, 4, 2, 1, false};
    default: return {0, 0, 0, 0, 0, 0, false};
  }
}

template <int kHeadDim>
struct ForwardPolicy {
  static constexpr ForwardTiles kTiles = forward_tiles(kHeadDim);
  static_assert(kTiles.head_dim == kHeadDim, "no tile policy for this head dim");
  static_assert(kHeadDim % 16 == 0, "the mma k-step is 16");
  static_assert(kTiles.block_n % 16 == 0, "P·V takes keys 16 at a time");
  static_assert(kTiles.warp_rows() == 16 || kTiles.warp_rows() == 32, "a warp owns one or two m16 tiles");
  static_assert(kTiles.block_m % kTiles.warps == 0);
  static_assert(kTiles.stages == 1 || kTiles.stages == 2);
};

}  // namespace flashattn::detail::sm80
