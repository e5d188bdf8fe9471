// The sm80 backward's GEMMs on a 2-D warp grid: every GEMM of a step is split over all warps of the
// block, each warp owning an interleaved set of m16 row tiles and 16-column slabs (WarpGrid), with
// both operands read from swizzled shared memory by ldmatrix (.trans where the tile's rows are the
// reduction dimension), and the accumulators stored back to swizzled tiles in the same layout.
#pragma once

#include <cstdint>

#include "cuda/primitives/ldmatrix.cuh"
#include "cuda/primitives/mma.cuh"
#include "cuda/primitives/smem_tile.cuh"

namespace flashattn::detail::sm80 {

// One warp's share of a [kRows x kCols] GEMM result split over a kWarpsM x kWarpsN warp grid. Warp
// (wm, wn) owns the m16 row tiles wm, wm + kWarpsM, ... and the 16-column slabs wn, wn + kWarpsN,
// ... (interleaved rather than contiguous: with power-of-two warp counts, the chunk steps between a
// warp's slabs never share a bit with its first chunk, the precondition of SwizzledTile::advance,
// whatever the number of slabs per warp). Accumulator c[mt][nt].x[2 r + e] is element
// (row0(mt) + g + 8 r, col0(nt) + 2 t + e), lane = 4 g + t.
template <int kRows, int kCols, int kWarpsM, int kWarpsN>
struct WarpGrid {
  static constexpr int kWM = kWarpsM, kWN = kWarpsN;
  static constexpr int kMTiles = kRows / (16 * kWarpsM);  // m16 tiles per warp
  static constexpr int kNTiles = kCols / (8 * kWarpsN);   // n8 tiles per warp, in pairs (slabs)
  static_assert(kRows % (16 * kWarpsM) == 0 && kCols % (16 * kWarpsN) == 0);

  int wm, wn;
  __device__ __forceinline__ explicit WarpGrid(int warp) : wm(warp % kWarpsM), wn(warp / kWarpsM) {}
  __device__ __forceinline__ int row0(int mt) const { return 16 * (wm + kWarpsM * mt); }
  __device__ __forceinline__ int col0(int nt) const { return 16 * (wn + kWarpsN * (nt / 2)) + 8 * (nt % 2); }
};

// What the rows of an operand's shared-memory tile index: the operand's own dimension (m of A, n
// of B: plain ldmatrix) or the reduction dimension k (ldmatrix.trans).
enum class TileRows { kMN, kK };

// c += A B for one warp of Grid, over kKSteps k16 steps from k = 0, both operands in swizzled
// shared memory. A [m, k] and B [k, n]; an operand whose tile rows are k is read transposed.
//   ldmatrix.x4 lane roles (lanes 8i..8i+7 address matrix i):
//   A, rows m: (m 0-7 | 8-15) x (k 0-7 | 8-15) as a0..a3      A, rows k: the same matrices from [k, m]
//   B, rows n: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15)
//   B, rows k: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15)
// the B matrices being b0, b1 of the slab's two n8 tiles. c holds kSlabs of the warp's slabs, from
// slab0 (a GEMM done in passes keeps fewer accumulators live). after_k_step(kk) runs once k-step
// kk's mma are issued (the loop is unrolled, so kk is a constant there): independent work placed
// there (no shared-memory stores, which would order the next ldmatrix after them) runs under the
// tensor cores.
struct NoKStepWork {
  __device__ __forceinline__ void operator()(int) const {}
};

template <class T, class Grid, int kKSteps, TileRows kARows, TileRows kBRows, class ATile, class BTile,
          int kSlabs = Grid::kNTiles / 2, class KStepWork = NoKStepWork>
__device__ __forceinline__ void warp_gemm(cuda::FragC (&c)[Grid::kMTiles][2 * kSlabs], uint32_t a_smem,
                                          uint32_t b_smem, const Grid& grid, int lane, int slab0 = 0,
                                          const KStepWork& after_k_step = {}) {
  const int lo = lane & 7, bit3 = (lane >> 3) & 1, bit4 = lane >> 4;
  // The lane's chunk is 0 or 1 plus the warp's first slab (2 wm or 2 wn): steps of 2 kk and of
  // 2 kWM mt (2 kWN np) never share a bit with it.
  const uint32_t a_offset = kARows == TileRows::kMN ? ATile::offset(16 * grid.wm + (lane & 15), bit4)
                                                    : ATile::offset(lo + 8 * bit4, 2 * grid.wm + bit3);
  const uint32_t b_offset = kBRows == TileRows::kMN ? BTile::offset(16 * grid.wn + lo + 8 * bit4, bit3)
                                                    : BTile::offset(lo + 8 * bit3, 2 * grid.wn + bit4);
#pragma unroll
  for (int kk = 0; kk < kKSteps; ++kk) {
    cuda::FragA a[Grid::kMTiles];
#pragma unroll
    for (int mt = 0; mt < Grid::kMTiles; ++mt) {
      if constexpr (kARows == TileRows::kMN)
        cuda::ldmatrix_x4(a[mt].x, a_smem + ATile::advance(a_offset, 16 * Grid::kWM * mt, 2 * kk));
      else
        cuda::ldmatrix_x4_trans(a[mt].x, a_smem + ATile::advance(a_offset, 16 * kk, 2 * Grid::kWM * mt));
    }
#pragma unroll
    for (int np = 0; np < kSlabs; ++np) {
      uint32_t b[4];
      if constexpr (kBRows == TileRows::kMN)
        cuda::ldmatrix_x4(b, b_smem + BTile::advance(b_offset, 16 * Grid::kWN * (slab0 + np), 2 * kk));
      else
        cuda::ldmatrix_x4_trans(b, b_smem + BTile::advance(b_offset, 16 * kk, 2 * Grid::kWN * (slab0 + np)));
#pragma unroll
      for (int mt = 0; mt < Grid::kMTiles; ++mt) {
        cuda::mma_m16n8k16<T>(c[mt][2 * np], a[mt], {b[0], b[1]});
        cuda::mma_m16n8k16<T>(c[mt][2 * np + 1], a[mt], {b[2], b[3]});
      }
    }
    after_k_step(kk);
  }
}

template <int kMTiles, int kNTiles>
__device__ __forceinline__ void zero_fragments(cuda::FragC (&c)[kMTiles][kNTiles]) {
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) c[mt][nt] = {0.0f, 0.0f, 0.0f, 0.0f};
}

// Where a lane's accumulator pair c[mt][nt].x[2 r], x[2 r + 1] lives in a swizzled [kRows, kCols]
// tile: the lane's first pair (fragment_base) advanced to (mt, nt, r). Chunk step
// 2 kWN (nt / 2) + nt % 2 from the first chunk 2 wn: bits disjoint.
template <class Grid, class Tile>
__device__ __forceinline__ uint32_t fragment_base(const Grid& grid, int lane) {
  return Tile::offset(grid.row0(0) + (lane >> 2), grid.col0(0) / 8) + 4 * (lane & 3);
}
template <class Grid, class Tile>
__device__ __forceinline__ uint32_t fragment_at(uint32_t base, int mt, int nt, int r) {
  return Tile::advance(base, 16 * Grid::kWM * mt + 8 * r, 2 * Grid::kWN * (nt / 2) + nt % 2);
}

// A warp's accumulators rounded to T into a swizzled [kRows, kCols] tile at the grid's positions.
// Eight rows (g) at one chunk fall in eight bank groups, the four lanes t of a row in one: no bank
// conflicts. kMatrix, on sm_90: one stmatrix per m16 tile and 16-column slab instead (matrices:
// rows 0-7 | 8-15 of the slab's first n8 tile, then of its second; lane L addresses row
// L % 8 + 8 (L / 8 % 2) at chunk L / 16 of the slab), a quarter of the store instructions and
// the same banks; 32-bit stores elsewhere.
template <class T, class Grid, class Tile, bool kMatrix>
__device__ __forceinline__ void store_fragments(char* tile, const cuda::FragC (&c)[Grid::kMTiles][Grid::kNTiles],
                                                const Grid& grid, int lane) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (kMatrix) {
    const uint32_t tile_smem = cuda::smem_address(tile);
    const uint32_t lane_offset = Tile::offset(grid.row0(0) + lane % 8 + 8 * (lane / 8 % 2), 2 * grid.wn + lane / 16);
#pragma unroll
    for (int mt = 0; mt < Grid::kMTiles; ++mt)
#pragma unroll
      for (int np = 0; np < Grid::kNTiles / 2; ++np) {
        const float* lo = c[mt][2 * np].x;
        const float* hi = c[mt][2 * np + 1].x;
        const uint32_t r[4] = {cuda::MmaType<T>::pack(lo[0], lo[1]), cuda::MmaType<T>::pack(lo[2], lo[3]),
                               cuda::MmaType<T>::pack(hi[0], hi[1]), cuda::MmaType<T>::pack(hi[2], hi[3])};
        cuda::stmatrix_x4(tile_smem + Tile::advance(lane_offset, 16 * Grid::kWM * mt, 2 * Grid::kWN * np), r);
      }
    return;
  }
#endif
  const uint32_t base = fragment_base<Grid, Tile>(grid, lane);
#pragma unroll
  for (int mt = 0; mt < Grid::kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < Grid::kNTiles; ++nt)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<uint32_t*>(tile + fragment_at<Grid, Tile>(base, mt, nt, r)) =
            cuda::MmaType<T>::pack(c[mt][nt].x[2 * r], c[mt][nt].x[2 * r + 1]);
}

}  // namespace flashattn::detail::sm80
