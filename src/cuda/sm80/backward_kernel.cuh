// FlashAttention-2 backward for sm_80 and later, on mma.sync: the main kernel in the FlashAttention-2
// work layout, for head dims up to 256. It runs between the row kernels of backward_rows.cuh
// (preprocess: D and lse·log2e; convert: dQ). One thread block per (Bc keys, kv head, batch) keeps
// K and V of its keys in shared memory and walks the Br-row query tiles that see its keys, for every
// query head of its GQA group; per step (j: the block's keys, i: the step's query rows):
//   S^T  = K Q^T                     P^T  = exp2(S^T scale log2e - lse log2e)
//   dP^T = V dO^T                    dS^T = P^T ∘ (dP^T - D)
//   dV  += P^T dO                    dK  += dS^T Q
//   dQ  += dS K  (fp32 atomic adds into the workspace, in fragment order: backward_dq_accum.cuh;
//                 skipped when p.dq_accum is null: the deterministic path computes dQ in its own kernel)
// Every GEMM is split over all warps as a 2-D warp grid (backward_policy.hpp), so that dK and
// dV (accumulated in registers over all steps) cost Bc·d·2 / (32 warps) registers per thread and each
// warp tile is wide in both directions: each ldmatrix feeds several mma. S^T and dP^T share one warp
// grid, so dS^T is elementwise in registers; P^T and dS^T go to shared memory, where the other
// warp grids read them as A operands (dQ reads dS^T transposed).
//
// Pipeline, two barriers per step, Q, dO, lse·log2e and D double-buffered:
//   wait step s | barrier | issue step s+1 | S^T, P^T, dP^T, dS^T -> smem | barrier | dV, dK, dQ
// The loads of step s+1 fly during the whole of step s's math; the first barrier also tells that
// every warp is done with the buffers they overwrite (step s-1's) and with the P^T and dS^T tiles.
//
// dO, V and dV have head_dim_v columns (kHeadDimV may differ from kHeadDim): dP^T = V dO^T and
// dV += P^T dO reduce or run over them, everything else over head_dim.
//
// kScoreMods: the variant with softcap, ALiBi, bias and mask (backward_score_mods.cuh), launched
// only when one is on, so that the plain path carries none of it. It recomputes the forward's
// logits from S^T, and keeps P^T ∘ (1 - (y/softcap)²) in registers for dS^T (P^T itself goes to
// shared memory for dV).
//
// dK is scaled once in the epilogue. The dQ atomics make dQ depend on the order in which blocks add,
// in the last bits (dK and dV do not: each is owned by one block and accumulated in a fixed order,
// except in the blocks of a split tail wave, whose pieces add theirs: backward_params.hpp's
// tail_split, gather_pieces below; the deterministic mode never splits).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/primitives/cp_async.cuh"
#include "cuda/primitives/grid_dependency.cuh"
#include "cuda/primitives/ldmatrix.cuh"
#include "cuda/primitives/math.cuh"
#include "cuda/primitives/mma.cuh"
#include "cuda/primitives/reduce.cuh"
#include "cuda/primitives/smem_tile.cuh"
#include "cuda/sm80/backward_dq_accum.cuh"
#include "cuda/sm80/backward_params.hpp"
#include "cuda/sm80/backward_rows.cuh"
#include "cuda/sm80/backward_policy.hpp"
#include "cuda/sm80/backward_score_mods.cuh"
#include "cuda/sm80/mask.cuh"
#include "cuda/sm80/tile_load.cuh"
#include "cuda/sm80/warp_grid.cuh"

namespace flashattn::detail::sm80 {

// Scores of S^T (rows: keys from j0; columns: queries from i0) outside the band become -inf.
template <class Grid>
__device__ __forceinline__ void mask_scores_transposed(cuda::FragC (&st)[Grid::kMTiles][Grid::kNTiles],
                                                       const Band& band, const Grid& grid, int i0, int j0, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < Grid::kNTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const KeyRange keys = band.visible_keys(i0 + grid.col0(nt) + 2 * t + e);
#pragma unroll
      for (int mt = 0; mt < Grid::kMTiles; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int j = j0 + grid.row0(mt) + g + 8 * r;
          if (j < keys.lo || j >= keys.hi) st[mt][nt].x[2 * r + e] = -INFINITY;
        }
    }
}

// The score-modifier variant's P^T from the raw scores of S^T (rows: keys from j0; columns:
// queries from i0), in one pass per element: the logit (modifiers, then the band), P^T rounded to
// T into the P^T tile (as store_fragments), and P^T ∘ (1 - (y/softcap)²) left in st for dS^T.
// lse_log2: the step's rows' lse·log2e in shared memory (+inf for rows past the end: P = 0).
template <class T, class Grid, class Tile>
__device__ __forceinline__ void probabilities_transposed(cuda::FragC (&st)[Grid::kMTiles][Grid::kNTiles],
                                                         const BackwardScoreMods& mods, const Band& band,
                                                         const float* lse_log2, int i0, int j0, char* pt_tile,
                                                         const Grid& grid, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const uint32_t base = fragment_base<Grid, Tile>(grid, lane);
#pragma unroll
  for (int nt = 0; nt < Grid::kNTiles; ++nt) {
    const int i = i0 + grid.col0(nt) + 2 * t;  // queries i and i + 1
    const float2 lse = *reinterpret_cast<const float2*>(lse_log2 + grid.col0(nt) + 2 * t);
    const KeyRange keys0 = band.visible_keys(i), keys1 = band.visible_keys(i + 1);
#pragma unroll
    for (int mt = 0; mt < Grid::kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int j = j0 + grid.row0(mt) + g + 8 * r;
        float* x = st[mt][nt].x + 2 * r;
        const float p0 = mods.probability(x[0], i, j, keys0.lo <= j && j < keys0.hi, lse.x, x[0]);
        const float p1 = mods.probability(x[1], i + 1, j, keys1.lo <= j && j < keys1.hi, lse.y, x[1]);
        *reinterpret_cast<uint32_t*>(pt_tile + fragment_at<Grid, Tile>(base, mt, nt, r)) =
            cuda::MmaType<T>::pack(p0, p1);
      }
  }
}

// Rows [0, rows_valid) and columns [0, cols) of a swizzled tile copied to global memory in 16-byte
// chunks (cols a multiple of 8).
template <class Tile, int kThreads, class T>
__device__ __forceinline__ void copy_out_rows(T* out, int64_t row_stride, const char* tile, int rows_valid, int cols,
                                              int tid) {
  constexpr int kChunksPerRow = Tile::kChunksPerRow;
  for (int c = tid; c < rows_valid * kChunksPerRow; c += kThreads) {
    const int row = c / kChunksPerRow, chunk = c % kChunksPerRow;
    if (chunk * 8 < cols)
      *reinterpret_cast<uint4*>(out + row * row_stride + chunk * 8) =
          *reinterpret_cast<const uint4*>(tile + Tile::offset(row, chunk));
  }
}

// The query tiles [begin, begin + count) of Br rows that some row of which sees a key of [j0, j1).
// The keys a row sees move right with the row (both ends), so "sees a key at or after j0" holds from
// some tile on and "sees a key before j1" up to some tile: two bisections find the ends, with the
// same per-tile test as a scan.
struct QueryTiles {
  int begin, count;
};

template <int kBlockM>
__device__ __forceinline__ QueryTiles visible_query_tiles(const Band& band, int seqlen_q, int j0, int j1) {
  const auto seen = [&](int m) { return band.visible_keys(m * kBlockM, min((m + 1) * kBlockM, seqlen_q)); };
  int lo = 0, hi = (seqlen_q + kBlockM - 1) / kBlockM;
  const int m_count = hi;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (seen(mid).hi > j0) hi = mid;
    else lo = mid + 1;
  }
  const int begin = lo;
  hi = m_count;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (seen(mid).lo >= j1) hi = mid;
    else lo = mid + 1;
  }
  return {begin, lo - begin};
}

// Which block this is, on the 1-D grid of backward_params.hpp (policies with tail_split; else on
// the 3-D grid): (b, kv head, key block) and, for a split block, which piece of it.
struct BlockCoords {
  int block, n_block, h_kv, b, piece;
  bool split;
};
template <bool kTailSplit>
__device__ __forceinline__ BlockCoords block_coords(const BackwardKernelParams& p) {
  if constexpr (!kTailSplit) {  // the grid is (key blocks, kv heads, batch)
    return {0, static_cast<int>(blockIdx.x), static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.z), 0, false};
  }
  const int x = static_cast<int>(blockIdx.x) + p.grid_first_block;
  BlockCoords c{x, 0, 0, 0, 0, x >= p.split_begin};
  if (c.split) {
    c.block = p.split_begin + (x - p.split_begin) / p.split_pieces;
    c.piece = (x - p.split_begin) % p.split_pieces;
  }
  const int bh = c.block / p.key_blocks, heads_kv = p.heads_q / p.group;
  c.n_block = c.block - bh * p.key_blocks;
  c.b = bh / heads_kv;
  c.h_kv = bh - c.b * heads_kv;
  return c;
}

// Programmatic dependent launch (p.dependent_launch; primitives/grid_dependency.cuh). The main
// kernel follows the preprocess: its blocks issue their K and V loads, then wait for it (D,
// lse·log2e and the zeroed accumulators), then let the next launch start. The pieces' own launch
// (grid_first_block > 0) follows the 3-D grid instead, and runs beside its last wave: it shares
// nothing with it but the dQ accumulator's commutative atomics, and what it reads of the
// preprocess is complete once every block of the 3-D grid has passed its wait. So it waits for the
// 3-D grid only before it exits, which keeps the chain's rule (a grid completes after the one
// before it) for the convert kernel after it.
__device__ __forceinline__ bool pieces_beside_main_grid(const BackwardKernelParams& p) {
  return p.grid_first_block > 0;
}

// A thread's accumulators c added into (kAdd) or read back from (L2, bypassing L1) fp32 memory in
// fragment order: fragment (mt, nt) of thread tid at (mt kNTiles + nt) · 4 · kThreads + 4 tid, so a
// warp's 16-byte accesses cover 512 consecutive bytes.
template <bool kAdd, int kThreads, int kMTiles, int kNTiles>
__device__ __forceinline__ void fragments_in_memory(float* base, cuda::FragC (&c)[kMTiles][kNTiles], int tid) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      float* at = base + (mt * kNTiles + nt) * 4 * kThreads + 4 * tid;
      float* x = c[mt][nt].x;
      if constexpr (kAdd) {
        cuda::red_add_f32x4(at, make_float4(x[0], x[1], x[2], x[3]));
      } else {
        const float4 v = __ldcg(reinterpret_cast<const float4*>(at));
        x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
      }
    }
}

// The end of one piece of a split block (tail_split): its dK (already scaled) and dV fragments are
// added into the block's fp32 accumulator (backward_params.hpp), and the piece counts itself in. The
// last piece to arrive reads the sums back into dk and dv and returns true (it writes dK and dV);
// the others return false. The fences order each piece's adds before its count, and the count
// before the last piece's reads.
template <int kThreads, class DkGrid, class DvGrid>
__device__ __forceinline__ bool gather_pieces(const BackwardKernelParams& p, int split_block,
                                              cuda::FragC (&dk)[DkGrid::kMTiles][DkGrid::kNTiles],
                                              cuda::FragC (&dv)[DvGrid::kMTiles][DvGrid::kNTiles], int tid) {
  constexpr int kDkFloats = DkGrid::kMTiles * DkGrid::kNTiles * 4 * kThreads;  // Bc x head dim
  constexpr int kDvFloats = DvGrid::kMTiles * DvGrid::kNTiles * 4 * kThreads;
  float* const dk_sum = p.dkv_accum + int64_t{split_block} * (kDkFloats + kDvFloats);
  float* const dv_sum = dk_sum + kDkFloats;
  fragments_in_memory<true, kThreads>(dk_sum, dk, tid);
  fragments_in_memory<true, kThreads>(dv_sum, dv, tid);
  __threadfence();
  __shared__ int last;
  __syncthreads();
  if (tid == 0) last = atomicAdd(p.dkv_arrivals + split_block, 1) == p.split_pieces - 1;
  __syncthreads();
  if (!last) return false;
  __threadfence();
  fragments_in_memory<false, kThreads>(dk_sum, dk, tid);
  fragments_in_memory<false, kThreads>(dv_sum, dv, tid);
  return true;
}

// kSplitGrid: the 1-D grid whose last blocks may run as pieces (tail_split); else the grid is
// (key blocks, kv heads, batch), whose coordinates cost no registers (blockIdx.y, z), and whose
// split blocks (if any) return at once: their pieces are the 1-D launch's.
template <int kHeadDim, int kHeadDimV, class T, bool kScoreMods, bool kSplitGrid>
__global__ void __launch_bounds__(BackwardPolicy<kHeadDim, kHeadDimV, kScoreMods>::kTiles.threads(),
                                  BackwardPolicy<kHeadDim, kHeadDimV, kScoreMods>::kTiles.min_blocks)
    backward_kernel(const BackwardKernelParams p) {
  constexpr BackwardTiles kTiles = BackwardPolicy<kHeadDim, kHeadDimV, kScoreMods>::kTiles;
  static_assert(!kSplitGrid || kTiles.tail_split);
  constexpr int kBlockM = kTiles.block_m, kBlockN = kTiles.block_n, kThreads = kTiles.threads();
  constexpr int kWarps = kTiles.warps, kStages = BackwardTiles::kStages;
  using KTile = cuda::SwizzledTile<kBlockN, kHeadDim>;    // K; dK in the epilogue
  using VTile = cuda::SwizzledTile<kBlockN, kHeadDimV>;   // V; dV in the epilogue
  using QTile = cuda::SwizzledTile<kBlockM, kHeadDim>;    // Q
  using DoTile = cuda::SwizzledTile<kBlockM, kHeadDimV>;  // dO
  using PTile = cuda::SwizzledTile<kBlockN, kBlockM>;     // P^T, dS^T: rows keys, columns queries
  using KLoad = TileLoad<T, kBlockN, kHeadDim, kThreads>;
  using VLoad = TileLoad<T, kBlockN, kHeadDimV, kThreads>;
  using QLoad = TileLoad<T, kBlockM, kHeadDim, kThreads>;
  using DoLoad = TileLoad<T, kBlockM, kHeadDimV, kThreads>;
  using SdpGrid = WarpGrid<kBlockN, kBlockM, kTiles.sdp_key_warps, kWarps / kTiles.sdp_key_warps>;
  using DkGrid = WarpGrid<kBlockN, kHeadDim, kTiles.dkv_key_warps, kWarps / kTiles.dkv_key_warps>;
  using DvGrid = WarpGrid<kBlockN, kHeadDimV, kTiles.dkv_key_warps, kWarps / kTiles.dkv_key_warps>;
  using DqLayout = DqAccumLayout<kHeadDim, kHeadDimV, kScoreMods>;
  using DqGrid = typename DqLayout::Grid;
  static_assert(KTile::kBytes == kTiles.k_bytes() && VTile::kBytes == kTiles.v_bytes() &&
                QTile::kBytes == kTiles.q_bytes() && DoTile::kBytes == kTiles.do_bytes() &&
                PTile::kBytes == kTiles.p_bytes());

  // K | V | stage 0: Q, dO | stage 1: Q, dO | P^T | dS^T | stage 0: lse·log2e, D | stage 1: ...
  constexpr int kStageBytes = QTile::kBytes + DoTile::kBytes;
  extern __shared__ __align__(128) char smem[];
  char* const pt_tile = smem + KTile::kBytes + VTile::kBytes + kStages * kStageBytes;
  char* const dst_tile = pt_tile + PTile::kBytes;
  float* const rows_smem = reinterpret_cast<float*>(dst_tile + PTile::kBytes);
  const uint32_t k_addr = cuda::smem_address(smem), v_addr = k_addr + KTile::kBytes;
  const uint32_t pt_addr = cuda::smem_address(pt_tile), dst_addr = cuda::smem_address(dst_tile);
  const auto q_addr = [=](int stage) { return v_addr + VTile::kBytes + stage * kStageBytes; };
  const auto do_addr = [=](int stage) { return q_addr(stage) + QTile::kBytes; };
  const auto lse_smem = [=](int stage) { return rows_smem + stage * 2 * kBlockM; };  // [Br]
  const auto delta_smem = [=](int stage) { return lse_smem(stage) + kBlockM; };     // [Br]

  const BlockCoords coords = block_coords<kSplitGrid>(p);
  const int n_block = coords.n_block, h_kv = coords.h_kv, b = coords.b;
  // Every exit waits for the grid before (pieces_beside_main_grid).
  if constexpr (!kSplitGrid) {  // the split blocks' pieces run in a launch of their own
    if (p.split_pieces > 1 && (b * (p.heads_q / p.group) + h_kv) * p.key_blocks + n_block >= p.split_begin) {
      cuda::wait_for_primary_grid();
      return;
    }
  }
  const bool beside_main = kSplitGrid && pieces_beside_main_grid(p);
  const BackwardSequence seq = backward_sequence(p, b);
  const int j0 = n_block * kBlockN;
  if (j0 >= seq.sk) {  // varlen: this sequence is shorter than the longest
    cuda::wait_for_primary_grid();
    return;
  }
  const int j1 = min(j0 + kBlockN, seq.sk);
  const Band band{seq.sk, p.bottom_right ? seq.sk - seq.sq : 0, p.window_left, p.window_right};
  const bool varlen = p.maybe_cu_seqlens_q != nullptr;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int t = lane & 3;
  const SdpGrid sdp(warp);
  const DkGrid dkg(warp);
  const DvGrid dvg(warp);
  const DqGrid dqg(warp);

  // Steps: the visible query tiles of head h_kv·group, then of the next head of the group, ...;
  // a piece of a split block runs its share of them, from `start`.
  const QueryTiles tiles = visible_query_tiles<kBlockM>(band, seq.sq, j0, j1);
  int steps = p.group * tiles.count;
  struct Step {
    int h, i0, i1;
  };
  const auto make_step = [&](int h, int i0) { return Step{h, i0, min(i0 + kBlockM, seq.sq)}; };
  const Step first = make_step(h_kv * p.group, tiles.begin * kBlockM);  // of the block
  Step start = first;                                                   // of this piece
  if constexpr (kSplitGrid) {
    if (coords.split) {
      const int s0 = coords.piece * steps / p.split_pieces;
      steps = (coords.piece + 1) * steps / p.split_pieces - s0;
      start = make_step(h_kv * p.group + s0 / tiles.count, (tiles.begin + s0 % tiles.count) * kBlockM);
    }
  }
  // The step after st: the next visible tile of its head, or the first of the next head (counted
  // on, not divided out of the step index: fewer registers across the loop).
  const auto next_step = [&](const Step& st) {
    return st.i0 + kBlockM < (tiles.begin + tiles.count) * kBlockM ? make_step(st.h, st.i0 + kBlockM)
                                                                   : make_step(st.h + 1, first.i0);
  };
  // Q, dO, lse·log2e and D of step s into buffer s % kStages, as one commit group. Rows past the
  // sequence end: Q and dO zero-filled, lse·log2e = +inf (P = 0), D = 0.
  const auto issue_step = [&](int s, const Step& st) {
    const int stage = s % kStages;
    const T* q = static_cast<const T*>(p.q) +
                 row_offset(varlen, b, seq.q_row0, st.i0, st.h, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
    const T* d_o = static_cast<const T*>(p.d_o) + row_offset(varlen, b, seq.q_row0, st.i0, st.h, p.do_batch_stride,
                                                             p.do_row_stride, p.do_head_stride);
    QLoad::issue(q_addr(stage), q, p.q_row_stride, st.i1 - st.i0, p.head_dim, tid);
    DoLoad::issue(do_addr(stage), d_o, p.do_row_stride, st.i1 - st.i0, p.head_dim_v, tid);
    if (tid < 2 * kBlockM) {
      const int row = tid % kBlockM;
      const bool is_delta = tid >= kBlockM;
      float* to = (is_delta ? delta_smem(stage) : lse_smem(stage)) + row;
      if (st.i0 + row < st.i1)
        cuda::cp_async_4(cuda::smem_address(to),
                         (is_delta ? p.delta : p.lse_log2) + workspace_row(p, b, st.h, st.i0 + row));
      else
        *to = is_delta ? 0.0f : INFINITY;
    }
    cuda::cp_async_commit();
  };

  const T* k = static_cast<const T*>(p.k) +
               row_offset(varlen, b, seq.k_row0, j0, h_kv, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  const T* v = static_cast<const T*>(p.v) +
               row_offset(varlen, b, seq.k_row0, j0, h_kv, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  KLoad::issue(k_addr, k, p.k_row_stride, j1 - j0, p.head_dim, tid);
  VLoad::issue(v_addr, v, p.v_row_stride, j1 - j0, p.head_dim_v, tid);
  cuda::cp_async_commit();
  if (!beside_main) cuda::wait_for_primary_grid();  // the preprocess
  cuda::release_dependent_grid();
  if (steps > 0) issue_step(0, start);

  cuda::FragC dk[DkGrid::kMTiles][DkGrid::kNTiles], dv[DvGrid::kMTiles][DvGrid::kNTiles];
  zero_fragments(dk);
  zero_fragments(dv);

  // One step, reading buffer s % kStages (a constant: its addresses fold into the
  // instructions instead of holding registers across the loop).
  const auto run_step = [&](auto stage_constant, int s, const Step& st) {
    constexpr int stage = decltype(stage_constant)::value;
    cuda::cp_async_wait<0>();
    __syncthreads();  // step s is in; every warp is done with step s - 1 (its buffers, P^T, dS^T)
    if (s + 1 < steps) issue_step(s + 1, next_step(st));

    // S^T = K Q^T, masked where the tile crosses the band's edge, then P^T in place and dP^T = V dO^T
    // (over dv). With the policy's exp_under_dp the exponentials of P^T are computed inside the dP^T
    // GEMM, a share after each k-step (they do not depend on it: MUFU then runs under the tensor
    // cores), and P^T is stored after it; else before it. Then dS^T = P^T ∘ (dP^T - D).
    cuda::FragC pt[SdpGrid::kMTiles][SdpGrid::kNTiles];
    zero_fragments(pt);
    warp_gemm<T, SdpGrid, kHeadDim / 16, TileRows::kMN, TileRows::kMN, KTile, QTile>(pt, k_addr, q_addr(stage), sdp,
                                                                                     lane);
    constexpr int kDpSteps = kHeadDimV / 16;
    // The exponentials of the n8 columns nt with nt kDpSteps / kNTiles == kk (all of them for kk < 0).
    const auto exponentials = [&](int kk) {
#pragma unroll
      for (int nt = 0; nt < SdpGrid::kNTiles; ++nt) {
        if (kk >= 0 && nt * kDpSteps / SdpGrid::kNTiles != kk) continue;
        const float2 lse = *reinterpret_cast<const float2*>(lse_smem(stage) + sdp.col0(nt) + 2 * t);
#pragma unroll
        for (int mt = 0; mt < SdpGrid::kMTiles; ++mt)
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            pt[mt][nt].x[2 * r] = cuda::fast_exp2(fmaf(pt[mt][nt].x[2 * r], p.scale_log2, -lse.x));
            pt[mt][nt].x[2 * r + 1] = cuda::fast_exp2(fmaf(pt[mt][nt].x[2 * r + 1], p.scale_log2, -lse.y));
          }
      }
    };
    constexpr bool kExpUnderDp = !kScoreMods && kTiles.exp_under_dp;
    if constexpr (kScoreMods) {
      // pt becomes P^T ∘ (1 - (y/softcap)²); P^T goes to its tile.
      const BackwardScoreMods mods = BackwardScoreMods::resolve(p, b, st.h, band.diagonal, seq.sq, seq.sk);
      probabilities_transposed<T, SdpGrid, PTile>(pt, mods, band, lse_smem(stage), st.i0, j0, pt_tile, sdp, lane);
    } else {
      const KeyRange full = band.keys_seen_by_all(st.i0, st.i1);
      if (j0 < full.lo || j0 + kBlockN > full.hi) mask_scores_transposed(pt, band, sdp, st.i0, j0, lane);
      if constexpr (!kExpUnderDp) {
        exponentials(-1);
        store_fragments<T, SdpGrid, PTile, kTiles.matrix_stores>(pt_tile, pt, sdp, lane);
      }
    }
    cuda::FragC dst[SdpGrid::kMTiles][SdpGrid::kNTiles];
    zero_fragments(dst);
    if constexpr (kExpUnderDp) {
      warp_gemm<T, SdpGrid, kDpSteps, TileRows::kMN, TileRows::kMN, VTile, DoTile, SdpGrid::kNTiles / 2>(
          dst, v_addr, do_addr(stage), sdp, lane, 0, exponentials);
      store_fragments<T, SdpGrid, PTile, kTiles.matrix_stores>(pt_tile, pt, sdp, lane);
    } else {
      warp_gemm<T, SdpGrid, kDpSteps, TileRows::kMN, TileRows::kMN, VTile, DoTile>(dst, v_addr, do_addr(stage), sdp,
                                                                                 lane);
    }
#pragma unroll
    for (int nt = 0; nt < SdpGrid::kNTiles; ++nt) {
      const float2 delta = *reinterpret_cast<const float2*>(delta_smem(stage) + sdp.col0(nt) + 2 * t);
#pragma unroll
      for (int mt = 0; mt < SdpGrid::kMTiles; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          dst[mt][nt].x[2 * r] = pt[mt][nt].x[2 * r] * (dst[mt][nt].x[2 * r] - delta.x);
          dst[mt][nt].x[2 * r + 1] = pt[mt][nt].x[2 * r + 1] * (dst[mt][nt].x[2 * r + 1] - delta.y);
        }
    }
    store_fragments<T, SdpGrid, PTile, kTiles.matrix_stores>(dst_tile, dst, sdp, lane);
    __syncthreads();  // P^T and dS^T are whole

    // dV += P^T dO, dK += dS^T Q: A rows are keys, B rows are queries (the reduction).
    warp_gemm<T, DvGrid, kBlockM / 16, TileRows::kMN, TileRows::kK, PTile, DoTile>(dv, pt_addr, do_addr(stage), dvg,
                                                                                    lane);
    warp_gemm<T, DkGrid, kBlockM / 16, TileRows::kMN, TileRows::kK, PTile, QTile>(dk, dst_addr, q_addr(stage), dkg,
                                                                                  lane);

    if (p.dq_accum == nullptr) return;  // dQ has its own kernel (deterministic mode)
    accumulate_dq<T, DqLayout, kBlockN / 16, kTiles.dq_pass_slabs, PTile, KTile>(DqLayout::tile(p, b, st.h, st.i0),
                                                                                dst_addr, k_addr, dqg, tid);
  };
  static_assert(kStages == 2);
  Step st = start;
  for (int s = 0; s < steps; s += 2) {
    run_step(std::integral_constant<int, 0>{}, s, st);
    st = next_step(st);
    if (s + 1 < steps) run_step(std::integral_constant<int, 1>{}, s + 1, st);
    st = next_step(st);
  }

  // Epilogue: dK = scale · Σ dS^T Q and dV staged over the K and V tiles they belong to, then
  // copied out in 16-byte rows; keys past the sequence end are not written.
  cuda::cp_async_wait<0>();  // with no step, K and V are still in flight
  __syncthreads();           // every warp is done with K, V, P^T and dS^T
#pragma unroll
  for (int mt = 0; mt < DkGrid::kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < DkGrid::kNTiles; ++nt)
#pragma unroll
      for (int x = 0; x < 4; ++x) dk[mt][nt].x[x] *= p.scale;
  // A piece of a split block: its coordinates worked out again rather than kept across the loop
  // (registers); only the last piece goes on.
  int b_out = b, h_kv_out = h_kv;
  if constexpr (kSplitGrid) {
    const BlockCoords again = block_coords<true>(p);
    if (again.split && !gather_pieces<kThreads, DkGrid, DvGrid>(p, again.block - p.split_begin, dk, dv, tid)) {
      if (beside_main) cuda::wait_for_primary_grid();
      return;
    }
    b_out = again.b, h_kv_out = again.h_kv;
  }
  store_fragments<T, DkGrid, KTile, false>(smem, dk, dkg, lane);
  store_fragments<T, DvGrid, VTile, false>(smem + KTile::kBytes, dv, dvg, lane);
  __syncthreads();

  // The sequence's first key row read again (cu_seqlens_k) rather than kept in registers across
  // the loop, which spills in the d = 256 variants on sm_90a.
  const int k_row0 = backward_sequence(p, b_out).k_row0;
  T* dk_out = static_cast<T*>(p.dk) +
              row_offset(varlen, b_out, k_row0, j0, h_kv_out, p.dk_batch_stride, p.dk_row_stride,
                         p.dk_head_stride);
  T* dv_out = static_cast<T*>(p.dv) +
              row_offset(varlen, b_out, k_row0, j0, h_kv_out, p.dv_batch_stride, p.dv_row_stride,
                         p.dv_head_stride);
  if constexpr (kHeadDim == kHeadDimV) {
    // One loop over dK and dV (two copy_out_rows calls here spill 4 bytes in the d = 192 mods variant).
    constexpr int kChunksPerRow = kHeadDim / 8;
    for (int c = tid; c < 2 * kBlockN * kChunksPerRow; c += kThreads) {
      const bool is_dv = c >= kBlockN * kChunksPerRow;
      const int row = (c % (kBlockN * kChunksPerRow)) / kChunksPerRow, chunk = c % kChunksPerRow;
      if (row >= j1 - j0 || chunk * 8 >= (is_dv ? p.head_dim_v : p.head_dim)) continue;  // runtime widths
      const uint4 value = *reinterpret_cast<const uint4*>(smem + (is_dv ? KTile::kBytes : 0) + KTile::offset(row, chunk));
      if (is_dv)
        *reinterpret_cast<uint4*>(dv_out + row * p.dv_row_stride + chunk * 8) = value;
      else
        *reinterpret_cast<uint4*>(dk_out + row * p.dk_row_stride + chunk * 8) = value;
    }
  } else {
    copy_out_rows<KTile, kThreads>(dk_out, p.dk_row_stride, smem, j1 - j0, p.head_dim, tid);
    copy_out_rows<VTile, kThreads>(dv_out, p.dv_row_stride, smem + KTile::kBytes, j1 - j0, p.head_dim_v, tid);
  }
  if (beside_main) cuda::wait_for_primary_grid();
}

// Launches the main kernel only (the preprocess has zeroed the split blocks' accumulators). The
// plain variant runs its whole blocks on the grid of key blocks x kv heads x batch and, when some
// are split, their pieces after them on a 1-D grid of their own (the 1-D grid's block coordinates
// cost the loop registers: 1-1.5% at d = 64 when every block ran on it), which with
// dependent_launch runs beside the 3-D grid's last wave. The score-modifier variant of a policy
// with tail_split runs every block and piece on one 1-D grid (BackwardKernelParams). The row
// kernels around it are the caller's (backward_launch.cuh); `dependent`: the first launch here
// follows the preprocess as its programmatic dependent.
template <int kHeadDim, int kHeadDimV, class T, bool kScoreMods, bool kSplitGrid>
cudaError_t launch_backward_grid(const BackwardKernelParams& p, bool dependent, cudaStream_t stream) {
  constexpr BackwardTiles kTiles = BackwardPolicy<kHeadDim, kHeadDimV, kScoreMods>::kTiles;
  const auto kernel = backward_kernel<kHeadDim, kHeadDimV, T, kScoreMods, kSplitGrid>;
  constexpr int kSmem = kTiles.smem_bytes();
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
      e != cudaSuccess)
    return e;
  const int64_t blocks = int64_t{p.key_blocks} * (p.heads_q / p.group) * p.batch;
  const dim3 grid = kSplitGrid ? dim3(static_cast<unsigned>(p.split_begin - p.grid_first_block +
                                                            (blocks - p.split_begin) * p.split_pieces))
                               : dim3(p.key_blocks, p.heads_q / p.group, p.batch);
  return cuda::launch_kernel(kernel, grid, dim3(kTiles.threads()), kSmem, stream, dependent, p);
}

template <int kHeadDim, int kHeadDimV, class T, bool kScoreMods>
cudaError_t launch_backward_main(const BackwardKernelParams& p, bool dependent, cudaStream_t stream) {
  constexpr BackwardTiles kTiles = BackwardPolicy<kHeadDim, kHeadDimV, kScoreMods>::kTiles;
  if (p.seqlen_k <= 0 || p.batch <= 0 || p.heads_q <= 0) return cudaSuccess;
  if constexpr (kTiles.tail_split && kScoreMods) {
    return launch_backward_grid<kHeadDim, kHeadDimV, T, kScoreMods, true>(p, dependent, stream);
  } else {
    if (p.split_pieces == 1 || p.split_begin > 0) {  // some whole blocks
      if (cudaError_t e = launch_backward_grid<kHeadDim, kHeadDimV, T, kScoreMods, false>(p, dependent, stream);
          e != cudaSuccess)
        return e;
      dependent = p.dependent_launch;  // the pieces, beside the 3-D grid
    }
    if constexpr (kTiles.tail_split) {
      if (p.split_pieces > 1) {
        BackwardKernelParams pieces = p;
        pieces.grid_first_block = p.split_begin;
        return launch_backward_grid<kHeadDim, kHeadDimV, T, kScoreMods, true>(pieces, dependent, stream);
      }
    }
    return cudaSuccess;
  }
}

}  // namespace flashattn::detail::sm80
