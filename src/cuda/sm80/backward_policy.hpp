// Tile sizes of the sm80 backward's main kernel (backward_kernel.cuh), one constexpr policy per
// (head dim, V head dim, score-modifier variant) instantiation, read by the host (shared-memory
// size, grid) and the device code alike. Changes speed only.
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
  int head_dim;    // of q and k: the instantiation serves every multiple of 8 up to this
  int head_dim_v;  // of v, o and dO: likewise
  int block_m;     // Br query rows per step
  int block_n;     // Bc keys per thread block
  int warps;
  int sdp_key_warps;   // warp grid of S^T and dP^T: warps along the keys
  int dkv_key_warps;   // warp grids of dK and dV: warps along the keys
  int dq_query_warps;  // warp grid of dQ: warps along the queries
  int dq_pass_slabs;   // dQ computed this many 16-column slabs of a warp at a time (registers)
  int min_blocks = 1;  // resident blocks per multiprocessor asked of the compiler (caps registers)
  bool matrix_stores = true;  // P^T and dS^T stored with stmatrix on sm_90 (a quarter of the store
                              // instructions); 32-bit stores where that spills
  bool exp_under_dp = false;  // P^T's exponentials issued inside the dP^T GEMM (plain variant only)
  // The 1-D grid whose last blocks may run split (backward_params.hpp's tail_split); false: a grid
  // of (key blocks, kv heads, batch), never split, where the block's coordinates cost no registers.
  bool tail_split = true;

  static constexpr int kStages = 2;  // Q, dO, lse·log2e and D buffers
  static constexpr int padded(int dim) { return (dim + 63) / 64 * 64; }
  static constexpr bool power_of_two(int x) { return x > 0 && (x & (x - 1)) == 0; }
  constexpr int threads() const { return warps * 32; }
  constexpr int k_bytes() const { return block_n * padded(head_dim) * 2; }     // K; dK in the epilogue
  constexpr int v_bytes() const { return block_n * padded(head_dim_v) * 2; }   // V; dV in the epilogue
  constexpr int q_bytes() const { return block_m * padded(head_dim) * 2; }     // Q, one stage
  constexpr int do_bytes() const { return block_m * padded(head_dim_v) * 2; }  // dO, one stage
  constexpr int p_bytes() const { return block_n * padded(block_m) * 2; }      // P^T or dS^T
  constexpr int rows_bytes() const { return 2 * block_m * 4; }                 // lse·log2e and D, one stage
  constexpr int smem_bytes() const {
    return k_bytes() + v_bytes() + kStages * (q_bytes() + do_bytes() + rows_bytes()) + 2 * p_bytes();
  }
};

// The warp tiles follow from the grids: S^T keys x queries, dK/dV keys x d (dv), dQ queries x d.
// All compile without spills at 245-255 registers (sm_80 and sm_90a); dQ in one pass (all slabs of
// a warp) fits beside dK and dV everywhere today. stmatrix for P^T and dS^T (sm_90) measured
// +3-4% at d = 256, +0-1% at d = 128 and nothing at d = 64, where it spills 8 bytes: d = 64 keeps
// 32-bit stores (docs/perf.md, backward v5). The exponentials under the dP^T GEMM (exp_under_dp,
// backward v6): on at d = 96 and 128, where ptxas interleaves them with its mma; at d = 64 it
// leaves them after the GEMM and spills, at d = 256 (Bc = 64) it measured -1%. The tail split:
// off at d = 256, whose main loop spills with the 1-D grid's block coordinates.
// Different V head dims: (192, 128) takes the d = 192 shape (its dV is smaller); (64, 128) takes
// the d = 128 shape, with dQ's warp grid along the queries (its 64 columns are too few for four
// 16-column slabs).
constexpr BackwardTiles backward_tiles_plain(int head_dim, int head_dim_v) {
  if (head_dim == head_dim_v) {
    switch (head_dim) {
      // d, dv, Br, Bc, warps; grids: S^T, dK/dV, dQ; dQ slabs per pass; blocks/SM, stmatrix, exp under dP
      //                                                                        tiles: S^T  dK,dV  dQ   smem
      case 64: return {64, 64, 128, 128, 8, 4, 4, 4, 2, 1, false};            //       32x64 32x32 32x32  162 KB
      case 96: return {96, 96, 64, 128, 8, 4, 4, 4, 3, 1, true, true};        //       32x32 32x48 16x48  161 KB
      case 128: return {128, 128, 64, 128, 8, 4, 4, 2, 2, 1, true, true};     //       32x32 32x64 32x32  161 KB
      case 192: return {192, 192, 64, 64, 8, 2, 2, 2, 3, 1, true, false, true};  //   32x16 32x48 32x48  161 KB
      case 256: return {256, 256, 64, 64, 8, 2, 2, 2, 4, 1, true, false, false};  //   32x16 32x64 32x64  209 KB
      default: break;
    }
  }
  if (head_dim == 192 && head_dim_v == 128)
    return {192, 128, 64, 64, 8, 2, 2, 2, 3, 1, true, false, true};  // 32x16 32x48/32 32x48 137 KB
  if (head_dim == 64 && head_dim_v == 128) return {64, 128, 64, 128, 8, 4, 4, 4, 2};   // 32x32 32x32/64 16x32 129 KB
  return {0, 0, 0, 0, 0, 0, 0, 0, 0};
}

// The kernel variant with score modifiers (softcap, ALiBi, bias, mask) recomputes the logits in
// registers beside S^T and dP^T. Where the plain shape's accumulators (dK, dV, S^T, dP^T: 192 fp32
// per thread at d = 128, 160 at d = 96 and (64, 128)) leave no room for that, ptxas spills; those
// take Bc = 64, and d = 64 takes Br = 64 (its 128 x 128 S^T is 64 fp32 per thread); d = 256
// stores dS^T with 32-bit stores (stmatrix spills 12 bytes there). The others compile as they are
// without spills.
constexpr BackwardTiles backward_tiles(int head_dim, int head_dim_v, bool score_mods) {
  if (score_mods) {
    //                                         d   dv   Br  Bc warps S^T dK,dV dQ  slabs/pass
    if (head_dim == 64 && head_dim_v == 64) return {64, 64, 64, 128, 8, 4, 4, 4, 2};
    if (head_dim == 96 && head_dim_v == 96) return {96, 96, 64, 64, 8, 4, 4, 4, 3};
    if (head_dim == 128 && head_dim_v == 128) return {128, 128, 64, 64, 8, 4, 4, 2, 2};
    if (head_dim == 64 && head_dim_v == 128) return {64, 128, 64, 64, 8, 4, 4, 4, 2};
    if (head_dim == 256 && head_dim_v == 256) return {256, 256, 64, 64, 8, 2, 2, 2, 4, 1, false, false, false};
  }
  return backward_tiles_plain(head_dim, head_dim_v);
}

// Dynamic shared memory of the main kernel's instantiation for (head_dim, head_dim_v); 0 for pairs
// without one.
constexpr int backward_smem_bytes(int head_dim, int head_dim_v, bool score_mods) {
  return backward_tiles(head_dim, head_dim_v, score_mods).smem_bytes();
}

template <int kHeadDim, int kHeadDimV, bool kScoreMods>
struct BackwardPolicy {
  static constexpr BackwardTiles kTiles = backward_tiles(kHeadDim, kHeadDimV, kScoreMods);
  static_assert(kTiles.head_dim == kHeadDim && kTiles.head_dim_v == kHeadDimV,
                "no backward policy for this (head dim, V head dim)");
  static_assert(kHeadDim % 16 == 0 && kHeadDimV % 16 == 0, "the mma k-step is 16; head-dim slabs are 16 wide");
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
                kHeadDim % (16 * (kTiles.warps / kTiles.dkv_key_warps)) == 0 &&
                kHeadDimV % (16 * (kTiles.warps / kTiles.dkv_key_warps)) == 0);
  static_assert(kTiles.block_m % (16 * kTiles.dq_query_warps) == 0 &&
                kHeadDim % (16 * (kTiles.warps / kTiles.dq_query_warps)) == 0);
};

}  // namespace flashattn::detail::sm80
