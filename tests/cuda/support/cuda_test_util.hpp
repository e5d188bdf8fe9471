// Support shared by every GPU test (flashattn_cuda_tests, and the sm90 primitive tests that nvcc
// compiles as C++17, hence header-only): the CUDA error check, fresh seeds, RAII device buffers
// that poison, and 16-bit storage conversions.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "flashattn/flashattn.hpp"

// Asserts (fatal for the calling void function) that a CUDA call succeeded, naming the call.
#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    const cudaError_t e_ = (expr);                                         \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

namespace fa_cuda_test {

constexpr uint16_t kPoison16 = 0xffff;  // a NaN in both bf16 and fp16; 0xff bytes are a NaN in fp32 too

// A fresh seed (or FLASHATTN_TEST_SEED), printed with `what` and recorded in the test's XML.
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

// fp16/bf16 values as the raw 16-bit words the tensors hold.
inline uint16_t to_storage(float x, flashattn::DType t) {
  return t == flashattn::DType::kBFloat16 ? flashattn::detail::float_to_bf16(x) : flashattn::detail::float_to_fp16(x);
}
inline float from_storage(uint16_t x, flashattn::DType t) {
  return t == flashattn::DType::kBFloat16 ? flashattn::detail::bf16_to_float(x) : flashattn::detail::fp16_to_float(x);
}
inline float round_to(float x, flashattn::DType t) { return from_storage(to_storage(x, t), t); }

// `count` elements of T in device memory, freed with the buffer. ptr is null before allocation and
// when cudaMalloc failed. Every allocation has at least kMinBytes, so that an empty buffer still has
// an address (a null pointer means "absent" to the params structs). Calls return the CUDA status.
template <class T>
struct DeviceBuffer {
  static constexpr size_t kMinBytes = 16;

  T* ptr = nullptr;
  size_t count = 0;

  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { allocate(n); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  size_t bytes() const { return count * sizeof(T); }
  size_t allocated_bytes() const { return std::max(bytes(), kMinBytes); }

  // Frees what the buffer held and allocates n elements (contents undefined).
  cudaError_t allocate(size_t n) {
    cudaFree(ptr);
    ptr = nullptr;
    count = n;
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, allocated_bytes());
    if (e == cudaSuccess) ptr = static_cast<T*>(p);
    return e;
  }
  // allocate(host.size()), then a copy of host.
  cudaError_t upload(const std::vector<T>& host) {
    const cudaError_t e = allocate(host.size());
    return e != cudaSuccess ? e : copy_from(host.data());
  }
  // count elements from / to host memory.
  cudaError_t copy_from(const T* host) const { return cudaMemcpy(ptr, host, bytes(), cudaMemcpyHostToDevice); }
  cudaError_t copy_to(T* host) const { return cudaMemcpy(host, ptr, bytes(), cudaMemcpyDeviceToHost); }
  // Every allocated byte 0xff: NaN in fp32, fp16 and bf16.
  cudaError_t poison() const { return cudaMemset(ptr, 0xff, allocated_bytes()); }
};

}  // namespace fa_cuda_test
