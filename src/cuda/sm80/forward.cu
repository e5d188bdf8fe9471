// Host side of the sm80 forward: the selection shared by supported(), workspace() and run(), and
// the translation of ForwardParams into the kernel's params.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "core/problem.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/host_checks.hpp"
#include "cuda/sm80/host_common.hpp"
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

const Instance* pick_instance(const ForwardParams& p) { return sm80::pick_instance(kInstances, p.dtype, resolve_dims(p)); }

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
  sm80::fill_shape_band_and_mods(k, p, d);
  return k;
}

}  // namespace

Status cuda_sm80_forward_supported(const ForwardParams& p) {
  const Dims d = resolve_dims(p);
  cuda_host::Device device;
  if (std::string why = sm80::common_refusal(p, d, &device); !why.empty()) return not_supported(std::move(why));
  if (std::string why = sm80::head_dim_refusal(kInstances, p.dtype, d); !why.empty()) return not_supported(std::move(why));
  const Instance* inst = pick_instance(p);

  const size_t elem = dtype_size(p.dtype);
  const struct { ConstTensor t; const char* name; } tensors[] = {{p.q, "q"}, {p.k, "k"}, {p.v, "v"}, {p.o, "o"}};
  for (const auto& t : tensors)
    if (!cuda_host::aligned_16(t.t, d.varlen, elem))
      return not_supported(std::string(t.name) + ": data and strides must be 16-byte aligned");

  // The launcher picks the kernel variant by the same test.
  const bool score_mods = kernel_params(p).has_score_mods();
  const ForwardTiles tiles = sm80::forward_tiles(inst->head_dim, inst->head_dim_v, score_mods);
  if (device.smem_optin < tiles.smem_bytes())
    return not_supported("head_dim " + std::to_string(d.head_dim) + " needs " + std::to_string(tiles.smem_bytes()) +
                         " bytes of shared memory per block, the device has " + std::to_string(device.smem_optin));

  if (const char* name = cuda_host::first_not_on_device(
          {{p.q.data, "q"}, {p.k.data, "k"}, {p.v.data, "v"}, {p.o.data, "o"}, {p.maybe_lse, "maybe_lse"},
           {p.maybe_cu_seqlens_q, "maybe_cu_seqlens_q"}, {p.maybe_cu_seqlens_k, "maybe_cu_seqlens_k"},
           {p.maybe_alibi_slopes, "maybe_alibi_slopes"}, {p.maybe_bias.data, "maybe_bias"},
           {p.maybe_mask.data, "maybe_mask"}},
          device.index))
    return not_supported(std::string(name) + " is not device memory of the current device");
  return {};
}

bool cuda_is_device_pointer(const void* ptr) {
  int device = 0;
  if (ptr == nullptr) return false;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return cuda_host::on_device(ptr, device);
}

size_t cuda_sm80_forward_workspace(const ForwardParams&) { return 0; }

Status cuda_sm80_forward(const ForwardParams& p, void* /*workspace*/, void* stream) {
  const Instance* inst = pick_instance(p);
  if (inst == nullptr || p.batch == 0 || p.seqlen_q == 0 || p.heads_q == 0) return {};  // nothing to launch
  if (const cudaError_t e = inst->launch(kernel_params(p), static_cast<cudaStream_t>(stream)); e != cudaSuccess)
    return {StatusCode::kInternal, std::string("cuda sm80 forward: launch failed: ") + cudaGetErrorString(e)};
  return {};
}

}  // namespace flashattn::detail
