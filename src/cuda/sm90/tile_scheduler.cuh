// The Hopper forward's persistent tile scheduler (step 4 of docs/hopper_forward.md): which work
// items (query tile, head, batch) a block runs, in which order, and where an item's rows live.
//
// Grid = min(SMs, items (pairs, below)) blocks, one per SM, each looping over items with a static
// stride: no counter to take items from (the split tail below hands over through the workspace,
// it does not schedule). The numbering makes that stride keep K/V in L2 and the load balanced:
//   - (batch, head) is the outer index (query heads that share a kv head are consecutive), so the
//     blocks running at one time work on a few heads and read their K and V from L2;
//   - without a causal/window band every item costs the same: items (batch, head, query tile from
//     the last to the first), block x taking x, x + G, x + 2G, ... (G = gridDim.x);
//   - with a band, tile m sees about m + 1 key tiles under causal masking (linear in m in general),
//     so a static stride over single items would hand some blocks far more work than others (the
//     busiest block 1.5-1.9x the average in a simulation of the benchmark's shapes, against
//     1.00-1.04x for the hardware's own dynamic launch of one block per item). Items are paired:
//     pair j of a (batch, head) is tile M-1-j (heavy, run first) then tile j (light), every pair
//     costing about the same (M + 1 tiles under causal masking); block x runs one pair of each
//     round of G pairs, pair x of the first (items 2x, 2x + 1), rotated by one block each round
//     after (block_item): 1.03x at d = 128 and 256, 1.03-1.06x at d = 64 (few 192-row tiles) in
//     the same simulation.
// A dynamic scheduler (an atomic counter) would balance better still but needs a counter reset
// per call, and does not remove the last wave's idle blocks.
//
// The split tail (stream-K over the last waves; p.split_round < kNoSplit, chosen on the host where
// every item costs the same T key tiles: no band, no varlen, and where the caller gives the
// workspace): N items on G blocks end in a partial wave of N % G items, the other blocks idle
// (2048 items on 132 SMs: 15.52 waves, the 16th 52% full, 3% of the run). The first
// split_round = floor(N / G) - 1 rounds run whole items as above; the remaining N - split_round G
// items (between G and 2G) are cut into units (item, key tile), U of them, and block x runs its
// floor(U / G) or one more of them in order (block_segment): every block the same work to one unit. A
// block's range holds at least T units, so an item is cut at most once, into two parts on two
// consecutive blocks: the end of one block's range (the walk's first positions: part 0) and the
// start of the next one's (part 1). Each part runs as an item of its own over its key tiles; the
// two merge their online-softmax states in the workspace (split_tail.cuh). A block's range spans
// about 1.5 items, so the tail's concurrent items stay within a few heads (K/V in L2).
//
// Shared tails (policy share_tails; p.shared_tails > 0, chosen on the host: three consumers in three
// stages, no band, no varlen, no pack-GQA, a last query tile whose rows fill one consumer's slice,
// rows % Br in 1 .. 64, and three key tiles or more): a tile with rows for one consumer costs what a
// full one does (that consumer's S, softmax and P V in a chain, the two others idle:
// tools/gpu/tail_cost.py measured 0.99-1.01 of a whole tile at d = 128), 4096 = 21 x 192 + 64
// making it 3% of the work at n = 4k. Each (batch, head)'s last tile instead shares its key tiles
// among the three consumers: each computes the slice's 64 rows over every third tile of the item's
// one walk (consumer c walk positions c, c + 3, ...; with three stages all in one K and one V slot),
// with an online-softmax state of its own, and the three states merge through the Q tile's shared
// memory at the end (forward_kernel.cuh), consumer 0 storing. The producer loads the walk as for any
// item, K three tiles ahead of V. Where they are numbered (shared_tail_item): spread, (batch, head)
// h's tail at item h M + h % M among its head's M items, so that tails land on different blocks in
// the rounds whose blocks hold their heads' K/V in L2; or (FLASHATTN_SM90_SHARED_TAILS=first, for
// measurements) items 0 .. shared_tails - 1, in the first round. Only the whole rounds' tails are
// shared (a spread tail in the split tail's items runs as any item's part); the split tail can give
// their blocks a credit (tail_units_begin).
// Pack-GQA (p.pack_gqa; policy.hpp): items are (tile, kv head, batch) and a tile's rows are
// pack-GQA rows r = i group + g, query i of query head h_kv group + g: rows [r0, r1) of the tile
// hold queries [r0 / group, (r1 - 1) / group] of every head of the group. The band (causal/window)
// of a row is its query's, so the item's visible key tiles and the tiles every row sees whole follow
// from that query range; the kernel masks row r with query r / group. Varlen applies as below with
// rows = group x the sequence's length (the consumers copy Q row by row, no box to move back).
//
// Varlen: sequence b owns packed rows cu_seqlens[b] ..; an item whose tile is not in its sequence
// (a shorter one than the longest) is empty and skipped. A TMA box does not stop at a sequence's
// end (the next rows belong to the next sequence, and past the packed total lies memory the map
// cannot bound: it only knows an upper bound), so the boxes of a sequence's last tiles are moved
// back to end at the sequence's end: the Q tile then starts sq - Br rows in (its first rows are the
// previous tile's, computed again and not stored) and the K/V tile sk - Bc keys in (its first keys
// belong to the previous key tile and are masked: key_floor). Coordinates before row 0 of the
// tensor read as zeros.
#pragma once

#include <cuda_runtime.h>

#include "cuda/sm80/mask.cuh"  // Band, KeyRange
#include "cuda/sm90/kernel_params.hpp"

namespace flashattn::detail::sm90 {

// The consumers that share a shared tail's key tiles (above): the policy's three.
constexpr int kSharedTailConsumers = 3;
// Of a walk of `tiles` key tiles, the positions c, c + 3, ... that a shared tail's consumer c takes.
__host__ __device__ constexpr int shared_walk_tiles(int tiles, int c) {
  return tiles > c ? (tiles - c + kSharedTailConsumers - 1) / kSharedTailConsumers : 0;
}
// Of consumer c's share of a walk whose first key tile is n_end - 1 (its keys n_end - 1 - c - 3 j,
// j = 0 .. shared_walk_tiles - 1, falling), how many come first with a key tile >= n: the share's
// positions that lie at or past key tile n.
__host__ __device__ constexpr int shared_walk_at_or_above(int n_end, int c, int n) {
  const int top = n_end - 1 - c, count = shared_walk_tiles(n_end, c);
  if (top < n) return 0;
  const int at_or_above = (top - n) / kSharedTailConsumers + 1;
  return at_or_above < count ? at_or_above : count;
}
// Checked against counting, on every share of walks of 3-13 tiles and every n.
constexpr bool shared_walk_at_or_above_counts() {
  for (int n_end = 3; n_end <= 13; ++n_end)
    for (int c = 0; c < kSharedTailConsumers; ++c)
      for (int n = -1; n <= n_end + 1; ++n) {
        int first = 0;
        while (first < shared_walk_tiles(n_end, c) && n_end - 1 - c - kSharedTailConsumers * first >= n) ++first;
        if (shared_walk_at_or_above(n_end, c, n) != first) return false;
      }
  return shared_walk_tiles(52, 0) == 18 && shared_walk_tiles(52, 1) == 17 && shared_walk_tiles(52, 2) == 17;
}
static_assert(shared_walk_at_or_above_counts(), "a share's tiles at or past a key tile");

// gridDim.x, read where used: ptxas otherwise keeps it in a register across the consumers' main
// loop, and at d = 256 spills it.
__device__ __forceinline__ int blocks_in_grid() {
  int g;
  asm volatile("mov.u32 %0, %%nctaid.x;" : "=r"(g));
  return g;
}

// The block's k-th item (k = 0, 1, ...; the block is done at the first one >= p.num_items: the
// walk is increasing). Paired items: round r = k / 2 of the stride covers pairs r G .. r G + G - 1,
// and block x takes pair r G + (x + r) % G of it, a rotation by one block a round. Without it a
// block would take pair x + r G, the same pair j of every (batch, head) whenever G is a multiple of
// the pairs per head (d = 64, n = 2k: 132 blocks, 6 pairs, the sixth a lone middle tile at half the
// cost: the busiest block 1.16x the average in the simulation above, 1.03x rotated).
__device__ __forceinline__ int block_item(const ForwardKernelParams& p, int k) {
  const int x = static_cast<int>(blockIdx.x), g = blocks_in_grid();
  if (!p.pair_tiles) return x + k * g;
  const int r = k >> 1;
  return 2 * (r * g + (x + r) % g) + (k & 1);
}

// What a block runs in its k-th round: an item, or the part of one (the split tail, above) that
// walks positions [walk_begin, walk_end) of the item's walk (position i: the walk's i-th key tile,
// n_end - 1 - i).
struct Segment {
  static constexpr int kWholeWalk = 1 << 30;
  int item;                  // >= p.num_items: the block is done
  int walk_begin, walk_end;  // 0, kWholeWalk for a whole item
  int boundary;              // a part: its item's workspace slot, the boundary between the two
                             // blocks (0 .. G - 2: between blocks boundary and boundary + 1); -1: whole
  __device__ __forceinline__ bool part() const { return boundary >= 0; }
};

// Block x's first unit of the split tail: x L + min(x, R), every block U / G. With a credit C per
// shared tail (p.shared_tail_credit > 0), L and R cut U - tails C units instead (the host's), and
// each block's share is C more for each shared tail it ran in the whole rounds (item i on block
// i % G: block_item; counted by the host into p.tails_before), so that every block ends at the
// same time where a shared tail costs C units less than an item. The host checks that every block's
// range still holds at least T units.
// The first term, shared with the host's check (forward.cu, shared_tail_credit): x L + min(x, R);
// the second, the shared tails that blocks 0 .. x - 1 ran, the host's table.
__host__ __device__ constexpr int split_units_begin(int x, int per_block, int extra) {
  return x * per_block + (x < extra ? x : extra);
}
__device__ __forceinline__ int tail_units_begin(const ForwardKernelParams& p, int x) {
  const int u = split_units_begin(x, p.tail_units_per_block, p.tail_units_extra);
  if (p.shared_tail_credit == 0) return u;
  return u + p.shared_tail_credit * p.tails_before[x];
}
// Where (batch, head) h's shared tail is in the item numbering (ForwardKernelParams::shared_tails_spread).
__host__ __device__ constexpr int shared_tail_item(int h, int m_blocks, bool spread) {
  return spread ? h * m_blocks + h % m_blocks : h;
}

__device__ __forceinline__ Segment block_segment(const ForwardKernelParams& p, int k) {
  if (k < p.split_round) return {block_item(p, k), 0, Segment::kWholeWalk, -1};
  const int x = static_cast<int>(blockIdx.x), t = p.key_tiles;
  // The block's units [u0, u1): L or L + 1 of them (the first R blocks one more), 32-bit (host).
  const int u0 = tail_units_begin(p, x), u1 = tail_units_begin(p, x + 1);
  const int a = u0 / t, z = (u1 - 1) / t;  // its first and last item
  const int j = a + (k - p.split_round);
  if (j > z) return {p.num_items, 0, 0, -1};
  const int begin = j == a ? u0 - a * t : 0, end = j == z ? u1 - z * t : t;
  return {p.split_round * blocks_in_grid() + j, begin, end, begin > 0 ? x - 1 : end < t ? x : -1};
}

// Which key tiles the item's rows see: [n_begin, n_end), walked from n_end - 1 down.
struct TileRange {
  int n_begin, n_end;
  __device__ __forceinline__ int count() const { return n_end > n_begin ? n_end - n_begin : 0; }
};

// The key tiles of one consumer's rows (WorkTile::slice_tiles): those they see and those they all
// see whole.
struct SliceTiles {
  TileRange seen, whole;
  int keys_hi;  // the rows see no key from here on
};

// One work item, resolved.
struct WorkTile {
  int b, h;             // batch entry and query head (pack-GQA: the group's first, h_kv group)
  int tma_batch;        // the maps' batch coordinate (0 with varlen)
  int sq, sk;           // this sequence's lengths
  int q_row0, k_row0;   // its first row in the packed tensors (varlen), else 0
  int r0, r1;           // the item's rows [r0, r1): queries, or pack-GQA rows (empty: skip the item)
  int i0, i1;           // the queries of those rows, [i0, i1) (= [r0, r1) unless pack-GQA)
  int q_tile_row0;      // the row at row 0 of the Q tile: r0, or sq - Br for a varlen tail tile,
                        // or -lead (< 0 when lead > 0) for tile 0 of paired tiles (work_tile)
  bool shift_tail;      // varlen: the last K/V box of the sequence ends at sk (key_tile_start),
                        // its rows before the sequence zeros (forward_kernel.cuh: load_tile)
  sm80::Band band;
  TileRange tiles;      // key tiles that queries [i0, i1) see
  bool shared_tail;     // a shared tail (above): the consumers share the key tiles, every one on the
                        // slice at the Q tile's row 0

  __device__ __forceinline__ bool empty() const { return r0 >= r1; }
  // The item's K/V tiles: `tiles`, walked once (a shared tail's consumer c takes every third of
  // the walk from position c: shared_walk_tiles).
  __device__ __forceinline__ int tile_count() const { return tiles.count(); }

  // First key held by the K/V box of key tile n: n Bc, or sk - Bc when tile n runs past the
  // sequence's end (varlen).
  template <int kBlockN>
  __device__ __forceinline__ int key_tile_start(int n) const {
    return shift_tail ? min(n * kBlockN, sk - kBlockN) : n * kBlockN;
  }

  // The key tiles that rows [row_begin, row_begin + rows) of the item's row space (a consumer's
  // slice of the Q tile) see, within `tiles`, and those they all see whole, so that they skip the
  // per-element mask. Only the rows in [r0, r1) count: a varlen tail tile's first rows are the
  // previous tile's, paired tile 0's may start before row 0 (work_tile: lead), the last tile's may
  // end past the sequence; a slice without rows of the item sees none (both ranges empty, at
  // n_end: the walk's start). Whole: the n of `seen` whose keys
  // [n Bc, (n + 1) Bc) lie inside band.keys_seen_by_all = [lo, hi) (lo, hi >= 0), n Bc >= lo and
  // (n + 1) Bc <= hi, so n in [ceil(lo / Bc), floor(hi / Bc)): one run, maybe empty. A tail box
  // that key_tile_start moves back is never one: its tile runs past sk >= hi.
  template <int kBlockN>
  __device__ __forceinline__ SliceTiles slice_tiles(int row_begin, int rows, int group, bool pack) const {
    const int a = max(row_begin, r0), b = min(row_begin + rows, r1);
    if (a >= b) return {{tiles.n_end, tiles.n_end}, {tiles.n_end, tiles.n_end}, 0};
    const int qa = pack ? a / group : a, qb = pack ? (b - 1) / group + 1 : b;
    const sm80::KeyRange keys = band.visible_keys(qa, qb), all = band.keys_seen_by_all(qa, qb);
    const TileRange seen{max(keys.lo / kBlockN, tiles.n_begin), min((keys.hi + kBlockN - 1) / kBlockN, tiles.n_end)};
    return {seen, {max((all.lo + kBlockN - 1) / kBlockN, seen.n_begin), min(all.hi / kBlockN, seen.n_end)},
            keys.hi};
  }
};

// Called by the producer's single thread (ItemInfo below carries the result to the consumers).
// A part of an item (the split tail) keeps the tiles of its walk positions only.
template <int kBlockM, int kBlockN>
__device__ __forceinline__ WorkTile work_tile(const ForwardKernelParams& p, const Segment& segment) {
  const int item = segment.item;
  WorkTile w;
  // Item -> (batch, head) and the pair or tile index within it (local = -1: the head's shared-tail
  // slot, its last tile).
  const int pairs = (p.m_blocks + 1) / 2;
  // Spread (shared_tail_item): (batch, head) h's items h M .., its tail at h M + h % M.
  bool tail_slot;
  int bh, local;
  if (p.shared_tails > 0 && p.shared_tails_spread) {
    bh = item / p.m_blocks;
    const int l = item - bh * p.m_blocks, j = bh % p.m_blocks;
    tail_slot = l == j;
    local = tail_slot ? -1 : l - (l > j ? 1 : 0);
  } else {
    tail_slot = item < p.shared_tails;
    const int per_head = p.pair_tiles ? 2 * pairs : p.m_blocks - (p.shared_tails > 0 ? 1 : 0);
    const int after_tails = item - p.shared_tails;
    bh = tail_slot ? item : after_tails / per_head;
    local = tail_slot ? -1 : after_tails - bh * per_head;
  }
  // Shared only in the whole rounds: in the split tail (spread) the tile runs as any item's part.
  w.shared_tail = tail_slot && (p.split_round == ForwardKernelParams::kNoSplit || item < p.split_round * blocks_in_grid());
  w.b = bh / p.item_heads;
  w.h = bh - w.b * p.item_heads;
  if (p.pack_gqa) w.h *= p.group;

  const bool varlen = p.maybe_cu_seqlens_q != nullptr;
  if (varlen) {
    w.q_row0 = p.maybe_cu_seqlens_q[w.b];
    w.k_row0 = p.maybe_cu_seqlens_k[w.b];
    w.sq = p.maybe_cu_seqlens_q[w.b + 1] - w.q_row0;
    w.sk = p.maybe_cu_seqlens_k[w.b + 1] - w.k_row0;
  } else {
    w.q_row0 = w.k_row0 = 0;
    w.sq = p.seqlen_q;
    w.sk = p.seqlen_k;
  }
  w.tma_batch = varlen ? 0 : w.b;
  w.shift_tail = varlen;

  // The query tile m (-1: none). Pairs are formed over this sequence's own tiles (M_b of them):
  // heavy tiles M_b-1-j for j < ceil(M_b / 2), light tiles j for j < floor(M_b / 2).
  // Paired tiles (a band) of a sequence that is not a multiple of Br long end at its end: tile m
  // holds rows [m Br - lead, (m + 1) Br - lead), lead = M_b Br - sq, so the rows that the last tile
  // would lack are missing from tile 0, the lightest, instead of the heaviest (there a consumer
  // whose slice has no row idles through the longest walk; at d = 64, n = 2k, the third of each
  // head's last tile). Tile 0's rows before 0 read as zeros (TMA); they count in no slice's tile
  // ranges (slice_tiles) and are not stored. Not with varlen (a box before a sequence's start
  // would read the previous one's rows; its tail box moves instead, below) or pack-GQA (the
  // consumers copy Q rows >= 0 only).
  const int rows = p.pack_gqa ? w.sq * p.group : w.sq;
  int m, lead = 0;
  if (p.pair_tiles) {
    const int m_b = (rows + kBlockM - 1) / kBlockM, j = local >> 1;
    m = (local & 1) ? (j < m_b / 2 ? j : -1) : (j < (m_b + 1) / 2 ? m_b - 1 - j : -1);
    if (!varlen && !p.pack_gqa) lead = m_b * kBlockM - rows;
  } else {
    // From the last tile to the first (past a shorter sequence's end when r0 >= rows); with shared
    // tails the last is the shared tail's (local = -1) and the others follow.
    m = p.m_blocks - 1 - local - (p.shared_tails > 0 ? 1 : 0);
  }
  const int tile_row0 = m * kBlockM - lead;
  w.r0 = m < 0 ? 0 : max(tile_row0, 0);
  w.r1 = m < 0 ? 0 : min(tile_row0 + kBlockM, rows);
  if (p.pack_gqa) {
    w.i0 = w.r0 / p.group;
    w.i1 = w.r0 < w.r1 ? (w.r1 - 1) / p.group + 1 : w.i0;
  } else {
    w.i0 = w.r0;
    w.i1 = w.r1;
  }
  w.q_tile_row0 = varlen && !p.pack_gqa ? min(w.r0, w.sq - kBlockM) : m < 0 ? 0 : tile_row0;
  w.band = {w.sk, p.bottom_right ? w.sk - w.sq : 0, p.window_left, p.window_right};
  if (w.empty()) {
    w.tiles = {0, 0};
  } else {
    const sm80::KeyRange keys = w.band.visible_keys(w.i0, w.i1);
    const int lo = keys.lo / kBlockN, hi = (keys.hi + kBlockN - 1) / kBlockN;
    w.tiles = {max(lo, hi - segment.walk_end), hi - segment.walk_begin};
  }
  return w;
}

// One round of a block as the producer resolved it, for the consumers (forward_kernel.cuh): the
// segment (item >= p.num_items: the block is done), its WorkTile and each consumer's SliceTiles.
// The producer alone runs block_segment, work_tile and slice_tiles (their divisions and 64-bit band
// arithmetic, some hundreds of instructions a round); it writes the round's ItemInfo into slot
// k % 4 of shared memory before it completes item_full's phase k, and the consumers read it there, at
// the item's start and again in its epilogue, instead of holding it in registers over the main loop.
template <int kConsumers>
struct ItemInfo {
  Segment segment;
  WorkTile w;
  SliceTiles slices[kConsumers];
};

}  // namespace flashattn::detail::sm90
