#include "kernels/common/dtype.h"

#include <cmath>

#include "gtest/gtest.h"

namespace tandem {
namespace {

TEST(DTypeTest, Bf16RoundTripsAndRoundsToNearestEven) {
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f)), 1.0f);
  EXPECT_EQ(Bf16ToF32(F32ToBf16(-2.5f)), -2.5f);
  // 1 + 2^-8 lies exactly between two bf16 values (1 and 1 + 2^-7): ties go to even (1).
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(NAN))));
}

TEST(DTypeTest, F16KnownValues) {
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(F16ToF32(0x7c00)));
  for (uint32_t v = 0; v < 0x7c00; ++v) {
    ASSERT_EQ(F32ToF16(F16ToF32(static_cast<uint16_t>(v))), v) << v;
    ASSERT_EQ(F32ToF16(F16ToF32(static_cast<uint16_t>(v | 0x8000))), v | 0x8000) << v;
  }
}

TEST(DTypeTest, Fp8E4M3KnownValues) {
  EXPECT_EQ(F8E4M3ToF32(0x7e), 448.0f);
  EXPECT_EQ(F8E4M3ToF32(0xfe), -448.0f);
  EXPECT_EQ(F8E4M3ToF32(0x38), 1.0f);
  EXPECT_EQ(F8E4M3ToF32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(F8E4M3ToF32(0x08), std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(F8E4M3ToF32(0x7f)));
  EXPECT_TRUE(std::isnan(F8E4M3ToF32(0xff)));
  for (int v = 0; v < 0x7f; ++v) {
    ASSERT_EQ(F32ToF8E4M3(F8E4M3ToF32(static_cast<uint8_t>(v))), v) << v;
  }
  EXPECT_EQ(F32ToF8E4M3(1000.0f), 0x7e);  // saturates
  EXPECT_EQ(F32ToF8E4M3(-1000.0f), 0xfe);
  // 1.0625 lies between 1 (0x38) and 1.125 (0x39): ties to even.
  EXPECT_EQ(F32ToF8E4M3(1.0625f), 0x38);
  EXPECT_EQ(F32ToF8E4M3(1.07f), 0x39);
}

}  // namespace
}  // namespace tandem
