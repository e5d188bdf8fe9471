// Tile sizes of the sm80 backward's deterministic dQ kernel (backward_dq_kernel.cuh), one constexpr
// policy per head dim, read by the host (shared-memory check in supported()) and the device code
// alike. Changes speed only; the summation order, and so the bits, are fixed by the policy.
//
// One thread block owns Br query rows of one (batch, query head); its warps split the rows, 16
// each, and keep dQ of their rows in registers (head_dim / 2 fp32 per thread) beside S and dP of
// one key tile (Bc / 2 each). Q and dO stay in shared memory for the whole walk and are re-read
// per key tile; K and V tiles are double-buffered. d = 192 and 256 take Bc = 32 so that S and dP
// fit beside their larger dQ.
#pragma once

namespace flashattn::detail::sm80 {

struct BackwardDqTiles {
  int head_dim;  // the instantiation serves every multiple of 8 up to this
  int block_m;   // Br query rows per thread block
  int block_n;   // Bc keys per K/V tile
  int warps;
  int min_blocks;

  static constexpr int kStages = 2;  // K and V buffers each
  static constexpr int padded(int dim) { return (dim + 63) / 64 * 64; }
  constexpr int threads() const { return warps * 32; }
  constexpr int warp_rows() const { return block_m / warps; }
  constexpr int tile_bytes(int rows) const { return rows * padded(head_dim) * 2; }
  // Q and dO (resident), then kStages K tiles and kStages V tiles.
  constexpr int smem_bytes() const { return 2 * tile_bytes(block_m) + 2 * kStages * tile_bytes(block_n); }
};

constexpr BackwardDqTiles backward_dq_tiles(int head_dim) {
  switch (head_dim) {
    //               d   Br  Bc warps blocks/SM
    case 64: return {64, 64, 64, 4, 2};
    case 96: return {96, 64, 64, 4, 2};
    case 128: return {128, 64, 64, 4, 2};
    case 192: return {192, 64, 32, 4, 1};
    case 256: return {256, 64, 32, 4, 1};
    default: return {0, 0, 0, 0, 0};
  }
}

template <int kHeadDim>
struct BackwardDqPolicy {
  static constexpr BackwardDqTiles kTiles = backward_dq_tiles(kHeadDim);
  static_assert(kTiles.head_dim == kHeadDim, "no dQ tile policy for this head dim");
  static_assert(kHeadDim % 16 == 0, "the mma k-step is 16; head-dim tiles come in pairs of n8");
  static_assert(kTiles.block_m % kTiles.warps == 0 && kTiles.warp_rows() % 16 == 0, "warps own whole m16 tiles");
  static_assert(kTiles.block_n % 16 == 0, "dS K takes keys 16 at a time");
};

}  // namespace flashattn::detail::sm80
