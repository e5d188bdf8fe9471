// Definition of launch_backward: preprocess (grid: query row groups, heads_q, batch), the main
// kernel (one block per key block, kv head and batch, the last ones perhaps split: tail_split in
// backward_params.hpp; dynamic shared memory from the tile policy), then dQ, in stream order (on
// 9.0 and later the main and convert kernels as programmatic dependents: p.dependent_launch). The
// main and dQ kernels run their score-modifier variant (softcap, ALiBi, bias, mask) only when one
// is on, so that the plain path carries none of it. dQ comes from one of two places, chosen by the
// workspace layout (backward.cu):
//   p.dq_accum set:  the main kernel adds dS·K into the fp32 accumulator with atomics, and the
//                    convert kernel (backward_dq_accum.cuh) scales and rounds it (fast; the last
//                    bits depend on the order of the adds);
//   p.dq_accum null: the deterministic mode; the main kernel computes dK and dV only, and the dQ
//                    kernel (grid: query blocks, heads_q, batch) owns each row's dQ.
// Included only by the generated instantiation files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/sm80/backward_dq_kernel.cuh"
#include "cuda/sm80/backward_kernel.cuh"
#include "cuda/sm80/backward_launch.hpp"

namespace flashattn::detail::sm80 {

template <DType kDType> struct BackwardStorageType;
template <> struct BackwardStorageType<DType::kFloat16> { using type = __half; };
template <> struct BackwardStorageType<DType::kBFloat16> { using type = __nv_bfloat16; };

// A kernel with dynamic shared memory above the default 48 KiB needs the opt-in first.
template <class Kernel>
cudaError_t allow_shared_memory(Kernel kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// The deterministic mode's dQ kernel (grid: query blocks, heads_q, batch).
template <int kHeadDim, int kHeadDimV, class T, bool kScoreMods>
cudaError_t launch_backward_dq(const BackwardKernelParams& p, cudaStream_t stream) {
  constexpr BackwardDqTiles kTiles = BackwardDqPolicy<kHeadDim, kHeadDimV, kScoreMods>::kTiles;
  const auto kernel = backward_dq_kernel<kHeadDim, kHeadDimV, T, kScoreMods>;
  if (cudaError_t e = allow_shared_memory(kernel, kTiles.smem_bytes()); e != cudaSuccess) return e;
  const dim3 grid((p.seqlen_q + kTiles.block_m - 1) / kTiles.block_m, p.heads_q, p.batch);
  kernel<<<grid, kTiles.threads(), kTiles.smem_bytes(), stream>>>(p);
  return cudaSuccess;
}

template <int kHeadDim, int kHeadDimV, class T, bool kScoreMods>
cudaError_t launch_backward_variant(const BackwardKernelParams& p, cudaStream_t stream) {
  const bool has_rows = p.seqlen_q > 0;
  const bool deterministic = p.dq_accum == nullptr;
  // The accumulator's rows are this instantiation's tiles (backward_dq_accum.cuh).
  if (!deterministic && p.dq_accum_width != kHeadDim) return cudaErrorInvalidValue;
  if (has_rows) {
    constexpr int kLanes = preprocess_lanes_per_row(kHeadDim > kHeadDimV ? kHeadDim : kHeadDimV);
    constexpr int kRows = kPreprocessRowsPerBlock<kLanes>;
    const dim3 grid((preprocess_rows(p) + kRows - 1) / kRows, p.heads_q, p.batch);
    backward_preprocess_kernel<T, kLanes><<<grid, kRowKernelWarps * 32, 0, stream>>>(p);
  }
  // The main kernel reads K and V before it waits for its primary: only the preprocess (launched
  // after everything before it in the stream) may be that primary.
  if (p.seqlen_k > 0)
    if (cudaError_t e = launch_backward_main<kHeadDim, kHeadDimV, T, kScoreMods>(p, p.dependent_launch && has_rows,
                                                                                stream);
        e != cudaSuccess)
      return e;
  if (has_rows && !deterministic) {
    constexpr int kBlockM = DqAccumLayout<kHeadDim, kHeadDimV, kScoreMods>::kBlockM;
    const dim3 grid((p.seqlen_q + kBlockM - 1) / kBlockM, p.heads_q, p.batch);
    if (cudaError_t e = cuda::launch_kernel(backward_convert_dq_kernel<kHeadDim, kHeadDimV, T, kScoreMods>, grid,
                                            dim3(kConvertDqThreads), 0, stream, p.dependent_launch, p);
        e != cudaSuccess)
      return e;
  }
  if (has_rows && deterministic)  // also with seqlen_k = 0: rows that see no key get dQ = 0
    if (cudaError_t e = launch_backward_dq<kHeadDim, kHeadDimV, T, kScoreMods>(p, stream); e != cudaSuccess) return e;
  return cudaGetLastError();
}

template <int kHeadDim, int kHeadDimV, DType kDType>
cudaError_t launch_backward(const BackwardKernelParams& p, cudaStream_t stream) {
  using T = typename BackwardStorageType<kDType>::type;
  return p.has_score_mods() ? launch_backward_variant<kHeadDim, kHeadDimV, T, true>(p, stream)
                            : launch_backward_variant<kHeadDim, kHeadDimV, T, false>(p, stream);
}

}  // namespace flashattn::detail::sm80
