// Host-side checks and translations that every CUDA backend's supported() and kernel-params fill
// share: where a pointer lives, 16-byte alignment of the tensors cp.async and TMA read, the current
// device's capabilities, the 32-bit index and grid limits of the kernels, and the causal/window band
// in the form the kernels take.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/problem.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn::detail::cuda_host {

// True when ptr is device (or managed) memory of `device`.
bool on_device(const void* ptr, int device);

struct NamedPointer {
  const void* ptr;
  const char* name;
};

// The first non-null pointer of the list that is not device memory of `device`; null when all are.
const char* first_not_on_device(std::initializer_list<NamedPointer> pointers, int device);

// Every row of the tensor starts on a 16-byte boundary (batch strides are unused with varlen).
template <class Tensor>
bool aligned_16(const Tensor& t, bool varlen, size_t elem) {
  const auto misaligned = [&](int64_t stride) { return (stride * static_cast<int64_t>(elem)) % 16 != 0; };
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && !misaligned(t.row_stride) && !misaligned(t.head_stride) &&
         (varlen || !misaligned(t.batch_stride));
}

struct Device {
  int index = 0;
  int major = 0, minor = 0;
  int smem_optin = 0;  // dynamic shared memory one block may opt in to, bytes
  int multiprocessors = 0;
};

// The current device; false (and the CUDA error cleared) when there is none usable.
bool current_device(Device* device);

// Why this build has no code the device can run (empty when it has): machine code runs on devices of
// its major version from its minor on (sm_90a on 9.0 alone), PTX on every later device.
std::string missing_code(const Device& device);

// The status of the launches just enqueued: kInternal naming `what` and the CUDA error when one
// failed (cudaGetLastError: a launch error is otherwise left for an unrelated later call to find).
Status last_launch_status(const char* what);

// What the kernels' 32-bit row indices and grid y/z dimensions cannot hold; empty when d fits.
std::string index_limits(const Dims& d);

// problem.hpp's band as the kernels take it: causal folded into window_right (min(window_right, 0),
// 0 when unbounded); windows of seqlen_q + seqlen_k or more hide nothing, so they are clamped there,
// which keeps the band exact and the kernels' indices in 32 bits. -1: unbounded.
struct KernelBand {
  bool bottom_right;
  int window_left, window_right;
};
KernelBand kernel_band(const AttentionParams& p, const Dims& d);

}  // namespace flashattn::detail::cuda_host
