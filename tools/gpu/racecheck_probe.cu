// flashattn_racecheck_probe: the shared tail's merge pattern (src/cuda/sm90/shared_tail.cuh) alone,
// so that compute-sanitizer racecheck can be asked about it without the forward kernel around it.
// A block of four warpgroups: warpgroup 0 stands for the producer (it takes no part in the meets and
// stays resident a while), warpgroups 1..3 for consumers 0..2. Per item every consumer thread holds
// 68 floats (kO = 64 of o, then m and l of two rows, as at d = 128); consumer 2 stores them, consumer
// 1 merges them into its own and stores the result in the same places, consumer 0 merges that, each
// step behind a meet of the three consumers; value x of thread t at float x 128 + t, as in the kernel.
// The meets, by mode:
//   one     one named barrier (id 7) over the 384 consumer threads, met three times (the kernel's)
//   three   three named barriers (ids 7, 8, 9), one per meet
//   pairs   id 7 over all three, then 8 over consumers 2 and 1, then 9 over 1 and 0 (bar.sync both)
//   all     __syncthreads, the producer warpgroup taking part
//   ring    as one, after a ring of turns per item (the kernel's ping-pong: consumer c waits on
//           barrier 4 + c and hands the turn on with bar.arrive on 4 + (c + 1) % 3, 256 threads
//           each), so that arrivals on other barriers are pending at the meets
// The merged values are checked on the host against the same float operations (exact), so a real
// race would show as a mismatch, and racecheck's report on each mode tells how it treats the pattern:
//   compute-sanitizer --tool racecheck build/.../flashattn_racecheck_probe one
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/primitives/named_barrier.cuh"

namespace {

constexpr int kValues = 68, kThreads = 128, kItems = 6, kBlocks = 4;

enum Mode { kOne, kThree, kPairs, kAll, kRing };

__host__ __device__ float initial(int block, int item, int c, int x, int t) {
  return static_cast<float>((block * 131 + item * 17 + c * 5 + x * 3 + t) % 97) * 0.125f - 4.0f;
}
__host__ __device__ float merged(float mine, float other) {  // no fma: the same bits on both sides
#if defined(__CUDA_ARCH__)
  return __fadd_rn(__fmul_rn(mine, 0.5f), __fmul_rn(other, 0.25f));
#else
  return mine * 0.5f + other * 0.25f;
#endif
}

template <Mode kMode>
__device__ __forceinline__ void meet(int step, int c) {
  if constexpr (kMode == kOne || kMode == kRing) {
    flashattn::cuda::named_barrier_sync(7, 3 * kThreads);
  } else if constexpr (kMode == kThree) {
    flashattn::cuda::named_barrier_sync(7 + step, 3 * kThreads);
  } else if constexpr (kMode == kPairs) {
    if (step == 0) flashattn::cuda::named_barrier_sync(7, 3 * kThreads);
    if (step == 1 && c >= 1) flashattn::cuda::named_barrier_sync(8, 2 * kThreads);
    if (step == 2 && c <= 1) flashattn::cuda::named_barrier_sync(9, 2 * kThreads);
  } else {
    __syncthreads();
  }
}

template <Mode kMode>
__global__ void __launch_bounds__(4 * kThreads) merge_probe(float* out) {
  __shared__ float smem[kValues * kThreads];
  const int wg = threadIdx.x / kThreads, t = threadIdx.x % kThreads;
  if (wg == 0) {  // the producer: resident for a while, in no meet (but __syncthreads' in mode all)
    if constexpr (kMode == kAll) {
      for (int item = 0; item < kItems; ++item)
        for (int step = 0; step < 3; ++step) __syncthreads();
    } else {
      for (int i = 0; i < 200; ++i) __nanosleep(1000);
    }
    return;
  }
  const int c = wg - 1;
  float* state = smem + t;
  for (int item = 0; item < kItems; ++item) {
    float o[kValues];
#pragma unroll
    for (int x = 0; x < kValues; ++x) o[x] = initial(blockIdx.x, item, c, x, t);
    if constexpr (kMode == kRing) {
      if (c > 0 || item > 0) flashattn::cuda::named_barrier_sync(4 + c, 2 * kThreads);
      flashattn::cuda::named_barrier_arrive(4 + (c + 1) % 3, 2 * kThreads);
    }
    meet<kMode>(0, c);
    if (c == 2) {
#pragma unroll
      for (int x = 0; x < kValues; ++x) state[x * kThreads] = o[x];
    }
    meet<kMode>(1, c);
    if (c == 1) {
#pragma unroll
      for (int x = 0; x < kValues; ++x) o[x] = merged(o[x], state[x * kThreads]);
#pragma unroll
      for (int x = 0; x < kValues; ++x) state[x * kThreads] = o[x];
    }
    meet<kMode>(2, c);
    if (c == 0) {
#pragma unroll
      for (int x = 0; x < kValues; ++x)
        out[((blockIdx.x * kItems + item) * kValues + x) * kThreads + t] = merged(o[x], state[x * kThreads]);
    }
  }
  if (kMode == kRing && c == 0) flashattn::cuda::named_barrier_sync(4, 2 * kThreads);  // consumer 2's last hand-over
}

}  // namespace

int main(int argc, char** argv) {
  const char* names[] = {"one", "three", "pairs", "all", "ring"};
  int mode = -1;
  for (int m = 0; m < 5 && argc > 1; ++m)
    if (std::strcmp(argv[1], names[m]) == 0) mode = m;
  if (mode < 0) {
    std::fprintf(stderr, "usage: %s one|three|pairs|all|ring\n", argv[0]);
    return 2;
  }
  const size_t n = size_t{kBlocks} * kItems * kValues * kThreads;
  float* out = nullptr;
  if (cudaMalloc(&out, n * sizeof(float)) != cudaSuccess) return 1;
  cudaMemset(out, 0xff, n * sizeof(float));  // NaN: an unwritten value fails
  void (*kernels[])(float*) = {merge_probe<kOne>, merge_probe<kThree>, merge_probe<kPairs>, merge_probe<kAll>,
                               merge_probe<kRing>};
  kernels[mode]<<<kBlocks, 4 * kThreads>>>(out);
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", names[mode], cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  std::vector<float> got(n);
  cudaMemcpy(got.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost);
  size_t wrong = 0;
  for (int b = 0; b < kBlocks; ++b)
    for (int item = 0; item < kItems; ++item)
      for (int x = 0; x < kValues; ++x)
        for (int t = 0; t < kThreads; ++t) {
          const float c1 = merged(initial(b, item, 1, x, t), initial(b, item, 2, x, t));
          const float want = merged(initial(b, item, 0, x, t), c1);
          const float value = got[((b * kItems + item) * kValues + x) * kThreads + t];
          wrong += std::memcmp(&value, &want, sizeof(float)) != 0;
        }
  std::printf("racecheck probe, mode %s: %zu of %zu merged values wrong\n", names[mode], wrong, n);
  cudaFree(out);
  return wrong == 0 ? 0 : 1;
}
