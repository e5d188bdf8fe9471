// The machine's fp32 GEMM rate, measured in the same run: OpenBLAS sgemm with its AVX-512 kernels.
//
// OpenBLAS is loaded at run time (dlopen "libopenblas.so.0"), not linked, because the kernel set
// is chosen once, when the library loads, from OPENBLAS_CORETYPE; this machine's environment says
// Haswell (AVX2). The anchor sets it to SkylakeX on CPUs with AVX-512 (and unsets it elsewhere,
// so OpenBLAS detects the CPU itself) just for the load, then restores the environment.
// FLASHATTN_OPENBLAS_LIB names another library file to load instead (e.g. a self-built OpenBLAS).
#pragma once

#include <cstdint>
#include <string>

namespace fa_bench {

struct GemmResult {
  bool available = false;  // false: OpenBLAS missing (see error); gemm_gflops is then null
  std::string error;
  std::string core;        // openblas_get_corename()
  int threads = 0;         // openblas_get_num_threads() after setting
  int64_t size = 0;        // M = N = K
  double median_ms = 0.0;
  double gflops = 0.0;
  // With two phases (combine_phases): each phase's median rate; gflops is the better of them.
  double gflops_before = 0.0, gflops_after = 0.0;
};

// Median rate of C = A·B for square [size × size] fp32 matrices over up to `repeats` runs after a
// warm-up, with `threads` OpenBLAS threads. Returns after OpenBLAS's workers, which spin for a
// while after a call, have gone idle, so that they cannot slow whatever is timed next.
GemmResult measure_sgemm(int64_t size, int threads, int repeats, double max_seconds);

// The anchor of a run: measured before and after the attention timings, reporting the better
// median. On a shared machine, load from elsewhere only lowers a rate, so the better phase is the
// closer estimate of the machine's rate (and the stricter yardstick for the attention figures);
// the two phases side by side show how steady the machine was.
GemmResult combine_phases(const GemmResult& before, const GemmResult& after);

}  // namespace fa_bench
