// The sm80 backward's fp32 dQ accumulator (the non-deterministic path): the main kernel's
// reductions into it and the convert kernel that reads it back.
//
// Each (b, h) has dq_accum_rows / Br tiles of Br query rows (the main kernel's step) by the
// instantiation's head dim, and a tile holds dQ in the order of the dQ GEMM's accumulators, not
// row-major: thread tid's fragment (mt, nt) of the dQ warp grid, an m16 x n8 block shared by its
// warp, has its four accumulators at (mt · kNTiles + nt) · 4 · kThreads + 4 tid. So a warp adds
// one fragment with one 16-byte reduction per lane, 512 consecutive bytes: four whole 128-byte
// lines per instruction. In row-major order the same fragment is 8 rows apart, 8 lines for every
// 8-byte pair (4x the L1 requests, issued in a burst at the end of each step; docs/perf.md).
// Rows past the sequence end and columns past head_dim are padding inside whole tiles: the adds
// need no bounds checks, and the convert kernel skips them.
//
// Convert: one block per tile scales by the softmax scale, rounds to T and un-permutes through
// shared memory into 16-byte row chunks of dQ.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/primitives/grid_dependency.cuh"
#include "cuda/primitives/mma.cuh"
#include "cuda/primitives/reduce.cuh"
#include "cuda/sm80/backward_params.hpp"
#include "cuda/sm80/backward_policy.hpp"
#include "cuda/sm80/backward_rows.cuh"
#include "cuda/sm80/warp_grid.cuh"

namespace flashattn::detail::sm80 {

template <int kHeadDim, int kHeadDimV, bool kScoreMods>
struct DqAccumLayout {
  static constexpr BackwardTiles kTiles = BackwardPolicy<kHeadDim, kHeadDimV, kScoreMods>::kTiles;
  static constexpr int kBlockM = kTiles.block_m;
  // The dQ GEMM's warp grid: [Br x d], dq_query_warps along the queries.
  using Grid = WarpGrid<kBlockM, kHeadDim, kTiles.dq_query_warps, kTiles.warps / kTiles.dq_query_warps>;
  static constexpr int kThreads = kTiles.threads();
  static constexpr int kFragments = Grid::kMTiles * Grid::kNTiles;  // per thread
  static_assert(kFragments * 4 * kThreads == kBlockM * kHeadDim);
  static_assert(kDqAccumRowMultiple % kBlockM == 0, "accumulator rows are padded to whole tiles");

  // Float offset of fragment (mt, nt) of thread 0 inside a tile (thread tid's: + 4 tid).
  __device__ static constexpr int fragment_offset(int mt, int nt) { return (mt * Grid::kNTiles + nt) * 4 * kThreads; }
  // The tile of (b, h) whose first row is i0 (a multiple of Br).
  __device__ static float* tile(const BackwardKernelParams& p, int b, int h, int i0) {
    return p.dq_accum + dq_accum_offset(p, b, h, i0, kHeadDim);
  }
};

// dQ += dS K for one warp, added into the step's tile: A = dS, read transposed from dS^T, B = K
// (rows keys, the reduction). kPassSlabs of the warp's 16-column slabs at a time.
template <class T, class Layout, int kKSteps, int kPassSlabs, class PTile, class KTile>
__device__ __forceinline__ void accumulate_dq(float* tile, uint32_t dst_smem, uint32_t k_smem,
                                              const typename Layout::Grid& grid, int tid) {
  using Grid = typename Layout::Grid;
  static_assert((Grid::kNTiles / 2) % kPassSlabs == 0);
  const int lane = tid % 32;
  float* const mine = tile + 4 * tid;  // constant offsets below
#pragma unroll
  for (int slab0 = 0; slab0 < Grid::kNTiles / 2; slab0 += kPassSlabs) {
    cuda::FragC dq[Grid::kMTiles][2 * kPassSlabs];
    zero_fragments(dq);
    warp_gemm<T, Grid, kKSteps, TileRows::kK, TileRows::kK, PTile, KTile, kPassSlabs>(dq, dst_smem, k_smem, grid, lane,
                                                                                      slab0);
#pragma unroll
    for (int mt = 0; mt < Grid::kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2 * kPassSlabs; ++nt) {
        const float* x = dq[mt][nt].x;
        cuda::red_add_f32x4(mine + Layout::fragment_offset(mt, 2 * slab0 + nt), make_float4(x[0], x[1], x[2], x[3]));
      }
  }
}

inline constexpr int kConvertDqThreads = 128;

// dQ = scale · accumulator for one tile (grid: tiles, heads_q, batch).
template <int kHeadDim, int kHeadDimV, class T, bool kScoreMods>
__global__ void __launch_bounds__(kConvertDqThreads) backward_convert_dq_kernel(const BackwardKernelParams p) {
  using Layout = DqAccumLayout<kHeadDim, kHeadDimV, kScoreMods>;
  using Grid = typename Layout::Grid;
  constexpr int kBlockM = Layout::kBlockM;
  // Rows padded by 16 bytes: the 8 rows of a fragment's lanes fall in 8 different bank groups.
  constexpr int kRowBytes = kHeadDim * 2 + 16;
  __shared__ __align__(16) char rows[kBlockM * kRowBytes];

  const int i0 = blockIdx.x * kBlockM, h = blockIdx.y, b = blockIdx.z;
  cuda::wait_for_primary_grid();  // the main kernel's adds (dependent_launch)
  const BackwardSequence seq = backward_sequence(p, b);
  if (i0 >= seq.sq) return;  // varlen: this sequence is shorter than the longest
  const float4* tile = reinterpret_cast<const float4*>(Layout::tile(p, b, h, i0));
  for (int f = threadIdx.x; f < kBlockM * kHeadDim / 4; f += kConvertDqThreads) {
    const float4 x = tile[f];
    const int tid = f % Layout::kThreads, lane = tid % 32, fragment = f / Layout::kThreads;
    const int nt = fragment % Grid::kNTiles, mt = fragment / Grid::kNTiles;
    const Grid grid(tid / 32);
    char* at = rows + (grid.row0(mt) + lane / 4) * kRowBytes + (grid.col0(nt) + 2 * (lane % 4)) * 2;
    *reinterpret_cast<uint32_t*>(at) = cuda::MmaType<T>::pack(x.x * p.scale, x.y * p.scale);
    *reinterpret_cast<uint32_t*>(at + 8 * kRowBytes) = cuda::MmaType<T>::pack(x.z * p.scale, x.w * p.scale);
  }
  __syncthreads();

  const bool varlen = p.maybe_cu_seqlens_q != nullptr;
  const int rows_valid = min(kBlockM, seq.sq - i0), chunks = p.head_dim / 8;
  T* dq = static_cast<T*>(p.dq) +
          row_offset(varlen, b, seq.q_row0, i0, h, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  for (int c = threadIdx.x; c < rows_valid * chunks; c += kConvertDqThreads) {
    const int row = c / chunks, chunk = c % chunks;
    *reinterpret_cast<uint4*>(dq + row * p.dq_row_stride + chunk * 8) =
        *reinterpret_cast<const uint4*>(rows + row * kRowBytes + chunk * 16);
  }
}

}  // namespace flashattn::detail::sm80
