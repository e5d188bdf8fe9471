// CPU FlashAttention forward and the fp32 standard forward against the double reference: sizes
// that are not tile multiples, Sq != Sk both ways, odd head dims, GQA, every option and
// combinations, varlen with empty sequences, strided layouts, fp16/bf16, every ISA level this
// machine has (FLASHATTN_CPU_ISA), and bit-for-bit independence of the thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/isa.hpp"
#include "support/test_util.hpp"

namespace fa_test {
namespace {

using flashattn::detail::CpuIsa;

// LSE is computed in fp32 from the same (rounded) inputs in every dtype.
constexpr double kLseTolerance = 2e-5;

// Runs `backend` on a fresh problem and the reference on the same rounded inputs; checks O and LSE.
void expect_close(const Case& c, Backend backend, int threads = 0) {
  SCOPED_TRACE(c.name() + " backend " + flashattn::to_string(backend));
  Problem p = make_problem(c, fresh_seed(c.name()));
  Problem exact = as_fp32(p);
  run_forward(exact, Backend::kReference);
  run_forward(p, backend, threads);
  const Error eo = compare(p.o, exact.o, exact, false);
  EXPECT_EQ(eo.nan_count, 0);
  if (c.dtype == DType::kFloat32) {
    EXPECT_LE(eo.max_abs, kFp32Tolerance * std::max(1.0, eo.max_ref));
  } else {
    // Within 2x what textbook attention computed in this dtype gets wrong, plus a floor.
    const LowpErrors lp = lowp_standard_errors(exact, c.dtype, false);
    EXPECT_LE(eo.max_abs, 2 * lp.o + kLowpFloorForward);
  }
  if (c.lse) {
    const Error el = compare_lse(p, exact);
    EXPECT_EQ(el.nan_count, 0);
    EXPECT_LE(el.max_abs, kLseTolerance * std::max(1.0, el.max_ref));
  }
}

void expect_close_both(const Case& c) {
  expect_close(c, Backend::kCpu);
  expect_close(c, Backend::kStandard);
}

Case base(int64_t sq, int64_t sk, int64_t d, DType dtype = DType::kFloat32) {
  Case c;
  c.dtype = dtype;
  c.seqlen_q = sq;
  c.seqlen_k = sk;
  c.head_dim = d;
  return c;
}

// Sets FLASHATTN_CPU_ISA for the scope (the CPU backends read it on every call).
class IsaOverride {
 public:
  explicit IsaOverride(const char* level) {
    if (const char* old = std::getenv("FLASHATTN_CPU_ISA")) old_ = old, had_ = true;
    setenv("FLASHATTN_CPU_ISA", level, 1);
  }
  ~IsaOverride() {
    if (had_) setenv("FLASHATTN_CPU_ISA", old_.c_str(), 1);
    else unsetenv("FLASHATTN_CPU_ISA");
  }

 private:
  std::string old_;
  bool had_ = false;
};

// The ISA levels this machine runs, lowest first.
std::vector<const char*> isa_levels() {
  const auto f = flashattn::detail::cpu_features();
  std::vector<const char*> levels{"portable"};
  if (f.isa >= CpuIsa::kAvx2) levels.push_back("avx2");
  if (f.isa >= CpuIsa::kAvx512) levels.push_back(f.avx512_bf16 ? "avx512-nobf16" : "avx512");
  if (f.avx512_bf16) levels.push_back("avx512");
  return levels;
}

TEST(CpuForward, LengthsAndShapes) {
  const std::pair<int64_t, int64_t> lengths[] = {{1, 1}, {17, 17}, {113, 113}, {203, 203}, {1023, 1023},
                                                 {1, 203}, {203, 1}, {17, 1023}, {1023, 113}, {113, 203}};
  for (const auto& [sq, sk] : lengths)
    for (const bool causal : {false, true}) {
      Case c = base(sq, sk, 64);
      c.causal = causal;
      expect_close_both(c);
    }
}

TEST(CpuForward, LongSequence) {
  Case c = base(4097, 4097, 32);
  c.heads_q = c.heads_kv = 1;
  c.causal = true;
  expect_close(c, Backend::kCpu);
}

TEST(CpuForward, HeadDims) {
  for (const int64_t d : {8, 24, 36, 40, 72, 100, 128, 136, 256}) expect_close_both(base(113, 77, d));
  const std::pair<int64_t, int64_t> dims[] = {{64, 32}, {36, 100}, {128, 8}, {1, 3}, {5, 512}, {512, 512}};
  for (const auto& [d, dv] : dims) {
    Case c = base(77, 113, d);
    c.head_dim_v = dv;
    expect_close_both(c);
  }
}

TEST(CpuForward, GroupedQueryHeads) {
  for (const auto& [hq, hkv] : {std::pair<int64_t, int64_t>{6, 3}, {6, 2}, {6, 1}, {8, 2}}) {
    Case c = base(130, 97, 48);
    c.heads_q = hq;
    c.heads_kv = hkv;
    c.batch = 2;
    expect_close_both(c);
    c.causal = true;
    expect_close(c, Backend::kCpu);
  }
}

TEST(CpuForward, CausalAndWindows) {
  for (const auto& [sq, sk] : {std::pair<int64_t, int64_t>{203, 203}, {113, 301}, {301, 113}})
    for (const Alignment a : {Alignment::kBottomRight, Alignment::kTopLeft}) {
      Case c = base(sq, sk, 32);
      c.alignment = a;
      c.causal = true;
      expect_close_both(c);
      c.causal = false;
      for (const auto& [left, right] : {std::pair<int64_t, int64_t>{17, 0}, {0, 0}, {64, 31}, {-1, 5}, {100, -1}}) {
        c.window_left = left;
        c.window_right = right;
        expect_close_both(c);
      }
    }
}

TEST(CpuForward, ScoreModifiers) {
  Case c = base(150, 170, 40);
  c.batch = 2;
  c.heads_q = 4;
  c.heads_kv = 2;
  {
    Case s = c;
    s.softcap = 5.0f;
    s.input_scale = 2.0;
    expect_close_both(s);
  }
  for (const AlibiKind a : {AlibiKind::kPerHead, AlibiKind::kPerBatchHead}) {
    Case s = c;
    s.alibi = a;
    expect_close_both(s);
  }
  for (const DType bt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    for (const bool bcast : {false, true}) {
      Case s = c;
      s.bias = true;
      s.bias_dtype = bt;
      s.bias_broadcast = bcast;
      expect_close_both(s);
    }
  for (const MaskKind m : {MaskKind::kRandom, MaskKind::kKeyPadding, MaskKind::kBlockSparse}) {
    Case s = c;
    s.mask = m;
    expect_close_both(s);
  }
  {
    Case s = c;
    s.scale = -0.3f;  // a negative scale flips which score is the maximum
    expect_close_both(s);
  }
}

TEST(CpuForward, Combinations) {
  Case c = base(211, 190, 72);
  c.batch = 2;
  c.heads_q = 6;
  c.heads_kv = 2;
  c.causal = true;
  c.softcap = 8.0f;
  c.alibi = AlibiKind::kPerBatchHead;
  c.bias = true;
  c.bias_dtype = DType::kBFloat16;
  c.mask = MaskKind::kBlockSparse;
  c.strided = true;
  expect_close_both(c);
  c.causal = false;
  c.window_left = 40;
  c.window_right = 7;
  c.alignment = Alignment::kTopLeft;
  c.mask = MaskKind::kRandom;
  c.head_dim_v = 36;
  expect_close_both(c);
  c.dtype = DType::kFloat16;
  expect_close_both(c);
}

TEST(CpuForward, VarlenWithEmptySequences) {
  Case c = base(0, 0, 64);
  c.varlen_q = {5, 0, 130, 64, 1, 77};
  c.varlen_k = {7, 3, 0, 200, 64, 77};
  c.heads_q = 4;
  c.heads_kv = 2;
  expect_close_both(c);
  c.causal = true;
  expect_close_both(c);
  c.strided = true;
  c.mask = MaskKind::kKeyPadding;
  c.alibi = AlibiKind::kPerBatchHead;
  expect_close_both(c);
}

TEST(CpuForward, RowsWithoutKeysGetZeroAndMinusInf) {
  Case c = base(150, 40, 32);  // bottom-right causal: the first 110 rows see nothing
  c.causal = true;
  Problem p = make_problem(c, fresh_seed(c.name()));
  run_forward(p, Backend::kCpu);
  for (int64_t i = 0; i < 150; ++i)
    for (int64_t h = 0; h < c.heads_q; ++h) {
      if (i < 110) {
        EXPECT_EQ(p.lse[h * 150 + i], -std::numeric_limits<float>::infinity()) << "row " << i;
        for (int64_t x = 0; x < 32; ++x) ASSERT_EQ(p.o.get(0, i, h, x), 0.0) << "row " << i;
      } else {
        EXPECT_TRUE(std::isfinite(p.lse[h * 150 + i])) << "row " << i;
      }
    }
}

// Random combinations of every option; the sweep's own seed (printed) replays the whole list.
TEST(CpuForward, RandomOptionSweep) {
  std::mt19937_64 rng(fresh_seed("option sweep"));
  auto pick = [&rng](std::initializer_list<int64_t> xs) {
    return *(xs.begin() + std::uniform_int_distribution<size_t>(0, xs.size() - 1)(rng));
  };
  auto coin = [&rng](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  for (int iter = 0; iter < 150; ++iter) {
    const DType t = coin(0.6) ? DType::kFloat32 : coin(0.5) ? DType::kFloat16 : DType::kBFloat16;
    Case c = base(pick({1, 2, 17, 63, 64, 65, 113, 203, 300}), pick({1, 2, 17, 63, 64, 65, 113, 203, 300}),
                  pick({8, 16, 24, 36, 40, 64, 80, 100, 128}), t);
    if (coin(0.3)) c.head_dim_v = pick({4, 20, 32, 48, 72});
    c.heads_kv = pick({1, 2});
    c.heads_q = c.heads_kv * pick({1, 2, 3});
    c.batch = pick({1, 2});
    c.causal = coin(0.4);
    c.alignment = coin(0.5) ? Alignment::kBottomRight : Alignment::kTopLeft;
    if (!c.causal && coin(0.3)) {
      c.window_left = pick({-1, 0, 5, 40});
      c.window_right = pick({-1, 0, 3, 70});
    }
    if (coin(0.25)) c.softcap = 6.0f;
    if (coin(0.25)) c.alibi = coin(0.5) ? AlibiKind::kPerHead : AlibiKind::kPerBatchHead;
    if (coin(0.25)) {
      c.bias = true;
      c.bias_dtype = coin(0.5) ? DType::kFloat32 : DType::kBFloat16;
      c.bias_broadcast = coin(0.5);
    }
    if (coin(0.25)) c.mask = coin(0.5) ? MaskKind::kRandom : MaskKind::kBlockSparse;
    c.strided = coin(0.3);
    c.lse = coin(0.8);
    if (coin(0.2) && c.bias == false && c.mask == MaskKind::kNone) {
      c.varlen_q = {static_cast<int32_t>(pick({0, 1, 37, 130})), static_cast<int32_t>(pick({5, 64, 99}))};
      c.varlen_k = {static_cast<int32_t>(pick({0, 1, 37, 130})), static_cast<int32_t>(pick({0, 5, 64, 99}))};
    }
    expect_close_both(c);
  }
}

TEST(CpuForward, NanInputsStayInTheirRows) {
  for (const bool causal : {false, true})
    for (const Backend backend : {Backend::kCpu, Backend::kStandard}) {
      Case c = base(150, 150, 32);
      c.causal = causal;
      SCOPED_TRACE(c.name() + " " + flashattn::to_string(backend));
      Problem p = make_problem(c, fresh_seed(c.name()));
      const double nan = std::numeric_limits<double>::quiet_NaN();
      p.q.set(0, 5, 0, 3, nan);    // query row 5 of head 0
      p.k.set(0, 100, 1, 7, nan);  // key 100 of head 1: under causal only rows >= 100 see it
      Problem exact = as_fp32(p);
      run_forward(exact, Backend::kReference);
      run_forward(p, backend);
      const Error e = compare(p.o, exact.o, exact, false);
      EXPECT_EQ(e.nan_count, 0);
      EXPECT_LE(e.max_abs, kFp32Tolerance * std::max(1.0, e.max_ref));
      int64_t nan_rows = 0;
      for (int64_t i = 0; i < 150; ++i)
        for (int64_t h = 0; h < 2; ++h) {
          const bool want = std::isnan(exact.o.get(0, i, h, 0));
          EXPECT_EQ(std::isnan(p.o.get(0, i, h, 0)), want) << "row " << i << " head " << h;
          nan_rows += want;
        }
      EXPECT_EQ(nan_rows, causal ? 1 + 50 : 1 + 150);
    }
}

TEST(CpuForward, StridedLayouts) {
  for (const bool causal : {false, true}) {
    Case c = base(203, 113, 40);
    c.batch = 2;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.head_dim_v = 24;
    c.strided = true;
    c.causal = causal;
    expect_close_both(c);
  }
}

TEST(CpuForward, LowPrecision) {
  for (const DType t : {DType::kFloat16, DType::kBFloat16}) {
    expect_close_both(base(203, 203, 64, t));
    Case c = base(130, 257, 36, t);
    c.causal = true;
    c.heads_q = 4;
    c.heads_kv = 1;
    expect_close_both(c);
    c = base(64, 300, 128, t);
    c.input_scale = 3.0;
    expect_close_both(c);
    c = base(1023, 1023, 128, t);
    c.heads_q = c.heads_kv = 1;
    expect_close(c, Backend::kCpu);
  }
}

TEST(CpuForward, EveryIsaLevel) {
  for (const char* level : isa_levels()) {
    IsaOverride isa(level);
    SCOPED_TRACE(std::string("FLASHATTN_CPU_ISA=") + level);
    for (const DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      Case c = base(250, 150, 36, t);  // 250: the last query panel of every Br ends past 256
      c.heads_q = 4;
      c.heads_kv = 2;
      c.head_dim_v = 20;
      c.causal = true;
      c.strided = true;
      expect_close_both(c);
      c = base(96, 129, 128, t);
      c.softcap = 4.0f;
      c.mask = MaskKind::kBlockSparse;
      c.window_left = 50;
      expect_close_both(c);
      c = base(5, 300, 72, t);  // decoding-sized query tiles
      c.heads_q = 8;
      c.heads_kv = 2;
      c.causal = true;
      c.alibi = AlibiKind::kPerHead;
      expect_close_both(c);
    }
  }
}

TEST(CpuForward, ThreadCountDoesNotChangeBits) {
  for (const char* level : isa_levels()) {
    IsaOverride isa(level);
    for (const DType t : {DType::kFloat32, DType::kBFloat16}) {
      for (const Backend backend : {Backend::kCpu, Backend::kStandard}) {
        Case c = base(517, 389, 72, t);
        c.heads_q = 4;
        c.heads_kv = 2;
        c.causal = true;
        SCOPED_TRACE(c.name() + " " + level + " " + flashattn::to_string(backend));
        Problem one = make_problem(c, fresh_seed(c.name()));
        Problem two = one;
        run_forward(one, backend, 1);
        run_forward(two, backend, 2);
        ASSERT_EQ(one.o.storage.size(), two.o.storage.size());
        EXPECT_EQ(std::memcmp(one.o.storage.data(), two.o.storage.data(), one.o.storage.size() * sizeof(float)), 0);
        EXPECT_EQ(std::memcmp(one.lse.data(), two.lse.data(), one.lse.size() * sizeof(float)), 0);
      }
    }
  }
}

TEST(CpuForward, WorkspaceIndependentOfSequenceLength) {
  auto bytes_for = [](int64_t n, DType t) {
    flashattn::ForwardParams p;
    p.dtype = t;
    p.batch = 1;
    p.seqlen_q = p.seqlen_k = n;
    p.heads_q = p.heads_kv = 8;
    p.head_dim = 128;
    static float dummy;  // sizes only: nothing is read or written
    p.q = p.k = p.v = flashattn::contiguous(static_cast<const void*>(&dummy), n, 8, 128);
    p.o = flashattn::contiguous(static_cast<void*>(&dummy), n, 8, 128);
    flashattn::Launch launch;
    launch.backend = Backend::kCpu;
    launch.num_threads = 2;
    size_t bytes = 0;
    const flashattn::Status s = flashattn::forward_workspace_size(p, launch, &bytes);
    EXPECT_TRUE(s.ok()) << s.message;
    return bytes;
  };
  for (const DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const size_t big = bytes_for(16384, t);
    EXPECT_LT(big, size_t{64} << 20);
    EXPECT_EQ(big, bytes_for(1024, t));
  }
}

}  // namespace
}  // namespace fa_test
