#include "gpu.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "check.hpp"
#include "report.hpp"
#include "runner.hpp"
#include "timing.hpp"
#include "workload.hpp"

namespace fa_bench {
namespace {

// Between two runs on one copy of the inputs and outputs, the other copies stream at least this
// many times the L2 size through the cache. Changes what is measured, never results.
constexpr double kL2Multiple = 3.0;
// The rotation takes at most this share of the free device memory (the rest: workspace, the
// library), and at most kMaxCopies copies (tiny problems: bounded set-up time).
constexpr double kRotationMemoryShare = 0.5;
constexpr int kMaxCopies = 4096;
// Every tensor of a set starts at a multiple of this (what cudaMalloc guarantees; the sm80 path
// wants 16-byte aligned rows).
constexpr size_t kTensorAlign = 256;

bool cuda_ok(cudaError_t e, const std::string& what, std::string* error) {
  if (e == cudaSuccess) return true;
  *error = what + ": " + cudaGetErrorString(e);
  return false;
}

// Launch errors of the kernels enqueued so far, and faults of those that ran, after a sync.
bool synced(const char* what, std::string* error) {
  return cuda_ok(cudaDeviceSynchronize(), what, error) && cuda_ok(cudaGetLastError(), what, error);
}

// One cudaMalloc allocation.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  ~DeviceMemory() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  bool allocate(size_t bytes, std::string* error) {
    return cuda_ok(cudaMalloc(&ptr_, std::max<size_t>(bytes, 1)),
                   "cudaMalloc of " + format_bytes(static_cast<double>(bytes)), error);
  }
  char* get() const { return static_cast<char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

// CUDA events, destroyed with the object.
class Events {
 public:
  explicit Events(size_t n) : events_(n, nullptr) {
    for (cudaEvent_t& e : events_)
      if (cudaEventCreate(&e) != cudaSuccess) e = nullptr;
  }
  ~Events() {
    for (cudaEvent_t e : events_)
      if (e != nullptr) cudaEventDestroy(e);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  bool ok() const { return std::none_of(events_.begin(), events_.end(), [](cudaEvent_t e) { return e == nullptr; }); }
  cudaEvent_t operator[](size_t i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

// One set: every tensor a run reads or writes, laid out as the host Workload's (contiguous
// [batch, seqlen, heads, dim]; lse [batch, heads_q, seqlen_q] fp32), each at a kTensorAlign offset.
enum Part { kQ, kK, kV, kO, kLse, kDo, kDq, kDk, kDv, kParts };

struct SetLayout {
  size_t offset[kParts] = {};
  size_t bytes[kParts] = {};  // 0: not part of this set (the gradients without backward)
  size_t total = 0;
};

SetLayout layout_of(const Workload& w, bool backward) {
  SetLayout l;
  l.bytes[kQ] = w.q().bytes();
  l.bytes[kK] = w.k().bytes();
  l.bytes[kV] = w.v().bytes();
  l.bytes[kO] = w.o(Path::kFlash).bytes();
  l.bytes[kLse] = w.lse(Path::kFlash).size() * sizeof(float);
  if (backward) {
    l.bytes[kDo] = w.d_o().bytes();
    l.bytes[kDq] = w.dq(Path::kFlash).bytes();
    l.bytes[kDk] = w.dk(Path::kFlash).bytes();
    l.bytes[kDv] = w.dv(Path::kFlash).bytes();
  }
  for (int part = 0; part < kParts; ++part) {
    l.offset[part] = l.total;
    l.total += (l.bytes[part] + kTensorAlign - 1) / kTensorAlign * kTensorAlign;
  }
  return l;
}

// The host side of each part: inputs, and the flash path's outputs.
const void* host_part(const Workload& w, Part part) {
  switch (part) {
    case kQ: return w.q().data();
    case kK: return w.k().data();
    case kV: return w.v().data();
    case kO: return w.o(Path::kFlash).data();
    case kLse: return w.lse(Path::kFlash).data();
    case kDo: return w.d_o().data();
    case kDq: return w.dq(Path::kFlash).data();
    case kDk: return w.dk(Path::kFlash).data();
    case kDv: return w.dv(Path::kFlash).data();
    case kParts: break;
  }
  return nullptr;
}

// Where the outputs come back to: w's flash slots.
void* host_output(Workload& w, Part part) {
  switch (part) {
    case kO: return w.o(Path::kFlash).data();
    case kLse: return w.lse(Path::kFlash).data();
    case kDq: return w.dq(Path::kFlash).data();
    case kDk: return w.dk(Path::kFlash).data();
    case kDv: return w.dv(Path::kFlash).data();
    default: return nullptr;  // an input
  }
}

// Every part of w into the set at `set`: the inputs, and the outputs as they are on the host
// (NaN-poisoned, or the reference forward's o and lse for a backward check).
bool upload(const Workload& w, const SetLayout& l, char* set, std::string* error) {
  for (int part = 0; part < kParts; ++part)
    if (l.bytes[part] > 0 &&
        !cuda_ok(cudaMemcpy(set + l.offset[part], host_part(w, static_cast<Part>(part)), l.bytes[part],
                            cudaMemcpyHostToDevice),
                 "cudaMemcpy to the device", error))
      return false;
  return true;
}

// Output parts of the set back into w's flash slots.
bool download(Workload* w, const SetLayout& l, const char* set, std::initializer_list<Part> parts, std::string* error) {
  for (Part part : parts)
    if (!cuda_ok(cudaMemcpy(host_output(*w, part), set + l.offset[part], l.bytes[part],
                            cudaMemcpyDeviceToHost),
                 "cudaMemcpy from the device", error))
      return false;
  return true;
}

// NaN (all bits set, in fp32, fp16 and bf16) into parts of a set: elements a run leaves unwritten show.
bool poison(const SetLayout& l, char* set, std::initializer_list<Part> parts, std::string* error) {
  for (Part part : parts)
    if (!cuda_ok(cudaMemset(set + l.offset[part], 0xff, l.bytes[part]), "cudaMemset", error)) return false;
  return true;
}

// The Workload's params with every pointer moved into the set (same strides).
flashattn::ForwardParams forward_on(Workload& w, const SetLayout& l, char* set) {
  flashattn::ForwardParams p = w.forward_params(Path::kFlash);
  p.q.data = set + l.offset[kQ];
  p.k.data = set + l.offset[kK];
  p.v.data = set + l.offset[kV];
  p.o.data = set + l.offset[kO];
  p.maybe_lse = reinterpret_cast<float*>(set + l.offset[kLse]);
  return p;
}

flashattn::BackwardParams backward_on(Workload& w, const SetLayout& l, char* set) {
  flashattn::BackwardParams p = w.backward_params(Path::kFlash);
  p.q.data = set + l.offset[kQ];
  p.k.data = set + l.offset[kK];
  p.v.data = set + l.offset[kV];
  p.o.data = set + l.offset[kO];
  p.lse = reinterpret_cast<const float*>(set + l.offset[kLse]);
  p.d_o.data = set + l.offset[kDo];
  p.dq.data = set + l.offset[kDq];
  p.dk.data = set + l.offset[kDk];
  p.dv.data = set + l.offset[kDv];
  return p;
}

bool device_info(GpuInfo* g, std::string* error) {
  int count = 0;
  if (!cuda_ok(cudaGetDeviceCount(&count), "no usable CUDA device (cudaGetDeviceCount)", error)) return false;
  if (count == 0) {
    *error = "no CUDA device";
    return false;
  }
  if (!cuda_ok(cudaGetDevice(&g->index), "cudaGetDevice", error)) return false;
  cudaDeviceProp prop{};
  int l2 = 0;
  if (!cuda_ok(cudaGetDeviceProperties(&prop, g->index), "cudaGetDeviceProperties", error) ||
      !cuda_ok(cudaDeviceGetAttribute(&g->cc_major, cudaDevAttrComputeCapabilityMajor, g->index), "cudaDeviceGetAttribute", error) ||
      !cuda_ok(cudaDeviceGetAttribute(&g->cc_minor, cudaDevAttrComputeCapabilityMinor, g->index), "cudaDeviceGetAttribute", error) ||
      !cuda_ok(cudaDeviceGetAttribute(&g->sm_count, cudaDevAttrMultiProcessorCount, g->index), "cudaDeviceGetAttribute", error) ||
      !cuda_ok(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, g->index), "cudaDeviceGetAttribute", error))
    return false;
  g->name = prop.name;
  g->l2_bytes = l2;
  return true;
}

// How many sets to rotate over: one, plus enough that kL2Multiple x L2 lies between two uses of
// one, within the memory share and kMaxCopies; 0 when not even one set fits in free memory.
int rotation_copies(size_t set_bytes, int64_t l2_bytes, size_t free_bytes) {
  if (set_bytes > free_bytes) return 0;
  const double wanted = 1.0 + std::ceil(kL2Multiple * static_cast<double>(l2_bytes) / static_cast<double>(set_bytes));
  const double fit = std::floor(kRotationMemoryShare * static_cast<double>(free_bytes) / static_cast<double>(set_bytes));
  return static_cast<int>(std::clamp(std::min(wanted, fit), 1.0, static_cast<double>(kMaxCopies)));
}

// Times call(copy): a warm-up over every copy, then up to o.repeats runs on the copies in turn,
// each between two CUDA events on the (default) stream the calls use; fewer runs when the warm-up
// says they would take longer than o.max_seconds. False with *fatal set when a call fails.
bool time_on_gpu(const std::function<flashattn::Status(int copy)>& call, int copies, const Options& o, Timing* out,
                 std::string* fatal) {
  const auto called = [&](int copy) {
    const flashattn::Status st = call(copy);
    if (!st) *fatal = st.message;
    return st.ok();
  };
  Events warm(2);
  if (!warm.ok()) return cuda_ok(cudaErrorMemoryAllocation, "cudaEventCreate", fatal);
  cudaEventRecord(warm[0]);
  for (int c = 0; c < copies; ++c)
    if (!called(c)) return false;
  cudaEventRecord(warm[1]);
  if (!synced("warm-up", fatal)) return false;
  float warm_ms = 0.0f;
  cudaEventElapsedTime(&warm_ms, warm[0], warm[1]);
  const double per_run_ms = warm_ms / copies;
  int runs = o.repeats;
  if (per_run_ms > 0.0) runs = static_cast<int>(std::clamp(std::floor(o.max_seconds * 1e3 / per_run_ms), 1.0, static_cast<double>(o.repeats)));

  Events ev(2 * static_cast<size_t>(runs));
  if (!ev.ok()) return cuda_ok(cudaErrorMemoryAllocation, "cudaEventCreate", fatal);
  for (int r = 0; r < runs; ++r) {
    cudaEventRecord(ev[2 * r]);
    if (!called(r % copies)) return false;  // the previous run on this copy was `copies` runs ago
    cudaEventRecord(ev[2 * r + 1]);
  }
  if (!synced("timed runs", fatal)) return false;
  std::vector<double> ms(static_cast<size_t>(runs));
  for (int r = 0; r < runs; ++r) {
    float t = 0.0f;
    if (!cuda_ok(cudaEventElapsedTime(&t, ev[2 * r], ev[2 * r + 1]), "cudaEventElapsedTime", fatal)) return false;
    ms[r] = t;
  }
  *out = summarize(std::move(ms));
  return true;
}

// The backward under test of the reduced check: w's inputs, o and lse on the device, the kernel,
// dq, dk, dv back into w.
BackwardUnderTest gpu_backward(flashattn::Backend kernel) {
  return [kernel](Workload& w, std::string* error) {
    const SetLayout l = layout_of(w, /*backward=*/true);
    DeviceMemory set, workspace;
    if (!set.allocate(l.total, error) || !upload(w, l, set.get(), error)) return false;
    flashattn::Launch launch;
    launch.backend = kernel;
    const flashattn::BackwardParams p = backward_on(w, l, set.get());
    size_t bytes = 0;
    if (const flashattn::Status st = flashattn::backward_workspace_size(p, launch, &bytes); !st) {
      *error = std::string(kernel_name(kernel)) + " backward: " + st.message;
      return false;
    }
    if (!workspace.allocate(bytes, error) || !cuda_ok(cudaMemset(workspace.get(), 0xff, bytes), "cudaMemset", error))
      return false;
    launch.workspace = workspace.get();
    launch.workspace_bytes = bytes;
    if (const flashattn::Status st = flashattn::backward(p, launch); !st) {
      *error = std::string(kernel_name(kernel)) + " backward: " + st.message;
      return false;
    }
    return synced("backward", error) && download(&w, l, set.get(), {kDq, kDk, kDv}, error);
  };
}

int64_t nonfinite(const Storage& s) {
  int64_t n = 0;
  for (int64_t i = 0; i < s.size(); ++i) n += !std::isfinite(s.get(i));
  return n;
}

}  // namespace

int run_gpu(const Options& o, uint64_t seed) {
  GpuResult r;
  r.shape = shape_of(o);
  r.kernel = o.kernel;
  r.seed = seed;
  r.backward = o.backward;
  std::string error;
  const auto failed = [&error](int status) {
    std::fprintf(stderr, "flashattn-bench: --device cuda: %s\n", error.c_str());
    return status;
  };
  if (!device_info(&r.gpu, &error)) return failed(kExitRunFailed);
  std::fprintf(stderr, "[bench] GPU %d: %s (sm_%d%d)\n", r.gpu.index, r.gpu.name.c_str(), r.gpu.cc_major, r.gpu.cc_minor);

  uint64_t host_bytes = 0;
  if (!workload_bytes(r.shape, o.backward, &host_bytes, &error)) return failed(kExitUsage);
  Workload w(r.shape, seed, o.backward);
  const SetLayout layout = layout_of(w, o.backward);
  size_t free_bytes = 0, total_bytes = 0;
  if (!cuda_ok(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo", &error)) return failed(kExitRunFailed);
  r.copies = rotation_copies(layout.total, r.gpu.l2_bytes, free_bytes);
  if (r.copies == 0) {
    error = "inputs and outputs need " + format_bytes(static_cast<double>(layout.total)) + " of device memory, " +
            format_bytes(static_cast<double>(free_bytes)) + " are free";
    return failed(kExitUsage);
  }
  r.rotation_bytes = static_cast<uint64_t>(r.copies) * layout.total;
  DeviceMemory arena;
  if (!arena.allocate(r.rotation_bytes, &error)) return failed(kExitRunFailed);
  const auto set = [&](int copy) { return arena.get() + static_cast<size_t>(copy) * layout.total; };

  flashattn::Launch launch;
  launch.backend = o.kernel;
  std::vector<flashattn::ForwardParams> fwd;
  for (int c = 0; c < r.copies; ++c) fwd.push_back(forward_on(w, layout, set(c)));
  size_t fwd_workspace = 0;
  if (const flashattn::Status st = flashattn::forward_workspace_size(fwd[0], launch, &fwd_workspace); !st) {
    error = std::string("the library rejects this problem (kernel ") + kernel_name(o.kernel) + "): " + st.message;
    return failed(kExitUsage);
  }
  const flashattn::AttentionParams ap = w.attention_params();
  r.visible_pairs = visible_pairs(ap) / std::max<int64_t>(r.shape.batch, 1);
  r.forward_flops = paper_forward_flops(ap, &r.papers_flops);
  r.backward_flops = 2.5 * r.forward_flops;

  // Copy 0 from the host (inputs; outputs NaN), the others from copy 0.
  std::fprintf(stderr, "[bench] %d copies of the inputs and outputs (%s) on the device...\n", r.copies,
               format_bytes(static_cast<double>(r.rotation_bytes)).c_str());
  if (!upload(w, layout, set(0), &error)) return failed(kExitRunFailed);
  for (int c = 1; c < r.copies; ++c)
    if (!cuda_ok(cudaMemcpy(set(c), set(0), layout.total, cudaMemcpyDeviceToDevice), "cudaMemcpy on the device", &error))
      return failed(kExitRunFailed);

  DeviceMemory fwd_ws;
  if (fwd_workspace > 0 && !fwd_ws.allocate(fwd_workspace, &error)) return failed(kExitRunFailed);
  launch.workspace = fwd_ws.get();
  launch.workspace_bytes = fwd_workspace;

  // Checked run on poisoned outputs, then the timing.
  std::fprintf(stderr, "[bench] flash forward...\n");
  if (!poison(layout, set(0), {kO, kLse}, &error)) return failed(kExitRunFailed);
  if (const flashattn::Status st = flashattn::forward(fwd[0], launch); !st) {
    error = "forward: " + st.message;
    return failed(kExitRunFailed);
  }
  if (!synced("forward", &error) || !download(&w, layout, set(0), {kO, kLse}, &error)) return failed(kExitRunFailed);
  r.flash_fwd_err = check_forward_rows(w.forward_params(Path::kFlash), o.check_rows, seed);
  r.flash_fwd.extra_known = true;
  r.flash_fwd.extra_bytes = fwd_workspace;
  if (!time_on_gpu([&](int c) { return flashattn::forward(fwd[c], launch); }, r.copies, o, &r.flash_fwd.timing, &error))
    return failed(kExitRunFailed);
  r.flash_fwd.ran = true;
  r.flash_fwd.gflops = gflops(r.forward_flops, r.flash_fwd.timing.median_ms);

  if (o.backward) {
    // Every copy's o and lse come from the forward runs above.
    std::vector<flashattn::BackwardParams> bwd;
    for (int c = 0; c < r.copies; ++c) bwd.push_back(backward_on(w, layout, set(c)));
    flashattn::Launch bwd_launch;
    bwd_launch.backend = o.kernel;
    size_t bwd_workspace = 0;
    r.bwd_check_shape = reduced_shape(r.shape);
    if (const flashattn::Status st = flashattn::backward_workspace_size(bwd[0], bwd_launch, &bwd_workspace); !st) {
      r.flash_bwd.skipped = std::string(kernel_name(o.kernel)) + " does not take this backward: " + st.message;
      r.bwd_err.error = r.flash_bwd.skipped;
    } else {
      std::fprintf(stderr, "[bench] flash backward...\n");
      DeviceMemory bwd_ws;
      if (!bwd_ws.allocate(bwd_workspace, &error) ||
          !cuda_ok(cudaMemset(bwd_ws.get(), 0xff, bwd_workspace), "cudaMemset", &error))
        return failed(kExitRunFailed);
      bwd_launch.workspace = bwd_ws.get();
      bwd_launch.workspace_bytes = bwd_workspace;
      if (!poison(layout, set(0), {kDq, kDk, kDv}, &error)) return failed(kExitRunFailed);
      if (const flashattn::Status st = flashattn::backward(bwd[0], bwd_launch); !st) {
        error = "backward: " + st.message;
        return failed(kExitRunFailed);
      }
      if (!synced("backward", &error) || !download(&w, layout, set(0), {kDq, kDk, kDv}, &error))
        return failed(kExitRunFailed);
      r.bwd_nonfinite = nonfinite(w.dq(Path::kFlash)) + nonfinite(w.dk(Path::kFlash)) + nonfinite(w.dv(Path::kFlash));
      r.flash_bwd.extra_known = true;
      r.flash_bwd.extra_bytes = bwd_workspace;
      if (!time_on_gpu([&](int c) { return flashattn::backward(bwd[c], bwd_launch); }, r.copies, o,
                       &r.flash_bwd.timing, &error))
        return failed(kExitRunFailed);
      r.flash_bwd.ran = true;
      r.flash_bwd.gflops = gflops(r.backward_flops, r.flash_bwd.timing.median_ms);
      std::fprintf(stderr, "[bench] backward check against the reference...\n");
      r.bwd_err = check_backward_reduced(r.shape, seed, gpu_backward(o.kernel), /*with_standard=*/false, o.threads);
    }
  }
  r.peak_rss_bytes = peak_rss_bytes();

  if (o.json)
    std::printf("%s\n", gpu_to_json(r, o).c_str());
  else
    print_gpu_table(r, o);
  return kExitOk;
}

}  // namespace fa_bench
