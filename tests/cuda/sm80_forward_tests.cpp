// GPU tests of the sm80 forward (run on a GPU machine only; built in CI). Each case draws fresh
// random inputs (seed printed; FLASHATTN_TEST_SEED=N replays), poisons the outputs with NaN, runs
// the kernel and compares with textbook attention in double precision computed here on the host.
// Tolerance rule: our error <= 2x the error of standard attention computed in the same low
// precision (S and P rounded to the storage type, fp32 softmax) + a small floor. The problem, the
// reference and the rule are support/forward_problem.hpp's, shared with the sm90 forward tests.
// The kernel is asked for by name (Backend::kCudaSm80): kAuto takes the Hopper forward on sm_90
// where it can, and tests/cuda/sm90_forward_tests.cpp checks what kAuto picks.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/support/cuda_test_util.hpp"
#include "cuda/support/forward_problem.hpp"

namespace {

using flashattn::Alignment;
using flashattn::Backend;
using flashattn::DType;
using flashattn::ForwardParams;
using flashattn::StatusCode;
namespace fd = flashattn::detail;
using namespace fa_cuda_test;

void check_case(const Case& cs) {
  const std::unique_ptr<Problem> pb = new_problem(cs);
  if (::testing::Test::HasFailure()) return;
  std::vector<float> lse;
  run(*pb, Backend::kCudaSm80, &lse);
  if (::testing::Test::HasFatalFailure()) return;
  const Reference ref = reference(*pb, pb->params(/*host_side=*/true));
  check_against_reference(*pb, ref, lse, "sm80");
}

class Sm80ForwardSmall : public ::testing::TestWithParam<Case> {};
class Sm80ForwardLarge : public ::testing::TestWithParam<Case> {};
TEST_P(Sm80ForwardSmall, MatchesReference) { check_case(GetParam()); }
TEST_P(Sm80ForwardLarge, MatchesReference) { check_case(GetParam()); }

std::vector<Case> small_cases() {
  std::vector<Case> cases = base_small_cases();
  constexpr DType kBf16 = DType::kBFloat16, kFp16 = DType::kFloat16;
  // Sliding windows, with and without causal.
  cases.push_back(window(make(kBf16, 1, 203, 203, 2, 2, 128), 37, 5));
  cases.push_back(window(make(kBf16, 1, 300, 203, 2, 2, 64), 70, -1));
  cases.push_back(window(causal(make(kFp16, 1, 203, 300, 2, 2, 128), Alignment::kTopLeft), 100, -1));
  cases.push_back(window(make(kBf16, 1, 203, 113, 2, 2, 64), -1, 3));
  // Every instantiation, and head dims served by the next one up (zero-padded columns).
  for (int64_t d : {8, 40, 64, 72, 96, 112, 128, 136, 192, 200, 256}) {
    cases.push_back(causal(make(kBf16, 1, 203, 113, 2, 1, d)));
    cases.push_back(make(kFp16, 1, 113, 203, 2, 2, d));
  }
  // Variable-length batches, empty sequences included.
  {
    Case c = causal(make(kBf16, 0, 0, 0, 4, 2, 128));
    c.varlen_q = {17, 0, 203, 1, 64};
    c.varlen_k = {17, 5, 113, 0, 300};
    cases.push_back(c);
    c.causal = false;
    c.dtype = kFp16;
    c.d = 64;
    cases.push_back(c);
  }
  // d = 256 runs on warp pairs (one row group's keys and V columns split over two warps): windows,
  // GQA, varlen with empty sequences, Sq of 1 and 17, and a V head dim that leaves the second warp's
  // columns all padding.
  cases.push_back(window(make(kBf16, 1, 203, 300, 4, 1, 256), 70, 9));
  cases.push_back(window(causal(make(kFp16, 1, 300, 203, 2, 2, 248), Alignment::kTopLeft), 50, -1));
  cases.push_back(causal(make(kBf16, 2, 17, 203, 8, 2, 256)));
  cases.push_back(make(kFp16, 3, 1, 113, 2, 2, 256));
  cases.push_back(head_dim_v(make(kBf16, 1, 113, 203, 2, 2, 256), 104));
  {
    Case c = causal(make(kBf16, 0, 0, 0, 4, 2, 256));
    c.varlen_q = {17, 0, 203, 1, 64};
    c.varlen_k = {17, 5, 113, 0, 300};
    cases.push_back(c);
  }
  // Score modifiers alone: softcap (saturating with scale 1), ALiBi per head and per (batch, head),
  // bias of each dtype and broadcast, masks random, key padding, block-sparse with masked rows.
  cases.push_back(softcap(causal(make(kBf16, 2, 203, 203, 2, 2, 64)), 30.0f));
  cases.push_back(softcap(make(kFp16, 1, 113, 203, 2, 2, 128), 5.0f, 1.0f));
  cases.push_back(alibi(causal(make(kBf16, 1, 203, 300, 4, 2, 128)), 1));
  cases.push_back(alibi(make(kFp16, 2, 113, 113, 2, 2, 64), 2));
  cases.push_back(alibi(causal(make(kBf16, 2, 300, 113, 2, 2, 64), Alignment::kTopLeft), 2));
  cases.push_back(bias(make(kBf16, 2, 113, 203, 2, 2, 64), 1, DType::kFloat32));
  cases.push_back(bias(causal(make(kFp16, 2, 203, 203, 2, 1, 128)), 2, DType::kFloat16));
  cases.push_back(bias(make(kBf16, 1, 203, 113, 2, 2, 96), 3, DType::kBFloat16));
  cases.push_back(mask(make(kBf16, 1, 203, 203, 2, 2, 64), 1));
  cases.push_back(mask(causal(make(kFp16, 3, 113, 300, 2, 2, 128)), 2));
  cases.push_back(mask(make(kBf16, 1, 300, 500, 2, 2, 128), 3));
  cases.push_back(mask(make(kFp16, 2, 257, 400, 2, 1, 64), 3));
  // All modifiers together, on every instantiation, with causal, windows, GQA and varlen.
  for (int64_t d : {64, 96, 128, 192, 256}) {
    cases.push_back(all_mods(causal(make(kBf16, 2, 203, 300, 4, 2, d)), DType::kFloat32));
    cases.push_back(all_mods(make(kFp16, 1, 300, 203, 2, 2, d), DType::kFloat16));
  }
  cases.push_back(all_mods(window(make(kBf16, 1, 300, 300, 2, 2, 128), 100, 20)));
  {
    Case c = all_mods(causal(make(kBf16, 0, 0, 0, 4, 2, 128)));
    c.varlen_q = {17, 0, 203, 1, 130};
    c.varlen_k = {17, 5, 113, 0, 300};
    cases.push_back(c);
  }
  // V head dims other than Q's: the built pairs, and pairs served by a larger instantiation.
  for (DType t : {kBf16, kFp16}) {
    cases.push_back(head_dim_v(causal(make(t, 2, 203, 300, 4, 2, 192)), 128));
    cases.push_back(head_dim_v(make(t, 1, 113, 203, 2, 2, 64), 128));
  }
  cases.push_back(head_dim_v(make(kBf16, 1, 203, 113, 2, 2, 64), 32));
  cases.push_back(head_dim_v(causal(make(kBf16, 1, 203, 203, 2, 2, 128)), 64));
  cases.push_back(head_dim_v(make(kFp16, 1, 113, 113, 2, 2, 136), 120));
  cases.push_back(head_dim_v(make(kBf16, 1, 113, 113, 2, 2, 40), 104));
  cases.push_back(all_mods(head_dim_v(causal(make(kBf16, 1, 203, 300, 2, 2, 192)), 128)));
  cases.push_back(all_mods(head_dim_v(make(kFp16, 1, 203, 300, 2, 2, 64), 128)));
  // Strided layouts (gaps must stay untouched), no lse, explicit scale.
  add_strided_pair(cases, causal(make(kBf16, 2, 113, 203, 4, 2, 128)));
  return cases;
}

std::vector<Case> large_cases() {
  std::vector<Case> cases;
  cases.push_back(causal(make(DType::kBFloat16, 1, 1023, 1023, 2, 2, 128)));
  cases.push_back(make(DType::kFloat16, 1, 1023, 4097, 2, 1, 64));
  cases.push_back(causal(make(DType::kBFloat16, 1, 4097, 4097, 1, 1, 128)));
  cases.push_back(causal(make(DType::kBFloat16, 1, 4097, 1023, 2, 2, 256), Alignment::kTopLeft));
  cases.push_back(window(make(DType::kFloat16, 1, 4097, 4097, 1, 1, 96), 1000, 0));
  cases.push_back(mask(make(DType::kBFloat16, 1, 2048, 2048, 2, 2, 128), 3));
  cases.push_back(all_mods(causal(make(DType::kBFloat16, 1, 1023, 2048, 2, 1, 256)), DType::kFloat16));
  cases.push_back(head_dim_v(causal(make(DType::kBFloat16, 1, 4097, 4097, 2, 1, 192)), 128));
  // Offsets above 2^31 elements (17 GB of device memory).
  Case huge = causal(make(DType::kBFloat16, 2, 203, 300, 2, 1, 128));
  huge.huge_offsets = true;
  cases.push_back(huge);
  return cases;
}


INSTANTIATE_TEST_SUITE_P(Cases, Sm80ForwardSmall, ::testing::ValuesIn(small_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Cases, Sm80ForwardLarge, ::testing::ValuesIn(large_cases()), case_name);

// Two runs on the same inputs give the same bits.
TEST(Sm80ForwardSmallRepeat, Deterministic) {
  Case c = causal(make(DType::kBFloat16, 2, 203, 300, 4, 2, 128));
  Problem pb(c);
  pb.fill(fresh_seed(c.name()));
  expect_runs_identical(pb, Backend::kCudaSm80);
}

// What the backend does not take is refused by name, before anything runs.
TEST(Sm80ForwardSmallSupport, RefusesWhatItDoesNotImplement) {
  Case c = make(DType::kBFloat16, 1, 17, 17, 2, 2, 64);
  Problem pb(c);
  const ForwardParams good = pb.params();
  ASSERT_TRUE(fd::cuda_sm80_forward_supported(good).ok());
  const auto refused = [](const ForwardParams& p, const char* word) {
    const flashattn::Status st = fd::cuda_sm80_forward_supported(p);
    EXPECT_EQ(st.code, StatusCode::kNotSupported) << word;
    EXPECT_NE(st.message.find(word), std::string::npos) << st.message;
  };
  ForwardParams p = good;
  p.dtype = DType::kFloat32;
  refused(p, "dtype");
  p = good, p.head_dim = 264, p.head_dim_v = 264;
  refused(p, "head_dim");
  p = good, p.head_dim_v = 264;
  refused(p, "head_dim_v 264 with head_dim 64");
  p = good, p.head_dim_v = 36;
  refused(p, "head_dim_v 36 (takes multiples of 8)");
  const float slopes[2] = {0.5f, 0.25f};
  p = good, p.maybe_alibi_slopes = slopes;
  refused(p, "maybe_alibi_slopes is not device memory");
  std::vector<uint8_t> host_mask(17 * 17);
  p = good, p.maybe_mask = {host_mask.data(), 0, 0, 17};
  refused(p, "maybe_mask is not device memory");
  std::vector<uint16_t> host(17 * 2 * 64);
  p = good, p.q.data = host.data();
  refused(p, "q is not device memory");
  p = good, p.k.data = static_cast<const char*>(good.k.data) + 2;
  refused(p, "k: data and strides must be 16-byte aligned");
  p = good, p.v.row_stride = good.v.row_stride + 1;
  refused(p, "v: data and strides");
}

// The public API routes to this backend and refuses, writing nothing, what it cannot run.
TEST(Sm80ForwardSmallSupport, PublicApiSelection) {
  Case c = make(DType::kBFloat16, 1, 17, 17, 2, 2, 64);
  Problem pb(c);
  pb.fill(fresh_seed(c.name()));
  pb.poison();
  flashattn::Launch gpu;
  gpu.backend = Backend::kCudaSm80;
  ForwardParams p = pb.params();
  std::vector<uint8_t> host_mask(17 * 17, 1);
  p.maybe_mask = {host_mask.data(), 0, 0, 17};
  flashattn::Status st = flashattn::forward(p, gpu);
  EXPECT_EQ(st.code, StatusCode::kNotSupported);
  EXPECT_NE(st.message.find("maybe_mask is not device memory"), std::string::npos) << st.message;
  std::vector<uint16_t> host_q(17 * 2 * 64);
  p = pb.params();
  p.q.data = host_q.data();
  st = flashattn::forward(p, gpu);
  EXPECT_EQ(st.code, StatusCode::kNotSupported);
  EXPECT_NE(st.message.find("q is not device memory"), std::string::npos) << st.message;
  CUDA_OK(cudaDeviceSynchronize());
  pb.o.download();
  for (uint16_t x : pb.o.host) ASSERT_EQ(x, kPoison16) << "a refused call wrote the output";
}

}  // namespace
