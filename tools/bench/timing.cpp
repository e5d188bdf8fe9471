#include "timing.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/problem.hpp"

namespace fa_bench {

bool measure(const std::function<bool()>& fn, int repeats, double max_seconds, Timing* out) {
  using Clock = std::chrono::steady_clock;
  const auto elapsed_ms = [](Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  *out = {};
  const auto w0 = Clock::now();
  if (!fn()) return false;
  const double warm_ms = elapsed_ms(w0);
  double total_ms = 0.0;
  for (int r = 0; r < repeats; ++r) {
    // The warm-up (or the slowest run so far) predicts the next run's length.
    const double predicted = std::max(warm_ms, out->ms.empty() ? 0.0 : *std::max_element(out->ms.begin(), out->ms.end()));
    if (r > 0 && total_ms + predicted > max_seconds * 1e3) break;
    const auto t0 = Clock::now();
    if (!fn()) return false;
    out->ms.push_back(elapsed_ms(t0));
    total_ms += out->ms.back();
  }
  *out = summarize(std::move(out->ms));
  return true;
}

Timing summarize(std::vector<double> ms) {
  Timing t;
  t.ms = std::move(ms);
  std::vector<double> sorted = t.ms;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  if (n == 0) return t;
  t.median_ms = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  t.min_ms = sorted.front();
  return t;
}

int64_t visible_pairs(const flashattn::AttentionParams& p) {
  namespace d = flashattn::detail;
  int64_t pairs = 0;
  const int64_t sequences = p.maybe_cu_seqlens_q ? p.batch : std::min<int64_t>(p.batch, 1);
  for (int64_t b = 0; b < sequences; ++b) {
    const d::Seq s = d::sequence(p, b);
    for (int64_t i = 0; i < s.sq; ++i) {
      const d::KeyRange r = d::visible_keys(p, s, i);
      pairs += r.hi - r.lo;
    }
  }
  // Without varlen every sequence has the same geometry: count one, multiply.
  return p.maybe_cu_seqlens_q ? pairs : pairs * p.batch;
}

double forward_flops(const flashattn::AttentionParams& p) {
  const int64_t dv = p.head_dim_v > 0 ? p.head_dim_v : p.head_dim;
  return 2.0 * static_cast<double>(p.head_dim + dv) * static_cast<double>(p.heads_q) *
         static_cast<double>(visible_pairs(p));
}

double backward_flops(const flashattn::AttentionParams& p) { return 2.5 * forward_flops(p); }

double paper_forward_flops(const flashattn::AttentionParams& p, bool* papers) {
  const bool window = p.window_left >= 0 || p.window_right >= 0;
  if (papers != nullptr) *papers = !window;
  if (window) return forward_flops(p);
  const int64_t dv = p.head_dim_v > 0 ? p.head_dim_v : p.head_dim;
  const double full = 2.0 * static_cast<double>(p.batch) * static_cast<double>(p.heads_q) *
                      static_cast<double>(p.seqlen_q) * static_cast<double>(p.seqlen_k) *
                      static_cast<double>(p.head_dim + dv);
  return p.causal ? 0.5 * full : full;
}

double gflops(double flops, double ms) { return ms > 0.0 ? flops / (ms * 1e6) : 0.0; }

}  // namespace fa_bench
