#include "support/test_util.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>

#include "core/dtype.hpp"
#include "core/problem.hpp"

namespace fa_test {

using flashattn::detail::float_to_bf16;
using flashattn::detail::float_to_fp16;
using flashattn::detail::load_float;
using flashattn::detail::store_float;

namespace {

double round_to(DType t, double x) {
  const float f = static_cast<float>(x);
  switch (t) {
    case DType::kFloat32: return f;
    case DType::kFloat16: return flashattn::detail::fp16_to_float(float_to_fp16(f));
    case DType::kBFloat16: return flashattn::detail::bf16_to_float(float_to_bf16(f));
  }
  return f;
}

const char* dtype_name(DType t) { return flashattn::to_string(t); }

// Layout of one tensor: contiguous, or padded/interleaved when the case asks for strides.
HostTensor make_tensor(DType dtype, int64_t batch, int64_t rows, int64_t heads, int64_t dim, bool strided) {
  HostTensor t;
  t.dtype = dtype;
  t.batch = batch;
  t.rows = rows;
  t.heads = heads;
  t.dim = dim;
  if (strided) {
    // Heads padded by 8 elements, rows by one extra head's worth, batches by 24 elements: nothing is
    // contiguous beyond the last dimension, as with packed QKV or sliced views.
    t.head_stride = dim + 8;
    t.row_stride = (heads + 1) * t.head_stride;
    t.batch_stride = rows * t.row_stride + 24;
  } else {
    t.head_stride = dim;
    t.row_stride = heads * dim;
    t.batch_stride = rows * heads * dim;
  }
  const int64_t elems = std::max<int64_t>(1, batch * t.batch_stride);
  const int64_t words = dtype == DType::kFloat32 ? elems : (elems + 1) / 2;
  t.storage.assign(static_cast<size_t>(words), 0.0f);
  return t;
}

std::atomic<uint64_t> g_seed_counter{0};

}  // namespace

bool sanitizer_run() {
  const char* env = std::getenv("FLASHATTN_TEST_SANITIZER");
  return env != nullptr && env[0] == '1';
}

uint64_t fresh_seed(const std::string& what) {
  uint64_t seed;
  if (const char* env = std::getenv("FLASHATTN_TEST_SEED")) {
    seed = std::strtoull(env, nullptr, 10) + g_seed_counter.fetch_add(1);
  } else {
    std::random_device rd;
    seed = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (g_seed_counter.fetch_add(1) * 0x9E3779B97F4A7C15ull);
  }
  std::printf("[ seed     ] %s: %llu\n", what.c_str(), static_cast<unsigned long long>(seed));
  if (::testing::UnitTest::GetInstance()->current_test_info() != nullptr)
    ::testing::Test::RecordProperty("seed_" + std::to_string(g_seed_counter.load()), std::to_string(seed));
  return seed;
}

std::string Case::name() const {
  std::ostringstream s;
  s << dtype_name(dtype) << " b" << batch << " sq" << seqlen_q << " sk" << seqlen_k << " hq" << heads_q << " hkv"
    << heads_kv << " d" << head_dim;
  if (head_dim_v > 0) s << " dv" << head_dim_v;
  if (causal) s << (alignment == Alignment::kBottomRight ? " causal-br" : " causal-tl");
  else if (alignment == Alignment::kTopLeft) s << " top-left";
  if (window_left >= 0 || window_right >= 0) s << " window(" << window_left << "," << window_right << ")";
  if (softcap > 0) s << " softcap" << softcap;
  if (alibi != AlibiKind::kNone) s << (alibi == AlibiKind::kPerHead ? " alibi[h]" : " alibi[b,h]");
  if (bias) s << " bias(" << dtype_name(bias_dtype) << (bias_broadcast ? ",bcast" : "") << ")";
  if (mask != MaskKind::kNone)
    s << " mask(" << (mask == MaskKind::kRandom ? "random" : mask == MaskKind::kKeyPadding ? "keypad" : "blocks") << ")";
  if (!varlen_q.empty()) {
    s << " varlen[";
    for (size_t i = 0; i < varlen_q.size(); ++i) s << (i ? "," : "") << varlen_q[i] << "/" << varlen_k[i];
    s << "]";
  }
  if (strided) s << " strided";
  if (scale != 0.0f) s << " scale" << scale;
  return s.str();
}

double HostTensor::get(int64_t b, int64_t r, int64_t h, int64_t d) const {
  return load_float(storage.data(), dtype, offset(b, r, h, d));
}
void HostTensor::set(int64_t b, int64_t r, int64_t h, int64_t d, double x) {
  store_float(storage.data(), dtype, offset(b, r, h, d), static_cast<float>(x));
}
void HostTensor::fill_storage_nan() {
  if (dtype == DType::kFloat32) {
    std::fill(storage.begin(), storage.end(), std::numeric_limits<float>::quiet_NaN());
  } else {
    const uint16_t nan16 = dtype == DType::kFloat16 ? 0x7e00 : 0x7fc0;
    auto* p = reinterpret_cast<uint16_t*>(storage.data());
    std::fill(p, p + storage.size() * 2, nan16);
  }
}

Problem make_problem(const Case& c_in, uint64_t seed) {
  Problem p;
  p.c = c_in;
  p.seed = seed;
  Case& c = p.c;
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);

  const bool varlen = !c.varlen_q.empty();
  int64_t rows_q = c.seqlen_q, rows_k = c.seqlen_k, tensor_batch = c.batch;
  if (varlen) {
    c.batch = static_cast<int64_t>(c.varlen_q.size());
    p.cu_q.assign(1, 0);
    p.cu_k.assign(1, 0);
    c.seqlen_q = c.seqlen_k = 0;
    for (size_t b = 0; b < c.varlen_q.size(); ++b) {
      p.cu_q.push_back(p.cu_q.back() + c.varlen_q[b]);
      p.cu_k.push_back(p.cu_k.back() + c.varlen_k[b]);
      c.seqlen_q = std::max<int64_t>(c.seqlen_q, c.varlen_q[b]);
      c.seqlen_k = std::max<int64_t>(c.seqlen_k, c.varlen_k[b]);
    }
    rows_q = p.cu_q.back();
    rows_k = p.cu_k.back();
    tensor_batch = 1;
  }
  const int64_t dv = c.head_dim_v > 0 ? c.head_dim_v : c.head_dim;
  p.q = make_tensor(c.dtype, tensor_batch, rows_q, c.heads_q, c.head_dim, c.strided);
  p.k = make_tensor(c.dtype, tensor_batch, rows_k, c.heads_kv, c.head_dim, c.strided);
  p.v = make_tensor(c.dtype, tensor_batch, rows_k, c.heads_kv, dv, c.strided);
  p.o = make_tensor(c.dtype, tensor_batch, rows_q, c.heads_q, dv, c.strided);
  p.d_o = make_tensor(c.dtype, tensor_batch, rows_q, c.heads_q, dv, c.strided);
  p.dq = make_tensor(c.dtype, tensor_batch, rows_q, c.heads_q, c.head_dim, c.strided);
  p.dk = make_tensor(c.dtype, tensor_batch, rows_k, c.heads_kv, c.head_dim, c.strided);
  p.dv = make_tensor(c.dtype, tensor_batch, rows_k, c.heads_kv, dv, c.strided);

  auto fill = [&](HostTensor& t) {
    for (int64_t b = 0; b < t.batch; ++b)
      for (int64_t r = 0; r < t.rows; ++r)
        for (int64_t h = 0; h < t.heads; ++h)
          for (int64_t d = 0; d < t.dim; ++d) t.set(b, r, h, d, c.input_scale * normal(rng));
  };
  fill(p.q);
  fill(p.k);
  fill(p.v);
  fill(p.d_o);

  if (c.alibi != AlibiKind::kNone) {
    const int64_t n = c.alibi == AlibiKind::kPerHead ? c.heads_q : c.batch * c.heads_q;
    for (int64_t i = 0; i < n; ++i) p.slopes.push_back(static_cast<float>(0.02 + 0.5 * uniform(rng)));
  }
  if (c.bias) {
    const int64_t bb = c.bias_broadcast ? 1 : c.batch;
    const int64_t elems = std::max<int64_t>(1, bb * c.heads_q * c.seqlen_q * c.seqlen_k);
    p.bias_storage.assign(static_cast<size_t>(c.bias_dtype == DType::kFloat32 ? elems : (elems + 1) / 2), 0.0f);
    for (int64_t i = 0; i < bb * c.heads_q * c.seqlen_q * c.seqlen_k; ++i)
      store_float(p.bias_storage.data(), c.bias_dtype, i, static_cast<float>(normal(rng)));
  }
  switch (c.mask) {
    case MaskKind::kNone: break;
    case MaskKind::kRandom:
      p.mask_storage.resize(static_cast<size_t>(std::max<int64_t>(1, c.batch * c.heads_q * c.seqlen_q * c.seqlen_k)));
      for (auto& m : p.mask_storage) m = uniform(rng) < 0.7 ? 1 : 0;
      break;
    case MaskKind::kKeyPadding:
      p.mask_storage.resize(static_cast<size_t>(std::max<int64_t>(1, c.batch * c.seqlen_k)));
      for (int64_t b = 0; b < c.batch; ++b)
        for (int64_t j = 0; j < c.seqlen_k; ++j)
          p.mask_storage[b * c.seqlen_k + j] = j < c.seqlen_k - 3 * (b + 1) ? 1 : 0;
      break;
    case MaskKind::kBlockSparse: {
      constexpr int64_t kBlock = 32;
      const int64_t nbq = (c.seqlen_q + kBlock - 1) / kBlock, nbk = (c.seqlen_k + kBlock - 1) / kBlock;
      std::vector<uint8_t> on(static_cast<size_t>(std::max<int64_t>(1, nbq * nbk)));
      for (auto& x : on) x = uniform(rng) < 0.5 ? 1 : 0;
      p.mask_storage.resize(static_cast<size_t>(std::max<int64_t>(1, c.seqlen_q * c.seqlen_k)));
      for (int64_t i = 0; i < c.seqlen_q; ++i)
        for (int64_t j = 0; j < c.seqlen_k; ++j)
          p.mask_storage[i * c.seqlen_k + j] = on[(i / kBlock) * nbk + j / kBlock];
      break;
    }
  }
  const int64_t lse_rows = varlen ? rows_q : c.batch * c.seqlen_q;
  p.lse.assign(static_cast<size_t>(std::max<int64_t>(1, c.heads_q * lse_rows)), 0.0f);
  p.poison_outputs();
  return p;
}

void Problem::poison_outputs() {
  o.fill_storage_nan();
  dq.fill_storage_nan();
  dk.fill_storage_nan();
  dv.fill_storage_nan();
  std::fill(lse.begin(), lse.end(), std::numeric_limits<float>::quiet_NaN());
}

namespace {
void fill_attention(Problem& p, flashattn::AttentionParams& a) {
  const Case& c = p.c;
  a.dtype = c.dtype;
  a.batch = c.batch;
  a.seqlen_q = c.seqlen_q;
  a.seqlen_k = c.seqlen_k;
  a.heads_q = c.heads_q;
  a.heads_kv = c.heads_kv;
  a.head_dim = c.head_dim;
  a.head_dim_v = c.head_dim_v;
  a.q = p.q.cview();
  a.k = p.k.cview();
  a.v = p.v.cview();
  if (!p.cu_q.empty()) {
    a.maybe_cu_seqlens_q = p.cu_q.data();
    a.maybe_cu_seqlens_k = p.cu_k.data();
  }
  a.softmax_scale = c.scale;
  a.causal = c.causal;
  a.alignment = c.alignment;
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.softcap = c.softcap;
  if (c.alibi != AlibiKind::kNone) {
    a.maybe_alibi_slopes = p.slopes.data();
    a.alibi_batch_stride = c.alibi == AlibiKind::kPerHead ? 0 : c.heads_q;
  }
  if (c.bias) {
    const int64_t plane = c.seqlen_q * c.seqlen_k;
    a.maybe_bias = {p.bias_storage.data(), c.bias_dtype, c.bias_broadcast ? 0 : c.heads_q * plane, plane, c.seqlen_k};
  }
  switch (c.mask) {
    case MaskKind::kNone: break;
    case MaskKind::kRandom:
      a.maybe_mask = {p.mask_storage.data(), c.heads_q * c.seqlen_q * c.seqlen_k, c.seqlen_q * c.seqlen_k, c.seqlen_k};
      break;
    case MaskKind::kKeyPadding: a.maybe_mask = {p.mask_storage.data(), c.seqlen_k, 0, 0}; break;
    case MaskKind::kBlockSparse: a.maybe_mask = {p.mask_storage.data(), 0, 0, c.seqlen_k}; break;
  }
}

int64_t lse_batch_stride(const Problem& p) { return p.cu_q.empty() ? p.c.heads_q * p.c.seqlen_q : 0; }
int64_t lse_head_stride(const Problem& p) { return p.cu_q.empty() ? p.c.seqlen_q : p.cu_q.back(); }
}  // namespace

flashattn::ForwardParams Problem::forward_params() {
  flashattn::ForwardParams f;
  fill_attention(*this, f);
  f.o = o.view();
  if (c.lse) {
    f.maybe_lse = lse.data();
    f.lse_batch_stride = lse_batch_stride(*this);
    f.lse_head_stride = lse_head_stride(*this);
  }
  return f;
}

flashattn::BackwardParams Problem::backward_params() {
  flashattn::BackwardParams g;
  fill_attention(*this, g);
  g.o = o.cview();
  g.d_o = d_o.cview();
  g.lse = lse.data();
  g.lse_batch_stride = lse_batch_stride(*this);
  g.lse_head_stride = lse_head_stride(*this);
  g.dq = dq.view();
  g.dk = dk.view();
  g.dv = dv.view();
  return g;
}

Problem as_fp32(const Problem& p) {
  Case c = p.c;
  c.dtype = DType::kFloat32;
  Problem q = make_problem(c, p.seed);
  auto copy = [](const HostTensor& from, HostTensor& to) {
    for (int64_t b = 0; b < from.batch; ++b)
      for (int64_t r = 0; r < from.rows; ++r)
        for (int64_t h = 0; h < from.heads; ++h)
          for (int64_t d = 0; d < from.dim; ++d) to.set(b, r, h, d, from.get(b, r, h, d));
  };
  copy(p.q, q.q);
  copy(p.k, q.k);
  copy(p.v, q.v);
  copy(p.d_o, q.d_o);
  q.bias_storage = p.bias_storage;
  q.mask_storage = p.mask_storage;
  q.slopes = p.slopes;
  return q;
}

void run_forward(Problem& p, Backend backend, int threads) {
  flashattn::Launch launch;
  launch.backend = backend;
  launch.num_threads = threads;
  const flashattn::Status s = flashattn::forward(p.forward_params(), launch);
  ASSERT_TRUE(s.ok()) << flashattn::to_string(backend) << " forward failed: " << s.message << " [" << p.c.name() << "]";
}

void run_backward(Problem& p, Backend backend, int threads) {
  flashattn::Launch launch;
  launch.backend = backend;
  launch.num_threads = threads;
  const flashattn::Status s = flashattn::backward(p.backward_params(), launch);
  ASSERT_TRUE(s.ok()) << flashattn::to_string(backend) << " backward failed: " << s.message << " [" << p.c.name() << "]";
}

namespace {
void accumulate(Error& e, double got, double want) {
  if (std::isnan(want)) return;
  if (std::isfinite(want)) e.max_ref = std::max(e.max_ref, std::abs(want));
  if (std::isnan(got)) {
    ++e.nan_count;
    e.max_abs = std::numeric_limits<double>::infinity();
    return;
  }
  if (std::isinf(want) || std::isinf(got)) {
    if (got != want) e.max_abs = std::numeric_limits<double>::infinity();
    return;
  }
  e.max_abs = std::max(e.max_abs, std::abs(got - want));
}
}  // namespace

Error compare(const HostTensor& got, const HostTensor& want, const Problem& shape, bool k_side) {
  Error e;
  const bool varlen = !shape.cu_q.empty();
  for (int64_t b = 0; b < shape.c.batch; ++b) {
    const int64_t len = k_side ? shape.seq_len_k(b) : shape.seq_len_q(b);
    const int64_t row0 = varlen ? (k_side ? shape.cu_k[b] : shape.cu_q[b]) : 0;
    const int64_t tb = varlen ? 0 : b;
    for (int64_t r = 0; r < len; ++r)
      for (int64_t h = 0; h < got.heads; ++h)
        for (int64_t d = 0; d < got.dim; ++d) accumulate(e, got.get(tb, row0 + r, h, d), want.get(tb, row0 + r, h, d));
  }
  return e;
}

Error compare_lse(const Problem& got, const Problem& want) {
  Error e;
  const bool varlen = !got.cu_q.empty();
  for (int64_t b = 0; b < got.c.batch; ++b)
    for (int64_t h = 0; h < got.c.heads_q; ++h)
      for (int64_t i = 0; i < got.seq_len_q(b); ++i) {
        const int64_t off = varlen ? h * lse_head_stride(got) + got.cu_q[b] + i
                                   : b * lse_batch_stride(got) + h * lse_head_stride(got) + i;
        accumulate(e, got.lse[off], want.lse[off]);
      }
  return e;
}

// Textbook attention with every intermediate rounded to `t`, as a framework's fp16/bf16 "math"
// attention computes it: S = round(q·k), round(scale·S), modifiers in fp32, P = round(softmax(S)),
// O = round(P·V); backward likewise with each GEMM output rounded.
LowpErrors lowp_standard_errors(const Problem& exact, DType t, bool backward) {
  using namespace flashattn::detail;
  Problem lp = exact;  // same inputs; outputs recomputed below
  const flashattn::ForwardParams f = lp.forward_params();
  const Dims dims = resolve_dims(f);
  const int64_t dq_dim = dims.head_dim, dvv = dims.head_dim_v;
  const bool varlen = dims.varlen;
  lp.dk.fill_storage_nan();
  lp.dv.fill_storage_nan();
  std::vector<double> dk_acc, dv_acc;
  for (int64_t b = 0; b < dims.batch; ++b) {
    const Seq s = sequence(f, b);
    const int64_t tb = varlen ? 0 : b, q0 = varlen ? s.q_row0 : 0, k0 = varlen ? s.k_row0 : 0;
    for (int64_t hk = 0; hk < dims.heads_kv; ++hk) {
      dk_acc.assign(static_cast<size_t>(s.sk * dq_dim), 0.0);
      dv_acc.assign(static_cast<size_t>(s.sk * dvv), 0.0);
      for (int64_t h = hk * dims.group; h < (hk + 1) * dims.group; ++h) {
        const ScoreMods mods = score_mods(f, s, h);
        std::vector<double> S(static_cast<size_t>(s.sq * s.sk)), P(S.size());
        for (int64_t i = 0; i < s.sq; ++i) {
          const KeyRange kr = visible_keys(f, s, i);
          double mx = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j < s.sk; ++j) {
            double x = -std::numeric_limits<double>::infinity();
            if (j >= kr.lo && j < kr.hi) {
              double dot = 0;
              for (int64_t d = 0; d < dq_dim; ++d) dot += exact.q.get(tb, q0 + i, h, d) * exact.k.get(tb, k0 + j, hk, d);
              x = round_to(t, round_to(t, dot) * double(round_to(t, dims.scale)));
              x = round_to(t, mods.apply<float>(static_cast<float>(x), i, j));
            }
            S[i * s.sk + j] = x;
            mx = std::max(mx, x);
          }
          double sum = 0;
          for (int64_t j = 0; j < s.sk; ++j) {
            const double e = std::isinf(mx) && mx < 0 ? 0.0 : std::exp(S[i * s.sk + j] - mx);
            P[i * s.sk + j] = e;
            sum += e;
          }
          for (int64_t j = 0; j < s.sk; ++j) P[i * s.sk + j] = sum > 0 ? round_to(t, P[i * s.sk + j] / sum) : 0.0;
          for (int64_t d = 0; d < dvv; ++d) {
            double acc = 0;
            for (int64_t j = 0; j < s.sk; ++j) acc += P[i * s.sk + j] * exact.v.get(tb, k0 + j, hk, d);
            lp.o.set(tb, q0 + i, h, d, round_to(t, acc));
          }
        }
        if (!backward) continue;
        for (int64_t i = 0; i < s.sq; ++i) {
          double D = 0;
          for (int64_t d = 0; d < dvv; ++d) D += exact.d_o.get(tb, q0 + i, h, d) * lp.o.get(tb, q0 + i, h, d);
          std::vector<double> dS(static_cast<size_t>(s.sk));
          for (int64_t j = 0; j < s.sk; ++j) {
            double dp = 0;
            for (int64_t d = 0; d < dvv; ++d) dp += exact.d_o.get(tb, q0 + i, h, d) * exact.v.get(tb, k0 + j, hk, d);
            const double p = P[i * s.sk + j];
            double ds = round_to(t, p * (round_to(t, dp) - D));
            if (mods.softcap != 0.0f && p != 0.0) {
              // S holds the capped logit minus the other modifiers; recover tanh from the capped score.
              double dot = 0;
              for (int64_t d = 0; d < dq_dim; ++d) dot += exact.q.get(tb, q0 + i, h, d) * exact.k.get(tb, k0 + j, hk, d);
              const double th = std::tanh(dims.scale * dot / mods.softcap);
              ds = round_to(t, ds * (1.0 - th * th));
            }
            dS[j] = ds;
            for (int64_t d = 0; d < dvv; ++d) dv_acc[j * dvv + d] += p * exact.d_o.get(tb, q0 + i, h, d);
            for (int64_t d = 0; d < dq_dim; ++d) dk_acc[j * dq_dim + d] += dims.scale * ds * exact.q.get(tb, q0 + i, h, d);
          }
          for (int64_t d = 0; d < dq_dim; ++d) {
            double acc = 0;
            for (int64_t j = 0; j < s.sk; ++j) acc += dS[j] * exact.k.get(tb, k0 + j, hk, d);
            lp.dq.set(tb, q0 + i, h, d, round_to(t, dims.scale * acc));
          }
        }
      }
      if (!backward) continue;
      for (int64_t j = 0; j < s.sk; ++j) {
        for (int64_t d = 0; d < dq_dim; ++d) lp.dk.set(tb, k0 + j, hk, d, round_to(t, dk_acc[j * dq_dim + d]));
        for (int64_t d = 0; d < dvv; ++d) lp.dv.set(tb, k0 + j, hk, d, round_to(t, dv_acc[j * dvv + d]));
      }
    }
  }
  LowpErrors e;
  e.o = compare(lp.o, exact.o, exact, false).max_abs;
  if (backward) {
    e.dq = compare(lp.dq, exact.dq, exact, false).max_abs;
    e.dk = compare(lp.dk, exact.dk, exact, true).max_abs;
    e.dv = compare(lp.dv, exact.dv, exact, true).max_abs;
  }
  return e;
}

}  // namespace fa_test
