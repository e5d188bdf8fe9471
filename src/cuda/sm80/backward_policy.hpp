// Tile sizes of the sm80 backward kernel, one constexpr policy per head dim instantiation, read by
// the host (dispatch, shared-memory size) and the device code alike. Changes speed only.
//
// One thread block owns Bc keys of one (batch, kv head) and walks the Br-row query tiles of every
// query head of its group. Each warp owns 16 keys: it computes S^T and dP^T for them, so that P^T
// and dS^T are already the A operands of dV += P^T dO and dK += dS^T Q, and keeps their dK and dV
// accumulators in registers. For dQ += dS K the warps split the Br query rows instead (dS^T goes
// through shared memory), in m16 tiles and then in parts of the head dim. Bc = 16 warps.
// Q, dO, lse and D of the next step load (cp.async) while this step computes: two step buffers.
// d = 64 and 128 take Bc = 128 (8 warps): half the Q/dO loads and dQ atomics per key of Bc = 64.
// d = 128 takes Br = 32: with Br = 64, S^T and dP^T (32 registers each) beside the dK and dV
// accumulators (128) spill on sm_90a (12 bytes at 255 registers).
#pragma once

namespace flashattn::detail::sm80 {

struct BackwardTiles {
  int head_dim;  // the instantiation serves every multiple of 8 up to this
  int block_m;   // Br query rows per step
  int block_n;   // Bc keys per thread block
  int warps;
  int min_blocks;

  static constexpr int padded(int dim) { return (dim + 63) / 64 * 64; }
  constexpr int threads() const { return warps * 32; }
  constexpr int tile_bytes(int rows) const { return rows * padded(head_dim) * 2; }
  constexpr int ds_bytes() const { return block_n * padded(block_m) * 2; }
  // One step's operands: Q, dO, then lse·log2(e) and D of its rows.
  constexpr int step_bytes() const { return 2 * tile_bytes(block_m) + 2 * block_m * 4; }
  // K, V (resident), dS^T, then two step buffers (the next step loads while this one computes).
  constexpr int smem_bytes() const { return 2 * tile_bytes(block_n) + ds_bytes() + 2 * step_bytes(); }
};

constexpr BackwardTiles backward_tiles(int head_dim) {
  switch (head_dim) {
    //               d   Br  Bc warps blocks/SM
    case 64: return {64, 64, 128, 8, 1};
    case 96: return {96, 32, 64, 4, 2};
    case 128: return {128, 32, 128, 8, 1};
    default: return {0, 0, 0, 0, 0};
  }
}

template <int kHeadDim>
struct BackwardPolicy {
  static constexpr BackwardTiles kTiles = backward_tiles(kHeadDim);
  static_assert(kTiles.head_dim == kHeadDim, "no backward tile policy for this head dim");
  static_assert(kHeadDim % 16 == 0, "the mma k-step is 16; head-dim tiles come in pairs of n8");
  static_assert(kTiles.block_n == 16 * kTiles.warps, "a warp owns 16 keys");
  static_assert(kTiles.block_m % 16 == 0, "P^T and dS^T feed the mma 16 queries at a time");
  static_assert(kTiles.warps % (kTiles.block_m / 16) == 0 &&
                    (kHeadDim / 8) % (kTiles.warps / (kTiles.block_m / 16)) == 0 &&
                    (kHeadDim / 8 / (kTiles.warps / (kTiles.block_m / 16))) % 2 == 0,
                "for dQ, the warps split the query rows in m16 tiles, then the head dim in pairs of n8 tiles");
};

}  // namespace flashattn::detail::sm80
