// The FlashAttention forward on the CPU, written once against a simd.hpp vector type V and
// instantiated per ISA (forward.cpp, forward.avx2.cpp, forward.avx512.cpp).
//
// One task = up to kQueryTilesPerTask query tiles of Br rows of one batch entry and of heads that
// share one kv head (consecutive tiles, and the heads of a GQA group). It packs each Qᵀ once,
// then walks the key tiles its rows can see (causal / window range from visible_keys; mask tiles
// that are all zero are skipped), and per tile of Bc keys and per query tile that sees it:
//   Sᵀ = K·Qᵀ                       gemm_st
//   scores_to_logits when needed    causal/window edges, softcap, ALiBi, bias, mask
//   m, l, alpha, Pᵀ = 2^(s - m)     online_softmax
//   O = alpha ⊙ O + P·V             gemm_pv
// and finally O / l and the LSE. fp32 K and V are read in place (any row stride); fp16 / bf16
// tiles are widened into per-worker buffers first (once per task, shared by its query tiles),
// except with kBf16Dot (AVX512-BF16, bf16 inputs) where both GEMMs run on bf16 pairs
// (kernels_bf16.hpp): K in place, V and P packed in pairs. Tasks write disjoint outputs and the
// task split depends on the problem only, so results do not depend on the thread count.
#pragma once

#include "core/isa_namespace.hpp"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "core/problem.hpp"
#include "core/thread_pool.hpp"
#include "cpu/forward.hpp"
#include "cpu/kernels_bf16.hpp"
#include "cpu/kernels_scores.hpp"
#include "cpu/kernels_softmax.hpp"
#include "cpu/kernels_tile.hpp"

namespace flashattn::detail::cpu::FLASHATTN_ISA_NS {

// Internal linkage: this header is compiled once per ISA, and a shared inline copy built with
// AVX-512 flags must not be what the portable path links to.
namespace {
// Pointer to an element of a strided tensor given its element offset.
inline const char* at(const void* base, int64_t offset, size_t esz) {
  return static_cast<const char*>(base) + offset * static_cast<int64_t>(esz);
}
}  // namespace

// One query tile's state: rows [i0, i0 + rows) of head h, its Qᵀ panel, O accumulator and m, l,
// alpha.
struct QueryTile {
  int64_t h, i0;
  int rows;
  ScoreMods mods;
  KeyRange keys;  // keys some row of the tile may see
  bool first;     // no key tile accumulated yet
  float *qt, *o, *m, *l, *alpha;
  int64_t *lo, *hi;  // per-row visible key range
};

template <class V, bool kBf16Dot, int kQVecs>
inline void flash_forward_task(const ForwardParams& p, const Dims& dims, const ForwardScratch& L, char* ws,
                               int64_t b, int64_t h_begin, int64_t h_end, int64_t i_begin, int64_t i_end) {
  constexpr int64_t Br = kQVecs * V::W;
  const Seq s = sequence(p, b);
  i_end = std::min(s.sq, i_end);  // (h_end - h_begin) * (i_end - i_begin) <= kQueryTilesPerTask * Br
  if (i_begin >= i_end) return;
  const size_t esz = dtype_size(p.dtype);
  const int64_t d = dims.head_dim, dv = dims.head_dim_v, hk = h_begin / dims.group;
  const float sc = dims.scale * kLog2e;
  float* st = reinterpret_cast<float*>(ws + L.st);
  float* kbuf = reinterpret_cast<float*>(ws + L.kbuf);
  float* vbuf = reinterpret_cast<float*>(ws + L.vbuf);
  float* row_buf = reinterpret_cast<float*>(ws + L.row_buf);
  [[maybe_unused]] uint32_t* p2 = reinterpret_cast<uint32_t*>(ws + L.p2);
  [[maybe_unused]] uint32_t* v2 = reinterpret_cast<uint32_t*>(ws + L.v2);

  QueryTile tiles[kQueryTilesPerTask];
  int n_tiles = 0;
  for (int64_t h = h_begin; h < h_end; ++h) {
    for (int64_t i0 = i_begin; i0 < i_end; i0 += Br, ++n_tiles) {
      QueryTile& t = tiles[n_tiles];
      char* tw = ws + n_tiles * L.tile_bytes;
      t.h = h;
      t.i0 = i0;
      t.mods = score_mods(p, s, h);
      t.rows = static_cast<int>(std::min<int64_t>(Br, s.sq - i0));
      t.keys = visible_keys(p, s, i0, i0 + t.rows);
      t.first = true;
      t.qt = reinterpret_cast<float*>(tw + L.qt);
      t.o = reinterpret_cast<float*>(tw + L.o);
      t.m = reinterpret_cast<float*>(tw + L.m);
      t.l = reinterpret_cast<float*>(tw + L.l);
      t.alpha = reinterpret_cast<float*>(tw + L.alpha);
      t.lo = reinterpret_cast<int64_t*>(tw + L.vis_lo);
      t.hi = reinterpret_cast<int64_t*>(tw + L.vis_hi);
      const char* q = at(p.q.data, q_offset(p, p.q, s, i0, h), esz);
      if constexpr (kBf16Dot) {
#if defined(__AVX512BF16__)
        bf16::pack_qt(reinterpret_cast<const uint16_t*>(q), p.q.row_stride, t.rows, d, reinterpret_cast<uint32_t*>(t.qt), Br);
#endif
      } else {
        pack_qt<V>(q, p.dtype, p.q.row_stride, t.rows, d, t.qt, Br, row_buf);
      }
      std::fill(t.m, t.m + Br, -std::numeric_limits<float>::infinity());
      std::fill(t.l, t.l + Br, 0.0f);
      for (int r = 0; r < t.rows; ++r) {
        const KeyRange vis = visible_keys(p, s, i0 + r);
        t.lo[r] = vis.lo;
        t.hi[r] = vis.hi;
      }
    }
  }

  // Key tiles over the union of the query tiles' ranges, so each K/V tile is loaded (and widened)
  // once and reused by every query tile of the task, across the heads that share it (GQA).
  int64_t keys_lo = s.sk, keys_hi = 0;
  for (int g = 0; g < n_tiles; ++g) {
    if (tiles[g].keys.empty()) continue;
    keys_lo = std::min(keys_lo, tiles[g].keys.lo);
    keys_hi = std::max(keys_hi, tiles[g].keys.hi);
  }
  for (int64_t j0 = keys_lo; j0 < keys_hi; j0 += kBc) {
    const int64_t n = std::min(kBc, keys_hi - j0);
    const char* kp = at(p.k.data, k_offset(p, p.k, s, j0, hk), esz);
    const char* vp = at(p.v.data, k_offset(p, p.v, s, j0, hk), esz);
    const float *kt = reinterpret_cast<const float*>(kp), *vt = reinterpret_cast<const float*>(vp);
    int64_t ldk = p.k.row_stride, ldv = p.v.row_stride;
    bool widened = kBf16Dot || p.dtype == DType::kFloat32;
    [[maybe_unused]] bool paired = false;
    for (int g = 0; g < n_tiles; ++g) {
      QueryTile& t = tiles[g];
      if (t.keys.empty() || j0 >= t.keys.hi || j0 + n <= t.keys.lo) continue;
      const ScoreMods& mods = t.mods;
      if (mods.mask != nullptr && mask_tile_empty(mods, t.i0, t.i0 + t.rows, j0, j0 + n)) continue;
      if (!widened) {
        for (int64_t j = 0; j < n; ++j) {
          widen_row<V>(kp + j * p.k.row_stride * static_cast<int64_t>(esz), p.dtype, d, kbuf + j * d);
          widen_row<V>(vp + j * p.v.row_stride * static_cast<int64_t>(esz), p.dtype, dv, vbuf + j * L.ldo);
        }
        kt = kbuf, vt = vbuf, ldk = d, ldv = L.ldo;
        widened = true;
      }
      if constexpr (kBf16Dot) {
#if defined(__AVX512BF16__)
        if (!paired) {
          bf16::pack_v(reinterpret_cast<const uint16_t*>(vp), p.v.row_stride, n, dv, v2, L.ldo);
          paired = true;
        }
        bf16::gemm_st<kQVecs>(reinterpret_cast<const uint16_t*>(kp), p.k.row_stride, n, d, reinterpret_cast<const uint32_t*>(t.qt),
                      Br, st, Br);
#endif
      } else {
        gemm_st<V, kQVecs>(kt, ldk, n, d, t.qt, Br, st, Br);
      }
      float sc_tile = sc;
      const bool edge = !tile_fully_visible(p, s, t.i0, t.i0 + t.rows, j0, j0 + n);
      if (mods.has_elementwise() || edge) {
        scores_to_logits<V, kQVecs>(st, Br, n, t.rows, t.i0, j0, dims.scale, mods, edge ? t.lo : nullptr, t.hi);
        sc_tile = kLog2e;
      }
      online_softmax<V, kQVecs>(st, Br, n, sc_tile, t.m, t.l, t.alpha);
      if constexpr (kBf16Dot) {
#if defined(__AVX512BF16__)
        bf16::pack_p<kQVecs>(st, Br, n, p2, Br);
        bf16::gemm_pv(p2, Br, n, t.rows, v2, L.ldo, t.first ? nullptr : t.alpha, t.o, L.ldo);
#endif
      } else {
        gemm_pv<V>(st, Br, n, t.rows, vt, ldv, dv, t.first ? nullptr : t.alpha, t.o, L.ldo);
      }
      t.first = false;
    }
  }

  for (int g = 0; g < n_tiles; ++g) {
    const QueryTile& t = tiles[g];
    if (t.first) std::fill(t.o, t.o + t.rows * L.ldo, 0.0f);
    float* lse = p.maybe_lse ? p.maybe_lse + lse_offset(p, p.lse_batch_stride, p.lse_head_stride, s, t.i0, t.h) : nullptr;
    finalize_rows<V>(t.o, L.ldo, t.rows, dv, t.m, t.l,
                     static_cast<char*>(p.o.data) + q_offset(p, p.o, s, t.i0, t.h) * static_cast<int64_t>(esz), p.dtype,
                     p.o.row_stride, lse, 1);
  }
}

// Query tiles of kQVecs vectors (Br = kQVecs · W rows).
template <class V, bool kBf16Dot, int kQVecs>
void flash_forward_tiles(const ForwardParams& p, void* workspace, int threads) {
  constexpr int64_t Br = kQVecs * V::W;
  static_assert(Br <= kMaxBr, "the scratch layout is sized for kMaxBr query rows");
  const Dims dims = resolve_dims(p);
  const ForwardScratch L = flash_forward_scratch(p);
  // A task holds up to kQueryTilesPerTask query tiles: the heads of one GQA group (up to that
  // many) times consecutive query tiles, fewer when there are few tiles in all so that every
  // worker gets work. Chosen from the problem alone: key tile boundaries follow the task split,
  // and the thread count must not change results.
  const int64_t heads_per_task = std::min<int64_t>(dims.group, kQueryTilesPerTask);
  const int64_t chunks = (dims.group + heads_per_task - 1) / heads_per_task;
  const int64_t total_tiles = (dims.seqlen_q + Br - 1) / Br * dims.batch * dims.heads_q;
  const int64_t rows_per_task = Br * std::clamp<int64_t>(total_tiles / 16, 1, kQueryTilesPerTask / heads_per_task);
  const int64_t n_qt = (dims.seqlen_q + rows_per_task - 1) / rows_per_task;
  const int64_t n_tasks = n_qt * chunks * dims.heads_kv * dims.batch;
  if (n_tasks == 0) return;
  // Head-major, so that the workers share one head's K and V in cache; within a head the last
  // query tiles first: under causal / window they see the most keys (largest tasks first).
  parallel_for(n_tasks, threads, [&](int64_t task, int worker) {
    const int64_t tile = n_qt - 1 - task % n_qt, chunk = task / n_qt % chunks;
    const int64_t hk = task / n_qt / chunks % dims.heads_kv, b = task / n_qt / chunks / dims.heads_kv;
    const int64_t h_begin = hk * dims.group + chunk * heads_per_task;
    const int64_t h_end = std::min(h_begin + heads_per_task, (hk + 1) * dims.group);
    flash_forward_task<V, kBf16Dot, kQVecs>(p, dims, L, static_cast<char*>(workspace) + worker * L.bytes, b, h_begin,
                                            h_end, tile * rows_per_task, (tile + 1) * rows_per_task);
  });
}

template <class V, bool kBf16Dot = false>
void flash_forward(const ForwardParams& p, void* workspace, int threads) {
  // Short query sequences (decoding) take one-vector query tiles rather than pad Br with zeros.
  if (p.seqlen_q <= V::W)
    flash_forward_tiles<V, kBf16Dot, 1>(p, workspace, threads);
  else
    flash_forward_tiles<V, kBf16Dot, Blocking<V>::kBrVecs>(p, workspace, threads);
}

}  // namespace flashattn::detail::cpu
