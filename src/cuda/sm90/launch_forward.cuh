// Definition of the sm90 launch_forward: a persistent grid of `blocks` blocks, dynamic shared memory
// from the tile policy, and the softcap variant only when softcap is on. Included only by the
// generated instantiation files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/sm90/forward_kernel.cuh"
#include "cuda/sm90/launch_forward.hpp"

namespace flashattn::detail::sm90 {

template <DType kDType> struct StorageType;
template <> struct StorageType<DType::kFloat16> { using type = __half; };
template <> struct StorageType<DType::kBFloat16> { using type = __nv_bfloat16; };

template <int kHeadDim, class T, bool kSoftcap>
cudaError_t launch_variant(const ForwardKernelParams& p, int blocks, cudaStream_t stream) {
  constexpr ForwardTiles kTiles = ForwardPolicy<kHeadDim>::kTiles;
  const auto kernel = forward_kernel<kHeadDim, T, kSoftcap>;
  constexpr int kSmem = kTiles.smem_bytes();
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
      e != cudaSuccess)
    return e;
  kernel<<<blocks, kTiles.threads(), kSmem, stream>>>(p);
  return cudaGetLastError();
}

template <int kHeadDim, DType kDType>
cudaError_t launch_forward(const ForwardKernelParams& p, int blocks, cudaStream_t stream) {
  using T = typename StorageType<kDType>::type;
  return p.softcap > 0.0f ? launch_variant<kHeadDim, T, true>(p, blocks, stream)
                          : launch_variant<kHeadDim, T, false>(p, blocks, stream);
}

}  // namespace flashattn::detail::sm90
