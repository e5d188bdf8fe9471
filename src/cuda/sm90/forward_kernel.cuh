// The Hopper forward (sm_90a), FlashAttention-3's warp-specialised design, steps 1-4 of
// docs/hopper_forward.md. A persistent block (one per SM) runs work items, each Br = 64 C query rows
// of one (batch, head), in the order of tile_scheduler.cuh:
//
//   producer warpgroup (one thread):  per item, K(n) and V(n) for the visible key tiles, last to
//       first (the tiles that need the per-element mask come first), into `stages` K and V slots,
//       and the item's Q tile right after its first K tile; full[slot] completes when a tile's
//       bytes land (expect_tx), empty[slot] when every consumer thread has finished reading it.
//       Q waits for q_empty, which the consumers pass once the previous item's last S = Q Kᵀ is
//       done (its last P V and epilogue still to run), or with Q in registers (policy
//       q_in_registers) once they have loaded it at the item's start. Order:
//       K(0), Q, V(0), K(1), V(1), ...; with the policy's exp_under_pv K(0), Q, K(1), V(0), K(2),
//       V(1), ... (K(i + 1) before V(i), kKAhead below; also the policy's k_ahead alone).
//   consumer warpgroup c (C of them, 64 rows each):  per tile, S = Q Kᵀ (wgmma from shared memory),
//       release K, mask, online softmax in registers on the accumulator layout, O += P V with P
//       from registers (wgmma_rs, V read MN-major; with the policy's row_sums_by_pv over V's d
//       columns and 8 more from a block of ones after each V slot, so that the tensor cores sum P's
//       rows into l, and the softmax adds nothing), release V; Q (q_empty) as the item's last P V
//       is issued; then O / l and lse, stored from registers to global memory (16 bytes per thread
//       and store after a transpose within each quad of lanes), rows outside the item not written.
//
// So the producer loads the next item's Q and first K/V tiles while the consumers run the current
// item's last P V and epilogue: in a persistent block the next item's first S finds them loaded
// when that tail outlasts the loads.
//
// A consumer's own 64 rows decide what it computes of the item's tiles (WorkTile::slice_tiles): the
// walk's first tiles that lie wholly above those rows' diagonal (or right window edge, or all of
// them for rows outside the item: past its end, or before row 0 in paired tile 0) it waits for and
// releases unread, and it masks only the tiles that its rows do not all see whole; the producer
// loads the item's tiles for all of them alike.
//
// A narrow first tile (policy narrow_widths > 0): a consumer whose rows see only the first w keys of
// its first tile (w = narrow_keys times 1 .. narrow_widths: a causal diagonal at d = 64, or the end
// of the sequence at d = 128 without a band in builds with FLASHATTN_SM90_NARROW_TAIL, as in the last
// key tile at n = 4096, Bc = 80, where w = 16) computes that tile as a 64 x w S (a narrow S) and its
// P V over those w / 16 key steps.
//
// The consumers' schedule is the policy's (policy.hpp). Step 1 (serial): S(j), wait, softmax, P V,
// wait. Steps 2-3 (pipelined): in phases; phase j issues S(j) and O += P(j-1) V(j-1) together (the
// first phase S(0) alone, the last P(N-1) V(N-1) alone), then computes the softmax of S(j):
//   overlap   after wgmma_wait<1> (S(j) done, P(j-1) V(j-1) still running) in phases that do
//             not mask, else (and in every phase without overlap) after wait<0>;
//             with exp_under_pv the wait for P(j-1) V(j-1) follows the softmax in SASS too
//             (end_basic_block; else ptxas hoists it above the exponentials);
//             phases that mask and phases that do not run apart (WorkTile::slice_tiles);
//   pingpong  phases are issued in turns, consumer 0, 1, ..., C-1, 0, ... (GemmTurns below), one
//             ring over all of the block's items.
// o *= alpha(j-1) happens just before O += P(j-1) V(j-1) is issued, when o is not in flight.
//
// Slot protocol: the block's K/V tiles are numbered 0, 1, ... in issue order over all its items;
// tile number g uses slot g % stages in round g / stages; consumers wait full with parity round & 1;
// the producer waits empty with parity (round & 1) ^ 1, which passes at once in round 0
// (mbarrier.cuh). K and V have barriers of their own, so issuing K(g + 1) before V(g) changes no
// barrier's sequence. Q and the rounds: the producer alone resolves the block's rounds (segment,
// WorkTile, each consumer's SliceTiles: tile_scheduler.cuh's ItemInfo) and writes round k's into
// items[k % 4]. Once the consumers pass q_empty's phase k - 1 (done with round k - 1's Q tile, or
// at that round's start when it has none; so after round k - 2's epilogue, and past item_full's
// phase k - 1) it completes item_full's phase k, then loads the item's Q tile, if it has one (key
// tiles, and not pack-GQA), the block's L-th Q load completing q_full's phase L. A slot is
// rewritten four rounds on, long after its last reader; the consumers read the item at once and
// set up their tiles while its Q is in flight. The block's end is a round whose item is
// >= num_items. No barrier is initialised twice.
//
// Two Q tiles (policy q_stages = 2): rounds alternate between them, round k using tile k % 2 with
// item_full, q_full and q_empty of its own, each barrier's phase j being round 2 j + k % 2. The
// producer then waits only for round k - 2's Q tile to be free, so the next item's Q loads under
// the current item's phases and its S(0) need not wait for it. It completes q_full every round,
// with a plain arrival where no Q is loaded, so that the consumers' parity is the round's; a slot
// of items[] is still rewritten only once every consumer is past round k - 3's start.
//
// Pack-GQA (p.pack_gqa, tile_scheduler.cuh): a tile's rows interleave the query heads of one kv
// head, which no TMA box describes; the producer then loads K and V only, and each consumer warp
// copies its 16 rows of Q itself (copy_packed_q), fenced for the async proxy and met on its
// warpgroup's named barrier before the first S; q_full stays unused, and q_empty guards the
// ItemInfo slots alone.
//
// The split tail (tile_scheduler.cuh: block_segment; p.split_round < kNoSplit): a block's last
// rounds may run parts of items, each a segment of the item's walk that the producer and the
// consumers treat as an item of its own (its Q, its tiles, its turns); after its main loop a part
// merges with the other part's state or hands its own over (split_tail.cuh), and only the part that
// merges stores O and lse.
//
// Shared tails (tile_scheduler.cuh; p.shared_tails > 0, policy share_tails): every consumer computes
// the tile's first slice (its 64 rows of the item) over every third of the item's key tiles (tile_of),
// through the same phases and turns as an item's, and releases its tiles for all; after the walk the
// three states merge through the Q tile (shared_tail.cuh), which is released only then, and consumer
// 0 stores.
//
// kSoftcap: the variant with softcap (scores become final logits before the softmax, which then
// scales by log2 e alone), launched only when softcap > 0.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/primitives/ldmatrix.cuh"  // smem_address
#include "cuda/primitives/math.cuh"
#include "cuda/primitives/mma.cuh"
#include "cuda/primitives/schedule.cuh"  // opaque, end_basic_block
#include "cuda/primitives/sm90/mbarrier.cuh"
#include "cuda/primitives/sm90/sw128_tile.cuh"
#include "cuda/primitives/sm90/tma.cuh"
#include "cuda/primitives/sm90/warpgroup.cuh"
#include "cuda/primitives/sm90/wgmma.cuh"
#include "cuda/sm80/mask.cuh"
#include "cuda/sm80/score_mods.cuh"  // ScoreMods::capped, sm80's softcap formula
#include "cuda/sm90/kernel_params.hpp"
#include "cuda/sm90/policy.hpp"
#include "cuda/sm90/shared_tail.cuh"
#include "cuda/sm90/softmax.cuh"
#include "cuda/sm90/split_tail.cuh"
#include "cuda/sm90/tile_scheduler.cuh"
#include "cuda/sm90/timeline.cuh"

namespace flashattn::detail::sm90 {

namespace hw = cuda::sm90;
using cuda::end_basic_block;
using cuda::opaque;
namespace tl = timeline;  // stamps of timeline builds only (timeline.cuh); nothing otherwise

// Named barriers (0 is __syncthreads), one of each kind per consumer c: id kind + c.
enum class NamedBarrier : int {
  kConsumerEpilogue = 1,                                   // the consumer's 128 threads
  kGemmTurn = kConsumerEpilogue + ForwardTiles::kMaxConsumers,  // the consumer and its predecessor
  kSharedTailMeets = kGemmTurn + ForwardTiles::kMaxConsumers,   // every consumer: a shared tail's three meets
};
static_assert(static_cast<int>(NamedBarrier::kSharedTailMeets) + 2 < 16, "16 named barriers");

// Ping-pong (step 2): the consumers issue their GEMM phases in a ring, 0, 1, ..., C-1, 0, ...
// Consumer c waits for its turn on barrier kGemmTurn + c (bar.sync) and, once its GEMMs are issued,
// hands the turn to c + 1 (bar.arrive on kGemmTurn + (c + 1) % C); each use of a barrier counts
// 2 x 128 threads, the waiting consumer's and the arriving one's. The ring runs over all of the
// block's items as one sequence of phases (every consumer runs the same items, and the same number
// of phases in each: the tile range is the item's), so that no barrier ever holds arrivals of two
// phases: a hand-over follows its sender's own turn, which the ring places after the receiver's
// previous turn. For the arrivals on each barrier to match its waits exactly, consumer 0 does not
// wait for the block's first phase (it starts the ring), and once the block's items are done it
// takes one last turn (finish) that receives consumer C-1's last hand-over. kEnabled = false: no
// barriers at all.
template <int kConsumers, bool kEnabled>
struct GemmTurns {
  static constexpr int kThreads = 2 * hw::kWarpgroupThreads;
  int c;

  __device__ __forceinline__ void take(bool block_first_phase) const {
    if constexpr (kEnabled)
      if (!(block_first_phase && c == 0))
        hw::named_barrier_sync(static_cast<int>(NamedBarrier::kGemmTurn) + c, kThreads);
  }
  __device__ __forceinline__ void pass() const {
    if constexpr (kEnabled)
      hw::named_barrier_arrive(static_cast<int>(NamedBarrier::kGemmTurn) + (c + 1) % kConsumers, kThreads);
  }
  // After the block's last item: consumer 0 receives the last hand-over (when any phase ran).
  __device__ __forceinline__ void finish(bool any_phase) const {
    if constexpr (kEnabled)
      if (any_phase && c == 0) hw::named_barrier_sync(static_cast<int>(NamedBarrier::kGemmTurn), kThreads);
  }
};

// Keeps the compiler from reusing the registers of P while a wgmma_rs may still read them (it
// believes they are consumed at issue): place after the wgmma_wait that retires the group.
template <int kRows>
__device__ __forceinline__ void keep_alive(const uint32_t (&a)[kRows][4]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i)
    asm volatile("" ::"r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]) : "memory");
}

// A consumer thread's place: consumer c (warpgroup c + 1), warp of the warpgroup (warp-uniform,
// from lane 0), lane. Read afresh where used: kept in registers over the main loop, these and what
// is computed from them would cost registers that d = 256 does not have.
struct ConsumerThread {
  int c, warp, lane;
};
__device__ __forceinline__ ConsumerThread consumer_thread() {
  const int tid = opaque(static_cast<int>(threadIdx.x));
  return {__shfl_sync(0xffffffffu, tid / hw::kWarpgroupThreads, 0) - 1,
          __shfl_sync(0xffffffffu, tid % hw::kWarpgroupThreads / 32, 0), tid % 32};
}

// The consumers' progress over the block's items, in one register (the main loop at d = 256 leaves
// none to spare): the round counter k (item_full's phase, through q_phase, and the ItemInfo slot
// k % 4); the K/V tiles consumed so far, modulo 2 stages (a tile's slot and round parity repeat every
// 2 stages tiles; at most 8, in 3 bits); with one Q tile, q_full's parity (Q tiles consumed, modulo
// 2); whether the ring of turns has started (a tile was consumed).
template <int kStages>
struct Progress {
  static constexpr int kTileModulus = 2 * kStages;
  static_assert(kTileModulus <= 8, "slot and round parity must repeat within the 3 bits kept");
  static constexpr uint32_t kTileBits = 7, kQOdd = 8, kStarted = 16, kItemShift = 5;
  uint32_t bits = 0;

  __device__ __forceinline__ int k() const { return static_cast<int>(bits >> kItemShift); }
  __device__ __forceinline__ int tiles() const { return static_cast<int>(bits & kTileBits); }
  __device__ __forceinline__ uint32_t q_parity() const { return (bits & kQOdd) ? 1u : 0u; }
  __device__ __forceinline__ bool started() const { return (bits & kStarted) != 0; }
  // The round is done, its item having consumed n_tiles K/V tiles and, when n_tiles > 0, a Q tile
  // (pack-GQA counts one too, and never waits for q_full).
  __device__ __forceinline__ void next_item(int n_tiles) {
    const uint32_t item = (bits >> kItemShift) + 1;
    if (n_tiles > 0)
      bits = static_cast<uint32_t>((tiles() + n_tiles) % kTileModulus) | ((bits & kQOdd) ^ kQOdd) | kStarted;
    bits = (bits & ((1u << kItemShift) - 1)) | (item << kItemShift);
  }
};

// x as lane 0 holds it: a value the compiler then knows to be warp-uniform (the consumers' branches
// on an item's tile ranges, read from shared memory, stay uniform branches).
__device__ __forceinline__ int warp_uniform(int x) { return __shfl_sync(0xffffffffu, x, 0); }

// f(std::integral_constant<int, w>{}) for the run-time width w, as min(max(w, 1), kMax): one
// compile-time width per narrow tile's shape (a chain of warp-uniform compares; none for kMax = 1).
template <int kMax, class F>
__device__ __forceinline__ void with_width(int w, F&& f) {
  static_assert(kMax >= 1);
  if constexpr (kMax > 1) {
    if (w < kMax) {
      with_width<kMax - 1>(w, f);
      return;
    }
  }
  f(std::integral_constant<int, kMax>{});
}

// Pack-GQA (tile_scheduler.cuh): a consumer warp's 16 rows of the Q tile (tile rows warp_row0 ..,
// item rows w.q_tile_row0 + warp_row0 ..), copied from global memory with 16-byte loads into the
// 128-byte-swizzled layout that TMA would have written; rows past the item's end and columns past
// the head dim are zeros, as TMA's out-of-bounds fill. Tile row t holds pack-GQA row
// r = w.q_tile_row0 + t: query r / group of head w.h + r % group. The caller syncs its
// warpgroup before (the previous item's S GEMMs read these rows) and after, fenced (generic -> async
// proxy), before wgmma reads the tile.
template <int kHeadDim, class QTile, class T>
__device__ __forceinline__ void copy_packed_q(const ForwardKernelParams& p, const WorkTile& w, uint8_t* q_smem,
                                              int warp_row0, int lane) {
  constexpr int kChunksPerRow = kHeadDim / 8;  // 16-byte chunks of a row
  constexpr int kSteps = 16 * kChunksPerRow / 32;
  static_assert(16 * kChunksPerRow % 32 == 0, "a warp's 16 rows split evenly over its lanes");
  const T* q = static_cast<const T*>(p.q) + w.b * p.q_batch_stride + int64_t{w.q_row0} * p.q_row_stride;
  uint4 value[kSteps];
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {  // all loads first, then the stores
    const int chunk_index = lane + 32 * step;
    const int row = chunk_index / kChunksPerRow, chunk = chunk_index % kChunksPerRow;
    const int r = w.q_tile_row0 + warp_row0 + row;
    value[step] = make_uint4(0, 0, 0, 0);
    if (r < w.r1 && chunk * 8 < p.head_dim) {
      const int i = r / p.group, g = r - i * p.group;
      value[step] = *reinterpret_cast<const uint4*>(q + int64_t{i} * p.q_row_stride +
                                                    int64_t{w.h + g} * p.q_head_stride + chunk * 8);
    }
  }
#pragma unroll
  for (int step = 0; step < kSteps; ++step) {
    const int chunk_index = lane + 32 * step;
    const int row = chunk_index / kChunksPerRow, chunk = chunk_index % kChunksPerRow;
    *reinterpret_cast<uint4*>(q_smem + QTile::offset(warp_row0 + row, chunk * 8)) = value[step];
  }
}

// S = Q Kᵀ for one consumer's 64 rows and the first 2 kAcc keys of the K tile at k_tile (all of
// them, or a narrow S's keys), one wgmma per 16 of the head dim, committed as one group.
template <class T, int kHeadDim, class QTile, class KTile, int kAcc>
__device__ __forceinline__ void score_gemm(float (&s)[kAcc], uint32_t q_slice, uint32_t k_tile) {
  hw::wgmma_fence();
#pragma unroll
  for (int k16 = 0; k16 < kHeadDim / 16; ++k16)
    hw::wgmma_ss<T>(s, hw::k_major_descriptor<QTile>(q_slice, k16), hw::k_major_descriptor<KTile>(k_tile, k16),
                    k16 > 0);
  hw::wgmma_commit();
  hw::wgmma_fence_operand(s);
}

// The same with Q from registers (policy q_in_registers): qa, the A operand of every k16 step.
template <class T, int kHeadDim, class KTile, int kAcc>
__device__ __forceinline__ void score_gemm(float (&s)[kAcc], const uint32_t (&qa)[kHeadDim / 16][4], uint32_t k_tile) {
  hw::wgmma_fence();
#pragma unroll
  for (int k16 = 0; k16 < kHeadDim / 16; ++k16)
    hw::wgmma_rs<T, 0>(s, qa[k16], hw::k_major_descriptor<KTile>(k_tile, k16), k16 > 0);
  hw::wgmma_commit();
  hw::wgmma_fence_operand(s);
}

// A consumer warp's 16 rows of the Q tile (tile rows warp_row0 ..) as the A operand of Q Kᵀ, one
// ldmatrix_x4 per 16 of the head dim: its four 8 x 8 matrices (rows 0-7 and 8-15 of the warp's,
// columns k and k + 8; lanes 8 i .. 8 i + 7 address matrix i's rows) are a[0..3] of wgmma.cuh.
template <int kHeadDim, class QTile>
__device__ __forceinline__ void load_q_operand(uint32_t (&qa)[kHeadDim / 16][4], uint32_t q_addr, int warp_row0,
                                               int lane) {
  const int row = warp_row0 + lane % 8 + 8 * (lane / 8 % 2), col = 8 * (lane / 16);
#pragma unroll
  for (int k16 = 0; k16 < kHeadDim / 16; ++k16) cuda::ldmatrix_x4(qa[k16], q_addr + QTile::offset(row, 16 * k16 + col));
}

// The block of ones that the row sums' own wgmmas read (policy ones_atom): 8 rows (N) of 64 keys (K),
// K-major; every key step reads its first 16 columns, all ones.
using OnesAtom = hw::Sw128Tile<8, 64>;

// O += P V over the first kSteps 16-key steps of the V tile at v_tile (P from registers), one group.
// kOnesAtom (policy ones_atom): o's last 4 accumulators are the row sums, each key step's m64n8k16
// on the ones at `ones` after V's m64n(d)k16; else `ones` is unused (with row sums by P V, V's
// instruction covers them: its N is d + 8, the V slot's ones block).
template <class T, class VTile, int kSteps, bool kOnesAtom, int kO, int kPSteps>
__device__ __forceinline__ void value_gemm(float (&o)[kO], const uint32_t (&pa)[kPSteps][4], uint32_t v_tile,
                                           uint32_t ones) {
  static_assert(kSteps <= kPSteps);
  hw::wgmma_fence_operand(o);
  hw::wgmma_fence();
  if constexpr (kOnesAtom) {
    float(&ov)[kO - 4] = *reinterpret_cast<float(*)[kO - 4]>(&o[0]);
    float(&ol)[4] = *reinterpret_cast<float(*)[4]>(&o[kO - 4]);
    const uint64_t ones_b = hw::k_major_descriptor<OnesAtom>(ones, 0);
#pragma unroll
    for (int k16 = 0; k16 < kSteps; ++k16) {
      hw::wgmma_rs<T, 1>(ov, pa[k16], hw::mn_major_descriptor<VTile>(v_tile, k16), true);
      hw::wgmma_rs<T, 0>(ol, pa[k16], ones_b, true);
    }
  } else {
#pragma unroll
    for (int k16 = 0; k16 < kSteps; ++k16)
      hw::wgmma_rs<T, 1>(o, pa[k16], hw::mn_major_descriptor<VTile>(v_tile, k16), true);
  }
  hw::wgmma_commit();
  hw::wgmma_fence_operand(o);
}

// Scores of key tile n -> final logits (kSoftcap) -> masked if `mask`, on this thread's rows row0
// and row0 + 8 of the Q tile and the tile's first kN / 2 keys (all of them, or a narrow S's).
template <bool kSoftcap, int kBlockN, int kN>
__device__ __forceinline__ void modify_scores(float (&s)[kN], const ForwardKernelParams& p, const WorkTile& w, int row0,
                                              int n, int quad_lane, bool mask) {
  if constexpr (kSoftcap) {
#pragma unroll
    for (int x = 0; x < kN; ++x) s[x] = sm80::ScoreMods::capped(s[x], p.softcap, p.softcap_to_exp2);
  }
  if (mask) {
    const int query[2] = {p.pack_gqa ? row0 / p.group : row0, p.pack_gqa ? (row0 + 8) / p.group : row0 + 8};
    apply_band_mask(s, w.band, query, w.key_tile_start<kBlockN>(n), n * kBlockN, quad_lane);
  }
}

// P (the softmax's s) as the A operand of P V: kN / 8 key steps of 16.
template <class T, int kN, int kPSteps>
__device__ __forceinline__ void pack_p(uint32_t (&pa)[kPSteps][4], const float (&s)[kN]) {
  static_assert(kN / 8 <= kPSteps);
#pragma unroll
  for (int k16 = 0; k16 < kN / 8; ++k16) hw::a_from_accumulators<T>(pa[k16], s, k16);
}

// The block's mbarriers.
template <int kStages, int kQStages>
struct Barriers {
  uint64_t item_full[kQStages];  // the round's ItemInfo is written (the producer's arrival)
  uint64_t q_full[kQStages], q_empty[kQStages];
  uint64_t k_full[kStages], k_empty[kStages];
  uint64_t v_full[kStages], v_empty[kStages];
};

// kBanded: the policy of problems with a band (policy.hpp), or of those without.
template <int kHeadDim, bool kBanded, class T, bool kSoftcap>
__global__ void __launch_bounds__(ForwardPolicy<kHeadDim, kBanded>::kTiles.threads(), 1)
    forward_kernel(const __grid_constant__ ForwardKernelParams p) {
  constexpr ForwardTiles kTiles = ForwardPolicy<kHeadDim, kBanded>::kTiles;
  constexpr int kBlockM = kTiles.block_m(), kBlockN = kTiles.block_n, kStages = kTiles.stages;
  constexpr int kRows = ForwardTiles::kRowsPerConsumer;
  constexpr int kConsumerThreads = kTiles.consumers * hw::kWarpgroupThreads;
  using QTile = hw::Sw128Tile<kBlockM, kHeadDim>;
  using KTile = hw::Sw128Tile<kBlockN, kHeadDim>;
  using VTile = hw::Sw128Tile<kBlockN, kHeadDim>;
  static_assert(QTile::kBytes == kTiles.q_bytes() && KTile::kBytes == kTiles.kv_tile_bytes());
  constexpr int kS = kBlockN / 2;   // S accumulators per thread
  constexpr int kO = kHeadDim / 2;  // O accumulators per thread
  // Row sums by P V (policy row_sums_by_pv): P V's N is d + 8, the last 8 columns V's ones, so o's
  // accumulators kO .. kO + 3 (column block kO / 4, rows r = 0 and 1, columns e = 0 and 1) each hold
  // the row's l = sum of P (in T, as P V sees it) over all the keys so far.
  constexpr bool kRowSums = kTiles.row_sums_by_pv;
  constexpr int kOAcc = kO + (kRowSums ? 4 : 0);
  constexpr int kPSteps = kBlockN / 16;
  constexpr bool kOverlap = kTiles.overlap;  // a scalar: the generic lambda below cannot read kTiles
  constexpr int kPolyShare = kTiles.exp2_poly_share;  // unmasked phases' exponentials on the FMA pipe
  // A slice's first tile may be narrow (policy.hpp: narrow_keys, narrow_widths): its first
  // kNarrowKeys x width keys, width 1 .. kNarrowWidths.
  constexpr int kNarrowKeys = kTiles.narrow_keys, kNarrowWidths = kTiles.narrow_widths;
  // With k_ahead (and exp_under_pv) the producer issues K(i + 1) before V(i) (FlashAttention-3's
  // order): K(i + 1)'s slot frees when S(i - 1) is done, V(i)'s when P(i - 2) V(i - 2) is (with
  // exp_under_pv after the softmax of S(i - 1)); issued first, K(i + 1) no longer queues behind V(i).
  constexpr bool kExpUnderPv = kTiles.exp_under_pv;
  constexpr bool kKAhead = kTiles.k_ahead;
  using Softmax = OnlineSoftmax<kTiles.tree_reductions, kTiles.lazy_rescale, kRowSums>;
  // Q from registers: loaded once per item, after which the Q tile is free for the next item's load.
  constexpr bool kQRegs = kTiles.q_in_registers;
  // Shared tails (tile_scheduler.cuh): a one-slice last tile's key tiles shared by the consumers.
  constexpr bool kShareTails = kTiles.share_tails;

  // The Q tiles: round k's is q_buffer(k), the phase of its barriers q_phase(k) (one tile: every round).
  constexpr int kQStages = kTiles.q_stages;
  const auto q_buffer = [](int k) { return kQStages == 1 ? 0 : k & 1; };
  const auto q_phase = [](int k) { return kQStages == 1 ? k : k >> 1; };

  extern __shared__ uint8_t smem_raw[];
  __shared__ alignas(8) Barriers<kStages, kQStages> bars;
  using Info = ItemInfo<kTiles.consumers>;
  __shared__ alignas(16) Info items[4];  // round k's in items[k % 4]
  const uint32_t raw = cuda::smem_address(smem_raw);
  const uint32_t q_addr = (raw + ForwardTiles::kAlignment - 1) / ForwardTiles::kAlignment * ForwardTiles::kAlignment;
  const uint32_t k_addr0 = q_addr + kQStages * QTile::kBytes;
  const auto q_tile = [&](int k) { return q_addr + q_buffer(k) * QTile::kBytes; };  // round k's Q tile
  const uint32_t v_addr0 = k_addr0 + kStages * KTile::kBytes;
  const auto k_slot = [&](int slot) { return k_addr0 + slot * KTile::kBytes; };
  constexpr int kVSlotBytes = kTiles.v_slot_bytes();  // the V tile, then its ones block (kRowSums)
  constexpr bool kOnesAtom = kTiles.ones_atom;         // or one block of ones after the V slots
  static_assert(!kRowSums || kOnesAtom ||
                    (VTile::kColBlocks == kHeadDim / 64 && VTile::kColBlockBytes == kTiles.ones_block_bytes()),
                "P V's columns d .. d + 7 are the first of the column block after the V tile");
  static_assert(!kOnesAtom || (kRowSums && OnesAtom::kBytes == kTiles.ones_atom_bytes()), "the row sums' ones");
  const uint32_t ones_addr = v_addr0 + kStages * kVSlotBytes;  // kOnesAtom: the ones block
  const auto v_slot = [&](int slot) { return v_addr0 + slot * kVSlotBytes; };
  const auto bar = [](uint64_t& b) { return cuda::smem_address(&b); };
  // K/V tile number g (in issue order over the block's items): slot and round parity.
  const auto slot_of = [](int g) { return g % kStages; };
  const auto parity_of = [](int g) { return static_cast<uint32_t>((g / kStages) & 1); };

  if (threadIdx.x == 0) {
#pragma unroll
    for (int b = 0; b < kQStages; ++b) {
      hw::mbarrier_init(bar(bars.item_full[b]), 1);               // the producer's arrival
      hw::mbarrier_init(bar(bars.q_full[b]), 1);                  // the producer's expect_tx (or arrival)
      hw::mbarrier_init(bar(bars.q_empty[b]), kConsumerThreads);  // every consumer thread
    }
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      hw::mbarrier_init(bar(bars.k_full[s]), 1);
      hw::mbarrier_init(bar(bars.v_full[s]), 1);
      hw::mbarrier_init(bar(bars.k_empty[s]), kConsumerThreads);
      hw::mbarrier_init(bar(bars.v_empty[s]), kConsumerThreads);
    }
    hw::fence_mbarrier_init();
  }
  if constexpr (kOnesAtom) {
    // The ones block (kOnesAtom), the same way.
    const uint32_t ones = cuda::MmaType<T>::pack(1.0f, 1.0f);
    for (int i = threadIdx.x; i < OnesAtom::kBytes / 16; i += kTiles.threads())
      *reinterpret_cast<uint4*>(smem_raw + (ones_addr - raw) + 16 * i) = make_uint4(ones, ones, ones, ones);
    hw::fence_proxy_async_shared();
  } else if constexpr (kRowSums) {
    // Each V slot's ones block (every element 1, so any swizzle reads ones), written once by every
    // thread and made visible to the async proxy (wgmma reads it) before the barrier.
    const uint32_t ones = cuda::MmaType<T>::pack(1.0f, 1.0f);
    constexpr int kChunks = kTiles.ones_block_bytes() / 16;
    for (int s = 0; s < kStages; ++s)
      for (int i = threadIdx.x; i < kChunks; i += kTiles.threads())
        *reinterpret_cast<uint4*>(smem_raw + (v_addr0 - raw) + s * kVSlotBytes + VTile::kBytes + 16 * i) =
            make_uint4(ones, ones, ones, ones);
    hw::fence_proxy_async_shared();
  }
  __syncthreads();

  const int wg = hw::warpgroup_index();
  if (wg == 0) {
    // ---- Producer -------------------------------------------------------------------------------
    hw::setmaxnreg_dec<kTiles.producer_registers>();
    if (threadIdx.x == 0) {
      hw::tma_prefetch_descriptor(p.q_map);
      hw::tma_prefetch_descriptor(p.k_map);
      hw::tma_prefetch_descriptor(p.v_map);
      int g = 0;  // K/V tiles issued so far
      for (int k = 0;; ++k) {
        tl::mark(p.timeline, k, tl::kSegment);
        const Segment segment = block_segment(p, k);
        const bool done = segment.item >= p.num_items;
        int h_kv = 0;  // the item's kv head, once per item (the loads below read it)
        // The item's tile i (key tile n_end - 1 - i) is the block's K/V tile g + i, into K's or V's
        // slot (tiles of one shape, KTile) once that slot's empty barrier passes.
        const auto load_tile = [&](const WorkTile& t, uint64_t(&full)[kStages], uint64_t(&empty)[kStages],
                                   uint32_t slot_addr0, int slot_bytes, const CUtensorMap& map, int i, int event) {
          const int tile = g + i, slot = slot_of(tile);
          // Varlen (packed-rows maps): the box at (col, i0, row0) with i0 = min(start, 0) <= 0, so
          // that its rows before the sequence's first (start < 0: a sequence shorter than Bc) read
          // as zeros. Else (col, row, head, batch).
          const int start = t.key_tile_start<kBlockN>(t.tiles.n_end - 1 - i);
          const int i0 = t.shift_tail ? min(start, 0) : 0;
          const int c1 = t.shift_tail ? i0 : start, c2 = t.shift_tail ? t.k_row0 + start - i0 : h_kv;
          const int c3 = t.shift_tail ? h_kv : t.tma_batch;
          hw::mbarrier_wait(bar(empty[slot]), parity_of(tile) ^ 1);
          tl::mark(p.timeline, k, tl::phase_slot(i, event));
          hw::mbarrier_arrive_expect_tx(bar(full[slot]), KTile::kBytes);
#pragma unroll
          for (int cb = 0; cb < KTile::kColBlocks; ++cb)
            hw::tma_load(slot_addr0 + slot * slot_bytes + KTile::col_block_offset(cb), map, bar(full[slot]),
                         hw::kSw128Cols * cb, c1, c2, c3);
        };
        // K(0) first, so that it does not wait behind the previous item's Q.
        if (!done) {
          const WorkTile w = work_tile<kBlockM, kBlockN>(p, segment);
          h_kv = w.h / p.group;
          if (w.tile_count() > 0) load_tile(w, bars.k_full, bars.k_empty, k_addr0, KTile::kBytes, p.k_map, 0, tl::kKLoad);
        }
        // Round k's ItemInfo, into slot k % 4: its last round, k - 4, ended (epilogue included)
        // before the consumers passed q_empty's phase k - 3 (or later), which the producer waited for
        // in round k - 2. The WorkTile is resolved again and written straight to shared memory, and
        // the rest is read back from there: the producer has 24-40 registers. Written before the
        // wait below, so that the Q load does not wait for it (without Q in registers, q_empty passes
        // only at the item's last S).
        Info& info = items[k & 3];
        info.segment = segment;
        info.w = done ? WorkTile{} : work_tile<kBlockM, kBlockN>(p, segment);
        asm volatile("" ::: "memory");  // what follows reads info.w from shared memory
#pragma unroll
        for (int c = 0; c < kTiles.consumers; ++c) {
          // A shared tail's consumers each hold the tile's first 64 rows.
          const int slice_row0 = kShareTails && info.w.shared_tail ? 0 : c * kRows;
          info.slices[c] = info.w.slice_tiles<kBlockN>(info.w.q_tile_row0 + slice_row0, kRows, p.group, p.pack_gqa);
          asm volatile("" ::: "memory");
        }
        // The loop's fields, back in registers (the mbarrier waits would have them reloaded from
        // shared memory on every tile).
        const WorkTile w = info.w;
        const int n_tiles = w.tile_count();
        // Then, once the consumers are done with round k - 1's Q tile (so that every consumer has
        // passed item_full's phase k - 1, and q_full's last phase is complete): item_full's phase k,
        // and the item's Q tile by TMA (none without key tiles, with pack-GQA, or when done).
        // (Two Q tiles: once they are done with round k - 2's.)
        const int b = q_buffer(k);
        hw::mbarrier_wait(bar(bars.q_empty[b]), static_cast<uint32_t>(q_phase(k) & 1) ^ 1);
        hw::mbarrier_arrive(bar(bars.item_full[b]));
        tl::mark(p.timeline, k, tl::kPublished);
        if (n_tiles > 0 && !p.pack_gqa) {
          hw::mbarrier_arrive_expect_tx(bar(bars.q_full[b]), QTile::kBytes);
#pragma unroll
          for (int cb = 0; cb < QTile::kColBlocks; ++cb)
            hw::tma_load(q_tile(k) + QTile::col_block_offset(cb), p.q_map, bar(bars.q_full[b]), hw::kSw128Cols * cb,
                         w.q_row0 + w.q_tile_row0, w.h, w.tma_batch);
          tl::mark(p.timeline, k, tl::kQIssued);
        } else if constexpr (kQStages > 1) {
          hw::mbarrier_arrive(bar(bars.q_full[b]));  // the round's phase, without a Q tile
        }
        if (done) break;
        if (kShareTails && w.shared_tail) {
          // K three tiles ahead of V. Tile i is one consumer's, whose turn comes every third: S(i) at
          // turn i of the ring, P(i) V(i) at turn i + 3. K(i + 3) takes K(i)'s slot (free once S(i)
          // is done) and V(i) takes V(i - 3)'s (free once P(i - 3) V(i - 3) is, issued at turn i), so
          // both can go at about turn i and land three turns before they are read; in the plain
          // order K(i + 1) would wait behind V(i), one turn before S(i + 1).
          for (int i = 1; i < kSharedTailConsumers && i < n_tiles; ++i)
            load_tile(w, bars.k_full, bars.k_empty, k_addr0, KTile::kBytes, p.k_map, i, tl::kKLoad);
          for (int i = 0; i < n_tiles; ++i) {
            if (i + kSharedTailConsumers < n_tiles)
              load_tile(w, bars.k_full, bars.k_empty, k_addr0, KTile::kBytes, p.k_map, i + kSharedTailConsumers,
                        tl::kKLoad);
            load_tile(w, bars.v_full, bars.v_empty, v_addr0, kVSlotBytes, p.v_map, i, tl::kVLoad);
          }
        } else {
          // Then per tile i: K(i) (K(0) above), K(i + 1) ahead (kKAhead), V(i).
          for (int i = 0; i < n_tiles; ++i) {
            if (i > 0 && !kKAhead) load_tile(w, bars.k_full, bars.k_empty, k_addr0, KTile::kBytes, p.k_map, i, tl::kKLoad);
            if (kKAhead && i + 1 < n_tiles)
              load_tile(w, bars.k_full, bars.k_empty, k_addr0, KTile::kBytes, p.k_map, i + 1, tl::kKLoad);
            load_tile(w, bars.v_full, bars.v_empty, v_addr0, kVSlotBytes, p.v_map, i, tl::kVLoad);
          }
        }
        g += n_tiles;
      }
    }
    return;
  }

  // ---- Consumers ----------------------------------------------------------------------------------
  hw::setmaxnreg_inc<kTiles.consumer_registers>();
  const float score_scale_log2 = kSoftcap ? cuda::kLog2e : p.scale_log2;  // softcap's scores are final logits
  Progress<kStages> progress;

  // Round k's item, as the producer published it (ItemInfo): read from shared memory where used.
  const auto info = [&](int k) -> const Info& { return items[k & 3]; };
  const auto release_q_loaded = [&] { hw::mbarrier_arrive(bar(bars.q_empty[q_buffer(progress.k())])); };

  for (;;) {
    tl::mark(p.timeline, progress.k(), tl::kTop);
    hw::mbarrier_wait(bar(bars.item_full[q_buffer(progress.k())]), static_cast<uint32_t>(q_phase(progress.k()) & 1));
    tl::mark(p.timeline, progress.k(), tl::kItem);
    const Info& item = info(progress.k());
    if (warp_uniform(item.segment.item) >= p.num_items) break;
    const WorkTile& w = item.w;
    const int n_tiles = warp_uniform(w.tile_count());
    // A shared tail (tile_scheduler.cuh): every consumer computes the tile's first 64 rows, from the
    // Q tile's first slice, over every third of the item's K/V tiles (tile_of).
    const bool shared = kShareTails && warp_uniform(w.shared_tail ? 1 : 0) != 0;
    // Without a Q tile by TMA (no key tiles, or pack-GQA: the consumers copy Q), q_empty's phase k
    // only frees the ItemInfo slot of round k - 1 (read in its epilogue, which is done).
    if (n_tiles == 0 || p.pack_gqa) release_q_loaded();
    if (w.empty()) {  // varlen: the sequence ends before this tile
      progress.next_item(0);
      continue;
    }
    const ConsumerThread me = consumer_thread();
    const int c = me.c, lane = me.lane;
    const int g_row = lane / 4, quad_lane = lane % 4;
    const int slice_row0 = shared ? 0 : c * kRows;  // of the item's rows at the Q tile's row 0
    const int warp_row0 = slice_row0 + 16 * me.warp;  // of the Q tile
    const uint32_t q_round = q_tile(progress.k());                    // the round's Q tile
    uint8_t* q_smem = smem_raw + (q_round - raw);
    const uint32_t q_slice = q_round + slice_row0 * hw::kSw128Bytes;  // its rows of every column block
    const GemmTurns<kTiles.consumers, kTiles.pingpong> turns{c};
    const int row0 = w.q_tile_row0 + warp_row0 + g_row;  // this thread's queries: row0 and row0 + 8

    float o[kOAcc];
    // 1 / l and lse per row; an item without key tiles: O = 0 (not staged), lse = -inf.
    float inv_l[2] = {0.0f, 0.0f}, lse[2] = {-INFINITY, -INFINITY};

    // The parts of one tile, by its K/V tile number g of the block: the item's tiles are g_begin ..
    // g_end - 1, g holding key tile n = n_top - g (the walk goes from the last visible one down).
    // A shared tail's consumer c walks its share the same way, g_begin .. g_begin + T_c - 1
    // (shared_walk_tiles), g standing for the block's K/V tile tile_of(g) = g_begin + c + 3 (g -
    // g_begin) and key tile key_of(g) = n_top - tile_of(g): the waits, releases, GEMMs and masks read
    // those.
    const int walk_tiles = shared ? shared_walk_tiles(n_tiles, c) : n_tiles;
    const int g_begin = progress.tiles(), g_end = g_begin + walk_tiles,
              n_top = warp_uniform(w.tiles.n_end) - 1 + g_begin;
    const int g_mul = shared ? kSharedTailConsumers : 1, g_add = shared ? c - (kSharedTailConsumers - 1) * g_begin : 0;
    const auto tile_of = [&](int g) { return g_mul * g + g_add; };
    const auto key_of = [&](int g) { return n_top - tile_of(g); };
    // Timeline builds: event (timeline.cuh's Phase) of tile g's phase.
    const auto mark_phase = [&](int g, int event) {
      tl::mark(p.timeline, progress.k(), tl::phase_slot(g - g_begin, event));
    };
    // This consumer's own rows (its 64-row slice, those of the item) decide what it computes: the
    // walk's first tiles, which lie above the slice's diagonal (the causal band of a 192-row tile
    // spans 2-3 key tiles, a 64-row slice's 1-2) or past its rows' right window edge, it skips:
    // g_begin .. g_first - 1 (all of them when the slice sees no key or holds no row of the item).
    // Of the rest, the tiles its rows all see whole skip the per-element mask: one run of the walk,
    // g_whole_begin .. g_whole_end - 1 (none: both g_end). The tiles before it hold the diagonal,
    // the right window edge and the end of the sequence (varlen tail boxes too), those after it the
    // left window edge.
    const SliceTiles& mine = item.slices[c];
    const int g_first = warp_uniform(mine.seen.count() > 0 ? n_top + 1 - mine.seen.n_end : g_end);
    int g_whole_begin = warp_uniform(mine.whole.count() > 0 ? n_top + 1 - mine.whole.n_end : g_end);
    int g_whole_end = warp_uniform(mine.whole.count() > 0 ? n_top + 1 - mine.whole.n_begin : g_end);
    if (shared && mine.whole.count() > 0) {
      // Without a band every tile is seen (g_first = g_begin); the share's key tiles fall by 3 a step,
      // so the whole ones [n_begin, n_end) are those after the first at_or_above(n_end) and within
      // the first at_or_above(n_begin). (The walk starts at tile 0's key: tiles.n_begin = 0.)
      const int n_end = warp_uniform(w.tiles.n_end);
      g_whole_begin = g_begin + shared_walk_at_or_above(n_end, c, warp_uniform(mine.whole.n_end));
      g_whole_end = g_begin + shared_walk_at_or_above(n_end, c, warp_uniform(mine.whole.n_begin));
    }
    const auto masked = [&](int g) { return g < g_whole_begin || g >= g_whole_end; };
    const auto wait_k = [&](int g) { hw::mbarrier_wait(bar(bars.k_full[slot_of(tile_of(g))]), parity_of(tile_of(g))); };
    const auto wait_v = [&](int g) { hw::mbarrier_wait(bar(bars.v_full[slot_of(tile_of(g))]), parity_of(tile_of(g))); };
    // A slot frees once every consumer has released it. A shared tail's consumer never sees the
    // others' tiles, and releases its own for all of them at once (an arrival counting kConsumers).
    const auto release = [&](uint64_t& empty) {
      if (shared)
        hw::mbarrier_arrive(bar(empty), kTiles.consumers);
      else
        hw::mbarrier_arrive(bar(empty));
    };
    const auto release_k = [&](int g) { release(bars.k_empty[slot_of(tile_of(g))]); };
    const auto release_v = [&](int g) { release(bars.v_empty[slot_of(tile_of(g))]); };
    // Once the item's last S is done, the Q tile is free for the next item's TMA load (wgmma read
    // it through the async proxy, which the load writes through; pack-GQA: released above). With
    // Q in registers it is free once they are loaded (release_q_loaded), and the item's last S
    // releases nothing. A shared tail's consumers merge their states through the Q tile, and release
    // it after that.
    const auto release_q = [&] {
      if (!kQRegs && !p.pack_gqa && !shared) release_q_loaded();
    };
    uint32_t qa[kQRegs ? kHeadDim / 16 : 1][4];  // Q's A operand (kQRegs), from the Q tile each item
    // S = Q K(g)ᵀ (first 2 kAcc keys: all, or a narrow S's), issued and committed as one group;
    // s belongs to the tensor cores until a wait retires the group (then wgmma_fence_operand(s), and
    // with Q from registers keep_alive(qa)).
    const auto score = [&](auto& s, int g) {
      if constexpr (kQRegs)
        score_gemm<T, kHeadDim, KTile>(s, qa, k_slot(slot_of(tile_of(g))));
      else
        score_gemm<T, kHeadDim, QTile, KTile>(s, q_slice, k_slot(slot_of(tile_of(g))));
    };
    const auto s_retired = [&] {
      if constexpr (kQRegs) keep_alive(qa);
    };
    // A narrow first tile g's width in kNarrowKeys: the fewest that hold every key the slice sees
    // there (its keys_hi > the tile's first key: the slice sees one of its keys; with_width takes 1
    // for less). The item's ItemInfo `round` is read afresh where the caller keeps none of it in
    // registers.
    const auto width_of = [&](int g, const Info& round, const SliceTiles& slice) {
      return warp_uniform((slice.keys_hi - round.w.key_tile_start<kBlockN>(key_of(g)) + kNarrowKeys - 1) /
                          max(kNarrowKeys, 1));
    };
    // O += P V(g), one group; pa (P) and o belong to the tensor cores until a wait retires it (then
    // wgmma_fence_operand(o) and keep_alive(pa)). Narrow (after a narrow S): its width's key steps.
    const auto issue_pv = [&](float(&acc)[kOAcc], const uint32_t(&pa)[kPSteps][4], int g, bool narrow) {
      if constexpr (kNarrowWidths > 0) {
        if (narrow) {
          const auto narrow_pv = [&](auto width) {
            value_gemm<T, VTile, decltype(width)::value * kNarrowKeys / 16, kOnesAtom>(acc, pa, v_slot(slot_of(tile_of(g))),
                                                                                      ones_addr);
          };
          if constexpr (kNarrowWidths == 1) {
            narrow_pv(std::integral_constant<int, 1>{});
          } else {
            const Info& round = info(opaque(progress.k()));
            with_width<kNarrowWidths>(width_of(g, round, round.slices[consumer_thread().c]), narrow_pv);
          }
          return;
        }
      }
      value_gemm<T, VTile, kPSteps, kOnesAtom>(acc, pa, v_slot(slot_of(tile_of(g))), ones_addr);
    };
    // Scores of tile g (s: the whole tile, or a narrow S's keys) -> final logits (softcap) -> masked
    // if `mask` (masked(g), or a constant where the phase is known to need the mask or not).
    const auto modify = [&](auto& s, int g, bool mask) {
      modify_scores<kSoftcap, kBlockN>(s, p, w, row0, key_of(g), quad_lane, mask);
    };

    if (n_tiles > 0) {
      if (p.pack_gqa) {
        // Each warp copies its 16 rows of the Q tile, once every warp of its warpgroup is past the
        // previous item's S GEMMs (which read those rows; the warpgroup meets first); then every
        // thread's stores are made visible to the async proxy (wgmma reads Q through it) and the
        // warpgroup meets again before its first S.
        hw::named_barrier_sync(static_cast<int>(NamedBarrier::kConsumerEpilogue) + c, hw::kWarpgroupThreads);
        copy_packed_q<kHeadDim, QTile, T>(p, w, q_smem, warp_row0, lane);
        hw::fence_proxy_async_shared();
        hw::named_barrier_sync(static_cast<int>(NamedBarrier::kConsumerEpilogue) + c, hw::kWarpgroupThreads);
      } else {
        hw::mbarrier_wait(bar(bars.q_full[q_buffer(progress.k())]),
                          kQStages == 1 ? progress.q_parity() : static_cast<uint32_t>(q_phase(progress.k()) & 1));
        tl::mark(p.timeline, progress.k(), tl::kQFull);
      }
      if constexpr (kQRegs) {
        load_q_operand<kHeadDim, QTile>(qa, q_round, warp_row0, lane);
        if (!p.pack_gqa) release_q_loaded();
        tl::mark(p.timeline, progress.k(), tl::kQLoaded);
      }
#pragma unroll
      for (int x = 0; x < kOAcc; ++x) o[x] = 0.0f;
      Softmax softmax;
      softmax.init();
      if constexpr (!kTiles.pingpong && !kTiles.overlap) {
        // Step 1: one GEMM at a time; the tiles before g_first waited for and released unread (a
        // slot frees once every consumer has released it, and is refilled only after).
        for (int g = g_begin; g < g_end; ++g) {
          if (g < g_first) {
            wait_k(g);
            release_k(g);
            if (g == g_end - 1) release_q();
            wait_v(g);
            release_v(g);
            continue;
          }
          float s[kS];
          wait_k(g);
          score(s, g);
          hw::wgmma_wait<0>();
          hw::wgmma_fence_operand(s);
          s_retired();
          release_k(g);
          if (g == g_end - 1) release_q();

          modify(s, g, masked(g));
          softmax.update(s, o, score_scale_log2);
          uint32_t pa[kPSteps][4];
          pack_p<T>(pa, s);

          wait_v(g);
          issue_pv(o, pa, g, false);
          hw::wgmma_wait<0>();
          hw::wgmma_fence_operand(o);
          keep_alive(pa);
          release_v(g);
        }
      } else {
        // Steps 2-3: phases 0 .. N (N = n_tiles), phase i issuing S(i) (i < N) and O += P(i-1) V(i-1)
        // (i > 0); the item's tile i is the block's K/V tile g = g_begin + i. Every consumer runs
        // all N + 1 phases (the turns' ring counts them): before g_first a phase issues nothing; it
        // takes and passes the turn and releases its tiles once they have landed (a slot frees
        // once every consumer has released it, and is refilled only after).
        uint32_t pa[kPSteps][4];  // P(g-1), from phase g-1 to phase g
        float alpha[2];           // alpha(g-1): o's rescaling before P(g-1) V(g-1) is added

        for (int g = g_begin; g < g_first; ++g) {  // phases that skip S(g) (and hold no P(g-1))
          wait_k(g);
          if (g > g_begin) wait_v(g - 1);
          turns.take(/*block_first_phase=*/g == g_begin && !progress.started());
          turns.pass();
          release_k(g);
          if (g > g_begin) release_v(g - 1);
        }
        if (g_first == g_end) {  // Phase N alone: V(N-1), unread.
          release_q();
          wait_v(g_end - 1);
          turns.take(false);
          turns.pass();
          release_v(g_end - 1);
        } else {
          // Narrow: the slice sees only the first tile's first kNarrowKeys x width keys, width <=
          // kNarrowWidths (the causal diagonal of a d = 64 slice whose rows start at a multiple of
          // 128, the sequence's end in a d = 128 tile of 80 keys; decided at run time), so S(g_first)
          // is a 64 x kNarrowKeys width GEMM, and P(g_first) V(g_first) takes those key steps alone.
          const bool narrow =
              kNarrowWidths > 0 &&
              warp_uniform(mine.keys_hi <= w.key_tile_start<kBlockN>(key_of(g_first)) + kNarrowWidths * kNarrowKeys);
          const int g_narrow = narrow ? g_first : -1;  // P(g) V(g) takes the narrow width's key steps
          // Phase g_first - g_begin: S(g_first) alone.
          wait_k(g_first);
          if (g_first > g_begin) wait_v(g_first - 1);
          turns.take(/*block_first_phase=*/g_first == g_begin && !progress.started());
          tl::mark(p.timeline, progress.k(), tl::kFirstTake);
          // S(g_first) into acc (the whole tile's s, or a narrow S's keys), then the phase's releases.
          const auto first_gemm = [&](auto& acc) {
            score(acc, g_first);
            turns.pass();
            hw::wgmma_wait<0>();
            tl::mark(p.timeline, progress.k(), tl::kFirstWait);
            hw::wgmma_fence_operand(acc);
            s_retired();
            release_k(g_first);
            if (g_first > g_begin) release_v(g_first - 1);
          };
          // s: the whole tile, or a narrow S's keys (masked: the slice may see fewer of them).
          const auto first_softmax = [&](auto& s, bool mask) {
            modify(s, g_first, mask);
            softmax.template update</*kFirst=*/true>(s, score_scale_log2, alpha);
            pack_p<T>(pa, s);
            tl::mark(p.timeline, progress.k(), tl::kFirstSoft);
          };
          if constexpr (kNarrowWidths == 1) {
            // One narrow width: its S has a softmax of its own, over its keys alone.
            if (narrow) {
              float s[kNarrowKeys / 2];
              first_gemm(s);
              first_softmax(s, true);
            } else {
              float s[kS];
              const bool mask = masked(g_first);
              first_gemm(s);
              first_softmax(s, mask);
            }
          } else {
            // Several (or none): a narrow S takes the whole tile's softmax, its keys past the width at
            // -inf (P = 0 there, and P V reads only the width's key steps), so that the code holds
            // one softmax rather than one per width.
            float s[kS];
            const bool mask = narrow || masked(g_first);
            if constexpr (kNarrowWidths > 1) {
              if (narrow) {
                with_width<kNarrowWidths>(width_of(g_first, item, mine), [&](auto width) {
                  float t[decltype(width)::value * kNarrowKeys / 2];
                  first_gemm(t);
#pragma unroll
                  for (int x = 0; x < kS; ++x) s[x] = x < decltype(width)::value * kNarrowKeys / 2 ? t[x] : -INFINITY;
                });
              } else {
                first_gemm(s);
              }
            } else {
              first_gemm(s);
            }
            first_softmax(s, mask);
          }
          // Phase g - g_begin (0 < g - g_begin < N): S(g) and O += P(g-1) V(g-1), then the softmax of
          // S(g). `mask`: std::true_type or std::false_type (the phase does or does not need the mask,
          // known at compile time), or masked(g).
          const auto phase = [&](int g, auto mask) {
            float s[kS];
            wait_k(g);
            mark_phase(g, tl::kKReady);
            wait_v(g - 1);
            mark_phase(g, tl::kVReady);
            turns.take(false);
            mark_phase(g, tl::kTake);
            score(s, g);
            softmax.rescale(o, alpha);
            issue_pv(o, pa, g - 1, g - 1 == g_narrow);
            turns.pass();
            mark_phase(g, tl::kPassed);
            // Masked phases wait for both GEMMs: the mask's registers on top of a second S tile cost
            // more than the overlap gains (docs/perf.md, 2026-12-02).
            if constexpr (kOverlap && std::is_same_v<decltype(mask), std::false_type>) {
              hw::wgmma_wait<1>();  // S(g) done; P(g-1) V(g-1) may still run
              mark_phase(g, tl::kWait1);
              hw::wgmma_fence_operand(s);
              s_retired();
              release_k(g);
              modify(s, g, mask);
              softmax.template update</*kFirst=*/false, kPolyShare>(s, score_scale_log2, alpha);
              // The row maxima and exponentials run under P(g-1) V(g-1) only if the wait stays
              // here: ptxas would otherwise move it up to the top of the block, above them.
              if constexpr (kExpUnderPv) end_basic_block(g);
              hw::wgmma_wait<0>();
              mark_phase(g, tl::kWait0);
              hw::wgmma_fence_operand(o);
              keep_alive(pa);
              release_v(g - 1);
            } else {
              hw::wgmma_wait<0>();
              mark_phase(g, tl::kWait0);
              hw::wgmma_fence_operand(s);
              hw::wgmma_fence_operand(o);
              keep_alive(pa);
              s_retired();
              release_k(g);
              release_v(g - 1);
              modify(s, g, mask);
              softmax.update(s, score_scale_log2, alpha);
            }
            pack_p<T>(pa, s);
            mark_phase(g, tl::kPacked);
          };
          if constexpr (kOverlap) {
            // In runs of phases that all mask or all do not: masked up to u0, unmasked up to u1,
            // masked again up to g_end (u0 = u1 when no tile after the first is seen whole).
            const int u0 = max(g_whole_begin, g_first + 1), u1 = max(g_whole_end, u0);
            int g = g_first + 1;
            for (int masked_end = u0;; masked_end = g_end) {
              for (; g < masked_end; ++g) phase(g, std::true_type{});
              if (masked_end == g_end) break;
              for (; g < u1; ++g) phase(g, std::false_type{});
            }
          } else {
            for (int g = g_first + 1; g < g_end; ++g) phase(g, masked(g));
          }
          // Phase N: P(N-1) V(N-1) alone (narrow when S(N-1) was a narrow S(g_first)). S(N-1) is done:
          // Q is free (released here rather than in the last phase, which would cost a test in every
          // phase and, at d = 256, registers).
          release_q();
          wait_v(g_end - 1);
          turns.take(false);
          tl::mark(p.timeline, progress.k(), tl::kLastTake);
          softmax.rescale(o, alpha);
          issue_pv(o, pa, g_end - 1, g_end - 1 == g_narrow);
          turns.pass();
          hw::wgmma_wait<0>();
          tl::mark(p.timeline, progress.k(), tl::kLastWait);
          hw::wgmma_fence_operand(o);
          keep_alive(pa);
          release_v(g_end - 1);
        }
      }
      // A shared tail: consumer c's share has T_c + 1 phases, and the ring of turns needs every
      // consumer to take as many in an item: a share one tile shorter than consumer 0's takes one more
      // turn, empty.
      if (shared && walk_tiles < shared_walk_tiles(n_tiles, 0)) {
        turns.take(false);
        turns.pass();
      }
      // Row sums by P V: l from o's ones columns (each lane of a quad holds its rows' whole sums).
      if constexpr (kRowSums) softmax.take_row_sums(o[acc_index(kO / 4, 0, 0)], o[acc_index(kO / 4, 1, 0)]);
      // A part of a split item (the split tail): merged with the other part's state, or handed to
      // it (then nothing to store; o's first kO accumulators, l being the softmax's). The segment is
      // read again from the round's ItemInfo.
      if (p.split_round != ForwardKernelParams::kNoSplit) {
        const Segment& part = info(opaque(progress.k())).segment;
        if (warp_uniform(part.part())) {
          const ConsumerThread t = consumer_thread();
          if (!merge_split_parts<kTiles.consumers, kO>(p, part.boundary, t.c, t.warp, t.lane, o, softmax,
                                                       score_scale_log2)) {
            progress.next_item(part.walk_end - part.walk_begin);  // its tiles (every item sees all T)
            continue;
          }
        }
      }
      // A shared tail: the three states merge into consumer 0's, which alone stores.
      if (shared)
        merge_shared_tail<kO>(q_smem, o, softmax, score_scale_log2, release_q_loaded,
                              static_cast<int>(NamedBarrier::kSharedTailMeets));
      softmax.finalize(kSoftcap ? 1.0f : p.scale, p.maybe_lse != nullptr, inv_l, lse);
      tl::mark(p.timeline, progress.k(), tl::kFinal);
    }

    // ---- Epilogue: O / l and lse -------------------------------------------------------------------
    // Straight from the accumulators to global memory: the Q tile may already hold the next item's
    // Q. O / l is packed to T first (half the registers of o), and the item resolved after that.
    // Thread (g, quad) of a warp holds rows g and g + 8 of the warp's 16, columns 8 j + 2 quad and
    // + 1 of every 8-column group j; a 4 x 4 transpose within the quad (cuda::transpose_quad) gives
    // each thread whole groups instead, so that a warp's store covers 64 contiguous bytes of 8 rows.
    // An item without key tiles (o never written) stores zeros.
    static_assert(kO % 16 == 0, "the epilogue transposes four 8-column groups at a time (head dim % 32 == 0)");
    uint32_t o_packed[2][kO / 4];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < kO / 4; ++j)
        o_packed[r][j] = n_tiles > 0 ? cuda::MmaType<T>::pack(o[acc_index(j, r, 0)] * inv_l[r],
                                                              o[acc_index(j, r, 1)] * inv_l[r])
                                     : 0u;
    const int e_lane = opaque(lane), e_warp_row0 = opaque(warp_row0);
    const int e_g = e_lane / 4, e_quad = e_lane % 4;

    // The item's rows and addresses, read again from the round's ItemInfo rather than kept in
    // registers over the main loop.
    const WorkTile& e = info(opaque(progress.k())).w;
    // The warp's rows are warp_r0 .. warp_r0 + 15 of the item's row space, those of the item stored
    // only; a row's place is (query, head) = (row, e.h), or under pack-GQA (row / group, e.h + row %
    // group).
    const int warp_r0 = e.q_tile_row0 + e_warp_row0;
    // A shared tail's rows are consumer 0's to store (its state the merged one).
    const int e_b = e.b, e_h = e.h;
    const int e_r1 = kShareTails && e.shared_tail && consumer_thread().c > 0 ? e.r0 : e.r1;
    const auto query_head = [&](int row) {
      const int query = p.pack_gqa ? row / p.group : row;
      return int2{query, e_h + (row - (p.pack_gqa ? query * p.group : row))};
    };
    T* out = static_cast<T*>(p.o) + e_b * p.o_batch_stride + int64_t{e.q_row0} * p.o_row_stride;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int item_row = warp_r0 + e_g + 8 * r;
      const int2 qh = query_head(item_row);
      T* out_row = out + int64_t{qh.x} * p.o_row_stride + int64_t{qh.y} * p.o_head_stride + 8 * e_quad;
#pragma unroll
      for (int j4 = 0; j4 < kO / 16; ++j4) {  // groups 4 j4 .. 4 j4 + 3; this thread stores 4 j4 + quad
        const uint4 group = cuda::transpose_quad(&o_packed[r][4 * j4], e_quad);
        if (item_row >= e.r0 && item_row < e_r1 && 8 * (4 * j4 + e_quad) < p.head_dim)
          *reinterpret_cast<uint4*>(out_row + 32 * j4) = group;
      }
    }
    if (p.maybe_lse != nullptr && e_quad == 0) {
      float* lse_rows = p.maybe_lse + e_b * p.lse_batch_stride + e.q_row0;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int item_row = warp_r0 + e_g + 8 * r;
        if (item_row >= e.r0 && item_row < e_r1) {
          const int2 qh = query_head(item_row);
          lse_rows[qh.y * p.lse_head_stride + qh.x] = lse[r];
        }
      }
    }
    tl::mark(p.timeline, progress.k(), tl::kStored);
    // n_tiles, not kept in a register over the epilogue.
    progress.next_item(e.tile_count());
  }
  const GemmTurns<kTiles.consumers, kTiles.pingpong> turns{consumer_thread().c};
  turns.finish(/*any_phase=*/progress.started());
}

}  // namespace flashattn::detail::sm90
