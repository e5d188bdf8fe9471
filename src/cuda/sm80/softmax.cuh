// Online softmax of one warp's query rows, in the seeds' notation. Each lane holds two rows per
// m16 tile (rows g and g + 8 of the mma fragment layout) and, for each, the running maximum m of
// the raw scores and a partial running sum l over its own columns; the four lanes of a quad share
// a row and combine their partial sums once, at the end.
//   m_new = max(m, rowmax(S)),  alpha = exp(scale (m - m_new)),  P = exp(scale (S - m_new)),
//   l = alpha l + rowsum(P),    o = alpha o + P V,               O = o / l,  lse = scale m + log l
// The scale is folded into exp2 (scale_log2 = scale log2 e), one FFMA per score. A row that has
// seen only masked keys keeps m = -inf; its exponent base is then 0 so that exp2(-inf) = 0 gives
// P = 0 and alpha = 0 instead of NaN, and it ends with O = 0 and lse = -inf.
#pragma once

#include <cmath>

#include "cuda/primitives/math.cuh"
#include "cuda/primitives/mma.cuh"

namespace flashattn::detail::sm80 {

template <int kMTiles>
struct OnlineSoftmax {
  float m[kMTiles][2];
  float l[kMTiles][2];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        m[mt][r] = -INFINITY;
        l[mt][r] = 0.0f;
      }
  }

  // Turns the scores s of one K tile into P (in place) and rescales the output accumulators o.
  template <int kNTiles, int kDTiles>
  __device__ __forceinline__ void update(cuda::FragC (&s)[kMTiles][kNTiles], cuda::FragC (&o)[kMTiles][kDTiles],
                                         float scale_log2) {
    float m_new[kMTiles][2];
    row_max(s, m_new);
    exponentiate(s, o, m_new, scale_log2);
  }

  // The two halves of update, for rows whose scores are split over several warps (each combines
  // the warps' m_new between them): m_new = max(m, rowmax(S)) over the lane's quad, then
  // P = exp(scale (S - m_new)) with alpha applied to l and o, and m = m_new.
  template <int kNTiles>
  __device__ __forceinline__ void row_max(const cuda::FragC (&s)[kMTiles][kNTiles], float (&m_new)[kMTiles][2]) const {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float row_max = m[mt][r];
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
          row_max = fmaxf(row_max, fmaxf(s[mt][nt].x[2 * r], s[mt][nt].x[2 * r + 1]));
        m_new[mt][r] = cuda::quad_max(row_max);
      }
  }

  template <int kNTiles, int kDTiles>
  __device__ __forceinline__ void exponentiate(cuda::FragC (&s)[kMTiles][kNTiles], cuda::FragC (&o)[kMTiles][kDTiles],
                                               const float (&m_new)[kMTiles][2], float scale_log2) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float base = m_new[mt][r] == -INFINITY ? 0.0f : m_new[mt][r] * scale_log2;
        const float alpha = cuda::fast_exp2(m[mt][r] * scale_log2 - base);
        m[mt][r] = m_new[mt][r];
        float row_sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; ++e) {
            const float p = cuda::fast_exp2(fmaf(s[mt][nt].x[e], scale_log2, -base));
            s[mt][nt].x[e] = p;
            row_sum += p;
          }
        l[mt][r] = alpha * l[mt][r] + row_sum;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          o[mt][dt].x[2 * r] *= alpha;
          o[mt][dt].x[2 * r + 1] *= alpha;
        }
      }
  }

  // Divides o by l; returns each row's natural-log lse (-inf for rows that saw no key).
  template <int kDTiles>
  __device__ __forceinline__ void finalize(cuda::FragC (&o)[kMTiles][kDTiles], float scale,
                                           float (&lse)[kMTiles][2]) {
    float sum[kMTiles][2];
    row_sums(sum);
    normalize(o, scale, sum, lse);
  }

  // The two halves of finalize: l summed over the lane's quad (rows split over several warps add
  // their warps' sums between the two), then the division.
  __device__ __forceinline__ void row_sums(float (&sum)[kMTiles][2]) const {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) sum[mt][r] = cuda::quad_sum(l[mt][r]);
  }

  template <int kDTiles>
  __device__ __forceinline__ void normalize(cuda::FragC (&o)[kMTiles][kDTiles], float scale,
                                            const float (&sum)[kMTiles][2], float (&lse)[kMTiles][2]) const {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float inv_l = sum[mt][r] > 0.0f ? 1.0f / sum[mt][r] : 0.0f;
        lse[mt][r] = sum[mt][r] > 0.0f ? m[mt][r] * scale + logf(sum[mt][r]) : -INFINITY;
#pragma unroll
        for (int dt = 0; dt < kDTiles; ++dt) {
          o[mt][dt].x[2 * r] *= inv_l;
          o[mt][dt].x[2 * r + 1] *= inv_l;
        }
      }
  }
};

}  // namespace flashattn::detail::sm80
