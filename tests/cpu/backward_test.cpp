// CPU FlashAttention backward and the fp32 standard backward against the double reference
// gradients: sizes that are not tile multiples, Sq != Sk both ways, odd head dims, GQA, every
// option and combinations, varlen with empty sequences, low-precision dtypes, and bit-for-bit
// determinism across runs and thread counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype.hpp"
#include "cpu/backward_kernels.hpp"
#include "cpu/isa.hpp"
#include "support/test_util.hpp"

namespace fa_test {
namespace {

struct Grads {
  Error dq, dk, dv;
};

// Inputs in `p` (any dtype): O and LSE from the reference forward on p, gradients from `backend`;
// the exact gradients from the reference on the same rounded inputs in fp32.
Grads run_and_compare(const Case& c, Backend backend, Problem* exact_out = nullptr, Problem* got_out = nullptr) {
  const uint64_t seed = fresh_seed(c.name());
  Problem p = make_problem(c, seed);
  run_forward(p, Backend::kReference);
  Problem exact = as_fp32(p);
  run_forward(exact, Backend::kReference);
  run_backward(exact, Backend::kReference);
  run_backward(p, backend);
  Grads g{compare(p.dq, exact.dq, exact, false), compare(p.dk, exact.dk, exact, true),
          compare(p.dv, exact.dv, exact, true)};
  if (exact_out != nullptr) *exact_out = std::move(exact);
  if (got_out != nullptr) *got_out = std::move(p);
  return g;
}

void expect_close(const Case& c, Backend backend) {
  SCOPED_TRACE(c.name() + " backend " + flashattn::to_string(backend));
  Problem exact;
  const Grads g = run_and_compare(c, backend, &exact);
  if (c.dtype == DType::kFloat32) {
    for (const Error* e : {&g.dq, &g.dk, &g.dv}) {
      EXPECT_EQ(e->nan_count, 0);
      EXPECT_LE(e->max_abs, kFp32Tolerance * std::max(1.0, e->max_ref));
    }
  } else {
    // Within 3x what textbook attention computed in this dtype gets wrong, plus a floor.
    const LowpErrors lp = lowp_standard_errors(exact, c.dtype, true);
    EXPECT_EQ(g.dq.nan_count + g.dk.nan_count + g.dv.nan_count, 0);
    EXPECT_LE(g.dq.max_abs, 3 * lp.dq + kLowpFloorBackward);
    EXPECT_LE(g.dk.max_abs, 3 * lp.dk + kLowpFloorBackward);
    EXPECT_LE(g.dv.max_abs, 3 * lp.dv + kLowpFloorBackward);
  }
}

Case base(int64_t sq, int64_t sk, int64_t d, DType dtype = DType::kFloat32) {
  Case c;
  c.dtype = dtype;
  c.seqlen_q = sq;
  c.seqlen_k = sk;
  c.head_dim = d;
  return c;
}

// Every backend-independent property the CPU flash path must hold, checked on both CPU backends.
class BackwardTest : public ::testing::TestWithParam<Backend> {};

TEST_P(BackwardTest, SizesNotTileMultiples) {
  for (auto [sq, sk] : {std::pair<int64_t, int64_t>{1, 1}, {17, 17}, {113, 203}, {203, 113}, {1, 203}, {203, 1}})
    expect_close(base(sq, sk, 40), GetParam());
}

TEST_P(BackwardTest, LongSequence) {
  Case c = base(1023, 1023, 64);
  c.heads_q = c.heads_kv = 1;
  expect_close(c, GetParam());
}

TEST_P(BackwardTest, HeadDims) {
  for (int64_t d : {1, 8, 24, 72, 128, 136, 256})
    expect_close(base(67, 91, d), GetParam());
  Case c = base(45, 130, 512);
  c.heads_q = c.heads_kv = 1;
  expect_close(c, GetParam());
  Case vdiff = base(77, 70, 40);
  vdiff.head_dim_v = 88;
  expect_close(vdiff, GetParam());
  vdiff.head_dim = 96;
  vdiff.head_dim_v = 24;
  expect_close(vdiff, GetParam());
}

TEST_P(BackwardTest, GroupedQueryHeads) {
  Case gqa = base(70, 150, 32);
  gqa.heads_q = 6;
  gqa.heads_kv = 2;
  expect_close(gqa, GetParam());
  Case mqa = base(129, 65, 24);
  mqa.batch = 2;
  mqa.heads_q = 4;
  mqa.heads_kv = 1;
  expect_close(mqa, GetParam());
  // One key block and one kv head: fewer tile tasks than per-query-head tasks (sizes the
  // per-worker scratch for the larger pass; an ASan build catches an undersized workspace).
  Case one_block = base(90, 40, 16);
  one_block.heads_q = 4;
  one_block.heads_kv = 1;
  expect_close(one_block, GetParam());
}

TEST_P(BackwardTest, CausalAndWindow) {
  for (Alignment a : {Alignment::kBottomRight, Alignment::kTopLeft})
    for (auto [sq, sk] : {std::pair<int64_t, int64_t>{150, 150}, {90, 203}, {203, 90}}) {
      Case c = base(sq, sk, 32);
      c.causal = true;
      c.alignment = a;
      expect_close(c, GetParam());
      Case w = base(sq, sk, 32);
      w.alignment = a;
      w.window_left = 37;
      w.window_right = 5;
      expect_close(w, GetParam());
    }
}

TEST_P(BackwardTest, ScoreModifiers) {
  Case softcap = base(100, 133, 32);
  softcap.softcap = 5.0f;
  softcap.input_scale = 2.0;
  expect_close(softcap, GetParam());
  for (AlibiKind a : {AlibiKind::kPerHead, AlibiKind::kPerBatchHead}) {
    Case alibi = base(77, 120, 32);
    alibi.batch = 2;
    alibi.alibi = a;
    expect_close(alibi, GetParam());
  }
  for (bool broadcast : {false, true})
    for (DType bt : {DType::kFloat32, DType::kBFloat16}) {
      Case bias = base(66, 99, 24);
      bias.batch = 2;
      bias.bias = true;
      bias.bias_dtype = bt;
      bias.bias_broadcast = broadcast;
      expect_close(bias, GetParam());
    }
  Case scaled = base(50, 70, 16);
  scaled.scale = 0.3f;
  expect_close(scaled, GetParam());
}

TEST_P(BackwardTest, Masks) {
  for (MaskKind m : {MaskKind::kRandom, MaskKind::kKeyPadding, MaskKind::kBlockSparse}) {
    Case c = base(140, 200, 32);
    c.batch = 2;
    c.mask = m;
    expect_close(c, GetParam());
  }
}

TEST_P(BackwardTest, VarlenWithEmptySequences) {
  Case c = base(0, 0, 32);
  c.varlen_q = {37, 0, 130, 5, 0};
  c.varlen_k = {80, 12, 0, 140, 0};
  c.heads_q = 4;
  c.heads_kv = 2;
  expect_close(c, GetParam());
  c.causal = true;
  expect_close(c, GetParam());
}

TEST_P(BackwardTest, StridedLayouts) {
  Case c = base(70, 90, 40);
  c.batch = 2;
  c.strided = true;
  expect_close(c, GetParam());
  c.dtype = DType::kBFloat16;
  expect_close(c, GetParam());
}

TEST_P(BackwardTest, Combinations) {
  Case c = base(0, 0, 40);
  c.varlen_q = {90, 0, 150};
  c.varlen_k = {130, 20, 110};
  c.heads_q = 6;
  c.heads_kv = 3;
  c.head_dim_v = 56;
  c.causal = true;
  c.alignment = Alignment::kTopLeft;
  c.window_left = 60;
  c.softcap = 8.0f;
  c.alibi = AlibiKind::kPerBatchHead;
  c.strided = true;
  expect_close(c, GetParam());

  Case d = base(120, 170, 24);
  d.batch = 2;
  d.heads_q = 4;
  d.heads_kv = 2;
  d.causal = true;
  d.bias = true;
  d.bias_broadcast = true;
  d.mask = MaskKind::kBlockSparse;
  d.softcap = 4.0f;
  expect_close(d, GetParam());
  d.dtype = DType::kFloat16;
  expect_close(d, GetParam());
}

TEST_P(BackwardTest, LowPrecision) {
  for (DType t : {DType::kFloat16, DType::kBFloat16}) {
    expect_close(base(113, 203, 64, t), GetParam());
    expect_close(base(50, 61, 9, t), GetParam());  // odd head dim: no bf16 pairs
    Case c = base(203, 113, 72, t);
    c.causal = true;
    c.heads_q = 4;
    c.heads_kv = 2;
    expect_close(c, GetParam());
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, BackwardTest, ::testing::Values(Backend::kCpu, Backend::kStandard),
                         [](const auto& info) { return std::string(flashattn::to_string(info.param)); });

// The pipeline as users run it: O and LSE from the CPU forward, gradients from the CPU backward.
TEST(CpuBackward, FromCpuForwardOutputs) {
  for (DType t : {DType::kFloat32, DType::kBFloat16}) {
    Case c = base(150, 230, 64, t);
    c.heads_q = 4;
    c.heads_kv = 2;
    c.causal = true;
    SCOPED_TRACE(c.name());
    Problem p = make_problem(c, fresh_seed(c.name()));
    run_forward(p, Backend::kCpu);
    Problem exact = as_fp32(p);
    run_forward(exact, Backend::kReference);
    run_backward(exact, Backend::kReference);
    run_backward(p, Backend::kCpu);
    const LowpErrors lp = t == DType::kFloat32 ? LowpErrors{} : lowp_standard_errors(exact, t, true);
    for (const auto& [got, want, k_side, lowp] : {std::tuple{&p.dq, &exact.dq, false, lp.dq},
                                                  {&p.dk, &exact.dk, true, lp.dk}, {&p.dv, &exact.dv, true, lp.dv}}) {
      const Error e = compare(*got, *want, exact, k_side);
      EXPECT_EQ(e.nan_count, 0);
      EXPECT_LE(e.max_abs, t == DType::kFloat32 ? kFp32Tolerance * std::max(1.0, e.max_ref)
                                                : 3 * lowp + kLowpFloorBackward);
    }
  }
}

// Rows that see no key (bottom-right causal with Sq > Sk, and a mask that hides a whole row)
// have LSE = -inf and must get exactly dq = 0, while the other rows stay correct.
TEST(CpuBackward, RowsWithoutVisibleKeysGetZeroDq) {
  Case c = base(90, 40, 32);
  c.causal = true;
  Problem exact, got;
  const Grads g = run_and_compare(c, Backend::kCpu, &exact, &got);
  EXPECT_LE(g.dq.max_abs, kFp32Tolerance * std::max(1.0, g.dq.max_ref));
  EXPECT_LE(g.dk.max_abs, kFp32Tolerance * std::max(1.0, g.dk.max_ref));
  int64_t dead_rows = 0;
  for (int64_t h = 0; h < c.heads_q; ++h)
    for (int64_t i = 0; i < c.seqlen_q; ++i) {
      if (got.lse[h * c.seqlen_q + i] != -std::numeric_limits<float>::infinity()) continue;
      ++dead_rows;
      for (int64_t e = 0; e < c.head_dim; ++e) ASSERT_EQ(got.dq.get(0, i, h, e), 0.0) << "row " << i;
    }
  EXPECT_EQ(dead_rows, c.heads_q * (c.seqlen_q - c.seqlen_k));
}

// A NaN in one query row reaches that row's dq only: every other row's dq stays finite and exact.
TEST(CpuBackward, NanInQueryRowStaysInItsDqRow) {
  Case c = base(100, 140, 32);
  c.heads_q = c.heads_kv = 1;
  Problem p = make_problem(c, fresh_seed(c.name()));
  p.q.set(0, 37, 0, 5, std::numeric_limits<double>::quiet_NaN());
  run_forward(p, Backend::kReference);
  Problem exact = p;
  run_backward(exact, Backend::kReference);
  run_backward(p, Backend::kCpu);
  for (int64_t i = 0; i < c.seqlen_q; ++i)
    for (int64_t e = 0; e < c.head_dim; ++e) {
      const double got = p.dq.get(0, i, 0, e), want = exact.dq.get(0, i, 0, e);
      if (i == 37) {
        EXPECT_TRUE(std::isnan(got)) << "element " << e;
      } else {
        ASSERT_TRUE(std::isfinite(got)) << "row " << i;
        EXPECT_NEAR(got, want, kFp32Tolerance * 10) << "row " << i;
      }
    }
}

// Identical bits across repeated runs and across 1, 2 and 3 workers (the dQ split count and the
// summation order come from the shape only), for both CPU backends.
TEST(CpuBackward, BitIdenticalAcrossRunsAndThreads) {
  for (Backend backend : {Backend::kCpu, Backend::kStandard})
    for (DType t : {DType::kFloat32, DType::kBFloat16}) {
      Case c = base(300, 520, 64, t);
      c.heads_q = 4;
      c.heads_kv = 2;
      c.causal = true;
      Problem p = make_problem(c, fresh_seed(c.name()));
      run_forward(p, Backend::kReference);
      std::vector<std::vector<float>> first;
      for (int threads : {1, 2, 2, 3, 1}) {
        p.dq.fill_storage_nan();
        p.dk.fill_storage_nan();
        p.dv.fill_storage_nan();
        run_backward(p, backend, threads);
        const std::vector<std::vector<float>> now{p.dq.storage, p.dk.storage, p.dv.storage};
        if (first.empty()) {
          first = now;
          continue;
        }
        for (size_t k = 0; k < now.size(); ++k)
          EXPECT_EQ(std::memcmp(now[k].data(), first[k].data(), now[k].size() * sizeof(float)), 0)
              << c.name() << " " << flashattn::to_string(backend) << ": tensor " << k << " differs with " << threads
              << " threads";
      }
    }
}

// Each ISA level's kernels (FLASHATTN_CPU_ISA lowers the detected level) against the reference.
TEST(CpuBackward, EveryIsaLevel) {
  const char* previous = std::getenv("FLASHATTN_CPU_ISA");
  const std::string saved = previous != nullptr ? previous : "";
  for (const char* isa : {"portable", "avx2", "avx512-nobf16", "avx512"}) {
    setenv("FLASHATTN_CPU_ISA", isa, 1);
    Case c = base(77, 133, 40);
    c.heads_q = 4;
    c.heads_kv = 2;
    c.causal = true;
    c.softcap = 6.0f;
    c.mask = MaskKind::kRandom;
    SCOPED_TRACE(isa);
    expect_close(c, Backend::kCpu);
    c.dtype = DType::kBFloat16;
    expect_close(c, Backend::kCpu);
  }
  if (previous != nullptr) setenv("FLASHATTN_CPU_ISA", saved.c_str(), 1);
  else unsetenv("FLASHATTN_CPU_ISA");
}

// The kernel tables this CPU can run.
std::vector<const flashattn::detail::BackwardKernels*> runnable_tables() {
  using namespace flashattn::detail;
  std::vector<const BackwardKernels*> t{&backward_kernels_portable()};
  const CpuIsa isa = cpu_features().isa;
  if (isa >= CpuIsa::kAvx2) t.push_back(&backward_kernels_avx2());
  if (isa >= CpuIsa::kAvx512) t.push_back(&backward_kernels_avx512());
  if (isa >= CpuIsa::kAvx512 && cpu_features().avx512_bf16) t.push_back(&backward_kernels_avx512_bf16());
  return t;
}

// The GEMM driver against a double loop: every register-tile edge (M, N, K not multiples of the
// tile), both A addressings, overwrite and accumulate.
TEST(BackwardKernels, GemmMatchesNaiveProduct) {
  std::mt19937 rng(static_cast<uint32_t>(fresh_seed("gemm")));
  std::normal_distribution<float> nd;
  for (const auto* k : runnable_tables()) {
    SCOPED_TRACE(k->name);
    for (auto [M, N, K] : {std::array<int64_t, 3>{1, 1, 1}, {7, 17, 5}, {13, 70, 33}, {64, 128, 64}, {6, 64, 0}, {25, 130, 9}})
      for (bool transposed_a : {false, true})
        for (bool accumulate : {false, true}) {
          const int64_t lda = (transposed_a ? M : K) + 3, ldb = N + 5, ldc = N + 2;
          std::vector<float> A((transposed_a ? K : M) * lda + 1), B(K * ldb + 1), C(M * ldc), C0;
          for (auto& x : A) x = nd(rng);
          for (auto& x : B) x = nd(rng);
          for (auto& x : C) x = nd(rng);
          C0 = C;
          const int64_t a_ms = transposed_a ? 1 : lda, a_ks = transposed_a ? lda : 1;
          k->gemm(M, N, K, A.data(), a_ms, a_ks, B.data(), ldb, C.data(), ldc, accumulate);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < ldc; ++n) {
              if (n >= N) {
                ASSERT_EQ(C[m * ldc + n], C0[m * ldc + n]) << "wrote outside C at " << m << "," << n;
                continue;
              }
              double want = accumulate ? C0[m * ldc + n] : 0.0;
              for (int64_t x = 0; x < K; ++x) want += double(A[m * a_ms + x * a_ks]) * B[x * ldb + n];
              ASSERT_NEAR(C[m * ldc + n], want, 1e-5 * (K + 1)) << M << "x" << N << "x" << K << " at " << m << "," << n;
            }
        }
  }
}

// The bf16 dot-product GEMM (where the CPU has it) against a double loop over the bf16 pairs.
TEST(BackwardKernels, Bf16GemmMatchesNaiveProduct) {
  using namespace flashattn::detail;
  std::mt19937 rng(static_cast<uint32_t>(fresh_seed("gemm_bf16")));
  std::normal_distribution<float> nd;
  int tables = 0;
  for (const auto* k : runnable_tables()) {
    if (k->gemm_bf16 == nullptr) continue;
    ++tables;
    SCOPED_TRACE(k->name);
    for (auto [M, N, K] : {std::array<int64_t, 3>{1, 1, 1}, {7, 17, 5}, {13, 70, 33}, {64, 64, 64}, {9, 130, 4}}) {
      const int64_t a_ms = K + 3, ldb = N + 5, ldc = N + 2;
      std::vector<uint16_t> A(2 * M * a_ms), B(2 * K * ldb);
      for (auto& x : A) x = float_to_bf16(nd(rng));
      for (auto& x : B) x = float_to_bf16(nd(rng));
      std::vector<uint32_t> A32(M * a_ms), B32(K * ldb);
      std::memcpy(A32.data(), A.data(), A32.size() * 4);
      std::memcpy(B32.data(), B.data(), B32.size() * 4);
      std::vector<float> C(M * ldc, 7.0f);
      k->gemm_bf16(M, N, K, A32.data(), a_ms, B32.data(), ldb, C.data(), ldc);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < ldc; ++n) {
          if (n >= N) {
            ASSERT_EQ(C[m * ldc + n], 7.0f) << "wrote outside C";
            continue;
          }
          double want = 0.0;
          for (int64_t x = 0; x < K; ++x)
            for (int e = 0; e < 2; ++e)  // word x of B column n holds rows 2x (low half) and 2x + 1
              want += double(bf16_to_float(A[2 * (m * a_ms + x) + e])) * bf16_to_float(B[2 * (x * ldb + n) + e]);
          ASSERT_NEAR(C[m * ldc + n], want, 1e-5 * (2 * K + 1)) << M << "x" << N << "x" << K << " at " << m << "," << n;
        }
    }
  }
  if (tables == 0) GTEST_SKIP() << "no bf16 dot products on this CPU";
}

// Vector dtype conversions are the scalar definitions bit for bit (NaN only needs to stay NaN).
TEST(BackwardKernels, ConversionsMatchScalar) {
  using namespace flashattn::detail;
  std::vector<uint16_t> all(65536 + 5);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> floats;
  std::mt19937 rng(static_cast<uint32_t>(fresh_seed("conversions")));
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 20000; ++i) {
    const uint32_t u = bits(rng);
    float f;
    std::memcpy(&f, &u, 4);
    floats.push_back(f);
  }
  for (float f : {0.0f, -0.0f, 65504.0f, 65519.0f, 65520.0f, 1e-8f, 5.96e-8f, 2.98e-8f, 1.0f + 1.0f / 256, 3.0e38f})
    floats.push_back(f), floats.push_back(-f);
  floats.push_back(std::numeric_limits<float>::infinity());
  floats.push_back(std::numeric_limits<float>::quiet_NaN());
  for (const auto* k : runnable_tables()) {
    SCOPED_TRACE(k->name);
    for (DType t : {DType::kBFloat16, DType::kFloat16}) {
      std::vector<float> wide(all.size());
      k->widen(all.data(), t, static_cast<int64_t>(all.size()), wide.data());
      for (size_t i = 0; i < all.size(); ++i) {
        const float want = t == DType::kBFloat16 ? bf16_to_float(all[i]) : fp16_to_float(all[i]);
        if (std::isnan(want)) ASSERT_TRUE(std::isnan(wide[i])) << i;
        else ASSERT_EQ(std::memcmp(&wide[i], &want, 4), 0) << "bits " << i;
      }
      std::vector<uint16_t> narrow(floats.size());
      k->narrow(floats.data(), static_cast<int64_t>(floats.size()), t, narrow.data());
      for (size_t i = 0; i < floats.size(); ++i) {
        const uint16_t want = t == DType::kBFloat16 ? float_to_bf16(floats[i]) : float_to_fp16(floats[i]);
        if (std::isnan(floats[i])) {
          const float back = t == DType::kBFloat16 ? bf16_to_float(narrow[i]) : fp16_to_float(narrow[i]);
          ASSERT_TRUE(std::isnan(back)) << i;
        } else {
          ASSERT_EQ(narrow[i], want) << "value " << floats[i];
        }
      }
    }
  }
}

// exp2 pass: accurate to a few ulp, exactly 0 for -inf, NaN stays NaN.
TEST(BackwardKernels, Exp2RowsIsAccurate) {
  for (const auto* k : runnable_tables()) {
    SCOPED_TRACE(k->name);
    std::vector<float> x;
    for (int i = 0; i <= 2000; ++i) x.push_back(-100.0f + 0.05f * static_cast<float>(i) - 0.0137f);
    x.push_back(-std::numeric_limits<float>::infinity());
    x.push_back(std::numeric_limits<float>::quiet_NaN());
    x.push_back(0.0f);
    std::vector<float> y = x;
    const float shift = 0.0f;
    k->exp2_rows(y.data(), 0, 1, static_cast<int64_t>(y.size()), 1.0f, &shift);
    for (size_t i = 0; i + 3 < x.size(); ++i)
      ASSERT_NEAR(y[i] / std::exp2(double(x[i])), 1.0, 5e-7) << "x = " << x[i];
    EXPECT_EQ(y[y.size() - 3], 0.0f);
    EXPECT_TRUE(std::isnan(y[y.size() - 2]));
    EXPECT_EQ(y.back(), 1.0f);
  }
}

}  // namespace
}  // namespace fa_test
