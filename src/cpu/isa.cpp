#include "cpu/isa.hpp"

#include <cpuid.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace flashattn::detail {
namespace {

uint64_t xgetbv0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool fma = c & bit_FMA, f16c = c & bit_F16C, osxsave = c & bit_OSXSAVE, avx = c & bit_AVX;
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = xgetbv0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;    // SSE + AVX state
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  if (!ymm_state || __get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = b & bit_AVX2;
  const bool avx512 = (b & bit_AVX512F) && (b & bit_AVX512BW) && (b & bit_AVX512VL) && (b & bit_AVX512DQ);
  if (avx2 && fma && f16c) f.isa = CpuIsa::kAvx2;
  if (f.isa == CpuIsa::kAvx2 && avx512 && zmm_state) {
    f.isa = CpuIsa::kAvx512;
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512_bf16 = a & (1u << 5);
  }
  return f;
}

CpuFeatures with_override(CpuFeatures f) {
  const char* env = std::getenv("FLASHATTN_CPU_ISA");
  if (env == nullptr) return f;
  auto lower_to = [&f](CpuIsa isa) {
    if (isa < f.isa) f.isa = isa;
    if (f.isa != CpuIsa::kAvx512) f.avx512_bf16 = false;
  };
  if (std::strcmp(env, "portable") == 0) lower_to(CpuIsa::kPortable);
  else if (std::strcmp(env, "avx2") == 0) lower_to(CpuIsa::kAvx2);
  else if (std::strcmp(env, "avx512-nobf16") == 0) f.avx512_bf16 = false;
  return f;
}

}  // namespace

CpuFeatures cpu_features() {
  static const CpuFeatures detected = detect();
  return with_override(detected);
}

const char* to_string(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kPortable: return "portable";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "unknown";
}

}  // namespace flashattn::detail
