// Tile sizes of the sm80 forward kernel, one constexpr policy per (head dim, V head dim)
// instantiation, read by the host (dispatch, shared-memory size) and the device code alike.
// Changes speed only.
//
// Br query rows per thread block, split across the warps; Bc keys per K/V tile. A warp owns 16 or
// 32 query rows (one or two m16 mma tiles). Two m16 tiles per warp halve the shared-memory traffic
// per tensor-core operation (each K and V fragment feeds two mma). Above a V head dim of 128 the
// output accumulators of 32 rows no longer fit in 255 registers beside the rest; there either a
// warp owns 16 rows (no warp needs another's softmax statistics), or a pair of warps shares 32
// rows (column_warps = 2): each warp computes S for half of the tile's keys and o for half of the
// V columns, the pair exchanging its row maxima and its halves of P through shared memory.
#pragma once

namespace flashattn::detail::sm80 {

struct ForwardTiles {
  int head_dim;    // of q and k: the instantiation serves every multiple of 8 up to this
  int head_dim_v;  // of v and o: likewise
  int block_m;     // Br
  int block_n;     // Bc
  int warps;
  int min_blocks;  // resident blocks per multiprocessor asked of the compiler (caps registers)
  int stages;      // K/V buffers: 1 (V loads during QK^T, K during PV) or 2 (each a whole tile ahead)
  bool q_in_registers;  // Q fragments loaded once into registers instead of re-read from smem per tile
  int column_warps = 1;  // warps sharing a row group (1 or 2): they split S's keys and o's columns

  static constexpr int padded(int dim) { return (dim + 63) / 64 * 64; }
  constexpr int threads() const { return warps * 32; }
  constexpr int row_groups() const { return warps / column_warps; }
  constexpr int warp_rows() const { return block_m / row_groups(); }
  // With warp pairs: the P tile [Br x Bc] that the pair's halves meet in, and each warp's row
  // maxima (then row sums) of its half, [column_warps][Br] floats.
  constexpr int exchange_bytes() const {
    return column_warps == 1 ? 0 : block_m * block_n * 2 + column_warps * block_m * 4;
  }
  // The Q tile (which the epilogue reuses for O, so it is sized for the wider of the two), then
  // `stages` K tiles and `stages` V tiles.
  constexpr int q_region_bytes() const {
    return block_m * (padded(head_dim) > padded(head_dim_v) ? padded(head_dim) : padded(head_dim_v)) * 2;
  }
  constexpr int smem_bytes() const {
    return q_region_bytes() + stages * block_n * (padded(head_dim) + padded(head_dim_v)) * 2 + exchange_bytes();
  }
};

// Chosen on an H200 (bf16, docs/perf.md), among the shapes that ptxas compiles without spills:
// d = 64: Bc = 128 with two stages beat Bc = 96 (two stages) by 4-7%, which had beaten Bc = 64
// (with one stage Bc = 128 spills on sm_90a); d = 96 and 128: one stage beat two; d = 192 and 256:
// 64x64 blocks of four warps, two per multiprocessor, beat 128x64 blocks of eight warps. 16-row
// warps re-read Q from shared memory for every K tile; keeping Q in registers won 7-9% at d = 192,
// while at d = 256 it only fits with Bc = 32, which loses. At d = 256 warp pairs (32 rows, each
// warp half of the keys and of o) beat 16-row warps by 8-14%: they read K and V half as often per
// mma, the limit of the 16-row warps there.
// Different V head dims: (192, 128) takes the d = 192 shape (its o is smaller); (64, 128) spills
// with the d = 128 shape and takes 16-row warps.
//
// The kernel variant with score modifiers (softcap, ALiBi, bias, mask) needs registers for them:
// where the plain shape is at the 255-register limit, it takes 16-row warps (V head dims above
// 64) or Bc = 64 (d = 64), and d = 192 re-reads Q from shared memory.
constexpr ForwardTiles forward_tiles_plain(int head_dim, int head_dim_v) {
  if (head_dim == head_dim_v) {
    switch (head_dim) {
      //               d   dv   Br   Bc warps blocks/SM stages Q in registers, warps per row group
      case 64: return {64, 64, 128, 128, 4, 2, 2, false};
      case 96: return {96, 96, 128, 64, 4, 2, 1, false};
      case 128: return {128, 128, 128, 64, 4, 2, 1, false};
      case 192: return {192, 192, 64, 64, 4, 2, 1, true};
      case 256: return {256, 256, 64, 64, 4, 2, 1, false, 2};
      default: break;
    }
  }
  if (head_dim == 192 && head_dim_v == 128) return {192, 128, 64, 64, 4, 2, 1, true};
  if (head_dim == 64 && head_dim_v == 128) return {64, 128, 64, 64, 4, 2, 1, false};
  return {0, 0, 0, 0, 0, 0, 0, false};
}

constexpr ForwardTiles forward_tiles(int head_dim, int head_dim_v, bool score_mods) {
  ForwardTiles t = forward_tiles_plain(head_dim, head_dim_v);
  if (score_mods) t.column_warps = 1;  // the modifiers index rows and keys of whole-row warps
  if (score_mods && t.warp_rows() == 32) {
    if (head_dim_v > 64) t.block_m /= 2;
    else if (t.block_n > 64) t.block_n = 64;
  }
  if (score_mods && t.q_in_registers && head_dim_v > 128) t.q_in_registers = false;  // (192, 192) spills on sm_80
  return t;
}

template <int kHeadDim, int kHeadDimV, bool kScoreMods>
struct ForwardPolicy {
  static constexpr ForwardTiles kTiles = forward_tiles(kHeadDim, kHeadDimV, kScoreMods);
  static_assert(kTiles.head_dim == kHeadDim && kTiles.head_dim_v == kHeadDimV,
                "no tile policy for this (head dim, V head dim)");
  static_assert(kHeadDim % 16 == 0 && kHeadDimV % 16 == 0, "the mma k-step is 16; V tiles come in pairs of n8");
  static_assert(kTiles.block_n % 16 == 0, "P·V takes keys 16 at a time");
  static_assert(kTiles.warp_rows() == 16 || kTiles.warp_rows() == 32, "a warp owns one or two m16 tiles");
  static_assert(kTiles.block_m % kTiles.row_groups() == 0);
  // A pair's halves: whole k16 steps of P (and 8-row swizzle groups of K), whole 16-column V slabs.
  static_assert(kTiles.column_warps == 1 ||
                (kTiles.column_warps == 2 && !kTiles.q_in_registers && !kScoreMods && kTiles.block_n % 32 == 0 &&
                 kHeadDimV % 32 == 0 && kTiles.row_groups() <= 15));
  static_assert(kTiles.stages == 1 || kTiles.stages == 2);
};

}  // namespace flashattn::detail::sm80
