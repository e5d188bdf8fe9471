// Standard attention backward in fp32: the speed and memory baseline of the flash backward.
// Per (batch, query head) P and dP are materialised as whole [seqlen_q, seqlen_k] matrices in the
// workspace and the five products run as plain GEMMs through the same micro-kernels:
//   S = Q Kᵀ,  P = exp(scale·S - LSE),  dP = dO Vᵀ,  dS = scale · P ∘ (dP - D)
//   dV += Pᵀ dO,  dK += dSᵀ Q,  dQ = dS K
// One task per (batch, kv head) sums dK and dV over the query heads that share it; every sum has a
// fixed order, so results do not depend on the thread count.
#include <algorithm>
#include <cstring>

#include "core/backends.hpp"
#include "core/problem.hpp"
#include "core/thread_pool.hpp"
#include "cpu/backward_common.hpp"
#include "cpu/backward_kernels.hpp"

namespace flashattn::detail {
namespace {

// Key panel width of the packed Kᵀ and Vᵀ, and the depth of one GEMM call along a long reduction
// (keeps the streamed B panel in L2). Change speed only: the micro-kernel adds k in order through
// C, so splitting K into calls keeps every sum's order.
constexpr int64_t kPanel = 64;
constexpr int64_t kDepth = 256;
// Row padding of the [seqlen_q, seqlen_k] matrices: keeps power-of-two lengths from mapping every
// row to the same cache sets when the GEMMs read them by column.
constexpr int64_t kRowPad = 16;

constexpr size_t kAlign = 64;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct Plan {
  Dims dims;
  int64_t ld;       // row stride of S/P and dP/dS
  int64_t panels;   // key panels of seqlen_k
  int workers;
  size_t w_p, w_ds, w_g, w_q, w_do, w_k, w_kt, w_vt, w_dq, w_dk, w_dv, w_lse2, w_d, w_row, worker_bytes;
};

Plan make_plan(const BackwardParams& p, int threads) {
  Plan pl{};
  pl.dims = resolve_dims(p);
  const Dims& dm = pl.dims;
  pl.ld = dm.seqlen_k + kRowPad;
  pl.panels = (dm.seqlen_k + kPanel - 1) / kPanel;
  pl.workers = static_cast<int>(std::clamp<int64_t>(dm.batch * dm.heads_kv, 1, std::max(threads, 1)));
  const int64_t sq = dm.seqlen_q, sk = dm.seqlen_k, d = dm.head_dim, dv = dm.head_dim_v;
  size_t w = 0;
  auto take = [&w](int64_t elems) { const size_t at = w; w += align_up(static_cast<size_t>(elems) * sizeof(float)); return at; };
  pl.w_p = take(sq * pl.ld);
  pl.w_ds = take(sq * pl.ld);
  pl.w_g = take(p.softcap != 0.0f ? sq * pl.ld : 0);
  pl.w_q = take(sq * d);
  pl.w_do = take(sq * dv);
  pl.w_k = take(sk * d);
  pl.w_kt = take(pl.panels * kPanel * d);
  pl.w_vt = take(pl.panels * kPanel * dv);
  pl.w_dq = take(sq * d);
  pl.w_dk = take(sk * d);
  pl.w_dv = take(sk * dv);
  pl.w_lse2 = take(sq);
  pl.w_d = take(sq);
  pl.w_row = take(2 * dv);
  pl.worker_bytes = w;
  return pl;
}

void run_task(const BackwardKernels& kern, const BackwardParams& p, const Plan& pl, char* scratch, int64_t b,
              int64_t kvh) {
  const Dims& dm = pl.dims;
  const int64_t d = dm.head_dim, dv = dm.head_dim_v, ld = pl.ld;
  const Seq s = sequence(p, b);
  const int64_t sq = s.sq, sk = s.sk;
  auto buf = [scratch](size_t at) { return reinterpret_cast<float*>(scratch + at); };
  float *pm = buf(pl.w_p), *ds = buf(pl.w_ds), *g = buf(pl.w_g), *q = buf(pl.w_q), *dob = buf(pl.w_do);
  float *k = buf(pl.w_k), *kt = buf(pl.w_kt), *vt = buf(pl.w_vt), *dq = buf(pl.w_dq), *dk = buf(pl.w_dk);
  float *dvb = buf(pl.w_dv), *lse2 = buf(pl.w_lse2), *drow = buf(pl.w_d);

  // K as rows, Kᵀ and Vᵀ as [panel][dim][kPanel] (V staged through the dV accumulator).
  load_rows_f32(kern, p.k.data, p.dtype, sk, d, [&](int64_t j) { return k_offset(p, p.k, s, j, kvh); }, k, d);
  load_rows_f32(kern, p.v.data, p.dtype, sk, dv, [&](int64_t j) { return k_offset(p, p.v, s, j, kvh); }, dvb, dv);
  for (int64_t j = 0; j < sk; ++j) {
    const int64_t panel = j / kPanel, col = j % kPanel;
    for (int64_t c = 0; c < d; ++c) kt[(panel * d + c) * kPanel + col] = k[j * d + c];
    for (int64_t c = 0; c < dv; ++c) vt[(panel * dv + c) * kPanel + col] = dvb[j * dv + c];
  }
  std::memset(dk, 0, static_cast<size_t>(sk * d) * sizeof(float));
  std::memset(dvb, 0, static_cast<size_t>(sk * dv) * sizeof(float));

  for (int64_t h = kvh * dm.group; h < (kvh + 1) * dm.group; ++h) {
    const ScoreMods mods = score_mods(p, s, h);
    load_rows_f32(kern, p.q.data, p.dtype, sq, d, [&](int64_t i) { return q_offset(p, p.q, s, i, h); }, q, d);
    load_rows_f32(kern, p.d_o.data, p.dtype, sq, dv, [&](int64_t i) { return q_offset(p, p.d_o, s, i, h); }, dob, dv);
    compute_d_rows(kern, p, s, h, 0, sq, drow, buf(pl.w_row));
    for (int64_t i = 0; i < sq; ++i) {
      const float lse = p.lse[lse_offset(p, p.lse_batch_stride, p.lse_head_stride, s, i, h)];
      lse2[i] = lse == kNegInf ? -kNegInf : lse * kLog2e;
    }

    for (int64_t j0 = 0; j0 < sk; j0 += kPanel) {
      const int64_t keys = std::min(kPanel, sk - j0);
      kern.gemm(sq, keys, d, q, d, 1, kt + (j0 / kPanel) * d * kPanel, kPanel, pm + j0, ld, false);
      kern.gemm(sq, keys, dv, dob, dv, 1, vt + (j0 / kPanel) * dv * kPanel, kPanel, ds + j0, ld, false);
      for (int64_t i0 = 0; i0 < sq; i0 += kPanel) {
        const int64_t rows = std::min(kPanel, sq - i0);
        const bool fast = !mods.has_elementwise() && tile_fully_visible(p, s, i0, i0 + rows, j0, j0 + keys);
        scores_to_p(kern, p, s, mods, dm.scale, fast, i0, rows, j0, keys, pm + i0 * ld + j0, ld, lse2 + i0,
                    g + i0 * ld + j0);
      }
    }
    p_to_ds(kern, p.softcap != 0.0f, sq, sk, pm, ds, ld, drow, lse2, g, dm.scale);

    for (int64_t i0 = 0; i0 < sq; i0 += kDepth) {
      const int64_t depth = std::min(kDepth, sq - i0);
      kern.gemm(sk, dv, depth, pm + i0 * ld, 1, ld, dob + i0 * dv, dv, dvb, dv, true);
      kern.gemm(sk, d, depth, ds + i0 * ld, 1, ld, q + i0 * d, d, dk, d, true);
    }
    std::memset(dq, 0, static_cast<size_t>(sq * d) * sizeof(float));
    for (int64_t j0 = 0; j0 < sk; j0 += kDepth)
      kern.gemm(sq, d, std::min(kDepth, sk - j0), ds + j0, ld, 1, k + j0 * d, d, dq, d, true);
    for (int64_t i = 0; i < sq; ++i)
      if (lse2[i] == -kNegInf) std::fill(dq + i * d, dq + (i + 1) * d, 0.0f);
    store_rows(kern, dq, d, sq, d, p.dq.data, p.dtype, [&](int64_t i) { return q_offset(p, p.dq, s, i, h); });
  }
  store_rows(kern, dk, d, sk, d, p.dk.data, p.dtype, [&](int64_t j) { return k_offset(p, p.dk, s, j, kvh); });
  store_rows(kern, dvb, dv, sk, dv, p.dv.data, p.dtype, [&](int64_t j) { return k_offset(p, p.dv, s, j, kvh); });
}

}  // namespace

size_t standard_backward_workspace(const BackwardParams& p, int threads) {
  const Plan pl = make_plan(p, threads);
  return pl.worker_bytes * static_cast<size_t>(pl.workers);
}

void standard_backward(const BackwardParams& p, void* workspace, int threads) {
  const Plan pl = make_plan(p, threads);
  const BackwardKernels& kern = backward_kernels();
  char* ws = static_cast<char*>(workspace);
  parallel_for(pl.dims.batch * pl.dims.heads_kv, pl.workers, [&](int64_t t, int worker) {
    run_task(kern, p, pl, ws + static_cast<size_t>(worker) * pl.worker_bytes, t / pl.dims.heads_kv,
             t % pl.dims.heads_kv);
  });
}

}  // namespace flashattn::detail
