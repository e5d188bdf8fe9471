// cp.async (sm_80+): 16-byte global -> shared copies that bypass registers and L1, grouped into
// commit groups so that a pipeline stage can be waited for while later ones stay in flight.
#pragma once

#include <cstdint>

namespace flashattn::cuda {

// Copies 16 bytes, or writes 16 zero bytes when !valid (rows past the sequence end, head-dim
// padding): the source is then not read at all, so it may point anywhere.
__device__ __forceinline__ void cp_async_16_or_zero(uint32_t smem_addr, const void* gmem, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem),
               "r"(src_bytes));
}

// Copies 4 bytes (through L1: .ca is the only cache mode for sizes below 16); both addresses 4-byte
// aligned.
__device__ __forceinline__ void cp_async_4(uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr), "l"(gmem));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most `kPending` of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

}  // namespace flashattn::cuda
