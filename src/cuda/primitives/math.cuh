// Scalar helpers of the softmax and score modifiers: the hardware exp2 and reciprocal, and
// reductions across the four lanes of an mma quad (the lanes that share one accumulator row).
#pragma once

namespace flashattn::cuda {

inline constexpr float kLog2e = 1.4426950408889634f;

// 1/x on the special-function unit (rcp.approx.ftz: about 1 ulp; 1/inf = 0).
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 2^x on the special-function unit (ex2.approx.ftz: about 2 ulp; ex2(-inf) = +0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace flashattn::cuda
