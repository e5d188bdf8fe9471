// BF16 dot-product (vdpbf16ps, AVX512-BF16) versions of the tile GEMMs for bf16 inputs: each
// instruction multiplies 16 lanes of bf16 *pairs* and accumulates in fp32, so both GEMMs are laid
// out in pairs along their reduction dimension. P is rounded to bf16 before P·V, the same
// precision trade flash-attn makes on GPUs; l is summed from the fp32 P.
//
// Layouts (a "pair" is two bf16 in one 32-bit word, the lower-indexed element in the low half):
//   Qᵀ pairs   qt2[x2 * ldq + r]  = (Q[r][2 x2], Q[r][2 x2 + 1])     ldq = Br, odd d padded with 0
//   K rows     bf16 straight from the tensor; pair x2 of key j is one 32-bit broadcast
//   Pᵀ pairs   pt2[j2 * ldp + r]  = (P[r][2 j2], P[r][2 j2 + 1])     odd n padded with 0
//   V pairs    v2[j2 * ldv + c]   = (V[2 j2][c], V[2 j2 + 1][c])     ldv = dv rounded up to 16
#pragma once

#include "core/isa_namespace.hpp"

#if defined(__AVX512BF16__)

#include <cstdint>
#include <cstring>

#include "cpu/kernels_tile.hpp"  // and simd.hpp, which includes <immintrin.h>

namespace flashattn::detail::cpu::bf16::FLASHATTN_ISA_NS {

using simd::Avx512;

// Word index vector that interleaves the low 16 words of a zmm with its high 16 words:
// result word 2i = word i, word 2i + 1 = word 16 + i.
inline __m512i interleave_halves_index() {
  alignas(64) uint16_t idx[32];
  for (int i = 0; i < 16; ++i) idx[2 * i] = static_cast<uint16_t>(i), idx[2 * i + 1] = static_cast<uint16_t>(16 + i);
  return _mm512_load_si512(idx);
}

inline uint32_t pair_at(const uint16_t* row, int64_t x2, int64_t d) {
  const uint32_t lo = row[2 * x2], hi = 2 * x2 + 1 < d ? row[2 * x2 + 1] : 0;
  return lo | (hi << 16);
}

// Qᵀ pairs from `rows` bf16 query rows (row stride in elements); rows >= `rows` are zero.
inline void pack_qt(const uint16_t* q, int64_t row_stride, int rows, int64_t d, uint32_t* qt2, int64_t ldq) {
  const int64_t d2 = (d + 1) / 2;
  for (int64_t x2 = 0; x2 < d2; ++x2) {
    uint32_t* dst = qt2 + x2 * ldq;
    for (int r = 0; r < rows; ++r) dst[r] = pair_at(q + r * row_stride, x2, d);
    std::memset(dst + rows, 0, sizeof(uint32_t) * static_cast<size_t>(ldq - rows));
  }
}

// Sᵀ rows j0..j0+R × C query vectors: Sᵀ[j][r] = Σ_x K[j][x] Q[r][x], bf16 products, fp32 sums.
template <int R, int C>
inline void gemm_st_block(const uint16_t* k, int64_t ldk, int64_t d, const uint32_t* qt2, int64_t ldq, float* st,
                          int64_t lds) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  const int64_t full = d / 2;
  auto step = [&](int64_t x2, auto&& pair_of_row) {
    __m512bh q[C];
    for (int c = 0; c < C; ++c) q[c] = (__m512bh)_mm512_loadu_si512(qt2 + x2 * ldq + c * 16);
    for (int r = 0; r < R; ++r) {
      const __m512bh kb = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair_of_row(r)));
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], kb, q[c]);
    }
  };
  for (int64_t x2 = 0; x2 < full; ++x2)
    step(x2, [&](int r) {
      uint32_t w;
      std::memcpy(&w, k + r * ldk + 2 * x2, 4);
      return w;
    });
  if (d % 2 != 0) step(full, [&](int r) { return static_cast<uint32_t>(k[r * ldk + d - 1]); });
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(st + r * lds + c * 16, acc[r][c]);
}

// Sᵀ[n, Br] for a whole key tile; Br = C vectors of 16 queries.
template <int C>
inline void gemm_st(const uint16_t* k, int64_t ldk, int64_t n, int64_t d, const uint32_t* qt2, int64_t ldq, float* st,
                    int64_t lds) {
  constexpr int R = Blocking<Avx512>::kStRows;
  int64_t j = 0;
  for (; j + R <= n; j += R) gemm_st_block<R, C>(k + j * ldk, ldk, d, qt2, ldq, st + j * lds, lds);
  if (j < n)
    with_static<R - 1>(static_cast<int>(n - j), [&](auto rows) {
      gemm_st_block<decltype(rows)::value, C>(k + j * ldk, ldk, d, qt2, ldq, st + j * lds, lds);
    });
}

// Pᵀ pairs from the fp32 Pᵀ tile st[n, Br] (rounded to nearest even); Br = C vectors.
template <int C>
inline void pack_p(const float* st, int64_t lds, int64_t n, uint32_t* pt2, int64_t ldp) {
  const __m512i idx = interleave_halves_index();
  for (int64_t j = 0; j < n; j += 2)
    for (int c = 0; c < C; ++c) {
      const __m512 a = _mm512_loadu_ps(st + j * lds + c * 16);
      const __m512 b = j + 1 < n ? _mm512_loadu_ps(st + (j + 1) * lds + c * 16) : _mm512_setzero_ps();
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(b, a);  // words 0-15: a, 16-31: b
      _mm512_storeu_si512(pt2 + (j / 2) * ldp + c * 16, _mm512_permutexvar_epi16(idx, both));
    }
}

// V pairs from n bf16 rows of dv values (row stride in elements); columns up to ldv are zero.
inline void pack_v(const uint16_t* v, int64_t row_stride, int64_t n, int64_t dv, uint32_t* v2, int64_t ldv) {
  const __m512i idx = interleave_halves_index();
  for (int64_t j = 0; j < n; j += 2) {
    const uint16_t* a = v + j * row_stride;
    const uint16_t* b = j + 1 < n ? v + (j + 1) * row_stride : nullptr;
    for (int64_t c = 0; c < ldv; c += 16) {
      const int64_t left = dv - c;
      const __mmask16 m = left >= 16 ? __mmask16(0xffff) : left <= 0 ? __mmask16(0) : __mmask16((1u << left) - 1);
      const __m256i lo = _mm256_maskz_loadu_epi16(m, a + c);
      const __m256i hi = b ? _mm256_maskz_loadu_epi16(m, b + c) : _mm256_setzero_si256();
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      _mm512_storeu_si512(v2 + (j / 2) * ldv + c, _mm512_permutexvar_epi16(idx, both));
    }
  }
}

// O rows r0..r0+R × C vectors: acc = alpha[r]·O (or 0), acc += Σ_j P[r][j] V[j][c] over pairs.
template <int R, int C>
inline void gemm_pv_block(const uint32_t* pt2, int64_t ldp, int64_t n2, const uint32_t* v2, int64_t ldv,
                          const float* alpha, float* o, int64_t ldo) {
  __m512 acc[R][C];
  for (int r = 0; r < R; ++r) {
    if (alpha == nullptr) {
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
    } else {
      const __m512 a = _mm512_set1_ps(alpha[r]);
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_mul_ps(a, _mm512_loadu_ps(o + r * ldo + c * 16));
    }
  }
  for (int64_t j2 = 0; j2 < n2; ++j2) {
    __m512bh vr[C];
    for (int c = 0; c < C; ++c) vr[c] = (__m512bh)_mm512_loadu_si512(v2 + j2 * ldv + c * 16);
    for (int r = 0; r < R; ++r) {
      const __m512bh pb = (__m512bh)_mm512_set1_epi32(static_cast<int>(pt2[j2 * ldp + r]));
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pb, vr[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(o + r * ldo + c * 16, acc[r][c]);
}

// O[rows, ldo] = alpha ⊙ O + P·V over n keys (pairs); alpha == nullptr starts from zero.
inline void gemm_pv(const uint32_t* pt2, int64_t ldp, int64_t n, int rows, const uint32_t* v2, int64_t ldv,
                    const float* alpha, float* o, int64_t ldo) {
  constexpr int R = Blocking<Avx512>::kPvRows, C = Blocking<Avx512>::kPvCols;
  const int64_t n2 = (n + 1) / 2, nvec = ldv / 16;
  for (int64_t c0 = 0; c0 < nvec; c0 += C) {
    const int cols = static_cast<int>(std::min<int64_t>(C, nvec - c0));
    with_static<C>(cols, [&](auto c_const) {
      constexpr int kC = decltype(c_const)::value;
      int r = 0;
      for (; r + R <= rows; r += R)
        gemm_pv_block<R, kC>(pt2 + r, ldp, n2, v2 + c0 * 16, ldv, alpha ? alpha + r : nullptr, o + r * ldo + c0 * 16, ldo);
      if (r < rows)
        with_static<R - 1>(rows - r, [&](auto r_const) {
          gemm_pv_block<decltype(r_const)::value, kC>(pt2 + r, ldp, n2, v2 + c0 * 16, ldv, alpha ? alpha + r : nullptr,
                                                      o + r * ldo + c0 * 16, ldo);
        });
    });
  }
}

}  // namespace flashattn::detail::cpu::bf16

#endif  // __AVX512BF16__
