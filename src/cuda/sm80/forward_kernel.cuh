// FlashAttention-2 forward for sm_80 and later, on mma.sync. One thread block owns Br query rows
// of one (batch, head) and walks the K/V tiles its rows can see, last to first, so that the tiles
// that need the per-element mask (the causal diagonal, the sequence end) come first; the warps
// split the rows, so each keeps its own softmax statistics and P stays in registers.
//
// Pipeline, Q resident, one barrier before each GEMM:
//   1 stage:   wait K(n) | issue V(n)   | S = Q K(n)^T, mask, softmax | wait V(n) | issue K(n-1) | o += P V(n)
//   2 stages:  wait K(n) | issue K(n-1) | S = Q K(n)^T, mask, softmax | wait V(n) | issue V(n-1) | o += P V(n)
// With one stage each load hides behind one GEMM; with two, behind a whole iteration. A second
// resident block per multiprocessor covers what remains.
//
// Warp pairs (policy column_warps = 2, head dims whose 32-row o does not fit one warp's registers):
// warps 2 g and 2 g + 1 share rows 32 g ..; warp c of the pair computes S for keys c Bc/2 .. of each
// tile and o for V columns c dv/2 ... Per tile the pair meets twice in shared memory: each writes its
// rows' maxima over its keys and, after a barrier of the two warps, takes the larger; then each
// writes its half of P, which the block barrier before P·V publishes, and reads the other's half
// as A fragments. Each keeps l over its own keys; the two are added at the end. Per tensor-core
// operation this reads K and V from shared memory half as often as 16-row warps do.
//
// kScoreMods: the variant with softcap, ALiBi, bias and mask (score_mods.cuh), launched only when
// one is on, so that the plain path carries none of it. In that variant the barrier before K(n)
// is issued is a __syncthreads_or over the mask bytes of tile n (the first tile's gets a barrier
// of its own): a tile that the mask hides entirely is neither loaded (its commit groups stay
// empty, so the group count holds), multiplied nor fed to the softmax. A block that skips every
// tile ends with O = 0 and lse = -inf.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/primitives/cp_async.cuh"
#include "cuda/primitives/ldmatrix.cuh"
#include "cuda/primitives/named_barrier.cuh"
#include "cuda/primitives/smem_tile.cuh"
#include "cuda/sm80/epilogue.cuh"
#include "cuda/sm80/kernel_params.hpp"
#include "cuda/sm80/mask.cuh"
#include "cuda/sm80/policy.hpp"
#include "cuda/sm80/score_mods.cuh"
#include "cuda/sm80/softmax.cuh"
#include "cuda/sm80/tile_load.cuh"
#include "cuda/sm80/warp_gemm.cuh"

namespace flashattn::detail::sm80 {

// Where this block's sequence lives: its lengths and the first row of q/o and k/v.
struct SequenceView {
  int sq, sk;
  int q_row0, k_row0;  // varlen: rows into the packed tensors; else 0 (batch strides apply)
};

__device__ __forceinline__ SequenceView sequence_view(const ForwardKernelParams& p, int b) {
  if (p.maybe_cu_seqlens_q != nullptr) {
    const int q0 = p.maybe_cu_seqlens_q[b], k0 = p.maybe_cu_seqlens_k[b];
    return {p.maybe_cu_seqlens_q[b + 1] - q0, p.maybe_cu_seqlens_k[b + 1] - k0, q0, k0};
  }
  return {p.seqlen_q, p.seqlen_k, 0, 0};
}

// Warp pairs: each warp of the pair (half 0 or 1) writes one value per row of its rows (lanes of a
// quad hold the same) into rows[half][..], waits for the other warp, and combines the other's into
// its own. Barrier 1 + row_group, of the pair's 64 threads.
template <int kMTiles, int kBlockM, class Combine>
__device__ __forceinline__ void exchange_rows(float (&value)[kMTiles][2], char* rows_smem, int rows0, int half,
                                              int row_group, int lane, Combine combine) {
  float* rows = reinterpret_cast<float*>(rows_smem);
  const int g = lane >> 2;
  if ((lane & 3) == 0) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int r = 0; r < 2; ++r) rows[half * kBlockM + rows0 + mt * 16 + g + 8 * r] = value[mt][r];
  }
  cuda::named_barrier_sync(1 + row_group, 64);
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r)
      value[mt][r] = combine(value[mt][r], rows[(1 - half) * kBlockM + rows0 + mt * 16 + g + 8 * r]);
}

// Warp pairs: the warp's P (A fragments of its keys keys0 ..) into the P tile. A fragment's
// registers are (row g, keys 2t..) (row g + 8, keys 2t..) of its left n8 tile, then of its right:
// eight rows at one chunk, four lanes per row, no bank conflicts.
template <class T, int kMTiles, int kKSteps, class PTile>
__device__ __forceinline__ void store_p_half(char* p_tile, const cuda::FragA (&p)[kMTiles][kKSteps], int rows0,
                                             int keys0, int lane) {
  // keys0 / 8 and the chunk steps 0 .. 2 kKSteps - 1 share no bit (keys0 a multiple of 16 kKSteps).
  const uint32_t base = PTile::offset(rows0 + (lane >> 2), keys0 / 8) + 4 * (lane & 3);
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        *reinterpret_cast<uint32_t*>(p_tile + PTile::advance(base, 16 * mt + 8 * (i & 1), 2 * kk + (i >> 1))) =
            p[mt][kk].x[i];
}

template <int kHeadDim, int kHeadDimV, class T, bool kScoreMods>
__global__ void __launch_bounds__(ForwardPolicy<kHeadDim, kHeadDimV, kScoreMods>::kTiles.threads(),
                                  ForwardPolicy<kHeadDim, kHeadDimV, kScoreMods>::kTiles.min_blocks)
    forward_kernel(const ForwardKernelParams p) {
  constexpr ForwardTiles kTiles = ForwardPolicy<kHeadDim, kHeadDimV, kScoreMods>::kTiles;
  constexpr int kBlockM = kTiles.block_m, kBlockN = kTiles.block_n, kThreads = kTiles.threads();
  constexpr int kPairs = kTiles.column_warps;       // warps per row group: 1, or 2 (a pair)
  constexpr int kMTiles = kTiles.warp_rows() / 16;  // m16 tiles per warp
  constexpr int kNTiles = kBlockN / kPairs / 8;     // n8 tiles of S per K tile, of the warp's keys
  constexpr int kDTiles = kHeadDimV / kPairs / 8;   // n8 tiles of o, of the warp's columns
  constexpr int kStages = kTiles.stages;
  using QTile = cuda::SwizzledTile<kBlockM, kHeadDim>;
  using OTile = cuda::SwizzledTile<kBlockM, kHeadDimV>;  // the epilogue's, over the Q tile
  using KTile = cuda::SwizzledTile<kBlockN, kHeadDim>;
  using VTile = cuda::SwizzledTile<kBlockN, kHeadDimV>;
  using PTile = cuda::SwizzledTile<kBlockM, kBlockN>;  // pairs: the P halves
  using QLoad = TileLoad<T, kBlockM, kHeadDim, kThreads>;
  using KLoad = TileLoad<T, kBlockN, kHeadDim, kThreads>;
  using VLoad = TileLoad<T, kBlockN, kHeadDimV, kThreads>;
  static_assert(QTile::kBytes <= kTiles.q_region_bytes() && OTile::kBytes <= kTiles.q_region_bytes());

  extern __shared__ __align__(128) char smem[];
  const uint32_t q_addr = cuda::smem_address(smem);
  const uint32_t k_addr0 = q_addr + kTiles.q_region_bytes();  // kStages K tiles
  const uint32_t v_addr0 = k_addr0 + kStages * KTile::kBytes;  // kStages V tiles
  char* const exchange = smem + kTiles.smem_bytes() - kTiles.exchange_bytes();  // pairs: P tile, then rows
  // Tile n lives in buffer n % kStages.
  const auto k_buffer = [=](int n) { return k_addr0 + (kStages == 1 ? 0u : (n & 1) * KTile::kBytes); };
  const auto v_buffer = [=](int n) { return v_addr0 + (kStages == 1 ? 0u : (n & 1) * VTile::kBytes); };

  // Heaviest blocks (last rows: most keys under causal masking) launch first.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, h_kv = h / p.group;
  const SequenceView seq = sequence_view(p, b);
  const int i0 = m_block * kBlockM;
  if (i0 >= seq.sq) return;  // varlen: this sequence is shorter than the longest
  const int i1 = min(i0 + kBlockM, seq.sq);
  const Band band = make_band(p, seq.sq, seq.sk);
  const KeyRange keys = band.visible_keys(i0, i1);
  const int n_begin = keys.lo / kBlockN;
  const int n_end = (keys.hi + kBlockN - 1) / kBlockN;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row_group = warp / kPairs, half = warp % kPairs;  // half: which keys and V columns (pairs)
  const int warp_rows0 = row_group * kTiles.warp_rows();
  const int keys0 = half * (kBlockN / kPairs), chunks0 = half * (kHeadDimV / kPairs / 8);
  const int other_keys0 = (kPairs - 1 - half) * (kBlockN / kPairs);

  const bool varlen = p.maybe_cu_seqlens_q != nullptr;
  const T* q = static_cast<const T*>(p.q) + (varlen ? 0 : b * p.q_batch_stride) +
               (int64_t{seq.q_row0} + i0) * p.q_row_stride + h * p.q_head_stride;
  const T* k = static_cast<const T*>(p.k) + (varlen ? 0 : b * p.k_batch_stride) + seq.k_row0 * p.k_row_stride +
               h_kv * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + (varlen ? 0 : b * p.v_batch_stride) + seq.k_row0 * p.v_row_stride +
               h_kv * p.v_head_stride;

  [[maybe_unused]] const ScoreMods mods{b, h, band.diagonal, seq.sq, seq.sk};
  // The mods variant's scores are final logits; the plain one's are q·k, scaled in the softmax.
  const float softmax_scale = kScoreMods ? 1.0f : p.scale;
  const float softmax_scale_log2 = kScoreMods ? cuda::kLog2e : p.scale_log2;

  cuda::FragC o[kMTiles][kDTiles];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) o[mt][dt] = {0.0f, 0.0f, 0.0f, 0.0f};
  OnlineSoftmax<kMTiles> softmax;
  softmax.init();

  if (n_begin < n_end) {
    const auto kv_rows = [&](int n) { return min(kBlockN, seq.sk - n * kBlockN); };
    const auto issue_k = [&](int n) {
      KLoad::issue(k_buffer(n), k + int64_t{n} * kBlockN * p.k_row_stride, p.k_row_stride, kv_rows(n), p.head_dim,
                   tid);
    };
    const auto issue_v = [&](int n) {
      VLoad::issue(v_buffer(n), v + int64_t{n} * kBlockN * p.v_row_stride, p.v_row_stride, kv_rows(n),
                   p.head_dim_v, tid);
    };
    // A barrier that, in the mods variant, also answers "does the mask keep some key of tile n?"
    // (check = false: the answer is false; there is no such tile).
    const auto barrier_and_keeps = [&](bool check, int n) {
      if constexpr (kScoreMods) {
        return __syncthreads_or(check && mods.mask_keeps_any(p, i0, i1, n * kBlockN, min((n + 1) * kBlockN, seq.sk),
                                                             tid, kThreads)) != 0;
      } else {
        __syncthreads();
        return check;
      }
    };
    bool live = kScoreMods ? barrier_and_keeps(true, n_end - 1) : true;  // tile n is not wholly masked
    QLoad::issue(q_addr, q, p.q_row_stride, i1 - i0, p.head_dim, tid);
    if (live) issue_k(n_end - 1);
    cuda::cp_async_commit();
    if constexpr (kStages == 2) {
      if (live) issue_v(n_end - 1);
      cuda::cp_async_commit();
    }
    // Policies with room keep the warp's Q fragments in registers, loaded after the first barrier.
    [[maybe_unused]] cuda::FragA q_frag[kMTiles][kTiles.q_in_registers ? kHeadDim / 16 : 1];

    // Commit groups complete in order. Two stages: every step commits one group (empty at the
    // end), so "all but the newest group" is always the tile about to be read.
    for (int n = n_end - 1; n >= n_begin; --n) {
      const int j0 = n * kBlockN;
      cuda::cp_async_wait<kStages - 1>();
      // K(n) is in; every warp is done with the buffer the next issue overwrites.
      bool live_next = live;  // of tile n - 1
      if constexpr (kStages == 1) {
        __syncthreads();
        if (live) issue_v(n);
      } else {
        live_next = barrier_and_keeps(n > n_begin, n - 1);
        if (live_next) issue_k(n - 1);
      }
      cuda::cp_async_commit();

      if constexpr (kTiles.q_in_registers) {
        if (n == n_end - 1) load_a_fragments<kMTiles, kHeadDim / 16, QTile>(q_frag, q_addr, warp_rows0, lane);
      }
      cuda::FragA p_frag[kMTiles][kNTiles / 2];
      if (live) {
        cuda::FragC s[kMTiles][kNTiles];
        if constexpr (kTiles.q_in_registers) {
          gemm_qk<T, kMTiles, kNTiles, kHeadDim, KTile>(s, q_frag, k_buffer(n), lane);
        } else {
          // keys0 is a multiple of 8 (one swizzle period), so a byte offset moves the tile's rows.
          gemm_qk<T, kMTiles, kNTiles, kHeadDim, QTile, KTile>(s, q_addr, k_buffer(n) + KTile::offset(keys0, 0),
                                                               warp_rows0, lane);
        }
        if constexpr (kScoreMods) mods.apply(p, s, i0 + warp_rows0, j0, lane);
        // Tiles that every row sees whole skip the per-element mask.
        const KeyRange full = band.keys_seen_by_all(i0, i1);
        if (j0 < full.lo || j0 + kBlockN > full.hi) apply_band_mask(s, band, i0 + warp_rows0, j0 + keys0, lane);
        if constexpr (kPairs == 1) {
          softmax.update(s, o, softmax_scale_log2);
          pack_p<T>(p_frag, s);
        } else {
          float m_new[kMTiles][2];
          softmax.row_max(s, m_new);
          exchange_rows<kMTiles, kBlockM>(m_new, exchange + PTile::kBytes, warp_rows0, half, row_group, lane,
                                          [](float a, float b) { return fmaxf(a, b); });
          softmax.exponentiate(s, o, m_new, softmax_scale_log2);
          pack_p<T>(p_frag, s);
          store_p_half<T, kMTiles, kNTiles / 2, PTile>(exchange, p_frag, warp_rows0, keys0, lane);
        }
      }

      cuda::cp_async_wait<kStages - 1>();
      // V(n) is in; every warp is done with the buffer the next issue overwrites.
      if constexpr (kStages == 1) {
        live_next = barrier_and_keeps(n > n_begin, n - 1);
        if (live_next) issue_k(n - 1);
      } else {
        __syncthreads();
        if (live_next) issue_v(n - 1);
      }
      cuda::cp_async_commit();
      if constexpr (kPairs == 1) {
        if (live) gemm_pv<T, kMTiles, kNTiles / 2, kDTiles, VTile>(o, p_frag, v_buffer(n), lane);
      } else {
        // o(half's columns) += P(own keys) V(own keys) + P(other keys) V(other keys); the offsets
        // are whole swizzle periods (rows by 8, chunks by 8).
        gemm_pv<T, kMTiles, kNTiles / 2, kDTiles, VTile>(o, p_frag, v_buffer(n) + VTile::offset(keys0, chunks0), lane);
        load_a_fragments<kMTiles, kNTiles / 2, PTile>(p_frag, cuda::smem_address(exchange), warp_rows0, lane,
                                                      other_keys0 / 8);
        gemm_pv<T, kMTiles, kNTiles / 2, kDTiles, VTile>(o, p_frag, v_buffer(n) + VTile::offset(other_keys0, chunks0),
                                                         lane);
      }
      if constexpr (kScoreMods) live = live_next;  // the plain variant's stays a constant true
    }
    cuda::cp_async_wait<0>();  // only empty groups remain; the epilogue reuses the Q tile
  }

  float lse[kMTiles][2];
  if constexpr (kPairs == 1) {
    softmax.finalize(o, softmax_scale, lse);
  } else {
    // Each warp's l covers its keys: the pair adds them. The partner read this warp's last row
    // maxima before the loop's last block barrier, so the row buffer is free.
    float sum[kMTiles][2];
    softmax.row_sums(sum);
    exchange_rows<kMTiles, kBlockM>(sum, exchange + PTile::kBytes, warp_rows0, half, row_group, lane,
                                    [](float a, float b) { return a + b; });
    softmax.normalize(o, softmax_scale, sum, lse);
  }

  const int rows_valid = i1 - i0 - warp_rows0;
  T* out = static_cast<T*>(p.o) + (varlen ? 0 : b * p.o_batch_stride) +
           (int64_t{seq.q_row0} + i0 + warp_rows0) * p.o_row_stride + h * p.o_head_stride;
  store_output<T, kMTiles, kDTiles, OTile>(o, smem, warp_rows0, out, p.o_row_stride, rows_valid, p.head_dim_v, lane,
                                           chunks0);
  if (p.maybe_lse != nullptr && half == 0) {
    float* lse_rows = p.maybe_lse + (varlen ? 0 : b * p.lse_batch_stride) + h * p.lse_head_stride +
                      (int64_t{seq.q_row0} + i0 + warp_rows0);
    store_lse(lse, lse_rows, rows_valid, lane);
  }
}

}  // namespace flashattn::detail::sm80
