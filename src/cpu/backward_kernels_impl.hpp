// The backward kernels written once over a vector-traits type V and compiled once per ISA
// (backward.avx512.cpp, backward.avx2.cpp, backward.cpp for the portable table). Everything here
// has internal linkage so that the per-ISA copies never merge at link time.
//
// V provides: W (lanes), MR x NV (register tile: MR rows of NV vectors), reg, mask_t,
// zero, set1, load, store, loadm / storem (first n lanes, others 0 / untouched), mask(n),
// bcast (one float to every lane), fma(a, b, c) = a·b + c, sub, mul, exp2,
// load_bf16 / load_fp16 / store_bf16 / store_fp16 (W 16-bit values, rounding as core/dtype.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/dtype.hpp"
#include "cpu/backward_kernels.hpp"

namespace flashattn::detail {
namespace {

// C[MR, NV·W] (+)= A[MR, K] · B[K, NV·W]; the last vector holds `tail_mask` lanes when Tail.
template <class V, int MR, int NV, bool Tail>
void gemm_micro(int64_t K, const float* A, int64_t a_ms, int64_t a_ks, const float* B, int64_t ldb,
                float* C, int64_t ldc, typename V::mask_t tail_mask, bool accumulate) {
  using R = typename V::reg;
  constexpr int W = V::W;
  R c[MR][NV];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) {
      float* cp = C + m * ldc + v * W;
      c[m][v] = !accumulate ? V::zero() : (Tail && v == NV - 1) ? V::loadm(cp, tail_mask) : V::load(cp);
    }
  for (int64_t k = 0; k < K; ++k) {
    const float* bp = B + k * ldb;
    R b[NV];
    for (int v = 0; v < NV; ++v) b[v] = (Tail && v == NV - 1) ? V::loadm(bp + v * W, tail_mask) : V::load(bp + v * W);
    const float* ap = A + k * a_ks;
    for (int m = 0; m < MR; ++m) {
      const R a = V::bcast(ap + m * a_ms);
      for (int v = 0; v < NV; ++v) c[m][v] = V::fma(a, b[v], c[m][v]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) {
      float* cp = C + m * ldc + v * W;
      if (Tail && v == NV - 1) V::storem(cp, c[m][v], tail_mask);
      else V::store(cp, c[m][v]);
    }
}

template <class V>
using MicroFn = void (*)(int64_t, const float*, int64_t, int64_t, const float*, int64_t, float*, int64_t,
                         typename V::mask_t, bool);

// Index (rows - 1) * NV * 2 + (vectors - 1) * 2 + tail.
template <class V, size_t... I>
constexpr std::array<MicroFn<V>, sizeof...(I)> micro_table(std::index_sequence<I...>) {
  return {&gemm_micro<V, static_cast<int>(I / (V::NV * 2)) + 1, static_cast<int>(I / 2 % V::NV) + 1, (I % 2) == 1>...};
}

template <class V>
void gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_ms, int64_t a_ks, const float* B,
          int64_t ldb, float* C, int64_t ldc, bool accumulate) {
  constexpr int W = V::W, MR = V::MR, NV = V::NV;
  static constexpr auto table = micro_table<V>(std::make_index_sequence<MR * NV * 2>{});
  // Column strips outer: one strip of B (K x NV·W) stays in L1 while the row blocks stream past.
  for (int64_t n0 = 0; n0 < N; n0 += NV * W) {
    const int64_t nn = std::min<int64_t>(NV * W, N - n0);
    const int64_t nv = (nn + W - 1) / W, tail = nn - (nv - 1) * W;
    const typename V::mask_t mask = V::mask(static_cast<int>(tail));
    for (int64_t m0 = 0; m0 < M; m0 += MR) {
      const int64_t mm = std::min<int64_t>(MR, M - m0);
      const auto fn = table[(mm - 1) * NV * 2 + (nv - 1) * 2 + (tail != W ? 1 : 0)];
      fn(K, A + m0 * a_ms, a_ms, a_ks, B + n0, ldb, C + m0 * ldc + n0, ldc, mask, accumulate);
    }
  }
}

template <class V>
void exp2_rows(float* x, int64_t ld, int64_t rows, int64_t cols, float mul, const float* shift) {
  constexpr int W = V::W;
  const typename V::reg vm = V::set1(mul);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * ld;
    const typename V::reg vs = V::set1(shift[r]);
    int64_t c = 0;
    for (; c + W <= cols; c += W) V::store(row + c, V::exp2(V::sub(V::mul(V::load(row + c), vm), vs)));
    if (c < cols) {
      const auto m = V::mask(static_cast<int>(cols - c));
      V::storem(row + c, V::exp2(V::sub(V::mul(V::loadm(row + c, m), vm), vs)), m);
    }
  }
}

template <class V>
void ds_rows(const float* p, float* dp, int64_t ld, int64_t rows, int64_t cols, const float* d, float scale) {
  constexpr int W = V::W;
  const typename V::reg vscale = V::set1(scale);
  for (int64_t r = 0; r < rows; ++r) {
    const float* pr = p + r * ld;
    float* dr = dp + r * ld;
    const typename V::reg vd = V::set1(d[r]);
    int64_t c = 0;
    for (; c + W <= cols; c += W)
      V::store(dr + c, V::mul(V::mul(V::load(pr + c), V::sub(V::load(dr + c), vd)), vscale));
    if (c < cols) {
      const auto m = V::mask(static_cast<int>(cols - c));
      V::storem(dr + c, V::mul(V::mul(V::loadm(pr + c, m), V::sub(V::loadm(dr + c, m), vd)), vscale), m);
    }
  }
}

template <class V>
void widen(const void* src, DType t, int64_t n, float* dst) {
  if (t == DType::kFloat32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const auto* s = static_cast<const uint16_t*>(src);
  int64_t i = 0;
  for (; i + V::W <= n; i += V::W) V::store(dst + i, t == DType::kBFloat16 ? V::load_bf16(s + i) : V::load_fp16(s + i));
  for (; i < n; ++i) dst[i] = t == DType::kBFloat16 ? bf16_to_float(s[i]) : fp16_to_float(s[i]);
}

template <class V>
void narrow(const float* src, int64_t n, DType t, void* dst) {
  if (t == DType::kFloat32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + V::W <= n; i += V::W) {
    if (t == DType::kBFloat16) V::store_bf16(d + i, V::load(src + i));
    else V::store_fp16(d + i, V::load(src + i));
  }
  for (; i < n; ++i) d[i] = t == DType::kBFloat16 ? float_to_bf16(src[i]) : float_to_fp16(src[i]);
}

template <class V>
BackwardKernels make_backward_kernels(const char* name) {
  return {name, &gemm<V>, &exp2_rows<V>, &ds_rows<V>, nullptr, &widen<V>, &narrow<V>};
}

// Coefficients of 2^f = e^(f ln 2) on f in [-1/2, 1/2], degree 7 (truncation error < 1e-8,
// below fp32 rounding).
inline constexpr float kExp2C1 = 0.69314718056f;
inline constexpr float kExp2C2 = 0.24022650695f;
inline constexpr float kExp2C3 = 0.05550410866f;
inline constexpr float kExp2C4 = 0.00961812911f;
inline constexpr float kExp2C5 = 0.00133335581f;
inline constexpr float kExp2C6 = 0.00015403530f;
inline constexpr float kExp2C7 = 0.00001525273f;

}  // namespace
}  // namespace flashattn::detail
