// Online-softmax state of one query row, in the seeds' notation:
//   m  running maximum of the logits seen so far
//   l  running sum of exp(s - m)
//   o  unnormalised output sum_j exp(s_j - m) v_j (held by the caller, rescaled by alpha)
// Two states over disjoint key sets merge exactly (split-KV decode, ring attention):
//   m = max(m1, m2), l = l1 e^(m1-m) + l2 e^(m2-m), o = o1 e^(m1-m) + o2 e^(m2-m).
// A row that has seen no visible key has m = -inf and l = 0; finalize() gives o = 0, lse = -inf.
#pragma once

#include "core/isa_namespace.hpp"

#include <cmath>
#include <limits>

namespace flashattn::detail::FLASHATTN_ISA_NS {

template <class F>
struct SoftmaxState {
  F m = -std::numeric_limits<F>::infinity();
  F l = F(0);

  // exp(x - m) with the convention exp(-inf - -inf) = 0: a fully masked block contributes nothing.
  static F shifted_exp(F x, F m_) { return m_ == -std::numeric_limits<F>::infinity() ? F(0) : std::exp(x - m_); }

  // Takes a block's maximum; returns alpha = exp(m_old - m_new), the factor for l and o.
  F rescale_to(F block_max) {
    // fmax ignores a NaN block max; the NaN still reaches l and o through exp(s - m).
    const F m_new = std::fmax(m, block_max);
    const F alpha = shifted_exp(m, m_new);
    m = m_new;
    l *= alpha;
    return alpha;
  }

  // Merges another state over a disjoint key set; returns {alpha_self, alpha_other} for the o's.
  struct Factors { F self, other; };
  Factors merge(const SoftmaxState& other) {
    const F m_new = std::fmax(m, other.m);
    const Factors f{shifted_exp(m, m_new), shifted_exp(other.m, m_new)};
    l = l * f.self + other.l * f.other;
    m = m_new;
    return f;
  }

  // 1/l for the final division (0 for a row that saw nothing), and the row's log-sum-exp.
  F inv_l() const { return l == F(0) ? F(0) : F(1) / l; }
  F lse() const {
    if (l == F(0) && m == -std::numeric_limits<F>::infinity()) return m;
    return m + std::log(l);
  }
};

}  // namespace flashattn::detail
