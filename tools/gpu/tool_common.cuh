// What the GPU microbenchmarks (wgmma_rate.cu, mufu_rate.cu) share: a CUDA call checked, and the
// sm_90 device they need.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                               \
  do {                                                                                         \
    const cudaError_t check_error_ = (x);                                                      \
    if (check_error_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x,                          \
                   cudaGetErrorString(check_error_));                                          \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

// Device 0's properties; exits with a message naming `tool` unless it is an sm_90 GPU.
inline cudaDeviceProp sm90_device(const char* tool) {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9) {
    std::fprintf(stderr, "%s: needs an sm_90 GPU (found %s, sm_%d%d)\n", tool, prop.name, prop.major, prop.minor);
    std::exit(1);
  }
  return prop;
}
