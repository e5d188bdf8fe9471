// The flash forward for AVX2 + FMA + F16C (see forward_impl.hpp).
#include "cpu/forward_impl.hpp"

namespace flashattn::detail::cpu {

void flash_forward_avx2(const ForwardParams& p, void* workspace, int threads) {
  flash_forward<simd::Avx2>(p, workspace, threads);
}

}  // namespace flashattn::detail::cpu
