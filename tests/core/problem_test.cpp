// The shared semantics every backend reads: key visibility, score modifiers, dtype conversions,
// and the online-softmax state with its merge.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.hpp"
#include "core/problem.hpp"
#include "core/softmax_state.hpp"
#include "support/test_util.hpp"

namespace flashattn::detail {
namespace {

// visible_keys against the definition written out per element.
TEST(Problem, VisibleKeysMatchesDefinition) {
  for (int64_t sq : {1, 3, 7, 12}) {
    for (int64_t sk : {1, 5, 7, 20}) {
      for (Alignment align : {Alignment::kBottomRight, Alignment::kTopLeft}) {
        for (bool causal : {false, true}) {
          for (int64_t wl : {-1, 0, 2}) {
            for (int64_t wr : {-1, 0, 3}) {
              AttentionParams p;
              p.seqlen_q = sq;
              p.seqlen_k = sk;
              p.causal = causal;
              p.alignment = align;
              p.window_left = wl;
              p.window_right = wr;
              const Seq s = sequence(p, 0);
              const int64_t diag = align == Alignment::kBottomRight ? sk - sq : 0;
              for (int64_t i = 0; i < sq; ++i) {
                const KeyRange r = visible_keys(p, s, i);
                for (int64_t j = 0; j < sk; ++j) {
                  bool vis = true;
                  if (causal && j > i + diag) vis = false;
                  if (wr >= 0 && j > i + diag + wr) vis = false;
                  if (wl >= 0 && j < i + diag - wl) vis = false;
                  EXPECT_EQ(vis, j >= r.lo && j < r.hi)
                      << "sq=" << sq << " sk=" << sk << " i=" << i << " j=" << j << " causal=" << causal << " wl=" << wl
                      << " wr=" << wr << " align=" << int(align);
                }
              }
              // Row-block ranges cover every visible key of every row in the block.
              for (int64_t i0 = 0; i0 < sq; ++i0)
                for (int64_t i1 = i0 + 1; i1 <= sq; ++i1) {
                  const KeyRange blk = visible_keys(p, s, i0, i1);
                  for (int64_t i = i0; i < i1; ++i) {
                    const KeyRange r = visible_keys(p, s, i);
                    if (!r.empty()) {
                      EXPECT_LE(blk.lo, r.lo);
                      EXPECT_GE(blk.hi, r.hi);
                    }
                  }
                  for (int64_t j0 = 0; j0 < sk; ++j0)
                    for (int64_t j1 = j0 + 1; j1 <= sk; ++j1) {
                      if (!tile_fully_visible(p, s, i0, i1, j0, j1)) continue;
                      for (int64_t i = i0; i < i1; ++i) {
                        const KeyRange r = visible_keys(p, s, i);
                        EXPECT_TRUE(r.lo <= j0 && r.hi >= j1) << "tile claimed fully visible but row " << i << " is not";
                      }
                    }
                }
            }
          }
        }
      }
    }
  }
}

TEST(Problem, ScoreModsOrder) {
  AttentionParams p;
  p.seqlen_q = 2;
  p.seqlen_k = 4;
  p.softcap = 5.0f;
  const float slopes[1] = {0.25f};
  p.maybe_alibi_slopes = slopes;
  const float bias[8] = {0.5f, 0, 0, 0, 0, 0, 0, -1.0f};
  p.maybe_bias = {bias, DType::kFloat32, 0, 0, 4};
  const uint8_t mask[8] = {1, 1, 1, 1, 1, 1, 0, 1};
  p.maybe_mask = {mask, 0, 0, 4};
  const Seq s = sequence(p, 0);
  const ScoreMods m = score_mods(p, s, 0);
  // (0, 0): diagonal offset 2, distance |0 + 2 - 0| = 2.
  EXPECT_NEAR(m.apply(3.0, 0, 0), 5.0 * std::tanh(3.0 / 5.0) - 0.25 * 2 + 0.5, 1e-6);
  EXPECT_NEAR(m.apply(1.0, 1, 3), 5.0 * std::tanh(1.0 / 5.0) - 0.0 - 1.0, 1e-6);
  EXPECT_TRUE(std::isinf(m.apply(1.0, 1, 2)));
  EXPECT_TRUE(mask_tile_empty(m, 1, 2, 2, 3));
  EXPECT_FALSE(mask_tile_empty(m, 0, 2, 2, 3));
}

TEST(DType, Fp16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = fp16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(f))));
      continue;
    }
    EXPECT_EQ(float_to_fp16(f), h) << std::hex << h;
  }
}

TEST(DType, Bf16RoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(float_to_bf16(f), h) << std::hex << h;
  }
}

TEST(DType, RoundsToNearestEven) {
  // Halfway between fp16 1.0 and its successor (1 + 2^-10) rounds to even (1.0); just above rounds up.
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);                          // half of the smallest subnormal: ties to even (0)
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25) * 1.5f), 0x0001);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -16)), 0x3f81);
}

// Splitting the keys in two, running the online update on each half and merging equals one pass.
TEST(SoftmaxState, MergeEqualsSinglePass) {
  const uint64_t seed = fa_test::fresh_seed("SoftmaxState.MergeEqualsSinglePass");
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 3.0);
  for (int trial = 0; trial < 50; ++trial) {
    const int n = 1 + trial % 17, split = trial % (n + 1);
    std::vector<double> s(n), v(n);
    for (int j = 0; j < n; ++j) {
      s[j] = normal(rng);
      v[j] = normal(rng);
    }
    auto run = [&](int lo, int hi, SoftmaxState<double>& st, double& o) {
      o = 0;
      for (int j = lo; j < hi; ++j) {
        const double alpha = st.rescale_to(s[j]);
        const double p = std::exp(s[j] - st.m);
        st.l += p;
        o = o * alpha + p * v[j];
      }
    };
    SoftmaxState<double> all, a, b;
    double o_all, o_a, o_b;
    run(0, n, all, o_all);
    run(0, split, a, o_a);
    run(split, n, b, o_b);
    const auto f = a.merge(b);
    const double o_merged = o_a * f.self + o_b * f.other;
    EXPECT_NEAR(a.lse(), all.lse(), 1e-12);
    EXPECT_NEAR(o_merged * a.inv_l(), o_all * all.inv_l(), 1e-12);
  }
  SoftmaxState<double> empty;
  EXPECT_EQ(empty.inv_l(), 0.0);
  EXPECT_TRUE(std::isinf(empty.lse()) && empty.lse() < 0);
}

}  // namespace
}  // namespace flashattn::detail
