// What one single-shape run measured, and its two renderings: a table for people, one JSON object
// for scripts (field names documented in --help).
#pragma once

#include <cstdint>
#include <string>

#include "check.hpp"
#include "flags.hpp"
#include "gemm_anchor.hpp"
#include "runner.hpp"

namespace fa_bench {

struct SingleResult {
  Shape shape;
  int threads = 0;
  uint64_t seed = 0;
  int64_t visible_pairs = 0;
  double forward_flops = 0.0, backward_flops = 0.0;

  PassResult flash_fwd, standard_fwd;
  ForwardError flash_fwd_err, standard_fwd_err;

  bool backward = false;
  PassResult flash_bwd, standard_bwd;
  BackwardError bwd_err;             // against the reference, reduced problem
  Shape bwd_check_shape;
  double bwd_flash_vs_standard = -1;  // full size; < 0 when standard backward did not run

  bool gemm_requested = false;
  GemmResult gemm;
  int64_t peak_rss_bytes = 0;
};

void print_table(const SingleResult& r, const Options& o);
std::string to_json(const SingleResult& r, const Options& o);

// The device a GPU run used.
struct GpuInfo {
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  int64_t l2_bytes = 0;
};

// What one --device cuda run measured (FLOPs by the papers' count, paper_forward_flops).
struct GpuResult {
  Shape shape;
  GpuInfo gpu;
  flashattn::Backend kernel = flashattn::Backend::kAuto;
  uint64_t seed = 0;
  int64_t visible_pairs = 0;
  bool papers_flops = true;  // false: a window, counted by visible pairs
  double forward_flops = 0.0, backward_flops = 0.0;
  int copies = 0;             // input/output sets rotated over so that L2 does not serve a timed run
  uint64_t rotation_bytes = 0;

  PassResult flash_fwd;
  ForwardError flash_fwd_err;

  bool backward = false;
  PassResult flash_bwd;
  BackwardError bwd_err;  // against the reference, reduced problem
  Shape bwd_check_shape;
  int64_t bwd_nonfinite = -1;  // NaN/inf elements of dq, dk, dv at full size; < 0 when not run
  int64_t peak_rss_bytes = 0;
};

void print_gpu_table(const GpuResult& r, const Options& o);
std::string gpu_to_json(const GpuResult& r, const Options& o);

// TFLOP/s of a pass (0 when it did not run).
double tflops(const PassResult& p);

// Process peak resident set size (getrusage), in bytes.
int64_t peak_rss_bytes();

// "fp32, batch 1, heads 8/8 (q/kv), Sq 4096, Sk 4096, d 128, causal bottom-right"; lengths left
// out when seqlen_q is 0.
std::string describe_problem(const Shape& s);

}  // namespace fa_bench
