// What the sm80 backward kernels read: BackwardParams resolved on the host into plain values, and
// the layout of the caller-owned workspace. Tensors are [batch, seqlen, heads, dim] with element
// strides (varlen: [total, heads, dim], batch strides unused); every offset is computed in 64 bits.
#pragma once

#include <cstdint>

namespace flashattn::detail::sm80 {

struct BackwardKernelParams {
  const void* q;    // [batch, seqlen_q, heads_q,  head_dim]
  const void* k;    // [batch, seqlen_k, heads_kv, head_dim]
  const void* v;    // [batch, seqlen_k, heads_kv, head_dim_v]
  const void* o;    // [batch, seqlen_q, heads_q,  head_dim_v]
  const void* d_o;  // [batch, seqlen_q, heads_q,  head_dim_v]
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

  // Workspace. delta and lse_log2 are indexed by (b, h, i) as ((b * heads_q + h) * seqlen_q + i),
  // i local to the sequence (varlen: seqlen_q is the longest, so every sequence fits):
  float* delta;      // [batch, heads_q, seqlen_q]: D = rowsum(dO ∘ O)
  float* lse_log2;   // [batch, heads_q, seqlen_q]: lse · log2(e), +inf for rows that see no key
  // fp32, unscaled dS·K: [batch, heads_q, dq_accum_rows / Br, Br · dq_accum_width], each tile of
  // the main kernel's Br query rows in the order of its dQ fragments (backward_dq_accum.cuh), so
  // that each warp's reduction covers whole lines. Null in the deterministic mode (dQ then comes
  // from backward_dq_kernel.cuh, no atomics).
  float* dq_accum;
  int64_t dq_accum_rows;  // rows per (b, h): seqlen_q rounded up to kDqAccumRowMultiple
  int dq_accum_width;     // floats per row: the instantiation's head dim (columns past head_dim unused)

  int batch;
  int seqlen_q, seqlen_k;  // varlen: upper bounds (they size the grid and the workspace)
  int heads_q, group;      // group = heads_q / heads_kv
  int head_dim;            // runtime head dim of q and k (and dq, dk), a multiple of 8
  int head_dim_v;          // runtime head dim of v, o and dO (and dv), a multiple of 8

  float scale;       // softmax scale
  float scale_log2;  // scale · log2(e)

  // The causal/window band, as in ForwardKernelParams (causal folded in, windows clamped).
  bool bottom_right;
  int window_left;
  int window_right;

  // Score modifiers, as in ForwardKernelParams (problem.hpp's ScoreMods, in this order on the
  // scaled score); they get no gradient. A kernel variant without them runs when all are off.
  float softcap;                    // > 0: x -> softcap tanh(x / softcap); 0: off
  const float* maybe_alibi_slopes;  // slope of (b, h) = [b * alibi_batch_stride + h]; null: off
  int64_t alibi_batch_stride;
  const void* maybe_bias;  // [batch, heads_q, seqlen_q, seqlen_k] of bias_dtype, strides below; null: off
  int bias_dtype;          // 0 fp32, 1 fp16, 2 bf16 (flashattn::DType's values)
  int64_t bias_batch_stride, bias_head_stride, bias_row_stride;
  const uint8_t* maybe_mask;  // [batch, heads_q, seqlen_q, seqlen_k], nonzero = attend; null: off
  int64_t mask_batch_stride, mask_head_stride, mask_row_stride;

  // The main kernel's blocks: one per (b, kv head, key block of Bc), numbered
  // (b heads_kv + h_kv) key_blocks + n_block (the split blocks' pieces on a 1-D grid, and every
  // block so in the score-modifier variant of a policy with tail_split; else on a grid of key
  // blocks x kv heads x batch). Blocks [split_begin, blocks) (the partial last wave, see tail_split) run as
  // split_pieces pieces each, a piece taking an equal share of the block's
  // steps; the pieces add their dK and dV into dkv_accum (fp32, in the order of the dK / dV
  // fragments, Bc · (d + dv) floats per split block, both the instantiation's widths) and count
  // themselves in dkv_arrivals, and the last to arrive writes dK and dV. Both arrays (contiguous:
  // dkv_words 4-byte words in all) are zeroed by the preprocess kernel; null and 0 when
  // split_pieces is 1.
  int key_blocks;
  int split_begin;
  int split_pieces;
  float* dkv_accum;
  int* dkv_arrivals;
  int64_t dkv_words;
  // On the 1-D grid: the block (or piece) that blockIdx.x 0 runs. 0 for one launch of every block;
  // split_begin where the plain variant runs the whole blocks on the 3-D grid and the pieces in a
  // launch of their own.
  int grid_first_block;

  // Compute capability 9.0 or later: the kernels after the preprocess are launched as programmatic
  // dependents of the one before them (primitives/grid_dependency.cuh), so that each starts while
  // the one before drains, and the split blocks' pieces run beside the main grid's last wave.
  bool dependent_launch;

  bool has_score_mods() const {
    return softcap != 0.0f || maybe_alibi_slopes != nullptr || maybe_bias != nullptr || maybe_mask != nullptr;
  }
};

// The dQ accumulator's rows per (b, h) are padded to a multiple of every policy's Br, so that its
// tiles are whole and the main kernel adds into them without bounds checks.
constexpr int kDqAccumRowMultiple = 128;
constexpr int64_t dq_accum_rows(int64_t seqlen_q) {
  return (seqlen_q + kDqAccumRowMultiple - 1) / kDqAccumRowMultiple * kDqAccumRowMultiple;
}

// Splitting the tail wave. When the main kernel's blocks all cost the same (no band, no varlen),
// `blocks` of them on `slots` resident places run in ceil(blocks / slots) waves, and the last wave
// is partly idle: 4096 blocks on 132 SMs take 32 block-times for 31.03 of work. The r = blocks %
// slots blocks of that partial wave can instead run as k pieces each, of steps / k steps and
// about kPieceOverheadSteps more (K and V loaded again; dK and dV added into the workspace):
// ceil(r k / slots) waves of pieces. (Splitting the last full wave's blocks as well never wins in
// this count: their pieces take k piece-times more, at least steps + 3 k.) tail_split picks the k
// of 1..8 with the least time, counted in steps, and returns the first split block (blocks when
// k = 1).
constexpr int kPieceOverheadSteps = 3;
constexpr int kMaxPieces = 8;
struct TailSplit {
  int64_t begin;
  int pieces;
};
constexpr TailSplit tail_split(int64_t blocks, int64_t slots, int64_t steps_per_block) {
  if (blocks <= 0 || slots <= 0 || blocks % slots == 0) return {blocks, 1};
  const int64_t r = blocks % slots;
  int64_t best_time = steps_per_block;
  int best = 1;
  for (int k = 2; k <= kMaxPieces && k <= steps_per_block; ++k) {
    const int64_t time = (r * k + slots - 1) / slots * ((steps_per_block + k - 1) / k + kPieceOverheadSteps);
    if (time < best_time) best_time = time, best = k;
  }
  return {best == 1 ? blocks : blocks - r, best};
}
// 4096 blocks on 132 SMs leave 4 for a 32nd wave: with 128 steps a block (d = 64, n = 16k) or 16
// (n = 2k) they run in 8 pieces, one wave of 19 (5) steps against 128 (16). 232 blocks of 20 steps
// (r = 100): 2 pieces would take 2 waves of 13 against 20, so none.
static_assert(tail_split(4096, 132, 128).begin == 4092 && tail_split(4096, 132, 128).pieces == 8);
static_assert(tail_split(4096, 132, 16).begin == 4092 && tail_split(4096, 132, 16).pieces == 8);
static_assert(tail_split(135, 132, 20).begin == 132 && tail_split(135, 132, 20).pieces == 7);
static_assert(tail_split(232, 132, 20).pieces == 1 && tail_split(4224, 132, 128).pieces == 1 &&
              tail_split(100, 132, 1).pieces == 1);

// Workspace bytes for the arrays above, plus slack to align the start. The order: dq_accum (when
// there is one; accum_width floats per row), delta, lse_log2, then (split blocks only, 16-byte
// aligned) dkv_accum of split_floats and dkv_arrivals of split_blocks.
constexpr int64_t kWorkspaceAlignment = 256;

constexpr int64_t split_arrays_offset(int64_t floats_before) { return (floats_before + 3) / 4 * 4; }

inline int64_t backward_workspace_bytes(int64_t batch, int64_t heads_q, int64_t seqlen_q, int64_t accum_width,
                                        bool deterministic, int64_t split_blocks = 0, int64_t split_floats = 0) {
  const int64_t rows = batch * heads_q * seqlen_q;
  const int64_t accum = deterministic ? 0 : batch * heads_q * dq_accum_rows(seqlen_q) * accum_width;
  const int64_t split = split_blocks > 0 ? split_arrays_offset(accum + 2 * rows) - (accum + 2 * rows) +
                                               split_floats + split_blocks
                                         : 0;
  return kWorkspaceAlignment + (accum + 2 * rows + split) * 4;
}

}  // namespace flashattn::detail::sm80
