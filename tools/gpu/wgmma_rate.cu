// flashattn_wgmma_rate: the tensor cores' rate, on this GPU, for the wgmma shapes the Hopper forward
// issues (m64nNk16, bf16, fp32 accumulators), A from shared memory (SS, as S = Q Kᵀ) or from
// registers (RS, as O = P V), B K-major from shared memory. One block per multiprocessor, W
// warpgroups per block each issuing groups of K / 16 = 8 wgmmas back to back (wgmma_wait<1>: one
// group in flight behind the one being issued), on pseudo-random operands (zeros would draw less
// power and clock higher than attention does). Prints TFLOP/s, the multiprocessor clock over the
// run (clock64 against %globaltimer on block 0) and the share of the dense peak at that clock,
// 4096 FLOP per clock per multiprocessor (the H100/H200 989.4 TFLOP/s at 1830 MHz over 132 SMs).
//
//   flashattn_wgmma_rate [--ms 40]      every shape, W = 1 and 2; a run of about --ms each
//
// What it answers (docs/perf.md): whether A from shared memory costs rate against A from registers
// at the N of our tiles, and what rate the tensor cores sustain at the clock that power allows.
// Rows "nN+8" issue an m64n8k16 after each m64nNk16 of the group, on the same A and a B tile of its
// own (P V's ones columns as an instruction of their own, beside N + 8 in one: policy.hpp's
// row_sums_by_pv); their FLOPs count N + 8 columns.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/primitives/ldmatrix.cuh"  // smem_address
#include "cuda/primitives/sm90/sw128_tile.cuh"
#include "cuda/primitives/sm90/warpgroup.cuh"
#include "cuda/primitives/sm90/wgmma.cuh"
#include "tool_common.cuh"  // CHECK, sm90_device

namespace {

namespace hw = flashattn::cuda::sm90;
using T = __nv_bfloat16;
constexpr int kK = 128;  // the head dim of Q Kᵀ at d = 128: 8 wgmmas a group

__device__ __forceinline__ uint32_t hash(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  return x ^ (x >> 16);
}
// Two bf16 values in [-1, 1), from a counter.
__device__ __forceinline__ uint32_t random_pair(uint32_t i) {
  const uint32_t h = hash(i);
  const float a = static_cast<float>(h & 0xffffu) / 32768.0f - 1.0f, b = static_cast<float>(h >> 16) / 32768.0f - 1.0f;
  return flashattn::cuda::MmaType<T>::pack(a, b);
}

// kExtra: 0, or 8 (an m64n8k16 after each m64nNk16, its B tile after the first).
template <int kN, int kExtra>
struct Layout {
  using ATile = hw::Sw128Tile<64, kK>;  // one per warpgroup (a Q slice)
  using BTile = hw::Sw128Tile<kN, kK>;  // shared (a K tile)
  using ETile = hw::Sw128Tile<kExtra == 0 ? 8 : kExtra, kK>;
  static constexpr int kBBytes = BTile::kBytes + (kExtra > 0 ? ETile::kBytes : 0);
  static constexpr int bytes(int warpgroups) { return warpgroups * ATile::kBytes + kBBytes + 1024; }
};

template <int kN, bool kRs, int kWarpgroups, int kExtra>
__global__ void __launch_bounds__(kWarpgroups * 128, 1) rate_kernel(float* sink, int groups, long long* clocks) {
  using L = Layout<kN, kExtra>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = flashattn::cuda::smem_address(smem_raw);
  const uint32_t base = (raw + 1023) / 1024 * 1024;
  uint32_t* words = reinterpret_cast<uint32_t*>(smem_raw + (base - raw));
  const int n_words = (kWarpgroups * L::ATile::kBytes + L::kBBytes) / 4;
  for (int i = threadIdx.x; i < n_words; i += blockDim.x) words[i] = random_pair(i + 7919u * blockIdx.x);
  __syncthreads();
  hw::fence_proxy_async_shared();  // generic stores -> wgmma's reads
  __syncthreads();

  const int wg = threadIdx.x / 128;
  const uint32_t a_tile = base + wg * L::ATile::kBytes, b_tile = base + kWarpgroups * L::ATile::kBytes;
  const uint32_t e_tile = b_tile + L::BTile::kBytes;
  uint32_t a[kK / 16][4];
#pragma unroll
  for (int s = 0; s < kK / 16; ++s)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[s][r] = random_pair(threadIdx.x * 64 + s * 4 + r);
  float d[kN / 2], e[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) d[i] = 0.0f;

  long long t0 = 0, c0 = 0;
  if (threadIdx.x == 0) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    c0 = clock64();
  }
  for (int g = 0; g < groups; ++g) {
    hw::wgmma_fence();
#pragma unroll
    for (int s = 0; s < kK / 16; ++s) {
      const uint64_t b = hw::k_major_descriptor<typename L::BTile>(b_tile, s);
      const uint64_t a_desc = hw::k_major_descriptor<typename L::ATile>(a_tile, s);  // SS only
      if constexpr (kRs)
        hw::wgmma_rs<T>(d, a[s], b, true);
      else
        hw::wgmma_ss<T>(d, a_desc, b, true);
      if constexpr (kExtra > 0) {
        const uint64_t eb = hw::k_major_descriptor<typename L::ETile>(e_tile, s);
        if constexpr (kRs)
          hw::wgmma_rs<T>(e, a[s], eb, true);
        else
          hw::wgmma_ss<T>(e, a_desc, eb, true);
      }
    }
    hw::wgmma_commit();
    hw::wgmma_wait<1>();
  }
  hw::wgmma_wait<0>();
  hw::wgmma_fence_operand(d);
  if constexpr (kExtra > 0) hw::wgmma_fence_operand(e);
  if (threadIdx.x == 0 && blockIdx.x == 0) {
    long long t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    clocks[0] = clock64() - c0;
    clocks[1] = t1 - t0;
  }
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) sum += d[i];
  if constexpr (kExtra > 0) sum += e[0] + e[1] + e[2] + e[3];
  if (sum == 12345.678f) sink[threadIdx.x] = sum;  // keeps the accumulators live, never taken in practice
}

struct Result {
  double tflops, mhz;
};

template <int kN, bool kRs, int kWarpgroups, int kExtra>
Result measure(int sms, double target_ms) {
  constexpr int smem = Layout<kN, kExtra>::bytes(kWarpgroups);
  auto kernel = rate_kernel<kN, kRs, kWarpgroups, kExtra>;
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  float* sink;
  long long* clocks;
  CHECK(cudaMalloc(&sink, 4096));
  CHECK(cudaMalloc(&clocks, 2 * sizeof(long long)));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  const double flop_per_group = 2.0 * 64 * (kN + kExtra) * kK * kWarpgroups * sms;
  const auto run = [&](int groups) {
    CHECK(cudaEventRecord(e0));
    kernel<<<sms, kWarpgroups * 128, smem>>>(sink, groups, clocks);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    CHECK(cudaGetLastError());
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    return static_cast<double>(ms);
  };
  // Calibrate the length (about target_ms a run), warm up, then the median of 9 runs.
  int groups = 2000;
  const double ms0 = run(groups);
  groups = std::max(2000, static_cast<int>(groups * target_ms / std::max(ms0, 1e-3)));
  run(groups);
  std::vector<std::pair<double, double>> samples;  // (ms, MHz)
  for (int i = 0; i < 9; ++i) {
    const double ms = run(groups);
    long long host[2];
    CHECK(cudaMemcpy(host, clocks, sizeof host, cudaMemcpyDeviceToHost));
    samples.emplace_back(ms, host[1] > 0 ? 1e3 * static_cast<double>(host[0]) / static_cast<double>(host[1]) : 0.0);
  }
  std::sort(samples.begin(), samples.end());
  const auto [ms, mhz] = samples[samples.size() / 2];
  CHECK(cudaFree(sink));
  CHECK(cudaFree(clocks));
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  return {flop_per_group * groups / (ms * 1e-3) / 1e12, mhz};
}

template <int kN, int kWarpgroups, int kExtra = 0>
void row(int sms, double target_ms) {
  for (const bool rs : {false, true}) {
    const Result r = rs ? measure<kN, true, kWarpgroups, kExtra>(sms, target_ms)
                        : measure<kN, false, kWarpgroups, kExtra>(sms, target_ms);
    const double peak_at_clock = 4096.0 * sms * r.mhz * 1e6 / 1e12;
    char shape[16];
    if (kExtra > 0)
      std::snprintf(shape, sizeof shape, "n%d+%d", kN, kExtra);
    else
      std::snprintf(shape, sizeof shape, "n%d", kN);
    std::printf("  m64%-7sk16  %s  %d     %7.1f   %6.0f    %5.1f%%\n", shape, rs ? "RS" : "SS", kWarpgroups, r.tflops,
                r.mhz, 100.0 * r.tflops / peak_at_clock);
  }
}

}  // namespace

int main(int argc, char** argv) {
  double target_ms = 40.0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--ms") == 0 && i + 1 < argc) {
      target_ms = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: %s [--ms MILLISECONDS]\n", argv[0]);
      return 2;
    }
  }
  const cudaDeviceProp prop = sm90_device("flashattn_wgmma_rate");
  const int sms = prop.multiProcessorCount;
  std::printf("wgmma rate on %s (%d SMs), bf16 -> fp32, K = %d per group, one block per SM\n", prop.name, sms, kK);
  std::printf("  shape           A   WGs  TFLOP/s   MHz   of peak at that clock\n");
  row<8, 2>(sms, target_ms);
  row<64, 1>(sms, target_ms);
  row<64, 2>(sms, target_ms);
  row<80, 2>(sms, target_ms);
  row<128, 1>(sms, target_ms);
  row<128, 2>(sms, target_ms);
  row<136, 2>(sms, target_ms);
  row<128, 2, 8>(sms, target_ms);
  row<176, 2>(sms, target_ms);
  row<256, 1>(sms, target_ms);
  row<256, 2>(sms, target_ms);
  return 0;
}
