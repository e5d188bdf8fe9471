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

// C[MR, NV·16] = Σ_k A pairs · B pairs with vdpbf16ps (two bf16 products per fp32 lane).
template <int MR, int NV, bool Tail>
void gemm_bf16_micro(int64_t K, const uint32_t* A, int64_t a_ms, const uint32_t* B, int64_t ldb, float* C,
                     int64_t ldc, __mmask16 tail) {
  __m512 c[MR][NV];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) c[m][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512bh b[NV];
    for (int v = 0; v < NV; ++v) {
      const uint32_t* bp = B + k * ldb + v * 16;
      b[v] = (__m512bh)((Tail && v == NV - 1) ? _mm512_maskz_loadu_epi32(tail, bp) : _mm512_loadu_si512(bp));
    }
    for (int m = 0; m < MR; ++m) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(A[m * a_ms + k]));
      for (int v = 0; v < NV; ++v) c[m][v] = _mm512_dpbf16_ps(c[m][v], a, b[v]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < NV; ++v) {
      float* cp = C + m * ldc + v * 16;
      if (Tail && v == NV - 1) _mm512_mask_storeu_ps(cp, tail, c[m][v]);
      else _mm512_storeu_ps(cp, c[m][v]);
    }
}

using Bf16MicroFn = void (*)(int64_t, const uint32_t*, int64_t, const uint32_t*, int64_t, float*, int64_t, __mmask16);

template <size_t... I>
constexpr std::array<Bf16MicroFn, sizeof...(I)> bf16_micro_table(std::index_sequence<I...>) {
  return {&gemm_bf16_micro<static_cast<int>(I / (Avx512::NV * 2)) + 1, static_cast<int>(I / 2 % Avx512::NV) + 1,
                           (I % 2) == 1>...};
}

void gemm_bf16(int64_t M, int64_t N, int64_t K, const uint32_t* A, int64_t a_ms, const uint32_t* B, int64_t ldb,
               float* C, int64_t ldc) {
  constexpr int W = Avx512::W, MR = Avx512::MR, NV = Avx512::NV;
  static constexpr auto table = bf16_micro_table(std::make_index_sequence<MR * NV * 2>{});
  for (int64_t n0 = 0; n0 < N; n0 += NV * W) {
    const int64_t nn = std::min<int64_t>(NV * W, N - n0);
    const int64_t nv = (nn + W - 1) / W, tail = nn - (nv - 1) * W;
    for (int64_t m0 = 0; m0 < M; m0 += MR) {
      const int64_t mm = std::min<int64_t>(MR, M - m0);
      table[(mm - 1) * NV * 2 + (nv - 1) * 2 + (tail != W ? 1 : 0)](K, A + m0 * a_ms, a_ms, B + n0, ldb,
                                                                    C + m0 * ldc + n0, ldc, Avx512::mask(static_cast<int>(tail)));
    }
  }
}

}  // namespace

const BackwardKernels& backward_kernels_avx512() {
  static const BackwardKernels k = make_backward_kernels<Avx512>("avx512");
  return k;
}

const BackwardKernels& backward_kernels_avx512_bf16() {
  static const BackwardKernels k = [] {
    BackwardKernels t = make_backward_kernels<Avx512>("avx512-bf16");
    t.gemm_bf16 = &gemm_bf16;
    return t;
  }();
  return k;
}

}  // namespace flashattn::detail
