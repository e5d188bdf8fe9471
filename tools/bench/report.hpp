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

// Process peak resident set size (getrusage), in bytes.
int64_t peak_rss_bytes();

// "fp32, batch 1, heads 8/8 (q/kv), Sq 4096, Sk 4096, d 128, causal bottom-right"; lengths left
// out when seqlen_q is 0.
std::string describe_problem(const Shape& s);

}  // namespace fa_bench
