// GPU tests of the sm80 backward (run on a GPU machine only; built in CI). Each case draws fresh
// random q, k, v, dO (seed printed; FLASHATTN_TEST_SEED=N replays), computes O and lse on the host
// in double (O rounded to the storage type), poisons dq, dk, dv with NaN, runs the backend entry
// points and compares with the exact gradients in double. Tolerance rule, per gradient: our max
// error <= 3x the max error of standard attention's backward computed in the same low precision
// (S, P, dP, dS rounded to the storage type, fp32 softmax and accumulation) + a small floor.
// Visibility from problem.hpp's visible_keys, the definition the kernel mirrors.
// The deterministic mode (BackwardParams::deterministic: dQ in its own kernel, no atomics) passes
// the same rule over the same kinds of case, and two of its runs give the same bytes.
// Score modifiers (softcap, ALiBi, bias, mask) go through problem.hpp's ScoreMods::apply on the
// host in both precisions, with the softcap's chain-rule factor 1 - tanh²; head_dim_v != head_dim
// gives v, o, dO and dv their own width.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/problem.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/support/cuda_test_util.hpp"
#include "cuda/support/score_mod_inputs.hpp"
#include "flashattn/flashattn.h"
#include "flashattn/flashattn.hpp"

namespace {

using flashattn::Alignment;
using flashattn::BackwardParams;
using flashattn::DType;
using flashattn::StatusCode;
namespace fd = flashattn::detail;
using fa_cuda_test::DeviceBuffer;
using fa_cuda_test::fresh_seed;
using fa_cuda_test::from_storage;
using fa_cuda_test::round_to;
using fa_cuda_test::ScoreModInputs;
using fa_cuda_test::to_storage;

constexpr double kRatio = 3.0;

// An environment variable set for one scope (the backward's test knobs).
struct ScopedEnv {
  const char* name;
  ScopedEnv(const char* n, const char* value) : name(n) { setenv(n, value, 1); }
  ~ScopedEnv() { unsetenv(name); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
};
constexpr double kFloor = 2e-3;  // relative to max(1, largest exact gradient)

struct Case {
  DType dtype = DType::kBFloat16;
  int64_t batch = 1, sq = 17, sk = 17, hq = 2, hkv = 2, d = 64;
  bool causal = false;
  Alignment alignment = Alignment::kBottomRight;
  int64_t window_left = -1, window_right = -1;
  std::vector<int32_t> varlen_q, varlen_k;  // non-empty: variable-length batch
  float scale = 0.0f;
  bool deterministic = false;
  int64_t dv = 0;  // head_dim_v; 0: d
  float softcap = 0.0f;
  int alibi = 0;  // 0: none, 1: slopes [heads_q], 2: [batch, heads_q]
  int bias = 0;   // 0: none, 1: [B, H, Sq, Sk], 2: [1, H, Sq, Sk] (batch stride 0), 3: [B, 1, 1, Sk]
  DType bias_dtype = DType::kFloat32;
  int mask = 0;  // 0: none, 1: random, 2: key padding [B, 1, 1, Sk], 3: block-sparse with masked rows

  int64_t head_dim_v() const { return dv > 0 ? dv : d; }

  std::string name() const {
    std::ostringstream s;
    s << (dtype == DType::kBFloat16 ? "bf16" : "fp16");
    if (varlen_q.empty()) s << "_b" << batch << "_q" << sq << "_k" << sk;
    else s << "_varlen" << varlen_q.size();
    s << "_h" << hq << "x" << hkv << "_d" << d;
    if (causal) s << (alignment == Alignment::kBottomRight ? "_causalBR" : "_causalTL");
    if (window_left >= 0 || window_right >= 0) s << "_win" << window_left << "_" << window_right;
    if (scale != 0.0f) s << "_scale" << static_cast<int>(scale * 100);
    if (deterministic) s << "_deterministic";
    if (dv > 0) s << "_dv" << dv;
    if (softcap != 0.0f) s << "_softcap" << softcap;
    if (alibi != 0) s << (alibi == 1 ? "_alibiH" : "_alibiBH");
    if (bias != 0)
      s << "_bias" << bias << (bias_dtype == DType::kFloat32 ? "f32" : bias_dtype == DType::kFloat16 ? "f16" : "bf16");
    if (mask != 0) s << (mask == 1 ? "_maskRandom" : mask == 2 ? "_maskKeys" : "_maskBlocks");
    return s.str();
  }
};

// A contiguous [rows, heads, dim] tensor (rows: batch * seqlen, or the varlen total) on both sides.
struct Tensor {
  int64_t rows, heads, dim;
  std::vector<float> host;  // values exactly representable in the storage type
  DeviceBuffer<uint16_t> device;
  Tensor(int64_t r, int64_t h, int64_t d)
      : rows(r), heads(h), dim(d), host(static_cast<size_t>(r * h * d)), device(host.size()) {}
  int64_t at(int64_t r, int64_t h) const { return (r * heads + h) * dim; }
  void upload(DType t) const {
    std::vector<uint16_t> s(host.size());
    for (size_t x = 0; x < s.size(); ++x) s[x] = to_storage(host[x], t);
    ASSERT_EQ(device.copy_from(s.data()), cudaSuccess);
  }
  std::vector<float> download(DType t) const {
    std::vector<uint16_t> s(host.size());
    EXPECT_EQ(device.copy_to(s.data()), cudaSuccess);
    std::vector<float> out(s.size());
    for (size_t x = 0; x < s.size(); ++x) out[x] = from_storage(s[x], t);
    return out;
  }
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out(host.size() * 2);
    EXPECT_EQ(device.copy_to(reinterpret_cast<uint16_t*>(out.data())), cudaSuccess);
    return out;
  }
  // Batch stride for the non-varlen [batch, seqlen, heads, dim] view.
  flashattn::Tensor view(int64_t seqlen) const { return {device.ptr, seqlen * heads * dim, heads * dim, dim}; }
};

struct Gradients {
  std::vector<double> dq, dk, dv;  // exact
  std::vector<float> dq_lowp, dk_lowp, dv_lowp;
};

struct Problem {
  Case c;
  int64_t total_q, total_k;
  Tensor q, k, v, o, d_o, dq, dk, dv;
  std::vector<float> lse;  // [hq, total_q] for varlen, else [batch, hq, sq]
  DeviceBuffer<float> lse_device;
  std::vector<int32_t> cu_q, cu_k;
  DeviceBuffer<int32_t> cu_q_device, cu_k_device;
  ScoreModInputs mods;

  static int64_t sum(const std::vector<int32_t>& v) {
    int64_t s = 0;
    for (int32_t x : v) s += x;
    return s;
  }
  bool varlen() const { return !c.varlen_q.empty(); }

  explicit Problem(const Case& cs)
      : c(cs),
        total_q(cs.varlen_q.empty() ? cs.batch * cs.sq : sum(cs.varlen_q)),
        total_k(cs.varlen_q.empty() ? cs.batch * cs.sk : sum(cs.varlen_k)),
        q(total_q, cs.hq, cs.d), k(total_k, cs.hkv, cs.d), v(total_k, cs.hkv, cs.head_dim_v()),
        o(total_q, cs.hq, cs.head_dim_v()), d_o(total_q, cs.hq, cs.head_dim_v()), dq(total_q, cs.hq, cs.d),
        dk(total_k, cs.hkv, cs.d), dv(total_k, cs.hkv, cs.head_dim_v()) {
    if (varlen()) {
      c.batch = static_cast<int64_t>(c.varlen_q.size());
      c.sq = *std::max_element(c.varlen_q.begin(), c.varlen_q.end());
      c.sk = *std::max_element(c.varlen_k.begin(), c.varlen_k.end());
      cu_q = {0};
      cu_k = {0};
      for (size_t b = 0; b < c.varlen_q.size(); ++b) {
        cu_q.push_back(cu_q.back() + c.varlen_q[b]);
        cu_k.push_back(cu_k.back() + c.varlen_k[b]);
      }
      cu_q_device.upload(cu_q);
      cu_k_device.upload(cu_k);
    }
    lse.assign(static_cast<size_t>(c.hq * total_q), 0.0f);
    lse_device.allocate(lse.size());
  }

  // Random modifiers over [batch, heads_q, seqlen_q, seqlen_k] (varlen: the longest lengths),
  // on both sides.
  void fill_score_mods(std::mt19937_64& rng) {
    const int64_t keys_rows = c.sq * c.sk;
    if (c.alibi != 0) mods.random_alibi(c.alibi, c.batch, c.hq, rng);
    if (c.bias == 1) mods.random_bias(c.bias_dtype, {c.hq * keys_rows, keys_rows, c.sk}, c.batch * c.hq * keys_rows, rng);
    if (c.bias == 2) mods.random_bias(c.bias_dtype, {0, keys_rows, c.sk}, c.hq * keys_rows, rng);
    if (c.bias == 3) mods.random_bias(c.bias_dtype, {c.sk, 0, 0}, c.batch * c.sk, rng);
    if (c.mask != 0) mods.random_mask(c.mask, c.batch, c.hq, c.sq, c.sk, rng);
  }

  BackwardParams params(bool host_side) const {
    BackwardParams p;
    p.dtype = c.dtype;
    p.batch = c.batch;
    p.seqlen_q = c.sq;
    p.seqlen_k = c.sk;
    p.heads_q = c.hq;
    p.heads_kv = c.hkv;
    p.head_dim = c.d;
    p.head_dim_v = c.dv;
    p.q = q.view(c.sq);
    p.k = k.view(c.sk);
    p.v = v.view(c.sk);
    p.o = o.view(c.sq);
    p.d_o = d_o.view(c.sq);
    p.dq = dq.view(c.sq);
    p.dk = dk.view(c.sk);
    p.dv = dv.view(c.sk);
    p.lse = lse_device.ptr;
    if (varlen()) {
      p.maybe_cu_seqlens_q = host_side ? cu_q.data() : cu_q_device.ptr;
      p.maybe_cu_seqlens_k = host_side ? cu_k.data() : cu_k_device.ptr;
      p.lse_head_stride = total_q;
    } else {
      p.lse_batch_stride = c.hq * c.sq;
      p.lse_head_stride = c.sq;
    }
    p.softmax_scale = c.scale;
    p.causal = c.causal;
    p.alignment = c.alignment;
    p.window_left = c.window_left;
    p.window_right = c.window_right;
    p.deterministic = c.deterministic;
    p.softcap = c.softcap;
    mods.set_params(&p, host_side);
    return p;
  }

  // Random inputs; O and lse of the forward in double (O rounded to the storage type); the exact
  // and low-precision gradients. Work is split over (b, h); dK and dV per query head, summed over
  // the group at the end.
  Gradients prepare(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (Tensor* t : {&q, &k, &v, &d_o})
      for (float& x : t->host) x = round_to(normal(rng), c.dtype);
    fill_score_mods(rng);
    const BackwardParams p = params(true);
    const fd::Dims dims = fd::resolve_dims(p);
    const int64_t d = c.d, dvw = c.head_dim_v(), group = c.hq / c.hkv;
    const double softcap = c.softcap;
    Gradients g;
    g.dq.assign(q.host.size(), 0.0);
    g.dq_lowp.assign(q.host.size(), 0.0f);
    std::vector<double> dk_h(static_cast<size_t>(total_k * c.hq * d)), dv_h(static_cast<size_t>(total_k * c.hq * dvw));
    std::vector<float> dk_hl(dk_h.size()), dv_hl(dv_h.size());
    const auto work = [&](int64_t bh) {
      const int64_t b = bh / c.hq, h = bh % c.hq, hk = h / group;
      const fd::Seq s = fd::sequence(p, b);
      // Rows of sequence b in the packed [rows, heads, dim] host tensors.
      const int64_t q_row0 = varlen() ? s.q_row0 : b * c.sq, k_row0 = varlen() ? s.k_row0 : b * c.sk;
      const fd::ScoreMods mods = fd::score_mods(p, s, h);
      std::vector<double> pe, dpe, cap_e;  // cap: the softcap's factor 1 - tanh² of each key
      std::vector<float> pl, dsl, cap_l;
      for (int64_t i = 0; i < s.sq; ++i) {
        const fd::KeyRange keys = fd::visible_keys(p, s, i);
        const int64_t qi = q.at(q_row0 + i, h), oi = o.at(q_row0 + i, h);
        const int64_t li = varlen() ? h * total_q + s.q_row0 + i : (b * c.hq + h) * c.sq + i;
        const int64_t n = keys.hi - keys.lo;
        pe.assign(std::max<int64_t>(n, 0), 0.0);
        pl.assign(pe.size(), 0.0f);
        cap_e.assign(pe.size(), 1.0);
        cap_l.assign(pe.size(), 1.0f);
        double m = -INFINITY;
        float ml = -INFINITY;
        for (int64_t j = 0; j < n; ++j) {
          const int64_t kj = k.at(k_row0 + keys.lo + j, hk);
          double dot = 0.0;
          float dotf = 0.0f;
          for (int64_t x = 0; x < d; ++x) {
            const double prod = double{q.host[qi + x]} * k.host[kj + x];
            dot += prod;
            dotf += static_cast<float>(prod);
          }
          pe[j] = mods.apply(dot * dims.scale, i, keys.lo + j);
          pl[j] = mods.apply(round_to(dotf, c.dtype) * dims.scale, i, keys.lo + j);
          if (softcap != 0.0) {
            const double te = std::tanh(dot * dims.scale / softcap);
            const float tl = std::tanh(round_to(dotf, c.dtype) * dims.scale / c.softcap);
            cap_e[j] = 1.0 - te * te;
            cap_l[j] = 1.0f - tl * tl;
          }
          m = std::max(m, pe[j]);
          ml = std::max(ml, pl[j]);
        }
        if (n <= 0 || m == -INFINITY || ml == -INFINITY) {  // no key visible, or all masked
          lse[li] = -INFINITY;
          for (int64_t x = 0; x < dvw; ++x) o.host[oi + x] = 0.0f;
          continue;
        }
        double l = 0.0;
        float ll = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
          pe[j] = std::exp(pe[j] - m);
          l += pe[j];
          pl[j] = std::exp(pl[j] - ml);
          ll += pl[j];
        }
        std::vector<double> oe(dvw, 0.0);
        std::vector<float> ol(dvw, 0.0f);
        for (int64_t j = 0; j < n; ++j) {
          pe[j] /= l;
          pl[j] = round_to(pl[j] / ll, c.dtype);
          const int64_t vj = v.at(k_row0 + keys.lo + j, hk);
          for (int64_t x = 0; x < dvw; ++x) {
            oe[x] += pe[j] * v.host[vj + x];
            ol[x] += pl[j] * v.host[vj + x];
          }
        }
        lse[li] = static_cast<float>(m + std::log(l));
        double de = 0.0;
        float dl = 0.0f;
        for (int64_t x = 0; x < dvw; ++x) {
          o.host[oi + x] = round_to(static_cast<float>(oe[x]), c.dtype);
          de += oe[x] * d_o.host[oi + x];
          dl += round_to(ol[x], c.dtype) * d_o.host[oi + x];
        }
        dpe.assign(n, 0.0);
        dsl.assign(n, 0.0f);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t kj = k_row0 + keys.lo + j, vj = v.at(kj, hk);
          double dp = 0.0;
          float dpf = 0.0f;
          for (int64_t x = 0; x < dvw; ++x) {
            dp += double{d_o.host[oi + x]} * v.host[vj + x];
            dpf += d_o.host[oi + x] * v.host[vj + x];
          }
          const double ds = pe[j] * (dp - de) * cap_e[j];
          const float dsf = round_to(pl[j] * (round_to(dpf, c.dtype) - dl) * cap_l[j], c.dtype);
          const int64_t kk = k.at(kj, hk), acc = (kj * c.hq + h) * d, acc_v = (kj * c.hq + h) * dvw;
          for (int64_t x = 0; x < d; ++x) {
            g.dq[qi + x] += dims.scale * ds * k.host[kk + x];
            g.dq_lowp[qi + x] += dsf * k.host[kk + x];
            dk_h[acc + x] += dims.scale * ds * q.host[qi + x];
            dk_hl[acc + x] += dsf * q.host[qi + x];
          }
          for (int64_t x = 0; x < dvw; ++x) {
            dv_h[acc_v + x] += pe[j] * d_o.host[oi + x];
            dv_hl[acc_v + x] += pl[j] * d_o.host[oi + x];
          }
        }
        for (int64_t x = 0; x < d; ++x) g.dq_lowp[qi + x] = round_to(g.dq_lowp[qi + x] * dims.scale, c.dtype);
      }
    };
    const int64_t jobs = c.batch * c.hq;
    const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(jobs, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        for (int64_t bh = t; bh < jobs; bh += threads) work(bh);
      });
    for (auto& th : pool) th.join();
    g.dk.assign(k.host.size(), 0.0);
    g.dv.assign(v.host.size(), 0.0);
    g.dk_lowp.assign(k.host.size(), 0.0f);
    g.dv_lowp.assign(v.host.size(), 0.0f);
    for (int64_t r = 0; r < total_k; ++r)
      for (int64_t hk = 0; hk < c.hkv; ++hk) {
        const int64_t out = k.at(r, hk), out_v = v.at(r, hk);
        for (int64_t x = 0; x < d; ++x) {
          float kl = 0.0f;
          for (int64_t hg = 0; hg < group; ++hg) {
            const int64_t acc = (r * c.hq + hk * group + hg) * d + x;
            g.dk[out + x] += dk_h[acc];
            kl += dk_hl[acc] * dims.scale;
          }
          g.dk_lowp[out + x] = round_to(kl, c.dtype);
        }
        for (int64_t x = 0; x < dvw; ++x) {
          float vl = 0.0f;
          for (int64_t hg = 0; hg < group; ++hg) {
            const int64_t acc = (r * c.hq + hk * group + hg) * dvw + x;
            g.dv[out_v + x] += dv_h[acc];
            vl += dv_hl[acc];
          }
          g.dv_lowp[out_v + x] = round_to(vl, c.dtype);
        }
      }
    for (Tensor* t : {&q, &k, &v, &o, &d_o}) t->upload(c.dtype);
    EXPECT_EQ(cudaMemcpy(lse_device.ptr, lse.data(), lse.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    return g;
  }
};

void expect_close(const char* what, const std::vector<float>& ours, const std::vector<double>& exact,
                  const std::vector<float>& lowp) {
  double err = 0.0, err_lowp = 0.0, largest = 1.0;
  size_t worst = 0;
  for (size_t x = 0; x < exact.size(); ++x) {
    const double e = std::fabs(ours[x] - exact[x]);
    if (!(e <= err)) worst = x;  // NaN (an element not written) is the worst
    err = std::isnan(e) ? INFINITY : std::max(err, e);
    err_lowp = std::max(err_lowp, std::fabs(lowp[x] - exact[x]));
    largest = std::max(largest, std::fabs(exact[x]));
  }
  const double bound = kRatio * err_lowp + kFloor * largest;
  EXPECT_LE(err, bound) << what << ": max error " << err << " (at " << worst << ": ours " << ours[worst]
                        << ", exact " << exact[worst] << "), low-precision standard " << err_lowp;
  std::printf("  %s: error %.3g, standard low precision %.3g, bound %.3g\n", what, err, err_lowp, bound);
}

// Runs the backward of p through the public selection point: kAuto picks the GPU path for device
// pointers, and the caller-owned workspace is what backward_workspace_size() says, filled with
// workspace_fill bytes (0xff: NaN, so that nothing is read unwritten). dq, dk and dv are poisoned
// with NaN first. False (with the failure recorded) when any step fails.
bool run_backward(const Problem& pb, const BackwardParams& p, int workspace_fill = 0xff) {
  flashattn::Launch launch;
  size_t bytes = 0;
  const flashattn::Status st = flashattn::backward_workspace_size(p, launch, &bytes);
  EXPECT_TRUE(st.ok()) << st.message;
  DeviceBuffer<uint8_t> workspace;
  if (!st.ok() || workspace.allocate(bytes) != cudaSuccess) {
    ADD_FAILURE() << "no workspace";
    return false;
  }
  bool ok = cudaMemset(workspace.ptr, workspace_fill, workspace.allocated_bytes()) == cudaSuccess;
  for (const Tensor* t : {&pb.dq, &pb.dk, &pb.dv})
    ok = ok && t->device.poison() == cudaSuccess;
  EXPECT_TRUE(ok) << "poisoning failed";
  launch.workspace = workspace.ptr;
  launch.workspace_bytes = bytes;
  const flashattn::Status run = flashattn::backward(p, launch);
  EXPECT_TRUE(run.ok()) << run.message;
  const cudaError_t launched = cudaGetLastError(), done = cudaDeviceSynchronize();
  EXPECT_EQ(launched, cudaSuccess) << cudaGetErrorString(launched);
  EXPECT_EQ(done, cudaSuccess) << cudaGetErrorString(done);
  return ok && run.ok() && launched == cudaSuccess && done == cudaSuccess;
}

void expect_gradients_close(const Problem& pb, const Gradients& ref) {
  expect_close("dq", pb.dq.download(pb.c.dtype), ref.dq, ref.dq_lowp);
  expect_close("dk", pb.dk.download(pb.c.dtype), ref.dk, ref.dk_lowp);
  expect_close("dv", pb.dv.download(pb.c.dtype), ref.dv, ref.dv_lowp);
}

// The bytes of dq, dk and dv after a run.
struct GradientBytes {
  std::vector<uint8_t> dq, dk, dv;
};

// Two deterministic runs of p (the workspace NaN, then zeros; outputs poisoned before each): the
// first within the rule, the second giving the same bytes. `first` gets the first run's bytes.
void check_two_deterministic_runs(const Problem& pb, const BackwardParams& p, const Gradients& ref,
                                  GradientBytes* first) {
  ASSERT_TRUE(run_backward(pb, p, 0xff));
  expect_gradients_close(pb, ref);
  *first = {pb.dq.bytes(), pb.dk.bytes(), pb.dv.bytes()};
  ASSERT_TRUE(run_backward(pb, p, 0x00));
  EXPECT_TRUE(pb.dq.bytes() == first->dq) << "dq differs between two deterministic runs";
  EXPECT_TRUE(pb.dk.bytes() == first->dk) << "dk differs between two deterministic runs";
  EXPECT_TRUE(pb.dv.bytes() == first->dv) << "dv differs between two deterministic runs";
}

void check_case(const Case& cs) {
  Problem pb(cs);
  for (const Tensor* t : {&pb.q, &pb.k, &pb.v, &pb.o, &pb.d_o, &pb.dq, &pb.dk, &pb.dv})
    ASSERT_NE(t->device.ptr, nullptr) << "cudaMalloc failed";
  const Gradients ref = pb.prepare(fresh_seed(cs.name()));
  if (::testing::Test::HasFatalFailure()) return;
  if (run_backward(pb, pb.params(false))) expect_gradients_close(pb, ref);
}

Case make(DType t, int64_t sq, int64_t sk, int64_t d) {
  Case c;
  c.dtype = t;
  c.sq = sq;
  c.sk = sk;
  c.d = d;
  return c;
}

constexpr DType kTypes[] = {DType::kBFloat16, DType::kFloat16};

TEST(Sm80BackwardSmall, SizesNotTileMultiples) {
  for (DType t : kTypes)
    for (int64_t d : {64, 128, 192, 256})
      for (auto [sq, sk] : {std::pair<int64_t, int64_t>{1, 1}, {17, 17}, {113, 203}, {203, 113}, {1, 203}}) {
        Case c = make(t, sq, sk, d);
        c.batch = 2;
        SCOPED_TRACE(c.name());
        check_case(c);
      }
}

// The tail split (backward_params.hpp's tail_split), forced: off (every block whole), on for
// every block with 3 pieces and with 16 (more pieces than steps: some pieces run none and only add
// zeros), and from the third block on (whole blocks beside split ones), over odd sizes, GQA and the
// score-modifier variant (d = 256 has no split: its policy's tail_split is off).
TEST(Sm80BackwardSmall, TailSplitForced) {
  for (const char* pieces : {"1", "3", "16", "2,2"}) {
    const ScopedEnv forced("FLASHATTN_SM80_BACKWARD_PIECES", pieces);
    for (int64_t d : {64, 128, 256})
      for (auto [sq, sk] : {std::pair<int64_t, int64_t>{203, 113}, {1, 203}, {300, 77}}) {
        Case c = make(DType::kBFloat16, sq, sk, d);
        c.batch = 2;
        c.hq = 4;
        c.hkv = 2;
        SCOPED_TRACE(c.name() + " pieces " + pieces);
        check_case(c);
        c.softcap = 5.0f;
        c.alibi = 1;
        SCOPED_TRACE(c.name() + " pieces " + pieces);
        check_case(c);
      }
  }
}

// The tail split as the rule chooses it on this device: more blocks than multiprocessors, a
// partial last wave, enough steps per block (d = 64: 9 key blocks of 128 per head, 24 query tiles
// of 128), so that the blocks run in pieces (the workspace grows by their accumulators).
TEST(Sm80Backward, TailSplitByRule) {
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  Case c = make(DType::kBFloat16, 24 * 128 - 5, 9 * 128 - 3, 64);
  c.hq = c.hkv = sms / 9 + 2;  // 9 hq blocks: one wave and a partial one
  Problem pb(c);
  size_t split = 0, whole = 0;
  ASSERT_TRUE(flashattn::backward_workspace_size(pb.params(false), {}, &split).ok());
  {
    const ScopedEnv no_split("FLASHATTN_SM80_BACKWARD_PIECES", "1");
    ASSERT_TRUE(flashattn::backward_workspace_size(pb.params(false), {}, &whole).ok());
  }
  EXPECT_GT(split, whole) << "the rule did not split " << 9 * c.hq << " blocks on " << sms << " SMs";
  SCOPED_TRACE(c.name());
  check_case(c);
}

TEST(Sm80Backward, Long) {
  for (int64_t d : {64, 128, 256}) {
    Case c = make(DType::kBFloat16, 1023, 1023, d);
    SCOPED_TRACE(c.name());
    check_case(c);
  }
}

TEST(Sm80BackwardSmall, CausalBothAlignments) {
  for (DType t : kTypes)
    for (Alignment a : {Alignment::kBottomRight, Alignment::kTopLeft})
      for (auto [sq, sk] : {std::pair<int64_t, int64_t>{113, 203}, {203, 113}, {17, 17}})
        for (int64_t d : {t == DType::kBFloat16 ? 128 : 64, t == DType::kBFloat16 ? 256 : 192}) {
          Case c = make(t, sq, sk, d);
          c.causal = true;
          c.alignment = a;
          SCOPED_TRACE(c.name());
          check_case(c);
        }
}

TEST(Sm80BackwardSmall, SlidingWindow) {
  for (auto [left, right] : {std::pair<int64_t, int64_t>{37, 5}, {0, 0}, {70, -1}, {-1, 3}}) {
    Case c = make(DType::kBFloat16, 203, 181, 64);
    c.window_left = left;
    c.window_right = right;
    SCOPED_TRACE(c.name());
    check_case(c);
  }
  for (int64_t d : {128, 256}) {
    Case c = make(DType::kFloat16, 203, 113, d);
    c.causal = true;
    c.window_left = 20;
    SCOPED_TRACE(c.name());
    check_case(c);
  }
}

TEST(Sm80BackwardSmall, GqaMqa) {
  for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{6, 2}, {4, 1}})
    for (int64_t d : {128, 256}) {
      Case c = make(DType::kBFloat16, 113, 203, d);
      c.hq = hq;
      c.hkv = hkv;
      c.causal = true;
      SCOPED_TRACE(c.name());
      check_case(c);
    }
}

TEST(Sm80BackwardSmall, VarlenWithEmptySequences) {
  for (bool causal : {false, true})
    for (int64_t d : {64, 192}) {
      Case c = make(DType::kBFloat16, 0, 0, d);
      c.varlen_q = {0, 17, 113, 5, 70};
      c.varlen_k = {13, 0, 203, 64, 70};
      c.hq = 4;
      c.hkv = 2;
      c.causal = causal;
      SCOPED_TRACE(c.name());
      check_case(c);
    }
}

TEST(Sm80BackwardSmall, OtherHeadDimsAndScale) {
  for (int64_t d : {96, 40, 8, 120, 192, 160, 232}) {
    Case c = make(DType::kFloat16, 113, 97, d);
    c.scale = 0.3f;
    SCOPED_TRACE(c.name());
    check_case(c);
  }
}

// The deterministic mode over the cases above: every head dim built (and smaller multiples of 8,
// zero-padded), sizes that are not tile multiples, causal in both alignments (with rows that see
// no key), sliding windows, GQA/MQA, varlen with empty sequences, a custom scale.
std::vector<Case> deterministic_cases() {
  std::vector<Case> cases;
  const auto add = [&](Case c) {
    c.deterministic = true;
    cases.push_back(c);
  };
  for (DType t : kTypes)
    for (int64_t d : {64, 96, 128, 192, 256})
      for (auto [sq, sk] : {std::pair<int64_t, int64_t>{1, 1}, {113, 203}, {203, 113}}) {
        Case c = make(t, sq, sk, d);
        c.batch = 2;
        add(c);
      }
  for (DType t : kTypes)
    for (Alignment a : {Alignment::kBottomRight, Alignment::kTopLeft})
      for (auto [sq, sk] : {std::pair<int64_t, int64_t>{113, 203}, {203, 113}, {17, 17}}) {
        Case c = make(t, sq, sk, t == DType::kBFloat16 ? 128 : 64);
        c.causal = true;
        c.alignment = a;
        add(c);
      }
  for (auto [left, right] : {std::pair<int64_t, int64_t>{37, 5}, {0, 0}, {70, -1}, {-1, 3}}) {
    Case c = make(DType::kBFloat16, 203, 181, 64);
    c.window_left = left;
    c.window_right = right;
    add(c);
  }
  {
    Case c = make(DType::kFloat16, 203, 113, 128);
    c.causal = true;
    c.window_left = 20;
    add(c);
  }
  for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{6, 2}, {4, 1}}) {
    Case c = make(DType::kBFloat16, 113, 203, 128);
    c.hq = hq;
    c.hkv = hkv;
    c.causal = true;
    add(c);
  }
  for (bool causal : {false, true}) {
    Case c = make(DType::kBFloat16, 0, 0, 64);
    c.varlen_q = {0, 17, 113, 5, 70};
    c.varlen_k = {13, 0, 203, 64, 70};
    c.hq = 4;
    c.hkv = 2;
    c.causal = causal;
    add(c);
  }
  for (int64_t d : {40, 8, 120}) {
    Case c = make(DType::kFloat16, 113, 97, d);
    c.scale = 0.3f;
    add(c);
  }
  return cases;
}

TEST(Sm80BackwardSmall, DeterministicMatchesReference) {
  for (const Case& c : deterministic_cases()) {
    SCOPED_TRACE(c.name());
    check_case(c);
  }
}

TEST(Sm80Backward, DeterministicLong) {
  for (int64_t d : {64, 128, 256}) {
    Case c = make(DType::kBFloat16, 1023, 1023, d);
    c.hq = 4;
    c.hkv = 2;
    c.deterministic = true;
    SCOPED_TRACE(c.name());
    check_case(c);
  }
}

// Two deterministic runs give the same bytes of dq, dk and dv, whatever the workspace held before
// (NaN, then zeros) and with outputs poisoned before each; the first run is also checked against
// the reference, so that two equally wrong runs cannot pass. dK and dV come from the same main
// kernel in both modes, so the default mode gives their bytes too, where it splits no block (the
// tail split adds dK and dV with atomics; kept off here, whatever this device's rule would pick).
// The cases have many key blocks adding into each dQ row (long sequences, GQA), where the default
// mode's atomics reorder.
TEST(Sm80BackwardSmall, DeterministicRunsAreBitIdentical) {
  const ScopedEnv whole_blocks("FLASHATTN_SM80_BACKWARD_PIECES", "1");
  Case gqa = make(DType::kBFloat16, 517, 777, 128);
  gqa.batch = 2;
  gqa.hq = 6;
  gqa.hkv = 2;
  gqa.causal = true;
  Case varlen = make(DType::kFloat16, 0, 0, 64);
  varlen.varlen_q = {300, 0, 517, 1};
  varlen.varlen_k = {611, 9, 517, 0};
  varlen.hq = 4;
  varlen.hkv = 1;
  for (Case c : {gqa, varlen}) {
    c.deterministic = true;
    SCOPED_TRACE(c.name());
    Problem pb(c);
    const Gradients ref = pb.prepare(fresh_seed(c.name()));
    if (::testing::Test::HasFatalFailure()) return;
    BackwardParams p = pb.params(false);
    GradientBytes first;
    check_two_deterministic_runs(pb, p, ref, &first);
    if (::testing::Test::HasFatalFailure()) return;
    p.deterministic = false;
    ASSERT_TRUE(run_backward(pb, p, 0xff));
    EXPECT_TRUE(pb.dk.bytes() == first.dk) << "dk differs between the two modes";
    EXPECT_TRUE(pb.dv.bytes() == first.dv) << "dv differs between the two modes";
    expect_close("dq (default mode)", pb.dq.download(c.dtype), ref.dq, ref.dq_lowp);
  }
}

// The deterministic mode needs no dQ accumulator: its workspace is smaller by exactly one fp32
// [batch, heads_q, seqlen_q padded to 128, head dim of the instantiation] array (whole tiles; head
// dim 80 runs on the 96 instantiation), in C++ and through the C ABI, whose v1 callers (no
// deterministic field) get the default mode whatever lies past their struct.
TEST(Sm80BackwardSmall, DeterministicWorkspace) {
  const ScopedEnv whole_blocks("FLASHATTN_SM80_BACKWARD_PIECES", "1");  // no tail-split arrays
  Case c = make(DType::kBFloat16, 113, 203, 80);
  c.batch = 3;
  c.hq = 4;
  c.hkv = 2;
  Problem pb(c);
  BackwardParams p = pb.params(false);
  size_t plain = 0, deterministic = 0;
  ASSERT_TRUE(flashattn::backward_workspace_size(p, {}, &plain).ok());
  p.deterministic = true;
  ASSERT_TRUE(flashattn::backward_workspace_size(p, {}, &deterministic).ok());
  EXPECT_EQ(plain - deterministic, static_cast<size_t>(c.batch * c.hq * 128 * 96 * 4));

  fa_backward_params g;
  fa_backward_params_init(&g);
  EXPECT_EQ(g.deterministic, 0);
  g.dtype = FA_DTYPE_BFLOAT16;
  g.batch = p.batch, g.seqlen_q = p.seqlen_q, g.seqlen_k = p.seqlen_k;
  g.heads_q = p.heads_q, g.heads_kv = p.heads_kv, g.head_dim = p.head_dim;
  const auto to_c = [](const flashattn::ConstTensor& t) {
    return fa_const_tensor{t.data, t.batch_stride, t.row_stride, t.head_stride};
  };
  const auto to_c_out = [](const flashattn::Tensor& t) {
    return fa_tensor{t.data, t.batch_stride, t.row_stride, t.head_stride};
  };
  g.q = to_c(p.q), g.k = to_c(p.k), g.v = to_c(p.v), g.o = to_c(p.o), g.d_o = to_c(p.d_o);
  g.dq = to_c_out(p.dq), g.dk = to_c_out(p.dk), g.dv = to_c_out(p.dv);
  g.lse = p.lse, g.lse_batch_stride = p.lse_batch_stride, g.lse_head_stride = p.lse_head_stride;
  char err[256];
  size_t bytes = 0;
  ASSERT_EQ(fa_backward_workspace_size(&g, nullptr, &bytes, err, sizeof err), FA_STATUS_OK) << err;
  EXPECT_EQ(bytes, plain);
  g.deterministic = 1;
  ASSERT_EQ(fa_backward_workspace_size(&g, nullptr, &bytes, err, sizeof err), FA_STATUS_OK) << err;
  EXPECT_EQ(bytes, deterministic);
  g.struct_size = offsetof(fa_backward_params, deterministic);  // a v1 caller
  ASSERT_EQ(fa_backward_workspace_size(&g, nullptr, &bytes, err, sizeof err), FA_STATUS_OK) << err;
  EXPECT_EQ(bytes, plain);
}

TEST(Sm80BackwardSmall, RefusesWhatItDoesNotDo) {
  Problem pb(make(DType::kBFloat16, 17, 17, 64));
  const BackwardParams base = pb.params(false);
  const auto refused = [](const BackwardParams& p, const char* word) {
    const flashattn::Status st = fd::cuda_sm80_backward_supported(p);
    EXPECT_EQ(st.code, StatusCode::kNotSupported) << word;
    EXPECT_NE(st.message.find(word), std::string::npos) << st.message;
  };
  ASSERT_TRUE(fd::cuda_sm80_backward_supported(base).ok()) << fd::cuda_sm80_backward_supported(base).message;
  BackwardParams p = base;
  p.dtype = DType::kFloat32;
  refused(p, "fp32");
  p = base;
  p.head_dim_v = 36;
  refused(p, "head_dim_v 36");
  p = base;
  p.head_dim_v = 264;
  refused(p, "head_dim_v 264");
  p = base;
  p.head_dim = 264;
  refused(p, "head_dim 264");
  p = base;
  const float slopes[2] = {0.5f, 0.25f};
  p.maybe_alibi_slopes = slopes;  // host memory
  refused(p, "maybe_alibi_slopes is not device memory");
  p = base;
  std::vector<uint16_t> host(17 * 2 * 64);
  p.dq.data = host.data();
  refused(p, "dq is not device memory");
}

// Score modifiers, head_dim_v != head_dim, and both together with GQA, varlen and the
// deterministic mode. Sizes are not tile multiples; the block-sparse mask has whole key tiles
// false and rows that see nothing (lse = -inf: zero gradient).
Case softcap(Case c, float cap) {
  c.softcap = cap;
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
Case causal(Case c) {
  c.causal = true;
  return c;
}
Case all_mods(Case c) { return mask(bias(alibi(softcap(c, 10.0f), 2), 1, DType::kBFloat16), 3); }

void check_all(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name());
    check_case(c);
  }
}

TEST(Sm80BackwardSmall, Softcap) {
  std::vector<Case> cases;
  for (float cap : {30.0f, 2.0f})  // 2 saturates: tanh' near 0 for most scores
    for (int64_t d : {64, 96, 128, 192, 256}) cases.push_back(softcap(make(DType::kBFloat16, 113, 203, d), cap));
  cases.push_back(causal(softcap(make(DType::kFloat16, 203, 113, 128), 2.0f)));
  Case scaled = softcap(make(DType::kFloat16, 97, 131, 64), 5.0f);
  scaled.scale = 0.9f;  // large logits: deep in the saturated range
  cases.push_back(scaled);
  check_all(cases);
}

TEST(Sm80BackwardSmall, Alibi) {
  std::vector<Case> cases;
  for (int kind : {1, 2})
    for (bool is_causal : {false, true})
      for (int64_t d : {64, 128, 192}) {
        Case c = alibi(make(kind == 1 ? DType::kBFloat16 : DType::kFloat16, 113, 203, d), kind);
        c.batch = 2;
        c.hq = 4;
        c.hkv = 2;
        cases.push_back(is_causal ? causal(c) : c);
      }
  Case tl = causal(alibi(make(DType::kBFloat16, 203, 113, 96), 2));
  tl.alignment = Alignment::kTopLeft;
  cases.push_back(tl);
  check_all(cases);
}

TEST(Sm80BackwardSmall, Bias) {
  std::vector<Case> cases;
  for (DType bt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16})
    for (int kind : {1, 2, 3}) {
      Case c = bias(make(DType::kBFloat16, 113, 203, kind == 1 ? 64 : kind == 2 ? 128 : 256), kind, bt);
      c.batch = 2;
      c.hq = 2;
      c.hkv = 1;
      cases.push_back(c);
    }
  cases.push_back(causal(bias(make(DType::kFloat16, 203, 113, 96), 1, DType::kFloat16)));
  cases.push_back(bias(make(DType::kFloat16, 77, 77, 192), 2, DType::kFloat32));
  check_all(cases);
}

TEST(Sm80BackwardSmall, Mask) {
  std::vector<Case> cases;
  for (int kind : {1, 2, 3})
    for (int64_t d : {64, 128, 192}) {
      Case c = mask(make(DType::kBFloat16, 257, 300, d), kind);
      c.batch = 2;
      cases.push_back(c);
    }
  cases.push_back(causal(mask(make(DType::kFloat16, 300, 203, 96), 3)));
  cases.push_back(mask(make(DType::kFloat16, 113, 400, 256), 3));
  check_all(cases);
}

TEST(Sm80BackwardSmall, AllModsGqaVarlen) {
  std::vector<Case> cases;
  for (int64_t d : {64, 96, 128, 192, 256}) {
    Case c = all_mods(make(d % 128 == 0 ? DType::kBFloat16 : DType::kFloat16, 203, 257, d));
    c.batch = 2;
    c.hq = 6;
    c.hkv = 2;
    cases.push_back(causal(c));
  }
  for (int64_t d : {64, 192}) {
    Case c = all_mods(make(DType::kBFloat16, 0, 0, d));
    c.varlen_q = {0, 17, 113, 5, 70};
    c.varlen_k = {13, 0, 203, 64, 70};
    c.hq = 4;
    c.hkv = 1;
    cases.push_back(c);
  }
  Case window = all_mods(make(DType::kFloat16, 203, 181, 128));
  window.window_left = 37;
  window.window_right = 5;
  cases.push_back(window);
  check_all(cases);
}

// (d, dv) pairs: the built ones, (192, 128) and (64, 128), and smaller ones that run on them
// (zero padding), plain and with modifiers.
TEST(Sm80BackwardSmall, HeadDimV) {
  std::vector<Case> cases;
  for (auto [d, dv] : {std::pair<int64_t, int64_t>{192, 128}, {64, 128}, {40, 104}, {160, 120}, {128, 64}})
    for (DType t : kTypes) {
      Case c = make(t, 113, 203, d);
      c.dv = dv;
      c.batch = 2;
      cases.push_back(c);
    }
  for (auto [d, dv] : {std::pair<int64_t, int64_t>{192, 128}, {64, 128}}) {
    Case c = all_mods(make(DType::kBFloat16, 203, 257, d));
    c.dv = dv;
    c.hq = 4;
    c.hkv = 2;
    cases.push_back(causal(c));
    Case v = make(DType::kFloat16, 0, 0, d);
    v.dv = dv;
    v.varlen_q = {0, 17, 113, 5, 70};
    v.varlen_k = {13, 0, 203, 64, 70};
    v.softcap = 2.0f;
    cases.push_back(causal(v));
  }
  check_all(cases);
}

// The deterministic mode with modifiers and (d, dv) pairs: against the reference, and two runs
// give the same bytes.
TEST(Sm80BackwardSmall, DeterministicWithMods) {
  std::vector<Case> cases;
  for (int64_t d : {64, 96, 128, 192, 256}) {
    Case c = all_mods(make(DType::kBFloat16, 203, 257, d));
    c.hq = 4;
    c.hkv = 2;
    cases.push_back(causal(c));
  }
  for (auto [d, dv] : {std::pair<int64_t, int64_t>{192, 128}, {64, 128}}) {
    Case c = softcap(mask(make(DType::kFloat16, 113, 203, d), 2), 2.0f);
    c.dv = dv;
    c.batch = 2;
    cases.push_back(c);
  }
  for (Case c : cases) {
    c.deterministic = true;
    SCOPED_TRACE(c.name());
    Problem pb(c);
    const Gradients ref = pb.prepare(fresh_seed(c.name()));
    if (::testing::Test::HasFatalFailure()) return;
    const BackwardParams p = pb.params(false);
    GradientBytes first;
    check_two_deterministic_runs(pb, p, ref, &first);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(Sm80Backward, LongWithMods) {
  for (int64_t d : {64, 128}) {
    Case c = all_mods(make(DType::kBFloat16, 1023, 1023, d));
    c.hq = 4;
    c.hkv = 2;
    SCOPED_TRACE(c.name());
    check_case(causal(c));
  }
  Case c = softcap(make(DType::kBFloat16, 1023, 1023, 192), 30.0f);
  c.dv = 128;
  SCOPED_TRACE(c.name());
  check_case(c);
}

}  // namespace
