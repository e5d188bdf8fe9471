// ldmatrix: a warp loads four 8x8 matrices of 16-bit elements from shared memory into mma fragments.
// Lanes 8i..8i+7 give the row addresses (16 bytes each) of matrix i; lane 4g+t receives, of each
// matrix, row g elements 2t..2t+1 (plain) or column g elements of rows 2t..2t+1 (.trans).
#pragma once

#include <cstdint>

namespace flashattn::cuda {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// stmatrix (sm_90): the inverse of ldmatrix_x4, four 8x8 matrices of 16-bit elements from mma
// accumulator fragments (lane 4g+t holds row g elements 2t..2t+1 of matrix i in r[i]) to the rows
// whose addresses lanes 8i..8i+7 give. One instruction for what takes four 32-bit stores.
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_addr, const uint32_t (&r)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(smem_addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
#else
  __trap();  // callers take this path on sm_90 only
#endif
}

}  // namespace flashattn::cuda
