// Support for the sm90 primitive tests: CUDA error checks, seeds, device buffers, a launch watchdog
// (a wrong mbarrier protocol hangs rather than fails), and 16-bit storage conversions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "core/dtype.hpp"
#include "flashattn/flashattn.hpp"

namespace sm90_test {

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

// A fresh seed (or FLASHATTN_TEST_SEED), printed and recorded in the test's XML.
inline uint64_t fresh_seed(const std::string& what) {
  uint64_t seed;
  if (const char* env = std::getenv("FLASHATTN_TEST_SEED")) {
    seed = std::strtoull(env, nullptr, 10);
  } else {
    seed = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  }
  std::printf("[seed] %s: FLASHATTN_TEST_SEED=%llu\n", what.c_str(), static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return seed;
}

// These tests need an sm_90 device (the binary holds sm_90a code only).
inline void expect_hopper() {
  int device = 0, major = 0, minor = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess) << "no CUDA device";
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device), cudaSuccess);
  ASSERT_EQ(major * 10 + minor, 90) << "the sm90 primitive tests need a Hopper GPU (compute capability 9.0)";
}

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceBuffer(size_t n) : count(n) {
    if (cudaMalloc(&ptr, n * sizeof(T)) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  size_t bytes() const { return count * sizeof(T); }
};

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
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return flashattn::detail::float_to_bf16(x);
  else return flashattn::detail::float_to_fp16(x);
}

template <class T>
float from_bits(uint16_t h) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return flashattn::detail::bf16_to_float(h);
  else return flashattn::detail::fp16_to_float(h);
}

template <class T>
const char* type_name() {
  return std::is_same_v<T, __nv_bfloat16> ? "bf16" : "fp16";
}

// Physical byte offset -> logical byte offset inside a 1024-byte-aligned 128-byte-swizzled region:
// bits 4..6 are XORed with bits 7..9 (an involution). Written from the hardware rule, independently
// of Sw128Tile, so the tests check that header too.
inline uint32_t unswizzle128(uint32_t byte) { return byte ^ (((byte >> 7) & 7u) << 4); }

constexpr uint16_t kPoison16 = 0xffff;  // a NaN in both bf16 and fp16

}  // namespace sm90_test
