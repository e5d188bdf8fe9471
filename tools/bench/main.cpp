// flashattn-bench: standard attention against flash attention on one shape (or a sweep over
// sequence lengths), with error checks against the double reference and the OpenBLAS sgemm rate
// of the same machine, threads and run as the anchor; or, with --device cuda, flash attention on
// the GPU (gpu.hpp). --help documents flags and JSON fields.
#include <algorithm>
#include <cstdio>
#include <new>
#include <random>
#include <string>

#include "check.hpp"
#include "core/thread_pool.hpp"
#include "flags.hpp"
#include "gemm_anchor.hpp"
#include "gpu.hpp"
#include "report.hpp"
#include "runner.hpp"
#include "sweep.hpp"
#include "timing.hpp"
#include "workload.hpp"

namespace fa_bench {
namespace {

int run_single(const Options& o, uint64_t seed) {
  SingleResult r;
  r.shape = shape_of(o);
  r.threads = flashattn::detail::resolve_threads(o.threads);
  r.seed = seed;
  r.backward = o.backward;
  r.gemm_requested = o.run_gemm;

  uint64_t bytes = 0;
  std::string too_big;
  if (!workload_bytes(r.shape, o.backward, &bytes, &too_big)) {
    std::fprintf(stderr, "flashattn-bench: %s\n", too_big.c_str());
    return kExitUsage;
  }
  Workload w(r.shape, seed, o.backward);
  {
    flashattn::Launch launch;
    launch.num_threads = o.threads;
    if (const flashattn::Status st = flashattn::forward_supported(w.forward_params(Path::kFlash), launch); !st) {
      std::fprintf(stderr, "flashattn-bench: the library rejects this problem: %s\n", st.message.c_str());
      return kExitUsage;
    }
  }
  const flashattn::AttentionParams ap = w.attention_params();
  r.visible_pairs = visible_pairs(ap) / std::max<int64_t>(r.shape.batch, 1);
  r.forward_flops = forward_flops(ap);
  r.backward_flops = backward_flops(ap);

  std::string fatal;
  const auto failed = [&fatal] {
    std::fprintf(stderr, "flashattn-bench: run failed: %s\n", fatal.c_str());
    return kExitRunFailed;
  };
  GemmResult gemm_before;
  if (o.run_gemm) {
    std::fprintf(stderr, "[bench] OpenBLAS sgemm anchor, before...\n");
    gemm_before = measure_sgemm(o.gemm_size, r.threads, o.repeats, o.max_seconds);
  }
  const uint64_t no_limit = ~uint64_t{0};
  std::fprintf(stderr, "[bench] flash forward...\n");
  r.flash_fwd = time_pass(w, Direction::kForward, Path::kFlash, flashattn::Backend::kAuto, o, r.forward_flops,
                          no_limit, &fatal);
  if (!fatal.empty()) return failed();
  if (!r.flash_fwd.ran) {
    std::fprintf(stderr, "flashattn-bench: flash forward skipped: %s\n", r.flash_fwd.skipped.c_str());
    return kExitUsage;
  }
  r.flash_fwd_err = check_forward_rows(w.forward_params(Path::kFlash), o.check_rows, seed);
  if (o.run_standard) {
    std::fprintf(stderr, "[bench] standard forward...\n");
    r.standard_fwd = time_pass(w, Direction::kForward, Path::kStandard, flashattn::Backend::kStandard, o,
                               r.forward_flops, o.max_standard_bytes, &fatal);
    if (!fatal.empty()) return failed();
    if (r.standard_fwd.ran) r.standard_fwd_err = check_forward_rows(w.forward_params(Path::kStandard), o.check_rows, seed);
  } else {
    r.standard_fwd.skipped = "--no-standard";
  }

  if (o.backward) {
    // Both backwards read the flash forward's o and lse, so their gradients are comparable.
    std::fprintf(stderr, "[bench] flash backward...\n");
    r.flash_bwd = time_pass(w, Direction::kBackward, Path::kFlash, flashattn::Backend::kAuto, o, r.backward_flops,
                            no_limit, &fatal);
    if (!fatal.empty()) return failed();
    if (o.run_standard) {
      std::fprintf(stderr, "[bench] standard backward...\n");
      r.standard_bwd = time_pass(w, Direction::kBackward, Path::kStandard, flashattn::Backend::kStandard, o,
                                 r.backward_flops, o.max_standard_bytes, &fatal);
      if (!fatal.empty()) return failed();
    } else {
      r.standard_bwd.skipped = "--no-standard";
    }
    if (r.flash_bwd.ran && r.standard_bwd.ran)
      r.bwd_flash_vs_standard = std::max({max_abs_diff(w.dq(Path::kFlash), w.dq(Path::kStandard)),
                                          max_abs_diff(w.dk(Path::kFlash), w.dk(Path::kStandard)),
                                          max_abs_diff(w.dv(Path::kFlash), w.dv(Path::kStandard))});
    std::fprintf(stderr, "[bench] backward check against the reference...\n");
    r.bwd_check_shape = reduced_shape(r.shape);
    r.bwd_err = check_backward_reduced(r.shape, seed, cpu_flash_backward(o.threads), r.standard_bwd.ran, o.threads);
  }

  if (o.run_gemm) {
    std::fprintf(stderr, "[bench] OpenBLAS sgemm anchor, after...\n");
    r.gemm = combine_phases(gemm_before, measure_sgemm(o.gemm_size, r.threads, o.repeats, o.max_seconds));
  }
  r.peak_rss_bytes = peak_rss_bytes();

  if (o.json)
    std::printf("%s\n", to_json(r, o).c_str());
  else
    print_table(r, o);
  return kExitOk;
}

}  // namespace
}  // namespace fa_bench

int main(int argc, char** argv) {
  using namespace fa_bench;
  Options o;
  const ParseResult parsed = parse_options(argc, argv, &o);
  if (parsed.outcome == ParseOutcome::kHelp) {
    std::fputs(help_text().c_str(), stdout);
    return kExitOk;
  }
  if (parsed.outcome == ParseOutcome::kError) {
    std::fprintf(stderr, "flashattn-bench: %s\n", parsed.error.c_str());
    return kExitUsage;
  }
  // Fresh seeds stay below 2^48: short to copy, exact in JSON.
  const uint64_t seed = o.seed_given ? o.seed
                                     : ((uint64_t{std::random_device{}()} << 32) ^ std::random_device{}()) & ((uint64_t{1} << 48) - 1);
  std::fprintf(stderr, "[bench] seed %llu (replay with --seed %llu)\n", static_cast<unsigned long long>(seed),
               static_cast<unsigned long long>(seed));
  try {
#ifdef FLASHATTN_BENCH_CUDA
    if (o.device == Device::kCuda) return run_gpu(o, seed);
#endif
    return o.sweep ? run_sweep(o, seed) : run_single(o, seed);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "flashattn-bench: out of memory\n");
    return kExitRunFailed;
  }
}
