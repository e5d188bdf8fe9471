// Host side of the sm80 forward: the selection shared by supported(), workspace() and run(), and
// the translation of ForwardParams into the kernel's params.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "core/problem.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/sm80/kernel_params.hpp"
#include "cuda/sm80/launch_forward.hpp"
#include "cuda/sm80/policy.hpp"

namespace flashattn::detail {
namespace {

using sm80::ForwardKernelParams;
using sm80::ForwardTiles;

struct Instance {
  int head_dim, head_dim_v;
  DType dtype;
  cudaError_t (*launch)(const ForwardKernelParams&, cudaStream_t);
};

constexpr Instance kInstances[] = {
#define FLASHATTN_SM80_FORWARD_INSTANCE(HEAD_DIM, HEAD_DIM_V, DTYPE) \
  {HEAD_DIM, HEAD_DIM_V, DTYPE, &sm80::launch_forward<HEAD_DIM, HEAD_DIM_V, DTYPE>},
#include "cuda/sm80/instantiations/forward_list.inc"
#undef FLASHATTN_SM80_FORWARD_INSTANCE
};

Status not_supported(std::string what) {
  return {StatusCode::kNotSupported, "cuda sm80 forward: " + std::move(what)};
}

// The instantiation that serves p: of p's dtype, with head dims at least p's (zero padding serves
// the rest), the smallest head_dim + head_dim_v among those. Null when none.
const Instance* pick_instance(const ForwardParams& p) {
  const Dims d = resolve_dims(p);
  const Instance* best = nullptr;
  for (const Instance& inst : kInstances)
    if (inst.dtype == p.dtype && inst.head_dim >= d.head_dim && inst.head_dim_v >= d.head_dim_v &&
        (best == nullptr || inst.head_dim + inst.head_dim_v < best->head_dim + best->head_dim_v))
      best = &inst;
  return best;
}

int largest_head_dim(DType dtype) {
  int largest = 0;
  for (const Instance& inst : kInstances)
    if (inst.dtype == dtype && inst.head_dim == inst.head_dim_v && inst.head_dim > largest) largest = inst.head_dim;
  return largest;
}

// "(192, 128), (64, 128)": the built pairs of different head dims, for refusals.
std::string head_dim_pairs(DType dtype) {
  std::string pairs;
  for (const Instance& inst : kInstances)
    if (inst.dtype == dtype && inst.head_dim != inst.head_dim_v)
      pairs += (pairs.empty() ? "(" : ", (") + std::to_string(inst.head_dim) + ", " + std::to_string(inst.head_dim_v) + ")";
  return pairs.empty() ? "none" : pairs;
}

// cp.async moves 16 bytes: every row must start on a 16-byte boundary (batch strides are unused
// with varlen).
template <class Tensor>
bool aligned_16(const Tensor& t, bool varlen, size_t elem) {
  const auto misaligned = [&](int64_t stride) { return (stride * static_cast<int64_t>(elem)) % 16 != 0; };
  return reinterpret_cast<uintptr_t>(t.data) % 16 == 0 && !misaligned(t.row_stride) && !misaligned(t.head_stride) &&
         (varlen || !misaligned(t.batch_stride));
}

// Device (or managed) memory of the current device.
bool on_device(const void* ptr, int device) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();  // the failed query leaves an error behind; clear it
    return false;
  }
  return (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) && attr.device == device;
}

ForwardKernelParams kernel_params(const ForwardParams& p) {
  const Dims d = resolve_dims(p);
  ForwardKernelParams k{};
  k.q = p.q.data;
  k.k = p.k.data;
  k.v = p.v.data;
  k.o = p.o.data;
  k.maybe_lse = p.maybe_lse;
  k.q_batch_stride = p.q.batch_stride, k.q_row_stride = p.q.row_stride, k.q_head_stride = p.q.head_stride;
  k.k_batch_stride = p.k.batch_stride, k.k_row_stride = p.k.row_stride, k.k_head_stride = p.k.head_stride;
  k.v_batch_stride = p.v.batch_stride, k.v_row_stride = p.v.row_stride, k.v_head_stride = p.v.head_stride;
  k.o_batch_stride = p.o.batch_stride, k.o_row_stride = p.o.row_stride, k.o_head_stride = p.o.head_stride;
  k.lse_batch_stride = p.lse_batch_stride;
  k.lse_head_stride = p.lse_head_stride;
  k.maybe_cu_seqlens_q = p.maybe_cu_seqlens_q;
  k.maybe_cu_seqlens_k = p.maybe_cu_seqlens_k;
  k.batch = static_cast<int>(d.batch);
  k.seqlen_q = static_cast<int>(d.seqlen_q);
  k.seqlen_k = static_cast<int>(d.seqlen_k);
  k.heads_q = static_cast<int>(d.heads_q);
  k.group = static_cast<int>(d.group);
  k.head_dim = static_cast<int>(d.head_dim);
  k.head_dim_v = static_cast<int>(d.head_dim_v);
  k.scale = d.scale;
  k.scale_log2 = d.scale * kLog2e;
  k.bottom_right = p.alignment == Alignment::kBottomRight;
  // problem.hpp's visible_keys: causal is window_right = min(window_right, 0) (0 when unbounded).
  // A window of seqlen_q + seqlen_k or more hides nothing, so clamping there keeps the band exact
  // and the kernel's indices in 32 bits.
  const int64_t right = p.causal ? (p.window_right < 0 ? 0 : std::min<int64_t>(p.window_right, 0)) : p.window_right;
  const auto clamp_window = [&](int64_t w) { return static_cast<int>(w < 0 ? -1 : std::min(w, d.seqlen_q + d.seqlen_k)); };
  k.window_left = clamp_window(p.window_left);
  k.window_right = clamp_window(right);
  k.softcap = p.softcap;
  k.maybe_alibi_slopes = p.maybe_alibi_slopes;
  k.alibi_batch_stride = p.alibi_batch_stride;
  k.maybe_bias = p.maybe_bias.data;
  k.bias_dtype = static_cast<int>(p.maybe_bias.dtype);
  k.bias_batch_stride = p.maybe_bias.batch_stride;
  k.bias_head_stride = p.maybe_bias.head_stride;
  k.bias_row_stride = p.maybe_bias.row_stride;
  k.maybe_mask = p.maybe_mask.data;
  k.mask_batch_stride = p.maybe_mask.batch_stride;
  k.mask_head_stride = p.maybe_mask.head_stride;
  k.mask_row_stride = p.maybe_mask.row_stride;
  return k;
}

}  // namespace

Status cuda_sm80_forward_supported(const ForwardParams& p) {
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16)
    return not_supported("dtype fp32 (takes fp16 and bf16)");
  const Dims d = resolve_dims(p);
  if (d.head_dim % 8 != 0)
    return not_supported("head_dim " + std::to_string(d.head_dim) + " (takes multiples of 8)");
  if (d.head_dim_v % 8 != 0)
    return not_supported("head_dim_v " + std::to_string(d.head_dim_v) + " (takes multiples of 8)");
  const Instance* inst = pick_instance(p);
  if (inst == nullptr && d.head_dim_v == d.head_dim)
    return not_supported("head_dim " + std::to_string(d.head_dim) + " (the largest built is " +
                         std::to_string(largest_head_dim(p.dtype)) + ")");
  if (inst == nullptr)
    return not_supported("head_dim_v " + std::to_string(d.head_dim_v) + " with head_dim " +
                         std::to_string(d.head_dim) + " (the largest built is " +
                         std::to_string(largest_head_dim(p.dtype)) + " for both; other (head_dim, head_dim_v): " +
                         head_dim_pairs(p.dtype) + ")");
  if (p.maybe_bias.data != nullptr &&
      reinterpret_cast<uintptr_t>(p.maybe_bias.data) % dtype_size(p.maybe_bias.dtype) != 0)
    return not_supported("maybe_bias: data must be aligned to its element size");
  if (!(d.scale > 0.0f) || !std::isfinite(d.scale))
    return not_supported("softmax_scale " + std::to_string(d.scale) + " (takes finite positive scales)");
  constexpr int64_t kMaxGridYZ = 65535;
  if (d.seqlen_q + d.seqlen_k > std::numeric_limits<int32_t>::max())
    return not_supported("seqlen_q + seqlen_k above 2^31 - 1 (32-bit row indices)");
  if (d.heads_q > kMaxGridYZ || d.batch > kMaxGridYZ)
    return not_supported("heads_q and batch must be at most 65535 (grid dimensions)");

  const size_t elem = dtype_size(p.dtype);
  if (!aligned_16(p.q, d.varlen, elem)) return not_supported("q: data and strides must be 16-byte aligned");
  if (!aligned_16(p.k, d.varlen, elem)) return not_supported("k: data and strides must be 16-byte aligned");
  if (!aligned_16(p.v, d.varlen, elem)) return not_supported("v: data and strides must be 16-byte aligned");
  if (!aligned_16(p.o, d.varlen, elem)) return not_supported("o: data and strides must be 16-byte aligned");

  int device = 0, major = 0, smem_optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    cudaGetLastError();
    return not_supported("no usable CUDA device");
  }
  if (major < 8) return not_supported("compute capability " + std::to_string(major) + ".x (needs 8.0 or later)");
  // The launcher picks the kernel variant by the same test.
  const bool score_mods = kernel_params(p).has_score_mods();
  const ForwardTiles tiles = sm80::forward_tiles(inst->head_dim, inst->head_dim_v, score_mods);
  if (smem_optin < tiles.smem_bytes())
    return not_supported("head_dim " + std::to_string(d.head_dim) + " needs " + std::to_string(tiles.smem_bytes()) +
                         " bytes of shared memory per block, the device has " + std::to_string(smem_optin));

  const struct { const void* ptr; const char* name; } pointers[] = {
      {p.q.data, "q"}, {p.k.data, "k"}, {p.v.data, "v"}, {p.o.data, "o"}, {p.maybe_lse, "maybe_lse"},
      {p.maybe_cu_seqlens_q, "maybe_cu_seqlens_q"}, {p.maybe_cu_seqlens_k, "maybe_cu_seqlens_k"},
      {p.maybe_alibi_slopes, "maybe_alibi_slopes"}, {p.maybe_bias.data, "maybe_bias"}, {p.maybe_mask.data, "maybe_mask"}};
  for (const auto& ptr : pointers)
    if (ptr.ptr != nullptr && !on_device(ptr.ptr, device))
      return not_supported(std::string(ptr.name) + " is not device memory of the current device");
  return {};
}

bool cuda_is_device_pointer(const void* ptr) {
  int device = 0;
  if (ptr == nullptr) return false;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return on_device(ptr, device);
}

size_t cuda_sm80_forward_workspace(const ForwardParams&) { return 0; }

void cuda_sm80_forward(const ForwardParams& p, void* /*workspace*/, void* stream) {
  const Instance* inst = pick_instance(p);
  if (inst == nullptr || p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return;  // nothing to launch
  inst->launch(kernel_params(p), static_cast<cudaStream_t>(stream));
}

}  // namespace flashattn::detail
