// Tile GEMM micro-kernels of the CPU attention backends, written once against a simd.hpp vector
// type V and instantiated per ISA. Shared by the forward and backward kernels: the layouts and
// signatures below are the published interface.
//
// Layouts (all fp32, element strides):
//   Qᵀ panel  qt[k * ldq + r]   k < head_dim, r < Br (Br a multiple of V::W; absent rows are 0)
//   Sᵀ tile   st[j * lds + r]   key j, query r: one vector of S holds W queries of one key, so
//                               the softmax reduces over keys with vertical max/add, no shuffles
//   K, V rows k[j * ldk + x]    straight from the caller's tensor when it is fp32 (any row stride)
//   O accum   o[r * ldo + c]    ldo a multiple of V::W, columns >= head_dim_v are scratch
//
//   gemm_st:  Sᵀ[n, Br]   = K[n, d] · Qᵀ[d, Br]          (broadcast K[j][k], FMA a Qᵀ row)
//   gemm_pv:  O[rows, dv] = alpha ⊙ O + Pᵀ[n, Br]ᵀ · V[n, dv]  (broadcast P, FMA a V row)
#pragma once

#include "core/isa_namespace.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/dtype.hpp"
#include "cpu/simd.hpp"

namespace flashattn::detail::cpu::FLASHATTN_ISA_NS {

// Register blocking per ISA (changes speed only). kStRows keys × kBrVecs vectors of queries for
// S (kBrVecs is the default query tile; the forward uses 1 vector for short queries);
// kPvRows queries × kPvCols vectors of head_dim_v for O. Accumulators + operands must fit the
// register file: AVX-512 6×4 + 4 = 28 of 32 zmm (broadcasts fold into the FMA), AVX2
// 4×3 + 3 + 1 broadcast = 16 of 16 ymm.
template <class V>
struct Blocking;
#if defined(__AVX512F__)
template <>
struct Blocking<simd::Avx512> {
  static constexpr int kBrVecs = 4, kStRows = 6, kPvRows = 6, kPvCols = 4;
};
#endif
#if defined(__AVX2__)
template <>
struct Blocking<simd::Avx2> {
  static constexpr int kBrVecs = 3, kStRows = 4, kPvRows = 4, kPvCols = 3;
};
#endif
template <>
struct Blocking<simd::Portable> {
  static constexpr int kBrVecs = 4, kStRows = 2, kPvRows = 2, kPvCols = 2;
};

// Calls f(std::integral_constant<int, n>) for a run-time n in [1, kMax].
template <int kMax, class Fn>
inline void with_static(int n, Fn&& f) {
  if constexpr (kMax >= 1) {
    if (n == kMax) return f(std::integral_constant<int, kMax>{});
    with_static<kMax - 1>(n, std::forward<Fn>(f));
  }
}

// Sᵀ rows j0..j0+R (R keys) × C query vectors, over the full head_dim d.
template <class V, int R, int C>
inline void gemm_st_block(const float* k, int64_t ldk, int64_t d, const float* qt, int64_t ldq,
                          float* st, int64_t lds) {
  typename V::F acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = V::zero();
  for (int64_t x = 0; x < d; ++x) {
    typename V::F q[C];
    for (int c = 0; c < C; ++c) q[c] = V::load(qt + x * ldq + c * V::W);
    for (int r = 0; r < R; ++r) {
      const typename V::F kb = V::bcast(k + r * ldk + x);
      for (int c = 0; c < C; ++c) acc[r][c] = V::fma(kb, q[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) V::store(st + r * lds + c * V::W, acc[r][c]);
}

// Sᵀ[n, Br] = K[n, d] · Qᵀ[d, Br] for a whole key tile (any n); Br = C vectors.
template <class V, int C = Blocking<V>::kBrVecs>
inline void gemm_st(const float* k, int64_t ldk, int64_t n, int64_t d, const float* qt, int64_t ldq,
                    float* st, int64_t lds) {
  constexpr int R = Blocking<V>::kStRows;
  int64_t j = 0;
  for (; j + R <= n; j += R) gemm_st_block<V, R, C>(k + j * ldk, ldk, d, qt, ldq, st + j * lds, lds);
  if (j < n)
    with_static<R - 1>(static_cast<int>(n - j), [&](auto rows) {
      gemm_st_block<V, decltype(rows)::value, C>(k + j * ldk, ldk, d, qt, ldq, st + j * lds, lds);
    });
}

// O rows r0..r0+R × C vectors of columns: acc = alpha[r]·O (or 0), acc += Σ_j P[j][r] V[j][c].
// The last vector of the block loads only `last_cols` columns of V (V rows may end there).
template <class V, int R, int C, bool kPartial>
inline void gemm_pv_block(const float* pt, int64_t ldp, int64_t n, const float* v, int64_t ldv,
                          const float* alpha, float* o, int64_t ldo, int last_cols) {
  typename V::F acc[R][C];
  for (int r = 0; r < R; ++r) {
    if (alpha == nullptr) {
      for (int c = 0; c < C; ++c) acc[r][c] = V::zero();
    } else {
      const typename V::F a = V::bcast(alpha + r);
      for (int c = 0; c < C; ++c) acc[r][c] = V::mul(a, V::load(o + r * ldo + c * V::W));
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    typename V::F vr[C];
    for (int c = 0; c < C; ++c)
      vr[c] = (kPartial && c == C - 1) ? V::loadu_partial(v + j * ldv + c * V::W, last_cols)
                                       : V::load(v + j * ldv + c * V::W);
    for (int r = 0; r < R; ++r) {
      const typename V::F pb = V::bcast(pt + j * ldp + r);
      for (int c = 0; c < C; ++c) acc[r][c] = V::fma(pb, vr[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) V::store(o + r * ldo + c * V::W, acc[r][c]);
}

// O[rows, dv] = alpha ⊙ O + Pᵀ[n, rows]ᵀ · V[n, dv]; alpha == nullptr starts O from zero.
template <class V>
inline void gemm_pv(const float* pt, int64_t ldp, int64_t n, int rows, const float* v, int64_t ldv,
                    int64_t dv, const float* alpha, float* o, int64_t ldo) {
  constexpr int R = Blocking<V>::kPvRows, C = Blocking<V>::kPvCols, W = V::W;
  const int64_t nvec = (dv + W - 1) / W;
  const int last_cols = static_cast<int>(dv - (nvec - 1) * W);
  for (int64_t c0 = 0; c0 < nvec; c0 += C) {
    const int cols = static_cast<int>(std::min<int64_t>(C, nvec - c0));
    const bool partial = c0 + cols == nvec && last_cols != W;
    const float* vc = v + c0 * W;
    float* oc = o + c0 * W;
    with_static<C>(cols, [&](auto c_const) {
      constexpr int kC = decltype(c_const)::value;
      auto run = [&](auto r_const, int r) {
        constexpr int kR = decltype(r_const)::value;
        const float* a = alpha ? alpha + r : nullptr;
        if (partial)
          gemm_pv_block<V, kR, kC, true>(pt + r, ldp, n, vc, ldv, a, oc + r * ldo, ldo, last_cols);
        else
          gemm_pv_block<V, kR, kC, false>(pt + r, ldp, n, vc, ldv, a, oc + r * ldo, ldo, last_cols);
      };
      int r = 0;
      for (; r + R <= rows; r += R) run(std::integral_constant<int, R>{}, r);
      if (r < rows) with_static<R - 1>(rows - r, [&](auto r_const) { run(r_const, r); });
    });
  }
}

// dst[0, n) = src[0, n) widened to fp32 (src in storage dtype t).
template <class V>
inline void widen_row(const void* src, DType t, int64_t n, float* dst) {
  if (t == DType::kFloat32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
  int64_t x = 0;
  for (; x + V::W <= n; x += V::W)
    V::store(dst + x, t == DType::kBFloat16 ? V::load_bf16(s + x) : V::load_fp16(s + x));
  for (; x < n; ++x) dst[x] = load_float(s, t, x);
}

// Qᵀ panel from `rows` query rows (row r at q + r * ldq_src elements, storage dtype t), scaled by
// nothing: qt[x * ldq + r], rows >= `rows` up to ldq zero-filled. `row_buf` holds d floats.
template <class V>
inline void pack_qt(const void* q, DType t, int64_t row_stride, int rows, int64_t d, float* qt, int64_t ldq,
                    float* row_buf) {
  const size_t esz = dtype_size(t);
  for (int64_t x = 0; x < d; ++x) std::fill(qt + x * ldq + rows, qt + x * ldq + ldq, 0.0f);
  for (int r = 0; r < rows; ++r) {
    widen_row<V>(static_cast<const char*>(q) + r * row_stride * static_cast<int64_t>(esz), t, d, row_buf);
    for (int64_t x = 0; x < d; ++x) qt[x * ldq + r] = row_buf[x];
  }
}

}  // namespace flashattn::detail::cpu
