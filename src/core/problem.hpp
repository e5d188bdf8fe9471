// The shared model of one attention problem: per-sequence geometry, element addressing, which
// keys a query row sees, and the score modifiers (softcap, ALiBi, bias, mask). Every backend
// (reference, standard, CPU flash, later GPU) reads the problem through these functions so that
// they cannot disagree on semantics. Validation (validate.hpp) has run before any of this.
#pragma once

#include "core/isa_namespace.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/dtype.hpp"
#include "flashattn/flashattn.hpp"

namespace flashattn::detail::FLASHATTN_ISA_NS {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();
inline constexpr float kLog2e = 1.4426950408889634f;

// Sizes every backend needs, resolved from AttentionParams once.
struct Dims {
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v;
  int64_t group;  // heads_q / heads_kv: query heads that share one kv head
  float scale;    // resolved softmax scale
  bool varlen;
};

inline Dims resolve_dims(const AttentionParams& p) {
  Dims d{};
  d.batch = p.batch;
  d.seqlen_q = p.seqlen_q;
  d.seqlen_k = p.seqlen_k;
  d.heads_q = p.heads_q;
  d.heads_kv = p.heads_kv;
  d.head_dim = p.head_dim;
  d.head_dim_v = p.head_dim_v > 0 ? p.head_dim_v : p.head_dim;
  d.group = p.heads_kv > 0 ? p.heads_q / p.heads_kv : 1;
  d.scale = p.softmax_scale != 0.0f ? p.softmax_scale
                                    : 1.0f / std::sqrt(static_cast<float>(p.head_dim));
  d.varlen = p.maybe_cu_seqlens_q != nullptr;
  return d;
}

// Where sequence b lives: its lengths and its first row in the (possibly packed) tensors.
struct Seq {
  int64_t b;
  int64_t sq, sk;            // this sequence's lengths
  int64_t q_row0, k_row0;    // first row in packed varlen tensors (0 otherwise)
  int64_t diagonal;          // query i's diagonal is key i + diagonal
};

inline Seq sequence(const AttentionParams& p, int64_t b) {
  Seq s{};
  s.b = b;
  if (p.maybe_cu_seqlens_q != nullptr) {
    s.q_row0 = p.maybe_cu_seqlens_q[b];
    s.k_row0 = p.maybe_cu_seqlens_k[b];
    s.sq = p.maybe_cu_seqlens_q[b + 1] - s.q_row0;
    s.sk = p.maybe_cu_seqlens_k[b + 1] - s.k_row0;
  } else {
    s.q_row0 = s.k_row0 = 0;
    s.sq = p.seqlen_q;
    s.sk = p.seqlen_k;
  }
  s.diagonal = p.alignment == Alignment::kBottomRight ? s.sk - s.sq : 0;
  return s;
}

// Element offset of (row, head) of sequence s in a strided tensor: packed rows from row0 with varlen,
// else batch s.b. Output tensors (Tensor) convert to ConstTensor, so one function serves both.
inline int64_t row_offset(const ConstTensor& t, bool varlen, const Seq& s, int64_t row0, int64_t row, int64_t h) {
  return varlen ? (row0 + row) * t.row_stride + h * t.head_stride
                : s.b * t.batch_stride + row * t.row_stride + h * t.head_stride;
}
// q-side tensors (q, o, d_o, dq) and k-side tensors (k, v, dk, dv).
inline int64_t q_offset(const AttentionParams& p, const ConstTensor& t, const Seq& s, int64_t i, int64_t h) {
  return row_offset(t, p.maybe_cu_seqlens_q != nullptr, s, s.q_row0, i, h);
}
inline int64_t k_offset(const AttentionParams& p, const ConstTensor& t, const Seq& s, int64_t j, int64_t h) {
  return row_offset(t, p.maybe_cu_seqlens_k != nullptr, s, s.k_row0, j, h);
}
// LSE element (b, h, i): [batch, heads, seqlen_q], or [heads, total_q] with varlen.
inline int64_t lse_offset(const AttentionParams& p, int64_t batch_stride, int64_t head_stride,
                          const Seq& s, int64_t i, int64_t h) {
  return p.maybe_cu_seqlens_q ? h * head_stride + s.q_row0 + i
                              : s.b * batch_stride + h * head_stride + i;
}

// Keys [lo, hi) that query row i may see under causal / window (before bias and mask).
struct KeyRange {
  int64_t lo, hi;
  bool empty() const { return hi <= lo; }
};

inline KeyRange visible_keys(const AttentionParams& p, const Seq& s, int64_t i) {
  const int64_t d = i + s.diagonal;
  int64_t lo = 0, hi = s.sk;
  const int64_t right = p.causal ? (p.window_right < 0 ? 0 : std::min<int64_t>(p.window_right, 0))
                                 : p.window_right;
  if (right >= 0) hi = std::min(hi, d + right + 1);
  if (p.window_left >= 0) lo = std::max(lo, d - p.window_left);
  lo = std::min(lo, s.sk);
  hi = std::max(hi, lo);
  return {lo, hi};
}

// Keys that some row in [i0, i1) may see. lo(i) and hi(i) are non-decreasing in i, so this is
// [lo(i0), hi(i1 - 1)): a superset of the union (rows in between that see nothing add nothing),
// exact for every non-empty row. Kernels still apply visible() per element on boundary tiles.
inline KeyRange visible_keys(const AttentionParams& p, const Seq& s, int64_t i0, int64_t i1) {
  const KeyRange first = visible_keys(p, s, i0), last = visible_keys(p, s, i1 - 1);
  return {first.lo, std::max(first.lo, last.hi)};
}

// True when every (i, j) of the tile [i0, i1) x [j0, j1) is inside the causal/window band, so the
// kernel may skip per-element visibility checks there.
inline bool tile_fully_visible(const AttentionParams& p, const Seq& s, int64_t i0, int64_t i1,
                               int64_t j0, int64_t j1) {
  const KeyRange first = visible_keys(p, s, i0), last = visible_keys(p, s, i1 - 1);
  // The band's lower edge is tightest at the last row, the upper edge at the first row.
  return last.lo <= j0 && first.hi >= j1;
}

// Per-(sequence, head) score modifiers beyond scale: softcap, ALiBi, bias, mask.
struct ScoreMods {
  float softcap = 0.0f;      // 0: off
  float alibi_slope = 0.0f;  // 0: off
  int64_t diagonal = 0;
  const void* bias = nullptr;  // row 0 of this (b, h)'s bias; nullptr: none
  DType bias_dtype = DType::kFloat32;
  int64_t bias_row_stride = 0;
  const uint8_t* mask = nullptr;  // row 0 of this (b, h)'s mask; nullptr: none
  int64_t mask_row_stride = 0;

  bool has_elementwise() const {
    return softcap != 0.0f || alibi_slope != 0.0f || bias != nullptr || mask != nullptr;
  }
  float bias_at(int64_t i, int64_t j) const { return load_float(bias, bias_dtype, i * bias_row_stride + j); }
  bool masked_out(int64_t i, int64_t j) const { return mask != nullptr && mask[i * mask_row_stride + j] == 0; }

  // s is the scaled score scale·q·k of (i, j); returns the final logit (or -inf when masked).
  template <class F>
  F apply(F s, int64_t i, int64_t j) const {
    if (softcap != 0.0f) s = F(softcap) * std::tanh(s / F(softcap));
    if (alibi_slope != 0.0f) s -= F(alibi_slope) * F(std::llabs(i + diagonal - j));
    if (bias != nullptr) s += F(bias_at(i, j));
    if (masked_out(i, j)) s = -std::numeric_limits<F>::infinity();
    return s;
  }
};

inline ScoreMods score_mods(const AttentionParams& p, const Seq& s, int64_t h) {
  ScoreMods m;
  m.softcap = p.softcap;
  m.diagonal = s.diagonal;
  if (p.maybe_alibi_slopes != nullptr) m.alibi_slope = p.maybe_alibi_slopes[s.b * p.alibi_batch_stride + h];
  if (p.maybe_bias.data != nullptr) {
    m.bias_dtype = p.maybe_bias.dtype;
    m.bias_row_stride = p.maybe_bias.row_stride;
    m.bias = static_cast<const char*>(p.maybe_bias.data) +
             (s.b * p.maybe_bias.batch_stride + h * p.maybe_bias.head_stride) *
                 static_cast<int64_t>(dtype_size(p.maybe_bias.dtype));
  }
  if (p.maybe_mask.data != nullptr) {
    m.mask_row_stride = p.maybe_mask.row_stride;
    m.mask = p.maybe_mask.data + s.b * p.maybe_mask.batch_stride + h * p.maybe_mask.head_stride;
  }
  return m;
}

// True when the mask hides every key in [j0, j1) for every row in [i0, i1): the tile is skipped.
inline bool mask_tile_empty(const ScoreMods& m, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  if (m.mask == nullptr) return false;
  const int64_t rows = m.mask_row_stride == 0 ? std::min<int64_t>(i1 - i0, 1) : i1 - i0;
  for (int64_t i = i0; i < i0 + rows; ++i) {
    const uint8_t* row = m.mask + i * m.mask_row_stride;
    for (int64_t j = j0; j < j1; ++j)
      if (row[j] != 0) return false;
  }
  return true;
}

}  // namespace flashattn::detail
