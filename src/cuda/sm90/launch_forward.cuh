// Definition of the sm90 launch_forward: a persistent grid of `blocks` blocks, dynamic shared memory
// from the tile policy (of banded problems or not, where the head dim has two), and the softcap
// variant only when softcap is on. Included only by the generated instantiation files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/sm90/forward_kernel.cuh"
#include "cuda/sm90/launch_forward.hpp"

namespace flashattn::detail::sm90 {

template <DType kDType> struct StorageType;
template <> struct StorageType<DType::kFloat16> { using type = __half; };
template <> struct StorageType<DType::kBFloat16> { using type = __nv_bfloat16; };

template <int kHeadDim, bool kBanded, class T, bool kSoftcap>
cudaError_t launch_variant(const ForwardKernelParams& p, int blocks, cudaStream_t stream) {
  constexpr ForwardTiles kTiles = ForwardPolicy<kHeadDim, kBanded>::kTiles;
  const auto kernel = forward_kernel<kHeadDim, kBanded, T, kSoftcap>;
  constexpr int kSmem = kTiles.smem_bytes();
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
      e != cudaSuccess)
    return e;
  kernel<<<blocks, kTiles.threads(), kSmem, stream>>>(p);
  return cudaGetLastError();
}

template <int kHeadDim, bool kBanded, class T>
cudaError_t launch_tiles(const ForwardKernelParams& p, int blocks, cudaStream_t stream) {
  return p.softcap > 0.0f ? launch_variant<kHeadDim, kBanded, T, true>(p, blocks, stream)
                          : launch_variant<kHeadDim, kBanded, T, false>(p, blocks, stream);
}

// The host (forward.cu) sized the grid, the tensor maps' boxes and the shared memory by the same
// choice, forward_tiles(head dim, banded(window)).
template <int kHeadDim, DType kDType>
cudaError_t launch_forward(const ForwardKernelParams& p, int blocks, cudaStream_t stream) {
  using T = typename StorageType<kDType>::type;
  if constexpr (own_unbanded_tiles(kHeadDim)) {
    if (!banded(p.window_left, p.window_right)) return launch_tiles<kHeadDim, false, T>(p, blocks, stream);
  }
  return launch_tiles<kHeadDim, true, T>(p, blocks, stream);
}

}  // namespace flashattn::detail::sm90
