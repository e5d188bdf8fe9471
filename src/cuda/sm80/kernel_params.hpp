// What the sm80 forward kernel reads: ForwardParams resolved on the host into plain values.
// Tensors are [batch, seqlen, heads, dim] with element strides (varlen: [total, heads, dim], batch
// strides unused); every offset is computed in 64 bits.
#pragma once

#include <cstdint>

namespace flashattn::detail::sm80 {

struct ForwardKernelParams {
  const void* q;  // [batch, seqlen_q, heads_q,  head_dim]
  const void* k;  // [batch, seqlen_k, heads_kv, head_dim]
  const void* v;  // [batch, seqlen_k, heads_kv, head_dim_v]
  void* o;        // [batch, seqlen_q, heads_q,  head_dim_v]
  float* maybe_lse;  // [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q]); null: not written
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride;

  // Variable-length batches: int32 [batch + 1] row offsets, both or neither.
  const int32_t* maybe_cu_seqlens_q;
  const int32_t* maybe_cu_seqlens_k;

  int batch;
  int seqlen_q, seqlen_k;  // varlen: upper bounds (they size the grid)
  int heads_q, group;      // group = heads_q / heads_kv
  int head_dim;            // runtime head dims, multiples of 8 up to the instantiation's
  int head_dim_v;

  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e): exp(scale (s - m)) = exp2(scale_log2 (s - m))

  // Visible keys of query i, measured from its diagonal key d = i + diagonal (problem.hpp's
  // visible_keys): d - window_left <= j <= d + window_right; a negative bound is unbounded.
  // Causal is folded in on the host (window_right = min(window_right, 0), or 0), and windows are
  // clamped to seqlen_q + seqlen_k, beyond which they hide nothing.
  bool bottom_right;  // diagonal = seqlen_k - seqlen_q (per sequence), else 0
  int window_left;
  int window_right;

  // Score modifiers (problem.hpp's ScoreMods, applied in this order to the scaled score); a
  // kernel variant without them is launched when all are off.
  float softcap;  // > 0: x -> softcap tanh(x / softcap); 0: off
  const float* maybe_alibi_slopes;  // slope of (b, h) = [b * alibi_batch_stride + h]; null: off
  int64_t alibi_batch_stride;
  const void* maybe_bias;  // [batch, heads_q, seqlen_q, seqlen_k] of bias_dtype, strides below; null: off
  int bias_dtype;          // 0 fp32, 1 fp16, 2 bf16 (flashattn::DType's values)
  int64_t bias_batch_stride, bias_head_stride, bias_row_stride;
  const uint8_t* maybe_mask;  // [batch, heads_q, seqlen_q, seqlen_k], nonzero = attend; null: off
  int64_t mask_batch_stride, mask_head_stride, mask_row_stride;

  bool has_score_mods() const {
    return softcap != 0.0f || maybe_alibi_slopes != nullptr || maybe_bias != nullptr || maybe_mask != nullptr;
  }
};

}  // namespace flashattn::detail::sm80
