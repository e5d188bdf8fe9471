// standard_forward: scratch layout and run-time ISA dispatch of the fp32 baseline; the portable
// instantiation lives here, the vector ones in standard_forward.avx2.cpp / .avx512.cpp.
#include "core/backends.hpp"
#include "core/problem.hpp"
#include "cpu/forward.hpp"
#include "cpu/isa.hpp"
#include "cpu/standard_forward_impl.hpp"

namespace flashattn::detail {
namespace cpu {

StandardScratch standard_forward_scratch(const ForwardParams& p) {
  const Dims dims = resolve_dims(p);
  StandardScratch L{};
  ForwardParams fp32 = p;  // the panel scratch never widens K/V tiles: whole heads are widened here
  fp32.dtype = DType::kFloat32;
  L.panel = flash_forward_scratch(fp32);
  // Room for whole query panels of any ISA's Br (<= kMaxBr): round_up(seqlen_q, Br) <= this.
  L.lds = (dims.seqlen_q + kMaxBr - 1 + 15) / 16 * 16;
  auto round64 = [](size_t bytes) { return (bytes + 63) / 64 * 64; };
  const size_t sk = static_cast<size_t>(dims.seqlen_k), f = sizeof(float);
  const bool widen = p.dtype != DType::kFloat32;
  size_t total = L.panel.bytes;
  L.s = total;
  total += round64(sk * static_cast<size_t>(L.lds) * f);
  L.kbuf = total;
  total += widen ? round64(sk * static_cast<size_t>(dims.head_dim) * f) : 0;
  L.vbuf = total;
  total += widen ? round64(sk * static_cast<size_t>(L.panel.ldo) * f) : 0;
  L.bytes = total;
  return L;
}

void standard_forward_portable(const ForwardParams& p, void* workspace, int threads) {
  standard_forward<simd::Portable>(p, workspace, threads);
}

}  // namespace cpu

size_t standard_forward_workspace(const ForwardParams& p, int threads) {
  return static_cast<size_t>(threads) * cpu::standard_forward_scratch(p).bytes;
}

void standard_forward(const ForwardParams& p, void* workspace, int threads) {
  switch (cpu_features().isa) {
    case CpuIsa::kAvx512: cpu::standard_forward_avx512(p, workspace, threads); break;
    case CpuIsa::kAvx2: cpu::standard_forward_avx2(p, workspace, threads); break;
    case CpuIsa::kPortable: cpu::standard_forward_portable(p, workspace, threads); break;
  }
}

}  // namespace flashattn::detail
