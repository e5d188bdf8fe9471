// Online-softmax steps of the CPU attention backends on an Sᵀ tile (layout in kernels_tile.hpp),
// in the seeds' notation with log2-domain logits: m (running max, log2 units), l (running sum),
// alpha = 2^(m_old - m_new). Scores become logits as t = s · sc, sc = softmax_scale · log2(e)
// (or 1 when a scalar pass already wrote log2-domain logits), so one exp2 per element remains.
#pragma once

#include "core/isa_namespace.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/dtype.hpp"
#include "cpu/kernels_tile.hpp"

namespace flashattn::detail::cpu::FLASHATTN_ISA_NS {

inline constexpr float kLn2 = 0.693147180559945309f;

// One key tile (Br = C vectors of queries): st holds Sᵀ[n, Br] on entry and Pᵀ = 2^(s·sc - m_new) on return; m and l are
// updated and alpha receives the factor for O. Rows with no finite logit yet keep m = -inf and
// get p = 0 (the -inf max is replaced by 0 before subtracting). NaN scores skip the max and reach
// l and O through p.
template <class V, int C = Blocking<V>::kBrVecs>
inline void online_softmax(float* st, int64_t lds, int64_t n, float sc, float* m, float* l, float* alpha) {
  using F = typename V::F;
  const F scv = V::set1(sc);
  F mx[C];
  for (int c = 0; c < C; ++c) mx[c] = V::set1(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < n; ++j)
    for (int c = 0; c < C; ++c) mx[c] = V::max(V::mul(V::load(st + j * lds + c * V::W), scv), mx[c]);
  F neg_m[C], sum[C];
  for (int c = 0; c < C; ++c) {
    const F m_old = V::load(m + c * V::W);
    const F m_new = V::max(mx[c], m_old);
    const F m_use = V::neg_inf_to_zero(m_new);
    V::store(alpha + c * V::W, V::exp2(V::sub(m_old, m_use)));
    V::store(m + c * V::W, m_new);
    neg_m[c] = V::sub(V::zero(), m_use);
    sum[c] = V::zero();
  }
  for (int64_t j = 0; j < n; ++j)
    for (int c = 0; c < C; ++c) {
      float* s = st + j * lds + c * V::W;
      const F p = V::exp2(V::fma(V::load(s), scv, neg_m[c]));
      V::store(s, p);
      sum[c] = V::add(sum[c], p);
    }
  for (int c = 0; c < C; ++c) {
    const F lv = V::load(l + c * V::W);
    V::store(l + c * V::W, V::fma(lv, V::load(alpha + c * V::W), sum[c]));
  }
}

// Epilogue of `rows` query rows: out row r = O[r] / l[r] in storage dtype t (0 for rows that saw
// nothing), and optionally lse[r * lse_stride] = ln(l) + m·ln2 (-inf for those rows). Templated
// on V only so that each ISA's translation unit keeps its own copy.
template <class V>
inline void finalize_rows(const float* o, int64_t ldo, int rows, int64_t dv, const float* m, const float* l,
                          void* out, DType t, int64_t out_row_stride, float* maybe_lse, int64_t lse_stride) {
  const size_t esz = dtype_size(t);
  for (int r = 0; r < rows; ++r) {
    const float inv_l = l[r] == 0.0f ? 0.0f : 1.0f / l[r];
    const float* src = o + r * ldo;
    void* dst = static_cast<char*>(out) + r * out_row_stride * static_cast<int64_t>(esz);
    if (t == DType::kFloat32) {
      float* d = static_cast<float*>(dst);
      for (int64_t x = 0; x < dv; ++x) d[x] = src[x] * inv_l;
    } else {
      for (int64_t x = 0; x < dv; ++x) store_float(dst, t, x, src[x] * inv_l);
    }
    if (maybe_lse != nullptr)
      maybe_lse[r * lse_stride] =
          l[r] == 0.0f ? -std::numeric_limits<float>::infinity() : (m[r] + std::log2(l[r])) * kLn2;
  }
}

}  // namespace flashattn::detail::cpu
