// Random score-modifier inputs (ALiBi slopes, additive bias, boolean mask) of one GPU test problem,
// on both sides: host copies for the reference, which reads them through problem.hpp's ScoreMods,
// and device copies for the kernels. Shared by the forward and backward tests; each test's Case
// says which layout it wants (the bias layouts differ between them).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/support/cuda_test_util.hpp"
#include "flashattn/flashattn.hpp"

namespace fa_cuda_test {

struct ScoreModInputs {
  // ALiBi: 0 none, 1 slopes [heads_q], 2 slopes [batch, heads_q].
  int alibi = 0;
  int64_t alibi_batch_stride = 0;
  std::vector<float> host_slopes;
  DeviceBuffer<float> slopes;
  // Bias: bytes of bias_dtype elements, strides (batch, head, row) with 0 where broadcast.
  bool has_bias = false;
  flashattn::DType bias_dtype = flashattn::DType::kFloat32;
  int64_t bias_strides[3] = {0, 0, 0};
  std::vector<uint8_t> host_bias;
  DeviceBuffer<uint8_t> bias;
  // Mask: strides (batch, head, row); see random_mask for the kinds.
  bool has_mask = false;
  int64_t mask_strides[3] = {0, 0, 0};
  std::vector<uint8_t> host_mask;
  DeviceBuffer<uint8_t> mask;

  // kind 1: the geometric slopes 2^(-8 (h + 1) / heads_q); kind 2: random slopes per (batch, head).
  void random_alibi(int kind, int64_t batch, int64_t heads_q, std::mt19937_64& rng);
  // `count` values ~ 2 N(0, 1) in `dtype`, laid out by `strides` (batch, head, row).
  void random_bias(flashattn::DType dtype, const int64_t (&strides)[3], int64_t count, std::mt19937_64& rng);
  // Over [batch, heads_q, seqlen_q, seqlen_k]: kind 1 random (70% kept); 2 key padding [batch,
  // seqlen_k], each sequence keeping a random prefix of its keys (possibly none); 3 block-sparse:
  // 64 x 64 blocks on or off, keys [64, 192) off everywhere (whole key tiles), rows 5 mod 13 off
  // (rows that see nothing), 90% of the rest kept.
  void random_mask(int kind, int64_t batch, int64_t heads_q, int64_t seqlen_q, int64_t seqlen_k,
                   std::mt19937_64& rng);

  // Points p's modifiers at the host copies (host_side) or the device ones.
  void set_params(flashattn::AttentionParams* p, bool host_side) const;
};

}  // namespace fa_cuda_test
