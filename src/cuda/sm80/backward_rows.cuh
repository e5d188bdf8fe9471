// The sm80 backward's row kernels and the indexing they share with the main kernels:
//   preprocess: D = rowsum(dO ∘ O) (over head_dim_v) and lse·log2(e) per query row into the workspace, and the fp32
//               dQ accumulator zeroed, padding included (when the workspace has one: p.dq_accum not null),
//               and the split blocks' accumulators (p.dkv_words);
// (the convert kernel, which reads the accumulator's fragment order, is in backward_dq_accum.cuh).
// Rows that see no key (lse = -inf) get lse·log2e = +inf, so their P is exp2(-inf) = 0.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/primitives/grid_dependency.cuh"
#include "cuda/primitives/math.cuh"
#include "cuda/primitives/mma.cuh"
#include "cuda/sm80/backward_params.hpp"

namespace flashattn::detail::sm80 {

// Where this block's sequence lives: its lengths and the first row of the q-side and k-side tensors.
struct BackwardSequence {
  int sq, sk;
  int q_row0, k_row0;  // varlen: rows into the packed tensors; else 0 (batch strides apply)
};

__device__ __forceinline__ BackwardSequence backward_sequence(const BackwardKernelParams& p, int b) {
  if (p.maybe_cu_seqlens_q != nullptr) {
    const int q0 = p.maybe_cu_seqlens_q[b], k0 = p.maybe_cu_seqlens_k[b];
    return {p.maybe_cu_seqlens_q[b + 1] - q0, p.maybe_cu_seqlens_k[b + 1] - k0, q0, k0};
  }
  return {p.seqlen_q, p.seqlen_k, 0, 0};
}

// Element offset of (row i, head h) of sequence b in a q-side or k-side tensor.
__device__ __forceinline__ int64_t row_offset(bool varlen, int b, int row0, int i, int h, int64_t batch_stride,
                                              int64_t row_stride, int64_t head_stride) {
  return (varlen ? 0 : b * batch_stride) + (int64_t{row0} + i) * row_stride + h * head_stride;
}

// Index of (b, h, i) in the workspace arrays.
__device__ __forceinline__ int64_t workspace_row(const BackwardKernelParams& p, int b, int h, int i) {
  return (int64_t{b} * p.heads_q + h) * p.seqlen_q + i;
}

// Float offset of row slot i of (b, h) in the dQ accumulator, slots `width` floats wide
// (p.dq_accum_width; the main and convert kernels pass their head dim, which the launch checks
// equal to it). The slots of a tile hold its rows in fragment order (backward_dq_accum.cuh).
__device__ __forceinline__ int64_t dq_accum_offset(const BackwardKernelParams& p, int b, int h, int64_t i, int width) {
  return ((int64_t{b} * p.heads_q + h) * p.dq_accum_rows + i) * width;
}

template <class T> struct Pair;
template <> struct Pair<__half> {
  __device__ static float2 to_float2(uint32_t x) { return __half22float2(*reinterpret_cast<const __half2*>(&x)); }
};
template <> struct Pair<__nv_bfloat16> {
  __device__ static float2 to_float2(uint32_t x) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
  }
};

// The preprocess kernel: kLanesPerRow lanes per query row (the row's 8-element chunks, one per
// lane: head dims up to 8 kLanesPerRow), so a warp covers 32 / kLanesPerRow rows at once, and
// kPreprocessPasses such groups of rows; every lane issues all of its loads before the first sum.
// It also zeroes the split blocks' dK / dV accumulators and arrival counts (p.dkv_words words),
// spread over all of its threads, and lets the main kernel start at once (dependent_launch): the
// main kernel's blocks load K and V, then wait for this grid to complete.
// Passes measured at d = 64, 2k-16k rows per head: 2 beats 4 by 0-0.7% of the whole backward, and 8
// is worse (docs/perf.md).
inline constexpr int kRowKernelWarps = 4;
inline constexpr int kPreprocessPasses = 2;
template <int kLanesPerRow>
inline constexpr int kPreprocessRowsPerBlock = kRowKernelWarps * kPreprocessPasses * (32 / kLanesPerRow);

// Lanes per row for an instantiation whose rows (of O and dO, and the dQ accumulator's slots) are
// at most `width` elements wide: the power of two at or above width / 8.
constexpr int preprocess_lanes_per_row(int width) { return width <= 64 ? 8 : width <= 128 ? 16 : 32; }

// Grid: row blocks covering the longest sequence's rows and, with an accumulator, its padded rows.
inline int64_t preprocess_rows(const BackwardKernelParams& p) {
  return p.dq_accum != nullptr ? p.dq_accum_rows : p.seqlen_q;
}

template <class T, int kLanesPerRow>
__global__ void __launch_bounds__(kRowKernelWarps * 32) backward_preprocess_kernel(const BackwardKernelParams p) {
  static_assert(kLanesPerRow == 8 || kLanesPerRow == 16 || kLanesPerRow == 32);
  constexpr int kRowsPerPass = 32 / kLanesPerRow;
  const int h = blockIdx.y, b = blockIdx.z, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunk = lane % kLanesPerRow;  // elements 8 chunk .. of the lane's rows
  const BackwardSequence seq = backward_sequence(p, b);
  const bool varlen = p.maybe_cu_seqlens_q != nullptr;
  const int row0 = blockIdx.x * kPreprocessRowsPerBlock<kLanesPerRow> + warp * kPreprocessPasses * kRowsPerPass +
                   lane / kLanesPerRow;
  const auto row_of_pass = [&](int pass) { return row0 + pass * kRowsPerPass; };
  cuda::release_dependent_grid();

  uint4 ov[kPreprocessPasses], dv[kPreprocessPasses];
#pragma unroll
  for (int pass = 0; pass < kPreprocessPasses; ++pass) {
    const int i = row_of_pass(pass);
    ov[pass] = dv[pass] = make_uint4(0u, 0u, 0u, 0u);  // bf16/fp16 zeros: padding adds nothing
    if (i < seq.sq && chunk * 8 < p.head_dim_v) {
      const T* o = static_cast<const T*>(p.o) +
                   row_offset(varlen, b, seq.q_row0, i, h, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
      const T* d_o = static_cast<const T*>(p.d_o) +
                     row_offset(varlen, b, seq.q_row0, i, h, p.do_batch_stride, p.do_row_stride, p.do_head_stride);
      ov[pass] = *reinterpret_cast<const uint4*>(o + chunk * 8);
      dv[pass] = *reinterpret_cast<const uint4*>(d_o + chunk * 8);
    }
  }
#pragma unroll
  for (int pass = 0; pass < kPreprocessPasses; ++pass) {
    const int i = row_of_pass(pass);
    const uint32_t os[4] = {ov[pass].x, ov[pass].y, ov[pass].z, ov[pass].w};
    const uint32_t ds[4] = {dv[pass].x, dv[pass].y, dv[pass].z, dv[pass].w};
    float dot = 0.0f;
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const float2 a = Pair<T>::to_float2(os[x]), c = Pair<T>::to_float2(ds[x]);
      dot = fmaf(a.x, c.x, fmaf(a.y, c.y, dot));
    }
    // Over the row's lanes (xor masks below kLanesPerRow stay inside the aligned group).
#pragma unroll
    for (int mask = kLanesPerRow / 2; mask >= 1; mask /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, mask);
    if (i < seq.sq && chunk == 0) {
      const int64_t row = workspace_row(p, b, h, i);
      const float lse = p.lse[(varlen ? 0 : b * p.lse_batch_stride) + h * p.lse_head_stride + seq.q_row0 + i];
      p.delta[row] = dot;
      p.lse_log2[row] = lse == -INFINITY ? INFINITY : lse * cuda::kLog2e;
    }
    // Row slot i of (b, h), not row i of dQ (the tiles are in fragment order): all slots below
    // dq_accum_rows together zero every tile.
    if (p.dq_accum != nullptr && i < p.dq_accum_rows && chunk * 8 < p.dq_accum_width) {
      float4* acc = reinterpret_cast<float4*>(p.dq_accum + dq_accum_offset(p, b, h, i, p.dq_accum_width) + chunk * 8);
      acc[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      acc[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  if (p.dkv_words > 0) {  // 16-byte aligned (backward_params.hpp), the last words one at a time
    const int64_t threads = int64_t{gridDim.x} * gridDim.y * gridDim.z * blockDim.x;
    const int64_t first = ((int64_t{blockIdx.z} * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x +
                          threadIdx.x;
    for (int64_t x = first; x < p.dkv_words / 4; x += threads)
      reinterpret_cast<float4*>(p.dkv_accum)[x] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int64_t x = p.dkv_words / 4 * 4 + first; x < p.dkv_words; x += threads) p.dkv_accum[x] = 0.0f;
  }
}

}  // namespace flashattn::detail::sm80
