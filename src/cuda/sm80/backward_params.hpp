// What the sm80 backward kernels read: BackwardParams resolved on the host into plain values, and
// the layout of the caller-owned workspace. Tensors are [batch, seqlen, heads, dim] with element
// strides (varlen: [total, heads, dim], batch strides unused); every offset is computed in 64 bits.
#pragma once

#include <cstdint>

namespace flashattn::detail::sm80 {

struct BackwardKernelParams {
  const void* q;    // [batch, seqlen_q, heads_q,  head_dim]
  const void* k;    // [batch, seqlen_k, heads_kv, head_dim]
  const void* v;    // [batch, seqlen_k, heads_kv, head_dim]
  const void* o;    // [batch, seqlen_q, heads_q,  head_dim]
  const void* d_o;  // [batch, seqlen_q, heads_q,  head_dim]
  const float* lse;  // [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q]), natural log
  void* dq;         // like q
  void* dk;         // like k
  void* dv;         // like v
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t do_batch_stride, do_row_stride, do_head_stride;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;
  int64_t lse_batch_stride, lse_head_stride;

  // Variable-length batches: int32 [batch + 1] row offsets, both or neither.
  const int32_t* maybe_cu_seqlens_q;
  const int32_t* maybe_cu_seqlens_k;

  // Workspace, each array indexed by (b, h, i) as ((b * heads_q + h) * seqlen_q + i), i local to
  // the sequence (varlen: seqlen_q is the longest, so every sequence fits):
  float* dq_accum;   // [batch, heads_q, seqlen_q, head_dim] fp32, unscaled dS·K; null in the
                     // deterministic mode (dQ then comes from backward_dq_kernel.cuh, no atomics)
  float* delta;      // [batch, heads_q, seqlen_q]: D = rowsum(dO ∘ O)
  float* lse_log2;   // [batch, heads_q, seqlen_q]: lse · log2(e), +inf for rows that see no key

  int batch;
  int seqlen_q, seqlen_k;  // varlen: upper bounds (they size the grid and the workspace)
  int heads_q, group;      // group = heads_q / heads_kv
  int head_dim;            // runtime head dim (of q, k, v and o alike), a multiple of 8

  float scale;       // softmax scale
  float scale_log2;  // scale · log2(e)

  // The causal/window band, as in ForwardKernelParams (causal folded in, windows clamped).
  bool bottom_right;
  int window_left;
  int window_right;
};

// Workspace bytes for the arrays above, plus slack to align the start. The order: dq_accum (when
// there is one), delta, lse_log2.
constexpr int64_t kWorkspaceAlignment = 256;

inline int64_t backward_workspace_bytes(int64_t batch, int64_t heads_q, int64_t seqlen_q, int64_t head_dim,
                                        bool deterministic) {
  const int64_t rows = batch * heads_q * seqlen_q;
  return kWorkspaceAlignment + rows * ((deterministic ? 0 : head_dim) + 2) * 4;
}

}  // namespace flashattn::detail::sm80
