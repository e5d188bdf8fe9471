// flashattn_mufu_rate: what a softmax tile's exponentials cost one warp, by where their results are
// first read. One block per multiprocessor; E "softmax" warpgroups (one warp of each on every
// sub-partition, as a consumer's) each run a loop whose body is one 64 x 128 tile of the d = 128
// forward, per thread: 64 FFMA (x = s c + b), 64 ex2.approx (MUFU.EX2) and, by pattern,
//   interleaved  the packs (cvt to bf16x2, F2FP) written after the exponentials in one basic block,
//                which ptxas schedules as MUFU, MUFU, F2FP of those two, as in the kernel
//   apart        the packs of a tile at the top of the next iteration: 64 MUFU back to back end the
//                loop's body (what branch pack-apart's SASS shows at d = 128)
//   sums         the packs and a row sum in four partials, in one basic block: MUFU, FADD ... (the
//                kernel where P V does not add the row sums: d = 96, 192, 256)
//   sums-apart   both at the top of the next iteration (branch sums-apart at d = 256); ptxas mixes
//                the previous tile's adds and packs in among the new MUFUs, none reading a fresh one
// The packs are then XORed into four words, the exponentials feed the next iteration's FFMA (values
// stay in [2^-8, 1]), so nothing is dead and every iteration depends on the last. Optionally one more
// warpgroup issues m64n128k16 wgmmas back to back for as long as the softmax warpgroups run (the
// other consumer's GEMMs in the ping-pong), with A from registers (RS, as the kernel's S = Q K^T and
// P V) or from shared memory (SS: no reads of the register file for A). Prints cycles per tile per
// warp (median over every softmax warp, then over 5 runs) against the special-function unit's bound:
// 16 lanes a clock per multiprocessor, 8 cycles per warp instruction per sub-partition, 512 cycles for
// 64 per warp, times E where E warps share a sub-partition.
//
//   flashattn_mufu_rate [--tiles 4000]
//
// What it answers (docs/perf.md, 2026-12-04, session 27): whether a consumer's softmax, about 1-1.5 K
// cycles a phase on the timeline against 528 for its 66 MUFU, waits on the exponentials' latency
// (each pack right behind the MUFU it reads, in an in-order warp) or on the unit's rate.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/primitives/ldmatrix.cuh"  // smem_address
#include "cuda/primitives/math.cuh"      // fast_exp2
#include "cuda/primitives/mma.cuh"       // MmaType<T>::pack
#include "cuda/primitives/named_barrier.cuh"
#include "cuda/primitives/sm90/sw128_tile.cuh"
#include "cuda/primitives/sm90/warpgroup.cuh"
#include "cuda/primitives/sm90/wgmma.cuh"
#include "tool_common.cuh"  // CHECK, sm90_device

namespace {

namespace hw = flashattn::cuda::sm90;
using T = __nv_bfloat16;
constexpr int kS = 64;  // values per thread: a 64 x 128 fp32 tile over a warpgroup

enum class Pattern { kInterleaved, kApart, kSums, kSumsApart };
constexpr const char* kPatternNames[] = {"interleaved", "apart", "sums", "sums-apart"};

// The wgmma warpgroup beside the softmax: none, A from registers, or A from shared memory.
enum class Gemm { kNone, kRs, kSs };

// Threads of a block: kSoftmax softmax warpgroups, and one wgmma warpgroup unless kGemm is kNone.
constexpr int block_threads(int softmax, Gemm gemm) { return (softmax + (gemm != Gemm::kNone)) * 128; }

using BTile = hw::Sw128Tile<128, 128>;  // the wgmma warpgroup's B (a K tile)
using ATile = hw::Sw128Tile<64, 128>;   // its A under kSs (a Q tile), after B
constexpr int kGemmBarrier = 1;          // the wgmma warpgroup's named barrier

// The reads of a tile's exponentials: its packs folded into four words, and (kSums) its row sums.
template <bool kSums>
__device__ __forceinline__ void consume(const float (&s)[kS], uint32_t (&fold)[4], float (&sum)[4]) {
  if constexpr (kSums) {
#pragma unroll
    for (int i = 0; i < kS; ++i) sum[i % 4] += s[i];
  }
#pragma unroll
  for (int k = 0; k < kS / 2; ++k) fold[k % 4] ^= flashattn::cuda::MmaType<T>::pack(s[2 * k], s[2 * k + 1]);
}

// One tile's softmax work on s (kS values). The apart patterns read the previous tile's
// exponentials at the top of the loop's body, so that the exponentials end it with no reader in
// their basic block (a branch after them would not do: ptxas schedules it first and sinks the
// exponentials below it).
template <Pattern kPattern>
__device__ __forceinline__ void tile(float (&s)[kS], uint32_t (&fold)[4], float (&sum)[4]) {
  constexpr bool kSums = kPattern == Pattern::kSums || kPattern == Pattern::kSumsApart;
  constexpr bool kApart = kPattern == Pattern::kApart || kPattern == Pattern::kSumsApart;
  if constexpr (kApart) consume<kSums>(s, fold, sum);
#pragma unroll
  for (int i = 0; i < kS; ++i) s[i] = flashattn::cuda::fast_exp2(fmaf(s[i], -8.0f, 0.0f));
  if constexpr (!kApart) consume<kSums>(s, fold, sum);
}

// Warpgroups 0 .. kSoftmax - 1 run `tiles` tiles of `kPattern` each; warpgroup kSoftmax (unless
// kGemm is kNone) issues groups of 8 wgmmas until they are all done. Lane 0 of each softmax warp writes its
// cycles to cycles[block * 4 kSoftmax + warp].
template <Pattern kPattern, int kSoftmax, Gemm kGemm>
__global__ void __launch_bounds__(block_threads(kSoftmax, kGemm), 1)
    mufu_kernel(uint32_t* sink, int tiles, long long* cycles) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ int running;  // softmax warps still in their loop
  const int wg = threadIdx.x / 128;
  if (threadIdx.x == 0) running = 4 * kSoftmax;
  if constexpr (kGemm != Gemm::kNone) {
    const uint32_t raw = flashattn::cuda::smem_address(smem_raw);
    const uint32_t base = (raw + 1023) / 1024 * 1024;
    uint32_t* words = reinterpret_cast<uint32_t*>(smem_raw + (base - raw));
    for (int i = threadIdx.x; i < (BTile::kBytes + ATile::kBytes) / 4; i += blockDim.x)
      words[i] = flashattn::cuda::MmaType<T>::pack(static_cast<float>(i % 7) / 8.0f, static_cast<float>(i % 5) / 8.0f);
    hw::fence_proxy_async_shared();  // generic stores -> wgmma's reads
  }
  __syncthreads();

  if (kGemm != Gemm::kNone && wg == kSoftmax) {
    const uint32_t raw = flashattn::cuda::smem_address(smem_raw);
    const uint32_t b_tile = (raw + 1023) / 1024 * 1024, a_tile = b_tile + BTile::kBytes;
    uint32_t a[8][4];
#pragma unroll
    for (int k = 0; k < 8; ++k)
#pragma unroll
      for (int r = 0; r < 4; ++r) a[k][r] = flashattn::cuda::MmaType<T>::pack(0.25f * r, 0.125f * k);
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.0f;
    // Every thread of the warpgroup takes the same decision (wgmma issues warpgroup-wide).
    while (flashattn::cuda::named_barrier_any(kGemmBarrier, 128, *static_cast<volatile int*>(&running) > 0)) {
      hw::wgmma_fence();
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        if constexpr (kGemm == Gemm::kRs) {
          hw::wgmma_rs<T>(d, a[k], hw::k_major_descriptor<BTile>(b_tile, k), true);
        } else {
          hw::wgmma_ss<T>(d, hw::k_major_descriptor<ATile>(a_tile, k), hw::k_major_descriptor<BTile>(b_tile, k), true);
        }
      }
      hw::wgmma_commit();
      hw::wgmma_wait<1>();
    }
    hw::wgmma_wait<0>();
    hw::wgmma_fence_operand(d);
    float total = 0.0f;
#pragma unroll
    for (int i = 0; i < 64; ++i) total += d[i];
    if (total == 12345.678f) sink[threadIdx.x] = 1u;  // keeps the accumulators live, never taken in practice
    return;
  }

  float s[kS];
#pragma unroll
  for (int i = 0; i < kS; ++i) s[i] = 0.5f + 0.001f * static_cast<float>((threadIdx.x + i) % 97);
  uint32_t fold[4] = {};
  float sum[4] = {};
#pragma unroll
  for (int i = 0; i < kS; ++i) asm volatile("" : "+f"(s[i]));  // the start values set before the clock is read
  __syncwarp();
  const long long c0 = clock64();
#pragma unroll 1
  for (int t = 0; t < tiles; ++t) tile<kPattern>(s, fold, sum);
  const long long c1 = clock64();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    cycles[blockIdx.x * 4 * kSoftmax + warp] = c1 - c0;
    atomicSub(&running, 1);
  }
  const uint32_t out = fold[0] ^ fold[1] ^ fold[2] ^ fold[3] ^ __float_as_uint(sum[0] + sum[1] + sum[2] + sum[3]);
  if (out == 0x12345678u) sink[threadIdx.x] = out;  // keeps the work live, never taken in practice
}

// Median cycles per tile per warp over the multiprocessors' softmax warps.
template <Pattern kPattern, int kSoftmax, Gemm kGemm>
double measure(int sms, int tiles) {
  // One block per multiprocessor (__launch_bounds__ sets no maximum): more shared memory than half of
  // a multiprocessor's 228 KB, whatever the block uses of it.
  constexpr int kOneBlockSmem = 120 * 1024;
  const int smem = std::max(kGemm != Gemm::kNone ? BTile::kBytes + ATile::kBytes + 1024 : 0, kOneBlockSmem);
  constexpr int kThreads = block_threads(kSoftmax, kGemm);
  auto kernel = mufu_kernel<kPattern, kSoftmax, kGemm>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  uint32_t* sink;
  long long* cycles;
  const int warps = sms * 4 * kSoftmax;
  CHECK(cudaMalloc(&sink, 4096 * sizeof(uint32_t)));
  CHECK(cudaMalloc(&cycles, warps * sizeof(long long)));
  kernel<<<sms, kThreads, smem>>>(sink, tiles / 10, cycles);  // warm-up
  CHECK(cudaDeviceSynchronize());
  std::vector<double> medians;
  for (int run = 0; run < 5; ++run) {
    kernel<<<sms, kThreads, smem>>>(sink, tiles, cycles);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaGetLastError());
    std::vector<long long> host(warps);
    CHECK(cudaMemcpy(host.data(), cycles, warps * sizeof(long long), cudaMemcpyDeviceToHost));
    std::sort(host.begin(), host.end());
    medians.push_back(static_cast<double>(host[warps / 2]) / tiles);
  }
  std::sort(medians.begin(), medians.end());
  CHECK(cudaFree(sink));
  CHECK(cudaFree(cycles));
  return medians[medians.size() / 2];
}

template <Pattern kPattern>
void row(int sms, int tiles) {
  const double one = measure<kPattern, 1, Gemm::kNone>(sms, tiles);
  const double rs = measure<kPattern, 1, Gemm::kRs>(sms, tiles);
  const double ss = measure<kPattern, 1, Gemm::kSs>(sms, tiles);
  const double two = measure<kPattern, 2, Gemm::kNone>(sms, tiles);
  constexpr double kBound = 8.0 * kS;  // 64 MUFU at 8 cycles each, one warp per sub-partition
  std::printf("  %-12s %8.0f %6.2f   %8.0f %6.2f   %8.0f %6.2f   %8.0f %6.2f\n",
              kPatternNames[static_cast<int>(kPattern)], one, one / kBound, rs, rs / kBound, ss, ss / kBound, two,
              two / (2 * kBound));
}

}  // namespace

int main(int argc, char** argv) {
  int tiles = 4000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--tiles") == 0 && i + 1 < argc) {
      tiles = std::max(10, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--tiles N]\n", argv[0]);
      return 2;
    }
  }
  const cudaDeviceProp prop = sm90_device("flashattn_mufu_rate");
  const int sms = prop.multiProcessorCount;
  std::printf("softmax tile (64 FFMA, 64 MUFU.EX2, 32 packs per thread) on %s (%d SMs), %d tiles per warp\n",
              prop.name, sms, tiles);
  std::printf("cycles per tile per warp, and that over the MUFU bound (512 per warp sharing a sub-partition)\n");
  std::printf("  pattern       1 softmax WG      + 1 RS wgmma WG   + 1 SS wgmma WG   2 softmax WGs\n");
  row<Pattern::kInterleaved>(sms, tiles);
  row<Pattern::kApart>(sms, tiles);
  row<Pattern::kSums>(sms, tiles);
  row<Pattern::kSumsApart>(sms, tiles);
  return 0;
}
