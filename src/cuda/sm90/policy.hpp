// Block shapes and consumer schedule of the Hopper forward, one constexpr policy per head dim, read
// by the host (dispatch, shared memory, grid) and the kernel alike. Changes speed only.
//
// One block = 1 producer warpgroup (TMA) + `consumers` consumer warpgroups of 64 query rows each
// (the M of one wgmma), so Br = 64 consumers; Bc keys per K/V tile, `stages` K and V tiles each in
// flight. Register budgets (setmaxnreg) move registers from the producer to the consumers; their
// sum must fit the block's allocation at launch (65536 / threads per thread, one block per SM).
//
// The consumers' schedule (docs/hopper_forward.md), two switches:
//   pingpong  step 2: the consumers take turns issuing their GEMMs, in a ring of named barriers,
//             so that the tensor cores run the others' GEMMs while one computes its softmax;
//   overlap   step 3: S(j) = Q K(j)ᵀ and O += P(j-1) V(j-1) are issued together and the softmax of
//             S(j) runs while P(j-1) V(j-1) is in flight (one more S tile of registers); the
//             producer then issues K(j+1) before V(j).
// Both off: step 1's schedule (S, softmax, P V, one GEMM at a time).
#pragma once

namespace flashattn::detail::sm90 {

// When the grid is persistent (step 4: one block per multiprocessor looping over work items,
// tile_scheduler.cuh) rather than one block per item; host side only, the kernel is the same.
enum class Persistence {
  kNever,
  kUniformItems,  // when every item costs the same: no causal/window band, no varlen
  kAlways,
};

struct ForwardTiles {
  int head_dim;    // of q, k, v, o: the instantiation serves every multiple of 8 up to this
  int consumers;   // consumer warpgroups
  int block_n;     // Bc
  int stages;      // K tiles and V tiles in flight
  int producer_registers, consumer_registers;
  bool pingpong, overlap;  // the consumers' schedule (above)
  bool exp_under_pv;       // with overlap: the wait for P(j-1) V(j-1) held after the softmax of S(j)
                           // (forward_kernel.cuh, end_basic_block), and the producer's K(j+1)
                           // issued before V(j); false: ptxas places that wait before the
                           // exponentials, and V(j-1) frees earlier
  bool k_ahead;            // the producer issues K(j+1) before V(j) (exp_under_pv implies it), so that
                           // K(j+1), whose slot frees when S(j-1) is done, does not queue behind V(j),
                           // whose slot frees when P(j-2) V(j-2) is
  int narrow_keys;         // a consumer whose 64 rows see only the first w keys of its first tile, w
  int narrow_widths;       // narrow_keys times 1 .. narrow_widths (a causal diagonal or the sequence's
                           // end inside the tile), computes it as a narrow 64 x w S and P V over
                           // those key steps (forward_kernel.cuh); narrow_widths = 0: whole tiles
  bool tree_reductions;    // the softmax's row max as a tree, its row sum in four partials
                           // (softmax.cuh); false: one chain each
  bool lazy_rescale;       // m moves (and o is rescaled) only when a row's maximum exceeds it by
                           // more than 2^8 in exponent terms (softmax.cuh); false: every tile
  bool q_in_registers;     // S = Q Kᵀ takes Q from registers (wgmma RS; d / 4 registers per thread,
                           // loaded once per item with ldmatrix, the Q tile freed at once);
                           // false: from shared memory (wgmma SS)
  bool row_sums_by_pv;     // the tensor cores sum P's rows: P V runs over V's d columns and 8 more
                           // of ones (a constant block after each V slot), so l accumulates in o's
                           // last 4 registers and the softmax adds nothing (forward_kernel.cuh)
  int exp2_poly_share;     // > 0: in the tiles every row sees whole, one in this many 8-column blocks
                           // takes its exponentials on the FMA pipe (softmax.cuh); 0: all on the SFU
  Persistence persistent;
  bool share_tails;        // three consumers in three stages, no band: the last query tile whose rows
                           // fill one consumer's slice (rows % Br in 1 .. 64) runs with its key tiles
                           // shared by the consumers, each over every third, their states merged
                           // (tile_scheduler.cuh: shared tails); false: one consumer computes it
  int q_stages;            // Q tiles: 1, or 2 so that the next item's Q loads under the current
                           // item's phases (rounds alternate between them, forward_kernel.cuh)
  bool ones_atom;          // with row_sums_by_pv: the row sums as an m64n8k16 of their own per key
                           // step, on one 1 KB block of ones for all V slots (rather than P V's N
                           // of d + 8 over a ones block after each V slot)

  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kRowsPerConsumer = 64;
  static constexpr int kMaxConsumers = 3;  // named barrier ids: 1 + 2 kMaxConsumers <= 16
  static constexpr int kAlignment = 1024;  // of every swizzled tile (sw128_tile.cuh)
  static constexpr int padded(int dim) { return (dim + 63) / 64 * 64; }

  constexpr int block_m() const { return kRowsPerConsumer * consumers; }  // Br
  constexpr int threads() const { return (1 + consumers) * kWarpgroupThreads; }
  // Registers per thread at launch: what the register file gives each of `threads` threads,
  // rounded down to the allocation granule of 8.
  constexpr int launch_registers() const { return 65536 / threads() / 8 * 8; }
  constexpr int q_bytes() const { return block_m() * padded(head_dim) * 2; }
  constexpr int kv_tile_bytes() const { return block_n * padded(head_dim) * 2; }
  // A V slot: the tile, then (row_sums_by_pv) one 64-column block of ones, the columns d .. d + 7
  // that P V reads past the tile (d % 64 == 0: the next column block).
  constexpr int ones_block_bytes() const { return row_sums_by_pv && !ones_atom ? block_n * 128 : 0; }
  constexpr int ones_atom_bytes() const { return ones_atom ? 1024 : 0; }  // 8 rows of 128 bytes
  constexpr int v_slot_bytes() const { return kv_tile_bytes() + ones_block_bytes(); }
  // `q_stages` Q tiles, then `stages` K tiles, then `stages` V slots, then the ones atom, plus the
  // slack to align the base to 1024.
  constexpr int smem_bytes() const {
    return q_stages * q_bytes() + stages * (kv_tile_bytes() + v_slot_bytes()) + ones_atom_bytes() + kAlignment;
  }
  // Every field: whether two policies compile to the same kernel.
  constexpr bool operator==(const ForwardTiles& o) const {
    return head_dim == o.head_dim && consumers == o.consumers && block_n == o.block_n && stages == o.stages &&
           producer_registers == o.producer_registers && consumer_registers == o.consumer_registers &&
           pingpong == o.pingpong && overlap == o.overlap && exp_under_pv == o.exp_under_pv &&
           k_ahead == o.k_ahead && narrow_keys == o.narrow_keys && narrow_widths == o.narrow_widths &&
           tree_reductions == o.tree_reductions &&
           lazy_rescale == o.lazy_rescale && q_in_registers == o.q_in_registers &&
           row_sums_by_pv == o.row_sums_by_pv && exp2_poly_share == o.exp2_poly_share && persistent == o.persistent &&
           share_tails == o.share_tails && q_stages == o.q_stages && ones_atom == o.ones_atom;
  }
};

// A band: causal or a sliding window (window sides as in ForwardKernelParams, < 0 unbounded), where
// query tiles cost unequal work and the persistent grid pairs them.
constexpr bool banded(int window_left, int window_right) { return window_left >= 0 || window_right >= 0; }

// From the design note (docs/hopper_forward.md): d = 64 takes three consumers (the softmax is a
// larger share of the work); above d = 128 the O accumulators (d / 2 registers per thread) leave
// room only for narrower S tiles, and Bc shrinks to keep shared memory within 227 KB.
// Schedule: the exponentials of a 64 x Bc tile cost about as much as its two GEMMs at d = 64, half
// at d = 128 and a quarter at d = 256, so the turns pay where the softmax is a large share (d <= 128;
// at d = 64 a ring of three: each consumer's softmax runs under the other two's GEMMs) and at
// d = 256 the overlap within a warpgroup hides it alone. Measured with the tree reductions
// (docs/perf.md, 2026-12-02): turns off at d = 128 -8 to -12%; on at d = 192 +0.1 to +2.5% (on), at
// d = 256 -1.7 to +2.3% (left off). Setting both to false gives step 1 back.
// Registers: at d = 256 the consumers need 240 (O alone is 128) once the persistent loop's state
// is live across the main loop; the producer (TMA issue and the item walk) fits in 24.
// Persistent: measured against one block per item in one run (docs/perf.md, step 4): +3-8% at
// d = 256 and on short or causal d = 128 shapes, -2 to -7% at d = 64 (three consumers at 157 of
// 160 registers; its causal pairs balance worse). Measured again on 2026-12-02 (docs/perf.md): at
// d = 64 persistent non-causal gains 4% at n = 2k and is even at 8k-16k, causal loses 6% at n = 2k,
// so d = 64 was persistent only where its items all cost the same (kUniformItems). Since the Q tile
// is released after an item's last S (the next item's Q loads under its tail) and the pairs' walk
// rotates (tile_scheduler.cuh), persistent causal d = 64 gains 7% at n = 2k and 6% at 4k, is even
// at 8k-16k (docs/perf.md, 2026-12-02): persistent always.
// Narrow first tile: at d = 64 (three consumers, turns without overlap) +2-4% causal at n = 2k-4k
// over the consumers' own tile ranges alone; at d = 128 (overlap) -2 to -5% on every row measured,
// causal or not, both as a runtime choice of the P V's key steps and as a phase of its own
// (docs/perf.md, 2026-12-02): d = 64 only.
// Tree reductions (n = 2k-16k, causal and not, two runs): +1 to +5% at d = 128, +0 to +7% at d = 96,
// +15 to +22% non-causal and +1 to +6% causal at d = 192 (overlap without turns: the softmax's
// latency is the critical path), -1 to +2% at d = 256; -1 to -3% at d = 64, where identical code
// reads -2 to +0.5% and the partial sums alone -1.5 to -3.8% (docs/perf.md, 2026-12-02): off at d = 64.
// Lazy rescaling (against the policy before it, two runs, n = 2k-16k): +0.4 to +3% at d = 64, +0 to
// +4% at d = 256, -1 to +2% at d = 128 (docs/perf.md, 2026-12-03): on at every head dim.
// Q in registers (one process, against Q from shared memory): d = 128 +1.4 to +2.9% at n = 4k-16k
// non-causal, +0.6 to +3% causal, -1% at 2k non-causal; d = 96 -0.5 to +2.8%. A from registers
// draws less power than from shared memory (tools/gpu/wgmma_rate.cu: m64n128k16 RS holds 1615 MHz,
// SS 1575), docs/perf.md, 2026-12-03. d = 64 (three consumers, 160 registers) spills 96 bytes with
// it, d = 192 144 bytes, and d = 256 has no 64 registers to spare: off there.
// Row sums by P V (one process, against the policy without it, n = 2k-16k, docs/perf.md, 2026-12-04):
// d = 128 +0.9 to +2.2% non-causal, +0.8 to +1.1% causal; d = 64 -0.3 to +2.2%; d = 192 -0.1 to
// -1.3%: on at d = 64 and 128. Not possible at d = 96 (the ones would fall inside the padded second
// column block, which TMA fills with zeros) or d = 256 (N = 264 > 256).
// k_ahead alone, at d = 128 (one process beside main, n = 2k-16k): -2.4 to +1.2%, identical code -0.3
// to +1.3%. exp2_poly_share = 4 at d = 128: -5 to -7% on every row, though MUFU.EX2 fell from 66 to
// 50 a phase. exp_under_pv with 3 stages and row sums off (225 KB) at d = 128: -0.1 to -4.4%
// (docs/perf.md, 2026-12-04, session 27): off everywhere.
// The exponentials' packs (or row sums) moved past a basic-block boundary, apart from the MUFUs:
// -2.5 to -6% at d = 128, flat within noise at d = 256 (H100, docs/perf.md, 2026-12-05): not kept.
// Tail groups (three heads' one-slice last tiles in one item, consumer c on head c; sessions 36-38)
// ran exact but lost: -6% at n = 4k, -11% at 16k (H100), each head's pipeline one K and one V tile
// deep from DRAM. They gave way to shared tails (share_tails, tile_scheduler.cuh): one head's
// one-slice last tile, its key tiles shared by the three consumers. Measured beside the same build
// with them off at run time, one process: H100 (session 40) +2.3 and +2.4% at n = 4k and 16k in one
// run, -0.1 and +0.3% in the next; H200 (session 41, each column twice, 30 rounds) +1.7% at 4k and
// +1.2% against main, 8k and 16k within 1%; exact in every sm90 test at every head dim
// (docs/perf.md, "Shared tails"). On (FLASHATTN_SM90_SHARE_TAILS 1; CMake can override it).
// Problems without a band take their own tiles where they differ (banded = false below):
// d = 128 three consumers of 64 x 80 tiles, Br = 192, three stages, turns in a ring of three without
// the overlap (there are no registers for a second S tile at 160 a thread), Q from shared memory.
// With two consumers each softmax (about 1.5 K cycles beside a wgmma warpgroup, tools/gpu/mufu_rate.cu)
// outlasts the other's two GEMMs (about 1 K), and the tensor cores wait; with three, one softmax
// runs under the two others' GEMMs. One process beside the two-consumer policy (docs/perf.md,
// 2026-12-06, n = 2k-16k): non-causal +0.6 to +3.5% (H200), +0.9 to +6% (H100); causal -6 to -5% at
// n = 4k-16k (H200): the band keeps two consumers. 64 x 64 tiles in four stages: -0.5 to -2.5%
// non-causal (H200); with k_ahead -1.4 to -3.6%, without tree reductions -0.2 to -3.2% (H100).
// Narrow first tile (narrow_keys 16, narrow_widths 2; docs/perf.md, session 45): with Bc = 80 the
// walk's first tile holds 16, 32, 64 and 48 keys at n = 4k, 8k, 16k and 2k, and costs a whole phase;
// computed as a 64 x 16 or 64 x 32 S with 1 or 2 P V key steps it would save 1.5% of an item's GEMM
// work at 4k and 0.6% at 8k. Widths of 48 and 64 keys too serialized the wgmmas (ptxas C7511), one
// softmax per width spilled. Built and compiled (no spill, no C7511, 7048 SASS instructions against
// 6464), not yet run on a GPU: off (FLASHATTN_SM90_NARROW_TAIL 0, and the kernel is main's, SASS
// byte-identical) until measured.
// Second Q tile (q_stages 2; docs/perf.md, session 45): at n = 4k an item's boundary exceeds two
// phases by 4.4 K cycles (2.5% of the item), of which the next S(0) waits about 1 K for its Q, which
// can load only once the last consumer released the one Q tile. With two, the next item's Q loads
// under the current item's phases. 48 KB more: the row sums go back to the softmax (the ones blocks
// take 30 KB; 2 x 48 + 3 x 40 KB + the slack is 217 KB), which cost -0.9 to -2.2% alone. Built and
// compiled, not yet run on a GPU: off (FLASHATTN_SM90_SECOND_Q 0: main's SASS) until measured.
// Ones atom (ones_atom; with the second Q tile it keeps the row sums by P V in 218 KB): the row sums as
// an m64n8k16 of their own per key step, on one 1 KB block of ones that every V slot shares, instead
// of P V's N = 136 over a 10 KB ones block after each V slot. Compiled clean alone and with the second
// Q tile (all three switches together serialize the wgmmas); not yet run: off until measured.
#ifndef FLASHATTN_SM90_SHARE_TAILS
#define FLASHATTN_SM90_SHARE_TAILS 1  // the d = 128 policy's shared tails (above); CMake can override
#endif
#ifndef FLASHATTN_SM90_NARROW_TAIL
#define FLASHATTN_SM90_NARROW_TAIL 0  // its narrow first tile (above): off until measured; CMake can override
#endif
#ifndef FLASHATTN_SM90_SECOND_Q
#define FLASHATTN_SM90_SECOND_Q 0  // its second Q tile (above): off until measured; CMake can override
#endif
#ifndef FLASHATTN_SM90_ONES_ATOM
#define FLASHATTN_SM90_ONES_ATOM 0  // its row sums on one ones atom (above): off until measured; CMake too
#endif
constexpr ForwardTiles forward_tiles(int head_dim, bool banded) {
  if (head_dim == 128 && !banded)
    return {128, 3, 80, 3, 32, 160, true, false, false, false, 16, /*narrow_widths=*/FLASHATTN_SM90_NARROW_TAIL ? 2 : 0,
            true, true, false, /*row_sums_by_pv=*/FLASHATTN_SM90_SECOND_Q == 0 || FLASHATTN_SM90_ONES_ATOM != 0, 0,
            Persistence::kAlways, /*share_tails=*/FLASHATTN_SM90_SHARE_TAILS != 0,
            /*q_stages=*/FLASHATTN_SM90_SECOND_Q ? 2 : 1, /*ones_atom=*/FLASHATTN_SM90_ONES_ATOM != 0};
  switch (head_dim) {
    //               d  consumers  Bc stages registers  pingpong overlap exp_under_pv k_ahead narrow_keys narrow_widths
    //               tree lazy q_regs row_sums_by_pv exp2_poly_share persistent share_tails q_stages ones_atom
    case 64:
      return {64, 3, 128, 2, 32, 160, true, false, false, false, 64, 1, false, true, false, true, 0,
              Persistence::kAlways, false, 1, false};
    case 96:
      return {96, 2, 128, 2, 40, 232, true, true, false, false, 0, 0, true, true, true, false, 0,
              Persistence::kAlways, false, 1, false};
    case 128:
      return {128, 2, 128, 2, 40, 232, true, true, false, false, 0, 0, true, true, true, true, 0,
              Persistence::kAlways, false, 1, false};
    case 192:
      return {192, 2, 96, 2, 40, 232, true, true, false, false, 0, 0, true, true, false, false, 0,
              Persistence::kAlways, false, 1, false};
    case 256:
      return {256, 2, 80, 2, 24, 240, false, true, false, false, 0, 0, true, true, false, false, 0,
              Persistence::kAlways, false, 1, false};
    default:
      return {0,     0,     0,     0, 0, 0, false, false, false, false, 0, 0, false, false, false, false, 0,
              Persistence::kNever, false, 0, false};
  }
}

// Pack-GQA (docs/hopper_forward.md): with grouped-query attention (group = heads_q / heads_kv > 1)
// a tile of Br rows may hold the rows of all `group` query heads of one kv head (row r = i group + g:
// query i, head h_kv group + g), so that one block reads that kv head's K and V once for the whole
// group. The rule: pack when it makes fewer query tiles, ceil(sq group / Br) < group ceil(sq / Br):
// always for sq <= Br / 2 (decode: a few query rows against a long K/V), never for sq a multiple of
// Br (the tiles are full either way). Variable-length batches apply it to the longest sequence.
// Also bounded so that packed row indices (sq group + Br) stay within 32 bits.
constexpr bool pack_gqa(long long seqlen_q, long long group, int block_m) {
  if (group <= 1 || seqlen_q <= 0 || seqlen_q * group + block_m > 2147483647LL) return false;
  return (seqlen_q * group + block_m - 1) / block_m < group * ((seqlen_q + block_m - 1) / block_m);
}
static_assert(pack_gqa(1, 8, 128) && pack_gqa(63, 2, 128) && !pack_gqa(100, 2, 128) && !pack_gqa(128, 8, 128) &&
              !pack_gqa(1000, 1, 128));

inline constexpr int kMaxSmemBytes = 227 * 1024;  // opt-in shared memory per block on sm_90

// The policies that one head dim compiles: its banded one, and its unbanded one where that differs.
constexpr bool own_unbanded_tiles(int head_dim) { return !(forward_tiles(head_dim, false) == forward_tiles(head_dim, true)); }

template <int kHeadDim, bool kBanded>
struct ForwardPolicy {
  static constexpr ForwardTiles kTiles = forward_tiles(kHeadDim, kBanded);
  static_assert(kTiles.head_dim == kHeadDim, "no sm90 tile policy for this head dim");
  static_assert(kHeadDim % 16 == 0, "Q K^T consumes the head dim 16 at a time");
  static_assert(kTiles.block_n % 16 == 0 && kTiles.block_n <= 256, "P V consumes keys 16 at a time; wgmma N <= 256");
  static_assert(kTiles.block_m() <= 256, "one TMA box holds the Q tile (at most 256 rows)");
  static_assert(kTiles.consumers >= 1 && kTiles.consumers <= ForwardTiles::kMaxConsumers,
                "each consumer has its own named barriers");
  static_assert(!kTiles.pingpong || kTiles.consumers >= 2, "taking turns needs two consumers or more");
  static_assert(kTiles.stages >= 2, "the K/V pipeline needs two stages to overlap loads with compute");
  static_assert(kTiles.stages <= 4, "the consumers keep the tile count modulo 2 stages in 3 bits");
  static_assert(kTiles.q_stages == 1 || kTiles.q_stages == 2, "one Q tile, or two that rounds alternate between");
  static_assert(!kTiles.ones_atom || kTiles.row_sums_by_pv, "the ones atom serves the row sums by P V");
  static_assert(!kTiles.exp_under_pv || kTiles.overlap, "exp_under_pv is a variant of the overlap schedule");
  static_assert(!kTiles.exp_under_pv || kTiles.k_ahead, "exp_under_pv issues K(j+1) before V(j)");
  static_assert(kTiles.narrow_widths == 0 ||
                    (kTiles.narrow_keys > 0 && kTiles.narrow_keys % 16 == 0 &&
                     kTiles.narrow_widths * kTiles.narrow_keys < kTiles.block_n),
                "a narrow tile's widths are whole P V key steps (16 keys), narrower than Bc");
  static_assert(kTiles.exp2_poly_share >= 0, "a share of 1 in exp2_poly_share blocks, or 0 for none");
  static_assert(kTiles.smem_bytes() <= kMaxSmemBytes, "shared memory per block");
  static_assert(!kTiles.share_tails || kTiles.consumers == ForwardTiles::kMaxConsumers,
                "a shared tail's key tiles go to three consumers in turn");
  static_assert(!kTiles.share_tails || kTiles.stages == ForwardTiles::kMaxConsumers,
                "a shared tail's consumer keeps one K and one V slot of its own (its tiles every third)");
  static_assert(!kTiles.share_tails || (!kTiles.q_in_registers && kTiles.pingpong && !kTiles.overlap),
                "a shared tail's consumers read Q from shared memory, and the policy's phases hold one S tile");
  static_assert(!kTiles.share_tails || (kHeadDim / 2 + 4) * 4 * ForwardTiles::kWarpgroupThreads <= kTiles.q_bytes(),
                "a consumer's (o, m, l) passes through the Q tile (the shared tail's merge)");
  static_assert(!kTiles.row_sums_by_pv || kHeadDim % 64 == 0, "P V's ones columns start a column block of their own");
  static_assert(kTiles.producer_registers + kTiles.consumers * kTiles.consumer_registers <=
                    (1 + kTiles.consumers) * kTiles.launch_registers(),
                "setmaxnreg budgets exceed the block's register allocation");
};

}  // namespace flashattn::detail::sm90
