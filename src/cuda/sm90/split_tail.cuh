// The split tail's merge (tile_scheduler.cuh: an item cut into two parts run by two blocks). Each
// part ends its walk with an online-softmax state (m, l, unnormalised o) over its own key tiles;
// the two states merge as the seeds' state merging does (ring attention's):
//   m = max(m0, m1),  f_i = exp(scale (m_i - m)),  l = f0 l0 + f1 l1,  o = f0 o0 + f1 o1
// and O = o / l, lse = scale m + log l as for a whole item. The merge is per warp: a warp's 16 rows
// are its own in both parts (the same consumer and warp of the same slice of the Q tile), so each
// warp hands over on a counter of its own (cuda::Handoff). The first part to finish stores its
// state to its slot of the workspace and leaves the item; the second waits for that publication
// (the first has arrived: it is running its last stores) and merges, then stores O and lse as usual.
// Either part may finish first; each term is rounded alone and the two added (commutative), so the
// result is the same bits from run to run whichever it is.
// Slot layout: per (boundary, consumer, warp), d / 2 + 4 floats per lane, value v of lane t at
// v 32 + t (each store and load of a warp 128 contiguous bytes, through L2: __stcg / __ldcg). The
// merge itself (merge_state) is also the shared tails' (shared_tail.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>

#include "cuda/primitives/handoff.cuh"
#include "cuda/primitives/math.cuh"
#include "cuda/sm90/kernel_params.hpp"
#include "cuda/sm90/softmax.cuh"  // acc_index

namespace flashattn::detail::sm90 {

// The workspace: counters first (zeroed per call), then the partial states at a 256-byte multiple
// offset (the base is 64-byte aligned); per warp 32 (d / 2 + 4) floats (o: d / 2 per lane, then
// m[2] and l[2]). Two calls in flight must not share it: a second call's memset could reset a
// counter that a part of the first is waiting on.
struct SplitLayout {
  static constexpr int kWarps = 4;  // of a consumer warpgroup
  static constexpr int floats_per_warp(int head_dim) { return 32 * (head_dim / 2 + 4); }
  static constexpr size_t counter_bytes(int boundaries, int consumers) {
    return (static_cast<size_t>(boundaries) * consumers * kWarps * sizeof(int) + 255) / 256 * 256;
  }
  static constexpr size_t bytes(int boundaries, int consumers, int head_dim) {
    return counter_bytes(boundaries, consumers) +
           static_cast<size_t>(boundaries) * consumers * kWarps * floats_per_warp(head_dim) * sizeof(float);
  }
};

// Merges another online-softmax state into (o, softmax), the seeds' state merging: value x of the
// other state is other(x), its o's accumulator x for x < kO, then m[r] at kO + r and l[r] at
// kO + 2 + r (r = 0, 1: the thread's two rows). Each product is rounded on its own (no fma) and then
// added, so that the sum is the same bits whichever state is this thread's.
template <int kO, int kAcc, class Softmax, class Other>
__device__ __forceinline__ void merge_state(float (&o)[kAcc], Softmax& softmax, float scale_log2, const Other& other) {
  static_assert(kO <= kAcc, "o holds the O columns first");
  float f_mine[2], f_other[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float m_other = other(kO + r), l_other = other(kO + 2 + r);
    const float m = fmaxf(softmax.m[r], m_other);
    const float base = m == -INFINITY ? 0.0f : m * scale_log2;  // a row that saw no key: factors 0
    f_mine[r] = cuda::fast_exp2(softmax.m[r] * scale_log2 - base);
    f_other[r] = cuda::fast_exp2(m_other * scale_log2 - base);
    softmax.m[r] = m;
    softmax.l[r] = __fadd_rn(__fmul_rn(f_mine[r], softmax.l[r]), __fmul_rn(f_other[r], l_other));
  }
  // In chunks of 16 values, loaded then merged: hoisted all at once, the loads of the other state's
  // o would take d / 2 registers more than d = 256 has.
  constexpr int kChunk = kO < 16 ? kO : 16;
#pragma unroll
  for (int x0 = 0; x0 < kO; x0 += kChunk) {
    float values[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) values[i] = other(x0 + i);
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const int x = x0 + i, r = (x / 2) % 2;  // acc_index(j, r, e) = 4 j + 2 r + e
      o[x] = __fadd_rn(__fmul_rn(f_mine[r], o[x]), __fmul_rn(f_other[r], values[i]));
    }
    __syncwarp();  // the next chunk's loads stay after this one's merge (ptxas moves no load above it)
  }
}

// One warp's hand-over of a part's state (o's first kO accumulators, the O columns, and the
// softmax's m and l) for the split item at `boundary`. Returns false for the first part to finish (its state stored, the other part will
// finish the item: store nothing), true for the second, whose o and softmax then hold the merged
// state. scale_log2 converts m to exponent terms (softmax.cuh).
template <int kConsumers, int kO, int kAcc, class Softmax>
__device__ __forceinline__ bool merge_split_parts(const ForwardKernelParams& p, int boundary, int c, int warp,
                                                  int lane, float (&o)[kAcc], Softmax& softmax, float scale_log2) {
  static_assert(kO <= kAcc, "o holds the O columns first");
  const int index = (boundary * kConsumers + c) * SplitLayout::kWarps + warp;
  int* counter = p.split_counters + index;
  float* slot = p.split_partials + static_cast<size_t>(index) * SplitLayout::floats_per_warp(2 * kO) + lane;
  int arrived = 0;
  if (lane == 0) arrived = cuda::Handoff::arrive(counter);
  arrived = __shfl_sync(0xffffffffu, arrived, 0);
  if (arrived == 0) {  // first: publish (o, m, l)
#pragma unroll
    for (int x = 0; x < kO; ++x) __stcg(slot + 32 * x, o[x]);
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      __stcg(slot + 32 * (kO + r), softmax.m[r]);
      __stcg(slot + 32 * (kO + 2 + r), softmax.l[r]);
    }
    __threadfence();
    __syncwarp();
    if (lane == 0) cuda::Handoff::publish(counter);
    return false;
  }
  cuda::Handoff::wait_published(counter);  // every lane: its own acquire before its loads
  merge_state<kO>(o, softmax, scale_log2, [&](int x) { return __ldcg(slot + 32 * x); });
  return true;
}

}  // namespace flashattn::detail::sm90
