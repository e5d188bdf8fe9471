// GPU tests of the Hopper forward (Backend::kCudaSm90; sm_90 devices only: elsewhere every test
// skips with a message). Same rule as the sm80 tests, with the same problem and reference
// (support/forward_problem.hpp): fresh random inputs (seed printed; FLASHATTN_TEST_SEED=N
// replays), outputs poisoned with NaN before each run, every element compared with textbook
// attention in double precision; our error <= 2x the error of standard attention computed in the
// same low precision + a small floor; NaN never passes; padding and gaps must stay the poison.
// Then: sm90 against sm80 on the same inputs, the kAuto selection (sm90 where it takes the
// problem, sm80 for the rest), and refusals that name what is not taken, writing nothing. Suites:
// Small, Large (long sequences, 64-bit offsets), Varlen (variable-length batches), Persistent
// (many more work items than multiprocessors: the persistent tile scheduler), PackGqa (the rows of
// a kv head's query heads packed into shared tiles: decode and few-row GQA/MQA shapes), Split (the
// split tail: the last wave's items cut into key ranges over every block).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/sm90/pack_gqa.hpp"
#include "cuda/sm90/policy.hpp"
#include "cuda/sm90/shared_tails.hpp"
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

// The case on sm90 against the fp64 reference, then sm80 on the same inputs: both within the rule,
// and within each other's reach (each is within 2 err_lowp + floor of the exact result).
// check_problem: the same on a problem already made (inputs uploaded).
void check_problem(Problem* pb) {
  const Case& cs = pb->c;
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

void check_case(const Case& cs) {
  SKIP_UNLESS_HOPPER();
  const std::unique_ptr<Problem> pb = new_problem(cs);
  if (::testing::Test::HasFailure()) return;
  check_problem(pb.get());
}

class Sm90ForwardSmall : public ::testing::TestWithParam<Case> {};
class Sm90ForwardLarge : public ::testing::TestWithParam<Case> {};
class Sm90ForwardVarlen : public ::testing::TestWithParam<Case> {};
class Sm90ForwardPersistent : public ::testing::TestWithParam<Case> {};
TEST_P(Sm90ForwardSmall, MatchesReferenceAndSm80) { check_case(GetParam()); }
TEST_P(Sm90ForwardLarge, MatchesReferenceAndSm80) { check_case(GetParam()); }
TEST_P(Sm90ForwardVarlen, MatchesReferenceAndSm80) { check_case(GetParam()); }
TEST_P(Sm90ForwardPersistent, MatchesReferenceAndSm80) { check_case(GetParam()); }
std::vector<Case> small_cases() {
  // Sizes that are not tile multiples (Br = 192 at d = 64, 128 above; Bc = 128), Sq != Sk, GQA/MQA
  // (the K/V tensor maps' head coordinate), then what is particular to this path.
  std::vector<Case> cases = base_small_cases();
  constexpr DType kBf16 = DType::kBFloat16, kFp16 = DType::kFloat16;
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
  // Narrow first tiles at d = 128 without a band (policy narrow_keys = 16, narrow_widths = 2 in a
  // build with FLASHATTN_SM90_NARROW_TAIL on, Bc = 80): the walk's first tile holds the sequence's
  // last 1-80 keys, computed over 16 or 32 of them (1-16, 17-32 keys) or whole (33-80); both ends of
  // each.
  for (int64_t sk : {81, 96, 97, 112, 113, 144, 160})
    cases.push_back(make(sk % 2 == 0 ? kBf16 : kFp16, 1, 203, sk, 2, 1, 128));
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
  // Row maxima that grow along the keys, by steps below and above the lazy rescale's threshold
  // (softmax.cuh: m kept, then moved, tile after tile), and a large scale (a near one-hot softmax
  // whose maximum jumps).
  cases.push_back(key_ramp(make(kBf16, 1, 203, 1000, 2, 2, 128), 8.0f));
  cases.push_back(key_ramp(causal(make(kFp16, 1, 300, 1100, 2, 1, 64)), 8.0f));
  cases.push_back(key_ramp(make(kBf16, 1, 150, 900, 2, 2, 256), 8.0f));
  cases.push_back(key_ramp(window(make(kFp16, 1, 203, 800, 2, 2, 96), 300, 0), 12.0f));
  {
    Case sharp = make(kBf16, 1, 203, 700, 2, 2, 128);
    sharp.scale = 1.0f;
    cases.push_back(sharp);
  }
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
  cases.push_back(causal(make(DType::kFloat16, 2, 1023, 4097, 4, 2, 192)));
  // Offsets above 2^31 elements (17 GB of device memory).
  Case huge = causal(make(DType::kBFloat16, 2, 203, 300, 2, 1, 128));
  huge.huge_offsets = true;
  cases.push_back(huge);
  return cases;
}

// Variable-length batches (tile_scheduler.cuh): lengths that are not tile multiples (Br = 192 at
// d = 64, 128 above; Bc = 128, 128, 128, 96, 80), empty sequences on either side, sequences shorter
// than one tile first in the packed tensors (their tail boxes start before row 0) and last (they end
// at the packed total), sequences of several tiles, both causal alignments, Sq > Sk (rows and whole
// tiles with no visible key), windows, GQA / MQA, softcap, strided rows. The rows past a sequence's
// end in a box belong to its neighbours: they must neither be seen nor be written.
std::vector<Case> varlen_cases() {
  std::vector<Case> cases;
  constexpr DType kBf16 = DType::kBFloat16, kFp16 = DType::kFloat16;
  const std::vector<int32_t> q6 = {17, 0, 203, 1, 300, 64}, k6 = {17, 5, 113, 0, 300, 700};
  for (Alignment a : {Alignment::kBottomRight, Alignment::kTopLeft}) {
    cases.push_back(causal(varlen(make(kBf16, 0, 0, 0, 4, 2, 128), q6, k6), a));
    cases.push_back(causal(varlen(make(kFp16, 0, 0, 0, 6, 2, 64), q6, k6), a));  // ring of three
  }
  cases.push_back(varlen(make(kBf16, 0, 0, 0, 4, 2, 128), q6, k6));
  cases.push_back(varlen(make(kFp16, 0, 0, 0, 4, 1, 64), {203, 17, 0, 450}, {300, 17, 9, 129}));
  cases.push_back(causal(varlen(make(kBf16, 0, 0, 0, 2, 2, 96), {300, 130, 5}, {100, 129, 1})));  // Sq > Sk
  cases.push_back(window(varlen(make(kBf16, 0, 0, 0, 2, 1, 256), {100, 250, 3}, {90, 260, 170}), 30, 0));
  cases.push_back(window(varlen(make(kFp16, 0, 0, 0, 2, 2, 192), {97, 0, 290}, {200, 33, 95}), 60, 20));
  cases.push_back(softcap(causal(varlen(make(kBf16, 0, 0, 0, 4, 4, 192), {1, 129, 64}, {250, 96, 97})), 20.0f));
  cases.push_back(strided(causal(varlen(make(kBf16, 0, 0, 0, 4, 2, 128), {64, 128, 129, 1}, {64, 127, 300, 1}),
                                 Alignment::kTopLeft)));
  // One sequence: its tail boxes end at the packed total (nothing may be read past it).
  cases.push_back(varlen(make(kFp16, 0, 0, 0, 2, 2, 256), {203}, {113}));
  return cases;
}

// Varlen boxes that start before their sequence (a sequence shorter than Bc has one K/V box, moved
// back to end at its end) read zeros there, not the previous sequence's rows: the sequences without
// queries (0, 2, 5) hold K = NaN and V = NaN, +Inf and -Inf in every row, and the short sequences
// after them (1: 50 keys, 4: 1, 6: 100; Bc = 80-128) must come out as exact as ever. Masking alone
// does not keep them out (0 x Inf and NaN x 0 are NaN in P V).
class Sm90ForwardVarlenRows : public ::testing::TestWithParam<Case> {};
TEST_P(Sm90ForwardVarlenRows, NonFiniteRowsOfOtherSequencesStayOut) {
  SKIP_UNLESS_HOPPER();
  const Case& cs = GetParam();
  const std::unique_ptr<Problem> pb = new_problem(cs);
  if (::testing::Test::HasFailure()) return;
  const uint16_t nan = to_storage(NAN, cs.dtype), inf = to_storage(INFINITY, cs.dtype),
                 minus_inf = to_storage(-INFINITY, cs.dtype);
  int64_t poisoned_rows = 0;
  for (size_t b = 0; b < cs.varlen_q.size(); ++b) {
    if (cs.varlen_q[b] != 0) continue;
    for (int32_t r = pb->host_cu_k[b]; r < pb->host_cu_k[b + 1]; ++r, ++poisoned_rows)
      for (int64_t h = 0; h < cs.hkv; ++h)
        for (int64_t i = 0; i < cs.d; ++i) {
          pb->k.host[pb->k.at(0, r, h, i)] = nan;
          pb->v.host[pb->v.at(0, r, h, i)] = (r + i) % 3 == 0 ? nan : (r + i) % 3 == 1 ? inf : minus_inf;
        }
  }
  ASSERT_EQ(poisoned_rows, 300 + 200 + 130) << "the key rows of the query-less sequences";
  pb->k.upload();
  pb->v.upload();
  check_problem(pb.get());
}
std::vector<Case> varlen_rows_cases() {
  const std::vector<int32_t> q = {0, 50, 0, 70, 33, 0, 9}, k = {300, 50, 200, 70, 1, 130, 100};
  return {varlen(make(DType::kBFloat16, 0, 0, 0, 4, 2, 128), q, k),
          causal(varlen(make(DType::kFloat16, 0, 0, 0, 2, 2, 64), q, k)),
          varlen(make(DType::kBFloat16, 0, 0, 0, 2, 1, 96), q, k),
          causal(varlen(make(DType::kFloat16, 0, 0, 0, 2, 2, 192), q, k), Alignment::kTopLeft),
          varlen(make(DType::kBFloat16, 0, 0, 0, 2, 2, 256), q, k)};
}

// The persistent schedule (tile_scheduler.cuh): several times more work items than the H100/H200's
// 132 multiprocessors (batch 3 x 20 heads x 6-8 query tiles), so that every block runs many items
// and the K/V pipeline, q_full/q_empty and the consumers' ring of turns carry over from item to
// item; causal and not, windows, and Sq > Sk under causal masking, where whole items see no key
// tile (their rows O = 0, lse = -inf, no Q loaded) between items that do. The policy runs every
// head dim persistent (policy.hpp: `persistent`); FLASHATTN_SM90_PERSISTENT=0 in the environment
// runs these cases with one block per item instead.
std::vector<Case> persistent_cases() {
  std::vector<Case> cases;
  constexpr DType kBf16 = DType::kBFloat16, kFp16 = DType::kFloat16;
  cases.push_back(causal(make(kBf16, 3, 1000, 1000, 20, 4, 128)));
  cases.push_back(make(kFp16, 3, 1000, 1000, 20, 20, 64));
  cases.push_back(window(make(kBf16, 3, 1000, 1000, 20, 20, 128), 100, 0));
  cases.push_back(causal(make(kBf16, 3, 1000, 300, 20, 10, 128)));                 // items 0-4 see nothing
  cases.push_back(causal(make(kFp16, 3, 1000, 250, 20, 5, 64)));                   // ring of three
  cases.push_back(causal(make(kBf16, 3, 1000, 300, 20, 10, 256)));                 // d 256, no turns
  cases.push_back(softcap(causal(make(kBf16, 3, 1000, 1000, 20, 20, 192)), 30.0f));  // overlap, no turns
  cases.push_back(window(make(kFp16, 3, 1000, 1000, 20, 20, 96), 300, 300));
  // Causal pairs over more than one round of the stride (80 heads x 2 pairs of 192-row tiles = 160
  // pairs, more than the H200's 132 blocks), so the rotated walk hands out the second round.
  cases.push_back(causal(make(kBf16, 5, 400, 400, 16, 16, 64)));
  // Paired tiles end at the sequence's end (tile_scheduler.cuh: lead): sq 500 in 192-row tiles has
  // lead 76, so tile 0 starts at row -76, its first slice holds no row and its second rows -12..51.
  // Bottom-right (sk 560) those rows before 0 see keys; top-left with a window, none.
  cases.push_back(causal(make(kBf16, 3, 500, 560, 20, 20, 64)));  // MHA: pack-GQA would set lead 0
  cases.push_back(window(causal(make(kFp16, 3, 500, 500, 20, 20, 64), Alignment::kTopLeft), 150, -1));
  // Over 64 rounds a block (10000 items of one query tile and two key tiles on 132 blocks, the last
  // rounds split): the ring of ItemInfo slots and every barrier's phases lap many times.
  cases.push_back(make(kBf16, 10, 64, 100, 1000, 1000, 128));
  return cases;
}

// The split tail (tile_scheduler.cuh, split_tail.cuh): items of equal cost (no band, no varlen)
// that do not fill the last wave of the persistent grid (checked first: the case asks for the split's
// workspace), so that the last rounds run as units (item, key tile) and items cut over two blocks
// merge their states through the workspace. Every head dim (Bc = 128, 128, 128, 96, 80: 8, 8, 8,
// 11 and 13 key tiles of 1000 keys, the last one partial), one round of whole items before the
// tail or none, GQA and MQA, Sq != Sk, softcap, strided layouts, two key tiles per item (a block
// range that holds barely more than one item), and decode-like pack-GQA rows (140 items on 132
// blocks: all of them in the tail).
std::vector<Case> split_cases() {
  std::vector<Case> cases;
  constexpr DType kBf16 = DType::kBFloat16, kFp16 = DType::kFloat16;
  cases.push_back(make(kBf16, 3, 1000, 1000, 20, 20, 128));  // 480 items: 1 whole round, 216 in the tail
  cases.push_back(make(kFp16, 3, 1000, 1000, 20, 20, 64));   // 360 items of 192 rows
  cases.push_back(make(kBf16, 3, 1000, 1000, 20, 20, 256));
  cases.push_back(make(kFp16, 3, 1000, 1000, 20, 4, 96));
  cases.push_back(make(kBf16, 3, 1000, 1000, 20, 20, 192));
  cases.push_back(make(kBf16, 2, 600, 2100, 24, 1, 128));    // MQA, Sq != Sk: pack-GQA, 226 items
  cases.push_back(make(kFp16, 2, 1500, 129, 16, 8, 128));     // two key tiles per item
  cases.push_back(softcap(make(kBf16, 3, 1000, 1000, 20, 10, 128), 20.0f));
  cases.push_back(make(kBf16, 70, 1, 1000, 16, 2, 128));     // pack-GQA decode: 140 items
  add_strided_pair(cases, make(kFp16, 3, 1000, 777, 20, 20, 128));
  return cases;
}

// FLASHATTN_SM90_SPLIT=value for the guard's scope (forward.cu reads it at every call): 1 splits
// wherever the problem allows, whatever the idle share, so that small shapes test the mechanism.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};
class SplitEnv : public ScopedEnv {
 public:
  explicit SplitEnv(const char* value) : ScopedEnv("FLASHATTN_SM90_SPLIT", value) {}
};

class Sm90ForwardSplit : public ::testing::TestWithParam<Case> {};
TEST_P(Sm90ForwardSplit, MatchesReferenceAndSm80) {
  SKIP_UNLESS_HOPPER();
  const SplitEnv always("1");
  {
    const std::unique_ptr<Problem> pb = new_problem(GetParam());
    if (::testing::Test::HasFailure()) return;
    ASSERT_GT(fd::cuda_sm90_forward_workspace(pb->params()), 0u) << "the case must take the split tail";
  }
  check_case(GetParam());
}

// Pack-GQA (tile_scheduler.cuh, policy.hpp's pack_gqa): every case here must be one the rule packs
// (checked first), so that the packed Q copy, the per-row query index of the mask (r / group), the
// query range behind the visible and fully-seen key tiles, and the per-row (query, head) epilogue
// are what runs. Br = 192 at d = 64, 128 above. Decode (sq = 1 against 1000-4097 keys; groups 4, 8,
// 16; MQA), every head dim and two served by the next one up, few rows (sq = 5, 17, 63, 100 with
// groups 2, 6, 8: tiles that end inside a query's group of rows, and a last tile holding a partial
// group), causal both alignments (bottom-right is decode's), Sq > Sk under bottom-right causal
// (whole tiles with no visible key: no Q copied, O = 0, lse = -inf), windows, softcap, strided
// layouts without lse, variable-length batches (empty sequences, sequences of one row), and a
// persistent grid with several items per block.
std::vector<Case> pack_gqa_cases() {
  std::vector<Case> cases;
  constexpr DType kBf16 = DType::kBFloat16, kFp16 = DType::kFloat16;
  // Decode.
  cases.push_back(make(kBf16, 2, 1, 1000, 8, 2, 128));                               // group 4
  cases.push_back(make(kFp16, 1, 1, 4097, 8, 1, 64));                                // MQA, group 8
  cases.push_back(make(kBf16, 2, 1, 2049, 16, 1, 256));                              // MQA, group 16
  cases.push_back(causal(make(kBf16, 1, 1, 1537, 32, 2, 128)));                      // group 16
  cases.push_back(causal(make(kFp16, 2, 1, 1001, 8, 2, 96), Alignment::kTopLeft));  // one key visible
  cases.push_back(window(make(kBf16, 1, 1, 4097, 8, 1, 128), 1000, 0));              // sliding window
  cases.push_back(softcap(causal(make(kFp16, 1, 1, 3000, 16, 4, 192)), 30.0f));
  // Every instantiation (and head dims served by the next one up), decode and a few rows.
  for (int64_t d : {40, 64, 96, 128, 136, 192, 256}) {
    cases.push_back(causal(make(d % 64 == 0 ? kBf16 : kFp16, 2, 1, 1000 + d, 8, 2, d)));
    cases.push_back(causal(make(d % 64 == 0 ? kFp16 : kBf16, 1, 17, 700 + d, 8, 2, d), Alignment::kTopLeft));
  }
  // Few rows: sq 5, 17, 63, 100 with groups 2, 6, 8; both causal alignments.
  for (Alignment a : {Alignment::kBottomRight, Alignment::kTopLeft}) {
    cases.push_back(causal(make(kBf16, 2, 5, 1000, 4, 2, 128), a));    // group 2
    cases.push_back(causal(make(kBf16, 2, 17, 300, 12, 2, 128), a));   // group 6
    cases.push_back(causal(make(kFp16, 1, 63, 500, 16, 2, 64), a));    // group 8, three consumers
    cases.push_back(causal(make(kBf16, 1, 100, 1000, 6, 1, 256), a));  // group 6, MQA
    cases.push_back(causal(make(kFp16, 1, 63, 257, 4, 2, 192), a));    // group 2
    cases.push_back(causal(make(kBf16, 1, 100, 333, 16, 2, 96), a));   // group 8
  }
  cases.push_back(make(kFp16, 2, 100, 1000, 12, 2, 64));         // group 6, Br 192
  cases.push_back(make(kBf16, 1, 5, 129, 16, 2, 128));           // group 8
  cases.push_back(causal(make(kBf16, 1, 100, 40, 8, 1, 128)));  // Sq > Sk: queries 0-59 see nothing
  cases.push_back(causal(make(kFp16, 1, 63, 20, 12, 2, 64)));   // Sq > Sk, group 6
  // Windows.
  cases.push_back(window(make(kFp16, 2, 63, 700, 4, 2, 128), 100, 0));
  cases.push_back(window(make(kBf16, 1, 100, 300, 8, 1, 64), 37, 5));
  cases.push_back(window(causal(make(kBf16, 1, 17, 600, 12, 2, 256), Alignment::kTopLeft), 50, -1));
  cases.push_back(window(make(kFp16, 1, 100, 100, 6, 1, 192), -1, 3));
  // Softcap.
  cases.push_back(softcap(causal(make(kBf16, 2, 5, 1000, 4, 2, 192)), 30.0f));
  cases.push_back(softcap(make(kFp16, 1, 17, 2000, 16, 2, 96), 5.0f, 1.0f));
  cases.push_back(softcap(window(make(kBf16, 1, 63, 400, 16, 2, 64), 70, 0), 20.0f));
  // Strided layouts (gaps untouched), no lse, explicit scale.
  add_strided_pair(cases, causal(make(kBf16, 2, 17, 513, 6, 1, 128)));
  // Variable-length batches (the longest sequence decides the packing; empty and one-row sequences).
  const std::vector<int32_t> q4 = {1, 17, 0, 63}, k4 = {1000, 300, 5, 64};
  cases.push_back(causal(varlen(make(kBf16, 0, 0, 0, 8, 2, 128), q4, k4)));
  cases.push_back(causal(varlen(make(kFp16, 0, 0, 0, 16, 2, 64), q4, k4), Alignment::kTopLeft));
  cases.push_back(window(varlen(make(kBf16, 0, 0, 0, 6, 1, 256), {5, 1, 100}, {700, 1, 90}), 30, 0));
  // Persistent grid: 6 batch x 6 kv heads x 7 tiles of 128 rows (group 8), several items per block.
  cases.push_back(causal(make(kBf16, 6, 100, 256, 48, 6, 128)));
  cases.push_back(make(kFp16, 6, 100, 256, 48, 6, 192));
  return cases;
}

// The case must be one that the sm90 path packs; then as check_case.
class Sm90ForwardPackGqa : public ::testing::TestWithParam<Case> {};
TEST_P(Sm90ForwardPackGqa, MatchesReferenceAndSm80) {
  SKIP_UNLESS_HOPPER();
  {
    const std::unique_ptr<Problem> pb = new_problem(GetParam());
    if (::testing::Test::HasFailure()) return;
    ASSERT_TRUE(fd::cuda_sm90_forward_packs_gqa(pb->params())) << "the case must take the pack-GQA path";
  }
  check_case(GetParam());
}

// The rule (policy.hpp's pack_gqa) on the host's params: packed exactly when it makes fewer query
// tiles; not for MHA, nor when the tiles are full either way (sq a multiple of Br: 384 of 128 or
// 192), nor when the unpacked tiles are already as few (sq = 100, group 2: two tiles either way).
TEST(Sm90ForwardPackGqa, RuleTakesThePackedPathForFewRows) {
  SKIP_UNLESS_HOPPER();
  const auto packs = [](const Case& c) {
    const std::unique_ptr<Problem> pb = new_problem(c);
    return pb != nullptr && !::testing::Test::HasFailure() && fd::cuda_sm90_forward_packs_gqa(pb->params());
  };
  EXPECT_TRUE(packs(make(DType::kBFloat16, 1, 1, 300, 8, 1, 128)));
  EXPECT_TRUE(packs(make(DType::kBFloat16, 1, 63, 300, 4, 2, 128)));
  EXPECT_TRUE(packs(make(DType::kFloat16, 1, 100, 300, 16, 2, 64)));
  EXPECT_FALSE(packs(make(DType::kBFloat16, 1, 1, 300, 8, 8, 128)));    // MHA
  EXPECT_FALSE(packs(make(DType::kBFloat16, 1, 384, 300, 8, 1, 128)));  // full tiles either way
  EXPECT_FALSE(packs(make(DType::kBFloat16, 1, 100, 300, 4, 2, 128)));  // two tiles either way
  EXPECT_FALSE(packs(make(DType::kFloat16, 1, 192, 300, 4, 1, 64)));    // Br 192: full either way
}

// Shared tails (tile_scheduler.cuh; d = 128 without a band, Br = 192, Bc = 80): the last query tile
// whose rows fill one consumer's slice (sq % 192 in 1 .. 64) with three key tiles or more runs on all
// three consumers, each over every third key tile, the three states merged. Tails of 40, 11, 64 and
// 1 rows; 13 key tiles (shares of 5, 4, 4, the partial last key tile in consumer 0's first), 10, 5
// (2, 2, 1: the short share's empty turn), 4, and 3 (one tile each, the first of a single key);
// head dims served by the d = 128 instantiation (112); 512 heads (tails over more than one round of
// the grid); a problem of tails only (sq = 40) and MHA decode (sq = 1 against 4096 keys, 52 tiles);
// softcap, a growing row maximum (the shares' maxima differ), no lse and strided rows. (GQA with such
// tails always packs: fewer tiles. The split tail after shared tails: the Split suite's d = 128 cases
// and SplitWithCreditIsExact.)
std::vector<Case> shared_tail_cases() {
  std::vector<Case> cases;
  constexpr DType kBf16 = DType::kBFloat16, kFp16 = DType::kFloat16;
  cases.push_back(make(kBf16, 1, 1000, 1000, 4, 4, 128));
  cases.push_back(make(kFp16, 2, 203, 777, 5, 5, 112));
  cases.push_back(make(kBf16, 2, 256, 333, 3, 3, 128));
  cases.push_back(make(kFp16, 1, 193, 250, 2, 2, 128));
  cases.push_back(make(kBf16, 16, 203, 161, 32, 32, 128));
  cases.push_back(make(kBf16, 3, 203, 240, 3, 3, 128));
  cases.push_back(make(kBf16, 2, 40, 300, 5, 5, 128));
  cases.push_back(make(kBf16, 2, 1, 4096, 8, 8, 128));
  cases.push_back(softcap(make(kFp16, 1, 203, 300, 3, 3, 128), 5.0f));
  cases.push_back(key_ramp(make(kBf16, 1, 1000, 900, 3, 3, 128), 8.0f));
  add_strided_pair(cases, make(kBf16, 2, 1000, 500, 4, 4, 128));
  return cases;
}

// Whether the d = 128 unbanded policy shares tails (policy.hpp's share_tails, on by default; in a
// build with -DFLASHATTN_SM90_SHARE_TAILS=OFF the cases below run as plain items, and the rule
// expects none).
constexpr bool kSharedTailsOn = fd::sm90::forward_tiles(128, false).share_tails;

// The case must be one the sm90 path runs with shared tails where the policy shares them (the
// strided pair's d = 64 case has none: its policy does not); then as check_case.
class Sm90ForwardSharedTails : public ::testing::TestWithParam<Case> {};
TEST_P(Sm90ForwardSharedTails, MatchesReferenceAndSm80) {
  SKIP_UNLESS_HOPPER();
  {
    const std::unique_ptr<Problem> pb = new_problem(GetParam());
    if (::testing::Test::HasFailure()) return;
    const int tails = fd::cuda_sm90_forward_shared_tails(pb->params());
    if (GetParam().d > 64 && kSharedTailsOn) {
      ASSERT_EQ(tails, GetParam().batch * GetParam().hq) << "the case must share every head's last tile";
    } else {
      ASSERT_EQ(tails, 0) << (GetParam().d > 64 ? "the d = 128 policy's share_tails is off" : "d = 64's policy shares none");
    }
  }
  check_case(GetParam());
}

// The rule (forward.cu, schedule_params): one shared tail per (batch, head) where the last tile's
// rows fill one slice of the d = 128 unbanded policy and there are three key tiles or more; none for
// two slices' rows, full tiles, a band, fewer key tiles, pack-GQA, another head dim's policy, or
// FLASHATTN_SM90_SHARED_TAILS=0.
TEST(Sm90ForwardSharedTails, RuleSharesOneSliceTails) {
  SKIP_UNLESS_HOPPER();
  static_assert(fd::sm90::forward_tiles(128, false).block_m() == 192 && fd::sm90::forward_tiles(128, false).block_n == 80);
  const int on = kSharedTailsOn ? 1 : 0;  // policy.hpp's switch: every count is 0 while it is off
  const auto tails = [](const Case& c) {
    const std::unique_ptr<Problem> pb = new_problem(c);
    return pb == nullptr || ::testing::Test::HasFailure() ? -1 : fd::cuda_sm90_forward_shared_tails(pb->params());
  };
  EXPECT_EQ(tails(make(DType::kBFloat16, 4, 4096, 4096, 16, 16, 128)), 64 * on);  // 21 x 192 + 64
  EXPECT_EQ(tails(make(DType::kBFloat16, 1, 1000, 300, 4, 4, 128)), 4 * on);
  EXPECT_EQ(tails(make(DType::kBFloat16, 1, 1000, 300, 1, 1, 128)), 1 * on);    // one head
  EXPECT_EQ(tails(make(DType::kBFloat16, 1, 1000, 161, 4, 4, 128)), 4 * on);    // three key tiles
  EXPECT_EQ(tails(make(DType::kBFloat16, 1, 1000, 160, 4, 4, 128)), 0);         // two
  EXPECT_EQ(tails(make(DType::kBFloat16, 1, 1000, 300, 4, 2, 128)), 0);         // GQA: packs
  EXPECT_EQ(tails(make(DType::kBFloat16, 1, 1100, 300, 4, 4, 128)), 0);         // 1100 = 5 x 192 + 140
  EXPECT_EQ(tails(make(DType::kBFloat16, 1, 384, 300, 4, 4, 128)), 0);          // full tiles
  EXPECT_EQ(tails(causal(make(DType::kBFloat16, 1, 1000, 1000, 4, 4, 128))), 0);
  EXPECT_EQ(tails(make(DType::kBFloat16, 1, 1, 300, 8, 1, 128)), 0);            // pack-GQA
  EXPECT_EQ(tails(make(DType::kBFloat16, 1, 1000, 300, 4, 4, 256)), 0);
  const ScopedEnv off("FLASHATTN_SM90_SHARED_TAILS", "0");  // the measurement switch
  EXPECT_EQ(tails(make(DType::kBFloat16, 1, 1000, 300, 4, 4, 128)), 0);
}

// The split tail after shared tails, with a credit per tail (tile_scheduler.cuh, tail_units_begin:
// the tails' blocks take more of the tail's units): 60 tails and 360 items on 132 SMs, 13 key tiles
// an item (22 tails in the whole round, the others in the split's items, run as parts), the default
// credit (kSharedTailCreditPercent of 13) and others set by FLASHATTN_SM90_SHARED_TAIL_CREDIT; a
// credit that would leave a block less than an item's units is refused (none: 100 tails, 44 of them
// in the whole round, 168 items in the split: (168 - 44) 13 / 132 < 13 units a block at 100%); then
// exact, and bit-identical run after run.
TEST(Sm90ForwardSharedTails, SplitWithCreditIsExact) {
  SKIP_UNLESS_HOPPER();
  if (!kSharedTailsOn) GTEST_SKIP() << "the d = 128 policy shares no tails";
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (sms != 132) GTEST_SKIP() << "the shapes are counted for 132 SMs, this device has " << sms;
  const SplitEnv always("1");
  const Case c = make(DType::kBFloat16, 3, 1000, 1000, 20, 20, 128);
  const auto credit = [](const Case& x) {
    const std::unique_ptr<Problem> pb = new_problem(x);
    return pb == nullptr || ::testing::Test::HasFailure() ? -1 : fd::cuda_sm90_forward_shared_tail_credit(pb->params());
  };
  EXPECT_EQ(credit(c), fd::kSharedTailCreditPercent * 13 / 100);
  EXPECT_EQ(credit(make(DType::kBFloat16, 3, 1152, 1000, 20, 20, 128)), 0) << "full tiles: no shared tails, no credit";
  const Case many = make(DType::kBFloat16, 1, 424, 1000, 100, 100, 128);
  {
    const ScopedEnv all("FLASHATTN_SM90_SHARED_TAIL_CREDIT", "100");
    EXPECT_EQ(credit(many), 0);
  }
  {
    const ScopedEnv none("FLASHATTN_SM90_SHARED_TAIL_CREDIT", "0");
    EXPECT_EQ(credit(c), 0);
  }
  const ScopedEnv some("FLASHATTN_SM90_SHARED_TAIL_CREDIT", "30");  // 3 units of 13
  ASSERT_EQ(credit(many), 3);
  ASSERT_EQ(credit(c), 3);
  check_case(c);
  check_case(many);
  std::unique_ptr<Problem> pb(new_problem(c));
  expect_runs_identical(*pb, Backend::kCudaSm90);
}

INSTANTIATE_TEST_SUITE_P(Cases, Sm90ForwardSharedTails, ::testing::ValuesIn(shared_tail_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Cases, Sm90ForwardSmall, ::testing::ValuesIn(small_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Cases, Sm90ForwardLarge, ::testing::ValuesIn(large_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Cases, Sm90ForwardVarlen, ::testing::ValuesIn(varlen_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Cases, Sm90ForwardVarlenRows, ::testing::ValuesIn(varlen_rows_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Cases, Sm90ForwardPersistent, ::testing::ValuesIn(persistent_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Cases, Sm90ForwardPackGqa, ::testing::ValuesIn(pack_gqa_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Cases, Sm90ForwardSplit, ::testing::ValuesIn(split_cases()), case_name);

// The split tail gives the same bits run after run (either part of a cut item may finish first; the
// merge's sum does not depend on which), and without the workspace it asks for, the call is refused
// naming launch.workspace, the output untouched.
TEST(Sm90ForwardSplit, DeterministicAndNeedsItsWorkspace) {
  SKIP_UNLESS_HOPPER();
  const SplitEnv always("1");
  std::unique_ptr<Problem> pb(new_problem(make(DType::kBFloat16, 3, 1000, 1000, 20, 20, 128)));
  ASSERT_GT(fd::cuda_sm90_forward_workspace(pb->params()), 0u);
  std::vector<float> lse_a, lse_b;
  run(*pb, Backend::kCudaSm90, &lse_a);
  const std::vector<uint16_t> first = pb->o.host;
  for (int i = 0; i < 3; ++i) {
    run(*pb, Backend::kCudaSm90, &lse_b);
    ASSERT_EQ(first, pb->o.host) << "run " << i + 2;
    ASSERT_EQ(0, std::memcmp(lse_a.data(), lse_b.data(), lse_a.size() * 4)) << "run " << i + 2;
  }
  pb->poison();
  flashattn::Launch sm90;
  sm90.backend = Backend::kCudaSm90;
  const flashattn::Status st = flashattn::forward(pb->params(), sm90);
  EXPECT_EQ(st.code, StatusCode::kInvalidArgument) << st.message;
  EXPECT_NE(st.message.find("launch.workspace"), std::string::npos) << st.message;
  CUDA_OK(cudaDeviceSynchronize());
  pb->o.download();
  for (uint16_t x : pb->o.host) ASSERT_EQ(x, kPoison16) << "a refused call wrote the output";
}

// The rule (forward.cu, split_tail): the split where the last wave would leave enough idle (160
// items of 32 key tiles on 114-132 SMs: 1.2-1.4 waves), not where items do not all cost the same
// (causal), not with fewer items than SMs, not when FLASHATTN_SM90_SPLIT=0; on 132 SMs not for a
// last wave 97% full (256 items: 8 blocks idle for 32 tiles, 2 tiles' time a block on average).
TEST(Sm90ForwardSplit, RuleSplitsWhereTheLastWaveIdles) {
  SKIP_UNLESS_HOPPER();
  constexpr fd::sm90::ForwardTiles kTiles = fd::sm90::forward_tiles(96, false);
  static_assert(kTiles.block_m() == 128 && kTiles.block_n == 128,
                "the shapes below count 32 query tiles and 32 key tiles at d = 96, n = 4096");
  const auto split_bytes = [](const Case& c) {
    const std::unique_ptr<Problem> pb = new_problem(c);
    return pb == nullptr || ::testing::Test::HasFailure() ? size_t{0} : fd::cuda_sm90_forward_workspace(pb->params());
  };
  const Case idle = make(DType::kBFloat16, 1, 4096, 4096, 5, 5, 96);
  EXPECT_GT(split_bytes(idle), 0u);
  EXPECT_EQ(split_bytes(causal(idle)), 0u);
  EXPECT_EQ(split_bytes(make(DType::kBFloat16, 1, 4096, 4096, 1, 1, 96)), 0u);  // 32 items
  {
    const SplitEnv never("0");
    EXPECT_EQ(split_bytes(idle), 0u);
  }
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  if (sms == 132) {
    EXPECT_EQ(split_bytes(make(DType::kBFloat16, 1, 4096, 4096, 8, 8, 96)), 0u);
  }
}

// Two runs on the same inputs give the same bits.
TEST(Sm90ForwardSmall, Deterministic) {
  SKIP_UNLESS_HOPPER();
  std::unique_ptr<Problem> pb(new_problem(causal(make(DType::kBFloat16, 2, 203, 300, 4, 2, 128))));
  expect_runs_identical(*pb, Backend::kCudaSm90);
}

// kAuto on device data: the sm90 path where it takes the problem, variable-length batches included
// (bit-identical to an explicit kCudaSm90 run), the sm80 path for a problem with a bias or a mask
// (bit-identical to kCudaSm80).
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

  std::unique_ptr<Problem> packed(
      new_problem(causal(varlen(make(DType::kFloat16, 0, 0, 0, 4, 2, 64), {17, 0, 203}, {30, 5, 113}))));
  const flashattn::Status packed_status = fd::cuda_sm90_forward_supported(packed->params());
  ASSERT_TRUE(packed_status.ok()) << "variable-length batches are the sm90 path's: " << packed_status.message;
  same_bits(*packed, Backend::kCudaSm90);

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
  const int32_t host_cu[2] = {0, 17};  // varlen is taken, from device memory
  p = good, p.maybe_cu_seqlens_q = host_cu, p.maybe_cu_seqlens_k = host_cu;
  refused(p, "maybe_cu_seqlens_q is not device memory");
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
  for (uint16_t x : pb->o.host) ASSERT_EQ(x, kPoison16) << "a refused call wrote the output";
}

}  // namespace
