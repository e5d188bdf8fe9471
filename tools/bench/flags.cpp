#include "flags.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string_view>

namespace fa_bench {
namespace {

std::optional<int64_t> to_int(std::string_view s) {
  if (s.empty()) return std::nullopt;
  const std::string str(s);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(str.c_str(), &end, 10);
  if (errno != 0 || end != str.c_str() + str.size()) return std::nullopt;
  return v;
}

std::optional<double> to_double(std::string_view s) {
  if (s.empty()) return std::nullopt;
  const std::string str(s);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(str.c_str(), &end);
  if (errno != 0 || end != str.c_str() + str.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// Splits "a,b,c" (no empty items).
std::vector<std::string_view> split_commas(std::string_view s) {
  std::vector<std::string_view> items;
  size_t start = 0;
  for (;;) {
    const size_t comma = s.find(',', start);
    items.push_back(s.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return items;
}

// "auto|sm80": the --kernel values.
std::string kernel_names() {
  std::string names;
  for (const KernelChoice& k : kGpuKernels) {
    if (!names.empty()) names += '|';
    names += k.name;
  }
  return names;
}

// A flag's help column: padded to where the descriptions start.
std::string help_column(std::string flag) {
  constexpr size_t kWidth = 24;
  flag.resize(std::max(kWidth, flag.size() + 1), ' ');
  return flag;
}

class Parser {
 public:
  Parser(int argc, char** argv) : argc_(argc), argv_(argv) {}

  ParseResult run(Options* o) {
    for (i_ = 1; i_ < argc_; ++i_) {
      std::string_view arg = argv_[i_];
      inline_value_.reset();
      if (const size_t eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
        inline_value_ = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
      }
      flag_ = std::string(arg);
      if (!handle(arg, o)) return {ParseOutcome::kError, error_};
      if (help_) return {ParseOutcome::kHelp, {}};
    }
    if (o->sweep && o->sweep_n.empty()) o->sweep_n = default_sweep();
    if (o->sweep && o->backward) return {ParseOutcome::kError, "--backward: the sweep times the forward only"};
    if (kernel_given_ && o->device != Device::kCuda)
      return {ParseOutcome::kError, "--kernel: chooses a GPU kernel; add --device cuda"};
    if (o->device == Device::kCuda) {
      if (!built_with_cuda())
        return {ParseOutcome::kError, "--device cuda: this flashattn-bench was built without CUDA "
                                      "(configure with nvcc on the PATH, or -DFLASHATTN_CUDA=ON)"};
      if (o->sweep) return {ParseOutcome::kError, "--sweep: the sweep runs on the CPU only; time one shape per call with --device cuda"};
      if (!dtype_given_) o->dtype = flashattn::DType::kBFloat16;
      if (!repeats_given_) o->repeats = kGpuDefaultRepeats;
    }
    return {};
  }

 private:
  bool fail(const std::string& what) {
    error_ = flag_ + ": " + what;
    return false;
  }

  // The flag's value: "--flag=value" or the next argument.
  std::optional<std::string_view> value() {
    if (inline_value_) return inline_value_;
    if (i_ + 1 >= argc_) {
      fail("expects a value");
      return std::nullopt;
    }
    return std::string_view(argv_[++i_]);
  }

  bool no_value() { return inline_value_ ? fail("takes no value") : true; }

  bool integer(int64_t* dst, int64_t min, const char* expected) {
    const auto v = value();
    if (!v) return false;
    const auto n = to_int(*v);
    if (!n || *n < min) return fail(std::string("expected ") + expected + ", got '" + std::string(*v) + "'");
    *dst = *n;
    return true;
  }

  bool integer(int* dst, int64_t min, const char* expected) {
    int64_t n = 0;
    if (!integer(&n, min, expected)) return false;
    if (n > (int64_t{1} << 30)) return fail("value too large");
    *dst = static_cast<int>(n);
    return true;
  }

  bool handle(std::string_view a, Options* o) {
    if (a == "--help" || a == "-h") return (help_ = true), no_value();
    if (a == "--batch") return integer(&o->batch, 1, "a positive integer");
    if (a == "--heads") return integer(&o->heads_q, 1, "a positive integer");
    if (a == "--heads-kv") return integer(&o->heads_kv, 1, "a positive integer");
    if (a == "--seqlen") {
      if (!integer(&o->seqlen_q, 1, "a positive integer")) return false;
      o->seqlen_k = o->seqlen_q;
      return true;
    }
    if (a == "--seqlen-q") return integer(&o->seqlen_q, 1, "a positive integer");
    if (a == "--seqlen-k") return integer(&o->seqlen_k, 1, "a positive integer");
    if (a == "--head-dim") return integer(&o->head_dim, 1, "a positive integer");
    if (a == "--head-dim-v") return integer(&o->head_dim_v, 1, "a positive integer");
    if (a == "--dtype") {
      const auto v = value();
      if (!v) return false;
      if (*v == "fp32") o->dtype = flashattn::DType::kFloat32;
      else if (*v == "fp16") o->dtype = flashattn::DType::kFloat16;
      else if (*v == "bf16") o->dtype = flashattn::DType::kBFloat16;
      else return fail("expected fp32, fp16 or bf16, got '" + std::string(*v) + "'");
      dtype_given_ = true;
      return true;
    }
    if (a == "--causal" || a == "--causal-top-left") {
      o->causal = true;
      o->alignment = a == "--causal" ? flashattn::Alignment::kBottomRight : flashattn::Alignment::kTopLeft;
      return no_value();
    }
    if (a == "--window") return window(o);
    if (a == "--softcap") {
      const auto v = value();
      if (!v) return false;
      const auto x = to_double(*v);
      if (!x || *x < 0) return fail("expected a number >= 0, got '" + std::string(*v) + "'");
      o->softcap = static_cast<float>(*x);
      return true;
    }
    if (a == "--backward") return (o->backward = true), no_value();
    if (a == "--threads") return integer(&o->threads, 0, "an integer >= 0 (0 = every hardware thread)");
    if (a == "--repeats") return (repeats_given_ = true), integer(&o->repeats, 1, "a positive integer");
    if (a == "--max-seconds") {
      const auto v = value();
      if (!v) return false;
      const auto x = to_double(*v);
      if (!x || *x <= 0) return fail("expected a positive number of seconds, got '" + std::string(*v) + "'");
      o->max_seconds = *x;
      return true;
    }
    if (a == "--seed") {
      int64_t s = 0;
      if (!integer(&s, 0, "an integer >= 0")) return false;
      o->seed = static_cast<uint64_t>(s);
      o->seed_given = true;
      return true;
    }
    if (a == "--check-rows") return integer(&o->check_rows, 0, "an integer >= 0");
    if (a == "--no-standard") return (o->run_standard = false), no_value();
    if (a == "--no-gemm") return (o->run_gemm = false), no_value();
    if (a == "--gemm-size") return integer(&o->gemm_size, 1, "a positive integer");
    if (a == "--json") return (o->json = true), no_value();
    if (a == "--device") {
      const auto v = value();
      if (!v) return false;
      if (*v == "cpu") o->device = Device::kCpu;
      else if (*v == "cuda") o->device = Device::kCuda;
      else return fail("expected cpu or cuda, got '" + std::string(*v) + "'");
      return true;
    }
    if (a == "--kernel") {
      const auto v = value();
      if (!v) return false;
      for (const KernelChoice& k : kGpuKernels)
        if (*v == k.name) {
          o->kernel = k.backend;
          kernel_given_ = true;
          return true;
        }
      return fail("expected " + kernel_names() + ", got '" + std::string(*v) + "'");
    }
    if (a == "--sweep") return sweep(o);
    if (a == "--max-standard-bytes") {
      int64_t b = 0;
      if (!integer(&b, 0, "a byte count >= 0")) return false;
      o->max_standard_bytes = static_cast<uint64_t>(b);
      return true;
    }
    if (a == "--out") {
      const auto v = value();
      if (!v) return false;
      if (v->empty()) return fail("expected a path prefix");
      o->out_prefix = std::string(*v);
      return true;
    }
    return fail("unknown flag (see --help)");
  }

  bool window(Options* o) {
    const auto v = value();
    if (!v) return false;
    const auto items = split_commas(*v);
    const auto left = items.size() == 2 ? to_int(items[0]) : std::nullopt;
    const auto right = items.size() == 2 ? to_int(items[1]) : std::nullopt;
    if (!left || !right || *left < -1 || *right < -1)
      return fail("expected L,R with each >= 0 or -1 (unbounded), got '" + std::string(*v) + "'");
    o->window_left = *left;
    o->window_right = *right;
    return true;
  }

  // "--sweep" alone uses the default lengths; "--sweep 512,1024" (or "--sweep=...") lists them.
  bool sweep(Options* o) {
    o->sweep = true;
    std::string_view list;
    if (inline_value_) {
      list = *inline_value_;
    } else if (i_ + 1 < argc_ && argv_[i_ + 1][0] != '-') {
      list = argv_[++i_];
    } else {
      return true;
    }
    o->sweep_n.clear();
    for (std::string_view item : split_commas(list)) {
      const auto n = to_int(item);
      if (!n || *n < 1) return fail("expected a comma-separated list of positive lengths, got '" + std::string(list) + "'");
      o->sweep_n.push_back(*n);
    }
    return true;
  }

  int argc_;
  char** argv_;
  int i_ = 0;
  std::optional<std::string_view> inline_value_;
  std::string flag_;
  std::string error_;
  bool help_ = false;
  bool dtype_given_ = false, repeats_given_ = false, kernel_given_ = false;
};

}  // namespace

ParseResult parse_options(int argc, char** argv, Options* out) { return Parser(argc, argv).run(out); }

const char* kernel_name(flashattn::Backend backend) {
  for (const KernelChoice& k : kGpuKernels)
    if (k.backend == backend) return k.name;
  return flashattn::to_string(backend);
}

bool built_with_cuda() {
#ifdef FLASHATTN_BENCH_CUDA
  return true;
#else
  return false;
#endif
}

std::vector<int64_t> default_sweep() {
  std::vector<int64_t> n;
  for (int64_t x = 256; x <= 16384; x *= 2) n.push_back(x);
  return n;
}

std::string help_text() {
  return R"(flashattn-bench: standard attention against flash attention on the CPU, and flash attention
on a CUDA GPU.

Usage: flashattn-bench [flags]                one shape (default: batch 1, 8 heads, n 4096, d 128, fp32)
       flashattn-bench --sweep [N,...]        forward over sequence lengths, CSV + PNG plot
       flashattn-bench --device cuda [flags]  one shape on the GPU (default dtype bf16)

Shape and options:
  --batch N               batch size (1)
  --heads N               query heads (8)
  --heads-kv N            key/value heads, divides --heads (= --heads; fewer is GQA/MQA)
  --seqlen N              seqlen_q = seqlen_k = N (4096)
  --seqlen-q N, --seqlen-k N
  --head-dim N            q/k head dim (128)
  --head-dim-v N          v/o head dim (= --head-dim)
  --dtype fp32|fp16|bf16  storage type (fp32; bf16 with --device cuda); accumulation is fp32
  --causal                causal, bottom-right aligned (query i sees keys j <= i + Sk - Sq)
  --causal-top-left       causal, top-left aligned (query i sees keys j <= i)
  --window L,R            sliding window: L keys left, R keys right of the diagonal (-1 = unbounded)
  --softcap X             logit softcap (0 = off)
  --backward              also time and check the backward pass

Device:
  --device cpu|cuda       where attention runs (cpu). cuda: the flash forward (and backward with
                          --backward) on the current CUDA device, in a CUDA build; the standard
                          baseline and the sgemm anchor are CPU-only and not run
  )" + help_column("--kernel " + kernel_names()) + R"(with --device cuda: the GPU kernel (auto: what the library picks for
                          device memory)

Measurement:
  --threads N             worker threads for attention and for the GEMM anchor (0 = all hardware threads);
                          with --device cuda, for the host-side reference checks
  --repeats N             timed runs after one warm-up; the median is reported (5; 30 with --device cuda)
  --max-seconds S         per measurement, fewer repeats when runs are slow, never fewer than 1 (20)
  --seed N                input seed (default: fresh, printed)
  --check-rows N          rows sampled for the forward check against the double reference (64)
  --no-standard           skip the standard (S and P materialised) baseline
  --max-standard-bytes B  skip standard where its workspace exceeds B bytes (4294967296)
  --no-gemm               skip the OpenBLAS sgemm anchor
  --gemm-size N           M = N = K of the sgemm anchor (2048)
  --json                  print one JSON object instead of the table

Sweep:
  --sweep [N,...]         forward at seqlen_q = seqlen_k = each N (default 256,512,...,16384);
                          progress on stderr; writes <out>.csv and <out>.png
  --out PREFIX            output path prefix (bench-out/sweep)

What is measured (CPU):
  time      wall clock (std::chrono::steady_clock), median of --repeats runs after a warm-up.
  GFLOP/s   forward FLOPs = 2 * (head_dim + head_dim_v) * batch * heads * P, where P is the exact
            number of visible (query, key) pairs under causal/window (Sq*Sk without them); with
            head_dim_v = head_dim this is the usual 4*b*h*Sq*Sk*d, and for causal P -> Sq*Sk/2,
            the papers' halving. Backward FLOPs = 2.5 * forward FLOPs.
  extra     bytes of workspace the backend asks for (forward_workspace_size/backward_workspace_size);
            all scratch goes through it. Inputs and outputs (o, lse; dq, dk, dv) are not extra.
  error     forward: max |O - O_ref| (and |LSE - LSE_ref|) on --check-rows sampled rows, O_ref from
            the double-precision reference on the same (rounded) inputs. Backward: dq, dk, dv of
            flash and of standard against the double reference backward on a reduced problem (same
            options and GQA ratio, batch 1, at most 2 kv heads, lengths scaled to at most 384; the
            reference's gradients are rounded to the storage dtype, so fp16/bf16 errors include one
            rounding), plus flash against standard at full size.
  gemm      fp32 sgemm rate of OpenBLAS (loaded at run time, AVX-512 SkylakeX kernels where the CPU
            has AVX-512, whatever OPENBLAS_CORETYPE says) with the same thread count, measured
            before and after the attention runs; the better median is gemm_gflops (load from
            elsewhere only lowers a rate). null when libopenblas.so.0 is missing;
            FLASHATTN_OPENBLAS_LIB=path loads another OpenBLAS build.

GPU mode (--device cuda):
  time      CUDA events around each call on one stream, median of --repeats runs. A warm-up runs once
            on every copy of the inputs and outputs: the bench keeps enough copies that at least 3x
            the device's L2 cache streams between two runs on one copy, so no timed run finds its
            inputs in L2 (copies and rotation_bytes say how many and how much).
  TFLOP/s   the FlashAttention papers' count: forward 2 * batch * heads * Sq * Sk * (head_dim +
            head_dim_v) (4 * b * h * Sq * Sk * d when head_dim_v = head_dim), halved for causal;
            backward 2.5 x forward. The papers count no sliding window: with --window, the exact
            visible pairs are counted as on the CPU.
  error     forward: the same sampled-row check against the double reference, on the GPU's outputs
            of one run on poisoned (NaN) outputs. Backward: the GPU backward against the double
            reference backward on the reduced problem (as on the CPU), and bwd_nonfinite, the number
            of NaN/inf elements of dq, dk, dv at full size after one run on poisoned gradients.

JSON fields (--json), one object on stdout (progress goes to stderr); null where not measured:
  shape and options: mode, device, dtype, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, head_dim_v,
    causal, alignment, window_left, window_right, softcap, threads, repeats, seed, visible_pairs,
    forward_gflop (GFLOP counted per run)
  forward, per path P in {flash, standard}: P_ms (median), P_min_ms, P_gflops, P_runs,
    P_extra_bytes (known even when skipped for size), P_skipped (+ standard_skipped_reason);
    max_abs_err and lse_max_abs_err (flash), standard_max_abs_err, checked_rows
  anchor: gemm_gflops, gemm_gflops_before, gemm_gflops_after, gemm_ms, gemm_size, openblas_core,
    openblas_threads (gemm_error when missing), flash_vs_gemm, flash_vs_standard (GFLOP/s ratios)
  backward (with --backward): backward_gflop, the same P_* fields for P in {flash_bwd, standard_bwd},
    bwd_max_abs_err (flash), standard_bwd_max_abs_err, bwd_check_shape,
    bwd_flash_vs_standard_max_abs_diff, flash_bwd_vs_gemm
  peak_rss_bytes (the whole process: inputs, outputs and workspaces)
  With --device cuda: mode, device ("cuda"), device_name, compute_capability, sm_count, l2_bytes,
    kernel, the shape and options above, repeats, seed, visible_pairs, flops_convention ("papers" or
    "visible pairs"), forward_gflop, copies, rotation_bytes; flash_ms (median), flash_min_ms,
    flash_runs, flash_tflops, flash_extra_bytes, flash_skipped, max_abs_err, lse_max_abs_err,
    checked_rows; with --backward: backward_gflop, the same flash_bwd_* fields (flash_bwd_tflops,
    flash_bwd_skipped_reason when the kernel does not take the problem), bwd_max_abs_err,
    bwd_check_shape (bwd_check_error), bwd_nonfinite; peak_rss_bytes (host).
  With --sweep: {mode, problem, threads, seed, gemm_gflops, gemm_gflops_before, gemm_gflops_after,
    openblas_core, csv, png, points: [{n, flash_ms, flash_gflops, flash_extra_bytes, standard_ms,
    standard_gflops, standard_extra_bytes, standard_skipped, max_abs_err, standard_max_abs_err}, ...]}.

Exit status: 0 ok, 1 a run failed, 2 bad flag or a problem the library rejects.
)";
}

}  // namespace fa_bench
