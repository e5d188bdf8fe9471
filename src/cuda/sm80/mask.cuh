// Which keys a query row sees under causal and sliding-window masking: the device twin of
// problem.hpp's visible_keys(), formula for formula (the tests check the kernel against a reference
// built on problem.hpp). Indices fit in 32 bits (supported() requires seqlen_q + seqlen_k < 2^31 - 256);
// the arithmetic is done in 64. Also the per-element band masks of the score fragments (S and S^T).
#pragma once

#include <cstdint>

#include "cuda/primitives/mma.cuh"
#include "cuda/sm80/kernel_params.hpp"

namespace flashattn::detail::sm80 {

// Keys [lo, hi) visible to one query row, or to some row of a block.
struct KeyRange {
  int lo, hi;
};

// The causal/window band of one sequence.
struct Band {
  int seqlen_k;
  int diagonal;                     // query i's diagonal key is i + diagonal
  int window_left, window_right;    // < 0: unbounded

  __device__ __forceinline__ KeyRange visible_keys(int i) const {
    const int64_t d = int64_t{i} + diagonal;
    int64_t lo = 0, hi = seqlen_k;
    if (window_right >= 0) hi = min(hi, d + window_right + 1);
    if (window_left >= 0) lo = max(lo, d - window_left);
    lo = min(lo, int64_t{seqlen_k});
    hi = max(hi, lo);
    return {static_cast<int>(lo), static_cast<int>(hi)};
  }

  // Keys some row of [i0, i1) may see; lo and hi grow with i, so this is [lo(i0), hi(i1 - 1)).
  __device__ __forceinline__ KeyRange visible_keys(int i0, int i1) const {
    const KeyRange first = visible_keys(i0), last = visible_keys(i1 - 1);
    return {first.lo, max(first.lo, last.hi)};
  }

  // Keys that every row of [i0, i1) sees: [lo(i1 - 1), hi(i0)) (empty when lo >= hi). Tiles inside
  // it skip the per-element mask.
  __device__ __forceinline__ KeyRange keys_seen_by_all(int i0, int i1) const {
    return {visible_keys(i1 - 1).lo, visible_keys(i0).hi};
  }
};

__device__ __forceinline__ Band make_band(const ForwardKernelParams& p, int seqlen_q, int seqlen_k) {
  return {seqlen_k, p.bottom_right ? seqlen_k - seqlen_q : 0, p.window_left, p.window_right};
}

// Scores of keys outside the band become -inf, on tiles that not every row sees whole. The row
// ranges are recomputed per masked tile rather than kept across the loop: registers are scarcer
// than the few integer operations.
template <int kMTiles, int kNTiles>
__device__ __forceinline__ void apply_band_mask(cuda::FragC (&s)[kMTiles][kNTiles], const Band& band, int rows0,
                                                int j0, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const KeyRange keys = band.visible_keys(rows0 + mt * 16 + g + 8 * r);
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int j = j0 + nt * 8 + 2 * t + e;
          if (j < keys.lo || j >= keys.hi) s[mt][nt].x[2 * r + e] = -INFINITY;
        }
    }
}

}  // namespace flashattn::detail::sm80
