#include "cuda/support/score_mod_inputs.hpp"

#include <cmath>
#include <cstring>

#include "core/dtype.hpp"

namespace fa_cuda_test {

using flashattn::DType;

void ScoreModInputs::random_alibi(int kind, int64_t batch, int64_t heads_q, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  alibi = kind;
  alibi_batch_stride = kind == 2 ? heads_q : 0;
  host_slopes.resize(static_cast<size_t>(kind == 1 ? heads_q : batch * heads_q));
  for (size_t x = 0; x < host_slopes.size(); ++x)
    host_slopes[x] = kind == 1 ? std::exp2(-8.0f * static_cast<float>(x + 1) / static_cast<float>(heads_q))
                               : 0.01f + 0.5f * uniform(rng);
  slopes.upload(host_slopes);
}

void ScoreModInputs::random_bias(DType dtype, const int64_t (&strides)[3], int64_t count, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  has_bias = true;
  bias_dtype = dtype;
  std::memcpy(bias_strides, strides, sizeof bias_strides);
  const int64_t elem = static_cast<int64_t>(flashattn::detail::dtype_size(dtype));
  host_bias.resize(static_cast<size_t>(count * elem));
  for (int64_t x = 0; x < count; ++x) {
    const float value = 2.0f * normal(rng);
    if (dtype == DType::kFloat32) {
      std::memcpy(&host_bias[x * 4], &value, 4);
    } else {
      const uint16_t h = to_storage(value, dtype);
      std::memcpy(&host_bias[x * 2], &h, 2);
    }
  }
  bias.upload(host_bias);
}

void ScoreModInputs::random_mask(int kind, int64_t batch, int64_t heads_q, int64_t sq, int64_t sk,
                                 std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  has_mask = true;
  const int64_t keys_rows = sq * sk;
  int64_t count = 0;
  if (kind == 2) {
    mask_strides[0] = sk, count = batch * sk;
  } else {
    mask_strides[0] = heads_q * keys_rows, mask_strides[1] = keys_rows, mask_strides[2] = sk;
    count = batch * heads_q * keys_rows;
  }
  host_mask.assign(static_cast<size_t>(count), 1);
  if (kind == 1)
    for (auto& m : host_mask) m = uniform(rng) < 0.7f;
  if (kind == 2)
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t keep = static_cast<int64_t>(uniform(rng) * static_cast<float>(sk + 1));
      for (int64_t j = keep; j < sk; ++j) host_mask[b * sk + j] = 0;
    }
  if (kind == 3)
    for (int64_t bh = 0; bh < batch * heads_q; ++bh) {
      std::vector<uint8_t> block_on(static_cast<size_t>(((sq + 63) / 64) * ((sk + 63) / 64)));
      for (auto& on : block_on) on = uniform(rng) < 0.5f;
      for (int64_t i = 0; i < sq; ++i)
        for (int64_t j = 0; j < sk; ++j) {
          const bool on = block_on[(i / 64) * ((sk + 63) / 64) + j / 64] && !(j >= 64 && j < 192) && i % 13 != 5;
          host_mask[bh * keys_rows + i * sk + j] = on && uniform(rng) < 0.9f;
        }
    }
  mask.upload(host_mask);
}

void ScoreModInputs::set_params(flashattn::AttentionParams* p, bool host_side) const {
  if (alibi != 0) {
    p->maybe_alibi_slopes = host_side ? host_slopes.data() : slopes.ptr;
    p->alibi_batch_stride = alibi_batch_stride;
  }
  if (has_bias)
    p->maybe_bias = {host_side ? static_cast<const void*>(host_bias.data()) : bias.ptr, bias_dtype, bias_strides[0],
                     bias_strides[1], bias_strides[2]};
  if (has_mask)
    p->maybe_mask = {host_side ? host_mask.data() : mask.ptr, mask_strides[0], mask_strides[1], mask_strides[2]};
}

}  // namespace fa_cuda_test
