// FlashAttention-2 backward for sm_80 and later, on mma.sync: the main kernel. It runs between the
// row kernels of backward_rows.cuh (preprocess: D and lse·log2e; convert: dQ). One thread block per
// (Bc keys, kv head, batch) keeps K and V of its keys in shared memory and dK, dV in registers, and
// walks the Br-row query tiles that see its keys, for every query head of its GQA group (no partial
// dK/dV per query head, no reduction):
//   S^T  = K Q^T                     P^T = exp2(S^T scale log2e - lse log2e)
//   dP^T = V dO^T                    dS^T = P^T ∘ (dP^T - D)
//   dV  += P^T dO                    dK  += dS^T Q
//   dQ  += dS K  (fp32 atomic adds into the workspace; the warps split the query rows here; skipped
//                 when p.dq_accum is null: the deterministic path computes dQ in its own kernel)
// Each warp owns 16 keys, so P^T and dS^T leave the accumulators as A operands directly.
// dK is scaled once in the epilogue.
//
// The dQ atomics make dQ depend on the order in which blocks add, in the last bits (dK and dV do
// not: each is owned by one block and accumulated in a fixed order).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/primitives/cp_async.cuh"
#include "cuda/primitives/ldmatrix.cuh"
#include "cuda/primitives/math.cuh"
#include "cuda/primitives/reduce.cuh"
#include "cuda/primitives/smem_tile.cuh"
#include "cuda/sm80/backward_params.hpp"
#include "cuda/sm80/backward_policy.hpp"
#include "cuda/sm80/backward_rows.cuh"
#include "cuda/sm80/epilogue.cuh"
#include "cuda/sm80/mask.cuh"
#include "cuda/sm80/tile_load.cuh"
#include "cuda/sm80/warp_gemm.cuh"

namespace flashattn::detail::sm80 {

// dQ += dS K for one warp's 16 query rows, added into the fp32 accumulator rows dq_rows (row
// stride head_dim). dS comes from the dS^T tile in shared memory (its transpose through
// ldmatrix.trans), K is the B operand the way P·V reads V. The head dim goes kDTilesPerPass n8
// tiles at a time, so that only those accumulators are live beside dK and dV.
// Of the head dim, the warp takes kDTiles n8 tiles from d_tile0 (the warps that share query rows
// split it).
template <class T, int kKeySteps, int kDTiles, class DsTile, class KTile>
__device__ __forceinline__ void gemm_ds_k_accumulate(float* dq_rows, int rows_valid, int head_dim, uint32_t ds_smem,
                                                     uint32_t k_smem, int q_rows0, int d_tile0, int lane) {
  constexpr int kDTilesPerPass = kDTiles % 4 == 0 ? 4 : 2;
  static_assert(kDTiles % kDTilesPerPass == 0);
  // ldmatrix.x4.trans lane roles: (keys 0-7, queries 0-7), (keys 0-7, queries 8-15),
  // (keys 8-15, queries 0-7), (keys 8-15, queries 8-15) as a0..a3 of dS.
  const uint32_t a_offset = DsTile::offset((lane & 7) + ((lane >> 4) << 3), q_rows0 / 8 + ((lane >> 3) & 1));
  cuda::FragA ds[kKeySteps];
#pragma unroll
  for (int kk = 0; kk < kKeySteps; ++kk)
    cuda::ldmatrix_x4_trans(ds[kk].x, ds_smem + DsTile::advance(a_offset, 16 * kk, 0));
  const uint32_t b_offset = KTile::offset((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int pass = 0; pass < kDTiles / kDTilesPerPass; ++pass) {
    cuda::FragC dq[kDTilesPerPass];
#pragma unroll
    for (int dt = 0; dt < kDTilesPerPass; ++dt) dq[dt] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int kk = 0; kk < kKeySteps; ++kk)
#pragma unroll
      for (int dp = 0; dp < kDTilesPerPass / 2; ++dp) {
        uint32_t b[4];
        cuda::ldmatrix_x4_trans(b, k_smem + KTile::advance(b_offset, 16 * kk, d_tile0 + 2 * (pass * kDTilesPerPass / 2 + dp)));
        cuda::mma_m16n8k16<T>(dq[2 * dp], ds[kk], {b[0], b[1]});
        cuda::mma_m16n8k16<T>(dq[2 * dp + 1], ds[kk], {b[2], b[3]});
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = g + 8 * r;
      if (row >= rows_valid) continue;
#pragma unroll
      for (int dt = 0; dt < kDTilesPerPass; ++dt) {
        const int col = (d_tile0 + pass * kDTilesPerPass + dt) * 8 + 2 * t;
        if (col < head_dim) {  // head_dim is a multiple of 8: both columns or neither
          cuda::red_add_f32x2(dq_rows + int64_t{row} * head_dim + col, dq[dt].x[2 * r], dq[dt].x[2 * r + 1]);
        }
      }
    }
  }
}

template <int kHeadDim, class T>
__global__ void __launch_bounds__(BackwardPolicy<kHeadDim>::kTiles.threads(), BackwardPolicy<kHeadDim>::kTiles.min_blocks)
    backward_kernel(const BackwardKernelParams p) {
  constexpr BackwardTiles kTiles = BackwardPolicy<kHeadDim>::kTiles;
  constexpr int kBlockM = kTiles.block_m, kBlockN = kTiles.block_n, kThreads = kTiles.threads();
  constexpr int kQTiles = kBlockM / 8;   // n8 tiles of S^T (queries)
  constexpr int kDTiles = kHeadDim / 8;  // n8 tiles of dK, dV, dQ
  using KTile = cuda::SwizzledTile<kBlockN, kHeadDim>;  // K and V
  using QTile = cuda::SwizzledTile<kBlockM, kHeadDim>;  // Q and dO
  using DsTile = cuda::SwizzledTile<kBlockN, kBlockM>;  // dS^T: rows keys, columns queries
  using KLoad = TileLoad<T, kBlockN, kHeadDim, kThreads>;
  using QLoad = TileLoad<T, kBlockM, kHeadDim, kThreads>;
  static_assert(KTile::kBytes == kTiles.tile_bytes(kBlockN) && QTile::kBytes == kTiles.tile_bytes(kBlockM));
  static_assert(DsTile::kBytes == kTiles.ds_bytes());
  // dQ: warps split the Br rows in m16 tiles, then the head dim.
  constexpr int kRowGroups = kBlockM / 16, kDSplit = kTiles.warps / kRowGroups;

  // Shared memory: K, V (resident), dS^T, then two buffers of the per-step operands: Q, dO, and
  // the step's rows' lse·log2e and D. The next step's buffer fills while this one is in use.
  extern __shared__ __align__(128) char smem[];
  const uint32_t k_addr = cuda::smem_address(smem);
  const uint32_t v_addr = k_addr + KTile::kBytes;
  char* ds_tile = smem + 2 * KTile::kBytes;
  const uint32_t ds_addr = cuda::smem_address(ds_tile);
  char* const step_buffers = ds_tile + DsTile::kBytes;
  constexpr int kStepBytes = kTiles.step_bytes();
  const auto q_tile_of = [&](int buf) { return cuda::smem_address(step_buffers + buf * kStepBytes); };
  const auto do_tile_of = [&](int buf) { return q_tile_of(buf) + QTile::kBytes; };
  const auto lse_of = [&](int buf) { return reinterpret_cast<float*>(step_buffers + buf * kStepBytes + 2 * QTile::kBytes); };

  const int n_block = blockIdx.x, h_kv = blockIdx.y, b = blockIdx.z;
  const BackwardSequence seq = backward_sequence(p, b);
  const int j0 = n_block * kBlockN;
  if (j0 >= seq.sk) return;  // varlen: this sequence is shorter than the longest
  const int j1 = min(j0 + kBlockN, seq.sk);
  const Band band{seq.sk, p.bottom_right ? seq.sk - seq.sq : 0, p.window_left, p.window_right};

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int warp_rows0 = warp * 16;  // the warp's keys in S^T, dK, dV
  const bool varlen = p.maybe_cu_seqlens_q != nullptr;

  const T* k = static_cast<const T*>(p.k) +
               row_offset(varlen, b, seq.k_row0, j0, h_kv, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  const T* v = static_cast<const T*>(p.v) +
               row_offset(varlen, b, seq.k_row0, j0, h_kv, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  KLoad::issue(k_addr, k, p.k_row_stride, j1 - j0, p.head_dim, tid);
  KLoad::issue(v_addr, v, p.v_row_stride, j1 - j0, p.head_dim, tid);
  cuda::cp_async_commit();

  cuda::FragC dk[1][kDTiles], dv[1][kDTiles];
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt) dk[0][dt] = dv[0][dt] = {0.0f, 0.0f, 0.0f, 0.0f};

  // The query tiles that see these keys form one run [m_first, m_end) (the band's edges grow with
  // the row); the block walks it once per query head of its group: steps s = hg·count + (m - m_first).
  const int m_count = (seq.sq + kBlockM - 1) / kBlockM;
  const auto sees_block = [&](int m) {
    const KeyRange seen = band.visible_keys(m * kBlockM, min(m * kBlockM + kBlockM, seq.sq));
    return seen.hi > j0 && seen.lo < j1;
  };
  int m_first = 0;
  while (m_first < m_count && !sees_block(m_first)) ++m_first;
  int m_end = m_first;
  while (m_end < m_count && sees_block(m_end)) ++m_end;
  const int steps_per_head = m_end - m_first, steps = steps_per_head * p.group;

  // Issues the loads of step s into buffer buf: Q and dO through cp.async (rows past the end
  // zero-filled), lse·log2e and D through 4-byte cp.async; rows past the end get lse·log2e = +inf
  // (P = 0) and D = 0 by plain stores (the buffer was last read two steps ago, before a barrier).
  const auto issue_step = [&](int s, int buf) {
    const int h = h_kv * p.group + s / steps_per_head;
    const int i0 = (m_first + s % steps_per_head) * kBlockM, rows = min(kBlockM, seq.sq - i0);
    const T* q = static_cast<const T*>(p.q) +
                 row_offset(varlen, b, seq.q_row0, i0, h, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
    const T* d_o = static_cast<const T*>(p.d_o) +
                   row_offset(varlen, b, seq.q_row0, i0, h, p.do_batch_stride, p.do_row_stride, p.do_head_stride);
    QLoad::issue(q_tile_of(buf), q, p.q_row_stride, rows, p.head_dim, tid);
    QLoad::issue(do_tile_of(buf), d_o, p.do_row_stride, rows, p.head_dim, tid);
    if (tid < 2 * kBlockM) {
      const int r = tid % kBlockM;
      float* dst = lse_of(buf) + tid;  // lse·log2e [kBlockM], then D [kBlockM]
      if (r < rows) {
        const int64_t row = workspace_row(p, b, h, i0 + r);
        cuda::cp_async_4(cuda::smem_address(dst), tid < kBlockM ? p.lse_log2 + row : p.delta + row);
      } else {
        *dst = tid < kBlockM ? INFINITY : 0.0f;
      }
    }
    cuda::cp_async_commit();
  };

  if (steps > 0) issue_step(0, 0);
  for (int s = 0; s < steps; ++s) {
    const int buf = s & 1;
    const int h = h_kv * p.group + s / steps_per_head;
    const int i0 = (m_first + s % steps_per_head) * kBlockM, i1 = min(i0 + kBlockM, seq.sq);
    // Prefetch step s + 1 into the other buffer (read last in step s - 1, before its dS^T barrier),
    // then wait for step s's group (and K, V) only.
    if (s + 1 < steps) {
      issue_step(s + 1, buf ^ 1);
      cuda::cp_async_wait<1>();
    } else {
      cuda::cp_async_wait<0>();
    }
    __syncthreads();  // step s's operands are visible to all; every warp is done with step s - 1's dS^T
    const uint32_t q_addr = q_tile_of(buf), do_addr = do_tile_of(buf);
    const float* lse_log2_s = lse_of(buf);
    const float* delta_s = lse_log2_s + kBlockM;

      // S^T = K Q^T, masked, then P^T in place.
      cuda::FragC st[1][kQTiles];
      gemm_qk<T, 1, kQTiles, kHeadDim, KTile, QTile>(st, k_addr, q_addr, warp_rows0, lane);
      const KeyRange full = band.keys_seen_by_all(i0, i1);
      if (j0 < full.lo || j0 + kBlockN > full.hi) apply_band_mask_transposed(st, band, i0, j0 + warp_rows0, lane);
#pragma unroll
      for (int nt = 0; nt < kQTiles; ++nt) {
        const float2 lse = *reinterpret_cast<const float2*>(lse_log2_s + nt * 8 + 2 * t);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          st[0][nt].x[2 * r] = cuda::fast_exp2(fmaf(st[0][nt].x[2 * r], p.scale_log2, -lse.x));
          st[0][nt].x[2 * r + 1] = cuda::fast_exp2(fmaf(st[0][nt].x[2 * r + 1], p.scale_log2, -lse.y));
        }
      }

      // dP^T = V dO^T, then dS^T = P^T ∘ (dP^T - D) in place.
      cuda::FragC dst[1][kQTiles];
      gemm_qk<T, 1, kQTiles, kHeadDim, KTile, QTile>(dst, v_addr, do_addr, warp_rows0, lane);
#pragma unroll
      for (int nt = 0; nt < kQTiles; ++nt) {
        const float2 delta = *reinterpret_cast<const float2*>(delta_s + nt * 8 + 2 * t);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          dst[0][nt].x[2 * r] = st[0][nt].x[2 * r] * (dst[0][nt].x[2 * r] - delta.x);
          dst[0][nt].x[2 * r + 1] = st[0][nt].x[2 * r + 1] * (dst[0][nt].x[2 * r + 1] - delta.y);
        }
      }

      cuda::FragA pt_frag[1][kQTiles / 2], dst_frag[1][kQTiles / 2];
      pack_p<T>(pt_frag, st);
      pack_p<T>(dst_frag, dst);
      // dS^T to shared memory for dQ: A fragment register x holds rows g / g + 8 (x odd), query
      // columns 2t.. / 2t + 8.. (x >= 2) of the 16-query step kk.
#pragma unroll
      for (int kk = 0; kk < kQTiles / 2; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x)
          *reinterpret_cast<uint32_t*>(ds_tile + DsTile::offset(warp_rows0 + g + 8 * (x & 1), 2 * kk + (x >> 1)) +
                                       4 * t) = dst_frag[0][kk].x[x];

      gemm_pv<T, 1, kQTiles / 2, kDTiles, QTile>(dv, pt_frag, do_addr, lane);
      gemm_pv<T, 1, kQTiles / 2, kDTiles, QTile>(dk, dst_frag, q_addr, lane);
      __syncthreads();  // dS^T is whole; every warp is done with this step's Q and dO

      if (p.dq_accum == nullptr) continue;  // dQ has its own kernel (deterministic mode)
      const int q_rows0 = (warp % kRowGroups) * 16;
      gemm_ds_k_accumulate<T, kBlockN / 16, kDTiles / kDSplit, DsTile, KTile>(
          p.dq_accum + workspace_row(p, b, h, i0 + q_rows0) * p.head_dim, i1 - i0 - q_rows0, p.head_dim, ds_addr,
          k_addr, q_rows0, (warp / kRowGroups) * (kDTiles / kDSplit), lane);
  }

  // Epilogue: dK = scale · dS^T Q, and dV, staged over the K and V tiles they belong to.
  cuda::cp_async_wait<0>();  // K and V, when there was no step
  __syncthreads();
#pragma unroll
  for (int dt = 0; dt < kDTiles; ++dt)
#pragma unroll
    for (int x = 0; x < 4; ++x) dk[0][dt].x[x] *= p.scale;
  const int rows_valid = j1 - j0 - warp_rows0;
  T* dk_out = static_cast<T*>(p.dk) + row_offset(varlen, b, seq.k_row0, j0 + warp_rows0, h_kv, p.dk_batch_stride,
                                                  p.dk_row_stride, p.dk_head_stride);
  T* dv_out = static_cast<T*>(p.dv) + row_offset(varlen, b, seq.k_row0, j0 + warp_rows0, h_kv, p.dv_batch_stride,
                                                  p.dv_row_stride, p.dv_head_stride);
  store_output<T, 1, kDTiles, kHeadDim, KTile>(dk, smem, warp_rows0, dk_out, p.dk_row_stride, rows_valid,
                                               p.head_dim, lane);
  store_output<T, 1, kDTiles, kHeadDim, KTile>(dv, smem + KTile::kBytes, warp_rows0, dv_out, p.dv_row_stride, rows_valid,
                                               p.head_dim, lane);
}

}  // namespace flashattn::detail::sm80
