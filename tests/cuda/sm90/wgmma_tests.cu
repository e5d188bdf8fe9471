// wgmma on the H200, fed by TMA: (b) C[64 x N] = A[64 x K] Bᵀ with A and B both K-major in
// 128-byte-swizzled shared memory (wgmma_ss, k_major_descriptor), and (c) the attention pair
// S = Q Kᵀ then O = P V with P = S rounded to T and taken from registers (a_from_accumulators,
// wgmma_rs) and V row-major [keys, dims] read MN-major (mn_major_descriptor, kTransB = 1).
// Inputs are random, stored with padded row strides; the accumulators start as NaN (the first
// instruction of each chain must overwrite them, scale-d = 0) and every fp32 output is compared
// with an fp64 product of the same 16-bit inputs. Tolerance: the bound of fp32 summation of K
// exact products in any order with truncation, K 2^-23 sum|a b| (products of two 16-bit values are
// exact in fp32), so only accumulation error passes; a wrong element is off by O(sum|a b|).
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/primitives/sm90/mbarrier.cuh"
#include "cuda/primitives/sm90/tma.cuh"
#include "cuda/primitives/sm90/wgmma.cuh"
#include "sm90_test_util.cuh"

namespace {

namespace sm90 = flashattn::cuda::sm90;
using namespace sm90_test;
using flashattn::cuda::smem_address;

constexpr int kM = 64;  // rows of one wgmma (one warpgroup)
constexpr int kThreads = 128;

__device__ uint32_t aligned_base(void* p) {
  const uint32_t a = smem_address(p);
  return (a + sm90::kSw128Alignment - 1) / sm90::kSw128Alignment * sm90::kSw128Alignment;
}

// Loads all column blocks of a tile (rows x cols) whose top-left element is (row0, 0).
template <class Tile>
__device__ void load_tile(uint32_t dst, const CUtensorMap& map, uint32_t bar, int row0) {
#pragma unroll
  for (int j = 0; j < Tile::kColBlocks; ++j) sm90::tma_load(dst + Tile::col_block_offset(j), map, bar, 64 * j, row0);
}

// Writes this thread's accumulators of a 64 x (2 kAcc) fp32 result to c (row-major, ld columns).
template <int kAcc>
__device__ void store_accumulators(const float (&d)[kAcc], float* c, int ld) {
  const int t = threadIdx.x % kThreads, w = t / 32, g = (t % 32) / 4, q = t % 4;
#pragma unroll
  for (int j = 0; j < kAcc / 4; ++j) {
    const int col = 8 * j + 2 * q;
    c[(16 * w + g) * ld + col] = d[4 * j + 0];
    c[(16 * w + g) * ld + col + 1] = d[4 * j + 1];
    c[(16 * w + g + 8) * ld + col] = d[4 * j + 2];
    c[(16 * w + g + 8) * ld + col + 1] = d[4 * j + 3];
  }
}

template <int kAcc>
__device__ void fill_nan(float (&d)[kAcc]) {
#pragma unroll
  for (int i = 0; i < kAcc; ++i) d[i] = __int_as_float(0x7fffffff);
}

// (b) C[64 x kN] = A[64 x kK] B[kN x kK]ᵀ.
template <class T, int kN, int kK>
__global__ void __launch_bounds__(kThreads) gemm_ss_kernel(const __grid_constant__ CUtensorMap map_a,
                                                           const __grid_constant__ CUtensorMap map_b, float* c) {
  using TileA = sm90::Sw128Tile<kM, kK>;
  using TileB = sm90::Sw128Tile<kN, kK>;
  extern __shared__ uint8_t smem_raw[];
  __shared__ alignas(8) uint64_t bar;
  const uint32_t a_addr = aligned_base(smem_raw), b_addr = a_addr + TileA::kBytes;
  const uint32_t bar_addr = smem_address(&bar);
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(bar_addr, 1);
    sm90::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sm90::mbarrier_arrive_expect_tx(bar_addr, TileA::kBytes + TileB::kBytes);
    load_tile<TileA>(a_addr, map_a, bar_addr, 0);
    load_tile<TileB>(b_addr, map_b, bar_addr, 0);
  }
  sm90::mbarrier_wait(bar_addr, 0);

  float d[kN / 2];
  fill_nan(d);
  sm90::wgmma_fence();
#pragma unroll
  for (int s = 0; s < kK / 16; ++s)
    sm90::wgmma_ss<T>(d, sm90::k_major_descriptor<TileA>(a_addr, s), sm90::k_major_descriptor<TileB>(b_addr, s), s > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::wgmma_fence_operand(d);
  store_accumulators(d, c, kN);
}

// (c) S[64 x kBc] = Q[64 x kD] K[kBc x kD]ᵀ, then O[64 x kDv] = P V with P = T(S) from registers
// and V[kBc x kDv] row-major.
template <class T, int kBc, int kD, int kDv>
__global__ void __launch_bounds__(kThreads) attention_pair_kernel(const __grid_constant__ CUtensorMap map_q,
                                                                  const __grid_constant__ CUtensorMap map_k,
                                                                  const __grid_constant__ CUtensorMap map_v, float* s_out,
                                                                  float* o_out) {
  using TileQ = sm90::Sw128Tile<kM, kD>;
  using TileK = sm90::Sw128Tile<kBc, kD>;
  using TileV = sm90::Sw128Tile<kBc, kDv>;
  static_assert(kBc % 16 == 0, "P V consumes keys 16 at a time");
  extern __shared__ uint8_t smem_raw[];
  __shared__ alignas(8) uint64_t bar;
  const uint32_t q_addr = aligned_base(smem_raw), k_addr = q_addr + TileQ::kBytes, v_addr = k_addr + TileK::kBytes;
  const uint32_t bar_addr = smem_address(&bar);
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(bar_addr, 1);
    sm90::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sm90::mbarrier_arrive_expect_tx(bar_addr, TileQ::kBytes + TileK::kBytes + TileV::kBytes);
    load_tile<TileQ>(q_addr, map_q, bar_addr, 0);
    load_tile<TileK>(k_addr, map_k, bar_addr, 0);
    load_tile<TileV>(v_addr, map_v, bar_addr, 0);
  }
  sm90::mbarrier_wait(bar_addr, 0);

  float s[kBc / 2];
  fill_nan(s);
  sm90::wgmma_fence();
#pragma unroll
  for (int k16 = 0; k16 < kD / 16; ++k16)
    sm90::wgmma_ss<T>(s, sm90::k_major_descriptor<TileQ>(q_addr, k16), sm90::k_major_descriptor<TileK>(k_addr, k16),
                      k16 > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::wgmma_fence_operand(s);
  store_accumulators(s, s_out, kBc);

  uint32_t p[kBc / 16][4];
#pragma unroll
  for (int k16 = 0; k16 < kBc / 16; ++k16) sm90::a_from_accumulators<T>(p[k16], s, k16);
  float o[kDv / 2];
  fill_nan(o);
  sm90::wgmma_fence();  // p and o were written by ordinary instructions
#pragma unroll
  for (int k16 = 0; k16 < kBc / 16; ++k16)
    sm90::wgmma_rs<T, 1>(o, p[k16], sm90::mn_major_descriptor<TileV>(v_addr, k16), k16 > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  sm90::wgmma_fence_operand(o);
  store_accumulators(o, o_out, kDv);
}

// A random rows x cols matrix of T with a padded row stride, on host and device, and its tensor map.
template <class T>
struct Matrix {
  int rows, cols, stride;
  std::vector<uint16_t> host;
  DeviceBuffer<uint16_t> dev;
  CUtensorMap map{};
  Matrix(int r, int c, int box_rows, std::mt19937_64& rng)
      : rows(r), cols(c), stride(c + 24), host(static_cast<size_t>(r) * stride, kPoison16), dev(host.size()) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) host[static_cast<size_t>(i) * stride + j] = to_bits<T>(u(rng));
    EXPECT_NE(dev.ptr, nullptr);
    EXPECT_EQ(cudaMemcpy(dev.ptr, host.data(), dev.bytes(), cudaMemcpyHostToDevice), cudaSuccess);
    const flashattn::Status s = sm90::make_matrix_tensor_map(&map, dtype_of<T>(), dev.ptr, rows, cols, stride, box_rows);
    EXPECT_TRUE(s.ok()) << s.message;
  }
  double at(int i, int j) const { return from_bits<T>(host[static_cast<size_t>(i) * stride + j]); }
};

// Compares got[m][n] with sum_k x(m, k) y(k, n) in fp64, within K 2^-23 sum|x y| (see the top).
template <class X, class Y>
void check_product(const std::vector<float>& got, int rows, int cols, int depth, const X& x, const Y& y,
                   const std::string& what) {
  int failures = 0;
  double worst = 0.0;
  for (int m = 0; m < rows; ++m)
    for (int n = 0; n < cols; ++n) {
      double ref = 0.0, mag = 0.0;
      for (int k = 0; k < depth; ++k) {
        const double prod = x(m, k) * y(k, n);
        ref += prod;
        mag += std::fabs(prod);
      }
      const double tol = depth * std::ldexp(mag, -23) + 1e-30;
      const double g = got[static_cast<size_t>(m) * cols + n];
      const double err = std::fabs(g - ref);
      if (!(err <= tol)) {  // NaN fails
        if (++failures <= 10)
          ADD_FAILURE() << what << ": (" << m << ", " << n << ") = " << g << ", fp64 " << ref << ", error " << err
                        << " > " << tol;
      } else {
        worst = std::max(worst, err / tol);
      }
    }
  EXPECT_EQ(failures, 0) << what;
  std::printf("  %s: worst error %.3f of the fp32-summation bound\n", what.c_str(), worst);
}

template <class T, int kN, int kK>
void run_gemm_ss() {
  expect_hopper();
  const std::string what = std::string("gemm_ss ") + type_name<T>() + " N " + std::to_string(kN) + " K " + std::to_string(kK);
  std::mt19937_64 rng(fresh_seed(what));
  Matrix<T> a(kM, kK, kM, rng), b(kN, kK, kN, rng);
  DeviceBuffer<float> d_c(static_cast<size_t>(kM) * kN);
  ASSERT_NE(d_c.ptr, nullptr);
  CUDA_OK(cudaMemset(d_c.ptr, 0xff, d_c.bytes()));
  const size_t smem = sm90::Sw128Tile<kM, kK>::kBytes + sm90::Sw128Tile<kN, kK>::kBytes + sm90::kSw128Alignment;
  auto kernel = gemm_ss_kernel<T, kN, kK>;
  CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<1, kThreads, smem>>>(a.map, b.map, d_c.ptr);
  CUDA_OK(cudaGetLastError());
  sync_or_die(what.c_str());
  std::vector<float> c(d_c.count);
  CUDA_OK(cudaMemcpy(c.data(), d_c.ptr, d_c.bytes(), cudaMemcpyDeviceToHost));
  check_product(c, kM, kN, kK, [&](int m, int k) { return a.at(m, k); }, [&](int k, int n) { return b.at(n, k); }, what);
}

TEST(Sm90Wgmma, SsBf16N64K64) { run_gemm_ss<__nv_bfloat16, 64, 64>(); }
TEST(Sm90Wgmma, SsBf16N64K128) { run_gemm_ss<__nv_bfloat16, 64, 128>(); }
TEST(Sm90Wgmma, SsBf16N64K256) { run_gemm_ss<__nv_bfloat16, 64, 256>(); }
TEST(Sm90Wgmma, SsBf16N128K64) { run_gemm_ss<__nv_bfloat16, 128, 64>(); }
TEST(Sm90Wgmma, SsBf16N128K128) { run_gemm_ss<__nv_bfloat16, 128, 128>(); }
TEST(Sm90Wgmma, SsBf16N128K256) { run_gemm_ss<__nv_bfloat16, 128, 256>(); }
TEST(Sm90Wgmma, SsBf16N256K64) { run_gemm_ss<__nv_bfloat16, 256, 64>(); }
TEST(Sm90Wgmma, SsBf16N256K128) { run_gemm_ss<__nv_bfloat16, 256, 128>(); }
TEST(Sm90Wgmma, SsBf16N256K256) { run_gemm_ss<__nv_bfloat16, 256, 256>(); }
TEST(Sm90Wgmma, SsFp16N128K128) { run_gemm_ss<__half, 128, 128>(); }
TEST(Sm90Wgmma, SsFp16N256K64) { run_gemm_ss<__half, 256, 64>(); }
TEST(Sm90Wgmma, SsBf16N176K96) { run_gemm_ss<__nv_bfloat16, 176, 96>(); }  // FA3-like Bc, d = 96

template <class T, int kBc, int kD, int kDv>
void run_attention_pair() {
  expect_hopper();
  const std::string what = std::string("S = Q Kᵀ, O = P V ") + type_name<T>() + " Bc " + std::to_string(kBc) + " d " +
                           std::to_string(kD) + " dv " + std::to_string(kDv);
  std::mt19937_64 rng(fresh_seed(what));
  Matrix<T> q(kM, kD, kM, rng), k(kBc, kD, kBc, rng), v(kBc, kDv, kBc, rng);
  DeviceBuffer<float> d_s(static_cast<size_t>(kM) * kBc), d_o(static_cast<size_t>(kM) * kDv);
  ASSERT_TRUE(d_s.ptr && d_o.ptr);
  CUDA_OK(cudaMemset(d_s.ptr, 0xff, d_s.bytes()));
  CUDA_OK(cudaMemset(d_o.ptr, 0xff, d_o.bytes()));
  const size_t smem = sm90::Sw128Tile<kM, kD>::kBytes + sm90::Sw128Tile<kBc, kD>::kBytes +
                      sm90::Sw128Tile<kBc, kDv>::kBytes + sm90::kSw128Alignment;
  auto kernel = attention_pair_kernel<T, kBc, kD, kDv>;
  CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<1, kThreads, smem>>>(q.map, k.map, v.map, d_s.ptr, d_o.ptr);
  CUDA_OK(cudaGetLastError());
  sync_or_die(what.c_str());
  std::vector<float> s(d_s.count), o(d_o.count);
  CUDA_OK(cudaMemcpy(s.data(), d_s.ptr, d_s.bytes(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(o.data(), d_o.ptr, d_o.bytes(), cudaMemcpyDeviceToHost));
  check_product(s, kM, kBc, kD, [&](int m, int j) { return q.at(m, j); }, [&](int j, int n) { return k.at(n, j); },
                what + " (S)");
  // P as the kernel rounded it: the GPU's own fp32 S, rounded to nearest even in T.
  auto p = [&](int m, int key) { return static_cast<double>(from_bits<T>(to_bits<T>(s[static_cast<size_t>(m) * kBc + key]))); };
  check_product(o, kM, kDv, kBc, p, [&](int key, int n) { return v.at(key, n); }, what + " (O)");
}

TEST(Sm90Wgmma, RsPvBf16Bc64D64Dv64) { run_attention_pair<__nv_bfloat16, 64, 64, 64>(); }
TEST(Sm90Wgmma, RsPvBf16Bc128D128Dv128) { run_attention_pair<__nv_bfloat16, 128, 128, 128>(); }
TEST(Sm90Wgmma, RsPvBf16Bc128D64Dv256) { run_attention_pair<__nv_bfloat16, 128, 64, 256>(); }
TEST(Sm90Wgmma, RsPvBf16Bc192D128Dv96) { run_attention_pair<__nv_bfloat16, 192, 128, 96>(); }
TEST(Sm90Wgmma, RsPvFp16Bc128D128Dv128) { run_attention_pair<__half, 128, 128, 128>(); }
TEST(Sm90Wgmma, RsPvFp16Bc176D96Dv64) { run_attention_pair<__half, 176, 96, 64>(); }

}  // namespace
