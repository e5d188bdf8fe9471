// Tile sizes of the sm80 backward's main kernel (backward_kernel.cuh), one constexpr
// policy per head dim instantiation, read by the host (shared-memory size, grid) and the device
// code alike. Changes speed only.
//
// One thread block owns Bc keys of one (batch, kv head) and walks the Br-row query tiles of every
// query head of its group. Every GEMM of a step is split over all warps as a 2-D warp grid:
//   S^T, dP^T  [Bc x Br]  sdp_key_warps along the keys, the rest along the queries
//   dK, dV     [Bc x d]   dkv_key_warps along the keys, the rest along the head dim
//   dQ         [Br x d]   dq_query_warps along the queries, the rest along the head dim
// so the dK and dV accumulators cost Bc·d·2 / (32 warps) registers per thread, and the warp tiles
// are at least 32 x 32 where the registers allow (S^T of d = 192 and 256 is 32 x 16).
//
// Shared memory: K and V resident; Q, dO and the rows' lse·log2e and D double-buffered (the next
// step's loads fly during this step's math); P^T and dS^T. Every policy but d = 256 fits the
// 163 KB opt-in of sm_80 (A100); d = 256 takes 209 KB and fits sm_90 (227 KB) only: the host
// refuses it where the device's opt-in is smaller.
#pragma once

namespace flashattn::detail::sm80 {

struct BackwardTiles {
  int head_dim;  // the instantiation serves every multiple of 8 up to this
  int block_m;   // Br query rows per step
  int block_n;   // Bc keys per thread block
  int warps;
  int sdp_key_warps;   // warp grid of S^T and dP^T: warps along the keys
  int dkv_key_warps;   // warp grid of dK and dV: warps along the keys
  int dq_query_warps;  // warp grid of dQ: warps along the queries
  int dq_pass_slabs;   // dQ computed this many 16-column slabs of a warp at a time (registers)
  int min_blocks = 1;  // resident blocks per multiprocessor asked of the compiler (caps registers)

  static constexpr int kStages = 2;  // Q, dO, lse·log2e and D buffers
  static constexpr int padded(int dim) { return (dim + 63) / 64 * 64; }
  static constexpr bool power_of_two(int x) { return x > 0 && (x & (x - 1)) == 0; }
  constexpr int threads() const { return warps * 32; }
  constexpr int kv_bytes() const { return block_n * padded(head_dim) * 2; }        // K or V
  constexpr int q_bytes() const { return block_m * padded(head_dim) * 2; }         // Q or dO, one stage
  constexpr int p_bytes() const { return block_n * padded(block_m) * 2; }          // P^T or dS^T
  constexpr int rows_bytes() const { return 2 * block_m * 4; }                     // lse·log2e and D, one stage
  constexpr int smem_bytes() const {
    return 2 * kv_bytes() + kStages * (2 * q_bytes() + rows_bytes()) + 2 * p_bytes();
  }
};

// The warp tiles follow from the grids: S^T keys x queries, dK/dV keys x d, dQ queries x d. All
// compile without spills at 245-255 registers (sm_80 and sm_90a); dQ in one pass (all slabs of a
// warp) fits beside dK and dV everywhere today.
constexpr BackwardTiles backward_tiles(int head_dim) {
  switch (head_dim) {
    //                 d   Br   Bc warps  grids: S^T dK,dV dQ  dQ slabs/pass   tiles: S^T  dK,dV  dQ   smem
    case 64: return {64, 128, 128, 8, 4, 4, 4, 2};    //                          32x64 32x32 32x32  162 KB
    case 96: return {96, 64, 128, 8, 4, 4, 4, 3};     //                          32x32 32x48 16x48  161 KB
    case 128: return {128, 64, 128, 8, 4, 4, 2, 2};   //                          32x32 32x64 32x32  161 KB
    case 192: return {192, 64, 64, 8, 2, 2, 2, 3};    //                          32x16 32x48 32x48  161 KB
    case 256: return {256, 64, 64, 8, 2, 2, 2, 4};    //                          32x16 32x64 32x64  209 KB
    default: return {0, 0, 0, 0, 0, 0, 0, 0};
  }
}

// Dynamic shared memory of the instantiation for head dim `head_dim` (64, 96, 128, 192 or 256);
// 0 for others.
constexpr int backward_smem_bytes(int head_dim) { return backward_tiles(head_dim).smem_bytes(); }

template <int kHeadDim>
struct BackwardPolicy {
  static constexpr BackwardTiles kTiles = backward_tiles(kHeadDim);
  static_assert(kTiles.head_dim == kHeadDim, "no backward policy for this head dim");
  static_assert(kHeadDim % 16 == 0, "the mma k-step is 16; head-dim slabs are 16 wide");
  static_assert(kTiles.block_m % 16 == 0 && kTiles.block_n % 16 == 0);
  static_assert(2 * kTiles.block_m <= kTiles.threads(), "one thread per row loads lse·log2e, one D");
  // Warp grids: power-of-two warp counts along each side (the interleaved slabs of WarpGrid keep
  // SwizzledTile::advance exact), every warp with the same number of m16 tiles and 16-wide slabs.
  static_assert(BackwardTiles::power_of_two(kTiles.warps) &&
                BackwardTiles::power_of_two(kTiles.sdp_key_warps) &&
                BackwardTiles::power_of_two(kTiles.dkv_key_warps) &&
                BackwardTiles::power_of_two(kTiles.dq_query_warps));
  static_assert((kHeadDim / 16 / (kTiles.warps / kTiles.dq_query_warps)) % kTiles.dq_pass_slabs == 0,
                "dQ passes cover a warp's slabs evenly");
  static_assert(kTiles.block_n % (16 * kTiles.sdp_key_warps) == 0 &&
                kTiles.block_m % (16 * (kTiles.warps / kTiles.sdp_key_warps)) == 0);
  static_assert(kTiles.block_n % (16 * kTiles.dkv_key_warps) == 0 &&
                kHeadDim % (16 * (kTiles.warps / kTiles.dkv_key_warps)) == 0);
  static_assert(kTiles.block_m % (16 * kTiles.dq_query_warps) == 0 &&
                kHeadDim % (16 * (kTiles.warps / kTiles.dq_query_warps)) == 0);
};

}  // namespace flashattn::detail::sm80
