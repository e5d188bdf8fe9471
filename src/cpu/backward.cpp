// FlashAttention backward on the CPU (FlashAttention-2 order: key blocks outer).
//
// For one key block K_j, V_j (Bc keys) of one kv head, every query block Q_i (Br rows) of every
// query head that shares the kv head, recomputing P from the forward's LSE:
//   S  = Q_i K_jᵀ               P  = exp(scale·S - LSE_i)   (score modifiers and masks applied)
//   dV_j += Pᵀ dO_i             dP = dO_i V_jᵀ
//   dS = scale · P ∘ (dP - D_i) (· (1 - tanh²) with softcap),  D_i = rowsum(dO_i ∘ O_i)
//   dK_j += dSᵀ Q_i             dQ_i += dS K_j
// dK_j, dV_j live in per-worker fp32 accumulators and are written once. dQ_i gets contributions
// from every key block, so the key blocks of a (batch, kv head) are dealt round-robin to a fixed
// number of splits (chosen from the shape, never the thread count); each split accumulates into
// its own fp32 dQ buffer, and a last pass adds the splits in order. Every sum therefore runs in
// the same order whatever the thread count: the result is bit-for-bit repeatable.
//
// Passes: (1) D per row, and fp32 copies of q and dO when they are fp16/bf16; (2) the tile loop
// above over (batch, kv head, split); (3) dQ = Σ splits, rounded to the storage dtype.
// With bf16 inputs on CPUs with AVX512-BF16, S and dP take bf16 dot products straight from q, k,
// v and dO (exact products); P and dS stay fp32, so the other three products run in fp32.
#include <algorithm>
#include <cstring>

#include "core/backends.hpp"
#include "core/problem.hpp"
#include "core/thread_pool.hpp"
#include "cpu/backward_common.hpp"
#include "cpu/backward_kernels.hpp"
#include "cpu/backward_kernels_impl.hpp"
#include "cpu/isa.hpp"

namespace flashattn::detail {
namespace {

// Portable kernels: 4-lane GCC/Clang vectors, which the baseline x86-64 target maps onto SSE2
// (register tile 4 x 2 of the 16 xmm registers).
struct Portable {
  static constexpr int W = 4, MR = 4, NV = 2;
  typedef float reg __attribute__((vector_size(16)));
  using mask_t = int;  // lanes in use
  static mask_t mask(int n) { return n; }
  static reg zero() { return reg{}; }
  static reg set1(float x) { return reg{x, x, x, x}; }
  static reg load(const float* p) {
    reg r;
    std::memcpy(&r, p, sizeof r);
    return r;
  }
  static reg loadm(const float* p, mask_t n) {
    reg r{};
    std::memcpy(&r, p, sizeof(float) * static_cast<size_t>(n));
    return r;
  }
  static void store(float* p, reg x) { std::memcpy(p, &x, sizeof x); }
  static void storem(float* p, reg x, mask_t n) { std::memcpy(p, &x, sizeof(float) * static_cast<size_t>(n)); }
  static reg bcast(const float* p) { return set1(*p); }
  static reg fma(reg a, reg b, reg c) { return a * b + c; }
  static reg sub(reg a, reg b) { return a - b; }
  static reg mul(reg a, reg b) { return a * b; }
  static reg exp2(reg x) {
    for (int i = 0; i < W; ++i) x[i] = std::exp2(x[i]);
    return x;
  }
  static reg load_bf16(const uint16_t* p) {
    return reg{bf16_to_float(p[0]), bf16_to_float(p[1]), bf16_to_float(p[2]), bf16_to_float(p[3])};
  }
  static reg load_fp16(const uint16_t* p) {
    return reg{fp16_to_float(p[0]), fp16_to_float(p[1]), fp16_to_float(p[2]), fp16_to_float(p[3])};
  }
  static void store_bf16(uint16_t* p, reg x) {
    for (int i = 0; i < W; ++i) p[i] = float_to_bf16(x[i]);
  }
  static void store_fp16(uint16_t* p, reg x) {
    for (int i = 0; i < W; ++i) p[i] = float_to_fp16(x[i]);
  }
};

// Tile shape: Br query rows x Bc keys. Changes speed and the (fixed) summation order, so results
// depend on these, never on the thread count.
constexpr int64_t kBr = 64;
constexpr int64_t kBc = 64;
// dQ splits are chosen so that batch · heads_kv · splits reaches this many tasks when the
// sequence has enough key blocks, as long as the split dQ buffers stay within kMaxSplitDqBytes
// (one split is always allowed: fp32 dQ accumulation needs it). Like the tile shape, these set
// the order of the dQ sums (rounding-level differences) and speed; the thread count never does.
constexpr int64_t kTargetTasks = 16;
constexpr size_t kMaxSplitDqBytes = size_t{128} << 20;
// Pass 1 borrows the score tile as its row buffer (2 · head_dim_v floats).
static_assert(kBr * kBc >= 2 * kCpuMaxHeadDim);

constexpr size_t kAlign = 64;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

struct Plan {
  Dims dims;
  int64_t rows_total;  // query rows over the batch: batch · seqlen_q, or total_q with varlen
  int64_t splits;
  bool stage;          // q and dO are fp16/bf16: keep fp32 copies
  size_t off_d, off_dq, off_q, off_do, off_worker, worker_bytes, total;

  // Offsets into the per-worker scratch.
  size_t w_kp, w_kt, w_vt, w_dk, w_dv, w_x, w_y, w_g, w_lse2;
};

Plan make_plan(const BackwardParams& p, int threads) {
  Plan pl{};
  pl.dims = resolve_dims(p);
  const Dims& d = pl.dims;
  pl.rows_total = d.varlen ? p.maybe_cu_seqlens_q[d.batch] : d.batch * d.seqlen_q;
  const int64_t base = std::max<int64_t>(1, d.batch * d.heads_kv);
  const int64_t key_blocks = std::max<int64_t>(1, (d.seqlen_k + kBc - 1) / kBc);
  const size_t f = sizeof(float);
  const size_t rows_heads = static_cast<size_t>(pl.rows_total * d.heads_q);
  const size_t dq_bytes = std::max<size_t>(1, rows_heads * d.head_dim * f);
  const int64_t by_memory = static_cast<int64_t>(std::max<size_t>(1, kMaxSplitDqBytes / dq_bytes));
  pl.splits = std::clamp<int64_t>((kTargetTasks + base - 1) / base, 1, std::min(key_blocks, by_memory));
  pl.stage = p.dtype != DType::kFloat32;

  size_t off = 0;
  pl.off_d = off;
  off += align_up(rows_heads * f);
  pl.off_dq = off;
  off += align_up(static_cast<size_t>(pl.splits) * rows_heads * d.head_dim * f);
  pl.off_q = off;
  if (pl.stage) off += align_up(rows_heads * d.head_dim * f);
  pl.off_do = off;
  if (pl.stage) off += align_up(rows_heads * d.head_dim_v * f);
  pl.off_worker = off;

  size_t w = 0;
  auto take = [&w](size_t elems) { const size_t at = w; w += align_up(elems * sizeof(float)); return at; };
  pl.w_kp = take(kBc * d.head_dim);
  pl.w_kt = take(kBc * d.head_dim);
  pl.w_vt = take(kBc * d.head_dim_v);
  pl.w_dk = take(kBc * d.head_dim);
  pl.w_dv = take(kBc * d.head_dim_v);
  pl.w_x = take(kBr * kBc);
  pl.w_y = take(kBr * kBc);
  pl.w_g = take(p.softcap != 0.0f ? kBr * kBc : 0);
  pl.w_lse2 = take(kBr);
  pl.worker_bytes = w;
  // parallel_for hands out worker indices below min(threads, tasks) of each pass.
  const int64_t tasks = std::max(d.batch * d.heads_kv * pl.splits, d.batch * d.heads_q);
  pl.total = off + w * static_cast<size_t>(std::clamp<int64_t>(tasks, 1, std::max(threads, 1)));
  return pl;
}

// Views of the workspace.
struct Buffers {
  const Plan& pl;
  char* ws;
  int64_t row0(const AttentionParams& p, const Seq& s) const {
    return p.maybe_cu_seqlens_q ? s.q_row0 : s.b * pl.dims.seqlen_q;
  }
  // [heads_q, rows_total]
  float* d(int64_t h, int64_t row) const {
    return reinterpret_cast<float*>(ws + pl.off_d) + h * pl.rows_total + row;
  }
  // [splits, heads_q, rows_total, head_dim]
  float* dq(int64_t split, int64_t h, int64_t row) const {
    return reinterpret_cast<float*>(ws + pl.off_dq) +
           ((split * pl.dims.heads_q + h) * pl.rows_total + row) * pl.dims.head_dim;
  }
  // [heads_q, rows_total, head_dim(_v)]
  float* q(int64_t h, int64_t row) const {
    return reinterpret_cast<float*>(ws + pl.off_q) + (h * pl.rows_total + row) * pl.dims.head_dim;
  }
  float* d_o(int64_t h, int64_t row) const {
    return reinterpret_cast<float*>(ws + pl.off_do) + (h * pl.rows_total + row) * pl.dims.head_dim_v;
  }
  float* worker(int w, size_t at) const {
    return reinterpret_cast<float*>(ws + pl.off_worker + static_cast<size_t>(w) * pl.worker_bytes + at);
  }
};

// Pass 1, task (batch, query head): D, and the fp32 copies of q and dO.
void prepare_rows(const BackwardKernels& kern, const BackwardParams& p, const Buffers& buf, int64_t b, int64_t h,
                  int worker) {
  const Seq s = sequence(p, b);
  const int64_t r0 = buf.row0(p, s);
  compute_d_rows(kern, p, s, h, 0, s.sq, buf.d(h, r0), buf.worker(worker, buf.pl.w_x));
  if (!buf.pl.stage) return;
  load_rows_f32(kern, p.q.data, p.dtype, s.sq, buf.pl.dims.head_dim,
                [&](int64_t i) { return q_offset(p, p.q, s, i, h); }, buf.q(h, r0), buf.pl.dims.head_dim);
  load_rows_f32(kern, p.d_o.data, p.dtype, s.sq, buf.pl.dims.head_dim_v,
                [&](int64_t i) { return q_offset(p, p.d_o, s, i, h); }, buf.d_o(h, r0), buf.pl.dims.head_dim_v);
}

// One worker's tiles: the key block being processed and the score tiles of one query block.
struct Tiles {
  float* kp;    // K_j   [Bc, d]
  float* kt;    // K_jᵀ  [d, Bc]
  float* vt;    // V_jᵀ  [dv, Bc]
  float* dk;    // dK_j  [Bc, d]
  float* dv;    // dV_j  [Bc, dv]
  float* x;     // S, then P   [Br, Bc]
  float* y;     // dP, then dS [Br, Bc]
  float* g;     // 1 - tanh² with softcap [Br, Bc]
  float* lse2;  // LSE · log2(e) per row, +inf for rows that see no key [Br]
};

// bf16 inputs whose rows are whole 32-bit pairs (even head dims, even element strides, 4-byte
// aligned data) take S = Q Kᵀ and dP = dO Vᵀ through the bf16 dot-product kernel, reading q and
// dO in place: exact products, half the instructions.
bool use_bf16_dots(const BackwardKernels& kern, const BackwardParams& p, const Dims& dm) {
  if (p.dtype != DType::kBFloat16 || kern.gemm_bf16 == nullptr || dm.head_dim % 2 != 0 || dm.head_dim_v % 2 != 0)
    return false;
  for (const ConstTensor* t : {&p.q, &p.k, &p.v, &p.d_o})
    if (reinterpret_cast<uintptr_t>(t->data) % 4 != 0 || t->batch_stride % 2 != 0 || t->row_stride % 2 != 0 ||
        t->head_stride % 2 != 0)
      return false;
  return true;
}

// The 32-bit word holding elements (2c, 2c + 1) of a bf16 row.
uint32_t bf16_pair(const uint16_t* row, int64_t c) {
  uint32_t w;
  std::memcpy(&w, row + 2 * c, sizeof w);
  return w;
}

// K_j as rows and transposed, V_j transposed (staged through the dV accumulator), dK_j = dV_j = 0.
// With bf16 dot products the transposes hold bf16 pairs: kt[c][j] = K[j][2c, 2c + 1] as a word.
void load_key_block(const BackwardKernels& kern, const BackwardParams& p, const Dims& dm, const Seq& s, int64_t kvh,
                    int64_t j0, int64_t keys, bool bf16_dots, const Tiles& t) {
  const int64_t d = dm.head_dim, dv = dm.head_dim_v;
  load_rows_f32(kern, p.k.data, p.dtype, keys, d, [&](int64_t j) { return k_offset(p, p.k, s, j0 + j, kvh); }, t.kp, d);
  if (bf16_dots) {
    auto* kt = reinterpret_cast<uint32_t*>(t.kt);
    auto* vt = reinterpret_cast<uint32_t*>(t.vt);
    for (int64_t j = 0; j < keys; ++j) {
      const auto* k = static_cast<const uint16_t*>(p.k.data) + k_offset(p, p.k, s, j0 + j, kvh);
      const auto* v = static_cast<const uint16_t*>(p.v.data) + k_offset(p, p.v, s, j0 + j, kvh);
      for (int64_t c = 0; c < d / 2; ++c) kt[c * kBc + j] = bf16_pair(k, c);
      for (int64_t c = 0; c < dv / 2; ++c) vt[c * kBc + j] = bf16_pair(v, c);
    }
  } else {
    load_rows_f32(kern, p.v.data, p.dtype, keys, dv, [&](int64_t j) { return k_offset(p, p.v, s, j0 + j, kvh); }, t.dv, dv);
    for (int64_t j = 0; j < keys; ++j) {
      for (int64_t c = 0; c < d; ++c) t.kt[c * kBc + j] = t.kp[j * d + c];
      for (int64_t c = 0; c < dv; ++c) t.vt[c * kBc + j] = t.dv[j * dv + c];
    }
  }
  std::memset(t.dk, 0, static_cast<size_t>(keys * d) * sizeof(float));
  std::memset(t.dv, 0, static_cast<size_t>(keys * dv) * sizeof(float));
}

// Query block operands: fp32 rows (row strides ldq, lddo), and for bf16 dot products the same
// rows as bf16 pairs (q2, do2 non-null; strides in words).
struct QueryRows {
  const float* q;
  int64_t ldq;
  const float* d_o;
  int64_t lddo;
  const uint32_t* q2 = nullptr;
  int64_t ldq2 = 0;
  const uint32_t* do2 = nullptr;
  int64_t lddo2 = 0;
};

// The five products of one (query block, key block) tile; dQ_i accumulates into dq (row stride d).
void query_tile(const BackwardKernels& kern, const BackwardParams& p, const Plan& pl, const Seq& s,
                const ScoreMods& mods, const QueryRows& qr, const float* drow, int64_t i0, int64_t rows, int64_t j0,
                int64_t keys, float* dq, const Tiles& t) {
  const int64_t d = pl.dims.head_dim, dv = pl.dims.head_dim_v;
  const float *qi = qr.q, *doi = qr.d_o;
  const int64_t ldq = qr.ldq, lddo = qr.lddo;
  const bool fast = !mods.has_elementwise() && tile_fully_visible(p, s, i0, i0 + rows, j0, j0 + keys);
  if (qr.q2 != nullptr)                                                              // S  = Q_i K_jᵀ
    kern.gemm_bf16(rows, keys, d / 2, qr.q2, qr.ldq2, reinterpret_cast<const uint32_t*>(t.kt), kBc, t.x, kBc);
  else
    kern.gemm(rows, keys, d, qi, ldq, 1, t.kt, kBc, t.x, kBc, false);
  scores_to_p(kern, p, s, mods, pl.dims.scale, fast, i0, rows, j0, keys, t.x, kBc, t.lse2, t.g);
  if (qr.do2 != nullptr)                                                             // dP = dO_i V_jᵀ
    kern.gemm_bf16(rows, keys, dv / 2, qr.do2, qr.lddo2, reinterpret_cast<const uint32_t*>(t.vt), kBc, t.y, kBc);
  else
    kern.gemm(rows, keys, dv, doi, lddo, 1, t.vt, kBc, t.y, kBc, false);
  p_to_ds(kern, p.softcap != 0.0f, rows, keys, t.x, t.y, kBc, drow, t.lse2, t.g, pl.dims.scale);
  kern.gemm(keys, dv, rows, t.x, 1, kBc, doi, lddo, t.dv, dv, true);                 // dV_j += Pᵀ dO_i
  kern.gemm(keys, d, rows, t.y, 1, kBc, qi, ldq, t.dk, d, true);                     // dK_j += dSᵀ Q_i
  kern.gemm(rows, d, keys, t.y, kBc, 1, t.kp, d, dq, d, true);                       // dQ_i += dS K_j
}

// Pass 2, task (batch, kv head, split): the key blocks jb = split, split + splits, ...
void key_blocks(const BackwardKernels& kern, const BackwardParams& p, const Buffers& buf, int64_t task, int worker) {
  const Plan& pl = buf.pl;
  const Dims& dm = pl.dims;
  const int64_t split = task % pl.splits, kvh = task / pl.splits % dm.heads_kv, b = task / pl.splits / dm.heads_kv;
  const int64_t d = dm.head_dim, dv = dm.head_dim_v;
  const Seq s = sequence(p, b);
  const int64_t r0 = buf.row0(p, s);
  const Tiles t{buf.worker(worker, pl.w_kp), buf.worker(worker, pl.w_kt), buf.worker(worker, pl.w_vt),
                buf.worker(worker, pl.w_dk), buf.worker(worker, pl.w_dv), buf.worker(worker, pl.w_x),
                buf.worker(worker, pl.w_y),  buf.worker(worker, pl.w_g),  buf.worker(worker, pl.w_lse2)};

  for (int64_t h = kvh * dm.group; h < (kvh + 1) * dm.group; ++h)
    std::memset(buf.dq(split, h, r0), 0, static_cast<size_t>(s.sq * d) * sizeof(float));

  const bool bf16_dots = use_bf16_dots(kern, p, dm);
  const int64_t num_kb = (s.sk + kBc - 1) / kBc;
  for (int64_t jb = split; jb < num_kb; jb += pl.splits) {
    const int64_t j0 = jb * kBc, keys = std::min(kBc, s.sk - j0);
    load_key_block(kern, p, dm, s, kvh, j0, keys, bf16_dots, t);
    for (int64_t h = kvh * dm.group; h < (kvh + 1) * dm.group; ++h) {
      const ScoreMods mods = score_mods(p, s, h);
      for (int64_t i0 = 0; i0 < s.sq; i0 += kBr) {
        const int64_t rows = std::min(kBr, s.sq - i0);
        // Tiles outside the causal/window band or wholly masked contribute nothing.
        const KeyRange kr = visible_keys(p, s, i0, i0 + rows);
        if (kr.hi <= j0 || kr.lo >= j0 + keys || mask_tile_empty(mods, i0, i0 + rows, j0, j0 + keys)) continue;
        for (int64_t r = 0; r < rows; ++r) {
          const float lse = p.lse[lse_offset(p, p.lse_batch_stride, p.lse_head_stride, s, i0 + r, h)];
          t.lse2[r] = lse == kNegInf ? -kNegInf : lse * kLog2e;
        }
        // fp32 inputs are read in place (any row stride); fp16/bf16 from pass 1's fp32 copies.
        QueryRows qr;
        if (pl.stage) {
          qr = {buf.q(h, r0 + i0), d, buf.d_o(h, r0 + i0), dv};
        } else {
          qr = {static_cast<const float*>(p.q.data) + q_offset(p, p.q, s, i0, h), p.q.row_stride,
                static_cast<const float*>(p.d_o.data) + q_offset(p, p.d_o, s, i0, h), p.d_o.row_stride};
        }
        if (bf16_dots) {
          qr.q2 = static_cast<const uint32_t*>(p.q.data) + q_offset(p, p.q, s, i0, h) / 2;
          qr.ldq2 = p.q.row_stride / 2;
          qr.do2 = static_cast<const uint32_t*>(p.d_o.data) + q_offset(p, p.d_o, s, i0, h) / 2;
          qr.lddo2 = p.d_o.row_stride / 2;
        }
        query_tile(kern, p, pl, s, mods, qr, buf.d(h, r0 + i0), i0, rows, j0, keys, buf.dq(split, h, r0 + i0), t);
      }
    }
    store_rows(kern, t.dk, d, keys, d, p.dk.data, p.dtype, [&](int64_t j) { return k_offset(p, p.dk, s, j0 + j, kvh); });
    store_rows(kern, t.dv, dv, keys, dv, p.dv.data, p.dtype, [&](int64_t j) { return k_offset(p, p.dv, s, j0 + j, kvh); });
  }
}

// Pass 3, task (batch, query head): dQ = Σ_split partials in split order; rows with LSE = -inf get 0.
void reduce_dq(const BackwardKernels& kern, const BackwardParams& p, const Buffers& buf, int64_t b, int64_t h) {
  const Seq s = sequence(p, b);
  const int64_t r0 = buf.row0(p, s), d = buf.pl.dims.head_dim;
  float* acc = buf.dq(0, h, r0);
  for (int64_t split = 1; split < buf.pl.splits; ++split) {
    const float* part = buf.dq(split, h, r0);
    for (int64_t e = 0; e < s.sq * d; ++e) acc[e] += part[e];
  }
  for (int64_t i = 0; i < s.sq; ++i)
    if (p.lse[lse_offset(p, p.lse_batch_stride, p.lse_head_stride, s, i, h)] == kNegInf)
      std::fill(acc + i * d, acc + (i + 1) * d, 0.0f);
  store_rows(kern, acc, d, s.sq, d, p.dq.data, p.dtype, [&](int64_t i) { return q_offset(p, p.dq, s, i, h); });
}

}  // namespace

const BackwardKernels& backward_kernels_portable() {
  static const BackwardKernels k = make_backward_kernels<Portable>("portable");
  return k;
}

const BackwardKernels& backward_kernels() {
  const CpuFeatures f = cpu_features();
  switch (f.isa) {
    case CpuIsa::kAvx512: return f.avx512_bf16 ? backward_kernels_avx512_bf16() : backward_kernels_avx512();
    case CpuIsa::kAvx2: return backward_kernels_avx2();
    default: return backward_kernels_portable();
  }
}

size_t cpu_backward_workspace(const BackwardParams& p, int threads) { return make_plan(p, threads).total; }

void cpu_backward(const BackwardParams& p, void* workspace, int threads) {
  const Plan pl = make_plan(p, threads);
  const Buffers buf{pl, static_cast<char*>(workspace)};
  const BackwardKernels& kern = backward_kernels();
  const Dims& dm = pl.dims;
  parallel_for(dm.batch * dm.heads_q, threads,
               [&](int64_t t, int w) { prepare_rows(kern, p, buf, t / dm.heads_q, t % dm.heads_q, w); });
  parallel_for(dm.batch * dm.heads_kv * pl.splits, threads,
               [&](int64_t t, int w) { key_blocks(kern, p, buf, t, w); });
  parallel_for(dm.batch * dm.heads_q, threads,
               [&](int64_t t, int) { reduce_dq(kern, p, buf, t / dm.heads_q, t % dm.heads_q); });
}

}  // namespace flashattn::detail
