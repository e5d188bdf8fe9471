#include "cuda/support/forward_problem.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>
#include <utility>

#include "core/problem.hpp"

namespace fa_cuda_test {

using flashattn::Alignment;
using flashattn::Backend;
using flashattn::DType;
using flashattn::ForwardParams;
namespace fd = flashattn::detail;

std::string Case::name() const {
  std::ostringstream s;
  s << (dtype == DType::kBFloat16 ? "bf16" : "fp16");
  if (varlen_q.empty()) {
    s << "_b" << batch << "_q" << sq << "_k" << sk;
  } else {
    s << "_varlen" << varlen_q.size();
  }
  s << "_h" << hq << "x" << hkv << "_d" << d;
  if (causal) s << (alignment == Alignment::kBottomRight ? "_causalBR" : "_causalTL");
  const auto bound = [](int64_t w) { return w < 0 ? std::string("inf") : std::to_string(w); };
  if (window_left >= 0 || window_right >= 0) s << "_win" << bound(window_left) << "_" << bound(window_right);
  if (strided) s << "_strided";
  if (!lse) s << "_nolse";
  if (huge_offsets) s << "_huge_offsets";
  if (dv > 0) s << "_dv" << dv;
  if (softcap != 0.0f) s << "_softcap" << static_cast<int>(softcap);
  if (alibi != 0) s << (alibi == 1 ? "_alibiH" : "_alibiBH");
  if (bias != 0)
    s << "_bias" << bias << (bias_dtype == DType::kFloat32 ? "f32" : bias_dtype == DType::kFloat16 ? "f16" : "bf16");
  if (mask != 0) s << (mask == 1 ? "_maskRandom" : mask == 2 ? "_maskKeys" : "_maskBlocks");
  if (scale != 0.0f) s << "_scale" << static_cast<int>(scale * 100);
  if (key_ramp != 0.0f) s << "_ramp" << static_cast<int>(key_ramp);
  return s.str();
}

Case make(DType t, int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d) {
  Case c;
  c.dtype = t;
  c.batch = b, c.sq = sq, c.sk = sk, c.hq = hq, c.hkv = hkv, c.d = d;
  return c;
}
Case causal(Case c, Alignment a) {
  c.causal = true;
  c.alignment = a;
  return c;
}
Case window(Case c, int64_t left, int64_t right) {
  c.window_left = left;
  c.window_right = right;
  return c;
}
Case softcap(Case c, float cap, float scale) {
  c.softcap = cap;
  c.scale = scale;
  return c;
}
Case key_ramp(Case c, float growth) {
  c.key_ramp = growth;
  return c;
}
Case alibi(Case c, int kind) {
  c.alibi = kind;
  return c;
}
Case bias(Case c, int kind, DType t) {
  c.bias = kind;
  c.bias_dtype = t;
  return c;
}
Case mask(Case c, int kind) {
  c.mask = kind;
  return c;
}
Case head_dim_v(Case c, int64_t dv) {
  c.dv = dv;
  return c;
}
Case varlen(Case c, std::vector<int32_t> lengths_q, std::vector<int32_t> lengths_k) {
  c.varlen_q = std::move(lengths_q);
  c.varlen_k = std::move(lengths_k);
  return c;
}

std::vector<Case> base_small_cases() {
  std::vector<Case> cases;
  constexpr DType kBf16 = DType::kBFloat16, kFp16 = DType::kFloat16;
  // Sizes that are not tile multiples, both dtypes, the two bar head dims.
  for (DType t : {kBf16, kFp16})
    for (int64_t d : {64, 128})
      for (int64_t n : {1, 17, 113, 203}) {
        cases.push_back(make(t, 2, n, n, 2, 2, d));
        cases.push_back(causal(make(t, 2, n, n, 2, 2, d)));
      }
  // Sq != Sk both ways, both causal alignments (rows with no visible key under bottom-right).
  for (Alignment a : {Alignment::kBottomRight, Alignment::kTopLeft})
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{113, 203}, {203, 113}, {1, 203}, {203, 1}, {17, 300}}) {
      cases.push_back(causal(make(kBf16, 2, sq, sk, 2, 2, 128), a));
      cases.push_back(causal(make(kFp16, 1, sq, sk, 2, 2, 64), a));
    }
  cases.push_back(make(kBf16, 1, 113, 203, 2, 2, 128));
  cases.push_back(make(kBf16, 1, 203, 113, 2, 2, 64));
  // GQA / MQA.
  cases.push_back(causal(make(kBf16, 2, 113, 203, 6, 2, 128)));
  cases.push_back(make(kFp16, 1, 203, 203, 4, 1, 64));
  return cases;
}

Case strided(Case c) {
  c.strided = true;
  return c;
}

void add_strided_pair(std::vector<Case>& cases, Case c) {
  c.strided = true;
  cases.push_back(c);
  c.lse = false;
  c.scale = 0.3f;
  c.d = 64;
  cases.push_back(c);
}
Case all_mods(Case c, DType bias_dtype) { return mask(bias(alibi(softcap(c, 10.0f), 2), 1, bias_dtype), 3); }

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name(); }

Buffer::Buffer(int64_t b, int64_t r, int64_t h, int64_t dm, bool strided, int64_t min_batch_stride)
    : batch(b), rows(r), heads(h), dim(dm) {
  head_stride = strided ? 2 * dm : dm;               // a gap of dm after every head
  row_stride = heads * head_stride + (strided ? 8 : 0);
  batch_stride = rows * row_stride + (strided ? 8 : 0);
  device_batch_stride = std::max(batch_stride, min_batch_stride);
  host.assign(static_cast<size_t>(std::max<int64_t>(batch * batch_stride, 8)), kPoison16);
  device.allocate(static_cast<size_t>(std::max<int64_t>((batch - 1) * device_batch_stride + batch_stride, 8)));
}

void Buffer::upload() const {
  for (int64_t b = 0; b < batch; ++b)
    ASSERT_EQ(cudaMemcpy(device_entry(b), host.data() + b * batch_stride, batch_stride * 2, cudaMemcpyHostToDevice),
              cudaSuccess);
}

void Buffer::download() {
  for (int64_t b = 0; b < batch; ++b)
    ASSERT_EQ(cudaMemcpy(host.data() + b * batch_stride, device_entry(b), batch_stride * 2, cudaMemcpyDeviceToHost),
              cudaSuccess);
}

namespace {

int64_t total(const std::vector<int32_t>& lens) {
  int64_t t = 0;
  for (int32_t l : lens) t += l;
  return t;
}
int64_t longest(const std::vector<int32_t>& lens) {
  int64_t m = 0;
  for (int32_t l : lens) m = std::max<int64_t>(m, l);
  return m;
}

}  // namespace

Problem::Problem(const Case& cs)
    : c(cs),
      q(cs.varlen_q.empty() ? cs.batch : 1, cs.varlen_q.empty() ? cs.sq : total(cs.varlen_q), cs.hq, cs.d, cs.strided,
        cs.huge_offsets ? kHugeBatchStride : 0),
      k(cs.varlen_q.empty() ? cs.batch : 1, cs.varlen_q.empty() ? cs.sk : total(cs.varlen_k), cs.hkv, cs.d, cs.strided,
        cs.huge_offsets ? kHugeBatchStride : 0),
      v(cs.varlen_q.empty() ? cs.batch : 1, cs.varlen_q.empty() ? cs.sk : total(cs.varlen_k), cs.hkv,
        cs.head_dim_v(), cs.strided, cs.huge_offsets ? kHugeBatchStride : 0),
      o(cs.varlen_q.empty() ? cs.batch : 1, cs.varlen_q.empty() ? cs.sq : total(cs.varlen_q), cs.hq,
        cs.head_dim_v(), cs.strided, cs.huge_offsets ? kHugeBatchStride : 0) {
  if (varlen()) {
    c.batch = static_cast<int64_t>(c.varlen_q.size());
    c.sq = longest(c.varlen_q);
    c.sk = longest(c.varlen_k);
    host_cu_q.push_back(0);
    host_cu_k.push_back(0);
    for (size_t b = 0; b < c.varlen_q.size(); ++b) {
      host_cu_q.push_back(host_cu_q.back() + c.varlen_q[b]);
      host_cu_k.push_back(host_cu_k.back() + c.varlen_k[b]);
    }
    cu_q.upload(host_cu_q);
    cu_k.upload(host_cu_k);
    lse_count = c.hq * total(c.varlen_q);
  } else {
    lse_count = c.batch * c.hq * c.sq;
  }
  if (c.lse) lse.allocate(static_cast<size_t>(std::max<int64_t>(lse_count, 1)));
}

void Problem::fill(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (Buffer* b : {&q, &k, &v})
    for (int64_t bb = 0; bb < b->batch; ++bb)
      for (int64_t r = 0; r < b->rows; ++r) {
        const float ramp = b == &k ? 1.0f + c.key_ramp * static_cast<float>(r) / static_cast<float>(b->rows) : 1.0f;
        for (int64_t h = 0; h < b->heads; ++h)
          for (int64_t i = 0; i < b->dim; ++i) b->host[b->at(bb, r, h, i)] = to_storage(ramp * normal(rng), c.dtype);
      }
  q.upload();
  k.upload();
  v.upload();
  const int64_t keys_rows = c.sq * c.sk;
  if (c.alibi != 0) mods.random_alibi(c.alibi, c.batch, c.hq, rng);
  if (c.bias == 1) mods.random_bias(c.bias_dtype, {c.hq * keys_rows, keys_rows, c.sk}, c.batch * c.hq * keys_rows, rng);
  if (c.bias == 2) mods.random_bias(c.bias_dtype, {0, 0, c.sk}, keys_rows, rng);
  if (c.bias == 3) mods.random_bias(c.bias_dtype, {0, c.sk, 0}, c.hq * c.sk, rng);
  if (c.mask != 0) mods.random_mask(c.mask, c.batch, c.hq, c.sq, c.sk, rng);
}

void Problem::poison() {
  o.poison();
  if (lse.ptr != nullptr) {
    ASSERT_EQ(lse.poison(), cudaSuccess);  // NaN
  }
}

ForwardParams Problem::params(bool host_side) const {
  ForwardParams p;
  p.dtype = c.dtype;
  p.batch = c.batch;
  p.seqlen_q = c.sq;
  p.seqlen_k = c.sk;
  p.heads_q = c.hq;
  p.heads_kv = c.hkv;
  p.head_dim = c.d;
  p.head_dim_v = c.head_dim_v();
  p.q = q.cview();
  p.k = k.cview();
  p.v = v.cview();
  p.o = o.view();
  p.maybe_cu_seqlens_q = !varlen() ? nullptr : host_side ? host_cu_q.data() : cu_q.ptr;
  p.maybe_cu_seqlens_k = !varlen() ? nullptr : host_side ? host_cu_k.data() : cu_k.ptr;
  p.softmax_scale = c.scale;
  p.causal = c.causal;
  p.alignment = c.alignment;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.maybe_lse = lse.ptr;
  p.softcap = c.softcap;
  mods.set_params(&p, host_side);
  if (varlen()) {
    p.lse_head_stride = total(c.varlen_q);
  } else {
    p.lse_batch_stride = c.hq * c.sq;
    p.lse_head_stride = c.sq;
  }
  return p;
}

std::unique_ptr<Problem> new_problem(const Case& cs) {
  auto pb = std::make_unique<Problem>(cs);
  for (const Buffer* buf : {&pb->q, &pb->k, &pb->v, &pb->o}) EXPECT_NE(buf->device.ptr, nullptr) << "cudaMalloc failed";
  pb->fill(fresh_seed(cs.name()));
  return pb;
}

Reference reference(const Problem& pb, const ForwardParams& p) {
  const Case& c = pb.c;
  Reference ref;
  ref.o_exact.assign(pb.o.host.size(), 0.0);
  ref.o_lowp.assign(pb.o.host.size(), 0.0f);
  ref.lse.assign(static_cast<size_t>(pb.lse_count), 0.0);
  ref.empty_row.assign(static_cast<size_t>(pb.lse_count), 0);
  const fd::Dims dims = fd::resolve_dims(p);
  struct Row { int64_t b, h, i; };
  std::vector<Row> rows;
  for (int64_t b = 0; b < c.batch; ++b) {
    const fd::Seq s = fd::sequence(p, b);
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < s.sq; ++i) rows.push_back({b, h, i});
  }
  const auto load = [&](const Buffer& buf, int64_t off) { return static_cast<double>(from_storage(buf.host[off], c.dtype)); };
  const int64_t dv = c.head_dim_v();
  const auto work = [&](size_t begin, size_t end) {
    std::vector<double> s_exact, acc(dv);
    std::vector<float> s_lowp, acc_lowp(dv);
    for (size_t r = begin; r < end; ++r) {
      const auto [b, h, i] = rows[r];
      const fd::Seq s = fd::sequence(p, b);
      const int64_t hk = h / dims.group;
      const fd::KeyRange keys = fd::visible_keys(p, s, i);
      const fd::ScoreMods mods = fd::score_mods(p, s, h);
      const int64_t qo = pb.varlen() ? pb.q.at(0, s.q_row0 + i, h, 0) : pb.q.at(b, i, h, 0);
      const int64_t oo = pb.varlen() ? pb.o.at(0, s.q_row0 + i, h, 0) : pb.o.at(b, i, h, 0);
      const int64_t li = fd::lse_offset(p, p.lse_batch_stride, p.lse_head_stride, s, i, h);
      if (keys.empty()) {
        ref.lse[li] = -INFINITY;
        ref.empty_row[li] = 1;
        continue;  // o stays 0
      }
      const int64_t n = keys.hi - keys.lo;
      s_exact.assign(n, 0.0);
      s_lowp.assign(n, 0.0f);
      double m = -INFINITY;
      float m_lowp = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t ko = pb.varlen() ? pb.k.at(0, s.k_row0 + keys.lo + j, hk, 0) : pb.k.at(b, keys.lo + j, hk, 0);
        double dot = 0.0;
        float dot_f = 0.0f;
        for (int64_t x = 0; x < c.d; ++x) {
          const double prod = load(pb.q, qo + x) * load(pb.k, ko + x);
          dot += prod;
          dot_f += static_cast<float>(prod);
        }
        s_exact[j] = mods.apply(dot * dims.scale, i, keys.lo + j);
        s_lowp[j] = mods.apply(round_to(dot_f, c.dtype) * dims.scale, i, keys.lo + j);
        m = std::max(m, s_exact[j]);
        m_lowp = std::max(m_lowp, s_lowp[j]);
      }
      if (m == -INFINITY) {  // every visible key masked out
        ref.lse[li] = -INFINITY;
        ref.empty_row[li] = 1;
        continue;
      }
      double l = 0.0;
      float l_lowp = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        s_exact[j] = std::exp(s_exact[j] - m);
        l += s_exact[j];
        s_lowp[j] = std::exp(s_lowp[j] - m_lowp);
        l_lowp += s_lowp[j];
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      std::fill(acc_lowp.begin(), acc_lowp.end(), 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const int64_t vo = pb.varlen() ? pb.v.at(0, s.k_row0 + keys.lo + j, hk, 0) : pb.v.at(b, keys.lo + j, hk, 0);
        const double pj = s_exact[j] / l;
        const float pj_lowp = round_to(s_lowp[j] / l_lowp, c.dtype);
        for (int64_t x = 0; x < dv; ++x) {
          const double vx = load(pb.v, vo + x);
          acc[x] += pj * vx;
          acc_lowp[x] += pj_lowp * static_cast<float>(vx);
        }
      }
      for (int64_t x = 0; x < dv; ++x) {
        ref.o_exact[oo + x] = acc[x];
        ref.o_lowp[oo + x] = round_to(acc_lowp[x], c.dtype);
      }
      ref.lse[li] = m + std::log(l);
    }
  };
  const size_t threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back(work, rows.size() * t / threads, rows.size() * (t + 1) / threads);
  for (auto& th : pool) th.join();
  return ref;
}

void run(Problem& pb, Backend backend, std::vector<float>* lse_out) {
  pb.poison();
  const ForwardParams p = pb.params();
  flashattn::Launch launch;
  launch.backend = backend;
  size_t bytes = 1;
  const flashattn::Status ws = flashattn::forward_workspace_size(p, launch, &bytes);
  ASSERT_TRUE(ws.ok()) << ws.message;
  DeviceBuffer<uint8_t> workspace;
  if (bytes > 0) {
    CUDA_OK(workspace.allocate(bytes));
    CUDA_OK(cudaMemset(workspace.ptr, 0xff, bytes));  // NaN floats, counters -1: nothing read unwritten
    launch.workspace = workspace.ptr;
    launch.workspace_bytes = bytes;
  }
  const flashattn::Status st = flashattn::forward(p, launch);
  ASSERT_TRUE(st.ok()) << st.message;
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  pb.o.download();
  if (pb.lse.ptr != nullptr) {
    lse_out->resize(pb.lse_count);
    CUDA_OK(cudaMemcpy(lse_out->data(), pb.lse.ptr, pb.lse_count * 4, cudaMemcpyDeviceToHost));
  }
}

void expect_runs_identical(Problem& pb, Backend backend) {
  std::vector<float> lse_a, lse_b;
  run(pb, backend, &lse_a);
  const std::vector<uint16_t> first = pb.o.host;
  run(pb, backend, &lse_b);
  EXPECT_EQ(first, pb.o.host);
  EXPECT_EQ(0, std::memcmp(lse_a.data(), lse_b.data(), lse_a.size() * 4));
}

std::vector<uint8_t> valid_elements(const Problem& pb, const ForwardParams& p) {
  std::vector<uint8_t> valid(pb.o.host.size(), 0);
  for (int64_t b = 0; b < pb.c.batch; ++b) {
    const fd::Seq s = fd::sequence(p, b);
    for (int64_t i = 0; i < s.sq; ++i)
      for (int64_t h = 0; h < pb.c.hq; ++h)
        for (int64_t x = 0; x < pb.c.head_dim_v(); ++x)
          valid[pb.varlen() ? pb.o.at(0, s.q_row0 + i, h, x) : pb.o.at(b, i, h, x)] = 1;
  }
  return valid;
}

// The output of `pb` (after run) against the reference: within the rule, every element written,
// padding untouched, lse within tolerance, rows with no visible key O = 0 and lse = -inf. Returns
// the low-precision standard attention's error (the rule's yardstick).
double check_against_reference(const Problem& pb, const Reference& ref, const std::vector<float>& lse,
                               const std::string& what) {
  const ForwardParams p = pb.params(/*host_side=*/true);
  const std::vector<uint8_t> valid = valid_elements(pb, p);
  double err = 0.0, err_lowp = 0.0;
  int64_t unwritten = 0, clobbered = 0;
  for (size_t e = 0; e < valid.size(); ++e) {
    if (!valid[e]) {
      clobbered += pb.o.host[e] != kPoison16;
      continue;
    }
    const float got = from_storage(pb.o.host[e], pb.c.dtype);
    if (std::isnan(got)) {
      ++unwritten;
      continue;
    }
    err = std::max(err, std::abs(got - ref.o_exact[e]));
    err_lowp = std::max(err_lowp, std::abs(ref.o_lowp[e] - ref.o_exact[e]));
  }
  EXPECT_EQ(unwritten, 0) << what << ": output elements left NaN (unwritten or NaN)";
  EXPECT_EQ(clobbered, 0) << what << ": elements outside the output's rows/heads/dims were written";
  EXPECT_LE(err, 2.0 * err_lowp + kFloor) << what << ": max |o - o_ref| = " << err
                                          << ", low-precision standard: " << err_lowp;
  std::printf("  %s %s: max err %.3g (low-precision standard %.3g)\n", what.c_str(), pb.c.name().c_str(), err,
              err_lowp);
  std::fflush(stdout);
  if (pb.lse.ptr != nullptr) {
    double lse_err = 0.0;
    int64_t bad_empty = 0;
    for (int64_t li = 0; li < pb.lse_count; ++li) {
      if (ref.empty_row[li]) {
        bad_empty += !(std::isinf(lse[li]) && lse[li] < 0);
        continue;
      }
      const double e = std::abs(lse[li] - ref.lse[li]) / std::max(1.0, std::abs(ref.lse[li]));
      lse_err = std::isnan(e) ? INFINITY : std::max(lse_err, e);
    }
    EXPECT_EQ(bad_empty, 0) << what << ": rows with no visible key must get lse = -inf";
    EXPECT_LE(lse_err, kLseTolerance) << what << ": lse relative error";
  }
  int64_t nonzero_empty = 0;
  for (int64_t b = 0; b < pb.c.batch; ++b) {
    const fd::Seq s = fd::sequence(p, b);
    for (int64_t i = 0; i < s.sq; ++i)
      for (int64_t h = 0; h < pb.c.hq; ++h)
        if (ref.empty_row[fd::lse_offset(p, p.lse_batch_stride, p.lse_head_stride, s, i, h)])
          for (int64_t x = 0; x < pb.c.head_dim_v(); ++x)
            nonzero_empty += from_storage(pb.o.host[pb.varlen() ? pb.o.at(0, s.q_row0 + i, h, x) : pb.o.at(b, i, h, x)],
                                          pb.c.dtype) != 0.0f;
  }
  EXPECT_EQ(nonzero_empty, 0) << what << ": rows with no visible key must get O = 0";
  return err_lowp;
}

}  // namespace fa_cuda_test
