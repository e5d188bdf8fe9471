// The Hopper forward (sm_90a), FlashAttention-3's warp-specialised design, steps 1-3 of
// docs/hopper_forward.md. One block owns Br = 64 C query rows of one (batch, head):
//
//   producer warpgroup (one thread):  Q once, then K(n), V(n) for the visible key tiles, last to
//       first (the tiles that need the per-element mask come first), into `stages` K and V slots;
//       full[slot] completes when a tile's bytes land (expect_tx), empty[slot] when every consumer
//       thread has finished reading it.
//   consumer warpgroup c (C of them, 64 rows each):  per tile, S = Q Kᵀ (wgmma from shared memory),
//       release K, mask, online softmax in registers on the accumulator layout, O += P V with P from
//       registers (wgmma_rs, V read MN-major), release V; then O / l and lse, written through the
//       consumer's own rows of the Q tile with 16-byte stores, rows past seqlen_q not written.
//
// The consumers' schedule is the policy's (policy.hpp). Step 1 (serial): S(j), wait, softmax, P V,
// wait. Steps 2-3 (pipelined): in phases; phase j issues S(j) and O += P(j-1) V(j-1) together (the
// first phase S(0) alone, the last P(N-1) V(N-1) alone), then computes the softmax of S(j):
//   overlap   after wgmma_wait<1> (S(j) done, P(j-1) V(j-1) still running), else after wait<0>;
//   pingpong  phases are issued in turns, consumer 0, 1, ..., C-1, 0, ... (GemmTurns below).
// o *= alpha(j-1) happens just before O += P(j-1) V(j-1) is issued, when o is not in flight.
//
// Slot protocol: tile number i (0, 1, ... in issue order) uses slot i % stages in round
// i / stages; consumers wait full with parity round & 1; the producer waits empty with parity
// (round & 1) ^ 1, which passes at once in round 0 (mbarrier.cuh).
//
// kSoftcap: the variant with softcap (scores become final logits before the softmax, which then
// scales by log2 e alone), launched only when softcap > 0.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/primitives/ldmatrix.cuh"  // smem_address
#include "cuda/primitives/math.cuh"
#include "cuda/primitives/mma.cuh"
#include "cuda/primitives/sm90/mbarrier.cuh"
#include "cuda/primitives/sm90/sw128_tile.cuh"
#include "cuda/primitives/sm90/tma.cuh"
#include "cuda/primitives/sm90/warpgroup.cuh"
#include "cuda/primitives/sm90/wgmma.cuh"
#include "cuda/sm80/mask.cuh"
#include "cuda/sm80/score_mods.cuh"  // ScoreMods::capped, sm80's softcap formula
#include "cuda/sm90/kernel_params.hpp"
#include "cuda/sm90/policy.hpp"
#include "cuda/sm90/softmax.cuh"

namespace flashattn::detail::sm90 {

namespace hw = cuda::sm90;

// Named barriers (0 is __syncthreads), one of each kind per consumer c: id kind + c.
enum class NamedBarrier : int {
  kConsumerEpilogue = 1,                                   // the consumer's 128 threads
  kGemmTurn = kConsumerEpilogue + ForwardTiles::kMaxConsumers,  // the consumer and its predecessor
};
static_assert(static_cast<int>(NamedBarrier::kGemmTurn) + ForwardTiles::kMaxConsumers <= 16, "16 named barriers");

// Ping-pong (step 2): the consumers issue their GEMM phases in a ring, 0, 1, ..., C-1, 0, ...
// Consumer c waits for its turn on barrier kGemmTurn + c (bar.sync) and, once its GEMMs are issued,
// hands the turn to c + 1 (bar.arrive on kGemmTurn + (c + 1) % C); each use of a barrier counts
// 2 x 128 threads, the waiting consumer's and the arriving one's. Every consumer runs the same
// number of phases (the tile range is the block's), so for the arrivals on each barrier to match
// its waits exactly, consumer 0 does not wait for its first phase (it starts the ring) and consumer
// C-1 does not hand over after its last one (nobody waits for it). A barrier never holds arrivals
// of two phases: a hand-over follows its sender's own turn, which the ring places after the
// receiver's previous turn. kEnabled = false: no barriers at all.
template <int kConsumers, bool kEnabled>
struct GemmTurns {
  static constexpr int kThreads = 2 * hw::kWarpgroupThreads;
  int c;

  __device__ __forceinline__ void take(bool first_phase) const {
    if constexpr (kEnabled)
      if (!(first_phase && c == 0)) hw::named_barrier_sync(static_cast<int>(NamedBarrier::kGemmTurn) + c, kThreads);
  }
  __device__ __forceinline__ void pass(bool last_phase) const {
    if constexpr (kEnabled)
      if (!(last_phase && c == kConsumers - 1))
        hw::named_barrier_arrive(static_cast<int>(NamedBarrier::kGemmTurn) + (c + 1) % kConsumers, kThreads);
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

// The block's mbarriers.
template <int kStages>
struct Barriers {
  uint64_t q_full;
  uint64_t k_full[kStages], k_empty[kStages];
  uint64_t v_full[kStages], v_empty[kStages];
};

// Which key tiles the block's rows see: [n_begin, n_end), walked from n_end - 1 down.
struct TileRange {
  int n_begin, n_end;
  __device__ __forceinline__ int count() const { return n_end > n_begin ? n_end - n_begin : 0; }
};

template <int kHeadDim, class T, bool kSoftcap>
__global__ void __launch_bounds__(ForwardPolicy<kHeadDim>::kTiles.threads(), 1)
    forward_kernel(const __grid_constant__ ForwardKernelParams p) {
  constexpr ForwardTiles kTiles = ForwardPolicy<kHeadDim>::kTiles;
  constexpr int kBlockM = kTiles.block_m(), kBlockN = kTiles.block_n, kStages = kTiles.stages;
  constexpr int kRows = ForwardTiles::kRowsPerConsumer;
  using QTile = hw::Sw128Tile<kBlockM, kHeadDim>;
  using KTile = hw::Sw128Tile<kBlockN, kHeadDim>;
  using VTile = hw::Sw128Tile<kBlockN, kHeadDim>;
  static_assert(QTile::kBytes == kTiles.q_bytes() && KTile::kBytes == kTiles.kv_tile_bytes());
  constexpr int kS = kBlockN / 2;   // S accumulators per thread
  constexpr int kO = kHeadDim / 2;  // O accumulators per thread
  constexpr int kPSteps = kBlockN / 16;

  extern __shared__ uint8_t smem_raw[];
  __shared__ alignas(8) Barriers<kStages> bars;
  const uint32_t raw = cuda::smem_address(smem_raw);
  const uint32_t q_addr = (raw + ForwardTiles::kAlignment - 1) / ForwardTiles::kAlignment * ForwardTiles::kAlignment;
  const uint32_t k_addr0 = q_addr + QTile::kBytes;
  const uint32_t v_addr0 = k_addr0 + kStages * KTile::kBytes;
  const auto k_slot = [&](int slot) { return k_addr0 + slot * KTile::kBytes; };
  const auto v_slot = [&](int slot) { return v_addr0 + slot * VTile::kBytes; };
  const auto bar = [](uint64_t& b) { return cuda::smem_address(&b); };

  // Heaviest blocks (last rows: most keys under causal masking) launch first.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, h_kv = h / p.group;
  const int i0 = m_block * kBlockM;
  const int i1 = min(i0 + kBlockM, p.seqlen_q);
  const sm80::Band band{p.seqlen_k, p.bottom_right ? p.seqlen_k - p.seqlen_q : 0, p.window_left, p.window_right};
  const sm80::KeyRange keys = band.visible_keys(i0, i1);
  const TileRange tiles{keys.lo / kBlockN, (keys.hi + kBlockN - 1) / kBlockN};
  const int n_tiles = tiles.count();

  if (threadIdx.x == 0) {
    hw::mbarrier_init(bar(bars.q_full), 1);
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      hw::mbarrier_init(bar(bars.k_full[s]), 1);  // the producer's expect_tx
      hw::mbarrier_init(bar(bars.v_full[s]), 1);
      hw::mbarrier_init(bar(bars.k_empty[s]), kTiles.consumers * hw::kWarpgroupThreads);  // every consumer thread
      hw::mbarrier_init(bar(bars.v_empty[s]), kTiles.consumers * hw::kWarpgroupThreads);
    }
    hw::fence_mbarrier_init();
  }
  __syncthreads();

  const int wg = hw::warpgroup_index();
  if (wg == 0) {
    // ---- Producer -------------------------------------------------------------------------------
    hw::setmaxnreg_dec<kTiles.producer_registers>();
    if (threadIdx.x == 0 && n_tiles > 0) {
      hw::tma_prefetch_descriptor(p.q_map);
      hw::tma_prefetch_descriptor(p.k_map);
      hw::tma_prefetch_descriptor(p.v_map);
      hw::mbarrier_arrive_expect_tx(bar(bars.q_full), QTile::kBytes);
#pragma unroll
      for (int cb = 0; cb < QTile::kColBlocks; ++cb)
        hw::tma_load(q_addr + QTile::col_block_offset(cb), p.q_map, bar(bars.q_full), hw::kSw128Cols * cb, i0, h, b);
      for (int i = 0; i < n_tiles; ++i) {
        const int n = tiles.n_end - 1 - i, slot = i % kStages;
        const uint32_t empty_parity = ((i / kStages) & 1) ^ 1;
        hw::mbarrier_wait(bar(bars.k_empty[slot]), empty_parity);
        hw::mbarrier_arrive_expect_tx(bar(bars.k_full[slot]), KTile::kBytes);
#pragma unroll
        for (int cb = 0; cb < KTile::kColBlocks; ++cb)
          hw::tma_load(k_slot(slot) + KTile::col_block_offset(cb), p.k_map, bar(bars.k_full[slot]), hw::kSw128Cols * cb,
                       n * kBlockN, h_kv, b);
        hw::mbarrier_wait(bar(bars.v_empty[slot]), empty_parity);
        hw::mbarrier_arrive_expect_tx(bar(bars.v_full[slot]), VTile::kBytes);
#pragma unroll
        for (int cb = 0; cb < VTile::kColBlocks; ++cb)
          hw::tma_load(v_slot(slot) + VTile::col_block_offset(cb), p.v_map, bar(bars.v_full[slot]), hw::kSw128Cols * cb,
                       n * kBlockN, h_kv, b);
      }
    }
    return;
  }

  // ---- Consumers ----------------------------------------------------------------------------------
  hw::setmaxnreg_inc<kTiles.consumer_registers>();
  const int c = wg - 1;
  const int t = hw::warpgroup_thread(), warp = hw::warpgroup_warp(), lane = t % 32;
  const int g = lane / 4, quad_lane = lane % 4;
  const int slice_row0 = c * kRows;                    // of the block
  const int row0 = i0 + slice_row0 + 16 * warp + g;    // this thread's rows: row0 and row0 + 8
  const uint32_t q_slice = q_addr + slice_row0 * hw::kSw128Bytes;  // rows 64 c.. of every column block
  // Tiles that every row of the block sees whole skip the per-element mask.
  const sm80::KeyRange full = band.keys_seen_by_all(i0, i1);
  const float score_scale_log2 = kSoftcap ? cuda::kLog2e : p.scale_log2;  // softcap's scores are final logits
  [[maybe_unused]] const float softcap_to_exp2 = kSoftcap ? p.scale / p.softcap * 2.0f * cuda::kLog2e : 0.0f;

  float o[kO];
#pragma unroll
  for (int x = 0; x < kO; ++x) o[x] = 0.0f;
  OnlineSoftmax softmax;
  softmax.init();

  // The parts of one tile, by its number i in issue order (key tile n = n_end - 1 - i, slot
  // i % stages, full in round i / stages).
  const auto slot_of = [](int i) { return i % kStages; };
  const auto parity_of = [](int i) { return static_cast<uint32_t>((i / kStages) & 1); };
  const auto wait_k = [&](int i) { hw::mbarrier_wait(bar(bars.k_full[slot_of(i)]), parity_of(i)); };
  const auto wait_v = [&](int i) { hw::mbarrier_wait(bar(bars.v_full[slot_of(i)]), parity_of(i)); };
  const auto release_k = [&](int i) { hw::mbarrier_arrive(bar(bars.k_empty[slot_of(i)])); };
  const auto release_v = [&](int i) { hw::mbarrier_arrive(bar(bars.v_empty[slot_of(i)])); };
  // S = Q K(i)ᵀ, issued and committed as one group; s belongs to the tensor cores until a wait
  // retires the group (then wgmma_fence_operand(s)).
  const auto issue_s = [&](float(&s)[kS], int i) {
    hw::wgmma_fence();
#pragma unroll
    for (int k16 = 0; k16 < kHeadDim / 16; ++k16)
      hw::wgmma_ss<T>(s, hw::k_major_descriptor<QTile>(q_slice, k16),
                      hw::k_major_descriptor<KTile>(k_slot(slot_of(i)), k16), k16 > 0);
    hw::wgmma_commit();
    hw::wgmma_fence_operand(s);
  };
  // O += P V(i), one group; pa (P) and o belong to the tensor cores until a wait retires it (then
  // wgmma_fence_operand(o) and keep_alive(pa)).
  const auto issue_pv = [&](float(&acc)[kO], const uint32_t(&pa)[kPSteps][4], int i) {
    hw::wgmma_fence_operand(acc);
    hw::wgmma_fence();
#pragma unroll
    for (int k16 = 0; k16 < kPSteps; ++k16)
      hw::wgmma_rs<T, 1>(acc, pa[k16], hw::mn_major_descriptor<VTile>(v_slot(slot_of(i)), k16), true);
    hw::wgmma_commit();
    hw::wgmma_fence_operand(acc);
  };
  // Scores of tile i -> final logits (softcap) -> masked where not every row sees the tile whole.
  const auto modify_scores = [&](float(&s)[kS], int i) {
    if constexpr (kSoftcap) {
#pragma unroll
      for (int x = 0; x < kS; ++x) s[x] = sm80::ScoreMods::capped(s[x], p.softcap, softcap_to_exp2);
    }
    const int j0 = (tiles.n_end - 1 - i) * kBlockN;
    if (j0 < full.lo || j0 + kBlockN > full.hi) apply_band_mask(s, band, row0, j0, quad_lane);
  };
  const auto to_p = [](uint32_t(&pa)[kPSteps][4], const float(&s)[kS]) {
#pragma unroll
    for (int k16 = 0; k16 < kPSteps; ++k16) hw::a_from_accumulators<T>(pa[k16], s, k16);
  };

  if (n_tiles > 0) hw::mbarrier_wait(bar(bars.q_full), 0);
  if constexpr (!kTiles.pingpong && !kTiles.overlap) {
    // Step 1: one GEMM at a time.
    for (int i = 0; i < n_tiles; ++i) {
      float s[kS];
      wait_k(i);
      issue_s(s, i);
      hw::wgmma_wait<0>();
      hw::wgmma_fence_operand(s);
      release_k(i);

      modify_scores(s, i);
      softmax.update(s, o, score_scale_log2);
      uint32_t pa[kPSteps][4];
      to_p(pa, s);

      wait_v(i);
      issue_pv(o, pa, i);
      hw::wgmma_wait<0>();
      hw::wgmma_fence_operand(o);
      keep_alive(pa);
      release_v(i);
    }
  } else if (n_tiles > 0) {
    // Steps 2-3: phases 0 .. N, phase i issuing S(i) (i < N) and O += P(i-1) V(i-1) (i > 0).
    const GemmTurns<kTiles.consumers, kTiles.pingpong> turns{c};
    uint32_t pa[kPSteps][4];  // P(i-1), from phase i-1 to phase i
    float alpha[2];           // alpha(i-1): o's rescaling before P(i-1) V(i-1) is added

    {  // Phase 0: S(0) alone.
      float s[kS];
      wait_k(0);
      turns.take(/*first_phase=*/true);
      issue_s(s, 0);
      turns.pass(/*last_phase=*/false);
      hw::wgmma_wait<0>();
      hw::wgmma_fence_operand(s);
      release_k(0);
      modify_scores(s, 0);
      softmax.update(s, score_scale_log2, alpha);
      to_p(pa, s);
    }
    for (int i = 1; i < n_tiles; ++i) {
      float s[kS];
      wait_k(i);
      wait_v(i - 1);
      turns.take(false);
      issue_s(s, i);
      OnlineSoftmax::rescale(o, alpha);
      issue_pv(o, pa, i - 1);
      turns.pass(false);
      if constexpr (kTiles.overlap) {
        hw::wgmma_wait<1>();  // S(i) done; P(i-1) V(i-1) may still run
        hw::wgmma_fence_operand(s);
        release_k(i);
        modify_scores(s, i);
        softmax.update(s, score_scale_log2, alpha);
        hw::wgmma_wait<0>();
        hw::wgmma_fence_operand(o);
        keep_alive(pa);
        release_v(i - 1);
      } else {
        hw::wgmma_wait<0>();
        hw::wgmma_fence_operand(s);
        hw::wgmma_fence_operand(o);
        keep_alive(pa);
        release_k(i);
        release_v(i - 1);
        modify_scores(s, i);
        softmax.update(s, score_scale_log2, alpha);
      }
      to_p(pa, s);
    }
    // Phase N: P(N-1) V(N-1) alone.
    wait_v(n_tiles - 1);
    turns.take(false);
    OnlineSoftmax::rescale(o, alpha);
    issue_pv(o, pa, n_tiles - 1);
    turns.pass(/*last_phase=*/true);
    hw::wgmma_wait<0>();
    hw::wgmma_fence_operand(o);
    keep_alive(pa);
    release_v(n_tiles - 1);
  }

  // ---- Epilogue: O / l and lse ---------------------------------------------------------------------
  float lse[2];
  softmax.finalize(o, kSoftcap ? 1.0f : p.scale, lse);

  // O goes through this consumer's own rows of the Q tile, which only its wgmmas read; the barrier
  // makes sure every warp of the warpgroup is past its last one (or that no Q was loaded at all).
  hw::named_barrier_sync(static_cast<int>(NamedBarrier::kConsumerEpilogue) + c, hw::kWarpgroupThreads);
  uint8_t* q_smem = smem_raw + (q_addr - raw);
  const int warp_row0 = slice_row0 + 16 * warp;  // of the block
#pragma unroll
  for (int j = 0; j < kO / 4; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t packed = cuda::MmaType<T>::pack(o[acc_index(j, r, 0)], o[acc_index(j, r, 1)]);
      *reinterpret_cast<uint32_t*>(q_smem + QTile::offset(warp_row0 + g + 8 * r, 8 * j + 2 * quad_lane)) = packed;
    }
  __syncwarp();

  // Each warp stores its 16 rows, 16 bytes per lane and step.
  const int rows_valid = i1 - (i0 + warp_row0);
  T* out = static_cast<T*>(p.o) + b * p.o_batch_stride + int64_t{i0 + warp_row0} * p.o_row_stride + h * p.o_head_stride;
  constexpr int kChunksPerRow = kHeadDim / 8;
  static_assert(16 * kChunksPerRow % 32 == 0, "a warp's 16 rows split evenly over its lanes");
#pragma unroll
  for (int step = 0; step < 16 * kChunksPerRow / 32; ++step) {
    const int chunk_index = lane + 32 * step;
    const int row = chunk_index / kChunksPerRow, chunk = chunk_index % kChunksPerRow;
    if (row < rows_valid && chunk * 8 < p.head_dim) {
      const uint4 value = *reinterpret_cast<const uint4*>(q_smem + QTile::offset(warp_row0 + row, chunk * 8));
      *reinterpret_cast<uint4*>(out + int64_t{row} * p.o_row_stride + chunk * 8) = value;
    }
  }
  if (p.maybe_lse != nullptr && quad_lane == 0) {
    float* lse_rows = p.maybe_lse + b * p.lse_batch_stride + h * p.lse_head_stride;
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (row0 + 8 * r < i1) lse_rows[row0 + 8 * r] = lse[r];
  }
}

}  // namespace flashattn::detail::sm90
