// Reductions into global memory (fire-and-forget atomics: no value comes back).
#pragma once

namespace flashattn::cuda {

// *addr += a, *(addr + 1) += b, each element atomically (the pair need not be added as a unit).
// sm_90 adds both with one vector instruction; earlier GPUs take two. addr is 8-byte aligned.
__device__ __forceinline__ void red_add_f32x2(float* addr, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(addr, a);
  atomicAdd(addr + 1, b);
#endif
}

}  // namespace flashattn::cuda
