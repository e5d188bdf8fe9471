// The sm80 backward's deterministic dQ kernel: dQ without atomics, so that two runs give the same
// bits. It runs after the preprocess (D and lse·log2e in the workspace) and beside the main kernel
// launched without a dQ accumulator (backward_launch.cuh). One thread block owns Br query rows of
// one (batch, query head) and walks the key tiles its rows see, last to first, as the forward
// does; the warps split the rows and keep dQ of their rows in registers:
//   S  = Q K^T                 P  = exp2(S scale log2e - lse log2e)   (P = 0 outside the band)
//   dP = dO V^T                dS = P ∘ (dP - D)
//   dQ += dS K                 (dS packed to T as the A operand straight from the accumulators,
//                              like P in the forward's P·V; K read through ldmatrix.trans like V)
// and ends with dQ = scale · dQ. Each element of dQ is summed by one thread in one fixed order.
// Rows past the sequence end and rows that see no key (lse·log2e = +inf) have P = 0; a block whose
// rows see no key writes dQ = 0.
//
// dO and V have head_dim_v columns (kHeadDimV may differ from kHeadDim): dP = dO V^T reduces over
// them. kScoreMods: the variant with softcap, ALiBi, bias and mask (backward_score_mods.cuh),
// launched only when one is on; it recomputes the forward's logits from S and takes
// P ∘ (1 - (y/softcap)²) in place of P (P itself is not needed here).
//
// Pipeline (two K and two V buffers; Q and dO loaded once with the first K):
//   wait K(n) | issue K(n-1) | S = Q K(n)^T, mask, P | wait V(n) | issue V(n-1) | dP = dO V(n)^T, dS, dQ += dS K(n)
// The barrier before each issue also tells that every warp is done with the buffer it overwrites:
// K(n+1) is last read by dQ += dS K(n+1), before the barrier of step n.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/primitives/cp_async.cuh"
#include "cuda/primitives/ldmatrix.cuh"
#include "cuda/primitives/math.cuh"
#include "cuda/primitives/smem_tile.cuh"
#include "cuda/sm80/backward_dq_policy.hpp"
#include "cuda/sm80/backward_params.hpp"
#include "cuda/sm80/backward_rows.cuh"
#include "cuda/sm80/backward_score_mods.cuh"
#include "cuda/sm80/epilogue.cuh"
#include "cuda/sm80/mask.cuh"
#include "cuda/sm80/tile_load.cuh"
#include "cuda/sm80/warp_gemm.cuh"

namespace flashattn::detail::sm80 {

// The per-row values of the workspace for this lane's rows (rows g and g + 8 of each m16 tile from
// rows0): lse·log2e and D. Rows at or past rows_end get +inf and 0, so that their P is 0.
template <int kMTiles>
__device__ __forceinline__ void load_row_stats(float (&lse_log2)[kMTiles][2], float (&delta)[kMTiles][2],
                                               const BackwardKernelParams& p, int b, int h, int rows0, int rows_end,
                                               int lane) {
  const int g = lane >> 2;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = rows0 + mt * 16 + g + 8 * r;
      const bool valid = i < rows_end;
      const int64_t row = workspace_row(p, b, h, valid ? i : 0);
      lse_log2[mt][r] = valid ? p.lse_log2[row] : INFINITY;
      delta[mt][r] = valid ? p.delta[row] : 0.0f;
    }
}

// The score-modifier variant's P ∘ (1 - (y/softcap)²) from the raw scores of S (rows: the warp's
// queries from rows0; columns: keys from j0), each element's logit through the modifiers, then
// the band.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void probabilities_rows(cuda::FragC (&s)[kMTiles][kNTiles], const BackwardScoreMods& mods,
                                                   const Band& band, const float (&lse_log2)[kMTiles][2], int rows0,
                                                   int j0, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = rows0 + mt * 16 + g + 8 * r;
      const KeyRange keys = band.visible_keys(i);
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = j0 + nt * 8 + 2 * t + e;
          float& x = s[mt][nt].x[2 * r + e];
          mods.probability(x, i, j, keys.lo <= j && j < keys.hi, lse_log2[mt][r], x);
        }
    }
}

template <int kHeadDim, int kHeadDimV, class T, bool kScoreMods>
__global__ void __launch_bounds__(BackwardDqPolicy<kHeadDim, kHeadDimV, kScoreMods>::kTiles.threads(),
                                  BackwardDqPolicy<kHeadDim, kHeadDimV, kScoreMods>::kTiles.min_blocks)
    backward_dq_kernel(const BackwardKernelParams p) {
  constexpr BackwardDqTiles kTiles = BackwardDqPolicy<kHeadDim, kHeadDimV, kScoreMods>::kTiles;
  constexpr int kBlockM = kTiles.block_m, kBlockN = kTiles.block_n, kThreads = kTiles.threads();
  constexpr int kMTiles = kTiles.warp_rows() / 16;  // m16 tiles per warp
  constexpr int kNTiles = kBlockN / 8;              // n8 tiles of S and dP per key tile
  constexpr int kDTiles = kHeadDim / 8;             // n8 tiles of dQ
  using QTile = cuda::SwizzledTile<kBlockM, kHeadDim>;    // Q; the epilogue stages dQ over it
  using DoTile = cuda::SwizzledTile<kBlockM, kHeadDimV>;  // dO
  using KTile = cuda::SwizzledTile<kBlockN, kHeadDim>;    // K
  using VTile = cuda::SwizzledTile<kBlockN, kHeadDimV>;   // V
  using QLoad = TileLoad<T, kBlockM, kHeadDim, kThreads>;
  using DoLoad = TileLoad<T, kBlockM, kHeadDimV, kThreads>;
  using KLoad = TileLoad<T, kBlockN, kHeadDim, kThreads>;
  using VLoad = TileLoad<T, kBlockN, kHeadDimV, kThreads>;
  static_assert(QTile::kBytes == kTiles.tile_bytes(kBlockM, kHeadDim) &&
                DoTile::kBytes == kTiles.tile_bytes(kBlockM, kHeadDimV) &&
                KTile::kBytes == kTiles.tile_bytes(kBlockN, kHeadDim) &&
                VTile::kBytes == kTiles.tile_bytes(kBlockN, kHeadDimV));
  static_assert(BackwardDqTiles::kStages == 2, "the pipeline below double-buffers K and V");

  extern __shared__ __align__(128) char smem[];
  const uint32_t q_addr = cuda::smem_address(smem);
  const uint32_t do_addr = q_addr + QTile::kBytes;
  const uint32_t k_addr0 = do_addr + DoTile::kBytes;     // two K tiles
  const uint32_t v_addr0 = k_addr0 + 2 * KTile::kBytes;  // two V tiles
  // Tile n lives in buffer n % 2.
  const auto k_buffer = [=](int n) { return k_addr0 + (n & 1) * KTile::kBytes; };
  const auto v_buffer = [=](int n) { return v_addr0 + (n & 1) * VTile::kBytes; };

  // Heaviest blocks (last rows: most keys under causal masking) launch first.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, h_kv = h / p.group;
  const BackwardSequence seq = backward_sequence(p, b);
  const int i0 = m_block * kBlockM;
  if (i0 >= seq.sq) return;  // varlen: this sequence is shorter than the longest
  const int i1 = min(i0 + kBlockM, seq.sq);
  const Band band{seq.sk, p.bottom_right ? seq.sk - seq.sq : 0, p.window_left, p.window_right};
  const KeyRange keys = band.visible_keys(i0, i1);
  const int n_begin = keys.lo / kBlockN;
  const int n_end = (keys.hi + kBlockN - 1) / kBlockN;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_rows0 = warp * kTiles.warp_rows();
  const bool varlen = p.maybe_cu_seqlens_q != nullptr;

  float lse_log2[kMTiles][2], delta[kMTiles][2];
  load_row_stats(lse_log2, delta, p, b, h, i0 + warp_rows0, i1, lane);

  cuda::FragC dq[kMTiles][kDTiles];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) dq[mt][dt] = {0.0f, 0.0f, 0.0f, 0.0f};

  if (n_begin < n_end) {
    const T* q = static_cast<const T*>(p.q) +
                 row_offset(varlen, b, seq.q_row0, i0, h, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
    const T* d_o = static_cast<const T*>(p.d_o) +
                   row_offset(varlen, b, seq.q_row0, i0, h, p.do_batch_stride, p.do_row_stride, p.do_head_stride);
    const T* k = static_cast<const T*>(p.k) +
                 row_offset(varlen, b, seq.k_row0, 0, h_kv, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
    const T* v = static_cast<const T*>(p.v) +
                 row_offset(varlen, b, seq.k_row0, 0, h_kv, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
    const auto kv_rows = [&](int n) { return min(kBlockN, seq.sk - n * kBlockN); };
    const auto issue_k = [&](int n) {
      KLoad::issue(k_buffer(n), k + int64_t{n} * kBlockN * p.k_row_stride, p.k_row_stride, kv_rows(n), p.head_dim,
                   tid);
    };
    const auto issue_v = [&](int n) {
      VLoad::issue(v_buffer(n), v + int64_t{n} * kBlockN * p.v_row_stride, p.v_row_stride, kv_rows(n),
                   p.head_dim_v, tid);
    };

    // Rows past the sequence end are zero-filled: their S and dP are finite, and P = 0 there.
    QLoad::issue(q_addr, q, p.q_row_stride, i1 - i0, p.head_dim, tid);
    DoLoad::issue(do_addr, d_o, p.do_row_stride, i1 - i0, p.head_dim_v, tid);
    issue_k(n_end - 1);
    cuda::cp_async_commit();
    issue_v(n_end - 1);
    cuda::cp_async_commit();

    // Tiles that every row sees whole skip the per-element mask.
    [[maybe_unused]] const KeyRange full = band.keys_seen_by_all(i0, i1);
    // Every step commits two groups (empty at the end), so "all but the newest group" is always
    // the tile about to be read.
    for (int n = n_end - 1; n >= n_begin; --n) {
      const int j0 = n * kBlockN;
      cuda::cp_async_wait<1>();
      __syncthreads();  // K(n) is in (with Q and dO at the first step); K(n+1) is free
      if (n > n_begin) issue_k(n - 1);
      cuda::cp_async_commit();

      cuda::FragC s[kMTiles][kNTiles];
      gemm_qk<T, kMTiles, kNTiles, kHeadDim, QTile, KTile>(s, q_addr, k_buffer(n), warp_rows0, lane);
      if constexpr (kScoreMods) {
        const BackwardScoreMods mods = BackwardScoreMods::resolve(p, b, h, band.diagonal, seq.sq, seq.sk);
        probabilities_rows(s, mods, band, lse_log2, i0 + warp_rows0, j0, lane);
      } else {
        if (j0 < full.lo || j0 + kBlockN > full.hi) apply_band_mask(s, band, i0 + warp_rows0, j0, lane);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)
              s[mt][nt].x[e] = cuda::fast_exp2(fmaf(s[mt][nt].x[e], p.scale_log2, -lse_log2[mt][e / 2]));
      }

      cuda::cp_async_wait<1>();
      __syncthreads();  // V(n) is in; V(n+1) is free
      if (n > n_begin) issue_v(n - 1);
      cuda::cp_async_commit();

      cuda::FragC dp[kMTiles][kNTiles];
      gemm_qk<T, kMTiles, kNTiles, kHeadDimV, DoTile, VTile>(dp, do_addr, v_buffer(n), warp_rows0, lane);
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) dp[mt][nt].x[e] = s[mt][nt].x[e] * (dp[mt][nt].x[e] - delta[mt][e / 2]);
      cuda::FragA ds[kMTiles][kNTiles / 2];
      pack_p<T>(ds, dp);
      gemm_pv<T, kMTiles, kNTiles / 2, kDTiles, KTile>(dq, ds, k_buffer(n), lane);
    }
    cuda::cp_async_wait<0>();  // only empty groups remain
  }

  // Epilogue: dQ = scale · dS K, staged over the warp's own rows of the Q tile (no other warp reads
  // them, and no copy is in flight).
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dq[mt][dt].x[e] *= p.scale;
  T* dq_out = static_cast<T*>(p.dq) + row_offset(varlen, b, seq.q_row0, i0 + warp_rows0, h, p.dq_batch_stride,
                                                  p.dq_row_stride, p.dq_head_stride);
  store_output<T, kMTiles, kDTiles, QTile>(dq, smem, warp_rows0, dq_out, p.dq_row_stride, i1 - i0 - warp_rows0,
                                           p.head_dim, lane);
}

}  // namespace flashattn::detail::sm80
