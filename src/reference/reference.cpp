// The reference backend: textbook attention in double precision, one query row at a time.
//
// For query row i of one (sequence, head), with modifiers from core/problem.hpp:
//   x_j = scale · q_i·k_j                        scaled score
//   s_j = mods(x_j)                              softcap → ALiBi → bias → mask (−inf when hidden)
//   m = max_j s_j,  l = Σ_j exp(s_j − m),  P_j = exp(s_j − m) / l
//   O_i = Σ_j P_j v_j,  LSE_i = m + log l
// Backward, with dO_i given:
//   dP_j = dO_i·v_j,  D = Σ_j P_j dP_j,  dS_j = P_j (dP_j − D) · (1 − tanh²(x_j / softcap) if softcap)
//   dQ_i = scale Σ_j dS_j k_j,  dK_j += scale dS_j q_i,  dV_j += P_j dO_i   (summed over the
//   query heads that share a kv head)
// Softmax works row by row, so a row of S (and P) is all the scratch it needs: the result equals
// materialising S for the whole (batch, head). Every sum runs in double, in index order.
//
// The backward recomputes P from q and k in double and does not read the given o and lse: it is
// the exact gradient at the given inputs, free of any forward's rounding. D is Σ_j P_j dP_j, which
// equals rowsum(dO∘O) for the exact O.
//
// Special values, row by row as textbook softmax behaves:
// - A key outside the causal/window band or hidden by the mask contributes nothing, even when its
//   k or v holds NaN/inf. A key whose logit is −inf (e.g. from the bias) gets P = 0 and its v is
//   not read.
// - A row whose logits are all −inf (no visible key): O = 0, LSE = −inf, gradients 0.
// - A NaN logit makes m NaN; a +inf logit gives exp(inf − inf) = NaN. Either way that row's O and
//   LSE are NaN, and in the backward its dQ and the dK, dV of every key with a non-−inf logit in
//   it. Other rows are untouched. NaN/inf in v_j reaches O of every row that sees key j. With a
//   softcap, an infinite score saturates to ±softcap and stays finite.
#include "reference/reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/backends.hpp"
#include "core/dtype.hpp"
#include "core/problem.hpp"

namespace flashattn::detail {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void load_row(const void* base, DType t, int64_t offset, int64_t n, double* out) {
  for (int64_t d = 0; d < n; ++d) out[d] = load_float(base, t, offset + d);
}

void store_row(void* base, DType t, int64_t offset, int64_t n, const double* x) {
  for (int64_t d = 0; d < n; ++d) store_float(base, t, offset + d, static_cast<float>(x[d]));
}

// One (sequence, kv head)'s keys and values in double: k [sk, head_dim], v [sk, head_dim_v].
struct KeysValues {
  std::vector<double> k, v;
};

KeysValues load_keys_values(const AttentionParams& p, const Dims& dims, const Seq& s, int64_t hk) {
  KeysValues kv;
  kv.k.resize(static_cast<size_t>(s.sk * dims.head_dim));
  kv.v.resize(static_cast<size_t>(s.sk * dims.head_dim_v));
  for (int64_t j = 0; j < s.sk; ++j) {
    load_row(p.k.data, p.dtype, k_offset(p, p.k, s, j, hk), dims.head_dim, &kv.k[j * dims.head_dim]);
    load_row(p.v.data, p.dtype, k_offset(p, p.v, s, j, hk), dims.head_dim_v, &kv.v[j * dims.head_dim_v]);
  }
  return kv;
}

// One query row: its q, the scaled scores x, the logits s (−inf where hidden) and P, each [sk].
struct Row {
  std::vector<double> q, x, s, p;
  Row(const Dims& dims, const Seq& seq)
      : q(static_cast<size_t>(dims.head_dim)),
        x(static_cast<size_t>(seq.sk)),
        s(static_cast<size_t>(seq.sk)),
        p(static_cast<size_t>(seq.sk)) {}
};

bool hidden(double logit) { return logit == -kInf; }

// Loads q_i of head h, computes x, s and P; returns LSE_i (−inf when the row sees no key).
double softmax_row(const AttentionParams& p, const Dims& dims, const Seq& seq, const ScoreMods& mods,
                   const KeysValues& kv, int64_t h, int64_t i, Row& r) {
  load_row(p.q.data, p.dtype, q_offset(p, p.q, seq, i, h), dims.head_dim, r.q.data());
  const KeyRange keys = visible_keys(p, seq, i);
  for (int64_t j = 0; j < seq.sk; ++j) {
    r.x[j] = 0.0;
    r.s[j] = -kInf;
    if (j < keys.lo || j >= keys.hi) continue;
    double dot = 0.0;
    for (int64_t d = 0; d < dims.head_dim; ++d) dot += r.q[d] * kv.k[j * dims.head_dim + d];
    r.x[j] = static_cast<double>(dims.scale) * dot;
    r.s[j] = mods.apply(r.x[j], i, j);
  }

  double m = -kInf;  // a NaN logit makes (and keeps) m NaN
  for (int64_t j = 0; j < seq.sk; ++j)
    if (std::isnan(r.s[j]) || r.s[j] > m) m = r.s[j];
  if (m == -kInf) {
    std::fill(r.p.begin(), r.p.end(), 0.0);
    return -kInf;
  }
  // exp(−inf − m) = 0 adds nothing to l; the sums below skip hidden keys, whatever their p.
  double l = 0.0;
  for (int64_t j = 0; j < seq.sk; ++j) {
    r.p[j] = std::exp(r.s[j] - m);
    l += r.p[j];
  }
  for (int64_t j = 0; j < seq.sk; ++j) r.p[j] /= l;
  return m + std::log(l);
}

// O_i = Σ_j P_j v_j over the keys the row sees.
void pv_row(const Dims& dims, const Seq& seq, const KeysValues& kv, const Row& r, double* o) {
  std::fill(o, o + dims.head_dim_v, 0.0);
  for (int64_t j = 0; j < seq.sk; ++j) {
    if (hidden(r.s[j])) continue;
    for (int64_t d = 0; d < dims.head_dim_v; ++d) o[d] += r.p[j] * kv.v[j * dims.head_dim_v + d];
  }
}

}  // namespace

void reference_forward_row(const AttentionParams& p, int64_t b, int64_t h, int64_t i, double* o_row, double* lse) {
  const Dims dims = resolve_dims(p);
  const Seq seq = sequence(p, b);
  const KeysValues kv = load_keys_values(p, dims, seq, h / dims.group);
  Row r(dims, seq);
  *lse = softmax_row(p, dims, seq, score_mods(p, seq, h), kv, h, i, r);
  pv_row(dims, seq, kv, r, o_row);
}

void reference_forward(const ForwardParams& p) {
  const Dims dims = resolve_dims(p);
  std::vector<double> o(static_cast<size_t>(dims.head_dim_v));
  for (int64_t b = 0; b < dims.batch; ++b) {
    const Seq seq = sequence(p, b);
    Row r(dims, seq);
    for (int64_t hk = 0; hk < dims.heads_kv; ++hk) {
      const KeysValues kv = load_keys_values(p, dims, seq, hk);
      for (int64_t h = hk * dims.group; h < (hk + 1) * dims.group; ++h) {
        const ScoreMods mods = score_mods(p, seq, h);
        for (int64_t i = 0; i < seq.sq; ++i) {
          const double lse = softmax_row(p, dims, seq, mods, kv, h, i, r);
          pv_row(dims, seq, kv, r, o.data());
          store_row(p.o.data, p.dtype, q_offset(p, p.o, seq, i, h), dims.head_dim_v, o.data());
          if (p.maybe_lse != nullptr)
            p.maybe_lse[lse_offset(p, p.lse_batch_stride, p.lse_head_stride, seq, i, h)] = static_cast<float>(lse);
        }
      }
    }
  }
}

void reference_backward(const BackwardParams& p) {
  const Dims dims = resolve_dims(p);
  const int64_t dk_dim = dims.head_dim, dv_dim = dims.head_dim_v;
  const double scale = dims.scale, softcap = p.softcap;
  std::vector<double> d_o(static_cast<size_t>(dv_dim)), dq(static_cast<size_t>(dk_dim));
  for (int64_t b = 0; b < dims.batch; ++b) {
    const Seq seq = sequence(p, b);
    Row r(dims, seq);
    std::vector<double> dp(static_cast<size_t>(seq.sk));
    for (int64_t hk = 0; hk < dims.heads_kv; ++hk) {
      const KeysValues kv = load_keys_values(p, dims, seq, hk);
      // dK, dV [sk, dim] of this kv head, summed over its query heads; keys no row sees keep 0.
      std::vector<double> dk(static_cast<size_t>(seq.sk * dk_dim), 0.0), dv(static_cast<size_t>(seq.sk * dv_dim), 0.0);
      for (int64_t h = hk * dims.group; h < (hk + 1) * dims.group; ++h) {
        const ScoreMods mods = score_mods(p, seq, h);
        for (int64_t i = 0; i < seq.sq; ++i) {
          softmax_row(p, dims, seq, mods, kv, h, i, r);
          load_row(p.d_o.data, p.dtype, q_offset(p, p.d_o, seq, i, h), dv_dim, d_o.data());
          double D = 0.0;
          for (int64_t j = 0; j < seq.sk; ++j) {
            dp[j] = 0.0;
            if (hidden(r.s[j])) continue;
            for (int64_t d = 0; d < dv_dim; ++d) dp[j] += d_o[d] * kv.v[j * dv_dim + d];
            D += r.p[j] * dp[j];
          }
          std::fill(dq.begin(), dq.end(), 0.0);
          for (int64_t j = 0; j < seq.sk; ++j) {
            if (hidden(r.s[j])) continue;
            double ds = r.p[j] * (dp[j] - D);
            if (softcap != 0.0) {
              const double t = std::tanh(r.x[j] / softcap);
              ds *= 1.0 - t * t;
            }
            for (int64_t d = 0; d < dk_dim; ++d) {
              dq[d] += scale * ds * kv.k[j * dk_dim + d];
              dk[j * dk_dim + d] += scale * ds * r.q[d];
            }
            for (int64_t d = 0; d < dv_dim; ++d) dv[j * dv_dim + d] += r.p[j] * d_o[d];
          }
          store_row(p.dq.data, p.dtype, q_offset(p, p.dq, seq, i, h), dk_dim, dq.data());
        }
      }
      for (int64_t j = 0; j < seq.sk; ++j) {
        store_row(p.dk.data, p.dtype, k_offset(p, p.dk, seq, j, hk), dk_dim, &dk[j * dk_dim]);
        store_row(p.dv.data, p.dtype, k_offset(p, p.dv, seq, j, hk), dv_dim, &dv[j * dv_dim]);
      }
    }
  }
}

}  // namespace flashattn::detail
