// AVX2 + FMA backward kernels: 8-lane fp32, register tile 4 rows x 2 vectors (8 accumulators,
// 2 B vectors, 1 broadcast of the 16 ymm registers). With 6 x 2 or 4 x 3 GCC 12 spills the
// accumulators to the stack inside the k loop: 61 GFLOP/s against 82 for 4 x 2 (one Zen 5 core).
#include <immintrin.h>

#include "cpu/backward_kernels_impl.hpp"

namespace flashattn::detail {
namespace {

struct Avx2 {
  static constexpr int W = 8, MR = 4, NV = 2;
  using reg = __m256;
  using mask_t = __m256i;
  static mask_t mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static reg zero() { return _mm256_setzero_ps(); }
  static reg set1(float x) { return _mm256_set1_ps(x); }
  static reg load(const float* p) { return _mm256_loadu_ps(p); }
  static reg loadm(const float* p, mask_t m) { return _mm256_maskload_ps(p, m); }
  static void store(float* p, reg x) { _mm256_storeu_ps(p, x); }
  static void storem(float* p, reg x, mask_t m) { _mm256_maskstore_ps(p, m, x); }
  static reg bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static reg fma(reg a, reg b, reg c) { return _mm256_fmadd_ps(a, b, c); }
  static reg sub(reg a, reg b) { return _mm256_sub_ps(a, b); }
  static reg mul(reg a, reg b) { return _mm256_mul_ps(a, b); }
  // 2^x = 2^n · 2^f with n = round(x) in [-127, 128]: n = -127 builds the bit pattern 0 (so the
  // result is 0), n = 128 builds inf. NaN survives the clamp (x is the second operand) and p.
  static reg exp2(reg x) {
    x = _mm256_min_ps(_mm256_set1_ps(128.0f), _mm256_max_ps(_mm256_set1_ps(-127.0f), x));
    const reg n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const reg f = _mm256_sub_ps(x, n);
    reg p = _mm256_set1_ps(kExp2C7);
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2C6));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2C5));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2C4));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2C3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2C2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2C1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
  }
  static reg load_bf16(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static reg load_fp16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static void store_fp16(uint16_t* p, reg x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // Round to nearest even on the bits; NaN keeps its top bits and is made quiet.
  static void store_bf16(uint16_t* p, reg x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    // |x| > inf as signed integers (both sides are non-negative).
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i v = _mm256_blendv_epi8(r, quiet, nan);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
};

}  // namespace

const BackwardKernels& backward_kernels_avx2() {
  static const BackwardKernels k = make_backward_kernels<Avx2>("avx2");
  return k;
}

}  // namespace flashattn::detail
