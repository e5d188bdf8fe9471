// The bench's attention problem: random inputs in the storage dtype, contiguous
// [batch, seqlen, heads, dim] tensors, and separate outputs for the flash and standard paths so
// both results can be checked after timing.
#pragma once

#include <cstdint>
#include <vector>

#include "flashattn/flashattn.hpp"

namespace fa_bench {

struct Shape {
  flashattn::DType dtype = flashattn::DType::kFloat32;
  int64_t batch = 1, heads_q = 8, heads_kv = 8, seqlen_q = 4096, seqlen_k = 4096, head_dim = 128, head_dim_v = 128;
  bool causal = false;
  flashattn::Alignment alignment = flashattn::Alignment::kBottomRight;
  int64_t window_left = -1, window_right = -1;
  float softcap = 0.0f;
};

// One contiguous tensor in its storage dtype (fp16/bf16 as 16-bit words).
class Storage {
 public:
  Storage() = default;
  Storage(flashattn::DType dtype, int64_t elements);
  void* data() { return words_.data(); }
  const void* data() const { return words_.data(); }
  int64_t size() const { return elements_; }
  size_t bytes() const;  // of the elements (a 16-bit tensor of odd length ends inside its last word)
  flashattn::DType dtype() const { return dtype_; }
  float get(int64_t i) const;
  void fill_random(uint64_t seed);  // uniform on [-sqrt(3), sqrt(3)): mean 0, variance 1
  void fill_nan();

 private:
  flashattn::DType dtype_ = flashattn::DType::kFloat32;
  int64_t elements_ = 0;
  std::vector<float> words_;  // fp32 words; 16-bit dtypes pack two per word
};

// Max |a - b| over every element; NaN on either side where the other is not NaN counts as +inf.
double max_abs_diff(const Storage& a, const Storage& b);

// Which output set a params struct points at.
enum class Path { kFlash, kStandard };

class Workload {
 public:
  // Inputs q, k, v (and d_o with backward) from `seed`; outputs poisoned with NaN.
  Workload(const Shape& shape, uint64_t seed, bool backward);

  const Shape& shape() const { return shape_; }
  flashattn::AttentionParams attention_params() const;
  flashattn::ForwardParams forward_params(Path path);
  // The backward of `path` reads the flash forward's o and lse (run the flash forward first), so
  // both backward paths see identical inputs.
  flashattn::BackwardParams backward_params(Path path);

  // NaN into the gradients of `path`, so a later run that skips an element shows up in checks.
  void poison_gradients(Path path);

  const Storage& q() const { return q_; }
  const Storage& k() const { return k_; }
  const Storage& v() const { return v_; }
  const Storage& d_o() const { return d_o_; }  // empty without backward
  const Storage& o(Path path) const { return path == Path::kFlash ? o_flash_ : o_standard_; }
  const std::vector<float>& lse(Path path) const { return path == Path::kFlash ? lse_flash_ : lse_standard_; }
  const Storage& dq(Path path) const { return path == Path::kFlash ? dq_flash_ : dq_standard_; }
  const Storage& dk(Path path) const { return path == Path::kFlash ? dk_flash_ : dk_standard_; }
  const Storage& dv(Path path) const { return path == Path::kFlash ? dv_flash_ : dv_standard_; }
  // Writable outputs, for results computed elsewhere (the GPU mode copies its outputs back here).
  Storage& o(Path path) { return path == Path::kFlash ? o_flash_ : o_standard_; }
  std::vector<float>& lse(Path path) { return path == Path::kFlash ? lse_flash_ : lse_standard_; }
  Storage& dq(Path path) { return path == Path::kFlash ? dq_flash_ : dq_standard_; }
  Storage& dk(Path path) { return path == Path::kFlash ? dk_flash_ : dk_standard_; }
  Storage& dv(Path path) { return path == Path::kFlash ? dv_flash_ : dv_standard_; }

 private:
  Shape shape_;
  Storage q_, k_, v_, d_o_;
  Storage o_flash_, o_standard_;
  std::vector<float> lse_flash_, lse_standard_;  // [batch, heads_q, seqlen_q]
  Storage dq_flash_, dk_flash_, dv_flash_, dq_standard_, dk_standard_, dv_standard_;
};

}  // namespace fa_bench
