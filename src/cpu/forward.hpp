// The CPU forward backends (flash and standard) behind cpu_forward / standard_forward
// (core/backends.hpp): per-ISA entry points and the per-worker scratch layout they share.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashattn/flashattn.hpp"

namespace flashattn::detail::cpu {

// Tile shape of the flash forward (changes speed only, never results within one ISA level).
// Br queries (4 vectors of the ISA; at most kMaxBr) × kBc keys per inner step.
inline constexpr int64_t kMaxBr = 64;
inline constexpr int64_t kBc = 64;
// Query tiles per task: they share each K/V tile while it is in L1/L2.
inline constexpr int kQueryTilesPerTask = 4;

// Byte offsets of one worker's scratch; every slice is 64-byte aligned. The first
// kQueryTilesPerTask × tile_bytes hold the query tiles' state (qt, o, m, l, alpha, vis_lo, vis_hi
// at those offsets within tile g's slice); st, kbuf, vbuf, row_buf are shared and come after.
struct ForwardScratch {
  int64_t ldo;  // row stride of the O accumulator (head_dim_v rounded up to 16)
  size_t qt, o, m, l, alpha, vis_lo, vis_hi, tile_bytes;
  size_t st, kbuf, vbuf, row_buf;
  size_t p2, v2;  // bf16 pairs of P and V (bf16 inputs only)
  size_t bytes;  // per worker
};
ForwardScratch flash_forward_scratch(const ForwardParams& p);

// Standard forward: Sᵀ [seqlen_k, lds >= seqlen_q + kMaxBr - 1] per worker plus the flash
// scratch of one query panel, plus whole-head fp32 copies of K and V for fp16/bf16 inputs.
struct StandardScratch {
  int64_t lds;  // row stride of Sᵀ
  ForwardScratch panel;
  size_t s, kbuf, vbuf;
  size_t bytes;  // per worker
};
StandardScratch standard_forward_scratch(const ForwardParams& p);

void flash_forward_portable(const ForwardParams& p, void* workspace, int threads);
void flash_forward_avx2(const ForwardParams& p, void* workspace, int threads);
void flash_forward_avx512(const ForwardParams& p, void* workspace, int threads, bool use_bf16_dot);

void standard_forward_portable(const ForwardParams& p, void* workspace, int threads);
void standard_forward_avx2(const ForwardParams& p, void* workspace, int threads);
void standard_forward_avx512(const ForwardParams& p, void* workspace, int threads);

}  // namespace flashattn::detail::cpu
