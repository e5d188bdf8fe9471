// The one launcher signature every sm90 forward instantiation shares. The definition lives in
// launch_forward.cuh and is compiled only by the generated files instantiations/*.cu (one per head
// dim and dtype, sm_90a code only); dispatch code sees the declarations below and compiles no kernel.
#pragma once

#include <cuda_runtime.h>

#include "cuda/sm90/kernel_params.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn::detail::sm90 {

template <int kHeadDim, DType kDType>
cudaError_t launch_forward(const ForwardKernelParams& p, int batch, int heads_q, cudaStream_t stream);

#define FLASHATTN_SM90_FORWARD_INSTANCE(HEAD_DIM, DTYPE) \
  extern template cudaError_t launch_forward<HEAD_DIM, DTYPE>(const ForwardKernelParams&, int, int, cudaStream_t);
#include "cuda/sm90/instantiations/forward_list.inc"
#undef FLASHATTN_SM90_FORWARD_INSTANCE

}  // namespace flashattn::detail::sm90
