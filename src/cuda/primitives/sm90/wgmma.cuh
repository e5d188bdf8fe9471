// wgmma (sm_90a): warpgroup-level asynchronous matrix multiply-accumulate, D[64 x N] (+)= A[64 x 16]
// B[16 x N] per instruction, fp32 accumulators in registers, B (and optionally A) read by the
// tensor cores straight from shared memory through 64-bit matrix descriptors.
//
// Issue protocol (all 128 threads of the warpgroup, warp-uniform control flow):
//   wgmma_fence()                 before the first wgmma, and again whenever the accumulators or
//                                 the A registers were written by ordinary instructions since
//   wgmma_ss / wgmma_rs ...       any number of instructions (they chain on the accumulators)
//   wgmma_commit()                closes a group
//   wgmma_wait<N>()               <= N groups still in flight; the accumulators (and the A
//                                 registers) of the completed groups may be read / rewritten
// The compiler does not know the accumulators are in flight between issue and wait, so code that
// keeps ordinary instructions away from them brackets the region with wgmma_fence_operand(d).
//
// Accumulator layout (m64nN, fp32, N/2 registers per thread): thread t of the warpgroup, warp
// w = t / 32, lane = 4 g + q (g = lane / 4, q = lane % 4), owns for each 8-column block j:
//   d[4 j + 0], d[4 j + 1]  at (row 16 w + g,     cols 8 j + 2 q, 8 j + 2 q + 1)
//   d[4 j + 2], d[4 j + 3]  at (row 16 w + g + 8, cols 8 j + 2 q, 8 j + 2 q + 1)
// i.e. the mma.sync m16n8 C layout (mma.cuh), warp w taking rows 16 w .. 16 w + 15.
// A from registers (m64k16, four 32-bit registers of two 16-bit elements, lower k in the low half):
//   a[0]: (row 16 w + g, k 2 q, 2 q + 1)   a[1]: (row 16 w + g + 8, k 2 q, 2 q + 1)
//   a[2]: (row 16 w + g, k 2 q + 8, + 9)   a[3]: (row 16 w + g + 8, k 2 q + 8, + 9)
// so the accumulator blocks 2 s and 2 s + 1 of one GEMM are, packed, the A operand of k16 step s of
// the next (a_from_accumulators): how P stays in registers between S = Q Kᵀ and O = P V.
//
// Shared-memory operands use the 128-byte-swizzled layout of Sw128Tile (sw128_tile.cuh), the layout
// TMA writes:
//   K-major (A, or B = Kᵀ in Q Kᵀ: rows = M or N, cols = K): rows of 128 bytes (64 k), 8-row groups
//     1024 bytes apart (stride byte offset, SBO); k16 step s of column block s / 4 starts 32 (s % 4)
//     bytes into the row: the hardware applies the swizzle to the address it forms, so stepping the
//     start address inside the 128-byte row is exact. The leading byte offset is unused.
//   MN-major (B = V in P V: rows = K (keys), cols = N (dims), N contiguous, kTransB = 1): atoms of
//     8 k rows x 64 n (1024 bytes); the 8-row groups along k are SBO = 1024 apart, the 64-wide
//     column blocks along n are LBO = kRows * 128 apart; k16 step s starts at row 16 s.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/primitives/mma.cuh"  // MmaType<T>::pack
#include "cuda/primitives/sm90/arch.cuh"
#include "cuda/primitives/sm90/sw128_tile.cuh"
#include "cuda/primitives/sm90/wgmma_ops.cuh"

namespace flashattn::cuda::sm90 {

// Matrix descriptor fields (PTX ISA, "Matrix Descriptor Format"): start address, leading and stride
// byte offsets, all >> 4 in 14-bit fields; bits 62-63 the swizzle mode (1 = 128-byte); the base
// offset (bits 49-51) stays 0 because every swizzle atom starts 1024-byte aligned.
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t smem_addr, uint32_t leading_byte_offset,
                                                    uint32_t stride_byte_offset) {
  constexpr uint64_t kSwizzle128B = 1;
  return static_cast<uint64_t>((smem_addr & 0x3ffffu) >> 4) |
         (static_cast<uint64_t>((leading_byte_offset & 0x3ffffu) >> 4) << 16) |
         (static_cast<uint64_t>((stride_byte_offset & 0x3ffffu) >> 4) << 32) | (kSwizzle128B << 62);
}

// Descriptor of k16 step `k16` of a K-major operand stored as Sw128Tile<kRows, kCols> at tile_addr
// (kRows = 64 for A, = N for B; kCols = K).
template <class Tile>
__device__ __forceinline__ uint64_t k_major_descriptor(uint32_t tile_addr, int k16) {
  constexpr int kStepsPerBlock = kSw128Cols / 16;
  const uint32_t addr = tile_addr + Tile::col_block_offset(k16 / kStepsPerBlock) + (k16 % kStepsPerBlock) * 32;
  return smem_descriptor(addr, 16, kSw128AtomBytes);  // LBO unused for swizzled K-major: any nonzero
}

// Descriptor of k16 step `k16` of an MN-major B operand stored as Sw128Tile<kRows = K, kCols = N>.
template <class Tile>
__device__ __forceinline__ uint64_t mn_major_descriptor(uint32_t tile_addr, int k16) {
  return smem_descriptor(tile_addr + k16 * 16 * kSw128Bytes, Tile::kColBlockBytes, kSw128AtomBytes);
}

__device__ __forceinline__ void wgmma_fence() {
#if defined(FLASHATTN_SM90A_DEVICE)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void wgmma_commit() {
#if defined(FLASHATTN_SM90A_DEVICE)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
#if defined(FLASHATTN_SM90A_DEVICE)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#else
  __trap();
#endif
}

// Keeps the compiler from moving reads or writes of the accumulators across this point (they are
// owned by the tensor cores between issue and wait).
template <int kCount>
__device__ __forceinline__ void wgmma_fence_operand(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (+)= A B, A and B from shared memory. N = 2 * kAccumulators.
template <class T, int kTransB = 0, int kAccumulators>
__device__ __forceinline__ void wgmma_ss(float (&d)[kAccumulators], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  WgmmaOp<2 * kAccumulators>::template ss<T, kTransB>(d, desc_a, desc_b, accumulate ? 1 : 0);
}

// d (+)= A B, A from registers (layout above), B from shared memory.
template <class T, int kTransB = 0, int kAccumulators>
__device__ __forceinline__ void wgmma_rs(float (&d)[kAccumulators], const uint32_t (&a)[4], uint64_t desc_b,
                                         bool accumulate) {
  WgmmaOp<2 * kAccumulators>::template rs<T, kTransB>(d, a, desc_b, accumulate ? 1 : 0);
}

// The A registers of k16 step `k16` of the next GEMM from the fp32 accumulators of this one
// (accumulator columns 16 k16 .. 16 k16 + 15 become k 0 .. 15), rounded to T. k16 must be a
// compile-time constant (an unrolled loop): a run-time index would move d to local memory.
template <class T, int kAccumulators>
__device__ __forceinline__ void a_from_accumulators(uint32_t (&a)[4], const float (&d)[kAccumulators], int k16) {
  const float* c = d + 8 * k16;
  a[0] = MmaType<T>::pack(c[0], c[1]);
  a[1] = MmaType<T>::pack(c[2], c[3]);
  a[2] = MmaType<T>::pack(c[4], c[5]);
  a[3] = MmaType<T>::pack(c[6], c[7]);
}

}  // namespace flashattn::cuda::sm90
