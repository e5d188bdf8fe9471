// The two GEMMs of attention, per warp, on mma.sync m16n8k16 with operands from swizzled shared
// memory (ldmatrix) and, for P, from registers:
//   S[kMTiles*16 x Bc]  = Q[rows, d] · K[Bc, d]^T     (Q and K row-major in smem: plain ldmatrix;
//                                                     or Q held in registers, loaded once)
//   o[kMTiles*16 x d]  += P[rows, Bc] · V[Bc, d]      (P from the S accumulators, V via ldmatrix.trans)
// Each K or V fragment is loaded once and fed to all kMTiles m16 tiles of the warp.
#pragma once

#include <cstdint>

#include "cuda/primitives/ldmatrix.cuh"
#include "cuda/primitives/mma.cuh"
#include "cuda/primitives/smem_tile.cuh"

namespace flashattn::detail::sm80 {

// S = Q K^T for one warp. q_rows0: the warp's first row in the Q tile.
template <class T, int kMTiles, int kNTiles, int kHeadDim, class QTile, class KTile>
__device__ __forceinline__ void gemm_qk(cuda::FragC (&s)[kMTiles][kNTiles], uint32_t q_smem, uint32_t k_smem,
                                        int q_rows0, int lane) {
  static_assert(kNTiles % 2 == 0, "K fragments come in pairs of n8 tiles");
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) s[mt][nt] = {0.0f, 0.0f, 0.0f, 0.0f};

  // Lane roles of ldmatrix.x4: for A, matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15) as a0..a3;
  // for B, (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15) as two n8 tiles.
  // Lane chunks 0/1 plus even chunk steps: the precondition of advance().
  const uint32_t a_offset = QTile::offset(q_rows0 + (lane & 15), lane >> 4);
  const uint32_t b_offset = KTile::offset((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    cuda::FragA a[kMTiles];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
      cuda::ldmatrix_x4(a[mt].x, q_smem + QTile::advance(a_offset, 16 * mt, 2 * kk));
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t b[4];
      cuda::ldmatrix_x4(b, k_smem + KTile::advance(b_offset, 16 * np, 2 * kk));
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        cuda::mma_m16n8k16<T>(s[mt][2 * np], a[mt], {b[0], b[1]});
        cuda::mma_m16n8k16<T>(s[mt][2 * np + 1], a[mt], {b[2], b[3]});
      }
    }
  }
}

// S = Q K^T with the warp's Q fragments already in registers (q[mt][kk]: rows 16 mt.., dims 16 kk..).
template <class T, int kMTiles, int kNTiles, int kHeadDim, class KTile>
__device__ __forceinline__ void gemm_qk(cuda::FragC (&s)[kMTiles][kNTiles], const cuda::FragA (&q)[kMTiles][kHeadDim / 16],
                                        uint32_t k_smem, int lane) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) s[mt][nt] = {0.0f, 0.0f, 0.0f, 0.0f};
  const uint32_t b_offset = KTile::offset((lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk)
#pragma unroll
    for (int np = 0; np < kNTiles / 2; ++np) {
      uint32_t b[4];
      cuda::ldmatrix_x4(b, k_smem + KTile::advance(b_offset, 16 * np, 2 * kk));
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        cuda::mma_m16n8k16<T>(s[mt][2 * np], q[mt][kk], {b[0], b[1]});
        cuda::mma_m16n8k16<T>(s[mt][2 * np + 1], q[mt][kk], {b[2], b[3]});
      }
    }
}

// A fragments of kMTiles m16 tiles from rows rows0 .. and kKSteps k16 steps from column 8 chunk0
// of a swizzled tile (ldmatrix.x4 lanes: rows 0-15 at a k step's chunks 0 | 1): the warp's Q for
// gemm_qk from registers, or a half of P that the other warp of a pair left in shared memory.
// chunk0 shares no bit with the chunk steps 0 .. 2 kKSteps - 1 (0, or a multiple of their span).
template <int kMTiles, int kKSteps, class Tile>
__device__ __forceinline__ void load_a_fragments(cuda::FragA (&a)[kMTiles][kKSteps], uint32_t tile_smem, int rows0,
                                                 int lane, int chunk0 = 0) {
  const uint32_t base = Tile::offset(rows0 + (lane & 15), chunk0 + (lane >> 4));
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk)
      cuda::ldmatrix_x4(a[mt][kk].x, tile_smem + Tile::advance(base, 16 * mt, 2 * kk));
}

// P as A fragments: the S accumulators of keys 16 kk .. 16 kk + 15 rounded to T. Done right after
// the softmax so that the fp32 scores are dead before the second GEMM (registers).
template <class T, int kMTiles, int kNTiles>
__device__ __forceinline__ void pack_p(cuda::FragA (&p)[kMTiles][kNTiles / 2], const cuda::FragC (&s)[kMTiles][kNTiles]) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int kk = 0; kk < kNTiles / 2; ++kk) p[mt][kk] = cuda::a_from_accumulators<T>(s[mt][2 * kk], s[mt][2 * kk + 1]);
}

// o += P V for one warp.
template <class T, int kMTiles, int kKSteps, int kDTiles, class VTile>
__device__ __forceinline__ void gemm_pv(cuda::FragC (&o)[kMTiles][kDTiles], const cuda::FragA (&p)[kMTiles][kKSteps],
                                        uint32_t v_smem, int lane) {
  static_assert(kDTiles % 2 == 0, "V fragments come in pairs of n8 tiles");
  // ldmatrix.x4.trans lane roles: (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15),
  // (keys 8-15, d 8-15) as b0, b1 of two n8 tiles of the head dim.
  const uint32_t b_offset = VTile::offset((lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
    for (int dp = 0; dp < kDTiles / 2; ++dp) {
      uint32_t b[4];
      cuda::ldmatrix_x4_trans(b, v_smem + VTile::advance(b_offset, 16 * kk, 2 * dp));
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        cuda::mma_m16n8k16<T>(o[mt][2 * dp], p[mt][kk], {b[0], b[1]});
        cuda::mma_m16n8k16<T>(o[mt][2 * dp + 1], p[mt][kk], {b[2], b[3]});
      }
    }
  }
}

}  // namespace flashattn::detail::sm80
