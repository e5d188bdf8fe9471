// Wall-clock timing (median after a warm-up) and the FLOP convention of every GFLOP/s figure.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "flashattn/flashattn.hpp"

namespace fa_bench {

struct Timing {
  std::vector<double> ms;  // every timed run, in order
  double median_ms = 0.0;
  double min_ms = 0.0;
};

// Runs fn once untimed (warm-up: first-touch page faults, pool start), then up to `repeats` timed
// runs with std::chrono::steady_clock; runs that would push the total past max_seconds are
// dropped, but at least one timed run always happens. fn returns false to abort (no timing).
bool measure(const std::function<bool()>& fn, int repeats, double max_seconds, Timing* out);

// A Timing of these runs (at least one): median and minimum.
Timing summarize(std::vector<double> ms);

// Exact number of (query, key) pairs inside the causal/window band, summed over the batch and one
// head: what the score-level FLOP count scales with. Masks and biases are not counted (the bench
// builds neither).
int64_t visible_pairs(const flashattn::AttentionParams& p);

// Forward FLOPs: 2·head_dim per visible pair for Q·Kᵀ plus 2·head_dim_v for P·V, times heads_q.
// With head_dim_v = head_dim and no band this is the customary 4·b·h·Sq·Sk·d; with causal the
// exact count is b·h·(Sq·Sk/2 + O(n))·4d, the papers' "halved" figure in the limit.
double forward_flops(const flashattn::AttentionParams& p);

// Backward FLOPs by the usual convention: 2.5 × forward (five GEMMs of the forward's two's size).
double backward_flops(const flashattn::AttentionParams& p);

// The FlashAttention papers' forward count, which their GPU benchmarks (and tools/gpu/bench_sdpa.py)
// report: 2·b·h·Sq·Sk·(head_dim + head_dim_v), halved for causal whatever the lengths and alignment.
// The papers count no sliding window; with one this is forward_flops(p). *papers says which.
double paper_forward_flops(const flashattn::AttentionParams& p, bool* papers = nullptr);

double gflops(double flops, double ms);

}  // namespace fa_bench
