// A hand-over between two parties at GPU scope through one counter in global memory (zero before
// either arrives): the first to arrive publishes its data, the second waits until it is published
// and reads it. Neither waits for a party that has not arrived, so that no block ever waits on one
// that may not be resident.
//   arrive(counter)            returns the counter's old value: 0, this party is first; else second
//                              (acquire: what the first published before publish() is visible once
//                              wait_published() returns)
//   publish(counter)           the first, after its stores and a __threadfence() by each thread
//                              that stored and a sync of those threads: counter += 1 (release)
//   wait_published(counter)    the second: until both arrivals and the publication are counted (3)
#pragma once

namespace flashattn::cuda {

__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* addr, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;\n" : "=r"(old) : "l"(addr), "r"(v) : "memory");
  return old;
}

__device__ __forceinline__ void red_add_release_gpu(int* addr, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(addr), "r"(v) : "memory");
}

__device__ __forceinline__ int load_acquire_gpu(const int* addr) {
  int v;
  asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(addr) : "memory");
  return v;
}

struct Handoff {
  static __device__ __forceinline__ int arrive(int* counter) { return atomic_add_acq_rel_gpu(counter, 1); }
  static __device__ __forceinline__ void publish(int* counter) { red_add_release_gpu(counter, 1); }
  static __device__ __forceinline__ void wait_published(const int* counter) {
    while (load_acquire_gpu(counter) < 3) {
    }
  }
};

}  // namespace flashattn::cuda
