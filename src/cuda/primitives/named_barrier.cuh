// Named barriers (bar.sync / bar.arrive, sm_70 and later): a barrier among a subset of the block's
// warps, so that a few warps that share data wait for each other only.
//   named_barrier_sync/arrive(id, threads)  on barrier `id` (1..15; 0 is __syncthreads) among
//                                           `threads` threads, a multiple of 32
#pragma once

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

}  // namespace flashattn::cuda
