// Command-line options of flashattn-bench: one struct, one parser, one help text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"

namespace fa_bench {

// Exit status of flashattn-bench.
inline constexpr int kExitOk = 0, kExitRunFailed = 1, kExitUsage = 2;

enum class Device { kCpu, kCuda };

// The values of --kernel (GPU backends; "auto" is what the library's kAuto picks for device
// memory). A new GPU backend is one more row.
struct KernelChoice {
  const char* name;
  flashattn::Backend backend;
};
inline constexpr KernelChoice kGpuKernels[] = {
    {"auto", flashattn::Backend::kAuto},
    {"sm80", flashattn::Backend::kCudaSm80},
    {"sm90", flashattn::Backend::kCudaSm90},
};
const char* kernel_name(flashattn::Backend backend);

// True when this flashattn-bench was built with CUDA (--device cuda is available).
bool built_with_cuda();

// With --device cuda and no --repeats: GPU runs are short, so the median takes more of them.
inline constexpr int kGpuDefaultRepeats = 30;

struct Options {
  // Problem shape and options (the default is the headline shape).
  int64_t batch = 1;
  int64_t heads_q = 8;
  int64_t heads_kv = 0;  // 0: same as heads_q
  int64_t seqlen_q = 4096;
  int64_t seqlen_k = 4096;
  int64_t head_dim = 128;
  int64_t head_dim_v = 0;  // 0: same as head_dim
  flashattn::DType dtype = flashattn::DType::kFloat32;  // bf16 with --device cuda unless --dtype is given
  bool causal = false;
  flashattn::Alignment alignment = flashattn::Alignment::kBottomRight;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool backward = false;

  // Where it runs: the CPU, or a CUDA GPU with one of kGpuKernels.
  Device device = Device::kCpu;
  flashattn::Backend kernel = flashattn::Backend::kAuto;

  // How to measure.
  int threads = 0;          // 0: every hardware thread (the GPU mode's host-side checks too)
  int repeats = 5;          // timed runs after one warm-up; the median is reported (GPU: kGpuDefaultRepeats)
  double max_seconds = 20;  // per measurement: fewer repeats when one run is slow (at least one)
  uint64_t seed = 0;
  bool seed_given = false;  // otherwise a fresh seed, printed
  int check_rows = 64;      // rows sampled for the forward check against the double reference
  bool run_standard = true;
  bool run_gemm = true;
  int64_t gemm_size = 2048;  // M = N = K of the OpenBLAS sgemm anchor
  bool json = false;

  // Sweep mode: forward only, standard and flash per n (seqlen_q = seqlen_k = n).
  bool sweep = false;
  std::vector<int64_t> sweep_n;
  uint64_t max_standard_bytes = uint64_t{4} << 30;  // skip standard above this workspace
  std::string out_prefix = "bench-out/sweep";       // writes <prefix>.csv and <prefix>.png
};

enum class ParseOutcome { kRun, kHelp, kError };

struct ParseResult {
  ParseOutcome outcome = ParseOutcome::kRun;
  std::string error;  // for kError: names the flag and what was expected
};

ParseResult parse_options(int argc, char** argv, Options* out);

// The --help text (documents every flag and every --json field).
std::string help_text();

// Default sweep lengths: doubling from 256 to 16384.
std::vector<int64_t> default_sweep();

}  // namespace fa_bench
