// Support for the sm90 primitive tests: a launch watchdog (a wrong mbarrier protocol hangs rather
// than fails) and 16-bit storage conversions by element type, on top of what every GPU test shares
// (cuda/support/cuda_test_util.hpp: CUDA_OK, seeds, device buffers, the poison).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <type_traits>

#include "cuda/support/cuda_test_util.hpp"
#include "flashattn/flashattn.hpp"

namespace sm90_test {

using fa_cuda_test::DeviceBuffer;
using fa_cuda_test::fresh_seed;
using fa_cuda_test::kPoison16;

// These tests need an sm_90 device (the binary holds sm_90a code only).
inline void expect_hopper() {
  int device = 0, major = 0, minor = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess) << "no CUDA device";
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), cudaSuccess);
  ASSERT_EQ(major * 10 + minor, 90) << "the sm90 primitive tests need a Hopper GPU (compute capability 9.0)";
}

// Waits for the default stream, failing the process (not hanging it) when a kernel has not finished
// after `seconds`: a kernel stuck on an mbarrier cannot be cancelled, only abandoned with its context.
inline void sync_or_die(const char* what, double seconds = 20.0) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(nullptr);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) {
      ADD_FAILURE() << what << ": " << cudaGetErrorString(e);
      return;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > seconds) {
      std::fprintf(stderr, "FATAL: %s did not finish within %.0f s (a barrier that never completes)\n", what, seconds);
      std::fflush(stderr);
      std::_Exit(2);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Storage of the element type T (__nv_bfloat16 or __half) as raw 16-bit words on the host.
template <class T>
constexpr flashattn::DType dtype_of() {
  return std::is_same_v<T, __nv_bfloat16> ? flashattn::DType::kBFloat16 : flashattn::DType::kFloat16;
}

template <class T>
uint16_t to_bits(float x) {
  return fa_cuda_test::to_storage(x, dtype_of<T>());
}

template <class T>
float from_bits(uint16_t h) {
  return fa_cuda_test::from_storage(h, dtype_of<T>());
}

template <class T>
const char* type_name() {
  return std::is_same_v<T, __nv_bfloat16> ? "bf16" : "fp16";
}

// Physical byte offset -> logical byte offset inside a 1024-byte-aligned 128-byte-swizzled region:
// bits 4..6 are XORed with bits 7..9 (an involution). Written from the hardware rule, independently
// of Sw128Tile, so the tests check that header too.
inline uint32_t unswizzle128(uint32_t byte) { return byte ^ (((byte >> 7) & 7u) << 4); }

}  // namespace sm90_test
