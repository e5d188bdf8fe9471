// Tile sizes of the sm80 backward's deterministic dQ kernel (backward_dq_kernel.cuh), one constexpr
// policy per (head dim, V head dim, score-modifier variant), read by the host (shared-memory check
// in supported()) and the device code alike. Changes speed only; the summation order, and so the bits, are fixed by the policy.
//
// One thread block owns Br query rows of one (batch, query head); its warps split the rows, 16
// each, and keep dQ of their rows in registers (head_dim / 2 fp32 per thread) beside S and dP of
// one key tile (Bc / 2 each). Q and dO stay in shared memory for the whole walk and are re-read
// per key tile; K and V tiles are double-buffered. d = 192 and 256 take Bc = 32 so that S and dP
// fit beside their larger dQ.
#pragma once

namespace flashattn::detail::sm80 {

struct BackwardDqTiles {
  int head_dim;    // of q and k: the instantiation serves every multiple of 8 up to this
  int head_dim_v;  // of v and dO: likewise
  int block_m;     // Br query rows per thread block
  int block_n;     // Bc keys per K/V tile
  int warps;
  int min_blocks;

  static constexpr int kStages = 2;  // K and V buffers each
  static constexpr int padded(int dim) { return (dim + 63) / 64 * 64; }
  constexpr int threads() const { return warps * 32; }
  constexpr int warp_rows() const { return block_m / warps; }
  constexpr int tile_bytes(int rows, int dim) const { return rows * padded(dim) * 2; }
  // Q and dO (resident), then kStages K tiles and kStages V tiles.
  constexpr int smem_bytes() const {
    return tile_bytes(block_m, head_dim) + tile_bytes(block_m, head_dim_v) +
           kStages * (tile_bytes(block_n, head_dim) + tile_bytes(block_n, head_dim_v));
  }
};

// Different V head dims take the shape of their Q head dim. The score-modifier variant
// recomputes the logits in registers; every plain shape has room for that.
constexpr BackwardDqTiles backward_dq_tiles_plain(int head_dim, int head_dim_v) {
  if (head_dim == head_dim_v) {
    switch (head_dim) {
      //               d   dv  Br  Bc warps blocks/SM
      case 64: return {64, 64, 64, 64, 4, 2};
      case 96: return {96, 96, 64, 64, 4, 2};
      case 128: return {128, 128, 64, 64, 4, 2};
      case 192: return {192, 192, 64, 32, 4, 1};
      case 256: return {256, 256, 64, 32, 4, 1};
      default: break;
    }
  }
  if (head_dim == 192 && head_dim_v == 128) return {192, 128, 64, 32, 4, 1};
  if (head_dim == 64 && head_dim_v == 128) return {64, 128, 64, 64, 4, 2};
  return {0, 0, 0, 0, 0, 0};
}

constexpr BackwardDqTiles backward_dq_tiles(int head_dim, int head_dim_v, bool score_mods) {
  BackwardDqTiles t = backward_dq_tiles_plain(head_dim, head_dim_v);
  (void)score_mods;
  return t;
}

template <int kHeadDim, int kHeadDimV, bool kScoreMods>
struct BackwardDqPolicy {
  static constexpr BackwardDqTiles kTiles = backward_dq_tiles(kHeadDim, kHeadDimV, kScoreMods);
  static_assert(kTiles.head_dim == kHeadDim && kTiles.head_dim_v == kHeadDimV,
                "no dQ tile policy for this (head dim, V head dim)");
  static_assert(kHeadDim % 16 == 0 && kHeadDimV % 16 == 0, "the mma k-step is 16; head-dim tiles come in pairs of n8");
  static_assert(kTiles.block_m % kTiles.warps == 0 && kTiles.warp_rows() % 16 == 0, "warps own whole m16 tiles");
  static_assert(kTiles.block_n % 16 == 0, "dS K takes keys 16 at a time");
};

}  // namespace flashattn::detail::sm80
