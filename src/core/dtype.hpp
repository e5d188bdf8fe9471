// Scalar storage-type conversions shared by every backend. Vectorised conversions live with the
// CPU kernels; these are the exact (round-to-nearest-even) definitions they must match.
#pragma once

#include "core/isa_namespace.hpp"

#include <cstdint>
#include <cstring>

#include "flashattn/flashattn.hpp"

namespace flashattn::detail::FLASHATTN_ISA_NS {

inline size_t dtype_size(DType t) { return t == DType::kFloat32 ? 4 : 2; }

inline float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do { ++e; man <<= 1; } while ((man & 0x400u) == 0);
    u = sign | (static_cast<uint32_t>(112 - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_fp16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;             // NaN
  if (u >= 0x477ff000u) return sign | 0x7c00u;            // overflow (>= 65520) to inf
  if (u < 0x38800000u) {                                  // subnormal or zero in fp16
    if (u < 0x33000000u) return sign;                     // below half the smallest subnormal
    const uint32_t exp = u >> 23, man = (u & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;                     // 14..24 - align to 2^-24 units
    uint32_t r = man >> shift;
    const uint32_t rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = u - 0x38000000u;                           // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);                         // round to nearest even
  return sign | static_cast<uint16_t>(r >> 13);
}

inline float load_float(const void* base, DType t, int64_t index) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(base)[index];
    case DType::kFloat16: return fp16_to_float(static_cast<const uint16_t*>(base)[index]);
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(base)[index]);
  }
  return 0.0f;
}

inline void store_float(void* base, DType t, int64_t index, float x) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(base)[index] = x; break;
    case DType::kFloat16: static_cast<uint16_t*>(base)[index] = float_to_fp16(x); break;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[index] = float_to_bf16(x); break;
  }
}

}  // namespace flashattn::detail
