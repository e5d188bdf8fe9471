// TMA (the Tensor Memory Accelerator, sm_90): bulk tensor copies between global memory and shared
// memory, described by a CUtensorMap that the host encodes once and the kernel receives by value as
// a `const __grid_constant__ CUtensorMap` parameter (its address is then a valid generic address).
//
// Device:
//   tma_prefetch_descriptor(map)           pull the 128-byte map into the descriptor cache early
//   tma_load(dst, map, bar, c0, c1[, c2[, c3[, c4]]])
//                                          one box global -> shared; completes `box bytes` on the
//                                          mbarrier `bar` (arm it with mbarrier_arrive_expect_tx)
//   tma_store(map, src, c0, c1[, ...])     one box shared -> global (after fence_proxy_async_shared
//                                          and a barrier, when the box was written by ordinary stores)
//   tma_store_commit()                     closes a group of stores
//   tma_store_wait_read<N>()               <= N groups still reading shared memory (reuse the source)
//   tma_store_wait<N>()                    <= N groups not yet complete (writes done)
// Coordinates are element indices, innermost dimension first, and may run past the tensor: a load
// fills those elements with zeros, a store skips them. A load's box may also start before 0 (those
// elements read as zeros); a store's may not: on the H200 a 4-d store box starting at row -53
// raised an illegal instruction (docs/perf.md, 2026-12-03, session 19). A box always counts its
// full size in bytes towards the mbarrier's transactions, whether or not part of it lies outside
// the tensor.
//
// Host:
//   make_matrix_tensor_map     a [rows, cols] matrix with a row stride, in boxes of box_rows x 64
//   make_attention_tensor_map  a strided [batch, seqlen, heads, dim] tensor, in boxes of box_rows x 64
//                              of one (batch, head): rows past seqlen read as zeros rather than as the
//                              next batch entry's rows
//   make_packed_rows_tensor_map  a [rows, heads, dim] tensor of packed sequences (varlen), in boxes
//                              of box_rows x 64 of one head whose rows before a given first row
//                              read as zeros rather than as the previous sequence's rows
// Both use 128-byte swizzle (the shared layout is Sw128Tile: a box of box_rows x 64 fills one column
// block), take fp16/bf16, and return a Status naming the argument at fault; nothing links libcuda:
// cuTensorMapEncodeTiled is found through the runtime's cudaGetDriverEntryPointByVersion.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums (types only; no driver symbols are linked)
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <string>

#include "cuda/primitives/sm90/arch.cuh"
#include "cuda/primitives/sm90/sw128_tile.cuh"
#include "flashattn/flashattn.hpp"

namespace flashattn::cuda::sm90 {

// ---------------------------------------------------------------------------------------------
// Device side

__device__ __forceinline__ uint64_t tensor_map_address(const CUtensorMap& map) {
  return reinterpret_cast<uint64_t>(&map);
}

__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap& map) {
#if defined(FLASHATTN_SM90_DEVICE)
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(tensor_map_address(map)) : "memory");
#else
  __trap();
#endif
}

// Loads: dst and bar are shared-state-space addresses; dst 128-byte aligned (1024 for the swizzle
// pattern to match Sw128Tile).
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap& map, uint32_t bar, int c0, int c1) {
#if defined(FLASHATTN_SM90_DEVICE)
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(tensor_map_address(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap& map, uint32_t bar, int c0, int c1, int c2) {
#if defined(FLASHATTN_SM90_DEVICE)
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(dst),
      "l"(tensor_map_address(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap& map, uint32_t bar, int c0, int c1, int c2,
                                         int c3) {
#if defined(FLASHATTN_SM90_DEVICE)
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(tensor_map_address(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap& map, uint32_t bar, int c0, int c1, int c2,
                                         int c3, int c4) {
#if defined(FLASHATTN_SM90_DEVICE)
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n" ::"r"(dst),
      "l"(tensor_map_address(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
      : "memory");
#else
  __trap();
#endif
}

// Stores: src is a shared-state-space address, 128-byte aligned.
__device__ __forceinline__ void tma_store(const CUtensorMap& map, uint32_t src, int c0, int c1) {
#if defined(FLASHATTN_SM90_DEVICE)
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(
                   tensor_map_address(map)),
               "r"(src), "r"(c0), "r"(c1)
               : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void tma_store(const CUtensorMap& map, uint32_t src, int c0, int c1, int c2) {
#if defined(FLASHATTN_SM90_DEVICE)
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                   tensor_map_address(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void tma_store(const CUtensorMap& map, uint32_t src, int c0, int c1, int c2, int c3) {
#if defined(FLASHATTN_SM90_DEVICE)
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   tensor_map_address(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void tma_store(const CUtensorMap& map, uint32_t src, int c0, int c1, int c2, int c3,
                                          int c4) {
#if defined(FLASHATTN_SM90_DEVICE)
  asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n" ::"l"(
                   tensor_map_address(map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
               : "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void tma_store_commit() {
#if defined(FLASHATTN_SM90_DEVICE)
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
#else
  __trap();
#endif
}

// Waits until at most kPending of this thread's store groups still read their shared source.
template <int kPending>
__device__ __forceinline__ void tma_store_wait_read() {
#if defined(FLASHATTN_SM90_DEVICE)
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
#else
  __trap();
#endif
}

// Waits until at most kPending of this thread's store groups are incomplete (their writes done).
template <int kPending>
__device__ __forceinline__ void tma_store_wait() {
#if defined(FLASHATTN_SM90_DEVICE)
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
#else
  __trap();
#endif
}

// ---------------------------------------------------------------------------------------------
// Host side

namespace tma_detail {

inline Status invalid(const std::string& message) { return {StatusCode::kInvalidArgument, message}; }

// cuTensorMapEncodeTiled from the driver the runtime loaded (null when the driver lacks it).
inline PFN_cuTensorMapEncodeTiled_v12000 encode_tiled_entry_point() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
    return (e == cudaSuccess && found == cudaDriverEntryPointSuccess)
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p)
               : nullptr;
  }();
  return fn;
}

// Encodes a tensor of `rank` dimensions (dims innermost first, dims[0] contiguous) whose outer
// dimension i >= 1 has byte stride byte_strides[i - 1], as boxes of box_rows x 64 elements (the box
// is 1 wide in dimensions >= 2), 128-byte swizzle, zero fill outside the tensor. names[i] name the
// caller's arguments in messages: names[0..rank) the sizes, names[rank..2 rank - 1) the strides.
inline Status encode_sw128(CUtensorMap* map, DType dtype, const void* data, int rank, const int64_t* dims,
                           const int64_t* byte_strides, int box_rows, const char* const* names) {
  if (map == nullptr) return invalid("tensor map: map must not be null");
  if (dtype != DType::kFloat16 && dtype != DType::kBFloat16)
    return invalid("tensor map: dtype must be fp16 or bf16 (128-byte swizzled boxes of 64 16-bit elements)");
  if (data == nullptr) return invalid("tensor map: data must not be null");
  if (reinterpret_cast<uintptr_t>(data) % 16 != 0) return invalid("tensor map: data must be 16-byte aligned");
  if (box_rows < 8 || box_rows > 256 || box_rows % 8 != 0)
    return invalid("tensor map: box_rows must be a multiple of 8 in [8, 256], got " + std::to_string(box_rows));
  cuuint64_t global_dim[5];
  cuuint64_t global_stride[4];
  cuuint32_t box[5] = {static_cast<cuuint32_t>(kSw128Cols), static_cast<cuuint32_t>(box_rows), 1, 1, 1};
  const cuuint32_t element_stride[5] = {1, 1, 1, 1, 1};
  for (int i = 0; i < rank; ++i) {
    if (dims[i] < 1 || dims[i] > (int64_t{1} << 32))
      return invalid(std::string("tensor map: ") + names[i] + " must be in [1, 2^32], got " + std::to_string(dims[i]));
    global_dim[i] = static_cast<cuuint64_t>(dims[i]);
  }
  for (int i = 1; i < rank; ++i) {
    const int64_t s = byte_strides[i - 1];
    const std::string name = names[rank + i - 1];
    // A dimension of size 1 is only ever read at coordinate 0: its stride is immaterial, so any
    // valid one stands in (callers pass 0 or garbage there, e.g. the batch stride of batch 1).
    if (dims[i] == 1) {
      global_stride[i - 1] = i > 1 ? global_stride[i - 2] : 16;
      continue;
    }
    if (s <= 0 || s % 16 != 0)
      return invalid("tensor map: " + name + " must be a positive multiple of 16 bytes, got " + std::to_string(s) +
                     " bytes");
    if (s >= (int64_t{1} << 40)) return invalid("tensor map: " + name + " must be below 2^40 bytes");
    global_stride[i - 1] = static_cast<cuuint64_t>(s);
  }
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encode_tiled_entry_point();
  if (encode == nullptr)
    return {StatusCode::kNotSupported, "tensor map: the CUDA driver has no cuTensorMapEncodeTiled (needs CUDA 12)"};
  const CUresult r = encode(map,
                            dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                            static_cast<cuuint32_t>(rank), const_cast<void*>(data), global_dim, global_stride, box,
                            element_stride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return {StatusCode::kInternal, "tensor map: cuTensorMapEncodeTiled failed with CUresult " + std::to_string(r)};
  return {};
}

}  // namespace tma_detail

// A row-major [rows, cols] matrix of 16-bit elements, row_stride in elements; coordinates
// (col, row). Box: box_rows x 64.
inline Status make_matrix_tensor_map(CUtensorMap* map, DType dtype, const void* data, int64_t rows, int64_t cols,
                                     int64_t row_stride, int box_rows) {
  const int64_t dims[2] = {cols, rows};
  const int64_t byte_strides[1] = {row_stride * 2};
  static const char* const names[] = {"cols", "rows", "row_stride"};
  return tma_detail::encode_sw128(map, dtype, data, 2, dims, byte_strides, box_rows, names);
}

// A [batch, seqlen, heads, dim] tensor of 16-bit elements (dim contiguous; strides in elements, as in
// ForwardParams); coordinates (col, row, head, batch). Box: box_rows x 64 of one head of one batch
// entry. dim need not be a multiple of 64: the columns past it read as zeros.
inline Status make_attention_tensor_map(CUtensorMap* map, DType dtype, const void* data, int64_t batch, int64_t seqlen,
                                        int64_t heads, int64_t dim, int64_t batch_stride, int64_t row_stride,
                                        int64_t head_stride, int box_rows) {
  const int64_t dims[4] = {dim, seqlen, heads, batch};
  const int64_t byte_strides[3] = {row_stride * 2, head_stride * 2, batch_stride * 2};
  static const char* const names[] = {"dim", "seqlen", "heads", "batch", "row_stride", "head_stride", "batch_stride"};
  return tma_detail::encode_sw128(map, dtype, data, 4, dims, byte_strides, box_rows, names);
}

// A [rows, heads, dim] tensor of packed sequences (dim contiguous; strides in elements), seen as
// four dimensions (col, i, row0, head) with element (c, i, r, h) at row i + r: i counts the box's
// rows, with size box_rows, and row0 is the row the box's i = 0 sits at, with size rows. TMA bounds
// each coordinate by its own dimension, so a box loaded at (col, i0 < 0, row0, head) reads zeros
// for its first -i0 rows, whatever lies before row0 in memory: a sequence's box that starts before
// its first row (row0 = that row, i0 = the start's offset from it) holds no row of the sequence
// before it. Rows past `rows` read as zeros too (row0 + i, i < box_rows, stays inside the tensor
// when the caller's boxes end at a sequence's end).
inline Status make_packed_rows_tensor_map(CUtensorMap* map, DType dtype, const void* data, int64_t rows, int64_t heads,
                                          int64_t dim, int64_t row_stride, int64_t head_stride, int box_rows) {
  const int64_t dims[4] = {dim, box_rows, rows, heads};
  const int64_t byte_strides[3] = {row_stride * 2, row_stride * 2, head_stride * 2};
  static const char* const names[] = {"dim", "box_rows", "rows", "heads", "row_stride", "row_stride", "head_stride"};
  return tma_detail::encode_sw128(map, dtype, data, 4, dims, byte_strides, box_rows, names);
}

}  // namespace flashattn::cuda::sm90
