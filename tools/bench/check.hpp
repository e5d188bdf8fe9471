// Correctness checks run next to the timings: both paths against the double-precision reference.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "flashattn/flashattn.hpp"
#include "workload.hpp"

namespace fa_bench {

struct ForwardError {
  double o = 0.0;    // max |O - O_ref| over the sampled rows
  double lse = 0.0;  // max |LSE - LSE_ref| over the sampled rows (equal infinities agree)
  int rows = 0;
};

// Samples `rows` query rows (always the first row of (batch 0, head 0) and the last row of the
// last batch and head, the rest uniformly from the seed) and compares p.o / p.maybe_lse with
// reference_forward_row on the same inputs. NaN where a finite value was expected counts as +inf.
ForwardError check_forward_rows(const flashattn::ForwardParams& p, int rows, uint64_t seed);

// The shape the backward check runs at: the options and GQA ratio of `full`, batch 1, at most
// two kv heads, seqlen_q and seqlen_k scaled down together to at most kBackwardCheckLen.
inline constexpr int64_t kBackwardCheckLen = 384;
Shape reduced_shape(const Shape& full);
std::string describe(const Shape& s);

struct BackwardError {
  bool ok = false;
  std::string error;      // why the check could not run
  double flash = 0.0;     // max |grad - grad_ref| over dq, dk, dv, flash path
  double standard = 0.0;  // the same for the standard path (when with_standard)
};

// The backward under test: writes dq, dk, dv of w's flash slots from w's inputs, o and lse (the
// flash slots); returns false with *error set when it fails.
using BackwardUnderTest = std::function<bool(Workload& w, std::string* error)>;

// Runs the reference forward, then reference, `flash` and (optionally) standard backward on the
// reduced problem and compares every element of dq, dk, dv.
BackwardError check_backward_reduced(const Shape& full, uint64_t seed, const BackwardUnderTest& flash,
                                     bool with_standard, int threads);

// The CPU mode's backward under test: flashattn::backward with kAuto on host memory.
BackwardUnderTest cpu_flash_backward(int threads);

}  // namespace fa_bench
