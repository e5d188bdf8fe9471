// Reductions into global memory (fire-and-forget atomics: no value comes back).
#pragma once

namespace flashattn::cuda {

// addr[0..3] += v.x .. v.w, each element atomically (the four need not be added as a unit). sm_90
// adds the four with one vector instruction, so that a warp whose lanes hold 16 consecutive bytes
// each covers four whole 128-byte lines with one request. addr is 16-byte aligned.
__device__ __forceinline__ void red_add_f32x4(float* addr, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
#else
  atomicAdd(addr, v.x);
  atomicAdd(addr + 1, v.y);
  atomicAdd(addr + 2, v.z);
  atomicAdd(addr + 3, v.w);
#endif
}

}  // namespace flashattn::cuda
