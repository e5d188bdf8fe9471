// Definition of launch_backward: preprocess (grid: query row groups, heads_q, batch), the main
// kernel (grid: key blocks, heads_kv, batch; dynamic shared memory from the tile policy), then the
// dQ conversion, in stream order. Included only by the generated instantiation files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/sm80/backward_kernel.cuh"
#include "cuda/sm80/backward_launch.hpp"

namespace flashattn::detail::sm80 {

template <DType kDType> struct BackwardStorageType;
template <> struct BackwardStorageType<DType::kFloat16> { using type = __half; };
template <> struct BackwardStorageType<DType::kBFloat16> { using type = __nv_bfloat16; };

template <int kHeadDim, DType kDType>
cudaError_t launch_backward(const BackwardKernelParams& p, cudaStream_t stream) {
  using T = typename BackwardStorageType<kDType>::type;
  constexpr BackwardTiles kTiles = BackwardPolicy<kHeadDim>::kTiles;
  const dim3 row_grid((p.seqlen_q + kRowsPerRowBlock - 1) / kRowsPerRowBlock, p.heads_q, p.batch);
  const bool has_rows = p.seqlen_q > 0;
  if (has_rows) backward_preprocess_kernel<T><<<row_grid, kRowKernelWarps * 32, 0, stream>>>(p);
  if (p.seqlen_k > 0) {
    const auto kernel = backward_kernel<kHeadDim, T>;
    constexpr int kSmem = kTiles.smem_bytes();
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
        e != cudaSuccess)
      return e;
    const dim3 grid((p.seqlen_k + kTiles.block_n - 1) / kTiles.block_n, p.heads_q / p.group, p.batch);
    kernel<<<grid, kTiles.threads(), kSmem, stream>>>(p);
  }
  if (has_rows) backward_convert_dq_kernel<T><<<row_grid, kRowKernelWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flashattn::detail::sm80
