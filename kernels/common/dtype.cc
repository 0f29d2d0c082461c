#include "kernels/common/dtype.h"

#include <array>
#include <limits>

namespace tandem {

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF8E4M3: return "F8_E4M3";
    case DType::kF8E8M0: return "F8_E8M0";
    case DType::kI8: return "I8";
    case DType::kU8: return "U8";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
  }
  return "?";
}

float F16ToF32(uint16_t v) {
  const uint32_t sign = (v >> 15) & 1u;
  const uint32_t exp = (v >> 10) & 0x1fu;
  const uint32_t mant = v & 0x3ffu;
  float mag;
  if (exp == 0) {
    mag = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    mag = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    mag = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -mag : mag;
}

uint16_t F32ToF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to infinity
  if (a < std::ldexp(1.0f, -14)) {
    // Subnormal: units of 2^-24, round to nearest even.
    const float units = a * 16777216.0f;
    return sign | static_cast<uint16_t>(std::nearbyint(units));
  }
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  // 11 significant bits: mantissa units of 2^(e-11).
  float scaled = std::nearbyint(std::ldexp(m, 11));
  if (scaled >= 2048.0f) {
    scaled /= 2.0f;
    ++e;
  }
  const uint32_t exp_field = static_cast<uint32_t>(e - 1 + 15);
  if (exp_field >= 31) return sign | 0x7c00u;
  return sign | static_cast<uint16_t>((exp_field << 10) | (static_cast<uint32_t>(scaled) & 0x3ffu));
}

namespace {

std::array<float, 256> MakeF8Table() {
  std::array<float, 256> t{};
  for (int i = 0; i < 256; ++i) {
    const int sign = (i >> 7) & 1;
    const int exp = (i >> 3) & 0xf;
    const int mant = i & 7;
    float mag;
    if (exp == 0xf && mant == 7) {
      mag = std::numeric_limits<float>::quiet_NaN();
    } else if (exp == 0) {
      mag = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant/8 * 2^-6
    } else {
      mag = std::ldexp(static_cast<float>(8 + mant), exp - 10);  // (1 + mant/8) * 2^(exp-7)
    }
    t[i] = sign ? -mag : mag;
  }
  return t;
}

const std::array<float, 256> kF8Table = MakeF8Table();

}  // namespace

const float* F8E4M3Table() { return kF8Table.data(); }
float F8E4M3ToF32(uint8_t v) { return kF8Table[v]; }

uint8_t F32ToF8E4M3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate to max finite
  // Nearest-even among the 127 non-negative finite codes: binary search by value.
  int lo = 0, hi = 0x7e;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (kF8Table[mid] <= a) lo = mid; else hi = mid - 1;
  }
  int best = lo;
  if (lo < 0x7e) {
    const float below = kF8Table[lo], above = kF8Table[lo + 1];
    const float d_below = a - below, d_above = above - a;
    if (d_above < d_below || (d_above == d_below && (lo & 1))) best = lo + 1;
  }
  return sign | static_cast<uint8_t>(best);
}

}  // namespace tandem
