// (d) A warp-specialised TMA pipeline on the H200, the skeleton of the Hopper forward's K/V stream:
// warpgroup 0 is the producer (setmaxnreg_dec; one thread issues the TMA loads), warpgroups 1 and 2
// are consumers (setmaxnreg_inc), kStages shared-memory stages guarded by full/empty mbarriers. Each
// block streams every 128-row tile of K of one (batch, head) of a strided [batch, seqlen, heads,
// 128] tensor; each consumer warpgroup reads its 64 rows of the tile, writes them unswizzled to
// global memory and sums them (reduced across its warps through a named barrier). The elements are
// multiples of 1/64 in [-2, 2), so every fp32 sum is exact in any order and is compared exactly,
// as is every element: a stage overwritten before it was consumed, or read before it landed,
// shows as a wrong element or sum; a protocol error hangs, which the watchdog turns into a failure.
#include <random>
#include <string>
#include <vector>

#include "cuda/primitives/named_barrier.cuh"
#include "cuda/primitives/sm90/mbarrier.cuh"
#include "cuda/primitives/sm90/tma.cuh"
#include "cuda/primitives/sm90/warpgroup.cuh"
#include "sm90_test_util.cuh"

namespace {

namespace sm90 = flashattn::cuda::sm90;
using flashattn::DType;
using namespace sm90_test;
using flashattn::cuda::smem_address;

constexpr int kDim = 128;
constexpr int kTileRows = 128;                       // rows of K per stage
constexpr int kConsumers = 2;                        // consumer warpgroups, 64 rows each
constexpr int kRowsPerConsumer = kTileRows / kConsumers;
constexpr int kThreads = (1 + kConsumers) * sm90::kWarpgroupThreads;
// Register budgets: 384 threads at one block per SM start with 65536 / 384 -> 168 registers each;
// the producer gives back 128, each consumer takes 64: 40 + 2 * 232 = 504 = 3 * 168.
constexpr int kProducerRegisters = 40;
constexpr int kConsumerRegisters = 232;
static_assert(kProducerRegisters + kConsumers * kConsumerRegisters <= (1 + kConsumers) * 168, "register pool");

using Tile = sm90::Sw128Tile<kTileRows, kDim>;

// Named barriers: 0 is __syncthreads; each consumer warpgroup has its own for its reduction.
enum class NamedBarrier : int { kConsumerReduce0 = 1 };

template <int kStages>
__global__ void __launch_bounds__(kThreads, 1)
    pipeline_kernel(const __grid_constant__ CUtensorMap map_k, int heads, int n_tiles, uint16_t* out, float* sums) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ alignas(8) uint64_t full[kStages];
  __shared__ alignas(8) uint64_t empty[kStages];
  __shared__ float partial[kConsumers][2][sm90::kWarpgroupWarps];  // double-buffered by tile parity
  const uint32_t raw = smem_address(smem_raw);
  const uint32_t stages = (raw + sm90::kSw128Alignment - 1) / sm90::kSw128Alignment * sm90::kSw128Alignment;
  const int batch = blockIdx.x / heads, head = blockIdx.x % heads;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      sm90::mbarrier_init(smem_address(&full[s]), 1);                                  // the producer's expect_tx
      sm90::mbarrier_init(smem_address(&empty[s]), kConsumers * sm90::kWarpgroupThreads);  // every consumer thread
    }
    sm90::fence_mbarrier_init();
  }
  __syncthreads();

  const int wg = sm90::warpgroup_index();
  if (wg == 0) {
    sm90::setmaxnreg_dec<kProducerRegisters>();
    if (threadIdx.x == 0) {
      sm90::tma_prefetch_descriptor(map_k);
      for (int i = 0; i < n_tiles; ++i) {
        const int stage = i % kStages;
        const uint32_t round = static_cast<uint32_t>(i / kStages);
        sm90::mbarrier_wait(smem_address(&empty[stage]), (round & 1) ^ 1);  // round 0 passes at once
        const uint32_t bar = smem_address(&full[stage]);
        sm90::mbarrier_arrive_expect_tx(bar, Tile::kBytes);
        for (int j = 0; j < Tile::kColBlocks; ++j)
          sm90::tma_load(stages + stage * Tile::kBytes + Tile::col_block_offset(j), map_k, bar, 64 * j, i * kTileRows,
                         head, batch);
      }
    }
  } else {
    sm90::setmaxnreg_inc<kConsumerRegisters>();
    const int consumer = wg - 1, t = sm90::warpgroup_thread(), warp = sm90::warpgroup_warp();
    const int barrier = static_cast<int>(NamedBarrier::kConsumerReduce0) + consumer;
    for (int i = 0; i < n_tiles; ++i) {
      const int stage = i % kStages;
      sm90::mbarrier_wait(smem_address(&full[stage]), static_cast<uint32_t>(i / kStages) & 1);
      const uint8_t* tile = smem_raw + (stages - raw) + stage * Tile::kBytes;
      uint16_t* out_tile = out + (static_cast<size_t>(blockIdx.x) * n_tiles + i) * kTileRows * kDim;
      float sum = 0.0f;
      for (int r = consumer * kRowsPerConsumer; r < (consumer + 1) * kRowsPerConsumer; ++r) {
        const uint16_t x = *reinterpret_cast<const uint16_t*>(tile + Tile::offset(r, t));  // column t
        out_tile[r * kDim + t] = x;
        sum += __bfloat162float(__ushort_as_bfloat16(x));
      }
      sm90::mbarrier_arrive(smem_address(&empty[stage]));  // this thread is done with the stage
      for (int m = 16; m > 0; m /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, m);
      if (t % 32 == 0) partial[consumer][i & 1][warp] = sum;
      sm90::named_barrier_sync(barrier, sm90::kWarpgroupThreads);
      if (t == 0) {
        float total = 0.0f;
        for (int w = 0; w < sm90::kWarpgroupWarps; ++w) total += partial[consumer][i & 1][w];
        sums[(static_cast<size_t>(blockIdx.x) * n_tiles + i) * kConsumers + consumer] = total;
      }
    }
  }
}

template <int kStages>
void run_pipeline(int seqlen) {
  expect_hopper();
  const std::string what = "pipeline " + std::to_string(kStages) + " stages, seqlen " + std::to_string(seqlen);
  std::mt19937_64 rng(fresh_seed(what));
  // K of [batch, seqlen, heads, 128] with padded rows and batch entries.
  const int batch = 2, heads = 3;
  const int64_t row_stride = heads * kDim + 64, head_stride = kDim, batch_stride = seqlen * row_stride + 128;
  std::vector<uint16_t> k(static_cast<size_t>(batch) * batch_stride);
  std::uniform_int_distribution<int> level(-128, 127);
  for (auto& x : k) x = to_bits<__nv_bfloat16>(level(rng) / 64.0f);  // padding too: it must never be read
  const int n_tiles = (seqlen + kTileRows - 1) / kTileRows;
  const int blocks = batch * heads;

  DeviceBuffer<uint16_t> d_k(k.size());
  DeviceBuffer<uint16_t> d_out(static_cast<size_t>(blocks) * n_tiles * kTileRows * kDim);
  DeviceBuffer<float> d_sums(static_cast<size_t>(blocks) * n_tiles * kConsumers);
  ASSERT_TRUE(d_k.ptr && d_out.ptr && d_sums.ptr);
  CUDA_OK(cudaMemcpy(d_k.ptr, k.data(), d_k.bytes(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(d_out.ptr, 0xff, d_out.bytes()));
  CUDA_OK(cudaMemset(d_sums.ptr, 0xff, d_sums.bytes()));

  CUtensorMap map;
  const flashattn::Status s = sm90::make_attention_tensor_map(&map, DType::kBFloat16, d_k.ptr, batch, seqlen, heads, kDim,
                                                              batch_stride, row_stride, head_stride, kTileRows);
  ASSERT_TRUE(s.ok()) << s.message;
  const size_t smem = static_cast<size_t>(kStages) * Tile::kBytes + sm90::kSw128Alignment;
  CUDA_OK(cudaFuncSetAttribute(pipeline_kernel<kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  pipeline_kernel<kStages><<<blocks, kThreads, smem>>>(map, heads, n_tiles, d_out.ptr, d_sums.ptr);
  CUDA_OK(cudaGetLastError());
  sync_or_die(what.c_str());

  std::vector<uint16_t> out(d_out.count);
  std::vector<float> sums(d_sums.count);
  CUDA_OK(cudaMemcpy(out.data(), d_out.ptr, d_out.bytes(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(sums.data(), d_sums.ptr, d_sums.bytes(), cudaMemcpyDeviceToHost));
  int failures = 0;
  for (int b = 0; b < blocks; ++b) {
    const int bi = b / heads, h = b % heads;
    for (int i = 0; i < n_tiles; ++i)
      for (int c = 0; c < kConsumers; ++c) {
        double expected_sum = 0.0;
        for (int r = c * kRowsPerConsumer; r < (c + 1) * kRowsPerConsumer; ++r)
          for (int d = 0; d < kDim; ++d) {
            const int row = i * kTileRows + r;
            const uint16_t want = row < seqlen ? k[bi * batch_stride + row * row_stride + h * head_stride + d] : 0;
            const uint16_t got = out[((static_cast<size_t>(b) * n_tiles + i) * kTileRows + r) * kDim + d];
            expected_sum += from_bits<__nv_bfloat16>(want);
            if (got != want && ++failures <= 10)
              ADD_FAILURE() << what << ": block " << b << " tile " << i << " row " << r << " col " << d << " is 0x"
                            << std::hex << got << ", expected 0x" << want << std::dec;
          }
        const float got_sum = sums[(static_cast<size_t>(b) * n_tiles + i) * kConsumers + c];
        if (!(got_sum == expected_sum) && ++failures <= 10)
          ADD_FAILURE() << what << ": block " << b << " tile " << i << " consumer " << c << " sum " << got_sum
                        << ", expected " << expected_sum;
      }
  }
  EXPECT_EQ(failures, 0);
}

TEST(Sm90Pipeline, TwoStagesEightTiles) { run_pipeline<2>(8 * kTileRows - 45); }
TEST(Sm90Pipeline, ThreeStagesThirtyTwoTiles) { run_pipeline<3>(32 * kTileRows - 96); }

// named_barrier_any: two warpgroups, each on a barrier of its own, OR a predicate that holds in the
// threads of `set` (a bit mask over the warpgroup's four warps, lane `lane` of each set warp), three
// rounds in a row (the barrier reused). Every thread must see the OR of its own warpgroup only. In
// rounds 1 and 2 the odd warps of each warpgroup arrive late, so that the two warpgroups' arrivals
// interleave (an implementation that ignored the barrier id would mix them).
__global__ void barrier_any_kernel(const uint32_t* sets, int lane, int* seen) {
  const int wg = threadIdx.x / sm90::kWarpgroupThreads, t = threadIdx.x % sm90::kWarpgroupThreads;
  for (int round = 0; round < 3; ++round) {
    if (round > 0 && (t / 32) % 2 == 1) {
      const long long start = clock64();
      while (clock64() - start < 20000) {
      }
    }
    const uint32_t set = sets[round * 2 + wg];
    const bool q = ((set >> (t / 32)) & 1u) != 0 && t % 32 == lane;
    seen[(round * 2 + wg) * sm90::kWarpgroupThreads + t] =
        flashattn::cuda::named_barrier_any(1 + wg, sm90::kWarpgroupThreads, q) ? 1 : 0;
  }
}

TEST(Sm90Pipeline, NamedBarrierAnyIsUniformPerWarpgroup) {
  expect_hopper();
  // Per round, warpgroup 0's and 1's sets: none, one warp, all, and mixed across the warpgroups.
  const std::vector<uint32_t> sets = {0x0, 0x4, 0x1, 0x0, 0xf, 0x8};
  const int lane = 29;
  DeviceBuffer<uint32_t> d_sets(sets.size());
  DeviceBuffer<int> d_seen(sets.size() * sm90::kWarpgroupThreads);
  ASSERT_TRUE(d_sets.ptr && d_seen.ptr);
  CUDA_OK(cudaMemcpy(d_sets.ptr, sets.data(), d_sets.bytes(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(d_seen.ptr, 0x7f, d_seen.bytes()));  // poison: neither 0 nor 1
  barrier_any_kernel<<<1, 2 * sm90::kWarpgroupThreads>>>(d_sets.ptr, lane, d_seen.ptr);
  CUDA_OK(cudaGetLastError());
  sync_or_die("named_barrier_any");
  std::vector<int> seen(d_seen.count);
  CUDA_OK(cudaMemcpy(seen.data(), d_seen.ptr, d_seen.bytes(), cudaMemcpyDeviceToHost));
  int failures = 0;
  for (size_t i = 0; i < sets.size(); ++i)
    for (int t = 0; t < sm90::kWarpgroupThreads; ++t) {
      const int want = sets[i] != 0 ? 1 : 0, got = seen[i * sm90::kWarpgroupThreads + t];
      if (got != want && ++failures <= 10)
        ADD_FAILURE() << "round " << i / 2 << " warpgroup " << i % 2 << " thread " << t << " saw " << got << ", expected "
                      << want;
    }
  EXPECT_EQ(failures, 0);
}

// mbarrier_arrive(bar, count): one thread's arrival standing for `count`. A barrier of 96 arrivals,
// four phases: in each, warp 0's lanes arrive with counts that sum to 96 minus warp 1's 32 single
// arrivals, some lanes with count 0 or several. Thread 0 reads try_wait before warp 1 arrives (the
// phase must still be open) and after (it must have completed), and the barrier's phase must not run
// ahead: a count taken as 1 leaves the phase open, a count taken as more completes it early.
__global__ void arrive_count_kernel(int* seen) {
  __shared__ alignas(8) uint64_t bar;
  const uint32_t b = smem_address(&bar);
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(b, 96);
    sm90::fence_mbarrier_init();
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int phase = 0; phase < 4; ++phase) {
    // warp 0: lanes 0..15 count (phase + lane) % 4 (a sum of 24 over 16 lanes), lanes 16..31 the
    // rest in equal parts: 64 - 24 = 40 over 16 lanes -> 2 or 3 (lanes 16..23 three, 24..31 two).
    if (warp == 0) {
      const uint32_t count = lane < 16 ? (phase + lane) % 4 : (lane < 24 ? 3u : 2u);
      if (count > 0) sm90::mbarrier_arrive(b, count);
    }
    __syncthreads();
    if (threadIdx.x == 0) seen[phase * 2] = sm90::mbarrier_try_wait(b, phase & 1) ? 1 : 0;
    __syncthreads();
    if (warp == 1) sm90::mbarrier_arrive(b);
    __syncthreads();
    if (threadIdx.x == 0) {
      const long long start = clock64();
      bool done = false;
      while (!done && clock64() - start < 1000000) done = sm90::mbarrier_try_wait(b, phase & 1);
      seen[phase * 2 + 1] = done ? 1 : 0;
    }
    __syncthreads();
  }
}

TEST(Sm90Pipeline, ArriveWithCountCompletesThePhaseExactly) {
  expect_hopper();
  DeviceBuffer<int> d_seen(8);
  ASSERT_TRUE(d_seen.ptr);
  CUDA_OK(cudaMemset(d_seen.ptr, 0x7f, d_seen.bytes()));  // poison: neither 0 nor 1
  arrive_count_kernel<<<1, 64>>>(d_seen.ptr);
  CUDA_OK(cudaGetLastError());
  sync_or_die("mbarrier_arrive with count");
  std::vector<int> seen(8);
  CUDA_OK(cudaMemcpy(seen.data(), d_seen.ptr, d_seen.bytes(), cudaMemcpyDeviceToHost));
  for (int phase = 0; phase < 4; ++phase) {
    EXPECT_EQ(seen[phase * 2], 0) << "phase " << phase << " completed with 64 of its 96 arrivals";
    EXPECT_EQ(seen[phase * 2 + 1], 1) << "phase " << phase << " did not complete with all 96 arrivals";
  }
}

}  // namespace
