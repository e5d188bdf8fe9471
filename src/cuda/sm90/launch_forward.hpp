// The one launcher signature every sm90 forward instantiation shares. The definition lives in
// launch_forward.cuh and is compiled only by the generated files instantiations/*.cu (one per head
// dim and dtype, sm_90a code only); dispatch code sees the declarations below and compiles no kernel.
#pragma once

#include <cuda_runtime.h>

#include "cuda/sm90/kernel_params.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn::detail::sm90 {

// blocks: the grid (forward.cu: one block per SM, or per work item), each block running its share
// of the work items (tile_scheduler.cuh's block_item walk).
template <int kHeadDim, DType kDType>
cudaError_t launch_forward(const ForwardKernelParams& p, int blocks, cudaStream_t stream);

#define FLASHATTN_SM90_FORWARD_INSTANCE(HEAD_DIM, DTYPE) \
  extern template cudaError_t launch_forward<HEAD_DIM, DTYPE>(const ForwardKernelParams&, int, cudaStream_t);
#include "cuda/sm90/instantiations/forward_list.inc"
#undef FLASHATTN_SM90_FORWARD_INSTANCE

}  // namespace flashattn::detail::sm90
