// The fp32 standard forward baseline for AVX2 + FMA + F16C (see standard_forward_impl.hpp).
#include "cpu/standard_forward_impl.hpp"

namespace flashattn::detail::cpu {

void standard_forward_avx2(const ForwardParams& p, void* workspace, int threads) {
  standard_forward<simd::Avx2>(p, workspace, threads);
}

}  // namespace flashattn::detail::cpu
