// cpu_forward: scratch layout and run-time ISA dispatch of the flash forward; the portable
// instantiation lives here, the vector ones in forward.avx2.cpp / forward.avx512.cpp.
#include "cpu/forward.hpp"

#include <algorithm>

#include "core/backends.hpp"
#include "core/problem.hpp"
#include "cpu/forward_impl.hpp"
#include "cpu/isa.hpp"

namespace flashattn::detail {
namespace cpu {
namespace {

// Appends `bytes` to a 64-byte aligned bump layout and returns the slice's offset.
size_t take(size_t* total, size_t bytes) {
  const size_t at = *total;
  *total += (bytes + 63) / 64 * 64;
  return at;
}

}  // namespace

ForwardScratch flash_forward_scratch(const ForwardParams& p) {
  const Dims dims = resolve_dims(p);
  const size_t d = static_cast<size_t>(dims.head_dim), f = sizeof(float);
  ForwardScratch L{};
  L.ldo = (dims.head_dim_v + 15) / 16 * 16;
  const size_t ldo = static_cast<size_t>(L.ldo), br = kMaxBr, bc = kBc;
  const bool widen = p.dtype != DType::kFloat32;
  size_t total = 0;
  L.qt = take(&total, d * br * f);
  L.o = take(&total, br * ldo * f);
  L.m = take(&total, br * f);
  L.l = take(&total, br * f);
  L.alpha = take(&total, br * f);
  L.vis_lo = take(&total, br * sizeof(int64_t));
  L.vis_hi = take(&total, br * sizeof(int64_t));
  L.tile_bytes = total;
  total *= kQueryTilesPerTask;
  L.st = take(&total, bc * br * f);
  L.kbuf = take(&total, widen ? bc * d * f : 0);
  L.vbuf = take(&total, widen ? bc * ldo * f : 0);
  L.row_buf = take(&total, std::max(d, ldo) * f);
  const bool pairs = p.dtype == DType::kBFloat16;
  L.p2 = take(&total, pairs ? (bc + 1) / 2 * br * sizeof(uint32_t) : 0);
  L.v2 = take(&total, pairs ? (bc + 1) / 2 * ldo * sizeof(uint32_t) : 0);
  L.bytes = total;
  return L;
}

void flash_forward_portable(const ForwardParams& p, void* workspace, int threads) {
  flash_forward<simd::Portable>(p, workspace, threads);
}

}  // namespace cpu

size_t cpu_forward_workspace(const ForwardParams& p, int threads) {
  return static_cast<size_t>(threads) * cpu::flash_forward_scratch(p).bytes;
}

void cpu_forward(const ForwardParams& p, void* workspace, int threads) {
  const CpuFeatures f = cpu_features();
  switch (f.isa) {
    case CpuIsa::kAvx512: cpu::flash_forward_avx512(p, workspace, threads, f.avx512_bf16); break;
    case CpuIsa::kAvx2: cpu::flash_forward_avx2(p, workspace, threads); break;
    case CpuIsa::kPortable: cpu::flash_forward_portable(p, workspace, threads); break;
  }
}

}  // namespace flashattn::detail
