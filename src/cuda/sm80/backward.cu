// Host side of the sm80 backward: the selection shared by supported(), workspace() and run(), and
// the translation of BackwardParams into the kernels' params and workspace layout.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "core/problem.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/host_checks.hpp"
#include "cuda/sm80/host_common.hpp"
#include "cuda/sm80/backward_dq_policy.hpp"
#include "cuda/sm80/backward_launch.hpp"
#include "cuda/sm80/backward_params.hpp"
#include "cuda/sm80/backward_policy.hpp"

namespace flashattn::detail {
namespace {

using sm80::BackwardKernelParams;

struct BackwardInstance {
  int head_dim, head_dim_v;
  DType dtype;
  cudaError_t (*launch)(const BackwardKernelParams&, cudaStream_t);
};

constexpr BackwardInstance kBackwardInstances[] = {
#define FLASHATTN_SM80_BACKWARD_INSTANCE(HEAD_DIM, HEAD_DIM_V, DTYPE) \
  {HEAD_DIM, HEAD_DIM_V, DTYPE, &sm80::launch_backward<HEAD_DIM, HEAD_DIM_V, DTYPE>},
#include "cuda/sm80/instantiations/backward_list.inc"
#undef FLASHATTN_SM80_BACKWARD_INSTANCE
};

Status not_supported(std::string what) {
  return {StatusCode::kNotSupported, "cuda sm80 backward: " + std::move(what)};
}

const BackwardInstance* pick_instance(const BackwardParams& p) {
  return sm80::pick_instance(kBackwardInstances, p.dtype, resolve_dims(p));
}

// Floats per row of the dQ accumulator: the head dim of the instantiation that runs (its tiles are
// that wide); the problem's own where none serves it (supported() then refuses).
int accum_width(const BackwardParams& p) {
  const BackwardInstance* inst = pick_instance(p);
  return inst != nullptr ? inst->head_dim : static_cast<int>(resolve_dims(p).head_dim);
}

// The main kernel's blocks and which of them run split (tail_split): only where every block
// costs the same (no band, no varlen, hence no score modifier that skips tiles) and in the
// non-deterministic mode (the pieces add dK and dV with atomics). FLASHATTN_SM80_BACKWARD_PIECES=k
// or k,first splits the blocks from `first` (0 if not given) into k pieces instead, or none for
// k = 1 (tests and measurements). No split without query rows (the preprocess, which zeroes the
// pieces' accumulators, does not run). `device`: the current one, null when there is none.
struct BlockPlan {
  int key_blocks;
  int64_t blocks, split_begin;
  int pieces;
  int64_t split_floats;  // dkv_accum

  int64_t split_blocks() const { return pieces > 1 ? blocks - split_begin : 0; }  // dkv_arrivals
};

BlockPlan block_plan(const BackwardParams& p, const Dims& d, bool score_mods, const cuda_host::Device* device) {
  const BackwardInstance* inst = pick_instance(p);
  BlockPlan plan{0, 0, 0, 1, 0};
  if (inst == nullptr) return plan;
  const sm80::BackwardTiles tiles = sm80::backward_tiles(inst->head_dim, inst->head_dim_v, score_mods);
  plan.key_blocks = static_cast<int>((d.seqlen_k + tiles.block_n - 1) / tiles.block_n);
  plan.blocks = int64_t{plan.key_blocks} * (d.heads_q / d.group) * d.batch;
  plan.split_begin = plan.blocks;
  const cuda_host::KernelBand band = cuda_host::kernel_band(p, d);
  // (Past 2^30 blocks the pieces could overflow the 1-D grid: no split.)
  if (!tiles.tail_split || p.deterministic || d.varlen || d.seqlen_q == 0 || band.window_left >= 0 ||
      band.window_right >= 0 || p.maybe_mask.data != nullptr || plan.blocks > (int64_t{1} << 30))
    return plan;
  if (const char* forced = std::getenv("FLASHATTN_SM80_BACKWARD_PIECES"); forced != nullptr) {
    plan.pieces = std::clamp(std::atoi(forced), 1, 64);
    const char* first = std::strchr(forced, ',');
    const int64_t from = first != nullptr ? std::atoll(first + 1) : 0;
    plan.split_begin = plan.pieces == 1 ? plan.blocks : std::clamp<int64_t>(from, 0, plan.blocks);
  } else {
    if (device == nullptr) return plan;
    const int64_t steps = d.group * ((d.seqlen_q + tiles.block_m - 1) / tiles.block_m);
    const sm80::TailSplit split =
        sm80::tail_split(plan.blocks, int64_t{device->multiprocessors} * tiles.min_blocks, steps);
    plan.split_begin = split.begin;
    plan.pieces = split.pieces;
  }
  if (plan.pieces > 1)
    plan.split_floats = plan.split_blocks() * tiles.block_n * (inst->head_dim + inst->head_dim_v);
  return plan;
}

// Whether the launch runs the score-modifier variant: the launcher's test (has_score_mods) on the
// modifier fields alone, without the rest of kernel_params (its block plan queries the device).
bool takes_score_mods(const BackwardParams& p) {
  BackwardKernelParams k{};
  sm80::fill_shape_band_and_mods(k, p, resolve_dims(p));
  return k.has_score_mods();
}

BackwardKernelParams kernel_params(const BackwardParams& p, void* workspace) {
  const Dims d = resolve_dims(p);
  BackwardKernelParams k{};
  k.q = p.q.data, k.k = p.k.data, k.v = p.v.data, k.o = p.o.data, k.d_o = p.d_o.data, k.lse = p.lse;
  k.dq = p.dq.data, k.dk = p.dk.data, k.dv = p.dv.data;
  k.q_batch_stride = p.q.batch_stride, k.q_row_stride = p.q.row_stride, k.q_head_stride = p.q.head_stride;
  k.k_batch_stride = p.k.batch_stride, k.k_row_stride = p.k.row_stride, k.k_head_stride = p.k.head_stride;
  k.v_batch_stride = p.v.batch_stride, k.v_row_stride = p.v.row_stride, k.v_head_stride = p.v.head_stride;
  k.o_batch_stride = p.o.batch_stride, k.o_row_stride = p.o.row_stride, k.o_head_stride = p.o.head_stride;
  k.do_batch_stride = p.d_o.batch_stride, k.do_row_stride = p.d_o.row_stride, k.do_head_stride = p.d_o.head_stride;
  k.dq_batch_stride = p.dq.batch_stride, k.dq_row_stride = p.dq.row_stride, k.dq_head_stride = p.dq.head_stride;
  k.dk_batch_stride = p.dk.batch_stride, k.dk_row_stride = p.dk.row_stride, k.dk_head_stride = p.dk.head_stride;
  k.dv_batch_stride = p.dv.batch_stride, k.dv_row_stride = p.dv.row_stride, k.dv_head_stride = p.dv.head_stride;
  k.lse_batch_stride = p.lse_batch_stride;
  k.lse_head_stride = p.lse_head_stride;

  // The layout of backward_workspace_bytes(); the deterministic mode has no dQ accumulator.
  // Without a workspace (supported() asking which variant runs) the arrays stay null.
  if (workspace != nullptr) {
    const int64_t rows = d.batch * d.heads_q * d.seqlen_q;
    const uintptr_t base = reinterpret_cast<uintptr_t>(workspace);
    const uintptr_t aligned =
        (base + sm80::kWorkspaceAlignment - 1) / sm80::kWorkspaceAlignment * sm80::kWorkspaceAlignment;
    float* arrays = reinterpret_cast<float*>(aligned);
    k.dq_accum_rows = sm80::dq_accum_rows(d.seqlen_q);
    k.dq_accum_width = accum_width(p);
    k.dq_accum = p.deterministic ? nullptr : arrays;
    k.delta = arrays + (p.deterministic ? 0 : d.batch * d.heads_q * k.dq_accum_rows * k.dq_accum_width);
    k.lse_log2 = k.delta + rows;
  }

  sm80::fill_shape_band_and_mods(k, p, d);
  cuda_host::Device device;
  const bool have_device = cuda_host::current_device(&device);
  k.dependent_launch = have_device && device.major >= 9;
  const BlockPlan plan = block_plan(p, d, k.has_score_mods(), have_device ? &device : nullptr);
  k.key_blocks = plan.key_blocks;
  k.split_begin = static_cast<int>(plan.split_begin);
  k.grid_first_block = 0;
  k.split_pieces = plan.pieces;
  if (workspace != nullptr && plan.pieces > 1) {  // after lse_log2 (backward_workspace_bytes)
    float* const arrays = k.dq_accum;  // split only in the non-deterministic mode: the start
    k.dkv_accum = arrays + sm80::split_arrays_offset(k.lse_log2 + d.batch * d.heads_q * d.seqlen_q - arrays);
    k.dkv_arrivals = reinterpret_cast<int*>(k.dkv_accum + plan.split_floats);
    k.dkv_words = plan.split_floats + plan.split_blocks();
  }
  return k;
}

}  // namespace

Status cuda_sm80_backward_supported(const BackwardParams& p) {
  const Dims d = resolve_dims(p);
  cuda_host::Device device;
  if (std::string why = sm80::common_refusal(p, d, &device); !why.empty()) return not_supported(std::move(why));
  if (std::string why = sm80::head_dim_refusal(kBackwardInstances, p.dtype, d); !why.empty())
    return not_supported(std::move(why));
  if (p.lse == nullptr) return not_supported("lse is required");
  const BackwardInstance* inst = pick_instance(p);

  const size_t elem = dtype_size(p.dtype);
  const struct { const ConstTensor t; const char* name; } tensors[] = {
      {p.q, "q"}, {p.k, "k"}, {p.v, "v"}, {p.o, "o"}, {p.d_o, "d_o"}, {p.dq, "dq"}, {p.dk, "dk"}, {p.dv, "dv"}};
  for (const auto& t : tensors)
    if (!cuda_host::aligned_16(t.t, d.varlen, elem))
      return not_supported(std::string(t.name) + ": data and strides must be 16-byte aligned");

  // The main kernel's shared memory, and the dQ kernel's in the deterministic mode, of the variant
  // the launcher picks by the same test.
  const bool score_mods = takes_score_mods(p);
  const int smem = std::max(sm80::backward_smem_bytes(inst->head_dim, inst->head_dim_v, score_mods),
                            p.deterministic
                                ? sm80::backward_dq_tiles(inst->head_dim, inst->head_dim_v, score_mods).smem_bytes()
                                : 0);
  if (device.smem_optin < smem)
    return not_supported("head_dim " + std::to_string(d.head_dim) +
                         (d.head_dim_v != d.head_dim ? ", head_dim_v " + std::to_string(d.head_dim_v) : "") +
                         (p.deterministic ? " (deterministic)" : "") + " needs " + std::to_string(smem) +
                         " bytes of shared memory per block, the device has " + std::to_string(device.smem_optin));

  if (const char* name = cuda_host::first_not_on_device(
          {{p.q.data, "q"}, {p.k.data, "k"}, {p.v.data, "v"}, {p.o.data, "o"}, {p.d_o.data, "d_o"}, {p.lse, "lse"},
           {p.dq.data, "dq"}, {p.dk.data, "dk"}, {p.dv.data, "dv"}, {p.maybe_cu_seqlens_q, "maybe_cu_seqlens_q"},
           {p.maybe_cu_seqlens_k, "maybe_cu_seqlens_k"}, {p.maybe_alibi_slopes, "maybe_alibi_slopes"},
           {p.maybe_bias.data, "maybe_bias"}, {p.maybe_mask.data, "maybe_mask"}},
          device.index))
    return not_supported(std::string(name) + " is not device memory of the current device");
  return {};
}

size_t cuda_sm80_backward_workspace(const BackwardParams& p) {
  const Dims d = resolve_dims(p);
  cuda_host::Device device;
  const bool have_device = cuda_host::current_device(&device);
  const BlockPlan plan = block_plan(p, d, takes_score_mods(p), have_device ? &device : nullptr);
  return static_cast<size_t>(sm80::backward_workspace_bytes(
      d.batch, d.heads_q, d.seqlen_q, accum_width(p), p.deterministic,
      plan.split_blocks(), plan.split_floats));
}

Status cuda_sm80_backward(const BackwardParams& p, void* workspace, void* stream) {
  const BackwardInstance* inst = pick_instance(p);
  if (inst == nullptr || p.batch == 0 || p.heads_q == 0 || (p.seqlen_q == 0 && p.seqlen_k == 0)) return {};
  if (const cudaError_t e = inst->launch(kernel_params(p, workspace), static_cast<cudaStream_t>(stream));
      e != cudaSuccess)
    return {StatusCode::kInternal, std::string("cuda sm80 backward: launch failed: ") + cudaGetErrorString(e)};
  return {};
}

}  // namespace flashattn::detail
