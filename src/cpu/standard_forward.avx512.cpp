// The fp32 standard forward baseline for AVX-512 (F, BW, VL, DQ) (see standard_forward_impl.hpp).
#include "cpu/standard_forward_impl.hpp"

namespace flashattn::detail::cpu {

void standard_forward_avx512(const ForwardParams& p, void* workspace, int threads) {
  standard_forward<simd::Avx512>(p, workspace, threads);
}

}  // namespace flashattn::detail::cpu
