#include "cpu/backward_common.hpp"

#include <cmath>
#include <cstdlib>
#include <limits>

namespace flashattn::detail {

void compute_d_rows(const BackwardKernels& kern, const BackwardParams& p, const Seq& s, int64_t h, int64_t i0,
                    int64_t rows, float* d, float* row_buf) {
  const int64_t dv = resolve_dims(p).head_dim_v;
  float* o = row_buf;
  float* d_o = row_buf + dv;
  for (int64_t r = 0; r < rows; ++r) {
    load_rows_f32(kern, p.o.data, p.dtype, 1, dv, [&](int64_t) { return q_offset(p, p.o, s, i0 + r, h); }, o, dv);
    load_rows_f32(kern, p.d_o.data, p.dtype, 1, dv, [&](int64_t) { return q_offset(p, p.d_o, s, i0 + r, h); }, d_o, dv);
    double sum = 0.0;
    for (int64_t c = 0; c < dv; ++c) sum += static_cast<double>(o[c]) * d_o[c];
    d[r] = static_cast<float>(sum);
  }
}

namespace {
void zero_dead_rows(int64_t rows, int64_t cols, float* x, int64_t ld, const float* lse2) {
  for (int64_t r = 0; r < rows; ++r)
    if (lse2[r] == std::numeric_limits<float>::infinity())
      for (int64_t c = 0; c < cols; ++c) x[r * ld + c] = 0.0f;
}
}  // namespace

void scores_to_p(const BackwardKernels& kern, const AttentionParams& p, const Seq& s, const ScoreMods& mods,
                 float scale, bool fast, int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* x,
                 int64_t ld, const float* lse2, float* g) {
  if (fast) {
    kern.exp2_rows(x, ld, rows, cols, scale * kLog2e, lse2);
  } else {
    // Logits with the same operation order as ScoreMods::apply, then one vectorised exp pass.
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = i0 + r;
      const KeyRange kr = visible_keys(p, s, i);
      float* xr = x + r * ld;
      float* gr = g + r * ld;
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t j = j0 + c;
        if (j < kr.lo || j >= kr.hi || mods.masked_out(i, j)) {
          xr[c] = kNegInf;
          if (mods.softcap != 0.0f) gr[c] = 0.0f;
          continue;
        }
        float v = scale * xr[c];
        if (mods.softcap != 0.0f) {
          const float t = std::tanh(v / mods.softcap);
          v = mods.softcap * t;
          gr[c] = 1.0f - t * t;
        }
        if (mods.alibi_slope != 0.0f) v -= mods.alibi_slope * static_cast<float>(std::llabs(i + mods.diagonal - j));
        if (mods.bias != nullptr) v += mods.bias_at(i, j);
        xr[c] = v;
      }
    }
    kern.exp2_rows(x, ld, rows, cols, kLog2e, lse2);
  }
  zero_dead_rows(rows, cols, x, ld, lse2);
}

void p_to_ds(const BackwardKernels& kern, bool softcap, int64_t rows, int64_t cols, const float* pm, float* dp,
             int64_t ld, const float* d, const float* lse2, const float* g, float scale) {
  kern.ds_rows(pm, dp, ld, rows, cols, d, scale);
  if (softcap)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) dp[r * ld + c] *= g[r * ld + c];
  zero_dead_rows(rows, cols, dp, ld, lse2);
}

}  // namespace flashattn::detail
