// Vector wrappers the CPU kernels are written against: one struct per ISA with the same static
// interface, so each kernel is one template instantiated per ISA in its *.avx512.cpp / *.avx2.cpp /
// portable translation unit. Each struct is only defined where the compiler targets its ISA.
//
//   W                 floats per vector
//   F                 the register type
//   zero/set1/load/loadu_partial(p, n)/store/store_partial(p, x, n)
//   fma(a, b, c) = a*b + c, mul, add, sub, max, min, bcast(p) = set1(*p)
//   max_nan_last(a, b): max that returns b when either is NaN (NaN in b survives)
//   exp2(x): 2^x for x <= 0 (0 below -150, NaN stays NaN), relative error < 2e-7
//   neg_inf_to_zero(x): x, with -inf lanes replaced by 0
//   tanh(x): absolute error < 3e-7 (through exp2; NaN stays NaN)
//   iota(): lanes 0, 1, ..., W-1; abs(x)
//   load_bf16 / load_fp16 (p): W 16-bit values widened to fp32
#pragma once

#include "core/isa_namespace.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX2__) || defined(__AVX512F__)
// GCC 12 reports its own _mm512_undefined_* placeholders as (maybe-)uninitialized once inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include "core/dtype.hpp"

namespace flashattn::detail::simd::FLASHATTN_ISA_NS {

// 2^f on f in [-0.5, 0.5]: Taylor series of e^(f ln2) to degree 6 (truncation < 1.3e-7 relative).
inline constexpr float kExp2C1 = 0.693147181f, kExp2C2 = 0.240226507f, kExp2C3 = 0.0555041087f,
                       kExp2C4 = 0.00961812911f, kExp2C5 = 0.00133335581f, kExp2C6 = 0.000154035304f;
// Below this the result is forced to exactly 0 (a masked logit must contribute nothing).
inline constexpr float kExp2Floor = -150.0f;

#if defined(__AVX512F__)
struct Avx512 {
  static constexpr int W = 16;
  using F = __m512;
  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F bcast(const float* p) { return _mm512_set1_ps(*p); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static __mmask16 tail_mask(int n) { return static_cast<__mmask16>(n >= 16 ? 0xffff : (1u << n) - 1); }
  static F loadu_partial(const float* p, int n) { return _mm512_maskz_loadu_ps(tail_mask(n), p); }
  static void store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static void store_partial(float* p, F x, int n) { _mm512_mask_storeu_ps(p, tail_mask(n), x); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F max_nan_last(F a, F b) { return _mm512_max_ps(a, b); }
  static F neg_inf_to_zero(F x) {
    const __mmask16 is_neg_inf = _mm512_cmp_ps_mask(x, set1(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
    return _mm512_maskz_mov_ps(static_cast<__mmask16>(~is_neg_inf), x);
  }
  static F exp2(F x) {
    x = _mm512_max_ps(set1(kExp2Floor), x);  // NaN in x survives (second operand)
    const F n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const F f = sub(x, n);
    F p = fma(set1(kExp2C6), f, set1(kExp2C5));
    p = fma(p, f, set1(kExp2C4));
    p = fma(p, f, set1(kExp2C3));
    p = fma(p, f, set1(kExp2C2));
    p = fma(p, f, set1(kExp2C1));
    p = fma(p, f, set1(1.0f));
    return _mm512_scalef_ps(p, n);  // p * 2^n, underflows to exactly 0 at n = -150
  }
  static F iota() {
    return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  }
  static F abs(F x) { return _mm512_abs_ps(x); }
  static F tanh(F x) {
    // tanh|x| = (1 - t) / (1 + t), t = e^(-2|x|); the sign of x is put back.
    const F t = exp2(mul(abs(x), set1(-2.0f * 1.44269504f)));
    const F r = _mm512_div_ps(sub(set1(1.0f), t), add(set1(1.0f), t));
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
    return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(r), sign));
  }
  static F load_bf16(const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static F load_fp16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
};
#endif

#if defined(__AVX2__)
struct Avx2 {
  static constexpr int W = 8;
  using F = __m256;
  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static __m256i tail_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static F loadu_partial(const float* p, int n) { return _mm256_maskload_ps(p, tail_mask(n)); }
  static void store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static void store_partial(float* p, F x, int n) { _mm256_maskstore_ps(p, tail_mask(n), x); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F max_nan_last(F a, F b) { return _mm256_max_ps(a, b); }
  static F neg_inf_to_zero(F x) {
    const F is_neg_inf = _mm256_cmp_ps(x, set1(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ);
    return _mm256_andnot_ps(is_neg_inf, x);
  }
  static F exp2(F x) {
    const F keep = _mm256_cmp_ps(x, set1(-126.0f), _CMP_NLT_UQ);  // false only for x < -126
    x = _mm256_max_ps(set1(-126.0f), x);
    const F n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const F f = sub(x, n);
    F p = fma(set1(kExp2C6), f, set1(kExp2C5));
    p = fma(p, f, set1(kExp2C4));
    p = fma(p, f, set1(kExp2C3));
    p = fma(p, f, set1(kExp2C2));
    p = fma(p, f, set1(kExp2C1));
    p = fma(p, f, set1(1.0f));
    // 2^n for n in [-126, 0] built in the exponent field; NaN lanes give garbage here but p is NaN.
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(keep, mul(p, _mm256_castsi256_ps(e)));
  }
  static F iota() { return _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7); }
  static F abs(F x) { return _mm256_andnot_ps(set1(-0.0f), x); }
  static F tanh(F x) {
    const F t = exp2(mul(abs(x), set1(-2.0f * 1.44269504f)));
    const F r = _mm256_div_ps(sub(set1(1.0f), t), add(set1(1.0f), t));
    return _mm256_or_ps(r, _mm256_and_ps(x, set1(-0.0f)));
  }
  static F load_bf16(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static F load_fp16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
};
#endif

// Plain C++ with a fixed width of 8 lanes (the compiler may map it onto SSE2).
struct Portable {
  static constexpr int W = 8;
  struct F {
    float v[W];
  };
  template <class Op>
  static F map(F a, F b, Op op) {
    F r;
    for (int i = 0; i < W; ++i) r.v[i] = op(a.v[i], b.v[i]);
    return r;
  }
  static F zero() { return set1(0.0f); }
  static F set1(float x) {
    F r;
    for (float& e : r.v) e = x;
    return r;
  }
  static F bcast(const float* p) { return set1(*p); }
  static F load(const float* p) {
    F r;
    std::memcpy(r.v, p, sizeof r.v);
    return r;
  }
  static F loadu_partial(const float* p, int n) {
    F r = zero();
    std::memcpy(r.v, p, sizeof(float) * static_cast<size_t>(n < W ? n : W));
    return r;
  }
  static void store(float* p, F x) { std::memcpy(p, x.v, sizeof x.v); }
  static void store_partial(float* p, F x, int n) { std::memcpy(p, x.v, sizeof(float) * static_cast<size_t>(n < W ? n : W)); }
  static F fma(F a, F b, F c) {
    F r;
    for (int i = 0; i < W; ++i) r.v[i] = a.v[i] * b.v[i] + c.v[i];
    return r;
  }
  static F mul(F a, F b) { return map(a, b, [](float x, float y) { return x * y; }); }
  static F add(F a, F b) { return map(a, b, [](float x, float y) { return x + y; }); }
  static F sub(F a, F b) { return map(a, b, [](float x, float y) { return x - y; }); }
  static F max(F a, F b) { return map(a, b, [](float x, float y) { return x > y ? x : y; }); }
  static F max_nan_last(F a, F b) { return max(a, b); }  // x > y is false with a NaN: y is returned
  static F neg_inf_to_zero(F x) {
    for (float& e : x.v)
      if (e == -std::numeric_limits<float>::infinity()) e = 0.0f;
    return x;
  }
  static F exp2(F x) {
    for (float& e : x.v) e = e < kExp2Floor ? 0.0f : std::exp2(e);
    return x;
  }
  static F iota() {
    F r;
    for (int i = 0; i < W; ++i) r.v[i] = static_cast<float>(i);
    return r;
  }
  static F abs(F x) {
    for (float& e : x.v) e = std::fabs(e);
    return x;
  }
  static F tanh(F x) {
    for (float& e : x.v) e = std::tanh(e);
    return x;
  }
  static F load_bf16(const uint16_t* p) {
    F r;
    for (int i = 0; i < W; ++i) r.v[i] = bf16_to_float(p[i]);
    return r;
  }
  static F load_fp16(const uint16_t* p) {
    F r;
    for (int i = 0; i < W; ++i) r.v[i] = fp16_to_float(p[i]);
    return r;
  }
};

}  // namespace flashattn::detail::simd
