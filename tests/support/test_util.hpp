// Test support: seeded random attention problems with every option, poisoned outputs, the
// low-precision "standard attention" baseline of the tolerance rule, and error metrics.
//
// Seeds: every problem is built from a fresh seed that is printed (and recorded as a GoogleTest
// property); FLASHATTN_TEST_SEED=N replays a run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashattn/flashattn.hpp"

namespace fa_test {

using flashattn::Alignment;
using flashattn::Backend;
using flashattn::DType;

// True under the ASan+UBSan build (FLASHATTN_TEST_SANITIZER=1): tests may drop their largest sizes.
bool sanitizer_run();

// A fresh seed (or FLASHATTN_TEST_SEED), printed with `what` and recorded in the test's XML.
uint64_t fresh_seed(const std::string& what);

enum class AlibiKind { kNone, kPerHead, kPerBatchHead };
enum class MaskKind {
  kNone,
  kRandom,       // [batch, heads, Sq, Sk], ~70% attend
  kKeyPadding,   // [batch, 1, 1, Sk] broadcast over heads and rows; the last keys of each batch hidden
  kBlockSparse,  // [1, 1, Sq, Sk] broadcast; 32x32 blocks wholly on or off (exercises tile skipping)
};

// One attention problem. Sizes that are not tile multiples are the point.
struct Case {
  DType dtype = DType::kFloat32;
  int64_t batch = 1, seqlen_q = 17, seqlen_k = 17, heads_q = 2, heads_kv = 2, head_dim = 32, head_dim_v = 0;
  float scale = 0.0f;  // 0: default
  bool causal = false;
  Alignment alignment = Alignment::kBottomRight;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
  AlibiKind alibi = AlibiKind::kNone;
  bool bias = false;
  DType bias_dtype = DType::kFloat32;
  bool bias_broadcast = false;  // [1, heads, Sq, Sk] with batch stride 0 instead of [batch, heads, Sq, Sk]
  MaskKind mask = MaskKind::kNone;
  std::vector<int32_t> varlen_q, varlen_k;  // non-empty: variable-length batch with these lengths
  bool strided = false;  // q, k, v, o, d_o, dq, dk, dv in padded non-contiguous layouts (heads/rows interleaved)
  bool lse = true;
  double input_scale = 1.0;  // inputs ~ N(0, input_scale²)

  std::string name() const;
};

// Owns one [batch, seqlen, heads, dim] (varlen: [total, heads, dim]) tensor in its storage dtype.
struct HostTensor {
  DType dtype = DType::kFloat32;
  int64_t batch = 0, rows = 0, heads = 0, dim = 0;  // rows per batch entry (varlen: total rows, batch = 1)
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;
  std::vector<float> storage;  // fp32 words; fp16/bf16 use it as uint16_t

  void* data() { return storage.data(); }
  const void* data() const { return storage.data(); }
  int64_t offset(int64_t b, int64_t r, int64_t h, int64_t d) const {
    return b * batch_stride + r * row_stride + h * head_stride + d;
  }
  double get(int64_t b, int64_t r, int64_t h, int64_t d) const;
  void set(int64_t b, int64_t r, int64_t h, int64_t d, double x);
  void fill_storage_nan();  // poisons every element, padding included
  flashattn::ConstTensor cview() const { return {storage.data(), batch_stride, row_stride, head_stride}; }
  flashattn::Tensor view() { return {storage.data(), batch_stride, row_stride, head_stride}; }
};

struct Problem {
  Case c;
  uint64_t seed = 0;
  HostTensor q, k, v, o, d_o, dq, dk, dv;
  std::vector<float> lse;  // [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q]), contiguous
  std::vector<float> bias_storage;
  std::vector<uint8_t> mask_storage;
  std::vector<float> slopes;
  std::vector<int32_t> cu_q, cu_k;

  flashattn::ForwardParams forward_params();
  // Uses o and lse as the forward's results (run a forward first).
  flashattn::BackwardParams backward_params();
  void poison_outputs();  // NaN into o, lse, dq, dk, dv (padding too)

  int64_t num_seqs() const { return c.batch; }
  int64_t seq_len_q(int64_t b) const { return cu_q.empty() ? c.seqlen_q : cu_q[b + 1] - cu_q[b]; }
  int64_t seq_len_k(int64_t b) const { return cu_k.empty() ? c.seqlen_k : cu_k[b + 1] - cu_k[b]; }
};

// Random inputs (q, k, v, d_o ~ N(0, input_scale²) rounded to the storage dtype; bias, mask, slopes
// per the case), outputs poisoned.
Problem make_problem(const Case& c, uint64_t seed);

// The same problem with fp32 storage holding exactly the same (rounded) input values: what the
// double reference runs on when the case is fp16/bf16.
Problem as_fp32(const Problem& p);

// Runs forward / backward with the given backend, asserting success (GoogleTest ASSERT inside).
void run_forward(Problem& p, Backend backend, int threads = 0);
void run_backward(Problem& p, Backend backend, int threads = 0);

// Max |got - want| over every valid element (only rows that exist; padding ignored);
// NaN anywhere in got where want is not NaN counts as infinite error.
struct Error {
  double max_abs = 0.0;
  double max_ref = 0.0;   // max |want|, for relative scales
  int64_t nan_count = 0;  // elements of got that are NaN while want is not
};
Error compare(const HostTensor& got, const HostTensor& want, const Problem& shape, bool k_side);
Error compare_lse(const Problem& got, const Problem& want);

// Error of textbook attention computed in `dtype` (S and P rounded to dtype, fp32 softmax, outputs
// rounded), against `exact` (a problem the reference ran on). The tolerance rule: a low-precision
// kernel's error must be at most 2x this (3x for gradients) plus a small floor.
struct LowpErrors {
  double o = 0.0, dq = 0.0, dk = 0.0, dv = 0.0;
};
LowpErrors lowp_standard_errors(const Problem& exact, DType dtype, bool backward);

// Small absolute floors added to the 2x / 3x rule (values of magnitude ~1).
inline constexpr double kLowpFloorForward = 1e-3;
inline constexpr double kLowpFloorBackward = 2e-3;
// fp32 kernels vs the double reference, relative to the output magnitude.
inline constexpr double kFp32Tolerance = 2e-5;

}  // namespace fa_test
