// The one launcher signature every sm80 backward instantiation shares. The definition lives in
// backward_launch.cuh and is compiled only by the generated files instantiations/backward_*.cu (one
// per Q head dim and dtype, holding every V head dim paired with it); dispatch code sees the
// declarations below and compiles no kernel.
#pragma once

#include <cuda_runtime.h>

#include "cuda/sm80/backward_params.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn::detail::sm80 {

template <int kHeadDim, int kHeadDimV, DType kDType>
cudaError_t launch_backward(const BackwardKernelParams& p, cudaStream_t stream);

#define FLASHATTN_SM80_BACKWARD_INSTANCE(HEAD_DIM, HEAD_DIM_V, DTYPE) \
  extern template cudaError_t launch_backward<HEAD_DIM, HEAD_DIM_V, DTYPE>(const BackwardKernelParams&, cudaStream_t);
#include "cuda/sm80/instantiations/backward_list.inc"
#undef FLASHATTN_SM80_BACKWARD_INSTANCE

}  // namespace flashattn::detail::sm80
