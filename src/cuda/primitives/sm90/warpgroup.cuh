// Warpgroups (4 consecutive warps, 128 threads, starting at a warp index divisible by 4): the unit
// that issues wgmma and that a warp-specialised kernel gives one role (producer or consumer).
//   warpgroup_index()      which warpgroup of the block this thread is in, warp-uniform
//   setmaxnreg_inc/dec<N>  move registers between warpgroups (sm_90a)
//   named_barrier_sync/arrive(id, threads)  bar.sync / bar.arrive on barrier `id` (1..15; 0 is
//                          __syncthreads) among `threads` threads, a multiple of 32 (named_barrier.cuh)
//   fence_proxy_async_shared()  orders this thread's ordinary shared-memory stores before later
//                          reads by the async proxy (TMA stores, wgmma operands)
#pragma once

#include <cstdint>

#include "cuda/primitives/named_barrier.cuh"
#include "cuda/primitives/sm90/arch.cuh"

namespace flashattn::cuda::sm90 {

inline constexpr int kWarpgroupThreads = 128;
inline constexpr int kWarpgroupWarps = 4;

// threadIdx.x / 128, read from lane 0 so that the compiler knows it is the same across the warp
// (role branches then stay warp-uniform, which setmaxnreg and wgmma require).
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / kWarpgroupThreads, 0);
}

// Thread index within the warpgroup, 0..127.
__device__ __forceinline__ int warpgroup_thread() { return static_cast<int>(threadIdx.x) % kWarpgroupThreads; }

// Warp index within the warpgroup, 0..3, warp-uniform.
__device__ __forceinline__ int warpgroup_warp() {
  return __shfl_sync(0xffffffffu, warpgroup_thread() / 32, 0);
}

// setmaxnreg: every warp of the warpgroup must execute it (sync.aligned). The kernel needs a register
// cap at entry (__launch_bounds__(threads, 1)); the registers a warpgroup gives up with dec go to a
// per-block pool from which inc takes them, blocking until enough are free. So the budgets must fit
// the block's allocation: for W warpgroups launched with R registers per thread, the sum of the
// warpgroups' new counts must stay <= W * R (e.g. 384 threads, R = 168: 40 + 232 + 232 = 504).
// kRegisters: a multiple of 8 in [24, 256].
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg: 24..256, multiple of 8");
#if defined(FLASHATTN_SM90A_DEVICE)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
#else
  __trap();
#endif
}

template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegisters % 8 == 0 && kRegisters >= 24 && kRegisters <= 256, "setmaxnreg: 24..256, multiple of 8");
#if defined(FLASHATTN_SM90A_DEVICE)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
#else
  __trap();
#endif
}

// named_barrier_sync/arrive: the arch-independent ones of named_barrier.cuh.
using cuda::named_barrier_arrive;
using cuda::named_barrier_sync;

// Each thread that wrote shared memory with ordinary stores (st.shared, stmatrix) which the async
// proxy reads next (a TMA store, a wgmma operand) issues this before the barrier that publishes it.
__device__ __forceinline__ void fence_proxy_async_shared() {
#if defined(FLASHATTN_SM90_DEVICE)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  __trap();
#endif
}

}  // namespace flashattn::cuda::sm90
