// AVX-512 backward kernels: 16-lane fp32 FMA, register tile 6 rows x 4 vectors (24 accumulators,
// 4 B vectors, 1 broadcast of the 32 zmm registers).
// GCC 12 reports its own _mm512_undefined_* placeholders as maybe-uninitialized once inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "cpu/backward_kernels_impl.hpp"

namespace flashattn::detail {
namespace {

struct Avx512 {
  static constexpr int W = 16, MR = 6, NV = 4;
  using reg = __m512;
  using mask_t = __mmask16;
  static mask_t mask(int n) { return static_cast<mask_t>((1u << n) - 1u); }
  static reg zero() { return _mm512_setzero_ps(); }
  static reg set1(float x) { return _mm512_set1_ps(x); }
  static reg load(const float* p) { return _mm512_loadu_ps(p); }
  static reg loadm(const float* p, mask_t m) { return _mm512_maskz_loadu_ps(m, p); }
  static void store(float* p, reg x) { _mm512_storeu_ps(p, x); }
  static void storem(float* p, reg x, mask_t m) { _mm512_mask_storeu_ps(p, m, x); }
  static reg bcast(const float* p) { return _mm512_set1_ps(*p); }
  static reg fma(reg a, reg b, reg c) { return _mm512_fmadd_ps(a, b, c); }
  static reg sub(reg a, reg b) { return _mm512_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm512_mul_ps(a, b); }
  // 2^x = 2^n · 2^f with n = round(x); scalef makes n <= -150 give 0 and n >= 128 give inf.
  // The clamp keeps f finite for ±inf (max/min return their second operand, x, when it is NaN).
  static reg exp2(reg x) {
    x = _mm512_min_ps(_mm512_set1_ps(129.0f), _mm512_max_ps(_mm512_set1_ps(-160.0f), x));
    const reg n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const reg f = _mm512_sub_ps(x, n);
    reg p = _mm512_set1_ps(kExp2C7);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2C6));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2C5));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2C4));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2C3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2C2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2C1));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
  }
  static reg load_bf16(const uint16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static reg load_fp16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static void store_fp16(uint16_t* p, reg x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // Round to nearest even on the bits; NaN keeps its top bits and is made quiet.
  static void store_bf16(uint16_t* p, reg x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
};

}  // namespace

const BackwardKernels& backward_kernels_avx512() {
  static const BackwardKernels k = make_backward_kernels<Avx512>("avx512");
  return k;
}

}  // namespace flashattn::detail
