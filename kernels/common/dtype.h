// Element types of weights and activations, and exact scalar conversions between them.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string_view>

namespace tandem {

enum class DType : uint8_t {
  kF32,
  kBF16,
  kF16,
  kF8E4M3,  // OCP FP8 E4M3 "fn": no infinities, 0x7f/0xff are NaN, max 448.
  // Stored types that are not weights by themselves: block scales (an exponent only,
  // 2^(e - 127); 0xff is NaN), packed FP4 pairs (I8/U8) and index tables (I32/I64).
  // Safetensors readers accept them only when asked to (safetensors.h).
  kF8E8M0,
  kI8,
  kU8,
  kI32,
  kI64,
};

constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kF8E4M3: return 1;
    case DType::kF8E8M0: return 1;
    case DType::kI8: return 1;
    case DType::kU8: return 1;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
  }
  return 0;
}

// Safetensors' spelling of each type ("F32", "BF16", "F16", "F8_E4M3", "F8_E8M0", "I8",
// "U8", "I32", "I64").
std::string_view DTypeName(DType t);

inline float Bf16ToF32(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as PyTorch does; NaN stays a quiet NaN.
inline uint16_t F32ToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float F16ToF32(uint16_t v);
uint16_t F32ToF16(float f);

// FP8 E4M3 (fn variant) to float: exact, through a 256-entry table.
float F8E4M3ToF32(uint8_t v);
// Round to nearest even, saturating at ±448; NaN maps to 0x7f.
uint8_t F32ToF8E4M3(float f);
const float* F8E4M3Table();  // 256 entries

// An E8M0 scale byte (OCP MX): 2^(v - 127), exact; 0xff is NaN.
inline float F8E8M0ToF32(uint8_t v) {
  if (v == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(v) - 127);
}

}  // namespace tandem
