// Standard attention in fp32, the speed and memory baseline: per (batch, head) the whole score
// matrix is materialised (as Sᵀ [seqlen_k, seqlen_q], the layout of kernels_tile.hpp), turned into
// logits with the score mods and masks, soft-maxed over every key at once and multiplied by V.
// It uses the same micro-kernels as the flash forward, so the comparison measures the algorithm.
#pragma once

#include "core/isa_namespace.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/problem.hpp"
#include "core/thread_pool.hpp"
#include "cpu/forward.hpp"
#include "cpu/forward_impl.hpp"
#include "cpu/kernels_scores.hpp"
#include "cpu/kernels_softmax.hpp"
#include "cpu/kernels_tile.hpp"

namespace flashattn::detail::cpu::FLASHATTN_ISA_NS {

template <class V>
inline void standard_forward_head(const ForwardParams& p, const Dims& dims, const StandardScratch& L, char* ws,
                                  int64_t b, int64_t h) {
  constexpr int64_t Br = Blocking<V>::kBrVecs * V::W;
  const Seq s = sequence(p, b);
  if (s.sq == 0) return;
  const size_t esz = dtype_size(p.dtype);
  const int64_t d = dims.head_dim, dv = dims.head_dim_v, hk = h / dims.group, lds = L.lds;
  const ForwardScratch& P = L.panel;
  float* st = reinterpret_cast<float*>(ws + L.s);
  float* qt = reinterpret_cast<float*>(ws + P.qt);
  float* o = reinterpret_cast<float*>(ws + P.o);
  float* m = reinterpret_cast<float*>(ws + P.m);
  float* l = reinterpret_cast<float*>(ws + P.l);
  float* alpha = reinterpret_cast<float*>(ws + P.alpha);
  int64_t* lo = reinterpret_cast<int64_t*>(ws + P.vis_lo);
  int64_t* hi = reinterpret_cast<int64_t*>(ws + P.vis_hi);
  float* row_buf = reinterpret_cast<float*>(ws + P.row_buf);

  const char* kp = at(p.k.data, k_offset(p, p.k, s, 0, hk), esz);
  const char* vp = at(p.v.data, k_offset(p, p.v, s, 0, hk), esz);
  const float *kt = reinterpret_cast<const float*>(kp), *vt = reinterpret_cast<const float*>(vp);
  int64_t ldk = p.k.row_stride, ldv = p.v.row_stride;
  if (p.dtype != DType::kFloat32) {
    float* kbuf = reinterpret_cast<float*>(ws + L.kbuf);
    float* vbuf = reinterpret_cast<float*>(ws + L.vbuf);
    for (int64_t j = 0; j < s.sk; ++j) {
      widen_row<V>(kp + j * p.k.row_stride * static_cast<int64_t>(esz), p.dtype, d, kbuf + j * d);
      widen_row<V>(vp + j * p.v.row_stride * static_cast<int64_t>(esz), p.dtype, dv, vbuf + j * P.ldo);
    }
    kt = kbuf, vt = vbuf, ldk = d, ldv = P.ldo;
  }

  // 1. Sᵀ = K·Qᵀ for every query panel.
  for (int64_t i0 = 0; i0 < s.sq; i0 += Br) {
    const int rows = static_cast<int>(std::min<int64_t>(Br, s.sq - i0));
    pack_qt<V>(at(p.q.data, q_offset(p, p.q, s, i0, h), esz), p.dtype, p.q.row_stride, rows, d, qt, Br, row_buf);
    gemm_st<V>(kt, ldk, s.sk, d, qt, Br, st + i0, lds);
  }
  // 2. Logits: scores outside the causal/window band and masked ones become -inf.
  const ScoreMods mods = score_mods(p, s, h);
  const bool elementwise = mods.has_elementwise();
  float sc = dims.scale * kLog2e;
  if (elementwise || !tile_fully_visible(p, s, 0, s.sq, 0, s.sk)) {
    for (int64_t i0 = 0; i0 < s.sq; i0 += Br) {
      const int rows = static_cast<int>(std::min<int64_t>(Br, s.sq - i0));
      for (int r = 0; r < rows; ++r) {
        const KeyRange vis = visible_keys(p, s, i0 + r);
        lo[r] = vis.lo;
        hi[r] = vis.hi;
      }
      scores_to_logits<V>(st + i0, lds, s.sk, rows, i0, 0, dims.scale, mods, lo, hi);
    }
    sc = kLog2e;
  }
  // 3. Softmax over all keys, O = P·V, normalise.
  for (int64_t i0 = 0; i0 < s.sq; i0 += Br) {
    const int rows = static_cast<int>(std::min<int64_t>(Br, s.sq - i0));
    std::fill(m, m + Br, -std::numeric_limits<float>::infinity());
    std::fill(l, l + Br, 0.0f);
    online_softmax<V>(st + i0, lds, s.sk, sc, m, l, alpha);
    gemm_pv<V>(st + i0, lds, s.sk, rows, vt, ldv, dv, nullptr, o, P.ldo);
    float* lse = p.maybe_lse ? p.maybe_lse + lse_offset(p, p.lse_batch_stride, p.lse_head_stride, s, i0, h) : nullptr;
    finalize_rows<V>(o, P.ldo, rows, dv, m, l,
                     static_cast<char*>(p.o.data) + q_offset(p, p.o, s, i0, h) * static_cast<int64_t>(esz), p.dtype,
                     p.o.row_stride, lse, 1);
  }
}

template <class V>
void standard_forward(const ForwardParams& p, void* workspace, int threads) {
  static_assert(Blocking<V>::kBrVecs * V::W <= kMaxBr, "the scratch layout is sized for kMaxBr query rows");
  const Dims dims = resolve_dims(p);
  const StandardScratch L = standard_forward_scratch(p);
  parallel_for(dims.batch * dims.heads_q, threads, [&](int64_t task, int worker) {
    standard_forward_head<V>(p, dims, L, static_cast<char*>(workspace) + worker * L.bytes, task / dims.heads_q,
                             task % dims.heads_q);
  });
}

}  // namespace flashattn::detail::cpu
