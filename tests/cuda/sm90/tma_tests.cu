// TMA on the H200: tensor maps made by make_matrix_tensor_map / make_attention_tensor_map, boxes
// loaded through an mbarrier (tma_load, mbarrier_arrive_expect_tx, mbarrier_wait) and stored back
// (tma_store after fence_proxy_async_shared). Every shared-memory byte is checked against the
// 128-byte swizzle rule applied to the source, out-of-bounds elements against zero (loads) or
// against untouched poison (stores); the host-side checks of the map helpers run without a GPU.
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "cuda/primitives/sm90/mbarrier.cuh"
#include "cuda/primitives/sm90/tma.cuh"
#include "cuda/primitives/sm90/warpgroup.cuh"
#include "sm90_test_util.cuh"

namespace {

namespace sm90 = flashattn::cuda::sm90;
using flashattn::DType;
using flashattn::StatusCode;
using namespace sm90_test;
using flashattn::cuda::smem_address;

constexpr int kBoxRows = 64;
constexpr int kBoxBytes = kBoxRows * sm90::kSw128Bytes;
constexpr int kThreads = 128;

__device__ uint8_t* align_1024(uint8_t* p) {
  return p + ((sm90::kSw128Alignment - smem_address(p) % sm90::kSw128Alignment) % sm90::kSw128Alignment);
}

// One box per block at coords[blockIdx.x] = (c0, c1, c2, c3) (unused trailing coordinates ignored
// by rank); the raw shared-memory image (swizzled) goes to out[blockIdx.x].
template <int kRank>
__global__ void __launch_bounds__(kThreads) load_box_kernel(const __grid_constant__ CUtensorMap map, const int4* coords,
                                                            uint32_t* out) {
  extern __shared__ uint8_t smem_raw[];
  __shared__ alignas(8) uint64_t bar;
  uint8_t* tile = align_1024(smem_raw);
  const uint32_t bar_addr = smem_address(&bar);
  if (threadIdx.x == 0) {
    sm90::tma_prefetch_descriptor(map);
    sm90::mbarrier_init(bar_addr, 1);
    sm90::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int4 c = coords[blockIdx.x];
    sm90::mbarrier_arrive_expect_tx(bar_addr, kBoxBytes);
    if constexpr (kRank == 2) sm90::tma_load(smem_address(tile), map, bar_addr, c.x, c.y);
    else sm90::tma_load(smem_address(tile), map, bar_addr, c.x, c.y, c.z, c.w);
  }
  sm90::mbarrier_wait(bar_addr, 0);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(tile);
  for (int i = threadIdx.x; i < kBoxBytes / 4; i += kThreads) out[blockIdx.x * (kBoxBytes / 4) + i] = words[i];
}

// Writes box_src[blockIdx.x] (kBoxRows x 64 elements, plain row-major) into shared memory at the
// swizzled places Sw128Tile says, then stores it as the box at coords[blockIdx.x].
__global__ void __launch_bounds__(kThreads) store_box_kernel(const __grid_constant__ CUtensorMap map, const int4* coords,
                                                             const uint16_t* box_src) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* tile = align_1024(smem_raw);
  using Box = sm90::Sw128Tile<kBoxRows, sm90::kSw128Cols>;
  const uint16_t* src = box_src + blockIdx.x * kBoxRows * sm90::kSw128Cols;
  for (int i = threadIdx.x; i < kBoxRows * sm90::kSw128Cols; i += kThreads) {
    const int r = i / sm90::kSw128Cols, c = i % sm90::kSw128Cols;
    *reinterpret_cast<uint16_t*>(tile + Box::offset(r, c)) = src[i];
  }
  sm90::fence_proxy_async_shared();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int4 c = coords[blockIdx.x];
    sm90::tma_store(map, smem_address(tile), c.x, c.y, c.z, c.w);
    sm90::tma_store_commit();
    sm90::tma_store_wait<0>();
  }
}

constexpr size_t kSmemBytes = kBoxBytes + sm90::kSw128Alignment;

// Checks one loaded box image: physical byte -> logical (row, col) by the hardware swizzle rule;
// expected(row, col) gives the source element or 0 outside the tensor.
template <class Expected>
void check_box(const uint32_t* image, const Expected& expected, const std::string& where, int& failures) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(image);
  for (uint32_t phys = 0; phys < kBoxBytes; phys += 2) {
    const uint32_t logical = unswizzle128(phys);
    const int r = static_cast<int>(logical / sm90::kSw128Bytes), c = static_cast<int>(logical % sm90::kSw128Bytes) / 2;
    uint16_t got;
    std::memcpy(&got, bytes + phys, 2);
    const uint16_t want = expected(r, c);
    if (got != want && ++failures <= 10)
      ADD_FAILURE() << where << ": box element (" << r << ", " << c << ") at byte " << phys << " is 0x" << std::hex << got
                    << ", expected 0x" << want << std::dec;
  }
}

TEST(Sm90Tma, SwizzleLayoutMatchesHardwareRule) {
  // Sw128Tile::offset against the bit rule, for a tile of several column blocks.
  using Tile = sm90::Sw128Tile<40, 192>;
  for (int r = 0; r < 40; ++r)
    for (int c = 0; c < 192; ++c) {
      const uint32_t phys = Tile::offset(r, c);
      const uint32_t block = phys / Tile::kColBlockBytes, in_block = phys % Tile::kColBlockBytes;
      const uint32_t logical = unswizzle128(in_block);
      ASSERT_EQ(block, static_cast<uint32_t>(c / 64));
      ASSERT_EQ(logical, static_cast<uint32_t>(r * 128 + (c % 64) * 2)) << "row " << r << " col " << c;
    }
}

TEST(Sm90Tma, Load2dBf16Swizzled) {
  expect_hopper();
  const uint64_t seed = fresh_seed("Sm90Tma.Load2dBf16Swizzled");
  std::mt19937_64 rng(seed);
  // [rows, cols] with a padded row stride; neither is a multiple of the box.
  const int rows = 300, cols = 200, row_stride = 216;
  std::vector<uint16_t> a(static_cast<size_t>(rows) * row_stride, kPoison16);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) a[static_cast<size_t>(r) * row_stride + c] = to_bits<__nv_bfloat16>(u(rng));

  // Boxes: random rows (some run past the last row), every column block (the last one is 8 wide).
  std::vector<int4> coords;
  std::uniform_int_distribution<int> row0(0, rows - 1);
  for (int cb = 0; cb < 4; ++cb)
    for (int k = 0; k < 3; ++k) coords.push_back({cb * 64, k == 0 ? rows - 5 : row0(rng), 0, 0});

  DeviceBuffer<uint16_t> d_a(a.size());
  DeviceBuffer<int4> d_coords(coords.size());
  DeviceBuffer<uint32_t> d_out(coords.size() * kBoxBytes / 4);
  ASSERT_TRUE(d_a.ptr && d_coords.ptr && d_out.ptr);
  CUDA_OK(cudaMemcpy(d_a.ptr, a.data(), d_a.bytes(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_coords.ptr, coords.data(), d_coords.bytes(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(d_out.ptr, 0xff, d_out.bytes()));

  CUtensorMap map;
  const flashattn::Status s = sm90::make_matrix_tensor_map(&map, DType::kBFloat16, d_a.ptr, rows, cols, row_stride, kBoxRows);
  ASSERT_TRUE(s.ok()) << s.message;
  CUDA_OK(cudaFuncSetAttribute(load_box_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  load_box_kernel<2><<<coords.size(), kThreads, kSmemBytes>>>(map, d_coords.ptr, d_out.ptr);
  CUDA_OK(cudaGetLastError());
  sync_or_die("load_box_kernel<2>");

  std::vector<uint32_t> out(d_out.count);
  CUDA_OK(cudaMemcpy(out.data(), d_out.ptr, d_out.bytes(), cudaMemcpyDeviceToHost));
  int failures = 0;
  for (size_t b = 0; b < coords.size(); ++b) {
    const int4 c0 = coords[b];
    check_box(out.data() + b * kBoxBytes / 4,
              [&](int r, int c) -> uint16_t {
                const int gr = c0.y + r, gc = c0.x + c;
                return gr < rows && gc < cols ? a[static_cast<size_t>(gr) * row_stride + gc] : 0;
              },
              "box at (col " + std::to_string(c0.x) + ", row " + std::to_string(c0.y) + ")", failures);
  }
  EXPECT_EQ(failures, 0);
}

// A packed-QKV-like layout: K of [batch, seqlen, heads, dim] inside rows of q|k|v, so the row stride
// is 3 heads dim, and the elements past dim belong to the next head (must not be read or written).
struct PackedK {
  int batch, seqlen, heads, dim;
  int64_t row_stride() const { return 3LL * heads * dim; }
  int64_t batch_stride() const { return seqlen * row_stride(); }
  int64_t k_offset() const { return static_cast<int64_t>(heads) * dim; }  // K starts after Q's heads
  size_t total() const { return static_cast<size_t>(batch) * batch_stride(); }
  int64_t index(int b, int s, int h, int d) const { return k_offset() + b * batch_stride() + s * row_stride() + h * dim + d; }
};

// Every (batch, head, row block, column block) box of K, row blocks and the last column block
// running past seqlen and dim.
std::vector<int4> all_boxes(const PackedK& t) {
  std::vector<int4> coords;
  for (int b = 0; b < t.batch; ++b)
    for (int h = 0; h < t.heads; ++h)
      for (int r = 0; r < t.seqlen; r += kBoxRows)
        for (int c = 0; c < t.dim; c += 64) coords.push_back({c, r, h, b});
  return coords;
}

class Sm90TmaAttention : public ::testing::TestWithParam<int> {};

TEST_P(Sm90TmaAttention, Load4dStridedZeroFill) {
  expect_hopper();
  const PackedK t{2, 83, 3, GetParam()};
  const uint64_t seed = fresh_seed("Sm90TmaAttention.Load4dStridedZeroFill dim " + std::to_string(t.dim));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<uint16_t> qkv(t.total());
  for (auto& x : qkv) x = to_bits<__half>(u(rng));  // every element, so zero fill cannot be mistaken
  const std::vector<int4> coords = all_boxes(t);

  DeviceBuffer<uint16_t> d_qkv(qkv.size());
  DeviceBuffer<int4> d_coords(coords.size());
  DeviceBuffer<uint32_t> d_out(coords.size() * kBoxBytes / 4);
  ASSERT_TRUE(d_qkv.ptr && d_coords.ptr && d_out.ptr);
  CUDA_OK(cudaMemcpy(d_qkv.ptr, qkv.data(), d_qkv.bytes(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_coords.ptr, coords.data(), d_coords.bytes(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemset(d_out.ptr, 0xff, d_out.bytes()));

  CUtensorMap map;
  const flashattn::Status s =
      sm90::make_attention_tensor_map(&map, DType::kFloat16, d_qkv.ptr + t.k_offset(), t.batch, t.seqlen, t.heads,
                                      t.dim, t.batch_stride(), t.row_stride(), t.dim, kBoxRows);
  ASSERT_TRUE(s.ok()) << s.message;
  CUDA_OK(cudaFuncSetAttribute(load_box_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  load_box_kernel<4><<<coords.size(), kThreads, kSmemBytes>>>(map, d_coords.ptr, d_out.ptr);
  CUDA_OK(cudaGetLastError());
  sync_or_die("load_box_kernel<4>");

  std::vector<uint32_t> out(d_out.count);
  CUDA_OK(cudaMemcpy(out.data(), d_out.ptr, d_out.bytes(), cudaMemcpyDeviceToHost));
  int failures = 0;
  for (size_t i = 0; i < coords.size(); ++i) {
    const int4 c0 = coords[i];
    check_box(out.data() + i * kBoxBytes / 4,
              [&](int r, int c) -> uint16_t {
                const int s_ = c0.y + r, d = c0.x + c;
                return s_ < t.seqlen && d < t.dim ? qkv[t.index(c0.w, s_, c0.z, d)] : 0;
              },
              "box (batch " + std::to_string(c0.w) + ", head " + std::to_string(c0.z) + ", row " +
                  std::to_string(c0.y) + ", col " + std::to_string(c0.x) + ")",
              failures);
  }
  EXPECT_EQ(failures, 0);
}

TEST_P(Sm90TmaAttention, Store4dClipsAtSeqlenAndDim) {
  expect_hopper();
  const PackedK t{2, 83, 3, GetParam()};
  const uint64_t seed = fresh_seed("Sm90TmaAttention.Store4dClipsAtSeqlenAndDim dim " + std::to_string(t.dim));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  const std::vector<int4> coords = all_boxes(t);
  std::vector<uint16_t> src(coords.size() * kBoxRows * 64);
  for (auto& x : src) x = to_bits<__nv_bfloat16>(u(rng));

  // Expected: the poisoned buffer with each box's in-bounds elements written.
  std::vector<uint16_t> expected(t.total(), kPoison16);
  for (size_t i = 0; i < coords.size(); ++i)
    for (int r = 0; r < kBoxRows; ++r)
      for (int c = 0; c < 64; ++c) {
        const int4 c0 = coords[i];
        if (c0.y + r < t.seqlen && c0.x + c < t.dim)
          expected[t.index(c0.w, c0.y + r, c0.z, c0.x + c)] = src[(i * kBoxRows + r) * 64 + c];
      }

  DeviceBuffer<uint16_t> d_qkv(t.total());
  DeviceBuffer<int4> d_coords(coords.size());
  DeviceBuffer<uint16_t> d_src(src.size());
  ASSERT_TRUE(d_qkv.ptr && d_coords.ptr && d_src.ptr);
  CUDA_OK(cudaMemset(d_qkv.ptr, 0xff, d_qkv.bytes()));
  CUDA_OK(cudaMemcpy(d_coords.ptr, coords.data(), d_coords.bytes(), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_src.ptr, src.data(), d_src.bytes(), cudaMemcpyHostToDevice));

  CUtensorMap map;
  const flashattn::Status s =
      sm90::make_attention_tensor_map(&map, DType::kBFloat16, d_qkv.ptr + t.k_offset(), t.batch, t.seqlen, t.heads,
                                      t.dim, t.batch_stride(), t.row_stride(), t.dim, kBoxRows);
  ASSERT_TRUE(s.ok()) << s.message;
  CUDA_OK(cudaFuncSetAttribute(store_box_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  store_box_kernel<<<coords.size(), kThreads, kSmemBytes>>>(map, d_coords.ptr, d_src.ptr);
  CUDA_OK(cudaGetLastError());
  sync_or_die("store_box_kernel");

  std::vector<uint16_t> got(t.total());
  CUDA_OK(cudaMemcpy(got.data(), d_qkv.ptr, d_qkv.bytes(), cudaMemcpyDeviceToHost));
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != expected[i] && ++failures <= 10)
      ADD_FAILURE() << "element " << i << " of the packed buffer is 0x" << std::hex << got[i] << ", expected 0x"
                    << expected[i] << std::dec;
  EXPECT_EQ(failures, 0);
}

// dim 128: whole column blocks; dim 96: the second block is half outside (zero fill / clipped).
INSTANTIATE_TEST_SUITE_P(Dims, Sm90TmaAttention, ::testing::Values(128, 96));

// The helpers refuse what TMA cannot describe, naming the argument, before touching the driver.
TEST(Sm90TmaHost, RejectsBadArguments) {
  alignas(16) static uint16_t storage[64 * 1024];
  CUtensorMap map;
  auto expect_invalid = [](const flashattn::Status& s, const char* needle) {
    EXPECT_EQ(s.code, StatusCode::kInvalidArgument) << s.message;
    EXPECT_NE(s.message.find(needle), std::string::npos) << "message does not name " << needle << ": " << s.message;
  };
  // Row stride of 100 elements = 200 bytes, not a multiple of 16.
  expect_invalid(sm90::make_matrix_tensor_map(&map, DType::kBFloat16, storage, 64, 64, 100, 64), "row_stride");
  expect_invalid(sm90::make_attention_tensor_map(&map, DType::kFloat16, storage, 2, 16, 4, 64, 16 * 4 * 64, 4 * 64, 60, 64),
                 "head_stride");
  expect_invalid(sm90::make_attention_tensor_map(&map, DType::kFloat16, storage, 2, 16, 4, 64, 1001, 4 * 64, 64, 64),
                 "batch_stride");
  expect_invalid(sm90::make_matrix_tensor_map(&map, DType::kFloat32, storage, 64, 64, 64, 64), "dtype");
  expect_invalid(sm90::make_matrix_tensor_map(&map, DType::kBFloat16, storage + 1, 64, 64, 64, 64), "data");
  expect_invalid(sm90::make_matrix_tensor_map(&map, DType::kBFloat16, nullptr, 64, 64, 64, 64), "data");
  expect_invalid(sm90::make_matrix_tensor_map(&map, DType::kBFloat16, storage, 64, 64, 64, 300), "box_rows");
  expect_invalid(sm90::make_matrix_tensor_map(&map, DType::kBFloat16, storage, 64, 64, 64, 12), "box_rows");
  expect_invalid(sm90::make_matrix_tensor_map(&map, DType::kBFloat16, storage, 0, 64, 64, 64), "rows");
  expect_invalid(sm90::make_attention_tensor_map(&map, DType::kBFloat16, storage, 1, 16, 4, 0, 0, 4 * 64, 64, 64), "dim");
}

}  // namespace
