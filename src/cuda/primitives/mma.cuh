// Warp-level tensor-core matrix multiply-accumulate, mma.sync.aligned.m16n8k16 (sm_80+), with fp32
// accumulation. Fragment ownership, for lane = 4 g + t (g = lane / 4, t = lane % 4):
//   A 16x16 (row-major)  a[0]: (g,   2t..2t+1)  a[1]: (g+8, 2t..2t+1)  a[2]: (g, 2t+8..)  a[3]: (g+8, 2t+8..)
//   B 16x8  (k x n)      b[0]: (k 2t..2t+1, n g)                      b[1]: (k 2t+8.., n g)
//   C 16x8  fp32         c[0..1]: (g, 2t..2t+1)                       c[2..3]: (g+8, 2t..2t+1)
// Each 32-bit register of A and B holds two consecutive-k elements, the lower k in the low half.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashattn::cuda {

struct FragA { uint32_t x[4]; };
struct FragB { uint32_t x[2]; };
struct FragC { float x[4]; };

// The element types the tensor cores take, with their PTX names and fp32 pair conversion.
template <class T> struct MmaType;

template <> struct MmaType<__half> {
  __device__ static uint32_t pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  __device__ static void mma(FragC& c, const FragA& a, const FragB& b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c.x[0]), "+f"(c.x[1]), "+f"(c.x[2]), "+f"(c.x[3])
        : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
  }
};

template <> struct MmaType<__nv_bfloat16> {
  __device__ static uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  __device__ static void mma(FragC& c, const FragA& a, const FragB& b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c.x[0]), "+f"(c.x[1]), "+f"(c.x[2]), "+f"(c.x[3])
        : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
  }
};

// c += a * b for element type T.
template <class T>
__device__ __forceinline__ void mma_m16n8k16(FragC& c, const FragA& a, const FragB& b) {
  MmaType<T>::mma(c, a, b);
}

// An A fragment from two fp32 C fragments that sit side by side along k (keys 0-7 and 8-15):
// this is how P stays in registers between the two GEMMs of attention.
template <class T>
__device__ __forceinline__ FragA a_from_accumulators(const FragC& left, const FragC& right) {
  FragA a;
  a.x[0] = MmaType<T>::pack(left.x[0], left.x[1]);
  a.x[1] = MmaType<T>::pack(left.x[2], left.x[3]);
  a.x[2] = MmaType<T>::pack(right.x[0], right.x[1]);
  a.x[3] = MmaType<T>::pack(right.x[2], right.x[3]);
  return a;
}

}  // namespace flashattn::cuda
