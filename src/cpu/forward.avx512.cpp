// The flash forward for AVX-512 (F, BW, VL, DQ) with fp32 FMA tile GEMMs, and with AVX512-BF16
// dot products for bf16 inputs when the CPU has them (see forward_impl.hpp).
#include "cpu/forward_impl.hpp"

namespace flashattn::detail::cpu {

void flash_forward_avx512(const ForwardParams& p, void* workspace, int threads, bool use_bf16_dot) {
  if (use_bf16_dot && p.dtype == DType::kBFloat16)
    flash_forward<simd::Avx512, true>(p, workspace, threads);
  else
    flash_forward<simd::Avx512, false>(p, workspace, threads);
}

}  // namespace flashattn::detail::cpu
