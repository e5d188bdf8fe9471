// What the Hopper forward kernel reads: ForwardParams resolved on the host into tensor maps and
// plain values. The kernel takes it as a `const __grid_constant__` parameter so that the maps'
// addresses are valid for TMA. Tensors are [batch, seqlen, heads, dim] with element strides.
#pragma once

#include <cuda.h>  // CUtensorMap (a type only)

#include <cstdint>

namespace flashattn::detail::sm90 {

struct ForwardKernelParams {
  // 128-byte-swizzled boxes of 64 columns: q in Br-row boxes, k and v in Bc-row boxes; coordinates
  // (column, row, head, batch); rows past seqlen read as zeros.
  CUtensorMap q_map;  // [batch, seqlen_q, heads_q,  head_dim]
  CUtensorMap k_map;  // [batch, seqlen_k, heads_kv, head_dim]
  CUtensorMap v_map;  // [batch, seqlen_k, heads_kv, head_dim]

  void* o;           // [batch, seqlen_q, heads_q, head_dim], written with 16-byte stores
  float* maybe_lse;  // [batch, heads_q, seqlen_q]; null: not written
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride;

  int seqlen_q, seqlen_k;
  int group;     // heads_q / heads_kv
  int head_dim;  // runtime head dim, a multiple of 8 up to the instantiation's

  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e)

  // The causal/window band as sm80's kernel takes it (cuda_host::kernel_band; mask.cuh's Band).
  bool bottom_right;
  int window_left, window_right;

  float softcap;  // > 0: x -> softcap tanh(x / softcap) on the scaled score (a kernel variant); 0: off
};

}  // namespace flashattn::detail::sm90
