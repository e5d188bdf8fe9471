// A shared tail's merge (tile_scheduler.cuh: the three consumers computed the same 64 rows, each
// over every third key tile). Each consumer ends its share with an online-softmax state (m, l,
// unnormalised o) on the same register layout (thread t of every consumer holds the same rows and
// columns), and the three merge as the split tail's two parts do (split_tail.cuh, merge_state),
// through the Q tile's shared memory, which no S reads any more. The consumers meet on a named
// barrier before each step, a barrier of its own for each of the three:
//   1. every consumer is done with its share: its last S, so the Q tile is free, and every tile
//      phase of the item complete (a consumer saw no phase of the others' slots and must not wait on
//      one of them by parity before they end); consumer 2 stores its state;
//   2. consumer 1 merges it into its own and stores the result in the same places (each thread
//      reads and writes its own values);
//   3. consumer 0 merges that, and stores O and lse as for any item.
// The order is fixed, so the result is the same bits from run to run. Value x of thread t of the
// warpgroup lies at float x 128 + t (a warp's accesses 128 contiguous bytes); kO + 4 floats a
// thread, 34 KB of the 48 KB Q tile at d = 128. Each thread then orders its ordinary accesses before
// the next item's Q load (async proxy) and releases the Q tile (release_q). Racecheck reports this
// hand-over (a store before a meet, the load after it) though the barrier orders it: 11 sites in
// this version, 20 with one barrier met three times. tools/gpu/racecheck_probe.cu shows the same
// pattern reported only where other named barriers have bar.arrive pending (the ring of turns),
// with exact values; scripts/gpu_check.sh fails on any other hazard (tools/gpu/racecheck_sites.py).
// docs/perf.md, "Shared tails switched on".
#pragma once

#include <cuda_runtime.h>

#include "cuda/primitives/sm90/warpgroup.cuh"
#include "cuda/sm90/split_tail.cuh"  // merge_state

namespace flashattn::detail::sm90 {

// meets: the first of three named barriers over the three consumers' threads, met after the walk
// (meets), after consumer 2's store (meets + 1) and after consumer 1's (meets + 2); the consumers
// waiting at one have nothing else to do (the next item needs the Q tile, released only at the end).
template <int kO, int kAcc, class Softmax, class ReleaseQ>
__device__ __forceinline__ void merge_shared_tail(uint8_t* q_smem, float (&o)[kAcc], Softmax& softmax,
                                                  float scale_log2, const ReleaseQ& release_q, int meets) {
  constexpr int kThreads = cuda::sm90::kWarpgroupThreads;
  const int c = cuda::sm90::warpgroup_index() - 1, t = cuda::sm90::warpgroup_thread();  // consumer c: warpgroup c + 1
  float* state = reinterpret_cast<float*>(q_smem) + t;
  const auto store = [&] {
#pragma unroll
    for (int x = 0; x < kO; ++x) state[x * kThreads] = o[x];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      state[(kO + r) * kThreads] = softmax.m[r];
      state[(kO + 2 + r) * kThreads] = softmax.l[r];
    }
  };
  const auto merge_stored = [&] {
    merge_state<kO>(o, softmax, scale_log2, [&](int x) { return state[x * kThreads]; });
  };
  const auto meet = [&](int step) { cuda::sm90::named_barrier_sync(meets + step, 3 * kThreads); };
  meet(0);
  if (c == 2) store();
  meet(1);
  if (c == 1) {
    merge_stored();
    store();
  }
  meet(2);
  if (c == 0) merge_stored();
  cuda::sm90::fence_proxy_async_shared();
  release_q();
}

}  // namespace flashattn::detail::sm90
