// The ISA-specific pieces of the CPU backward (flash and standard): one fp32 GEMM micro-kernel
// driver and the two element-wise passes that turn scores into P and dP into dS. The drivers
// (backward.cpp, standard_backward.cpp) are built for baseline x86-64 and call these through a
// table picked once at run time from the CPU's features.
//
// Results are bit-identical for a given table whatever the thread count; different ISAs may round
// differently (FMA contraction, exp polynomial).
#pragma once

#include <cstdint>

#include "flashattn/flashattn.hpp"

namespace flashattn::detail {

struct BackwardKernels {
  const char* name;

  // C[M, N] (+)= A[M, K] · B[K, N], fp32. A is read by broadcast at A[m * a_ms + k * a_ks], so it
  // may be row-major (a_ms = lda, a_ks = 1) or a transposed view (a_ms = 1, a_ks = lda); B and C
  // are row-major with leading dimensions ldb, ldc (last dimension contiguous). accumulate = false
  // overwrites C. M, N, K >= 0; K = 0 with accumulate = false writes zeros.
  void (*gemm)(int64_t M, int64_t N, int64_t K, const float* A, int64_t a_ms, int64_t a_ks,
               const float* B, int64_t ldb, float* C, int64_t ldc, bool accumulate);

  // x[r, c] = 2^(x[r, c] * mul - shift[r]) for r < rows, c < cols (row stride ld).
  // -inf gives exactly 0, NaN stays NaN.
  void (*exp2_rows)(float* x, int64_t ld, int64_t rows, int64_t cols, float mul, const float* shift);

  // dp[r, c] = p[r, c] · (dp[r, c] - d[r]) · scale: dP becomes dS (already multiplied by the
  // softmax scale that dQ and dK need).
  void (*ds_rows)(const float* p, float* dp, int64_t ld, int64_t rows, int64_t cols, const float* d,
                  float scale);

  // bf16 inputs only, null where the CPU has no bf16 dot products: C[M, N] = A[M, 2K] · B[2K, N]
  // with A and B in bf16 pairs along the reduction, as 32-bit words: A row m is the 2K bf16 values
  // at A + m * a_ms (words); B[k, n] (word k * ldb + n) holds rows 2k and 2k + 1 of column n.
  // Products of bf16 values are exact in fp32, so this matches gemm on the widened values up to
  // summation order (bf16 denormals count as zero).
  void (*gemm_bf16)(int64_t M, int64_t N, int64_t K, const uint32_t* A, int64_t a_ms, const uint32_t* B,
                    int64_t ldb, float* C, int64_t ldc);

  // n elements of storage dtype t to fp32 and back (round to nearest even, as core/dtype.hpp).
  void (*widen)(const void* src, DType t, int64_t n, float* dst);
  void (*narrow)(const float* src, int64_t n, DType t, void* dst);
};

// One table per ISA; each exists in every build, call only what the CPU supports.
const BackwardKernels& backward_kernels_avx512();
const BackwardKernels& backward_kernels_avx512_bf16();  // the above plus gemm_bf16
const BackwardKernels& backward_kernels_avx2();
const BackwardKernels& backward_kernels_portable();

// The best table this CPU runs (cpu_features(), so FLASHATTN_CPU_ISA can lower it).
const BackwardKernels& backward_kernels();

}  // namespace flashattn::detail
