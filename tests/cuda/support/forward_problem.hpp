// The forward GPU tests' problem (sm80_forward_tests.cpp, sm90_forward_tests.cpp): a Case, its
// random inputs on host and device with poisoned outputs, textbook attention on the host, and the
// tolerance rule. Rule: our error <= 2x the error of standard attention computed in the same low
// precision (S and P rounded to the storage type, fp32 softmax) + a small floor; NaN never passes;
// padding and gaps must stay the poison; rows with no visible key get O = 0 and lse = -inf.
// Score modifiers (softcap, ALiBi, bias, mask) go through problem.hpp's ScoreMods::apply on the
// host, the definition every backend shares.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/support/cuda_test_util.hpp"
#include "cuda/support/score_mod_inputs.hpp"
#include "flashattn/flashattn.hpp"

namespace fa_cuda_test {

constexpr double kFloor = 1e-3;
constexpr double kLseTolerance = 2e-3;

struct Case {
  flashattn::DType dtype = flashattn::DType::kBFloat16;
  int64_t batch = 1, sq = 17, sk = 17, hq = 2, hkv = 2, d = 64;
  bool causal = false;
  flashattn::Alignment alignment = flashattn::Alignment::kBottomRight;
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
  flashattn::DType bias_dtype = flashattn::DType::kFloat32;
  int mask = 0;               // 0: none, 1: random, 2: key padding [B, Sk], 3: block-sparse with masked rows
  float key_ramp = 0.0f;      // key row r (of `rows`) scaled by 1 + key_ramp r / rows: row maxima that
                              // keep growing along the keys, in steps large and small

  int64_t head_dim_v() const { return dv > 0 ? dv : d; }
  std::string name() const;
};

// Case builders: make(...) and the options, each returning the changed copy.
Case make(flashattn::DType t, int64_t b, int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d);
Case causal(Case c, flashattn::Alignment a = flashattn::Alignment::kBottomRight);
Case window(Case c, int64_t left, int64_t right);
Case softcap(Case c, float cap, float scale = 0.0f);
Case alibi(Case c, int kind);
Case bias(Case c, int kind, flashattn::DType t);
Case mask(Case c, int kind);
Case head_dim_v(Case c, int64_t dv);
Case key_ramp(Case c, float growth);
// A variable-length batch of the given sequence lengths (batch, sq and sk then follow from them).
Case varlen(Case c, std::vector<int32_t> lengths_q, std::vector<int32_t> lengths_k);
// Every modifier at once.
Case all_mods(Case c, flashattn::DType bias_dtype = flashattn::DType::kBFloat16);
// The shapes every GPU forward suite's small cases start from: sizes that are not tile multiples
// (d = 64 and 128, both dtypes, causal and not), Sq != Sk both ways in both causal alignments, and
// GQA / MQA.
std::vector<Case> base_small_cases();
// Strided rows (gaps between rows and heads that must stay untouched).
Case strided(Case c);
// The strided-layout pair the suites share: c strided, then the same without lse, with an explicit
// scale (0.3) and d = 64.
void add_strided_pair(std::vector<Case>& cases, Case c);

// GoogleTest's name of a parameterized case.
std::string case_name(const ::testing::TestParamInfo<Case>& info);

// One [batch, rows, heads, dim] tensor (varlen: batch 1, rows = total) in host and device memory.
// The host copy is compact per batch entry; on the device, entries may lie device_batch_stride
// elements apart (above 2^31 to exercise 64-bit offsets), the gaps never copied.
struct Buffer {
  int64_t batch = 0, rows = 0, heads = 0, dim = 0;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;  // host layout
  int64_t device_batch_stride = 0;
  std::vector<uint16_t> host;
  DeviceBuffer<uint16_t> device;

  Buffer(int64_t b, int64_t r, int64_t h, int64_t dm, bool strided, int64_t min_batch_stride);

  int64_t at(int64_t b, int64_t r, int64_t h, int64_t i) const { return b * batch_stride + r * row_stride + h * head_stride + i; }
  uint16_t* device_entry(int64_t b) const { return device.ptr + b * device_batch_stride; }
  void upload() const;
  void download();
  void poison() { ASSERT_EQ(device.poison(), cudaSuccess); }
  flashattn::ConstTensor cview() const { return {device.ptr, device_batch_stride, row_stride, head_stride}; }
  flashattn::Tensor view() const { return {device.ptr, device_batch_stride, row_stride, head_stride}; }
};

// The problem of one case: inputs on both sides, outputs on the device, params.
struct Problem {
  Case c;
  Buffer q, k, v, o;
  DeviceBuffer<float> lse;  // allocated when c.lse
  DeviceBuffer<int32_t> cu_q, cu_k;
  std::vector<int32_t> host_cu_q, host_cu_k;
  // Score modifiers, [batch, heads_q, seqlen_q, seqlen_k] with zero strides where broadcast.
  ScoreModInputs mods;
  int64_t lse_count = 0;

  static constexpr int64_t kHugeBatchStride = (int64_t{1} << 31) + 1024;

  explicit Problem(const Case& cs);
  bool varlen() const { return !c.varlen_q.empty(); }

  // Random q, k, v (uploaded) and score modifiers from `seed`.
  void fill(uint64_t seed);
  // o and lse to NaN.
  void poison();
  // The kernel's params (device pointers). host_side: cu_seqlens and modifiers point at the host
  // copies, for the reference and problem.hpp's helpers, which read them on the host.
  flashattn::ForwardParams params(bool host_side = false) const;
};

// A problem of `cs` with fresh random inputs (seed printed); a failure recorded when an
// allocation failed.
std::unique_ptr<Problem> new_problem(const Case& cs);

// Textbook attention per (sequence, head, row): exact in double, and in the storage precision
// (S = q·k rounded, fp32 softmax of scale·S, P rounded, O = P·V in fp32 rounded). Visibility from
// problem.hpp's visible_keys, the definition the kernel mirrors.
struct Reference {
  std::vector<double> o_exact;   // indexed like the o buffer's host vector
  std::vector<float> o_lowp;
  std::vector<double> lse;       // indexed like the kernel's lse
  std::vector<uint8_t> empty_row;  // per (lse index): no visible key
};
Reference reference(const Problem& pb, const flashattn::ForwardParams& p);

// Runs the forward with `backend` through the public selection point on poisoned outputs, with the
// workspace that forward_workspace_size() asks for, filled with 0xff bytes (NaN); o (host copy) and
// lse come back.
void run(Problem& pb, flashattn::Backend backend, std::vector<float>* lse_out);

// Two runs with `backend` on pb's inputs give the same bits (O and lse).
void expect_runs_identical(Problem& pb, flashattn::Backend backend);

// Elements of the o buffer that belong to the output (the rest is padding and gaps).
std::vector<uint8_t> valid_elements(const Problem& pb, const flashattn::ForwardParams& p);

// The output of `pb` (after run) against the reference: within the rule, every element written,
// padding untouched, lse within tolerance, rows with no visible key O = 0 and lse = -inf. Failures
// and the printed errors name `what`. Returns the low-precision standard attention's error (the
// rule's yardstick).
double check_against_reference(const Problem& pb, const Reference& ref, const std::vector<float>& lse,
                               const std::string& what);

}  // namespace fa_cuda_test
