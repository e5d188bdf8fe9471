// Scores to logits on an Sᵀ tile (layout in kernels_tile.hpp) for tiles that need more than the
// scale: causal/window edges, softcap, ALiBi, bias, mask (the ScoreMods order of core/problem.hpp).
// Softcap and ALiBi run on vectors of queries; bias and mask are read along their contiguous key
// dimension. The result is natural-log logits: soft-max them with sc = log2(e).
#pragma once

#include "core/isa_namespace.hpp"

#include <cstdint>
#include <limits>

#include "core/problem.hpp"
#include "cpu/kernels_tile.hpp"

namespace flashattn::detail::cpu::FLASHATTN_ISA_NS {

// st[j * lds + r] for keys j0 + j (j < n) and queries i0 + r: every one of the Br = C·W columns is
// rescaled (padding columns hold finite junk), rows r < rows get bias and -inf for keys outside
// [lo[r], hi[r]) (when lo/hi are given) or masked.
template <class V, int C = Blocking<V>::kBrVecs>
inline void scores_to_logits(float* st, int64_t lds, int64_t n, int rows, int64_t i0, int64_t j0, float scale,
                             const ScoreMods& mods, const int64_t* maybe_lo, const int64_t* maybe_hi) {
  using F = typename V::F;
  const F scale_v = V::set1(scale), cap = V::set1(mods.softcap), inv_cap = V::set1(1.0f / mods.softcap);
  const F neg_slope = V::set1(-mods.alibi_slope);
  for (int64_t j = 0; j < n; ++j) {
    // ALiBi distance |i + diagonal - j| of query lane r, exact in fp32 below 2^24.
    const float dist0 = static_cast<float>(i0 + mods.diagonal - (j0 + j));
    for (int c = 0; c < C; ++c) {
      float* s = st + j * lds + c * V::W;
      F x = V::mul(V::load(s), scale_v);
      if (mods.softcap != 0.0f) x = V::mul(cap, V::tanh(V::mul(x, inv_cap)));
      if (mods.alibi_slope != 0.0f) {
        const F dist = V::abs(V::add(V::set1(dist0 + static_cast<float>(c * V::W)), V::iota()));
        x = V::fma(neg_slope, dist, x);
      }
      V::store(s, x);
    }
  }
  // Bias and mask rows are contiguous along keys, Sᵀ along queries: walk blocks of kBlock keys so
  // that the strided writes stay in L1 (the standard path passes a whole [seqlen_k, Br] panel).
  constexpr int64_t kBlock = 64;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t jb = 0; jb < n; jb += kBlock) {
    const int64_t je = std::min(n, jb + kBlock);
    if (mods.bias != nullptr) {
      for (int r = 0; r < rows; ++r) {
        const int64_t row = (i0 + r) * mods.bias_row_stride + j0;
        switch (mods.bias_dtype) {
          case DType::kFloat32: {
            const float* b = static_cast<const float*>(mods.bias) + row;
            for (int64_t j = jb; j < je; ++j) st[j * lds + r] += b[j];
            break;
          }
          case DType::kFloat16: {
            const uint16_t* b = static_cast<const uint16_t*>(mods.bias) + row;
            for (int64_t j = jb; j < je; ++j) st[j * lds + r] += fp16_to_float(b[j]);
            break;
          }
          case DType::kBFloat16: {
            const uint16_t* b = static_cast<const uint16_t*>(mods.bias) + row;
            for (int64_t j = jb; j < je; ++j) st[j * lds + r] += bf16_to_float(b[j]);
            break;
          }
        }
      }
    }
    if (mods.mask != nullptr) {
      for (int r = 0; r < rows; ++r) {
        const uint8_t* m = mods.mask + (i0 + r) * mods.mask_row_stride + j0;
        for (int64_t j = jb; j < je; ++j)
          if (m[j] == 0) st[j * lds + r] = kNegInf;
      }
    }
    if (maybe_lo != nullptr) {
      for (int64_t j = jb; j < je; ++j) {
        const int64_t key = j0 + j;
        float* srow = st + j * lds;
        for (int r = 0; r < rows; ++r)
          if (key < maybe_lo[r] || key >= maybe_hi[r]) srow[r] = kNegInf;
      }
    }
  }
}

}  // namespace flashattn::detail::cpu
