// Run-time CPU feature detection for the CPU backends. Kernels for each level live in
// *.avx512.cpp / *.avx2.cpp files built with that ISA's flags; only code behind a check of
// active_isa() may call into them.
#pragma once

namespace flashattn::detail {

// Ordered: a level implies every level below it.
enum class CpuIsa : int { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

struct CpuFeatures {
  CpuIsa isa = CpuIsa::kPortable;  // AVX2 = AVX2+FMA+F16C; AVX-512 = F+BW+VL+DQ on top of that
  bool avx512_bf16 = false;        // vdpbf16ps / vcvtne2ps2bf16 (only meaningful with kAvx512)
};

// What this CPU supports and the OS enables, lowered by FLASHATTN_CPU_ISA=avx512|avx2|portable
// (read on every call, so tests can switch levels; a request above what the CPU has is ignored).
// FLASHATTN_CPU_ISA=avx512-nobf16 keeps AVX-512 but turns the BF16 dot-product kernels off.
CpuFeatures cpu_features();

const char* to_string(CpuIsa isa);

}  // namespace flashattn::detail
