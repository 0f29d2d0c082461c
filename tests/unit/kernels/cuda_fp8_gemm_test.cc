// Fp8Gemm and Fp8QuantizeRows (kernels/cuda/fp8_gemm.h).
//
// Exactness where it is possible: the quantizer against the host's e4m3 rounding of the same
// float32 quotient, bit for bit; the GEMM on small-integer codes, whose 128-wide block sums
// are exact in any accumulator, against the host doing the kernel's float32 steps (scale
// product, one fused multiply-add per k block, in block order), bit for bit. Then realistic
// data (normal activations through the quantizer, normal block-scaled weights) against a
// float64 sum, within the tensor cores' FP8 accumulation error. Skips where no GPU is usable
// or the device is not a Hopper.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/dtype.h"
#include "kernels/cuda/fp8_gemm.h"
#include "tests/unit/kernels/cuda_test_support.h"

namespace tandem {
namespace {

using testing::Dev;

constexpr int kBlock = 128;

int Blocks(int n) { return (n + kBlock - 1) / kBlock; }

class Fp8Test : public testing::GpuTest {
 protected:
  void SetUp() override {
    testing::GpuTest::SetUp();
    if (IsSkipped()) return;
    if (!cuda::Fp8GemmSupported()) GTEST_SKIP() << "Fp8Gemm runs on sm_90 only";
  }
};

struct QuantCase {
  int m, k;
  bool bf16;
};

class Fp8QuantizeTest : public Fp8Test, public ::testing::WithParamInterface<QuantCase> {};

TEST_P(Fp8QuantizeTest, EqualsTheHostRoundingBitwise) {
  const QuantCase c = GetParam();
  const int64_t ldx = c.k + 8, ldq = c.k + 16, stride = c.m + 3;
  std::vector<float> x = testing::NormalValues(static_cast<size_t>(c.m) * ldx, 1.0f, 7);
  // Outliers (one column far larger than the rest of its block), an all-zero block, tiny values.
  for (int i = 0; i < c.m; i += 5) x[static_cast<size_t>(i) * ldx + (i * 37) % c.k] = 300.0f * (i % 2 ? -1 : 1);
  for (int col = 0; col < std::min(c.k, kBlock); ++col) x[col] = 0.0f;
  if (c.m > 1) {
    for (int col = 0; col < c.k; ++col) x[ldx + col] *= 1e-6f;
  }
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = F32ToBf16(x[i]);
    if (c.bf16) x[i] = Bf16ToF32(xb[i]);
  }
  Dev<float> dx(x);
  Dev<uint16_t> dxb(xb);
  Dev<uint8_t> dq(static_cast<size_t>(c.m) * ldq);
  Dev<float> ds(static_cast<size_t>(Blocks(c.k)) * stride);
  ASSERT_EQ(cuda::Fp8QuantizeRows({.x = c.bf16 ? static_cast<const void*>(dxb.get()) : dx.get(), .x_bf16 = c.bf16,
                                   .ldx = ldx, .q = dq.get(), .ldq = ldq, .scales = ds.get(), .scales_stride = stride,
                                   .m = c.m, .k = c.k},
                                  nullptr),
            cudaSuccess);
  const std::vector<uint8_t> q = dq.Download();
  const std::vector<float> s = ds.Download();
  int bad_scales = 0, bad_codes = 0, touched = 0;
  for (int i = 0; i < c.m; ++i) {
    for (int b = 0; b < Blocks(c.k); ++b) {
      float amax = 0.0f;
      for (int col = b * kBlock; col < std::min(c.k, (b + 1) * kBlock); ++col) {
        amax = std::max(amax, std::fabs(x[static_cast<size_t>(i) * ldx + col]));
      }
      const float scale = std::max(amax, 1e-4f) / 448.0f;
      bad_scales += std::memcmp(&s[static_cast<size_t>(b) * stride + i], &scale, 4) != 0;
      for (int col = b * kBlock; col < std::min(c.k, (b + 1) * kBlock); ++col) {
        bad_codes += q[static_cast<size_t>(i) * ldq + col] != F32ToF8E4M3(x[static_cast<size_t>(i) * ldx + col] / scale);
      }
    }
    for (int64_t col = c.k; col < ldq; ++col) touched += q[static_cast<size_t>(i) * ldq + col] != 0xff;
  }
  EXPECT_EQ(bad_scales, 0);
  EXPECT_EQ(bad_codes, 0);
  EXPECT_EQ(touched, 0) << "bytes past k written";
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8QuantizeTest,
                         ::testing::Values(QuantCase{1, 128, true}, QuantCase{77, 1408, true},
                                           QuantCase{33, 144, false}, QuantCase{300, 2048, false},
                                           QuantCase{5, 7168, true}));

struct GemmCase {
  int m, n, k;
  enum Out { kBf16, kF32, kF32Accumulate } out;
};

// Codes, scales and strides of one product.
struct Operands {
  int64_t lda, ldb, ldy, a_stride;
  std::vector<uint8_t> a, b;
  std::vector<float> sa, sb;
};

Operands MakeOperands(const GemmCase& c, bool small_integers, uint32_t seed) {
  Operands o;
  o.lda = c.k + 16;
  o.ldb = c.k + 32;
  o.ldy = c.n + 6;
  o.a_stride = c.m + 4;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-4, 4);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto code = [&] { return small_integers ? F32ToF8E4M3(static_cast<float>(small(rng))) : F32ToF8E4M3(normal(rng) * 100.0f); };
  o.a.assign(static_cast<size_t>(c.m) * o.lda, 0x7f);  // NaN past k: must not be read
  o.b.assign(static_cast<size_t>(c.n) * o.ldb, 0x7f);
  for (int i = 0; i < c.m; ++i) {
    for (int col = 0; col < c.k; ++col) o.a[static_cast<size_t>(i) * o.lda + col] = code();
  }
  for (int j = 0; j < c.n; ++j) {
    for (int col = 0; col < c.k; ++col) o.b[static_cast<size_t>(j) * o.ldb + col] = code();
  }
  std::uniform_real_distribution<float> scale(0.25f, 2.0f);
  o.sa.assign(static_cast<size_t>(Blocks(c.k)) * o.a_stride, 0.0f);
  for (float& v : o.sa) v = scale(rng) / 64.0f;
  o.sb.assign(static_cast<size_t>(Blocks(c.n)) * Blocks(c.k), 0.0f);
  for (float& v : o.sb) v = scale(rng) / 128.0f;
  return o;
}

// y as the kernel leaves it (its padding columns included), y0 the values it started from.
struct Result {
  std::vector<float> y, y0;
  std::vector<uint16_t> y_bf16;
};

Result RunGemm(const GemmCase& c, const Operands& o, bool wide) {
  Dev<uint8_t> da(o.a), db(o.b);
  Dev<float> dsa(o.sa), dsb(o.sb);
  Result r;
  r.y0 = testing::NormalValues(static_cast<size_t>(c.m) * o.ldy, 1.0f, 11);
  Dev<float> dy(r.y0);
  Dev<uint16_t> dyb(static_cast<size_t>(c.m) * o.ldy);
  const bool bf16 = c.out == GemmCase::kBf16;
  EXPECT_EQ(cuda::Fp8Gemm({.a = da.get(), .lda = o.lda, .a_scales = dsa.get(), .a_scales_stride = o.a_stride,
                           .b = db.get(), .ldb = o.ldb, .b_scales = dsb.get(),
                           .y = bf16 ? static_cast<void*>(dyb.get()) : dy.get(), .ldy = o.ldy, .y_bf16 = bf16,
                           .accumulate = c.out == GemmCase::kF32Accumulate, .m = c.m, .n = c.n, .k = c.k,
                           .wide_tiles = wide},
                          nullptr),
            cudaSuccess);
  r.y = dy.Download();
  r.y_bf16 = dyb.Download();
  return r;
}

class Fp8GemmTest : public Fp8Test, public ::testing::WithParamInterface<GemmCase> {};

// Block sums of products of integers in [-4, 4] are at most 2048 in magnitude: exact on the
// tensor cores whatever they keep of float32's mantissa, so every output is determined.
TEST_P(Fp8GemmTest, SmallIntegerCodesEqualTheKernelsFloatStepsBitwise) {
  const GemmCase c = GetParam();
  const Operands o = MakeOperands(c, /*small_integers=*/true, 5);
  // The kernel's float32 steps on the host, once for both tile shapes.
  const int kb_count = Blocks(c.k);
  std::vector<float> sums(static_cast<size_t>(c.m) * c.n);
  for (int i = 0; i < c.m; ++i) {
    for (int j = 0; j < c.n; ++j) {
      float acc = 0.0f;
      for (int kb = 0; kb < kb_count; ++kb) {
        float block = 0.0f;  // exact: integers below 2^24
        for (int col = kb * kBlock; col < std::min(c.k, (kb + 1) * kBlock); ++col) {
          block += F8E4M3ToF32(o.a[static_cast<size_t>(i) * o.lda + col]) * F8E4M3ToF32(o.b[static_cast<size_t>(j) * o.ldb + col]);
        }
        const float s = o.sa[static_cast<size_t>(kb) * o.a_stride + i] * o.sb[static_cast<size_t>(j / kBlock) * kb_count + kb];
        acc = std::fmaf(block, s, acc);
      }
      sums[static_cast<size_t>(i) * c.n + j] = acc;
    }
  }
  for (bool wide : {false, true}) {
    SCOPED_TRACE(wide ? "128 x 256 tiles" : "128 x 128 tiles");
    const Result r = RunGemm(c, o, wide);
    int mismatches = 0;
    for (int i = 0; i < c.m; ++i) {
      for (int j = 0; j < c.n; ++j) {
        const float acc = sums[static_cast<size_t>(i) * c.n + j];
        const size_t at = static_cast<size_t>(i) * o.ldy + j;
        bool bad;
        float got, want;
        if (c.out == GemmCase::kBf16) {
          bad = r.y_bf16[at] != F32ToBf16(acc);
          got = Bf16ToF32(r.y_bf16[at]);
          want = Bf16ToF32(F32ToBf16(acc));
        } else {
          want = c.out == GemmCase::kF32Accumulate ? r.y0[at] + acc : acc;
          got = r.y[at];
          bad = std::memcmp(&got, &want, 4) != 0;
        }
        if (bad && mismatches < 8) ADD_FAILURE() << "y[" << i << "][" << j << "] = " << got << ", want " << want;
        mismatches += bad;
      }
    }
    EXPECT_EQ(mismatches, 0) << "of " << c.m * c.n;
    // Columns past n are left alone.
    int touched = 0;
    for (int i = 0; i < c.m; ++i) {
      for (int64_t j = c.n; j < o.ldy; ++j) {
        const size_t at = static_cast<size_t>(i) * o.ldy + j;
        touched += c.out == GemmCase::kBf16 ? r.y_bf16[at] != 0xffff : std::memcmp(&r.y[at], &r.y0[at], 4) != 0;
      }
    }
    EXPECT_EQ(touched, 0);
  }
}

// Normal codes spanning e4m3's range: within the FP8 accumulation's error of a float64 sum.
TEST_P(Fp8GemmTest, NormalCodesWithinTheAccumulationErrorOfFloat64) {
  const GemmCase c = GetParam();
  if (c.out != GemmCase::kF32) GTEST_SKIP() << "float32 output only";
  const Operands o = MakeOperands(c, /*small_integers=*/false, 9);
  const Result r = RunGemm(c, o, /*wide=*/c.n > 256);
  const int kb_count = Blocks(c.k);
  double err2 = 0.0, ref2 = 0.0, worst = 0.0;
  int outside = 0;
  for (int i = 0; i < c.m; ++i) {
    for (int j = 0; j < c.n; ++j) {
      double ref = 0.0, magnitude = 0.0;
      for (int kb = 0; kb < kb_count; ++kb) {
        double block = 0.0, block_abs = 0.0;
        for (int col = kb * kBlock; col < std::min(c.k, (kb + 1) * kBlock); ++col) {
          const double t = static_cast<double>(F8E4M3ToF32(o.a[static_cast<size_t>(i) * o.lda + col])) *
                           F8E4M3ToF32(o.b[static_cast<size_t>(j) * o.ldb + col]);
          block += t;
          block_abs += std::fabs(t);
        }
        const double s = static_cast<double>(o.sa[static_cast<size_t>(kb) * o.a_stride + i]) *
                         o.sb[static_cast<size_t>(j / kBlock) * kb_count + kb];
        ref += block * s;
        magnitude += block_abs * s;
      }
      const double got = r.y[static_cast<size_t>(i) * o.ldy + j];
      const double e = std::fabs(got - ref);
      err2 += e * e;
      ref2 += ref * ref;
      // 2^-12 of the terms' magnitudes: the tensor cores keep about 13 bits of each block's
      // running sum (a wrong block or scale is off by whole terms). Measured on an H100:
      // at most 0.084 of 2^-10, i.e. under 2^-13.
      const double bound = magnitude * std::ldexp(1.0, -12) + 1e-30;
      worst = std::max(worst, e / bound);
      outside += e > bound;
    }
  }
  const double relative = std::sqrt(err2 / std::max(ref2, 1e-300));
  std::printf("m %d n %d k %d: relative L2 error %.3g, worst error / bound %.3g\n", c.m, c.n, c.k, relative, worst);
  EXPECT_EQ(outside, 0);
  EXPECT_LT(relative, 2e-3);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8GemmTest,
    ::testing::Values(GemmCase{1, 128, 128, GemmCase::kF32}, GemmCase{77, 576, 2048, GemmCase::kBf16},
                      GemmCase{128, 128, 1408, GemmCase::kF32}, GemmCase{200, 300, 144, GemmCase::kF32Accumulate},
                      GemmCase{256, 1536, 512, GemmCase::kBf16}, GemmCase{333, 2048, 7168, GemmCase::kF32},
                      GemmCase{1100, 640, 256, GemmCase::kF32Accumulate}, GemmCase{513, 200, 2048, GemmCase::kF32}));

// Grouped: rows sorted by group (empty groups, one row, ragged tails), each group its own
// matrix; block scales per group, or row scales with the even/odd octet structure of the
// experts' interleaved gate_up. Small-integer codes: bitwise against the kernel's float32
// steps, each row with its own group's matrix and scales.
struct GroupedCase {
  std::vector<int> rows;  // per group
  int n, k;
  bool row_scales;
};

class Fp8GroupedGemmTest : public Fp8Test, public ::testing::WithParamInterface<GroupedCase> {};

TEST_P(Fp8GroupedGemmTest, EachRowUsesItsGroupsMatrixBitwise) {
  const GroupedCase c = GetParam();
  const int groups = static_cast<int>(c.rows.size());
  std::vector<int32_t> offsets = {0};
  for (int r : c.rows) offsets.push_back(offsets.back() + r);
  const int m = offsets.back() + 5;  // capacity past the last group's rows
  const int kb_count = Blocks(c.k), nb_count = Blocks(c.n);
  const int64_t lda = c.k, ldb = c.k + 16, ldy = c.n + 2, a_stride = m;
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> small(-4, 4);
  auto code = [&] { return F32ToF8E4M3(static_cast<float>(small(rng))); };
  std::vector<uint8_t> a(static_cast<size_t>(m) * lda), b(static_cast<size_t>(groups) * c.n * ldb, 0x7f);
  for (uint8_t& v : a) v = code();
  for (int g = 0; g < groups; ++g) {
    for (int j = 0; j < c.n; ++j) {
      for (int col = 0; col < c.k; ++col) b[(static_cast<size_t>(g) * c.n + j) * ldb + col] = code();
    }
  }
  std::uniform_real_distribution<float> scale(0.25f, 2.0f);
  std::vector<float> sa(static_cast<size_t>(kb_count) * a_stride);
  for (float& v : sa) v = scale(rng) / 64.0f;
  // Scale of (group, row j of b, k block): per 128-row block and octet parity.
  std::vector<float> block_scale(static_cast<size_t>(groups) * nb_count * 2 * kb_count);
  for (float& v : block_scale) v = scale(rng) / 128.0f;
  auto sb = [&](int g, int j, int kb) {
    const int parity = c.row_scales ? (j / 8) % 2 : 0;
    return block_scale[((static_cast<size_t>(g) * nb_count + j / kBlock) * 2 + parity) * kb_count + kb];
  };
  std::vector<float> b_scales;
  if (c.row_scales) {
    for (int g = 0; g < groups; ++g) {
      for (int j = 0; j < c.n; ++j) {
        for (int kb = 0; kb < kb_count; ++kb) b_scales.push_back(sb(g, j, kb));
      }
    }
  } else {
    for (int g = 0; g < groups; ++g) {
      for (int nb = 0; nb < nb_count; ++nb) {
        for (int kb = 0; kb < kb_count; ++kb) b_scales.push_back(sb(g, nb * kBlock, kb));
      }
    }
  }
  Dev<uint8_t> da(a), db(b);
  Dev<float> dsa(sa), dsb(b_scales);
  Dev<int32_t> doff(offsets);
  for (bool wide : {false, true}) {
    SCOPED_TRACE(wide ? "128 x 256 tiles" : "128 x 128 tiles");
    Dev<float> dy(static_cast<size_t>(m) * ldy);
    ASSERT_EQ(cuda::Fp8Gemm({.a = da.get(), .lda = lda, .a_scales = dsa.get(), .a_scales_stride = a_stride,
                             .b = db.get(), .ldb = ldb, .b_scales = dsb.get(), .y = dy.get(), .ldy = ldy,
                             .y_bf16 = false, .m = m, .n = c.n, .k = c.k, .groups = groups,
                             .group_offsets = doff.get(), .b_row_scales = c.row_scales, .wide_tiles = wide},
                            nullptr),
              cudaSuccess);
    const std::vector<float> y = dy.Download();
    int mismatches = 0, touched = 0;
    for (int g = 0; g < groups; ++g) {
      for (int i = offsets[g]; i < offsets[g + 1]; ++i) {
        for (int j = 0; j < c.n; ++j) {
          float acc = 0.0f;
          for (int kb = 0; kb < kb_count; ++kb) {
            float block = 0.0f;
            for (int col = kb * kBlock; col < std::min(c.k, (kb + 1) * kBlock); ++col) {
              block += F8E4M3ToF32(a[static_cast<size_t>(i) * lda + col]) *
                       F8E4M3ToF32(b[(static_cast<size_t>(g) * c.n + j) * ldb + col]);
            }
            acc = std::fmaf(block, sa[static_cast<size_t>(kb) * a_stride + i] * sb(g, j, kb), acc);
          }
          const float got = y[static_cast<size_t>(i) * ldy + j];
          const bool bad = std::memcmp(&got, &acc, 4) != 0;
          if (bad && mismatches < 8) {
            ADD_FAILURE() << "group " << g << " y[" << i << "][" << j << "] = " << got << ", want " << acc;
          }
          mismatches += bad;
        }
      }
    }
    // Rows past the last group are not written (still the 0xff poison).
    for (int64_t at = static_cast<int64_t>(offsets.back()) * ldy; at < static_cast<int64_t>(y.size()); ++at) {
      uint32_t bits;
      std::memcpy(&bits, &y[static_cast<size_t>(at)], 4);
      touched += bits != 0xffffffffu;
    }
    EXPECT_EQ(mismatches, 0);
    EXPECT_EQ(touched, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8GroupedGemmTest,
                         ::testing::Values(GroupedCase{{0, 1, 200, 128, 0, 333}, 256, 512, true},
                                           GroupedCase{{7, 0, 0, 129}, 200, 1408, false},
                                           GroupedCase{{300}, 384, 256, true},
                                           GroupedCase{std::vector<int>(66, 40), 256, 256, true}));

TEST_F(Fp8Test, RefusesWhatItCannotRead) {
  Dev<uint8_t> a(1 << 16), b(1 << 16);
  Dev<float> s(1 << 10), y(1 << 14);
  const cuda::Fp8GemmParams good{.a = a.get(), .lda = 128, .a_scales = s.get(), .a_scales_stride = 8, .b = b.get(),
                                 .ldb = 128, .b_scales = s.get(), .y = y.get(), .ldy = 128, .y_bf16 = false,
                                 .m = 8, .n = 128, .k = 128};
  EXPECT_EQ(cuda::Fp8Gemm(good, nullptr), cudaSuccess);
  auto with = [&](auto change) {
    cuda::Fp8GemmParams p = good;
    change(p);
    return cuda::Fp8Gemm(p, nullptr);
  };
  EXPECT_EQ(with([](auto& p) { p.k = 120; }), cudaErrorInvalidValue);           // k not a multiple of 16
  EXPECT_EQ(with([](auto& p) { p.lda = 136; }), cudaErrorInvalidValue);         // row stride not 16-byte
  EXPECT_EQ(with([](auto& p) { p.a_scales_stride = 7; }), cudaErrorInvalidValue);
  EXPECT_EQ(with([](auto& p) { p.ldy = 127; }), cudaErrorInvalidValue);
  EXPECT_EQ(with([](auto& p) { p.y_bf16 = true, p.accumulate = true; }), cudaErrorInvalidValue);
  EXPECT_EQ(with([&](auto& p) { p.a = a.get() + 8; }), cudaErrorInvalidValue);  // misaligned
  EXPECT_EQ(with([](auto& p) { p.groups = 2; }), cudaErrorInvalidValue);          // no offsets
  EXPECT_EQ(with([](auto& p) { p.groups = cuda::kFp8GemmMaxGroups + 1; }), cudaErrorInvalidValue);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace tandem
