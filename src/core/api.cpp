// The one selection point per operation: supported(), workspace_size() and run() all go through
// select_*(), so they cannot disagree.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#include "core/backends.hpp"
#include "core/problem.hpp"
#include "core/thread_pool.hpp"
#include "core/validate.hpp"
#ifdef FLASHATTN_WITH_CUDA
#include "cuda/cuda_backend.hpp"
#endif

namespace flashattn {
namespace detail {
namespace {

template <class Params>
struct Plan {
  Status status;
  size_t workspace_bytes = 0;
  int threads = 1;
  bool device = false;  // a GPU backend: workspace must come from the caller, run() enqueues on launch.stream
  Status (*run)(const Params&, void* workspace, int threads, void* stream) = nullptr;
};

Status run_reference_forward(const ForwardParams& p, void*, int, void*) { return reference_forward(p), Status{}; }
Status run_reference_backward(const BackwardParams& p, void*, int, void*) { return reference_backward(p), Status{}; }
template <void (*F)(const ForwardParams&, void*, int)>
Status run_cpu(const ForwardParams& p, void* ws, int threads, void*) { return F(p, ws, threads), Status{}; }
template <void (*F)(const BackwardParams&, void*, int)>
Status run_cpu(const BackwardParams& p, void* ws, int threads, void*) { return F(p, ws, threads), Status{}; }
#ifdef FLASHATTN_WITH_CUDA
// The GPU backends enqueue on the stream and report a failed launch (kInternal), not the kernels' end.
Status run_cuda_sm80_forward(const ForwardParams& p, void* ws, int, void* stream) { return cuda_sm80_forward(p, ws, stream); }
Status run_cuda_sm90_forward(const ForwardParams& p, void* ws, int, void* stream) { return cuda_sm90_forward(p, ws, stream); }
Status run_cuda_sm80_backward(const BackwardParams& p, void* ws, int, void* stream) { return cuda_sm80_backward(p, ws, stream); }
#endif

Status check_head_dims(const AttentionParams& p, Backend b, int64_t max_dim) {
  const int64_t dv = p.head_dim_v > 0 ? p.head_dim_v : p.head_dim;
  if (p.head_dim > max_dim)
    return not_supported("head_dim: backend " + std::string(to_string(b)) + " takes at most " +
                         std::to_string(max_dim) + ", got " + std::to_string(p.head_dim));
  if (dv > max_dim)
    return not_supported("head_dim_v: backend " + std::string(to_string(b)) + " takes at most " +
                         std::to_string(max_dim) + ", got " + std::to_string(dv));
  return {};
}

// kAuto: the GPU path when the data lives on the GPU (CUDA builds), else the CPU flash backend. For
// device data this says kCudaSm80; select_forward() then takes kCudaSm90 where it supports the problem.
Backend resolve_backend(Backend requested, const AttentionParams& p) {
  if (requested != Backend::kAuto) return requested;
#ifdef FLASHATTN_WITH_CUDA
  if (cuda_is_device_pointer(p.q.data)) return Backend::kCudaSm80;
#else
  (void)p;
#endif
  return Backend::kCpu;
}

#ifndef FLASHATTN_WITH_CUDA
Status no_cuda_build(Backend b) {
  return not_supported("launch.backend: " + std::string(to_string(b)) +
                       " needs a CUDA build of flashattn (configure with FLASHATTN_CUDA=ON)");
}
#endif

// The standard backend materialises [seqlen_q, seqlen_k] score matrices per worker; refuse sizes whose
// scratch (at most 16 bytes per score and worker) would not even fit in size_t.
Status check_standard_scratch(const AttentionParams& p, int threads) {
  int64_t bytes;
  if (__builtin_mul_overflow(p.seqlen_q, p.seqlen_k, &bytes) || __builtin_mul_overflow(bytes, int64_t{16}, &bytes) ||
      __builtin_mul_overflow(bytes, int64_t{threads}, &bytes))
    return not_supported("seqlen_q, seqlen_k: backend standard would need more than 2^63 bytes of scratch for " +
                         std::to_string(p.seqlen_q) + " x " + std::to_string(p.seqlen_k) + " scores");
  return {};
}

// Workspace handed to a backend is 64-byte aligned; the caller's may have any alignment, so the
// size asked of the caller includes the slack to align it.
constexpr size_t kWorkspaceAlign = 64;
size_t with_slack(size_t bytes) { return bytes == 0 ? 0 : bytes + kWorkspaceAlign; }
void* align_up(void* p) {
  const auto u = reinterpret_cast<uintptr_t>(p);
  return reinterpret_cast<void*>((u + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign);
}

Plan<ForwardParams> select_forward(const ForwardParams& p, const Launch& launch) {
  Plan<ForwardParams> plan;
  if ((plan.status = validate_launch(launch)); !plan.status) return plan;
  Backend b = resolve_backend(launch.backend, p);
  if (b == Backend::kCudaSm80 || b == Backend::kCudaSm90) {
#ifdef FLASHATTN_WITH_CUDA
    plan.device = true;
    if ((plan.status = validate_forward(p, /*host_cu_seqlens=*/false)); !plan.status) return plan;
    // kAuto on device data: the Hopper kernel where it takes the problem, else the sm80 one (its
    // supported() is asked once: it encodes tensor maps, a cost a tiny call notices).
    const bool ask_sm90 = b == Backend::kCudaSm90 || launch.backend == Backend::kAuto;
    const Status sm90 = ask_sm90 ? cuda_sm90_forward_supported(p) : Status{StatusCode::kNotSupported, {}};
    if (launch.backend == Backend::kAuto && sm90) b = Backend::kCudaSm90;
    if (b == Backend::kCudaSm90) {
      if ((plan.status = sm90); !plan.status) return plan;
      plan.run = run_cuda_sm90_forward;
      plan.workspace_bytes = with_slack(cuda_sm90_forward_workspace(p));
      return plan;
    }
    if ((plan.status = cuda_sm80_forward_supported(p)); !plan.status) return plan;
    plan.run = run_cuda_sm80_forward;
    plan.workspace_bytes = with_slack(cuda_sm80_forward_workspace(p));
#else
    plan.status = no_cuda_build(b);
#endif
    return plan;
  }
  if ((plan.status = validate_forward(p)); !plan.status) return plan;
  if ((plan.status = check_head_dims(p, b, kCpuMaxHeadDim)); !plan.status) return plan;
  plan.threads = resolve_threads(launch.num_threads);
  switch (b) {
    case Backend::kReference: plan.run = run_reference_forward; break;
    case Backend::kStandard:
      if ((plan.status = check_standard_scratch(p, plan.threads)); !plan.status) return plan;
      plan.run = run_cpu<standard_forward>;
      plan.workspace_bytes = with_slack(standard_forward_workspace(p, plan.threads));
      break;
    default:
      plan.run = run_cpu<cpu_forward>;
      plan.workspace_bytes = with_slack(cpu_forward_workspace(p, plan.threads));
      break;
  }
  return plan;
}

Plan<BackwardParams> select_backward(const BackwardParams& p, const Launch& launch) {
  Plan<BackwardParams> plan;
  if ((plan.status = validate_launch(launch)); !plan.status) return plan;
  const Backend b = resolve_backend(launch.backend, p);
  if (b == Backend::kCudaSm90) {
    plan.status = not_supported("launch.backend: cuda-sm90 has no backward (use cuda-sm80 or auto)");
    return plan;
  }
  if (b == Backend::kCudaSm80) {
#ifdef FLASHATTN_WITH_CUDA
    plan.device = true;
    if ((plan.status = validate_backward(p, /*host_cu_seqlens=*/false)); !plan.status) return plan;
    if ((plan.status = cuda_sm80_backward_supported(p)); !plan.status) return plan;
    plan.run = run_cuda_sm80_backward;
    plan.workspace_bytes = with_slack(cuda_sm80_backward_workspace(p));
#else
    plan.status = no_cuda_build(b);
#endif
    return plan;
  }
  if ((plan.status = validate_backward(p)); !plan.status) return plan;
  if ((plan.status = check_head_dims(p, b, kCpuMaxHeadDim)); !plan.status) return plan;
  plan.threads = resolve_threads(launch.num_threads);
  switch (b) {
    case Backend::kReference: plan.run = run_reference_backward; break;
    case Backend::kStandard:
      if ((plan.status = check_standard_scratch(p, plan.threads)); !plan.status) return plan;
      plan.run = run_cpu<standard_backward>;
      plan.workspace_bytes = with_slack(standard_backward_workspace(p, plan.threads));
      break;
    default:
      plan.run = run_cpu<cpu_backward>;
      plan.workspace_bytes = with_slack(cpu_backward_workspace(p, plan.threads));
      break;
  }
  return plan;
}

template <class Params>
Status execute(const Plan<Params>& plan, const Params& p, const Launch& launch) {
  if (!plan.status) return plan.status;
  if (launch.workspace != nullptr) {
    if (launch.workspace_bytes < plan.workspace_bytes)
      return {StatusCode::kWorkspaceTooSmall, "launch.workspace_bytes: need " + std::to_string(plan.workspace_bytes) +
                                                  " bytes, got " + std::to_string(launch.workspace_bytes)};
    return plan.run(p, plan.workspace_bytes ? align_up(launch.workspace) : nullptr, plan.threads, launch.stream);
  }
  if (plan.device && plan.workspace_bytes > 0)
    return invalid("launch.workspace: the GPU backend needs " + std::to_string(plan.workspace_bytes) +
                   " bytes of caller-owned device workspace (null given)");
  // CPU convenience: no caller workspace, so allocate it for this call.
  struct Free { void operator()(void* q) const { std::free(q); } };
  std::unique_ptr<void, Free> ws;
  if (plan.workspace_bytes > 0) {
    ws.reset(std::aligned_alloc(kWorkspaceAlign, (plan.workspace_bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign));
    if (!ws) return {StatusCode::kInternal, "out of memory allocating " + std::to_string(plan.workspace_bytes) +
                                                " bytes of workspace"};
  }
  return plan.run(p, ws.get(), plan.threads, launch.stream);  // aligned_alloc is already aligned; the slack goes unused
}

}  // namespace
}  // namespace detail

Status forward_supported(const ForwardParams& p, const Launch& launch) { return detail::select_forward(p, launch).status; }
Status forward_workspace_size(const ForwardParams& p, const Launch& launch, size_t* bytes) {
  if (bytes == nullptr) return detail::invalid("bytes: null pointer");
  const auto plan = detail::select_forward(p, launch);
  if (plan.status) *bytes = plan.workspace_bytes;
  return plan.status;
}
Status forward(const ForwardParams& p, const Launch& launch) {
  return detail::execute(detail::select_forward(p, launch), p, launch);
}

Status backward_supported(const BackwardParams& p, const Launch& launch) { return detail::select_backward(p, launch).status; }
Status backward_workspace_size(const BackwardParams& p, const Launch& launch, size_t* bytes) {
  if (bytes == nullptr) return detail::invalid("bytes: null pointer");
  const auto plan = detail::select_backward(p, launch);
  if (plan.status) *bytes = plan.workspace_bytes;
  return plan.status;
}
Status backward(const BackwardParams& p, const Launch& launch) {
  return detail::execute(detail::select_backward(p, launch), p, launch);
}

const char* to_string(DType t) {
  switch (t) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
  }
  return "unknown";
}
const char* to_string(Backend b) {
  switch (b) {
    case Backend::kAuto: return "auto";
    case Backend::kCpu: return "cpu";
    case Backend::kReference: return "reference";
    case Backend::kStandard: return "standard";
    case Backend::kCudaSm80: return "cuda-sm80";
    case Backend::kCudaSm90: return "cuda-sm90";
  }
  return "unknown";
}
const char* to_string(StatusCode c) {
  switch (c) {
    case StatusCode::kOk: return "ok";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kNotSupported: return "not supported";
    case StatusCode::kWorkspaceTooSmall: return "workspace too small";
    case StatusCode::kInternal: return "internal error";
  }
  return "unknown";
}

}  // namespace flashattn
