// Named barriers (bar.sync / bar.arrive, sm_70 and later): a barrier among a subset of the block's
// warps, so that a few warps that share data wait for each other only.
//   named_barrier_sync/arrive(id, threads)  on barrier `id` (1..15; 0 is __syncthreads) among
//                                           `threads` threads, a multiple of 32
//   named_barrier_any(id, threads, q)       named_barrier_sync, returning whether q held in any of
//                                           them (the same answer in every thread)
#pragma once

#include <cstdint>

namespace flashattn::cuda {

// Waits until `threads` threads (counting arrivals) have reached barrier `id`; orders the shared-memory
// accesses of the participating threads like __syncthreads does for the whole block.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Counts this thread towards barrier `id` without waiting (the producer side of a named barrier:
// the waiting side calls named_barrier_sync with the same total).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// named_barrier_sync that also ORs a predicate over the participating threads (bar.red.or.pred):
// a decision every thread of a warpgroup takes alike, as wgmma's .aligned issue requires. A barrier
// used this way must not also be used by bar.sync or bar.arrive while active (the PTX ISA: the
// execution is then unpredictable).
__device__ __forceinline__ bool named_barrier_any(int id, int threads, bool q) {
  uint32_t any;
  asm volatile(
      "{\n"
      "  .reg .pred q, p;\n"
      "  setp.ne.u32 q, %1, 0;\n"
      "  bar.red.or.pred p, %2, %3, q;\n"
      "  selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(any)
      : "r"(static_cast<uint32_t>(q)), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

}  // namespace flashattn::cuda
