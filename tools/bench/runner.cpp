#include "runner.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <memory>

namespace fa_bench {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

Shape shape_of(const Options& o) {
  Shape s;
  s.dtype = o.dtype;
  s.batch = o.batch;
  s.heads_q = o.heads_q;
  s.heads_kv = o.heads_kv > 0 ? o.heads_kv : o.heads_q;
  s.seqlen_q = o.seqlen_q;
  s.seqlen_k = o.seqlen_k;
  s.head_dim = o.head_dim;
  s.head_dim_v = o.head_dim_v > 0 ? o.head_dim_v : o.head_dim;
  s.causal = o.causal;
  s.alignment = o.alignment;
  s.window_left = o.window_left;
  s.window_right = o.window_right;
  s.softcap = o.softcap;
  return s;
}

bool workload_bytes(const Shape& s, bool backward, uint64_t* bytes, std::string* error) {
  const auto product = [](std::initializer_list<int64_t> factors, int64_t* out) {
    *out = 1;
    for (int64_t f : factors)
      if (__builtin_mul_overflow(*out, f, out)) return false;
    return true;
  };
  int64_t q = 0, k = 0, v = 0, o = 0, rows = 0;
  bool ok = product({s.batch, s.seqlen_q, s.heads_q, s.head_dim}, &q) &&
            product({s.batch, s.seqlen_k, s.heads_kv, s.head_dim}, &k) &&
            product({s.batch, s.seqlen_k, s.heads_kv, s.head_dim_v}, &v) &&
            product({s.batch, s.seqlen_q, s.heads_q, s.head_dim_v}, &o) &&
            product({s.batch, s.heads_q, s.seqlen_q}, &rows);
  // q, k, v and one o per path; with backward also d_o and one dq, dk, dv per path; two fp32 LSEs.
  int64_t elems = 0, total = 0, lse = 0;
  for (int64_t part : {q, k, v, o, o}) ok = ok && !__builtin_add_overflow(elems, part, &elems);
  if (backward)
    for (int64_t part : {o, q, q, k, k, v, v}) ok = ok && !__builtin_add_overflow(elems, part, &elems);
  ok = ok && product({elems, static_cast<int64_t>(s.dtype == flashattn::DType::kFloat32 ? 4 : 2)}, &total) &&
       product({rows, 8}, &lse) && !__builtin_add_overflow(total, lse, &total);
  if (!ok) {
    *error = "the problem's tensor sizes overflow int64";
    return false;
  }
  *bytes = static_cast<uint64_t>(total);
  const uint64_t ram = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (ram > 0 && *bytes > ram) {
    *error = "inputs and outputs need " + format_bytes(static_cast<double>(*bytes)) + ", the machine has " +
             format_bytes(static_cast<double>(ram));
    return false;
  }
  return true;
}

PassResult time_pass(Workload& w, Direction dir, Path path, flashattn::Backend backend, const Options& o,
                     double flops, uint64_t max_workspace_bytes, std::string* fatal) {
  PassResult r;
  flashattn::Launch launch;
  launch.backend = backend;
  launch.num_threads = o.threads;
  const bool fwd = dir == Direction::kForward;
  const flashattn::ForwardParams fp = fwd ? w.forward_params(path) : flashattn::ForwardParams{};
  const flashattn::BackwardParams bp = fwd ? flashattn::BackwardParams{} : w.backward_params(path);

  size_t bytes = 0;
  const flashattn::Status sized = fwd ? flashattn::forward_workspace_size(fp, launch, &bytes)
                                      : flashattn::backward_workspace_size(bp, launch, &bytes);
  if (!sized) {
    r.skipped = std::string(flashattn::to_string(backend)) + " does not take this problem: " + sized.message;
    return r;
  }
  r.extra_known = true;
  r.extra_bytes = bytes;
  if (bytes > max_workspace_bytes) {
    r.skipped = "workspace " + format_bytes(static_cast<double>(bytes)) + " above --max-standard-bytes " +
                format_bytes(static_cast<double>(max_workspace_bytes));
    return r;
  }
  std::unique_ptr<void, FreeDeleter> ws;
  if (bytes > 0) {
    ws.reset(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    if (!ws) {
      r.skipped = "cannot allocate " + format_bytes(static_cast<double>(bytes)) + " of workspace";
      return r;
    }
  }
  launch.workspace = ws.get();
  launch.workspace_bytes = bytes;
  const bool ok = measure([&] {
    const flashattn::Status st = fwd ? flashattn::forward(fp, launch) : flashattn::backward(bp, launch);
    if (!st) *fatal = std::string(flashattn::to_string(backend)) + (fwd ? " forward: " : " backward: ") + st.message;
    return st.ok();
  }, o.repeats, o.max_seconds, &r.timing);
  if (!ok) return r;
  r.ran = true;
  r.gflops = gflops(flops, r.timing.median_ms);
  return r;
}

std::string format_bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", bytes, kUnits[u]);
  return buf;
}

}  // namespace fa_bench
