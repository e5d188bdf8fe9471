// Helpers of the softmax, the score modifiers and the epilogues: the hardware exp2 and reciprocal,
// and reductions and a transpose across the four lanes of an mma quad (the lanes that share one
// accumulator row).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

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

// The 4 x 4 transpose of 32-bit words within a quad of lanes (lanes 4 i .. 4 i + 3, every lane of
// the warp taking part): lane `quad` passes w[0..3] and gets back word `quad` of each lane of the
// quad, in lane order. Two butterfly steps, exchanging single words with the lane quad ^ 1, then
// pairs with quad ^ 2.
__device__ __forceinline__ uint4 transpose_quad(const uint32_t* w, int quad) {
  uint32_t x[4] = {w[0], w[1], w[2], w[3]};
  const bool odd = quad & 1, upper = quad & 2;
#pragma unroll
  for (int i = 0; i < 4; i += 2) {  // words i, i + 1: swap the off-diagonal ones of the 2 x 2 block
    const uint32_t sent = odd ? x[i] : x[i + 1];
    const uint32_t got = __shfl_xor_sync(0xffffffffu, sent, 1);
    if (odd) x[i] = got; else x[i + 1] = got;
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // the pairs (0, 1) and (2, 3): swap the off-diagonal 2 x 2 blocks
    const uint32_t sent = upper ? x[i] : x[i + 2];
    const uint32_t got = __shfl_xor_sync(0xffffffffu, sent, 2);
    if (upper) x[i] = got; else x[i + 2] = got;
  }
  return make_uint4(x[0], x[1], x[2], x[3]);
}

}  // namespace flashattn::cuda
