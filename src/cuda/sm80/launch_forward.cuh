// Definition of launch_forward: grid (query blocks, heads_q, batch), dynamic shared memory from the
// tile policy, and the kernel variant with score modifiers only when one is on. Included only by
// the generated instantiation files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/sm80/forward_kernel.cuh"
#include "cuda/sm80/launch_forward.hpp"

namespace flashattn::detail::sm80 {

template <DType kDType> struct StorageType;
template <> struct StorageType<DType::kFloat16> { using type = __half; };
template <> struct StorageType<DType::kBFloat16> { using type = __nv_bfloat16; };

template <int kHeadDim, int kHeadDimV, class T, bool kScoreMods>
cudaError_t launch_variant(const ForwardKernelParams& p, cudaStream_t stream) {
  constexpr ForwardTiles kTiles = ForwardPolicy<kHeadDim, kHeadDimV, kScoreMods>::kTiles;
  const auto kernel = forward_kernel<kHeadDim, kHeadDimV, T, kScoreMods>;
  constexpr int kSmem = kTiles.smem_bytes();
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
      e != cudaSuccess)
    return e;
  const dim3 grid((p.seqlen_q + kTiles.block_m - 1) / kTiles.block_m, p.heads_q, p.batch);
  kernel<<<grid, kTiles.threads(), kSmem, stream>>>(p);
  return cudaGetLastError();
}

template <int kHeadDim, int kHeadDimV, DType kDType>
cudaError_t launch_forward(const ForwardKernelParams& p, cudaStream_t stream) {
  using T = typename StorageType<kDType>::type;
  return p.has_score_mods() ? launch_variant<kHeadDim, kHeadDimV, T, true>(p, stream)
                            : launch_variant<kHeadDim, kHeadDimV, T, false>(p, stream);
}

}  // namespace flashattn::detail::sm80
