// GPU tests of the Hopper forward (Backend::kCudaSm90; sm_90 devices only: elsewhere every test
// skips with a message). Same rule as the sm80 tests (sm80_forward_tests.cpp, whose problem and
// reference helpers are repeated below): fresh random inputs (seed printed; FLASHATTN_TEST_SEED=N
// replays), outputs poisoned with NaN before each run, every element compared with textbook
// attention in double precision; our error <= 2x the error of standard attention computed in the
// same low precision + a small floor; NaN never passes; padding and gaps must stay the poison.
// Then: sm90 against sm80 on the same inputs, the kAuto selection (sm90 where it takes the
// problem, sm80 for the rest), and refusals that name what is not taken, writing nothing.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/dtype.hpp"
#include "core/problem.hpp"
#include "cuda/cuda_backend.hpp"

namespace {

using flashattn::Alignment;
using flashattn::DType;
using flashattn::ForwardParams;
using flashattn::StatusCode;
namespace fd = flashattn::detail;

constexpr double kFloor = 1e-3;
constexpr double kLseTolerance = 2e-3;

#define CUDA_OK(expr)                                                              \
  do {                                                                             \
    const cudaError_t e_ = (expr);                                                 \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);         \
  } while (0)

uint64_t fresh_seed(const std::string& what) {
  uint64_t seed;
  if (const char* env = std::getenv("FLASHATTN_TEST_SEED")) {
    seed = std::strtoull(env, nullptr, 10);
  } else {
    seed = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
  }
  std::printf("[seed] %s: FLASHATTN_TEST_SEED=%llu\n", what.c_str(), static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  return seed;
}

struct Case {
  DType dtype = DType::kBFloat16;
  int64_t batch = 1, sq = 17, sk = 17, hq = 2, hkv = 2, d = 64;
  bool causal = false;
  Alignment alignment = Alignment::kBottomRight;
  int64_t window_left = -1, window_right = -1;
  std::vector<int32_t> varlen_q, varlen_k;  // non-empty: variable-length batch
  bool strided = false;  // rows padded by 8 elements and heads interleaved: gaps must stay untouched
  bool lse = true;
  float scale = 0.0f;
  bool huge_offsets = false;  // batch entries 2^31 + 1024 elements apart on the device
  int64_t dv = 0;             // head_dim_v; 0: d
  float softcap = 0.0f;
  int alibi = 0;              // 0: none, 1: slopes per head, 2: per (batch, head)
  int bias = 0;               // 0: none, 1: [B, H, Sq, Sk], 2: [Sq, Sk] (batch, head broadcast), 3: [H, Sk] (rows too)
  DType bias_dtype = DType::kFloat32;
  int mask = 0;               // 0: none, 1: random, 2: key padding [B, Sk], 3: block-sparse with masked rows

  int64_t head_dim_v() const { return dv > 0 ? dv : d; }

  std::string name() const {
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
    return s.str();
  }
};

uint16_t to_storage(float x, DType t) {
  return t == DType::kBFloat16 ? fd::float_to_bf16(x) : fd::float_to_fp16(x);
}
float from_storage(uint16_t x, DType t) { return t == DType::kBFloat16 ? fd::bf16_to_float(x) : fd::fp16_to_float(x); }
float round_to(float x, DType t) { return from_storage(to_storage(x, t), t); }

// One [batch, rows, heads, dim] tensor (varlen: batch 1, rows = total) in host and device memory.
// The host copy is compact per batch entry; on the device, entries may lie device_batch_stride
// elements apart (above 2^31 to exercise 64-bit offsets), the gaps never copied.
struct Buffer {
  int64_t batch = 0, rows = 0, heads = 0, dim = 0;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;  // host layout
  int64_t device_batch_stride = 0;
  std::vector<uint16_t> host;
  void* device = nullptr;
  size_t device_elems = 0;

  Buffer(int64_t b, int64_t r, int64_t h, int64_t dm, bool strided, int64_t min_batch_stride)
      : batch(b), rows(r), heads(h), dim(dm) {
    head_stride = strided ? 2 * dm : dm;               // a gap of dm after every head
    row_stride = heads * head_stride + (strided ? 8 : 0);
    batch_stride = rows * row_stride + (strided ? 8 : 0);
    device_batch_stride = std::max(batch_stride, min_batch_stride);
    host.assign(static_cast<size_t>(std::max<int64_t>(batch * batch_stride, 8)), 0xffff);  // NaN in both types
    device_elems = static_cast<size_t>(std::max<int64_t>((batch - 1) * device_batch_stride + batch_stride, 8));
    if (cudaMalloc(&device, device_elems * 2) != cudaSuccess) device = nullptr;
  }
  ~Buffer() { cudaFree(device); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  int64_t at(int64_t b, int64_t r, int64_t h, int64_t i) const { return b * batch_stride + r * row_stride + h * head_stride + i; }
  uint16_t* device_entry(int64_t b) const { return static_cast<uint16_t*>(device) + b * device_batch_stride; }
  void upload() const {
    for (int64_t b = 0; b < batch; ++b)
      ASSERT_EQ(cudaMemcpy(device_entry(b), host.data() + b * batch_stride, batch_stride * 2, cudaMemcpyHostToDevice),
                cudaSuccess);
  }
  void download() {
    for (int64_t b = 0; b < batch; ++b)
      ASSERT_EQ(cudaMemcpy(host.data() + b * batch_stride, device_entry(b), batch_stride * 2, cudaMemcpyDeviceToHost),
                cudaSuccess);
  }
  void poison() { ASSERT_EQ(cudaMemset(device, 0xff, device_elems * 2), cudaSuccess); }
  flashattn::ConstTensor cview() const { return {device, device_batch_stride, row_stride, head_stride}; }
  flashattn::Tensor view() const { return {device, device_batch_stride, row_stride, head_stride}; }
};

// The problem of one case: inputs on both sides, outputs on the device, params.
struct Problem {
  Case c;
  Buffer q, k, v, o;
  float* lse = nullptr;
  int32_t *cu_q = nullptr, *cu_k = nullptr;
  std::vector<int32_t> host_cu_q, host_cu_k;
  // Score modifiers, [batch, heads_q, seqlen_q, seqlen_k] with zero strides where broadcast.
  std::vector<float> host_slopes;
  float* slopes = nullptr;
  std::vector<uint8_t> host_bias, host_mask;  // bias: bytes of bias_dtype elements
  void* bias = nullptr;
  uint8_t* mask = nullptr;
  int64_t bias_strides[3] = {0, 0, 0}, mask_strides[3] = {0, 0, 0};  // batch, head, row
  int64_t lse_count = 0;

  static int64_t total(const std::vector<int32_t>& lens) {
    int64_t t = 0;
    for (int32_t l : lens) t += l;
    return t;
  }
  static int64_t longest(const std::vector<int32_t>& lens) {
    int64_t m = 0;
    for (int32_t l : lens) m = std::max<int64_t>(m, l);
    return m;
  }
  bool varlen() const { return !c.varlen_q.empty(); }

  static constexpr int64_t kHugeBatchStride = (int64_t{1} << 31) + 1024;

  explicit Problem(const Case& cs)
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
      cudaMalloc(&cu_q, host_cu_q.size() * 4);
      cudaMalloc(&cu_k, host_cu_k.size() * 4);
      cudaMemcpy(cu_q, host_cu_q.data(), host_cu_q.size() * 4, cudaMemcpyHostToDevice);
      cudaMemcpy(cu_k, host_cu_k.data(), host_cu_k.size() * 4, cudaMemcpyHostToDevice);
      lse_count = c.hq * total(c.varlen_q);
    } else {
      lse_count = c.batch * c.hq * c.sq;
    }
    if (c.lse) cudaMalloc(&lse, static_cast<size_t>(std::max<int64_t>(lse_count, 1)) * 4);
  }
  ~Problem() {
    cudaFree(slopes);
    cudaFree(bias);
    cudaFree(mask);
    cudaFree(lse);
    cudaFree(cu_q);
    cudaFree(cu_k);
  }

  void fill(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (Buffer* b : {&q, &k, &v})
      for (int64_t bb = 0; bb < b->batch; ++bb)
        for (int64_t r = 0; r < b->rows; ++r)
          for (int64_t h = 0; h < b->heads; ++h)
            for (int64_t i = 0; i < b->dim; ++i) b->host[b->at(bb, r, h, i)] = to_storage(normal(rng), c.dtype);
    q.upload();
    k.upload();
    v.upload();
    fill_score_mods(rng);
  }

  void fill_score_mods(std::mt19937_64& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
    const int64_t sq = c.sq, sk = c.sk, keys_rows = sq * sk;
    if (c.alibi != 0) {
      host_slopes.resize(c.alibi == 1 ? c.hq : c.batch * c.hq);
      for (size_t x = 0; x < host_slopes.size(); ++x)
        host_slopes[x] = c.alibi == 1 ? std::exp2(-8.0f * (x + 1) / c.hq) : 0.01f + 0.5f * uniform(rng);
      cudaMalloc(&slopes, host_slopes.size() * 4);
      cudaMemcpy(slopes, host_slopes.data(), host_slopes.size() * 4, cudaMemcpyHostToDevice);
    }
    if (c.bias != 0) {
      const int64_t elem = static_cast<int64_t>(fd::dtype_size(c.bias_dtype));
      int64_t count = 0;
      if (c.bias == 1) bias_strides[0] = c.hq * keys_rows, bias_strides[1] = keys_rows, bias_strides[2] = sk, count = c.batch * c.hq * keys_rows;
      if (c.bias == 2) bias_strides[2] = sk, count = keys_rows;
      if (c.bias == 3) bias_strides[1] = sk, count = c.hq * sk;
      host_bias.resize(count * elem);
      for (int64_t x = 0; x < count; ++x) {
        const float value = 2.0f * normal(rng);
        if (c.bias_dtype == DType::kFloat32) {
          std::memcpy(&host_bias[x * 4], &value, 4);
        } else {
          const uint16_t h = to_storage(value, c.bias_dtype);
          std::memcpy(&host_bias[x * 2], &h, 2);
        }
      }
      cudaMalloc(&bias, std::max<size_t>(host_bias.size(), 4));
      cudaMemcpy(bias, host_bias.data(), host_bias.size(), cudaMemcpyHostToDevice);
    }
    if (c.mask != 0) {
      int64_t count = 0;
      if (c.mask == 2) {
        mask_strides[0] = sk, count = c.batch * sk;
      } else {
        mask_strides[0] = c.hq * keys_rows, mask_strides[1] = keys_rows, mask_strides[2] = sk;
        count = c.batch * c.hq * keys_rows;
      }
      host_mask.assign(count, 1);
      if (c.mask == 1)
        for (auto& m : host_mask) m = uniform(rng) < 0.7f;
      if (c.mask == 2)  // each sequence keeps a random prefix of its keys (possibly none)
        for (int64_t b = 0; b < c.batch; ++b) {
          const int64_t keep = static_cast<int64_t>(uniform(rng) * (sk + 1));
          for (int64_t j = keep; j < sk; ++j) host_mask[b * sk + j] = 0;
        }
      if (c.mask == 3)  // 64 x 64 blocks on or off, keys [64, 192) off everywhere, rows 5 mod 13 off
        for (int64_t bh = 0; bh < c.batch * c.hq; ++bh) {
          std::vector<uint8_t> block_on(((sq + 63) / 64) * ((sk + 63) / 64));
          for (auto& on : block_on) on = uniform(rng) < 0.5f;
          for (int64_t i = 0; i < sq; ++i)
            for (int64_t j = 0; j < sk; ++j) {
              const bool on = block_on[(i / 64) * ((sk + 63) / 64) + j / 64] && !(j >= 64 && j < 192) && i % 13 != 5;
              host_mask[bh * keys_rows + i * sk + j] = on && uniform(rng) < 0.9f;
            }
        }
      cudaMalloc(&mask, std::max<size_t>(host_mask.size(), 1));
      cudaMemcpy(mask, host_mask.data(), host_mask.size(), cudaMemcpyHostToDevice);
    }
  }

  void poison() {
    o.poison();
    if (lse) {
      ASSERT_EQ(cudaMemset(lse, 0xff, std::max<int64_t>(lse_count, 1) * 4), cudaSuccess);  // NaN
    }
  }

  // The kernel's params (device pointers). host_side: cu_seqlens point at the host copies, for
  // the reference and problem.hpp's helpers, which read them on the host.
  ForwardParams params(bool host_side = false) const {
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
    p.maybe_cu_seqlens_q = !varlen() ? nullptr : host_side ? host_cu_q.data() : cu_q;
    p.maybe_cu_seqlens_k = !varlen() ? nullptr : host_side ? host_cu_k.data() : cu_k;
    p.softmax_scale = c.scale;
    p.causal = c.causal;
    p.alignment = c.alignment;
    p.window_left = c.window_left;
    p.window_right = c.window_right;
    p.maybe_lse = lse;
    p.softcap = c.softcap;
    if (c.alibi != 0) {
      p.maybe_alibi_slopes = host_side ? host_slopes.data() : slopes;
      p.alibi_batch_stride = c.alibi == 1 ? 0 : c.hq;
    }
    if (c.bias != 0)
      p.maybe_bias = {host_side ? static_cast<const void*>(host_bias.data()) : bias, c.bias_dtype, bias_strides[0],
                      bias_strides[1], bias_strides[2]};
    if (c.mask != 0)
      p.maybe_mask = {host_side ? host_mask.data() : mask, mask_strides[0], mask_strides[1], mask_strides[2]};
    if (varlen()) {
      p.lse_head_stride = total(c.varlen_q);
    } else {
      p.lse_batch_stride = c.hq * c.sq;
      p.lse_head_stride = c.sq;
    }
    return p;
  }
};

// Textbook attention per (sequence, head, row): exact in double, and in the storage precision
// (S = q·k rounded, fp32 softmax of scale·S, P rounded, O = P·V in fp32 rounded). Visibility from
// problem.hpp's visible_keys, the definition the kernel mirrors.
struct Reference {
  std::vector<double> o_exact;   // indexed like the o buffer's host vector
  std::vector<float> o_lowp;
  std::vector<double> lse;       // indexed like the kernel's lse
  std::vector<uint8_t> empty_row;  // per (lse index): no visible key
};

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

// Runs the kernel on a poisoned output; returns o (host copy) and lse.

using flashattn::Backend;

// The kernel is sm_90a code: it runs on compute capability 9.0 only.
bool on_hopper() {
  int device = 0;
  cudaDeviceProp prop{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return prop.major == 9 && prop.minor == 0;
}

#define SKIP_UNLESS_HOPPER() \
  if (!on_hopper()) GTEST_SKIP() << "the sm90 forward needs a compute capability 9.0 device (H100/H200)"

// Runs the forward with `backend` on poisoned outputs; o (host copy) and lse come back.
void run(Problem& pb, Backend backend, std::vector<float>* lse_out) {
  pb.poison();
  const ForwardParams p = pb.params();
  flashattn::Launch launch;
  launch.backend = backend;
  size_t workspace = 1;
  const flashattn::Status ws = flashattn::forward_workspace_size(p, launch, &workspace);
  ASSERT_TRUE(ws.ok()) << ws.message;
  ASSERT_EQ(workspace, 0u);
  const flashattn::Status st = flashattn::forward(p, launch);
  ASSERT_TRUE(st.ok()) << st.message;
  CUDA_OK(cudaGetLastError());
  CUDA_OK(cudaDeviceSynchronize());
  pb.o.download();
  if (pb.lse != nullptr) {
    lse_out->resize(pb.lse_count);
    CUDA_OK(cudaMemcpy(lse_out->data(), pb.lse, pb.lse_count * 4, cudaMemcpyDeviceToHost));
  }
}

// Elements of the o buffer that belong to the output (the rest is padding and gaps).
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
      clobbered += pb.o.host[e] != 0xffff;
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
  if (pb.lse != nullptr) {
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

Problem* new_problem(const Case& cs) {
  auto* pb = new Problem(cs);
  for (const Buffer* buf : {&pb->q, &pb->k, &pb->v, &pb->o}) EXPECT_NE(buf->device, nullptr) << "cudaMalloc failed";
  pb->fill(fresh_seed(cs.name()));
  return pb;
}

// The case on sm90 against the fp64 reference, then sm80 on the same inputs: both within the rule,
// and within each other's reach (each is within 2 err_lowp + floor of the exact result).
void check_case(const Case& cs) {
  SKIP_UNLESS_HOPPER();
  std::unique_ptr<Problem> pb(new_problem(cs));
  if (::testing::Test::HasFailure()) return;
  {
    const flashattn::Status s = fd::cuda_sm90_forward_supported(pb->params());
    ASSERT_TRUE(s.ok()) << "the case must be one the sm90 path takes: " << s.message;
  }
  std::vector<float> lse90, lse80;
  run(*pb, Backend::kCudaSm90, &lse90);
  if (::testing::Test::HasFatalFailure()) return;
  const std::vector<uint16_t> o90 = pb->o.host;
  const Reference ref = reference(*pb, pb->params(/*host_side=*/true));
  const double err_lowp = check_against_reference(*pb, ref, lse90, "sm90");

  run(*pb, Backend::kCudaSm80, &lse80);
  if (::testing::Test::HasFatalFailure()) return;
  const std::vector<uint8_t> valid = valid_elements(*pb, pb->params(/*host_side=*/true));
  double diff = 0.0;
  for (size_t e = 0; e < valid.size(); ++e)
    if (valid[e]) {
      const double d = std::abs(double{from_storage(o90[e], cs.dtype)} - from_storage(pb->o.host[e], cs.dtype));
      diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    }
  EXPECT_LE(diff, 4.0 * err_lowp + 2.0 * kFloor) << "max |o_sm90 - o_sm80| = " << diff;
  for (size_t li = 0; li < lse90.size(); ++li) {
    if (std::isinf(lse90[li]) && lse90[li] == lse80[li]) continue;  // both -inf: a row with no visible key
    ASSERT_LE(std::abs(lse90[li] - lse80[li]) / std::max(1.0f, std::abs(lse80[li])), 2 * kLseTolerance)
        << "lse of sm90 and sm80 at " << li << ": " << lse90[li] << " vs " << lse80[li];
  }
}

class Sm90ForwardSmall : public ::testing::TestWithParam<Case> {};
class Sm90ForwardLarge : public ::testing::TestWithParam<Case> {};
TEST_P(Sm90ForwardSmall, MatchesReferenceAndSm80) { check_case(GetParam()); }
TEST_P(Sm90ForwardLarge, MatchesReferenceAndSm80) { check_case(GetParam()); }

Case make(DType t, int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d) {
  Case c;
  c.dtype = t;
  c.batch = b, c.sq = sq, c.sk = sk, c.hq = hq, c.hkv = hkv, c.d = d;
  return c;
}
Case causal(Case c, Alignment a = Alignment::kBottomRight) {
  c.causal = true;
  c.alignment = a;
  return c;
}
Case window(Case c, int64_t left, int64_t right) {
  c.window_left = left;
  c.window_right = right;
  return c;
}
Case softcap(Case c, float cap, float scale = 0.0f) {
  c.softcap = cap;
  c.scale = scale;
  return c;
}

std::vector<Case> small_cases() {
  std::vector<Case> cases;
  constexpr DType kBf16 = DType::kBFloat16, kFp16 = DType::kFloat16;
  // Sizes that are not tile multiples (Br = 192 at d = 64, 128 above; Bc = 128), both dtypes.
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
  // GQA / MQA: the K/V tensor maps' head coordinate.
  cases.push_back(causal(make(kBf16, 2, 113, 203, 6, 2, 128)));
  cases.push_back(make(kFp16, 1, 203, 203, 4, 1, 64));
  cases.push_back(causal(make(kBf16, 1, 300, 300, 8, 1, 256), Alignment::kTopLeft));
  // Sliding windows, with and without causal (tiles outside the band skipped, both ends).
  cases.push_back(window(make(kBf16, 1, 203, 203, 2, 2, 128), 37, 5));
  cases.push_back(window(make(kBf16, 1, 300, 203, 2, 2, 64), 70, -1));
  cases.push_back(window(causal(make(kFp16, 1, 203, 300, 2, 2, 128), Alignment::kTopLeft), 100, -1));
  cases.push_back(window(make(kBf16, 1, 203, 113, 2, 2, 64), -1, 3));
  cases.push_back(window(make(kFp16, 1, 700, 700, 2, 2, 128), 130, 140));
  // Every instantiation, and head dims served by the next one up (zero-padded columns).
  for (int64_t d : {8, 40, 64, 72, 96, 112, 128, 136, 192, 200, 256}) {
    cases.push_back(causal(make(kBf16, 1, 203, 113, 2, 1, d)));
    cases.push_back(make(kFp16, 1, 113, 203, 2, 2, d));
  }
  // The pipelined schedules (policy.hpp: ping-pong, overlap) at every instantiation: one key tile
  // (only the first and last phases), then odd tile counts (3, 5) so that the consumers' turns do
  // not come out even; Bc = 128, 128, 128, 96, 80.
  for (auto [d, bc] : {std::pair<int64_t, int64_t>{64, 128}, {96, 128}, {128, 128}, {192, 96}, {256, 80}})
    for (int64_t sk : {bc - 5, 2 * bc + 7, 4 * bc + 1})
      cases.push_back(make(sk == 2 * bc + 7 ? kFp16 : kBf16, 1, 203, sk, 2, 1, d));
  // A key tile that one consumer's rows see and another's do not (its scores all -inf for that
  // consumer, first in the walk under causal masking), the other consumers' turns still taken.
  cases.push_back(causal(make(kBf16, 1, 203, 267, 2, 2, 128)));   // Br 128: rows 0-63 stop at key 127
  cases.push_back(causal(make(kFp16, 1, 300, 364, 2, 2, 64)));    // Br 192, three consumers
  cases.push_back(causal(make(kBf16, 1, 203, 219, 2, 2, 256)));   // Bc 80: rows 0-63 stop at key 79
  cases.push_back(window(make(kBf16, 1, 300, 300, 2, 2, 96), 40, 0));  // rows 192-255 skip keys < 152
  // Softcap (saturating with scale 1).
  cases.push_back(softcap(causal(make(kBf16, 2, 203, 203, 2, 2, 64)), 30.0f));
  cases.push_back(softcap(make(kFp16, 1, 113, 203, 2, 2, 128), 5.0f, 1.0f));
  cases.push_back(softcap(window(make(kBf16, 1, 300, 203, 4, 2, 256), 50, 0), 20.0f));
  // Strided layouts (gaps must stay untouched), no lse, explicit scale.
  {
    Case c = causal(make(kBf16, 2, 113, 203, 4, 2, 128));
    c.strided = true;
    cases.push_back(c);
    c.lse = false;
    c.scale = 0.3f;
    c.d = 64;
    cases.push_back(c);
  }
  return cases;
}

std::vector<Case> large_cases() {
  std::vector<Case> cases;
  cases.push_back(causal(make(DType::kBFloat16, 1, 1023, 1023, 2, 2, 128)));
  cases.push_back(make(DType::kFloat16, 1, 1023, 4097, 2, 1, 64));
  cases.push_back(causal(make(DType::kBFloat16, 1, 4097, 4097, 1, 1, 128)));
  cases.push_back(causal(make(DType::kBFloat16, 1, 4097, 1023, 2, 2, 256), Alignment::kTopLeft));
  cases.push_back(window(make(DType::kFloat16, 1, 4097, 4097, 1, 1, 96), 1000, 0));
  cases.push_back(causal(make(DType::kFloat16, 2, 1023, 4097, 4, 2, 192)));
  // Offsets above 2^31 elements (17 GB of device memory).
  Case huge = causal(make(DType::kBFloat16, 2, 203, 300, 2, 1, 128));
  huge.huge_offsets = true;
  cases.push_back(huge);
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name(); }

INSTANTIATE_TEST_SUITE_P(Cases, Sm90ForwardSmall, ::testing::ValuesIn(small_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Cases, Sm90ForwardLarge, ::testing::ValuesIn(large_cases()), case_name);

// Two runs on the same inputs give the same bits.
TEST(Sm90ForwardSmall, Deterministic) {
  SKIP_UNLESS_HOPPER();
  std::unique_ptr<Problem> pb(new_problem(causal(make(DType::kBFloat16, 2, 203, 300, 4, 2, 128))));
  std::vector<float> lse_a, lse_b;
  run(*pb, Backend::kCudaSm90, &lse_a);
  const std::vector<uint16_t> first = pb->o.host;
  run(*pb, Backend::kCudaSm90, &lse_b);
  EXPECT_EQ(first, pb->o.host);
  EXPECT_EQ(0, std::memcmp(lse_a.data(), lse_b.data(), lse_a.size() * 4));
}

// kAuto on device data: the sm90 path where it takes the problem (bit-identical to an explicit
// kCudaSm90 run), the sm80 path for a problem with a bias or a mask (bit-identical to kCudaSm80).
TEST(Sm90ForwardSmall, AutoSelection) {
  SKIP_UNLESS_HOPPER();
  const auto same_bits = [](Problem& pb, Backend explicit_backend) {
    std::vector<float> lse_auto, lse_explicit;
    run(pb, Backend::kAuto, &lse_auto);
    const std::vector<uint16_t> o_auto = pb.o.host;
    run(pb, explicit_backend, &lse_explicit);
    EXPECT_EQ(o_auto, pb.o.host) << "kAuto's output differs from " << flashattn::to_string(explicit_backend) << "'s";
    EXPECT_EQ(0, std::memcmp(lse_auto.data(), lse_explicit.data(), lse_auto.size() * 4));
  };
  std::unique_ptr<Problem> plain(new_problem(causal(make(DType::kBFloat16, 1, 203, 300, 2, 2, 128))));
  ASSERT_TRUE(fd::cuda_sm90_forward_supported(plain->params()).ok());
  same_bits(*plain, Backend::kCudaSm90);

  Case with_bias = make(DType::kFloat16, 1, 113, 203, 2, 2, 64);
  with_bias.bias = 1;
  std::unique_ptr<Problem> biased(new_problem(with_bias));
  const flashattn::Status s = fd::cuda_sm90_forward_supported(biased->params());
  EXPECT_EQ(s.code, StatusCode::kNotSupported);
  EXPECT_NE(s.message.find("maybe_bias"), std::string::npos) << s.message;
  same_bits(*biased, Backend::kCudaSm80);

  Case with_mask = make(DType::kBFloat16, 1, 203, 113, 2, 2, 128);
  with_mask.mask = 1;
  std::unique_ptr<Problem> masked(new_problem(with_mask));
  EXPECT_FALSE(fd::cuda_sm90_forward_supported(masked->params()).ok());
  same_bits(*masked, Backend::kCudaSm80);
}

// An explicit kCudaSm90 refuses, naming it, what the path does not take, and writes nothing.
TEST(Sm90ForwardSmall, RefusesWhatItDoesNotImplement) {
  SKIP_UNLESS_HOPPER();
  Case base = make(DType::kBFloat16, 1, 17, 17, 2, 2, 64);
  base.bias = 1;
  base.mask = 2;
  base.alibi = 1;
  std::unique_ptr<Problem> pb(new_problem(base));
  pb->poison();
  const ForwardParams good = [&] {
    ForwardParams p = pb->params();
    p.maybe_bias = {};
    p.maybe_mask = {};
    p.maybe_alibi_slopes = nullptr;
    return p;
  }();
  ASSERT_TRUE(fd::cuda_sm90_forward_supported(good).ok());
  flashattn::Launch sm90;
  sm90.backend = Backend::kCudaSm90;
  const auto refused = [&](const ForwardParams& p, const std::string& what) {
    const flashattn::Status s = flashattn::forward(p, sm90);
    EXPECT_EQ(s.code, StatusCode::kNotSupported) << what << ": " << s.message;
    EXPECT_NE(s.message.find(what), std::string::npos) << s.message;
  };
  const ForwardParams full = pb->params();
  ForwardParams p = good;
  p.maybe_bias = full.maybe_bias;
  refused(p, "maybe_bias");
  p = good, p.maybe_mask = full.maybe_mask;
  refused(p, "maybe_mask");
  p = good, p.maybe_alibi_slopes = full.maybe_alibi_slopes;
  refused(p, "maybe_alibi_slopes");
  p = good, p.head_dim_v = 32;
  refused(p, "head_dim_v 32 != head_dim 64");
  p = good, p.head_dim = 36, p.head_dim_v = 36;
  refused(p, "head_dim 36 (takes multiples of 8)");
  {
    int32_t* cu = nullptr;
    CUDA_OK(cudaMalloc(&cu, 8));
    CUDA_OK(cudaMemset(cu, 0, 8));
    p = good, p.maybe_cu_seqlens_q = cu, p.maybe_cu_seqlens_k = cu;
    refused(p, "maybe_cu_seqlens_q");
    cudaFree(cu);
  }
  std::vector<uint16_t> host(17 * 2 * 64);
  p = good, p.q.data = host.data();
  refused(p, "q is not device memory");
  p = good, p.k.data = static_cast<const char*>(good.k.data) + 2;
  refused(p, "k: data and strides must be 16-byte aligned");
  p = good, p.v.row_stride = good.v.row_stride + 1;
  refused(p, "v: data and strides");
  // The backward has no sm90 path.
  flashattn::BackwardParams bp;
  static_cast<flashattn::AttentionParams&>(bp) = good;
  const flashattn::Status bs = flashattn::backward(bp, sm90);
  EXPECT_EQ(bs.code, StatusCode::kNotSupported);
  EXPECT_NE(bs.message.find("no backward"), std::string::npos) << bs.message;

  CUDA_OK(cudaDeviceSynchronize());
  pb->o.download();
  for (uint16_t x : pb->o.host) ASSERT_EQ(x, 0xffff) << "a refused call wrote the output";
}

}  // namespace
