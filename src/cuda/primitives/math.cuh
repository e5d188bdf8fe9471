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

// 2^x on the FMA and integer pipes (no special-function unit), for x >= -125 finite (smaller x are
// taken as -125: 2^-125, not 0): x = n + f with n = rint(x) (the 1.5 2^23 rounding trick, whose low
// mantissa bits then hold n) and |f| <= 1/2; 2^f by a degree-3 polynomial (Chebyshev interpolation
// on [-1/2, 1/2], max relative error 9.6e-5 in fp32: below a bf16 or fp16 P's rounding); n added to
// the exponent field. Eight instructions: FMNMX, three FADD, three FFMA, one LEA.
__device__ __forceinline__ float exp2_poly3(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 2^23: x + kRound rounds x to an integer
  x = fmaxf(x, -125.0f);
  const float t = x + kRound;
  const float f = x - (t - kRound);
  const float p = fmaf(fmaf(fmaf(0.0558382832f, f, 0.242639482f), f, 0.693136752f), f, 0.999924541f);
  return __uint_as_float(__float_as_uint(p) + (__float_as_uint(t) << 23));  // unsigned: the shift wraps
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
