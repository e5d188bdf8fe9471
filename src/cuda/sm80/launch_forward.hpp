// The one launcher signature every sm80 forward instantiation shares. The definition lives in
// launch_forward.cuh and is compiled only by the generated files instantiations/*.cu (one per
// (head dim, V head dim) pair and dtype); dispatch code sees the declarations below and compiles
// no kernel.
#pragma once

#include <cuda_runtime.h>

#include "cuda/sm80/kernel_params.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn::detail::sm80 {

template <int kHeadDim, int kHeadDimV, DType kDType>
cudaError_t launch_forward(const ForwardKernelParams& p, cudaStream_t stream);

#define FLASHATTN_SM80_FORWARD_INSTANCE(HEAD_DIM, HEAD_DIM_V, DTYPE) \
  extern template cudaError_t launch_forward<HEAD_DIM, HEAD_DIM_V, DTYPE>(const ForwardKernelParams&, cudaStream_t);
#include "cuda/sm80/instantiations/forward_list.inc"
#undef FLASHATTN_SM80_FORWARD_INSTANCE

}  // namespace flashattn::detail::sm80
