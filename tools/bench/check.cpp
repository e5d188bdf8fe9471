#include "check.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <vector>

#include "core/problem.hpp"
#include "reference/reference.hpp"

namespace fa_bench {
namespace {

namespace d = flashattn::detail;

// |got - want| with NaN (where want is not NaN) as +inf and equal infinities as 0.
double abs_err(double got, double want) {
  if (std::isnan(want)) return std::isnan(got) ? 0.0 : std::numeric_limits<double>::infinity();
  if (got == want) return 0.0;
  const double e = std::fabs(got - want);
  return std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
}

}  // namespace

ForwardError check_forward_rows(const flashattn::ForwardParams& p, int rows, uint64_t seed) {
  ForwardError err;
  const d::Dims dims = d::resolve_dims(p);
  std::vector<double> o_ref(static_cast<size_t>(dims.head_dim_v));
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  const auto next = [&state](int64_t n) {  // uniform in [0, n), n > 0
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int64_t>((state >> 33) % static_cast<uint64_t>(n));
  };
  for (int r = 0; r < rows; ++r) {
    int64_t b = 0, h = 0, i = 0;
    if (r == 1) {
      b = dims.batch - 1;
      h = dims.heads_q - 1;
      i = d::sequence(p, b).sq - 1;
    } else if (r > 1) {
      b = next(dims.batch);
      h = next(dims.heads_q);
      i = next(std::max<int64_t>(d::sequence(p, b).sq, 1));
    }
    const d::Seq s = d::sequence(p, b);
    if (i < 0 || i >= s.sq) continue;  // an empty varlen sequence has no rows
    double lse_ref = 0.0;
    d::reference_forward_row(p, b, h, i, o_ref.data(), &lse_ref);
    const int64_t at = d::q_offset(p, p.o, s, i, h);
    for (int64_t c = 0; c < dims.head_dim_v; ++c)
      err.o = std::max(err.o, abs_err(d::load_float(p.o.data, p.dtype, at + c), o_ref[static_cast<size_t>(c)]));
    if (p.maybe_lse != nullptr)
      err.lse = std::max(err.lse, abs_err(p.maybe_lse[d::lse_offset(p, p.lse_batch_stride, p.lse_head_stride, s, i, h)], lse_ref));
    ++err.rows;
  }
  return err;
}

Shape reduced_shape(const Shape& full) {
  Shape s = full;
  const int64_t group = full.heads_q / std::max<int64_t>(full.heads_kv, 1);
  s.batch = 1;
  s.heads_kv = std::min<int64_t>(full.heads_kv, 2);
  s.heads_q = s.heads_kv * group;
  const int64_t longest = std::max(full.seqlen_q, full.seqlen_k);
  if (longest > kBackwardCheckLen) {
    s.seqlen_q = std::max<int64_t>(1, full.seqlen_q * kBackwardCheckLen / longest);
    s.seqlen_k = std::max<int64_t>(1, full.seqlen_k * kBackwardCheckLen / longest);
  }
  return s;
}

std::string describe(const Shape& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "batch %lld, heads %lld/%lld, Sq %lld, Sk %lld, d %lld, dv %lld",
                static_cast<long long>(s.batch), static_cast<long long>(s.heads_q), static_cast<long long>(s.heads_kv),
                static_cast<long long>(s.seqlen_q), static_cast<long long>(s.seqlen_k),
                static_cast<long long>(s.head_dim), static_cast<long long>(s.head_dim_v));
  return buf;
}

BackwardUnderTest cpu_flash_backward(int threads) {
  return [threads](Workload& w, std::string* error) {
    flashattn::Launch launch;
    launch.num_threads = threads;
    const flashattn::Status st = flashattn::backward(w.backward_params(Path::kFlash), launch);
    if (!st) *error = "flash backward: " + st.message;
    return st.ok();
  };
}

BackwardError check_backward_reduced(const Shape& full, uint64_t seed, const BackwardUnderTest& flash,
                                     bool with_standard, int threads) {
  BackwardError err;
  Workload w(reduced_shape(full), seed ^ 0xbac4ull, /*backward=*/true);
  const auto run_backward = [&](flashattn::Backend backend, Path path) {
    w.poison_gradients(path);
    flashattn::Launch launch;
    launch.backend = backend;
    launch.num_threads = threads;
    const flashattn::Status st = flashattn::backward(w.backward_params(path), launch);
    if (!st) err.error = std::string(flashattn::to_string(backend)) + " backward: " + st.message;
    return st.ok();
  };
  const auto max_grad_err = [&w](Path path, const Storage& dq, const Storage& dk, const Storage& dv) {
    return std::max({max_abs_diff(w.dq(path), dq), max_abs_diff(w.dk(path), dk), max_abs_diff(w.dv(path), dv)});
  };

  // The reference forward provides o and lse (in the flash slots, which both backwards read).
  flashattn::Launch ref_launch;
  ref_launch.backend = flashattn::Backend::kReference;
  if (const flashattn::Status st = flashattn::forward(w.forward_params(Path::kFlash), ref_launch); !st) {
    err.error = "reference forward: " + st.message;
    return err;
  }
  if (!run_backward(flashattn::Backend::kReference, Path::kFlash)) return err;
  const Storage dq_ref = w.dq(Path::kFlash), dk_ref = w.dk(Path::kFlash), dv_ref = w.dv(Path::kFlash);

  w.poison_gradients(Path::kFlash);
  if (!flash(w, &err.error)) return err;
  err.flash = max_grad_err(Path::kFlash, dq_ref, dk_ref, dv_ref);
  if (with_standard) {
    if (!run_backward(flashattn::Backend::kStandard, Path::kStandard)) return err;
    err.standard = max_grad_err(Path::kStandard, dq_ref, dk_ref, dv_ref);
  }
  err.ok = true;
  return err;
}

}  // namespace fa_bench
