// Programmatic dependent launch (sm_90 and later): a kernel launched with `dependent` set may start
// before the kernel ahead of it in the stream (its primary) has finished, once every block of the
// primary has called release_dependent_grid() or exited. The dependent's blocks can then set up
// (addresses, loads of what the primary does not write) while the primary's last blocks drain.
//   wait_for_primary_grid()    waits until the primary grid has completed and its memory writes
//                              are visible; before it, nothing the primary writes may be read or
//                              written. A no-op when the kernel was launched without `dependent`.
//   release_dependent_grid()   lets the next kernel, if launched with `dependent`, start.
//   launch_kernel(...)         a launch with or without the attribute.
// A dependent grid may complete before its primary unless its threads wait: every thread of a
// kernel launched with `dependent` calls wait_for_primary_grid() before it exits, so that a grid's
// completion implies its primary's, along the whole chain of launches. On earlier architectures
// the device calls compile to nothing (the launchers set `dependent` only on 9.0 and later).
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace flashattn::cuda {

__device__ __forceinline__ void wait_for_primary_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void release_dependent_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

template <class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                          bool dependent, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = dependent ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace flashattn::cuda
