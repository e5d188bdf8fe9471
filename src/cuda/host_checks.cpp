#include "cuda/host_checks.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <limits>

namespace flashattn::detail::cuda_host {

bool on_device(const void* ptr, int device) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();  // the failed query leaves an error behind; clear it
    return false;
  }
  return (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) && attr.device == device;
}

const char* first_not_on_device(std::initializer_list<NamedPointer> pointers, int device) {
  for (const NamedPointer& p : pointers)
    if (p.ptr != nullptr && !on_device(p.ptr, device)) return p.name;
  return nullptr;
}

bool current_device(Device* device) {
  Device d;
  if (cudaGetDevice(&d.index) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, d.index) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.minor, cudaDevAttrComputeCapabilityMinor, d.index) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, d.index) != cudaSuccess ||
      cudaDeviceGetAttribute(&d.multiprocessors, cudaDevAttrMultiProcessorCount, d.index) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  *device = d;
  return true;
}

#ifndef FLASHATTN_CUDA_SASS_TARGETS
#define FLASHATTN_CUDA_SASS_TARGETS 800, 901
#endif
#ifndef FLASHATTN_CUDA_PTX_ARCH
#define FLASHATTN_CUDA_PTX_ARCH 0
#endif

std::string missing_code(const Device& device) {
  constexpr int kSass[] = {FLASHATTN_CUDA_SASS_TARGETS};  // 10 x arch, + 1 for arch-specific "a" targets
  constexpr int kPtx = FLASHATTN_CUDA_PTX_ARCH;
  const int cc = device.major * 10 + device.minor;
  const auto runs_on = [cc](int target) {
    const int arch = target / 10;
    return target % 10 == 1 ? cc == arch : (cc / 10 == arch / 10 && cc >= arch);
  };
  for (int t : kSass)
    if (runs_on(t)) return {};
  if (kPtx > 0 && cc >= kPtx) return {};
  // Only a refusal spells out what was built (supported() runs on every call).
  std::string built;
  for (int t : kSass)
    built += (built.empty() ? "sm_" : ", sm_") + std::to_string(t / 10) + (t % 10 == 1 ? "a" : "");
  return "compute capability " + std::to_string(device.major) + "." + std::to_string(device.minor) +
         ": this build has machine code for " + (built.empty() ? std::string("no device") : built) +
         (kPtx > 0 ? " and PTX for compute_" + std::to_string(kPtx) : std::string(" and no PTX")) +
         " (add the device to FLASHATTN_CUDA_GENCODE)";
}

Status last_launch_status(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return {};
  return {StatusCode::kInternal, std::string(what) + ": launch failed: " + cudaGetErrorString(e)};
}

std::string index_limits(const Dims& d) {
  constexpr int64_t kMaxGridYZ = 65535;
  // Headroom of one 256-row tile: the kernels form tile ends (i0 + Br) past the last row.
  if (d.seqlen_q + d.seqlen_k > std::numeric_limits<int32_t>::max() - 256)
    return "seqlen_q + seqlen_k above 2^31 - 257 (32-bit row indices, with a tile of headroom)";
  if (d.heads_q > kMaxGridYZ || d.batch > kMaxGridYZ) return "heads_q and batch must be at most 65535 (grid dimensions)";
  return {};
}

KernelBand kernel_band(const AttentionParams& p, const Dims& d) {
  const int64_t right = p.causal ? (p.window_right < 0 ? 0 : std::min<int64_t>(p.window_right, 0)) : p.window_right;
  const auto clamp_window = [&](int64_t w) { return static_cast<int>(w < 0 ? -1 : std::min(w, d.seqlen_q + d.seqlen_k)); };
  return {p.alignment == Alignment::kBottomRight, clamp_window(p.window_left), clamp_window(right)};
}

}  // namespace flashattn::detail::cuda_host
