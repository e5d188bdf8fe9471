// Score modifiers in the backward's kernel variant that has them: the logits the forward fed its
// softmax, recomputed from the raw scores s = q·k in the same order as score_mods.cuh (whose
// capped() and bias_at() they use):
//   x = scale·s  ->  y = softcap·tanh(x / softcap)  ->  y - slope·|i + diagonal - j|  ->  + bias[i, j]
//   ->  -inf where mask[i, j] == 0
// and the factor that the softcap adds to the chain rule. ALiBi, bias and mask are additive
// constants (no gradient); the softcap's derivative is dy/dx = 1 - tanh²(x / softcap) = 1 - (y / softcap)²,
// and dx/ds = scale, so
//   dS_raw = dS_logit · (1 - (y / softcap)²) · scale
// where the scale is applied where the plain backward applies it (dK in the main kernel's epilogue,
// dQ in the convert kernel or the dQ kernel's epilogue): the kernels multiply by the factor only.
// Masked elements (and those outside the causal/window band) get logit -inf, so P = 0 and dS = 0.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/primitives/math.cuh"
#include "cuda/sm80/backward_params.hpp"
#include "cuda/sm80/score_mods.cuh"

namespace flashattn::detail::sm80 {

// The modifiers of one (sequence b, query head h), resolved from the kernel params (constant
// memory) where a tile needs them, so that only the indices live in registers across the loop.
struct BackwardScoreMods {
  float softcap, inv_softcap, s_to_exp2, scale, slope;
  const void* bias;  // row 0 of (b, h); null: none
  const uint8_t* mask;  // row 0 of (b, h); null: none
  int bias_dtype;
  int64_t bias_row_stride, mask_row_stride;
  int diagonal;    // query i's diagonal key is i + diagonal
  int rows, cols;  // the sequence's seqlen_q and seqlen_k: bias and mask are read inside only

  __device__ __forceinline__ static BackwardScoreMods resolve(const BackwardKernelParams& p, int b, int h,
                                                              int diagonal, int rows, int cols) {
    BackwardScoreMods m;
    m.softcap = p.softcap;
    m.inv_softcap = p.softcap != 0.0f ? 1.0f / p.softcap : 0.0f;
    m.s_to_exp2 = p.softcap != 0.0f ? p.scale / p.softcap * 2.0f * cuda::kLog2e : 0.0f;
    m.scale = p.scale;
    m.slope = p.maybe_alibi_slopes != nullptr ? p.maybe_alibi_slopes[b * p.alibi_batch_stride + h] : 0.0f;
    const int64_t bias_elem = p.bias_dtype == 0 ? 4 : 2;
    m.bias = p.maybe_bias == nullptr ? nullptr
                                     : static_cast<const char*>(p.maybe_bias) +
                                           (b * p.bias_batch_stride + h * p.bias_head_stride) * bias_elem;
    m.mask = p.maybe_mask == nullptr ? nullptr : p.maybe_mask + b * p.mask_batch_stride + h * p.mask_head_stride;
    m.bias_dtype = p.bias_dtype;
    m.bias_row_stride = p.bias_row_stride;
    m.mask_row_stride = p.mask_row_stride;
    m.diagonal = diagonal;
    m.rows = rows;
    m.cols = cols;
    return m;
  }

  // The logit of raw score s at (i, j), -inf when the band (visible) or the mask hides it; d_cap
  // gets the softcap factor 1 - (y / softcap)² (1 without softcap).
  __device__ __forceinline__ float logit(float s, int i, int j, bool visible, float& d_cap) const {
    float x;
    if (softcap != 0.0f) {
      x = ScoreMods::capped(s, softcap, s_to_exp2);
      const float u = x * inv_softcap;  // tanh(scale·s / softcap)
      d_cap = fmaf(-u, u, 1.0f);
    } else {
      x = s * scale;
      d_cap = 1.0f;
    }
    if (slope != 0.0f) x -= slope * static_cast<float>(abs(i + diagonal - j));
    if (i < rows && j < cols) {
      if (bias != nullptr) x += ScoreMods::bias_at(bias, bias_dtype, i * bias_row_stride + j);
      if (mask != nullptr && mask[i * mask_row_stride + j] == 0) x = -INFINITY;
    }
    return visible ? x : -INFINITY;
  }

  // P · (1 - (y / softcap)²) and P of raw score s, from the row's lse·log2e: what dS needs and
  // what dV needs.
  __device__ __forceinline__ float probability(float s, int i, int j, bool visible, float lse_log2,
                                               float& p_times_d_cap) const {
    float d_cap;
    const float x = logit(s, i, j, visible, d_cap);
    const float prob = cuda::fast_exp2(fmaf(x, cuda::kLog2e, -lse_log2));
    p_times_d_cap = prob * d_cap;
    return prob;
  }
};

}  // namespace flashattn::detail::sm80
