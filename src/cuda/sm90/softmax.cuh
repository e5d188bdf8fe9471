// Online softmax of one consumer warpgroup's 64 query rows on the wgmma accumulator layout, in the
// seeds' notation. Thread t (warp w, lane 4 g + q) holds rows 16 w + g (r = 0) and 16 w + g + 8
// (r = 1) of the slice; of each 8-column block j of a 64 x N accumulator tile it holds columns
// 8 j + 2 q + e (e = 0, 1) at index 4 j + 2 r + e (wgmma.cuh). The four lanes of a quad share a
// row: they combine their maxima every tile and their partial sums l once, at the end.
//   m_new = max(m, rowmax(S)),  alpha = exp(scale (m - m_new)),  P = exp(scale (S - m_new)),
//   l = alpha l + rowsum(P),    o = alpha o + P V,               O = o / l,  lse = scale m + log l
// The scale is folded into exp2 (scale_log2 = scale log2 e). A row that has seen only masked keys
// keeps m = -inf; its exponent base is then 0, so P = 0 and alpha = 0 instead of NaN, and it ends
// with O = 0 and lse = -inf.
// Lazy rescaling (kLazy, FlashAttention-4's): m is only a reference each row's exponents are taken
// against, kept while no row of the warp exceeds it by more than kLazyRescaleLog2 / scale_log2.
// Then alpha = 1 and o *= alpha is skipped (the warp branches around it); the exponents stay below
// 2^kLazyRescaleLog2 = 256, far from overflow in fp32 and in P's 16-bit type, and since m, l and o
// move together, O = o / l and lse are the same. Once a row exceeds it, the warp's rows all take
// their maxima, as without kLazy.
// Row sums by P V (kRowSums, policy row_sums_by_pv): the tensor cores add P's rows as P V runs over
// 8 more columns of ones (forward_kernel.cuh), so update() adds nothing and l lives in o (rescaled
// with it); take_row_sums() reads it back, each lane of a quad holding its rows' whole sums.
#pragma once

#include <cmath>

#include "cuda/primitives/math.cuh"
#include "cuda/sm80/mask.cuh"  // Band: the device twin of problem.hpp's visible_keys

namespace flashattn::detail::sm90 {

// Index of accumulator (block j, row half r, column e) of a 64 x N tile.
__device__ __forceinline__ constexpr int acc_index(int j, int r, int e) { return 4 * j + 2 * r + e; }

// Row r's maximum over values kLo .. kLo + kCount - 1 of a 64 x N tile (value i: block i / 2,
// column i % 2), as a pairwise tree: depth log2(N / 4) instead of a chain of N / 4 dependent fmax.
template <int kLo, int kCount, int kS>
__device__ __forceinline__ float tree_max(const float (&s)[kS], int r) {
  if constexpr (kCount == 1) {
    return s[acc_index(kLo / 2, r, kLo % 2)];
  } else {
    return fmaxf(tree_max<kLo, kCount / 2>(s, r), tree_max<kLo + kCount / 2, kCount - kCount / 2>(s, r));
  }
}

inline constexpr float kLazyRescaleLog2 = 8.0f;  // lazy rescaling's threshold (above), in exponent terms

// kTree (policy.hpp: tree_reductions): each row's max over a tile as a pairwise tree and its sum in
// four interleaved partials (dependency chains of log2(N / 4) fmax and N / 16 adds, against N / 4
// and N / 4 as one chain each; the sum's rounding order differs, not its precision).
// kLazy (policy.hpp: lazy_rescale): the lazy rescaling above.
template <bool kTree, bool kLazy, bool kRowSums = false>
struct OnlineSoftmax {
  float m[2];
  float l[2];
  bool moved;  // the last update moved m (alpha != 1) of an o that may be nonzero: o must be
               // rescaled; uniform over the warp

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m[r] = -INFINITY;
      l[r] = 0.0f;
    }
    moved = true;
  }

  // Turns the scores s of one K tile into unnormalised P (in place); alpha receives each row's
  // rescaling factor, by which o must be multiplied before P V is added to it. kFirst: the first
  // tile since init(), where o is still 0: kLazy then skips the vote, and o's rescale (alpha = 0).
  // kPolyShare > 0 (policy exp2_poly_share, tiles every row sees whole: every score finite and the
  // row's l >= 1 after this tile, so exp2_poly3's floor of 2^-125 is far below l's ulp): of every
  // kPolyShare 8-column blocks, the last one's exponentials on the FMA pipe (cuda::exp2_poly3), the
  // others on the special-function unit.
  template <bool kFirst = false, int kPolyShare = 0, int kS>
  __device__ __forceinline__ void update(float (&s)[kS], float scale_log2, float (&alpha)[2]) {
    float m_new[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float row_max = m[r];
      if constexpr (kTree) {
        row_max = fmaxf(row_max, tree_max<0, kS / 2>(s, r));
      } else {
#pragma unroll
        for (int j = 0; j < kS / 4; ++j) row_max = fmaxf(row_max, fmaxf(s[acc_index(j, r, 0)], s[acc_index(j, r, 1)]));
      }
      m_new[r] = cuda::quad_max(row_max);
    }
    if constexpr (kLazy && kFirst) {
      moved = false;  // m takes the tile's maxima; o = 0 needs no rescale
    } else if constexpr (kLazy) {
      // -inf to a finite maximum moves (inf > 8); -inf to -inf does not (NaN compares false).
      const bool exceeds = (m_new[0] - m[0]) * scale_log2 > kLazyRescaleLog2 ||
                           (m_new[1] - m[1]) * scale_log2 > kLazyRescaleLog2;
      moved = __any_sync(0xffffffffu, exceeds);
      if (!moved) {
        m_new[0] = m[0];
        m_new[1] = m[1];
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float base = m_new[r] == -INFINITY ? 0.0f : m_new[r] * scale_log2;
      alpha[r] = cuda::fast_exp2(m[r] * scale_log2 - base);
      m[r] = m_new[r];
      // P, and (unless P V sums it) its row sum in kSums partials.
      constexpr int kSums = kRowSums ? 0 : kTree ? 4 : 1;
      float row_sum[kSums > 0 ? kSums : 1] = {};
#pragma unroll
      for (int j = 0; j < kS / 4; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = fmaf(s[acc_index(j, r, e)], scale_log2, -base);
          constexpr int kEvery = kPolyShare > 0 ? kPolyShare : 1;  // (no % 0 where the share is off)
          const bool on_fma = kPolyShare > 0 && j % kEvery == kEvery - 1;
          const float p = on_fma ? cuda::exp2_poly3(x) : cuda::fast_exp2(x);
          s[acc_index(j, r, e)] = p;
          if constexpr (kSums > 0) row_sum[(2 * j + e) % kSums] += p;
        }
      if constexpr (kSums == 4) row_sum[0] = (row_sum[0] + row_sum[1]) + (row_sum[2] + row_sum[3]);
      if constexpr (kSums > 0) l[r] = alpha[r] * l[r] + row_sum[0];
    }
  }

  // o *= alpha, row by row (nothing when the last update kept m).
  template <int kO>
  __device__ __forceinline__ void rescale(float (&o)[kO], const float (&alpha)[2]) const {
    if (kLazy && !moved) return;
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int j = 0; j < kO / 4; ++j) {
        o[acc_index(j, r, 0)] *= alpha[r];
        o[acc_index(j, r, 1)] *= alpha[r];
      }
  }

  // Both at once: P from s, o rescaled (when o is not in flight in a wgmma).
  template <int kS, int kO>
  __device__ __forceinline__ void update(float (&s)[kS], float (&o)[kO], float scale_log2) {
    float alpha[2];
    update(s, scale_log2, alpha);
    rescale(o, alpha);
  }

  // kRowSums: each row's l, as P V summed it (o's ones columns, rescaled with o).
  __device__ __forceinline__ void take_row_sums(float l0, float l1) {
    static_assert(kRowSums, "l is the softmax's own");
    l[0] = l0;
    l[1] = l1;
  }

  // Each row's 1 / l (O = o / l, applied by the epilogue as it stores o) and natural-log lse; 0 and
  // -inf for rows that saw no key. `scale` converts m to natural units (1 when the scores already
  // are final logits).
  // with_lse = false: lse is left as it is (the caller stores none).
  __device__ __forceinline__ void finalize(float scale, bool with_lse, float (&inv_l)[2], float (&lse)[2]) const {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float sum = kRowSums ? l[r] : cuda::quad_sum(l[r]);
      inv_l[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
      if (with_lse) lse[r] = sum > 0.0f ? m[r] * scale + logf(sum) : -INFINITY;
    }
  }
};

// Scores of keys outside the band become -inf: this thread's rows r = 0 and 1 (tile rows row0 and
// row0 + 8) belong to queries query[0] and query[1] (row0 and row0 + 8, or under pack-GQA each
// row's query r / group: tile_scheduler.cuh), the tile's column 0 holding key j0; keys below
// key_floor too (a varlen tail box starts before its tile: tile_scheduler.cuh; elsewhere
// key_floor = j0). Used on the tiles that not every row of the item sees whole (the causal
// diagonal, window edges, the end of the sequence).
template <int kS>
__device__ __forceinline__ void apply_band_mask(float (&s)[kS], const sm80::Band& band, const int (&query)[2],
                                                int j0, int key_floor, int quad_lane) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const sm80::KeyRange keys = band.visible_keys(query[r]);
    const int lo = max(keys.lo, key_floor);
#pragma unroll
    for (int j = 0; j < kS / 4; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = j0 + 8 * j + 2 * quad_lane + e;
        if (key < lo || key >= keys.hi) s[acc_index(j, r, e)] = -INFINITY;
      }
  }
}

}  // namespace flashattn::detail::sm90
