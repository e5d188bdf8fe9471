// Score modifiers of one (sequence, head): the device twin of problem.hpp's ScoreMods::apply,
// in the same order on the scaled score x = scale·q·k:
//   softcap:  x -> softcap·tanh(x / softcap)
//   ALiBi:    x -= slope·|i + diagonal - j|
//   bias:     x += bias[i, j]
//   mask:     x = -inf where mask[i, j] == 0
// The kernel variant that applies them hands the softmax final logits (natural units), so the
// softmax then scales by log2 e alone. Rows i >= rows and keys j >= cols are never read (the band
// mask hides those keys; those rows are never stored).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "cuda/primitives/math.cuh"
#include "cuda/primitives/mma.cuh"
#include "cuda/sm80/kernel_params.hpp"

namespace flashattn::detail::sm80 {

// The modifiers of sequence b, head h (b indexes sequences under varlen, like problem.hpp). Only
// the indices live in registers across the K loop; everything else is read from the kernel params
// (constant memory) where it is used, which keeps the variant free of spills.
struct ScoreMods {
  int b, h;
  int diagonal;    // query i's diagonal key is i + diagonal
  int rows, cols;  // the sequence's seqlen_q and seqlen_k

  // softcap·tanh(x / softcap) with x = scale·s, as softcap - 2 softcap / (1 + 2^(2 log2e x / softcap)):
  // one exp2 and one reciprocal, absolute error a few ulp of softcap, where tanh.approx (relative
  // error 2^-11) would move saturated logits by softcap/2048.
  __device__ __forceinline__ static float capped(float s, float softcap, float s_to_exp2) {
    return fmaf(-2.0f * softcap, cuda::fast_rcp(1.0f + cuda::fast_exp2(s * s_to_exp2)), softcap);
  }

  __device__ __forceinline__ static float bias_at(const void* bias, int dtype, int64_t offset) {
    switch (dtype) {
      case 1: return __half2float(static_cast<const __half*>(bias)[offset]);
      case 2: return __bfloat162float(static_cast<const __nv_bfloat16*>(bias)[offset]);
      default: return static_cast<const float*>(bias)[offset];
    }
  }

  // Raw scores q·k of one warp's tile (rows rows0.., keys j0..) in, final logits out.
  template <int kMTiles, int kNTiles>
  __device__ __forceinline__ void apply(const ForwardKernelParams& p, cuda::FragC (&s)[kMTiles][kNTiles], int rows0,
                                        int j0, int lane) const {
    const int g = lane >> 2, t = lane & 3;
    const float softcap = p.softcap, scale = p.scale;
    const float s_to_exp2 = softcap != 0.0f ? scale / softcap * 2.0f * cuda::kLog2e : 0.0f;
    const float slope = p.maybe_alibi_slopes != nullptr ? p.maybe_alibi_slopes[b * p.alibi_batch_stride + h] : 0.0f;
    const int64_t bias_elem = p.bias_dtype == 0 ? 4 : 2;
    const void* bias = p.maybe_bias == nullptr ? nullptr
                                               : static_cast<const char*>(p.maybe_bias) +
                                                     (b * p.bias_batch_stride + h * p.bias_head_stride) * bias_elem;
    const uint8_t* mask =
        p.maybe_mask == nullptr ? nullptr : p.maybe_mask + b * p.mask_batch_stride + h * p.mask_head_stride;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = rows0 + mt * 16 + g + 8 * r;
        const bool row_ok = i < rows;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = j0 + nt * 8 + 2 * t + e;
            float& x = s[mt][nt].x[2 * r + e];
            x = softcap != 0.0f ? capped(x, softcap, s_to_exp2) : x * scale;
            if (slope != 0.0f) x -= slope * static_cast<float>(abs(i + diagonal - j));
            if (row_ok && j < cols) {
              if (bias != nullptr) x += bias_at(bias, p.bias_dtype, i * p.bias_row_stride + j);
              if (mask != nullptr && mask[i * p.mask_row_stride + j] == 0) x = -INFINITY;
            }
          }
      }
  }

  // This thread's share of "does the mask keep any key of rows [i0, i1) x keys [j0, j1)?" (true
  // without a mask); the block combines the shares with __syncthreads_or. A row stride of 0 means
  // one row for all.
  __device__ __forceinline__ bool mask_keeps_any(const ForwardKernelParams& p, int i0, int i1, int j0, int j1,
                                                 int tid, int threads) const {
    if (p.maybe_mask == nullptr) return true;
    const uint8_t* mask = p.maybe_mask + b * p.mask_batch_stride + h * p.mask_head_stride;
    const int n_rows = p.mask_row_stride == 0 ? 1 : i1 - i0, n_cols = j1 - j0;
    for (int c = tid; c < n_rows * n_cols; c += threads) {
      const int row = c / n_cols, col = c - row * n_cols;
      if (mask[(i0 + row) * p.mask_row_stride + j0 + col] != 0) return true;
    }
    return false;
  }
};

}  // namespace flashattn::detail::sm80
