#include "sweep.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "check.hpp"
#include "core/thread_pool.hpp"
#include "gemm_anchor.hpp"
#include "json.hpp"
#include "plot.hpp"
#include "report.hpp"
#include "runner.hpp"
#include "timing.hpp"
#include "workload.hpp"

namespace fa_bench {
namespace {

struct Point {
  int64_t n = 0;
  double flops = 0.0;
  PassResult flash, standard;
  ForwardError flash_err, standard_err;
};

constexpr Rgb kFlashColor{214, 39, 40};
constexpr Rgb kStandardColor{31, 119, 180};
constexpr Rgb kGemmColor{120, 120, 120};

// The swept problem without its lengths: "fp32, batch 1, heads 8/8 (q/kv), d 128, Sq = Sk = n".
std::string sweep_problem(Shape s) {
  s.seqlen_q = s.seqlen_k = 0;
  return describe_problem(s) + ", Sq = Sk = n";
}

std::string number_or_empty(bool known, double v) {
  if (!known) return "";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

bool write_csv(const std::string& path, const std::vector<Point>& points, std::string* error) {
  std::ofstream f(path);
  f << "n,flash_ms,flash_gflops,flash_extra_bytes,standard_ms,standard_gflops,standard_extra_bytes,standard_skipped,"
       "max_abs_err,standard_max_abs_err\n";
  for (const Point& p : points) {
    f << p.n << ',' << number_or_empty(p.flash.ran, p.flash.timing.median_ms) << ','
      << number_or_empty(p.flash.ran, p.flash.gflops) << ',' << (p.flash.extra_known ? std::to_string(p.flash.extra_bytes) : "")
      << ',' << number_or_empty(p.standard.ran, p.standard.timing.median_ms) << ','
      << number_or_empty(p.standard.ran, p.standard.gflops) << ','
      << (p.standard.extra_known ? std::to_string(p.standard.extra_bytes) : "") << ',' << (p.standard.ran ? 0 : 1) << ','
      << number_or_empty(p.flash.ran, p.flash_err.o) << ',' << number_or_empty(p.standard.ran, p.standard_err.o) << '\n';
  }
  if (!f) *error = "cannot write " + path;
  return static_cast<bool>(f);
}

bool write_sweep_plot(const std::string& path, const Shape& shape, int threads, const GemmResult& gemm,
                      const std::vector<Point>& points, uint64_t max_standard_bytes, std::string* error) {
  Panel time{"forward time", "sequence length n", "time per forward (ms)", AxisKind::kCount, AxisKind::kMilliseconds, {}};
  Panel memory{"extra memory (workspace)", "sequence length n", "workspace bytes", AxisKind::kCount, AxisKind::kBytes, {}};
  Series t_std{"standard", kStandardColor, false, false, {}}, t_flash{"flash", kFlashColor, false, false, {}};
  Series t_gemm{"at sgemm rate", kGemmColor, true, false, {}};
  Series m_std{"standard", kStandardColor, false, true, {}}, m_flash{"flash", kFlashColor, false, true, {}};
  Series m_skip{"standard, not run", kStandardColor, true, true, {}};
  std::string skipped_n;
  for (const Point& p : points) {
    const double n = static_cast<double>(p.n);
    if (p.flash.ran) t_flash.points.push_back({n, p.flash.timing.median_ms});
    if (p.standard.ran) t_std.points.push_back({n, p.standard.timing.median_ms});
    if (gemm.available && gemm.gflops > 0) t_gemm.points.push_back({n, p.flops / (gemm.gflops * 1e6)});
    if (p.flash.extra_known) m_flash.points.push_back({n, static_cast<double>(p.flash.extra_bytes)});
    if (p.standard.ran) {
      m_std.points.push_back({n, static_cast<double>(p.standard.extra_bytes)});
      m_skip.points.assign(1, m_std.points.back());  // the dashed part starts at the last run
    } else if (p.standard.extra_known) {
      m_skip.points.push_back({n, static_cast<double>(p.standard.extra_bytes)});
      skipped_n += (skipped_n.empty() ? "" : ", ") + std::to_string(p.n);
    }
  }
  time.series = {t_std, t_flash};
  if (!t_gemm.points.empty()) time.series.push_back(t_gemm);
  if (!skipped_n.empty()) m_std.label_last = false;  // the dashed continuation carries the label
  memory.series = {m_std, m_flash};
  if (!skipped_n.empty()) memory.series.push_back(m_skip);

  const std::string title = "flashattn-bench sweep: " + sweep_problem(shape) + ", " + std::to_string(threads) + " threads";
  std::vector<std::string> notes;
  if (!skipped_n.empty())
    notes.push_back("standard not run at n = " + skipped_n + " (workspace above " +
                    format_bytes(static_cast<double>(max_standard_bytes)) + "); dashed: the workspace it asks for");
  if (gemm.available) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "grey dashed: the same FLOPs at the OpenBLAS sgemm rate, %.0f GFLOP/s (%s)",
                  gemm.gflops, gemm.core.c_str());
    notes.push_back(buf);
  }
  return write_plot(path, title, notes, {time, memory}, error);
}

}  // namespace

int run_sweep(const Options& o, uint64_t seed) {
  const int threads = flashattn::detail::resolve_threads(o.threads);
  std::vector<Point> points;
  Shape shape = shape_of(o);
  GemmResult gemm_before;
  if (o.run_gemm) {
    std::fprintf(stderr, "[sweep] OpenBLAS sgemm anchor, before...\n");
    gemm_before = measure_sgemm(o.gemm_size, threads, o.repeats, o.max_seconds);
  }
  for (size_t k = 0; k < o.sweep_n.size(); ++k) {
    Point p;
    p.n = o.sweep_n[k];
    shape.seqlen_q = shape.seqlen_k = p.n;
    std::fprintf(stderr, "[sweep %zu/%zu] n = %lld: ", k + 1, o.sweep_n.size(), static_cast<long long>(p.n));
    std::fflush(stderr);
    uint64_t bytes = 0;
    std::string too_big;
    if (!workload_bytes(shape, /*backward=*/false, &bytes, &too_big)) {
      std::fprintf(stderr, "\nflashattn-bench: n = %lld: %s\n", static_cast<long long>(p.n), too_big.c_str());
      return 2;
    }
    Workload w(shape, seed + static_cast<uint64_t>(p.n), /*backward=*/false);
    p.flops = forward_flops(w.attention_params());
    std::string fatal;
    p.flash = time_pass(w, Direction::kForward, Path::kFlash, flashattn::Backend::kAuto, o, p.flops,
                        ~uint64_t{0}, &fatal);
    if (!fatal.empty() || !p.flash.ran) {
      std::fprintf(stderr, "\nflashattn-bench: flash forward at n = %lld: %s\n", static_cast<long long>(p.n),
                   fatal.empty() ? p.flash.skipped.c_str() : fatal.c_str());
      return fatal.empty() ? 2 : 1;
    }
    p.flash_err = check_forward_rows(w.forward_params(Path::kFlash), o.check_rows, seed);
    std::fprintf(stderr, "flash %.2f ms (%.1f GFLOP/s, %s)", p.flash.timing.median_ms, p.flash.gflops,
                 format_bytes(static_cast<double>(p.flash.extra_bytes)).c_str());
    std::fflush(stderr);
    if (o.run_standard) {
      p.standard = time_pass(w, Direction::kForward, Path::kStandard, flashattn::Backend::kStandard, o, p.flops,
                             o.max_standard_bytes, &fatal);
      if (!fatal.empty()) {
        std::fprintf(stderr, "\nflashattn-bench: run failed: %s\n", fatal.c_str());
        return 1;
      }
      if (p.standard.ran) {
        p.standard_err = check_forward_rows(w.forward_params(Path::kStandard), o.check_rows, seed);
        std::fprintf(stderr, ", standard %.2f ms (%.1f GFLOP/s, %s)", p.standard.timing.median_ms, p.standard.gflops,
                     format_bytes(static_cast<double>(p.standard.extra_bytes)).c_str());
      } else {
        std::fprintf(stderr, ", standard skipped (%s)", p.standard.skipped.c_str());
      }
    } else {
      p.standard.skipped = "--no-standard";
    }
    std::fprintf(stderr, "\n");
    points.push_back(p);
  }

  GemmResult gemm;
  if (o.run_gemm) {
    std::fprintf(stderr, "[sweep] OpenBLAS sgemm anchor, after...\n");
    gemm = combine_phases(gemm_before, measure_sgemm(o.gemm_size, threads, o.repeats, o.max_seconds));
  }

  const std::string csv = o.out_prefix + ".csv", png = o.out_prefix + ".png";
  std::error_code ec;
  if (const auto dir = std::filesystem::path(o.out_prefix).parent_path(); !dir.empty())
    std::filesystem::create_directories(dir, ec);
  std::string error;
  if (!write_csv(csv, points, &error) ||
      !write_sweep_plot(png, shape, threads, gemm, points, o.max_standard_bytes, &error)) {
    std::fprintf(stderr, "flashattn-bench: %s\n", error.c_str());
    return 1;
  }
  std::fprintf(stderr, "[sweep] wrote %s and %s\n", csv.c_str(), png.c_str());

  if (o.json) {
    std::string list;
    for (const Point& p : points) {
      JsonObject j;
      j.integer("n", p.n);
      j.number("flash_ms", p.flash.timing.median_ms).number("flash_gflops", p.flash.gflops);
      j.integer("flash_extra_bytes", static_cast<int64_t>(p.flash.extra_bytes));
      const double nan = std::numeric_limits<double>::quiet_NaN();
      j.number("standard_ms", p.standard.ran ? p.standard.timing.median_ms : nan);
      j.number("standard_gflops", p.standard.ran ? p.standard.gflops : nan);
      if (p.standard.extra_known) j.integer("standard_extra_bytes", static_cast<int64_t>(p.standard.extra_bytes));
      else j.null("standard_extra_bytes");
      j.boolean("standard_skipped", !p.standard.ran);
      j.number("max_abs_err", p.flash_err.o).number("standard_max_abs_err", p.standard.ran ? p.standard_err.o : nan);
      list += (list.empty() ? "" : ", ") + j.str();
    }
    JsonObject top;
    top.string("mode", "sweep").string("problem", sweep_problem(shape)).integer("threads", threads);
    top.integer("seed", static_cast<int64_t>(seed));
    const double nan = std::numeric_limits<double>::quiet_NaN();
    top.number("gemm_gflops", gemm.available ? gemm.gflops : nan);
    top.number("gemm_gflops_before", gemm.available ? gemm.gflops_before : nan);
    top.number("gemm_gflops_after", gemm.available ? gemm.gflops_after : nan);
    if (gemm.available) top.string("openblas_core", gemm.core);
    else top.null("openblas_core");
    top.string("csv", csv).string("png", png).raw("points", "[" + list + "]");
    std::printf("%s\n", top.str().c_str());
  } else {
    std::printf("%8s %12s %10s %12s %12s %10s %12s %10s\n", "n", "flash_ms", "GFLOP/s", "flash_extra", "standard_ms",
                "GFLOP/s", "std_extra", "max_err");
    for (const Point& p : points) {
      std::printf("%8lld %12.2f %10.1f %12s ", static_cast<long long>(p.n), p.flash.timing.median_ms, p.flash.gflops,
                  format_bytes(static_cast<double>(p.flash.extra_bytes)).c_str());
      if (p.standard.ran)
        std::printf("%12.2f %10.1f %12s", p.standard.timing.median_ms, p.standard.gflops,
                    format_bytes(static_cast<double>(p.standard.extra_bytes)).c_str());
      else
        std::printf("%12s %10s %12s", "skipped", "-",
                    p.standard.extra_known ? format_bytes(static_cast<double>(p.standard.extra_bytes)).c_str() : "-");
      std::printf(" %10.3g\n", p.flash_err.o);
    }
    if (gemm.available)
      std::printf("gemm anchor: OpenBLAS sgemm %lld^3, core %s, %d threads: %.1f GFLOP/s\n",
                  static_cast<long long>(gemm.size), gemm.core.c_str(), gemm.threads, gemm.gflops);
    else if (o.run_gemm)
      std::printf("gemm anchor: unavailable: %s\n", gemm.error.c_str());
  }
  return 0;
}

}  // namespace fa_bench
