// Host-side pieces the sm80 forward and backward share (forward.cu, backward.cu): choosing the
// instantiation that serves a problem from a generated table, the refusals that name what is built,
// and the fields their kernel params have in common (shape, scale, band, score modifiers).
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

#include "core/problem.hpp"
#include "cuda/host_checks.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn::detail::sm80 {

// The instantiation that serves d: of the dtype, with head dims at least d's (zero padding serves
// the rest), the smallest head_dim + head_dim_v among those. Null when none. Instance: any struct
// with head_dim, head_dim_v and dtype.
template <class Instance, size_t N>
const Instance* pick_instance(const Instance (&table)[N], DType dtype, const Dims& d) {
  const Instance* best = nullptr;
  for (const Instance& inst : table)
    if (inst.dtype == dtype && inst.head_dim >= d.head_dim && inst.head_dim_v >= d.head_dim_v &&
        (best == nullptr || inst.head_dim + inst.head_dim_v < best->head_dim + best->head_dim_v))
      best = &inst;
  return best;
}

// Why no instantiation serves d (empty when one does): the head dims are not multiples of 8, or above
// the largest built, or a (head_dim, head_dim_v) pair that is not built ("(192, 128), (64, 128)").
template <class Instance, size_t N>
std::string head_dim_refusal(const Instance (&table)[N], DType dtype, const Dims& d) {
  if (d.head_dim % 8 != 0) return "head_dim " + std::to_string(d.head_dim) + " (takes multiples of 8)";
  if (d.head_dim_v % 8 != 0) return "head_dim_v " + std::to_string(d.head_dim_v) + " (takes multiples of 8)";
  if (pick_instance(table, dtype, d) != nullptr) return {};
  int largest = 0;
  std::string pairs;
  for (const Instance& inst : table) {
    if (inst.dtype != dtype) continue;
    if (inst.head_dim == inst.head_dim_v && inst.head_dim > largest) largest = inst.head_dim;
    if (inst.head_dim != inst.head_dim_v)
      pairs += (pairs.empty() ? "(" : ", (") + std::to_string(inst.head_dim) + ", " + std::to_string(inst.head_dim_v) + ")";
  }
  if (d.head_dim_v == d.head_dim)
    return "head_dim " + std::to_string(d.head_dim) + " (the largest built is " + std::to_string(largest) + ")";
  return "head_dim_v " + std::to_string(d.head_dim_v) + " with head_dim " + std::to_string(d.head_dim) +
         " (the largest built is " + std::to_string(largest) + " for both; other (head_dim, head_dim_v): " +
         (pairs.empty() ? "none" : pairs) + ")";
}

// The checks of supported() that do not depend on the operation: dtype, a bias aligned to its
// element, a finite positive scale, the kernels' index limits, a device with compute capability 8.0
// or later that this build has code for. Fills *device. Empty when all pass.
inline std::string common_refusal(const AttentionParams& p, const Dims& d, cuda_host::Device* device) {
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return "dtype fp32 (takes fp16 and bf16)";
  if (p.maybe_bias.data != nullptr &&
      reinterpret_cast<uintptr_t>(p.maybe_bias.data) % dtype_size(p.maybe_bias.dtype) != 0)
    return "maybe_bias: data must be aligned to its element size";
  if (!(d.scale > 0.0f) || !std::isfinite(d.scale))
    return "softmax_scale " + std::to_string(d.scale) + " (takes finite positive scales)";
  if (std::string limit = cuda_host::index_limits(d); !limit.empty()) return limit;
  if (!cuda_host::current_device(device)) return "no usable CUDA device";
  if (device->major < 8)
    return "compute capability " + std::to_string(device->major) + "." + std::to_string(device->minor) +
           " (needs 8.0 or later)";
  return cuda_host::missing_code(*device);
}

// The fields ForwardKernelParams and BackwardKernelParams share, from the problem.
template <class KernelParams>
void fill_shape_band_and_mods(KernelParams& k, const AttentionParams& p, const Dims& d) {
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
  const cuda_host::KernelBand band = cuda_host::kernel_band(p, d);
  k.bottom_right = band.bottom_right;
  k.window_left = band.window_left;
  k.window_right = band.window_right;
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
}

}  // namespace flashattn::detail::sm80
