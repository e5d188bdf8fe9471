// The oracle's own evidence: hand-computed cases, options that must agree with each other,
// central finite differences for the backward, and special values (empty rows, NaN, inf).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.hpp"
#include "reference/reference.hpp"
#include "support/test_util.hpp"

namespace fa_test {
namespace {

using flashattn::AttentionParams;
using flashattn::detail::reference_forward_row;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

Problem make(const Case& c) { return make_problem(c, fresh_seed(c.name())); }

// Reference forward then backward, with `edit` applied to the parameters of both.
template <class Edit>
void run_reference(Problem& p, Edit edit) {
  flashattn::Launch launch;
  launch.backend = Backend::kReference;
  flashattn::ForwardParams f = p.forward_params();
  edit(f);
  const flashattn::Status fs = flashattn::forward(f, launch);
  ASSERT_TRUE(fs.ok()) << fs.message << " [" << p.c.name() << "]";
  flashattn::BackwardParams g = p.backward_params();
  edit(g);
  const flashattn::Status bs = flashattn::backward(g, launch);
  ASSERT_TRUE(bs.ok()) << bs.message << " [" << p.c.name() << "]";
}
void run_reference(Problem& p) {
  run_reference(p, [](AttentionParams&) {});
}

// Every output of `got` against `want` (same logical shapes, layouts and dtypes may differ):
// max |got - want| <= tol * max(1, max |want|), NaN where `want` has none counts as a mismatch.
void expect_outputs_match(const Problem& got, const Problem& want, double tol, const std::string& what) {
  const struct {
    const char* name;
    Error e;
  } errors[] = {
      {"o", compare(got.o, want.o, want, false)},   {"dq", compare(got.dq, want.dq, want, false)},
      {"dk", compare(got.dk, want.dk, want, true)}, {"dv", compare(got.dv, want.dv, want, true)},
      {"lse", compare_lse(got, want)},
  };
  for (const auto& [name, e] : errors) {
    // max_ref is inf when an LSE is −inf (a row without keys); then the bound stays absolute.
    const double bound = tol * std::max(1.0, std::isinf(e.max_ref) ? 1.0 : e.max_ref);
    EXPECT_LE(e.max_abs, bound) << name << " of " << what << " (nan: " << e.nan_count << ")";
  }
}

// Copies the logical contents of one tensor into another of the same shape (any layout, dtype),
// reading kv head `head_of(h)` of `from` for head h of `to`.
template <class HeadOf>
void copy_values(const HostTensor& from, HostTensor& to, HeadOf head_of) {
  for (int64_t b = 0; b < to.batch; ++b)
    for (int64_t r = 0; r < to.rows; ++r)
      for (int64_t h = 0; h < to.heads; ++h)
        for (int64_t d = 0; d < to.dim; ++d) to.set(b, r, h, d, from.get(b, r, head_of(h), d));
}
void copy_values(const HostTensor& from, HostTensor& to) {
  copy_values(from, to, [](int64_t h) { return h; });
}

double softmax_weight(double s_j, double s_other) { return 1.0 / (1.0 + std::exp(s_other - s_j)); }

// x as the reference stores it: rounded to fp32, then to the storage dtype.
double as_stored(DType t, double x) {
  float word = 0.0f;
  flashattn::detail::store_float(&word, t, 0, static_cast<float>(x));
  return flashattn::detail::load_float(&word, t, 0);
}

// ---------------------------------------------------------------------------------------------
// Hand-computed cases

// One query, two keys, d = 1, scale 2: s = 2 q k = (0, 0.5), P = (1, e^0.5) / (1 + e^0.5).
TEST(Reference, OneQueryTwoKeys) {
  Case c;
  c.seqlen_q = 1, c.seqlen_k = 2, c.heads_q = c.heads_kv = 1, c.head_dim = 1, c.scale = 2.0f;
  Problem p = make(c);
  p.q.set(0, 0, 0, 0, 1.0);
  p.k.set(0, 0, 0, 0, 0.0);
  p.k.set(0, 1, 0, 0, 0.25);
  p.v.set(0, 0, 0, 0, 2.0);
  p.v.set(0, 1, 0, 0, 6.0);
  p.d_o.set(0, 0, 0, 0, 3.0);  // loss = 3 O
  run_reference(p);

  const double p0 = softmax_weight(0.0, 0.5), p1 = softmax_weight(0.5, 0.0);
  const double o = 2.0 * p0 + 6.0 * p1;
  double o_row, lse;
  reference_forward_row(p.forward_params(), 0, 0, 0, &o_row, &lse);
  EXPECT_NEAR(o_row, o, 1e-15);
  EXPECT_NEAR(lse, std::log(1.0 + std::exp(0.5)), 1e-15);
  EXPECT_EQ(p.o.get(0, 0, 0, 0), static_cast<float>(o_row));
  EXPECT_EQ(p.lse[0], static_cast<float>(lse));

  // d(3 O)/dv_j = 3 P_j; dP_j/ds_l = P_j (δ_jl − P_l), s_j = 2 q k_j, so
  // dO/dq = 2 Σ_j P_j k_j (v_j − O) and dO/dk_j = 2 q P_j (v_j − O).
  const double k0 = 0.0, k1 = 0.25, q = 1.0;
  EXPECT_NEAR(p.dv.get(0, 0, 0, 0), 3.0 * p0, 1e-6);
  EXPECT_NEAR(p.dv.get(0, 1, 0, 0), 3.0 * p1, 1e-6);
  EXPECT_NEAR(p.dq.get(0, 0, 0, 0), 3.0 * 2.0 * (p0 * k0 * (2.0 - o) + p1 * k1 * (6.0 - o)), 1e-6);
  EXPECT_NEAR(p.dk.get(0, 0, 0, 0), 3.0 * 2.0 * q * p0 * (2.0 - o), 1e-6);
  EXPECT_NEAR(p.dk.get(0, 1, 0, 0), 3.0 * 2.0 * q * p1 * (6.0 - o), 1e-6);
}

// One key: P = 1, so O = v, LSE = scale q·k, dV = dO, and q, k get no gradient.
TEST(Reference, OneKey) {
  Case c;
  c.seqlen_q = 1, c.seqlen_k = 1, c.heads_q = c.heads_kv = 1, c.head_dim = 3, c.head_dim_v = 2;
  Problem p = make(c);
  run_reference(p);
  double qk = 0.0;
  for (int d = 0; d < 3; ++d) qk += p.q.get(0, 0, 0, d) * p.k.get(0, 0, 0, d);
  EXPECT_NEAR(p.lse[0], qk / std::sqrt(3.0), 1e-6);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(p.o.get(0, 0, 0, d), p.v.get(0, 0, 0, d));
    EXPECT_EQ(p.dv.get(0, 0, 0, d), p.d_o.get(0, 0, 0, d));
  }
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(p.dq.get(0, 0, 0, d), 0.0);
    EXPECT_EQ(p.dk.get(0, 0, 0, d), 0.0);
  }
}

// Every modifier at once, written out: top-left alignment (diagonal 0), softcap 2, ALiBi slope
// 0.25, a bias, and a mask that hides key 2: logit_j = 2 tanh(q k_j / 2) − 0.25 |j| + bias_j.
TEST(Reference, ModifiersByHand) {
  Case c;
  c.seqlen_q = 1, c.seqlen_k = 3, c.heads_q = c.heads_kv = 1, c.head_dim = 1, c.scale = 1.0f;
  c.alignment = Alignment::kTopLeft;
  c.softcap = 2.0f;
  Problem p = make(c);
  const double q = 1.5, k[3] = {1.0, -2.0, 3.0}, v[3] = {1.0, 10.0, 100.0}, bias[3] = {0.5, -0.25, 0.0};
  p.q.set(0, 0, 0, 0, q);
  for (int j = 0; j < 3; ++j) {
    p.k.set(0, j, 0, 0, k[j]);
    p.v.set(0, j, 0, 0, v[j]);
  }
  const float slope = 0.25f, bias_f[3] = {0.5f, -0.25f, 0.0f};
  const uint8_t mask[3] = {1, 1, 0};
  flashattn::ForwardParams f = p.forward_params();
  f.maybe_alibi_slopes = &slope;
  f.maybe_bias = {bias_f, DType::kFloat32, 0, 0, 3};
  f.maybe_mask = {mask, 0, 0, 3};
  double o, lse;
  reference_forward_row(f, 0, 0, 0, &o, &lse);

  double s[2];
  for (int j = 0; j < 2; ++j) s[j] = 2.0 * std::tanh(q * k[j] / 2.0) - 0.25 * j + bias[j];
  EXPECT_NEAR(o, softmax_weight(s[0], s[1]) * v[0] + softmax_weight(s[1], s[0]) * v[1], 1e-13);
  EXPECT_NEAR(lse, std::log(std::exp(s[0]) + std::exp(s[1])), 1e-14);
}

// Bottom-right causal with Sq = 2, Sk = 3: row 0 sees keys 0 and 1, row 1 sees all three.
TEST(Reference, CausalBottomRightByHand) {
  Case c;
  c.seqlen_q = 2, c.seqlen_k = 3, c.heads_q = c.heads_kv = 1, c.head_dim = 1, c.scale = 1.0f, c.causal = true;
  Problem p = make(c);
  const double q[2] = {0.5, -1.0}, k[3] = {1.0, 2.0, -3.0}, v[3] = {1.0, 2.0, 4.0};
  for (int i = 0; i < 2; ++i) p.q.set(0, i, 0, 0, q[i]);
  for (int j = 0; j < 3; ++j) {
    p.k.set(0, j, 0, 0, k[j]);
    p.v.set(0, j, 0, 0, v[j]);
  }
  run_reference(p);
  for (int i = 0; i < 2; ++i) {
    double l = 0.0, o = 0.0;
    for (int j = 0; j <= i + 1; ++j) {
      l += std::exp(q[i] * k[j]);
      o += std::exp(q[i] * k[j]) * v[j];
    }
    EXPECT_NEAR(p.o.get(0, i, 0, 0), o / l, 1e-6) << "row " << i;
    EXPECT_NEAR(p.lse[i], std::log(l), 1e-6) << "row " << i;
  }
}

// ---------------------------------------------------------------------------------------------
// Equivalences: two ways to state the same attention give the same result.

TEST(Reference, CausalTopLeftEqualsBottomRightWhenSquare) {
  Case c;
  c.seqlen_q = c.seqlen_k = 23, c.heads_q = 4, c.heads_kv = 2, c.head_dim = 16, c.causal = true, c.softcap = 3.0f;
  c.alibi = AlibiKind::kPerHead;
  Problem br = make(c);
  Problem tl = br;
  tl.c.alignment = Alignment::kTopLeft;
  run_reference(br);
  run_reference(tl);
  expect_outputs_match(tl, br, 0.0, "top-left vs bottom-right");
}

// A mask equal to the causal pattern (Sq != Sk, both alignments) equals causal.
TEST(Reference, CausalPatternMaskEqualsCausal) {
  for (Alignment align : {Alignment::kBottomRight, Alignment::kTopLeft}) {
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{13, 29}, {29, 13}}) {
      Case c;
      c.seqlen_q = sq, c.seqlen_k = sk, c.batch = 2, c.heads_q = 3, c.heads_kv = 1, c.head_dim = 12;
      c.alignment = align, c.causal = true;
      Problem causal = make(c);
      Problem masked = causal;
      masked.c.causal = false;
      const int64_t diag = align == Alignment::kBottomRight ? sk - sq : 0;
      std::vector<uint8_t> mask(static_cast<size_t>(sq * sk));
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t j = 0; j < sk; ++j) mask[i * sk + j] = j <= i + diag ? 1 : 0;
      run_reference(causal);
      run_reference(masked, [&](AttentionParams& a) { a.maybe_mask = {mask.data(), 0, 0, sk}; });
      expect_outputs_match(masked, causal, 0.0, "causal mask vs causal, " + c.name());
    }
  }
}

// A sliding window (and causal with a window) equals a mask that spells out the band
// i + diagonal − window_left <= j <= i + diagonal + window_right, for Sq < Sk and Sq > Sk.
TEST(Reference, WindowEqualsBandMask) {
  struct Window {
    bool causal;
    int64_t left, right;
  };
  for (Alignment align : {Alignment::kBottomRight, Alignment::kTopLeft}) {
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{11, 24}, {24, 11}}) {
      for (Window w : {Window{false, 3, 2}, Window{false, -1, 0}, Window{false, 0, -1}, Window{true, 4, -1},
                       Window{false, 2, 5}}) {
        Case c;
        c.seqlen_q = sq, c.seqlen_k = sk, c.heads_q = 2, c.heads_kv = 1, c.head_dim = 8, c.alignment = align;
        c.causal = w.causal, c.window_left = w.left, c.window_right = w.right;
        Problem windowed = make(c);
        Problem masked = windowed;
        masked.c.causal = false, masked.c.window_left = masked.c.window_right = -1;
        const int64_t diag = align == Alignment::kBottomRight ? sk - sq : 0;
        const int64_t right = w.causal ? 0 : w.right;
        std::vector<uint8_t> mask(static_cast<size_t>(sq * sk));
        for (int64_t i = 0; i < sq; ++i)
          for (int64_t j = 0; j < sk; ++j) {
            const bool past_left = w.left >= 0 && j < i + diag - w.left;
            const bool past_right = right >= 0 && j > i + diag + right;
            mask[i * sk + j] = past_left || past_right ? 0 : 1;
          }
        run_reference(windowed);
        run_reference(masked, [&](AttentionParams& a) { a.maybe_mask = {mask.data(), 0, 0, sk}; });
        expect_outputs_match(windowed, masked, 0.0, "window vs band mask, " + c.name());
      }
    }
  }
}

// A bias column of −inf hides that key exactly as the mask does.
TEST(Reference, NegInfBiasColumnEqualsMaskedColumn) {
  Case c;
  c.seqlen_q = 11, c.seqlen_k = 19, c.heads_q = 2, c.heads_kv = 2, c.head_dim = 8, c.bias = true;
  c.softcap = 4.0f;
  Problem by_mask = make(c);
  Problem by_bias = by_mask;
  const int64_t hidden_col = 7;
  std::vector<uint8_t> mask(static_cast<size_t>(c.seqlen_k), 1);
  mask[hidden_col] = 0;
  for (int64_t h = 0; h < c.heads_q; ++h)
    for (int64_t i = 0; i < c.seqlen_q; ++i) {
      by_bias.bias_storage[(h * c.seqlen_q + i) * c.seqlen_k + hidden_col] = -std::numeric_limits<float>::infinity();
      by_mask.bias_storage[(h * c.seqlen_q + i) * c.seqlen_k + hidden_col] = 0.0f;
    }
  run_reference(by_bias);
  run_reference(by_mask, [&](AttentionParams& a) { a.maybe_mask = {mask.data(), 0, 0, 0}; });
  expect_outputs_match(by_bias, by_mask, 0.0, "-inf bias column vs masked column");
  // The hidden key gets no gradient.
  for (int64_t d = 0; d < c.head_dim; ++d) {
    EXPECT_EQ(by_bias.dk.get(0, hidden_col, 0, d), 0.0);
    EXPECT_EQ(by_bias.dv.get(0, hidden_col, 0, d), 0.0);
  }
}

// ALiBi equals the explicit bias −slope·|i + diagonal − j|, per head and per (batch, head).
TEST(Reference, AlibiEqualsExplicitBias) {
  for (AlibiKind kind : {AlibiKind::kPerHead, AlibiKind::kPerBatchHead}) {
    for (Alignment align : {Alignment::kBottomRight, Alignment::kTopLeft}) {
      Case c;
      c.batch = 2, c.seqlen_q = 9, c.seqlen_k = 21, c.heads_q = 3, c.heads_kv = 3, c.head_dim = 8;
      c.alibi = kind, c.alignment = align, c.causal = true;
      Problem alibi = make(c);
      Problem biased = alibi;
      biased.c.alibi = AlibiKind::kNone;
      const int64_t diag = align == Alignment::kBottomRight ? c.seqlen_k - c.seqlen_q : 0;
      std::vector<float> bias(static_cast<size_t>(c.batch * c.heads_q * c.seqlen_q * c.seqlen_k));
      for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t h = 0; h < c.heads_q; ++h) {
          const double slope = alibi.slopes[kind == AlibiKind::kPerHead ? h : b * c.heads_q + h];
          for (int64_t i = 0; i < c.seqlen_q; ++i)
            for (int64_t j = 0; j < c.seqlen_k; ++j)
              bias[((b * c.heads_q + h) * c.seqlen_q + i) * c.seqlen_k + j] =
                  static_cast<float>(-slope * std::abs(static_cast<double>(i + diag - j)));
        }
      run_reference(alibi);
      run_reference(biased, [&](AttentionParams& a) {
        a.maybe_bias = {bias.data(), DType::kFloat32, c.heads_q * c.seqlen_q * c.seqlen_k, c.seqlen_q * c.seqlen_k,
                        c.seqlen_k};
      });
      // The bias is rounded to fp32 (relative 6e-8 of logits up to ~10).
      expect_outputs_match(biased, alibi, 2e-6, "alibi vs explicit bias, " + c.name());
    }
  }
}

// GQA equals the same attention with each kv head repeated for its query heads; dK, dV of a shared
// kv head are the sums over the repeats.
TEST(Reference, GqaEqualsRepeatedKvHeads) {
  Case c;
  const int64_t dv = 5;
  c.seqlen_q = 14, c.seqlen_k = 10, c.heads_q = 6, c.heads_kv = 2, c.head_dim = 8, c.head_dim_v = dv;
  c.window_left = 4, c.softcap = 2.5f, c.alibi = AlibiKind::kPerHead, c.mask = MaskKind::kRandom;
  Problem gqa = make(c);
  Case rc = c;
  rc.heads_kv = c.heads_q;
  Problem rep = make_problem(rc, gqa.seed);
  const auto kv_head = [&](int64_t h) { return h / (c.heads_q / c.heads_kv); };
  copy_values(gqa.q, rep.q);
  copy_values(gqa.k, rep.k, kv_head);
  copy_values(gqa.v, rep.v, kv_head);
  copy_values(gqa.d_o, rep.d_o);
  rep.slopes = gqa.slopes;
  rep.mask_storage = gqa.mask_storage;
  run_reference(gqa);
  run_reference(rep);

  EXPECT_EQ(compare(gqa.o, rep.o, rep, false).max_abs, 0.0);
  EXPECT_EQ(compare(gqa.dq, rep.dq, rep, false).max_abs, 0.0);
  EXPECT_EQ(compare_lse(gqa, rep).max_abs, 0.0);
  for (int64_t j = 0; j < c.seqlen_k; ++j)
    for (int64_t hk = 0; hk < c.heads_kv; ++hk) {
      for (int64_t d = 0; d < c.head_dim; ++d) {
        double sum = 0.0;
        for (int64_t h = 0; h < c.heads_q; ++h)
          if (kv_head(h) == hk) sum += rep.dk.get(0, j, h, d);
        EXPECT_NEAR(gqa.dk.get(0, j, hk, d), sum, 1e-6 * (1.0 + std::abs(sum))) << "dk j=" << j << " hk=" << hk;
      }
      for (int64_t d = 0; d < dv; ++d) {
        double sum = 0.0;
        for (int64_t h = 0; h < c.heads_q; ++h)
          if (kv_head(h) == hk) sum += rep.dv.get(0, j, h, d);
        EXPECT_NEAR(gqa.dv.get(0, j, hk, d), sum, 1e-6 * (1.0 + std::abs(sum))) << "dv j=" << j << " hk=" << hk;
      }
    }
}

// A variable-length batch (with empty sequences) equals running each sequence on its own, with
// the bias, mask and ALiBi slopes of that sequence addressed through offset pointers.
TEST(Reference, VarlenEqualsSeparateSequences) {
  const int64_t dv = 12;
  Case c;
  c.heads_q = 4, c.heads_kv = 2, c.head_dim = 8, c.head_dim_v = dv, c.causal = true, c.softcap = 3.0f;
  c.varlen_q = {5, 0, 9, 3, 6};
  c.varlen_k = {7, 3, 4, 0, 6};
  c.alibi = AlibiKind::kPerBatchHead, c.bias = true, c.mask = MaskKind::kRandom;
  Problem packed = make(c);
  run_reference(packed);
  const Case& pc = packed.c;  // seqlen_q/k are now the maxima
  const int64_t plane = pc.seqlen_q * pc.seqlen_k;

  for (int64_t b = 0; b < pc.batch; ++b) {
    const int64_t sq = packed.seq_len_q(b), sk = packed.seq_len_k(b), q0 = packed.cu_q[b], k0 = packed.cu_k[b];
    Case one = c;
    one.varlen_q.clear();
    one.varlen_k.clear();
    one.batch = 1, one.seqlen_q = sq, one.seqlen_k = sk;
    one.alibi = AlibiKind::kNone, one.bias = false, one.mask = MaskKind::kNone;
    Problem p = make_problem(one, packed.seed);
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t h = 0; h < c.heads_q; ++h) {
        for (int64_t d = 0; d < c.head_dim; ++d) p.q.set(0, i, h, d, packed.q.get(0, q0 + i, h, d));
        for (int64_t d = 0; d < dv; ++d) p.d_o.set(0, i, h, d, packed.d_o.get(0, q0 + i, h, d));
      }
    for (int64_t j = 0; j < sk; ++j)
      for (int64_t h = 0; h < c.heads_kv; ++h) {
        for (int64_t d = 0; d < c.head_dim; ++d) p.k.set(0, j, h, d, packed.k.get(0, k0 + j, h, d));
        for (int64_t d = 0; d < dv; ++d) p.v.set(0, j, h, d, packed.v.get(0, k0 + j, h, d));
      }
    run_reference(p, [&](AttentionParams& a) {
      a.maybe_alibi_slopes = packed.slopes.data() + b * c.heads_q;
      a.alibi_batch_stride = 0;
      a.maybe_bias = {packed.bias_storage.data() + b * c.heads_q * plane, DType::kFloat32, 0, plane, pc.seqlen_k};
      a.maybe_mask = {packed.mask_storage.data() + b * c.heads_q * plane, 0, plane, pc.seqlen_k};
    });

    const int64_t total_q = packed.cu_q.back();
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < sq; ++i) {
        EXPECT_EQ(p.lse[h * sq + i], packed.lse[h * total_q + q0 + i]) << "b=" << b << " h=" << h << " i=" << i;
        for (int64_t d = 0; d < dv; ++d) EXPECT_EQ(p.o.get(0, i, h, d), packed.o.get(0, q0 + i, h, d));
        for (int64_t d = 0; d < c.head_dim; ++d) EXPECT_EQ(p.dq.get(0, i, h, d), packed.dq.get(0, q0 + i, h, d));
      }
    for (int64_t h = 0; h < c.heads_kv; ++h)
      for (int64_t j = 0; j < sk; ++j) {
        for (int64_t d = 0; d < c.head_dim; ++d) EXPECT_EQ(p.dk.get(0, j, h, d), packed.dk.get(0, k0 + j, h, d));
        for (int64_t d = 0; d < dv; ++d) EXPECT_EQ(p.dv.get(0, j, h, d), packed.dv.get(0, k0 + j, h, d));
      }
  }
  // Keys of a sequence without queries get zero gradients; queries without keys get O = 0, LSE = −inf.
  for (int64_t j = 0; j < packed.seq_len_k(1); ++j)
    for (int64_t d = 0; d < c.head_dim; ++d) EXPECT_EQ(packed.dk.get(0, packed.cu_k[1] + j, 0, d), 0.0);
  for (int64_t i = 0; i < packed.seq_len_q(3); ++i) {
    EXPECT_EQ(packed.lse[packed.cu_q[3] + i], -kInf);
    EXPECT_EQ(packed.o.get(0, packed.cu_q[3] + i, 0, 0), 0.0);
  }
}

// Padded, interleaved layouts give bit-identical results to contiguous ones.
TEST(Reference, StridedEqualsContiguous) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    Case c;
    c.dtype = t, c.batch = 2, c.seqlen_q = 15, c.seqlen_k = 26, c.heads_q = 6, c.heads_kv = 2;
    c.head_dim = 24, c.head_dim_v = 16, c.window_left = 5, c.window_right = 3, c.alibi = AlibiKind::kPerHead;
    c.bias = true, c.bias_dtype = DType::kBFloat16, c.bias_broadcast = true, c.mask = MaskKind::kKeyPadding;
    Problem contiguous = make(c);
    c.strided = true;
    Problem strided = make_problem(c, contiguous.seed);
    run_reference(contiguous);
    run_reference(strided);
    expect_outputs_match(strided, contiguous, 0.0, "strided vs contiguous, " + c.name());
  }
}

// A bias in fp16/bf16 broadcast over the batch equals the fp32 bias holding the same values in
// full; a key-padding mask broadcast over heads and rows equals its expansion.
TEST(Reference, BroadcastBiasAndMaskEqualTheirExpansion) {
  for (DType bias_dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    Case c;
    c.batch = 3, c.seqlen_q = 7, c.seqlen_k = 12, c.heads_q = 2, c.heads_kv = 1, c.head_dim = 8;
    c.bias = true, c.bias_dtype = bias_dtype, c.bias_broadcast = true, c.mask = MaskKind::kKeyPadding;
    Problem bcast = make(c);
    Problem full = bcast;
    const int64_t plane = c.seqlen_q * c.seqlen_k;
    std::vector<float> bias(static_cast<size_t>(c.batch * c.heads_q * plane));
    std::vector<uint8_t> mask(bias.size());
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads_q; ++h)
        for (int64_t i = 0; i < c.seqlen_q; ++i)
          for (int64_t j = 0; j < c.seqlen_k; ++j) {
            const int64_t at = (b * c.heads_q + h) * plane + i * c.seqlen_k + j;
            const int64_t from = h * plane + i * c.seqlen_k + j;  // batch stride 0
            bias[at] = flashattn::detail::load_float(bcast.bias_storage.data(), bias_dtype, from);
            mask[at] = bcast.mask_storage[b * c.seqlen_k + j];
          }
    run_reference(bcast);
    run_reference(full, [&](AttentionParams& a) {
      a.maybe_bias = {bias.data(), DType::kFloat32, c.heads_q * plane, plane, c.seqlen_k};
      a.maybe_mask = {mask.data(), c.heads_q * plane, plane, c.seqlen_k};
    });
    expect_outputs_match(full, bcast, 0.0, "broadcast vs expanded, " + c.name());
  }
}

// fp16/bf16 storage: inputs are read exactly and outputs are the fp32 results rounded once more.
TEST(Reference, LowPrecisionStorageRoundsTheFp32Result) {
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    Case c;
    c.dtype = t, c.seqlen_q = 19, c.seqlen_k = 33, c.heads_q = 4, c.heads_kv = 2, c.head_dim = 16, c.causal = true;
    c.alibi = AlibiKind::kPerHead, c.bias = true, c.bias_dtype = DType::kFloat16;
    Problem lowp = make(c);
    Problem wide = as_fp32(lowp);
    run_reference(lowp);
    run_reference(wide);
    const auto expect_rounded = [&](const HostTensor& got, const HostTensor& want, const char* name) {
      for (int64_t r = 0; r < got.rows; ++r)
        for (int64_t h = 0; h < got.heads; ++h)
          for (int64_t d = 0; d < got.dim; ++d)
            ASSERT_EQ(got.get(0, r, h, d), as_stored(t, want.get(0, r, h, d)))
                << name << " r=" << r << " h=" << h << " d=" << d;
    };
    expect_rounded(lowp.o, wide.o, "o");
    expect_rounded(lowp.dq, wide.dq, "dq");
    expect_rounded(lowp.dk, wide.dk, "dk");
    expect_rounded(lowp.dv, wide.dv, "dv");
    EXPECT_EQ(compare_lse(lowp, wide).max_abs, 0.0);
  }
}

// Every option: the per-row entry point gives what the whole forward stores, and with a constant
// v every row that sees a key gets that constant (P sums to one); rows that see none get 0.
TEST(Reference, RowEntryPointAndConstantValues) {
  std::vector<Case> cases;
  {
    Case c;
    c.batch = 2, c.seqlen_q = 37, c.seqlen_k = 21, c.heads_q = 4, c.heads_kv = 1, c.head_dim = 16, c.head_dim_v = 8;
    cases.push_back(c);
    c.causal = true;
    cases.push_back(c);
    c.alignment = Alignment::kTopLeft, c.window_left = 3;
    cases.push_back(c);
    c.causal = false, c.window_right = 2, c.softcap = 1.5f, c.alibi = AlibiKind::kPerBatchHead;
    cases.push_back(c);
    c.bias = true, c.bias_dtype = DType::kBFloat16, c.mask = MaskKind::kRandom, c.dtype = DType::kFloat16;
    cases.push_back(c);
    c.mask = MaskKind::kBlockSparse, c.seqlen_q = 70, c.seqlen_k = 65, c.strided = true, c.dtype = DType::kBFloat16;
    cases.push_back(c);
    Case v;
    v.heads_q = 2, v.heads_kv = 2, v.head_dim = 8, v.varlen_q = {4, 0, 7}, v.varlen_k = {6, 2, 0};
    v.causal = true, v.bias = true, v.mask = MaskKind::kRandom;
    cases.push_back(v);
  }
  for (const Case& c : cases) {
    Problem p = make(c);
    const int64_t dv = c.head_dim_v > 0 ? c.head_dim_v : c.head_dim;
    const bool varlen = !p.cu_q.empty();
    for (int64_t b = 0; b < p.v.batch; ++b)
      for (int64_t r = 0; r < p.v.rows; ++r)
        for (int64_t h = 0; h < p.v.heads; ++h)
          for (int64_t d = 0; d < dv; ++d) p.v.set(b, r, h, d, 0.5 * d - 1.0);
    run_reference(p);
    const flashattn::ForwardParams f = p.forward_params();
    std::vector<double> o(static_cast<size_t>(dv));
    int64_t empty_rows = 0;
    for (int64_t b = 0; b < p.c.batch; ++b)
      for (int64_t h = 0; h < c.heads_q; ++h)
        for (int64_t i = 0; i < p.seq_len_q(b); ++i) {
          double lse;
          reference_forward_row(f, b, h, i, o.data(), &lse);
          const int64_t tb = varlen ? 0 : b, row = varlen ? p.cu_q[b] + i : i;
          const int64_t lse_at = varlen ? h * p.cu_q.back() + row : (b * c.heads_q + h) * p.c.seqlen_q + i;
          ASSERT_EQ(p.lse[lse_at], static_cast<float>(lse)) << c.name() << " b=" << b << " h=" << h << " i=" << i;
          const bool empty = lse == -kInf;
          empty_rows += empty;
          for (int64_t d = 0; d < dv; ++d) {
            ASSERT_EQ(p.o.get(tb, row, h, d), as_stored(c.dtype, o[d])) << c.name() << " b=" << b << " h=" << h;
            ASSERT_NEAR(o[d], empty ? 0.0 : 0.5 * d - 1.0, 1e-14) << c.name() << " b=" << b << " h=" << h << " i=" << i;
          }
        }
    // Bottom-right causal with Sq > Sk: the first Sq - Sk rows of every head see no key.
    if (c.causal && c.alignment == Alignment::kBottomRight && !varlen) {
      EXPECT_GE(empty_rows, c.batch * c.heads_q * std::max<int64_t>(0, c.seqlen_q - c.seqlen_k)) << c.name();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward against central finite differences of loss = Σ O∘W (W = d_o), O from the double
// row entry point, on small fp32 problems.

double loss(Problem& p) {
  const flashattn::ForwardParams f = p.forward_params();
  const bool varlen = !p.cu_q.empty();
  const int64_t dv = p.o.dim;
  std::vector<double> o(static_cast<size_t>(dv));
  double sum = 0.0;
  for (int64_t b = 0; b < p.c.batch; ++b)
    for (int64_t h = 0; h < p.c.heads_q; ++h)
      for (int64_t i = 0; i < p.seq_len_q(b); ++i) {
        double lse;
        reference_forward_row(f, b, h, i, o.data(), &lse);
        for (int64_t d = 0; d < dv; ++d) sum += o[d] * p.d_o.get(varlen ? 0 : b, varlen ? p.cu_q[b] + i : i, h, d);
      }
  return sum;
}

// Central difference of loss in every element of `x` (a tensor of p), against `grad`.
void expect_gradient(Problem& p, HostTensor Problem::*x, const HostTensor& grad, const char* name) {
  constexpr double kStep = 1.0 / 512;
  HostTensor& t = p.*x;
  double worst = 0.0;
  for (int64_t b = 0; b < t.batch; ++b)
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t h = 0; h < t.heads; ++h)
        for (int64_t d = 0; d < t.dim; ++d) {
          const double x0 = t.get(b, r, h, d);
          t.set(b, r, h, d, x0 + kStep);
          const double up = t.get(b, r, h, d) - x0;  // the step fp32 storage really took
          const double l_up = loss(p);
          t.set(b, r, h, d, x0 - kStep);
          const double down = x0 - t.get(b, r, h, d);
          const double l_down = loss(p);
          t.set(b, r, h, d, x0);
          const double fd = (l_up - l_down) / (up + down), g = grad.get(b, r, h, d);
          worst = std::max(worst, std::abs(fd - g) / (1.0 + std::abs(g)));
          EXPECT_NEAR(g, fd, 2e-5 * (1.0 + std::abs(g)))
              << name << " b=" << b << " r=" << r << " h=" << h << " d=" << d;
        }
  std::printf("[ fd       ] %s: max |fd - grad| / (1 + |grad|) = %.2e\n", name, worst);
}

TEST(Reference, BackwardMatchesFiniteDifferences) {
  std::vector<Case> cases;
  Case c;
  c.seqlen_q = 5, c.seqlen_k = 7, c.heads_q = 2, c.heads_kv = 1, c.head_dim = 8, c.head_dim_v = 6;
  cases.push_back(c);
  c.causal = true;
  cases.push_back(c);
  c.seqlen_q = 9, c.seqlen_k = 6, c.softcap = 1.5f, c.input_scale = 1.5;  // scores reach the cap
  cases.push_back(c);
  c.causal = false, c.alignment = Alignment::kTopLeft, c.window_left = 2, c.window_right = 1;
  c.alibi = AlibiKind::kPerHead, c.bias = true, c.mask = MaskKind::kRandom, c.softcap = 0.0f, c.input_scale = 1.0;
  cases.push_back(c);
  Case v;
  v.heads_q = 2, v.heads_kv = 2, v.head_dim = 8, v.varlen_q = {3, 5}, v.varlen_k = {6, 4}, v.causal = true;
  v.softcap = 2.0f, v.strided = true;
  cases.push_back(v);
  for (const Case& fc : cases) {
    Problem p = make(fc);
    run_reference(p);
    SCOPED_TRACE(fc.name());
    expect_gradient(p, &Problem::q, p.dq, "dq");
    expect_gradient(p, &Problem::k, p.dk, "dk");
    expect_gradient(p, &Problem::v, p.dv, "dv");
  }
}

// ---------------------------------------------------------------------------------------------
// Special values

// Rows that see no key (causal with Sq > Sk, a window past the keys, a mask row of zeros, a bias
// row of −inf) get O = 0, LSE = −inf and dQ = 0, and nothing anywhere is NaN.
TEST(Reference, RowsWithoutKeysGiveZeroAndNegInf) {
  Case c;
  c.batch = 2, c.seqlen_q = 12, c.seqlen_k = 5, c.heads_q = 3, c.heads_kv = 1, c.head_dim = 8, c.causal = true;
  c.bias = true, c.mask = MaskKind::kRandom;
  Problem p = make(c);
  const int64_t plane = c.seqlen_q * c.seqlen_k;
  // Row 9 of (b=1, h=2) masked everywhere; row 10 of (b=0, h=1) has a −inf bias everywhere.
  for (int64_t j = 0; j < c.seqlen_k; ++j) {
    p.mask_storage[(1 * c.heads_q + 2) * plane + 9 * c.seqlen_k + j] = 0;
    p.bias_storage[(0 * c.heads_q + 1) * plane + 10 * c.seqlen_k + j] = -std::numeric_limits<float>::infinity();
  }
  run_reference(p);
  const auto no_key = [&](int64_t b, int64_t h, int64_t i) {
    return i < c.seqlen_q - c.seqlen_k || (b == 1 && h == 2 && i == 9) || (b == 0 && h == 1 && i == 10);
  };
  int64_t rows_checked = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < c.seqlen_q; ++i) {
        const float lse = p.lse[(b * c.heads_q + h) * c.seqlen_q + i];
        ASSERT_FALSE(std::isnan(lse));
        for (int64_t d = 0; d < c.head_dim; ++d) {
          ASSERT_FALSE(std::isnan(p.o.get(b, i, h, d)));
          ASSERT_FALSE(std::isnan(p.dq.get(b, i, h, d)));
        }
        if (!no_key(b, h, i)) continue;
        ++rows_checked;
        EXPECT_EQ(lse, -kInf) << "b=" << b << " h=" << h << " i=" << i;
        for (int64_t d = 0; d < c.head_dim; ++d) {
          EXPECT_EQ(p.o.get(b, i, h, d), 0.0);
          EXPECT_EQ(p.dq.get(b, i, h, d), 0.0);
        }
      }
  EXPECT_EQ(rows_checked, c.batch * c.heads_q * (c.seqlen_q - c.seqlen_k) + 2);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t j = 0; j < c.seqlen_k; ++j)
      for (int64_t d = 0; d < c.head_dim; ++d) {
        ASSERT_FALSE(std::isnan(p.dk.get(b, j, 0, d)));
        ASSERT_FALSE(std::isnan(p.dv.get(b, j, 0, d)));
      }
}

// A NaN (or +inf) in one query row makes that row's O and LSE NaN and leaves every other row
// exactly as it was; in the backward it reaches only the keys that row sees. (With a softcap, an
// infinite score saturates to ±softcap instead, so this case runs without one.)
TEST(Reference, NonFiniteQueryStaysInItsRow) {
  for (double bad : {kNaN, kInf}) {
    Case c;
    c.batch = 2, c.seqlen_q = 9, c.seqlen_k = 13, c.heads_q = 2, c.heads_kv = 1, c.head_dim = 8;
    c.alibi = AlibiKind::kPerHead;
    Problem clean = make(c);
    const int64_t bb = 1, bi = 4, bh = 1, bd = 3;
    clean.k.set(bb, 0, 0, bd, 1.0);  // so that +inf in q gives a +inf score
    Problem dirty = clean;
    dirty.q.set(bb, bi, bh, bd, bad);
    run_reference(clean);
    run_reference(dirty);
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads_q; ++h)
        for (int64_t i = 0; i < c.seqlen_q; ++i) {
          const int64_t at = (b * c.heads_q + h) * c.seqlen_q + i;
          const bool poisoned = b == bb && h == bh && i == bi;
          if (poisoned) {
            EXPECT_TRUE(std::isnan(dirty.lse[at])) << "bad=" << bad;
          } else {
            EXPECT_EQ(dirty.lse[at], clean.lse[at]);
          }
          for (int64_t d = 0; d < c.head_dim; ++d) {
            if (poisoned) {
              EXPECT_TRUE(std::isnan(dirty.o.get(b, i, h, d))) << "bad=" << bad;
              EXPECT_TRUE(std::isnan(dirty.dq.get(b, i, h, d))) << "bad=" << bad;
            } else {
              EXPECT_EQ(dirty.o.get(b, i, h, d), clean.o.get(b, i, h, d));
              EXPECT_EQ(dirty.dq.get(b, i, h, d), clean.dq.get(b, i, h, d));
            }
          }
        }
    // The other batch entry's keys are untouched. In the bad row's batch entry, a key whose
    // score is NaN or +inf (key 0 at least) gets NaN dK, dV; with +inf in q, keys whose score is
    // −inf get P = 0 and stay finite.
    for (int64_t j = 0; j < c.seqlen_k; ++j)
      for (int64_t d = 0; d < c.head_dim; ++d) {
        EXPECT_EQ(dirty.dk.get(0, j, 0, d), clean.dk.get(0, j, 0, d));
        EXPECT_EQ(dirty.dv.get(0, j, 0, d), clean.dv.get(0, j, 0, d));
        const bool nan_score = std::isnan(bad) || j == 0;
        if (nan_score) {
          EXPECT_TRUE(std::isnan(dirty.dk.get(bb, j, 0, d))) << "bad=" << bad << " j=" << j;
          EXPECT_TRUE(std::isnan(dirty.dv.get(bb, j, 0, d))) << "bad=" << bad << " j=" << j;
        }
      }
  }
}

// A key hidden by causality or by the mask is never read: NaN in its k and v changes nothing.
TEST(Reference, HiddenKeysAreNeverRead) {
  Case c;
  c.batch = 2, c.seqlen_q = 10, c.seqlen_k = 10, c.heads_q = 2, c.heads_kv = 2, c.head_dim = 8, c.causal = true;
  c.mask = MaskKind::kKeyPadding;  // batch b hides its last 3(b + 1) keys
  Problem clean = make(c);
  Problem dirty = clean;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads_kv; ++h)
      for (int64_t d = 0; d < c.head_dim; ++d) {
        dirty.k.set(b, c.seqlen_k - 1, h, d, kNaN);  // hidden by the mask in both batch entries
        dirty.v.set(b, c.seqlen_k - 1, h, d, kNaN);
      }
  run_reference(clean);
  run_reference(dirty);
  expect_outputs_match(dirty, clean, 0.0, "NaN in a masked key");
  // The hidden key's own gradient is 0, not NaN.
  for (int64_t d = 0; d < c.head_dim; ++d) EXPECT_EQ(dirty.dk.get(0, c.seqlen_k - 1, 0, d), 0.0);
}

}  // namespace
}  // namespace fa_test
