// mbarrier: a 64-bit shared-memory barrier with a phase bit, an expected arrival count and (sm_90)
// a transaction count in bytes, so that a TMA copy can complete a phase when its bytes have landed.
//
// A phase completes when `count` threads have arrived and the pending transaction bytes are back to
// zero; the barrier then flips to the next phase. Waiters name the phase by its parity:
// mbarrier_wait(bar, p) returns once the phase of parity p has completed. A freshly initialised
// barrier is in phase 0, and the phase "before" it (parity 1) counts as completed, so a producer
// that waits for an empty slot with parity (round & 1) ^ 1 does not block in its first round.
//
//   thread 0:  mbarrier_init(bar, count); fence_mbarrier_init(); then __syncthreads()
//   producer:  mbarrier_arrive_expect_tx(bar, bytes); tma_load(..., bar)   (copy completes the bytes)
//   consumer:  mbarrier_wait(bar, phase)
//
// Addresses are shared-state-space addresses (smem_address(ptr), ldmatrix.cuh); the barrier must be
// 8-byte aligned.
#pragma once

#include <cstdint>

#include "cuda/primitives/ldmatrix.cuh"  // smem_address
#include "cuda/primitives/sm90/arch.cuh"

namespace flashattn::cuda::sm90 {

// One thread initialises each barrier before any use; `count` arrivals complete a phase.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
#if defined(FLASHATTN_SM90_DEVICE)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
#else
  __trap();
#endif
}

// Makes the initialising thread's mbarrier.init visible to the other threads and to the async proxy
// (the TMA unit that completes transactions on it). Follow with a block-wide barrier.
__device__ __forceinline__ void fence_mbarrier_init() {
#if defined(FLASHATTN_SM90_DEVICE)
  asm volatile(
      "fence.mbarrier_init.release.cluster;\n"
      "fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  __trap();
#endif
}

// Counts one arrival (release semantics: this thread's earlier memory accesses happen before the
// phase completes for the waiters).
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
#if defined(FLASHATTN_SM90_DEVICE)
  [[maybe_unused]] uint64_t state;
  asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1];\n" : "=l"(state) : "r"(bar) : "memory");
#else
  __trap();
#endif
}

// Counts `count` arrivals at once (sm_90): a thread that stands for others, as a tail group's owner
// of a K/V tile does for the consumers that never read it.
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar, uint32_t count) {
#if defined(FLASHATTN_SM90_DEVICE)
  [[maybe_unused]] uint64_t state;
  asm volatile("mbarrier.arrive.shared::cta.b64 %0, [%1], %2;\n" : "=l"(state) : "r"(bar), "r"(count) : "memory");
#else
  __trap();
#endif
}

// Counts one arrival and adds `bytes` to the transactions the current phase waits for: the producer
// calls it once per stage, before (or together with) the TMA copies that will deliver those bytes.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if defined(FLASHATTN_SM90_DEVICE)
  [[maybe_unused]] uint64_t state;
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 %0, [%1], %2;\n"
               : "=l"(state)
               : "r"(bar), "r"(bytes)
               : "memory");
#else
  __trap();
#endif
}

// One non-blocking test: has the phase of parity `parity` completed? (acquire semantics when true:
// the data the phase stood for, TMA bytes included, is visible to this thread.)
__device__ __forceinline__ bool mbarrier_try_wait(uint32_t bar, uint32_t parity) {
#if defined(FLASHATTN_SM90_DEVICE)
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
#else
  __trap();
  return false;
#endif
}

// Blocks until the phase of parity `parity` has completed. try_wait itself suspends the thread for a
// hardware-chosen time before reporting "not yet", so this loop does not spin hot.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  while (!mbarrier_try_wait(bar, parity)) {
  }
}

}  // namespace flashattn::cuda::sm90
