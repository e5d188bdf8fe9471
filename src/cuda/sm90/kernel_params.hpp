// What the Hopper forward kernel reads: ForwardParams resolved on the host into tensor maps and
// plain values. The kernel takes it as a `const __grid_constant__` parameter so that the maps'
// addresses are valid for TMA. Tensors are [batch, seqlen, heads, dim] with element strides; with
// variable-length batches [total, heads, dim] (batch 1 in the maps, batch strides 0 here).
#pragma once

#include <cuda.h>  // CUtensorMap (a type only)

#include <cstdint>

namespace flashattn::detail::sm90 {

struct ForwardKernelParams {
  // 128-byte-swizzled boxes of 64 columns: q in Br-row boxes, k and v in Bc-row boxes; coordinates
  // (column, row, head, batch); rows past the map's seqlen read as zeros. Varlen: one batch entry
  // of batch x max-seqlen rows (an upper bound of the packed total: tile_scheduler.cuh keeps every
  // box inside its sequence's end, so no row past the real total is ever read); k and v then as
  // packed rows, coordinates (column, i, row0, head) (tma.cuh: make_packed_rows_tensor_map), so
  // that a box starting before its sequence's first row reads zeros there.
  CUtensorMap q_map;  // [batch, seqlen_q, heads_q,  head_dim]
  CUtensorMap k_map;  // [batch, seqlen_k, heads_kv, head_dim]; varlen: [Bc, total_k, heads_kv] rows
  CUtensorMap v_map;  // [batch, seqlen_k, heads_kv, head_dim]; varlen: as k_map

  // Pack-GQA (tile_scheduler.cuh): the consumers copy Q's packed rows themselves, 16 bytes at a
  // time, from here (the map cannot express the packing); varlen: q_batch_stride = 0.
  const void* q;     // [batch, seqlen_q, heads_q, head_dim]
  int64_t q_batch_stride, q_row_stride, q_head_stride;

  void* o;           // [batch, seqlen_q, heads_q, head_dim], written with 16-byte stores
  float* maybe_lse;  // [batch, heads_q, seqlen_q] (varlen: [heads_q, total_q]); null: not written
  int64_t o_batch_stride, o_row_stride, o_head_stride;  // varlen: o_batch_stride = 0
  int64_t lse_batch_stride, lse_head_stride;            // varlen: lse_batch_stride = 0

  // Variable-length batches: int32 [batch + 1] row offsets in device memory, both or neither.
  const int32_t* maybe_cu_seqlens_q;
  const int32_t* maybe_cu_seqlens_k;

  int batch, heads_q;
  int seqlen_q, seqlen_k;  // varlen: the longest sequence's (upper bounds)
  int group;     // heads_q / heads_kv
  int head_dim;  // runtime head dim, a multiple of 8 up to the instantiation's

  // Pack-GQA (policy.hpp's pack_gqa): a tile's rows are packed rows r = i group + g (query i of
  // query head h_kv group + g) of one kv head h_kv, so that the group's heads share one K/V read.
  bool pack_gqa;
  int item_heads;   // heads of the item numbering: heads_kv when packed, else heads_q

  // The persistent schedule (tile_scheduler.cuh): work items (query tile, head, batch), numbered
  // 0 .. num_items - 1 and run with a static stride over the grid.
  int m_blocks;     // query tiles per (batch, head): ceil(rows / Br), rows = seqlen_q (x group packed)
  bool pair_tiles;  // items are pairs (tile M-1-j, tile j) of one (batch, head): causal/window bands
  int num_items;    // batch * item_heads * (pair_tiles ? 2 ceil(m_blocks / 2) : m_blocks)
  // Shared tails (policy share_tails, tile_scheduler.cuh): the last query tiles (rows in one
  // consumer's slice) of every (batch, head), shared_tails of them, their key tiles shared by the
  // three consumers; 0: none. Where (work_tile): spread, (batch, head) h's items h M .. h M + M - 1
  // (M = m_blocks) with its shared tail at h M + h % M; else items 0 .. shared_tails - 1, the other
  // tiles after them.
  int shared_tails;
  bool shared_tails_spread;

  // The split tail (tile_scheduler.cuh, block_segment): the block's rounds from split_round on run
  // the items from split_round G on as U units (item, key tile), key_tiles per item; block x takes
  // L = floor(U / G) consecutive units, one more for x < R = U % G. An item split over two blocks
  // is merged through the workspace (split_tail.cuh). split_round = kNoSplit: every round whole
  // items. U < 2^31 (the host's condition).
  static constexpr int kNoSplit = 0x7fffffff;
  int split_round;
  int key_tiles;             // T = ceil(seqlen_k / Bc), every item's (no band, no varlen)
  int tail_units_per_block;  // L
  int tail_units_extra;      // R
  // With shared tails in the rounds before: C units (key tiles) per shared tail that its block
  // takes more of the tail, where a shared tail costs less than an item (tail_units_begin; L and R
  // then cut U - tails C units, tails = tails_before[G]); 0: L and R as above, tails_before unset.
  // tails_before[x]: the shared tails that blocks 0 .. x - 1 run in the whole rounds (G <= kMaxCreditBlocks).
  static constexpr int kMaxCreditBlocks = 160;
  int shared_tail_credit;
  int tails_before[kMaxCreditBlocks + 1];
  int* split_counters;       // workspace: one hand-over counter per (boundary, consumer, warp), zeroed per call
  float* split_partials;     // workspace: the first part's (o, m, l) per (boundary, consumer, warp)

  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e)

  // The causal/window band as sm80's kernel takes it (cuda_host::kernel_band; mask.cuh's Band).
  bool bottom_right;
  int window_left, window_right;

  float softcap;          // > 0: x -> softcap tanh(x / softcap) on the scaled score (a kernel variant); 0: off
  float softcap_to_exp2;  // scale / softcap * 2 log2(e): the raw score's factor in ScoreMods::capped

  // Timeline builds only (FLASHATTN_SM90_TIMELINE, timeline.cuh): where the kernel stamps its
  // timeline; null (and unread) otherwise.
  uint64_t* timeline;
};

}  // namespace flashattn::detail::sm90
