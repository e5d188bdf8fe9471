#include "report.hpp"

#include <sys/resource.h>

#include <cstdio>
#include <limits>

#include "json.hpp"

namespace fa_bench {
namespace {

const char* alignment_name(flashattn::Alignment a) {
  return a == flashattn::Alignment::kBottomRight ? "bottom-right" : "top-left";
}

void print_pass(const char* name, const PassResult& p, double err, bool err_known) {
  if (!p.ran) {
    std::printf("  %-16s skipped: %s\n", name, p.skipped.c_str());
    return;
  }
  std::printf("  %-16s %10.2f ms  %8.1f GFLOP/s  extra %10s  ", name, p.timing.median_ms, p.gflops,
              format_bytes(static_cast<double>(p.extra_bytes)).c_str());
  if (err_known)
    std::printf("max err %.3g\n", err);
  else
    std::printf("\n");
}

void add_pass(JsonObject* j, const std::string& prefix, const PassResult& p) {
  if (p.ran) {
    j->number(prefix + "_ms", p.timing.median_ms).number(prefix + "_min_ms", p.timing.min_ms);
    j->number(prefix + "_gflops", p.gflops).integer(prefix + "_runs", static_cast<int64_t>(p.timing.ms.size()));
  } else {
    j->null(prefix + "_ms").null(prefix + "_min_ms").null(prefix + "_gflops").integer(prefix + "_runs", 0);
  }
  if (p.extra_known)
    j->integer(prefix + "_extra_bytes", static_cast<int64_t>(p.extra_bytes));
  else
    j->null(prefix + "_extra_bytes");
  j->boolean(prefix + "_skipped", !p.ran);
}

// dtype and every shape/option field, shared by the CPU and GPU objects.
void add_shape(JsonObject* j, const Shape& s) {
  j->string("dtype", flashattn::to_string(s.dtype));
  j->integer("batch", s.batch).integer("heads_q", s.heads_q).integer("heads_kv", s.heads_kv);
  j->integer("seqlen_q", s.seqlen_q).integer("seqlen_k", s.seqlen_k);
  j->integer("head_dim", s.head_dim).integer("head_dim_v", s.head_dim_v);
  j->boolean("causal", s.causal).string("alignment", alignment_name(s.alignment));
  j->integer("window_left", s.window_left).integer("window_right", s.window_right).number("softcap", s.softcap);
}

double ratio(const PassResult& a, double b) {
  return a.ran && b > 0 ? a.gflops / b : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;  // Linux reports KiB
}

std::string describe_problem(const Shape& s) {
  std::string d = std::string(flashattn::to_string(s.dtype)) + ", batch " + std::to_string(s.batch) + ", heads " +
                  std::to_string(s.heads_q) + "/" + std::to_string(s.heads_kv) + " (q/kv), ";
  if (s.seqlen_q > 0) d += "Sq " + std::to_string(s.seqlen_q) + ", Sk " + std::to_string(s.seqlen_k) + ", ";
  d += "d " + std::to_string(s.head_dim);
  if (s.head_dim_v != s.head_dim) d += ", dv " + std::to_string(s.head_dim_v);
  if (s.causal) d += std::string(", causal ") + alignment_name(s.alignment);
  if (s.window_left >= 0 || s.window_right >= 0)
    d += ", window (" + std::to_string(s.window_left) + "," + std::to_string(s.window_right) + ")";
  if (s.softcap > 0) {
    char buf[32];
    std::snprintf(buf, sizeof buf, ", softcap %g", static_cast<double>(s.softcap));
    d += buf;
  }
  return d;
}

void print_table(const SingleResult& r, const Options& o) {
  std::printf("flashattn-bench: %s\n", describe_problem(r.shape).c_str());
  std::printf("  threads %d, median of up to %d runs after a warm-up, seed %llu\n", r.threads, o.repeats,
              static_cast<unsigned long long>(r.seed));
  std::printf("forward (%.1f GFLOP, %lld visible pairs per head):\n", r.forward_flops * 1e-9,
              static_cast<long long>(r.visible_pairs));
  print_pass("flash", r.flash_fwd, r.flash_fwd_err.o, r.flash_fwd.ran);
  print_pass("standard", r.standard_fwd, r.standard_fwd_err.o, r.standard_fwd.ran);
  std::printf("  (max err: |O - O_ref| over %d sampled rows vs the double reference; flash LSE err %.3g)\n",
              r.flash_fwd_err.rows, r.flash_fwd_err.lse);
  if (r.backward) {
    std::printf("backward (%.1f GFLOP = 2.5 x forward; dq, dk, dv are outputs, not extra):\n", r.backward_flops * 1e-9);
    print_pass("flash", r.flash_bwd, r.bwd_err.flash, r.bwd_err.ok);
    print_pass("standard", r.standard_bwd, r.bwd_err.standard, r.bwd_err.ok && r.standard_bwd.ran);
    if (r.bwd_err.ok)
      std::printf("  (max err: dq, dk, dv vs the double reference backward at %s)\n", describe(r.bwd_check_shape).c_str());
    else
      std::printf("  backward check failed: %s\n", r.bwd_err.error.c_str());
    if (r.bwd_flash_vs_standard >= 0)
      std::printf("  flash vs standard gradients at full size: max |diff| %.3g\n", r.bwd_flash_vs_standard);
  }
  if (!r.gemm_requested) {
    std::printf("gemm anchor: skipped (--no-gemm)\n");
  } else if (!r.gemm.available) {
    std::printf("gemm anchor: unavailable: %s\n", r.gemm.error.c_str());
  } else {
    std::printf("gemm anchor: OpenBLAS sgemm %lld^3, core %s, %d threads: %.2f ms, %.1f GFLOP/s "
                "(better of before %.1f / after %.1f)\n",
                static_cast<long long>(r.gemm.size), r.gemm.core.c_str(), r.gemm.threads, r.gemm.median_ms,
                r.gemm.gflops, r.gemm.gflops_before, r.gemm.gflops_after);
    if (r.flash_fwd.ran) std::printf("  flash forward = %.2f x gemm", r.flash_fwd.gflops / r.gemm.gflops);
    if (r.flash_bwd.ran) std::printf(", flash backward = %.2f x gemm", r.flash_bwd.gflops / r.gemm.gflops);
    std::printf("\n");
  }
  if (r.flash_fwd.ran && r.standard_fwd.ran)
    std::printf("flash forward = %.2f x standard\n", r.flash_fwd.gflops / r.standard_fwd.gflops);
  std::printf("peak RSS %s\n", format_bytes(static_cast<double>(r.peak_rss_bytes)).c_str());
}

std::string to_json(const SingleResult& r, const Options& o) {
  const Shape& s = r.shape;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  JsonObject j;
  j.string("mode", "single").string("device", "cpu");
  add_shape(&j, s);
  j.integer("threads", r.threads).integer("repeats", o.repeats).integer("seed", static_cast<int64_t>(r.seed));
  j.integer("visible_pairs", r.visible_pairs).number("forward_gflop", r.forward_flops * 1e-9);

  add_pass(&j, "flash", r.flash_fwd);
  j.number("max_abs_err", r.flash_fwd.ran ? r.flash_fwd_err.o : nan);
  j.number("lse_max_abs_err", r.flash_fwd.ran ? r.flash_fwd_err.lse : nan);
  j.integer("checked_rows", r.flash_fwd_err.rows);
  add_pass(&j, "standard", r.standard_fwd);
  j.number("standard_max_abs_err", r.standard_fwd.ran ? r.standard_fwd_err.o : nan);
  if (!r.standard_fwd.ran) j.string("standard_skipped_reason", r.standard_fwd.skipped);

  const bool gemm = r.gemm_requested && r.gemm.available;
  j.number("gemm_gflops", gemm ? r.gemm.gflops : nan).number("gemm_ms", gemm ? r.gemm.median_ms : nan);
  j.number("gemm_gflops_before", gemm ? r.gemm.gflops_before : nan);
  j.number("gemm_gflops_after", gemm ? r.gemm.gflops_after : nan);
  j.integer("gemm_size", r.gemm.size);
  if (gemm) j.string("openblas_core", r.gemm.core).integer("openblas_threads", r.gemm.threads);
  else j.null("openblas_core").null("openblas_threads");
  if (r.gemm_requested && !r.gemm.available) j.string("gemm_error", r.gemm.error);
  j.number("flash_vs_gemm", gemm ? ratio(r.flash_fwd, r.gemm.gflops) : nan);
  j.number("flash_vs_standard", r.standard_fwd.ran ? ratio(r.flash_fwd, r.standard_fwd.gflops) : nan);

  j.boolean("backward", r.backward);
  if (r.backward) {
    j.number("backward_gflop", r.backward_flops * 1e-9);
    add_pass(&j, "flash_bwd", r.flash_bwd);
    add_pass(&j, "standard_bwd", r.standard_bwd);
    j.number("bwd_max_abs_err", r.bwd_err.ok ? r.bwd_err.flash : nan);
    j.number("standard_bwd_max_abs_err", r.bwd_err.ok && r.standard_bwd.ran ? r.bwd_err.standard : nan);
    if (!r.bwd_err.ok) j.string("bwd_check_error", r.bwd_err.error);
    j.string("bwd_check_shape", describe(r.bwd_check_shape));
    j.number("bwd_flash_vs_standard_max_abs_diff", r.bwd_flash_vs_standard >= 0 ? r.bwd_flash_vs_standard : nan);
    j.number("flash_bwd_vs_gemm", gemm ? ratio(r.flash_bwd, r.gemm.gflops) : nan);
    if (!r.standard_bwd.ran) j.string("standard_bwd_skipped_reason", r.standard_bwd.skipped);
  }
  j.integer("peak_rss_bytes", r.peak_rss_bytes);
  return j.str();
}


double tflops(const PassResult& p) { return p.ran ? p.gflops * 1e-3 : 0.0; }

namespace {

void print_gpu_pass(const char* name, const PassResult& p, double err, bool err_known) {
  if (!p.ran) {
    std::printf("  %-8s skipped: %s\n", name, p.skipped.c_str());
    return;
  }
  std::printf("  %-8s %10.3f ms  %7.1f TFLOP/s  (min %.3f ms, %zu runs)  workspace %s", name, p.timing.median_ms,
              tflops(p), p.timing.min_ms, p.timing.ms.size(), format_bytes(static_cast<double>(p.extra_bytes)).c_str());
  if (err_known)
    std::printf("  max err %.3g\n", err);
  else
    std::printf("\n");
}

void add_gpu_pass(JsonObject* j, const std::string& prefix, const PassResult& p) {
  add_pass(j, prefix, p);
  j->number(prefix + "_tflops", p.ran ? tflops(p) : std::numeric_limits<double>::quiet_NaN());
  if (!p.ran) j->string(prefix + "_skipped_reason", p.skipped);
}

}  // namespace

void print_gpu_table(const GpuResult& r, const Options& o) {
  std::printf("flashattn-bench: %s\n", describe_problem(r.shape).c_str());
  std::printf("  GPU %d: %s (sm_%d%d, %d SMs, L2 %s), kernel %s\n", r.gpu.index, r.gpu.name.c_str(), r.gpu.cc_major,
              r.gpu.cc_minor, r.gpu.sm_count, format_bytes(static_cast<double>(r.gpu.l2_bytes)).c_str(),
              kernel_name(r.kernel));
  std::printf("  CUDA events, median of up to %d runs after a warm-up; inputs and outputs rotated over %d copies "
              "(%s); seed %llu\n",
              o.repeats, r.copies, format_bytes(static_cast<double>(r.rotation_bytes)).c_str(),
              static_cast<unsigned long long>(r.seed));
  std::printf("forward (%.3g GFLOP, %s):\n", r.forward_flops * 1e-9,
              r.papers_flops ? "the papers' count" : "visible pairs of the window");
  print_gpu_pass("flash", r.flash_fwd, r.flash_fwd_err.o, r.flash_fwd.ran);
  std::printf("  (max err: |O - O_ref| over %d sampled rows vs the double reference; LSE err %.3g)\n",
              r.flash_fwd_err.rows, r.flash_fwd_err.lse);
  if (r.backward) {
    std::printf("backward (%.3g GFLOP = 2.5 x forward):\n", r.backward_flops * 1e-9);
    print_gpu_pass("flash", r.flash_bwd, r.bwd_err.flash, r.bwd_err.ok);
    if (r.bwd_err.ok)
      std::printf("  (max err: dq, dk, dv vs the double reference backward at %s)\n", describe(r.bwd_check_shape).c_str());
    else if (r.flash_bwd.ran)
      std::printf("  backward check failed: %s\n", r.bwd_err.error.c_str());
    if (r.bwd_nonfinite >= 0)
      std::printf("  full size: %lld non-finite elements in dq, dk, dv\n", static_cast<long long>(r.bwd_nonfinite));
  }
  std::printf("peak RSS (host) %s\n", format_bytes(static_cast<double>(r.peak_rss_bytes)).c_str());
}

std::string gpu_to_json(const GpuResult& r, const Options& o) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  JsonObject j;
  j.string("mode", "single").string("device", "cuda").string("device_name", r.gpu.name);
  j.string("compute_capability", std::to_string(r.gpu.cc_major) + "." + std::to_string(r.gpu.cc_minor));
  j.integer("sm_count", r.gpu.sm_count).integer("l2_bytes", r.gpu.l2_bytes).string("kernel", kernel_name(r.kernel));
  add_shape(&j, r.shape);
  j.integer("repeats", o.repeats).integer("seed", static_cast<int64_t>(r.seed));
  j.integer("visible_pairs", r.visible_pairs).string("flops_convention", r.papers_flops ? "papers" : "visible pairs");
  j.number("forward_gflop", r.forward_flops * 1e-9);
  j.integer("copies", r.copies).integer("rotation_bytes", static_cast<int64_t>(r.rotation_bytes));
  add_gpu_pass(&j, "flash", r.flash_fwd);
  j.number("max_abs_err", r.flash_fwd.ran ? r.flash_fwd_err.o : nan);
  j.number("lse_max_abs_err", r.flash_fwd.ran ? r.flash_fwd_err.lse : nan);
  j.integer("checked_rows", r.flash_fwd_err.rows);
  j.boolean("backward", r.backward);
  if (r.backward) {
    j.number("backward_gflop", r.backward_flops * 1e-9);
    add_gpu_pass(&j, "flash_bwd", r.flash_bwd);
    j.number("bwd_max_abs_err", r.bwd_err.ok ? r.bwd_err.flash : nan);
    j.string("bwd_check_shape", describe(r.bwd_check_shape));
    if (!r.bwd_err.ok) j.string("bwd_check_error", r.bwd_err.error);
    if (r.bwd_nonfinite >= 0) j.integer("bwd_nonfinite", r.bwd_nonfinite);
    else j.null("bwd_nonfinite");
  }
  j.integer("peak_rss_bytes", r.peak_rss_bytes);
  return j.str();
}

}  // namespace fa_bench
