// The FP8 (128 x 128 block scales), FP4 (e2m1, a scale per 32) and bf16 matrix-vector
// products on the GPU against the CPU's dequantization (cpu::DequantizeRows for FP8,
// v4::Fp4E2m1ToF32 for FP4, Bf16ToF32) and a double-precision dot product, over shapes with n and k off the 128
// blocks and 1 to 8 rows. The GPU multiplies a scale into each group's partial sum once,
// so results agree to float32 rounding of the terms (1e-5 of their magnitudes' sum), not
// bitwise. Skips, saying why, where no GPU is usable.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "engine/model/deepseek_v4/v4_weights.h"
#include "gtest/gtest.h"
#include "kernels/common/dtype.h"
#include "kernels/cpu/weight_matrix.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/fp4_tiled.h"
#include "kernels/cuda/quantized_gemv.h"
#include "tests/unit/kernels/cuda_test_support.h"

namespace tandem {
namespace {

using testing::Dev;

class CudaQuantizedGemvTest : public testing::GpuTest {};

const char* Name(cuda::QuantizedWeight f) {
  switch (f) {
    case cuda::QuantizedWeight::kFp8Block128: return "FP8";
    case cuda::QuantizedWeight::kFp4Group32: return "FP4";
    case cuda::QuantizedWeight::kFp4Tiled: return "FP4 tiled";
    case cuda::QuantizedWeight::kBf16: return "bf16";
  }
  return "?";
}

bool Fp4(cuda::QuantizedWeight f) {
  return f == cuda::QuantizedWeight::kFp4Group32 || f == cuda::QuantizedWeight::kFp4Tiled;
}

// Bytes of a plain row (the tiled form is made from the plain one).
int64_t RowBytes(cuda::QuantizedWeight f, int64_t k) {
  return f == cuda::QuantizedWeight::kFp8Block128 ? k : (Fp4(f) ? k / 2 : 2 * k);
}

// What the GPU reads: the tiled rearrangement of FP4 tiled matrices, else the same bytes.
struct Stored {
  std::vector<uint8_t> w;
  std::vector<float> scales;
};
Stored ForGpu(cuda::QuantizedWeight f, const std::vector<uint8_t>& w, const std::vector<float>& scales, int64_t n,
              int64_t k) {
  if (f != cuda::QuantizedWeight::kFp4Tiled) return {w, scales};
  Stored s{std::vector<uint8_t>(static_cast<size_t>(cuda::Fp4TiledCodeBytes(n, k))),
           std::vector<float>(static_cast<size_t>(cuda::Fp4TiledScaleCount(n, k)))};
  cuda::TileFp4(w.data(), scales.data(), n, k, s.w.data(), s.scales.data());
  return s;
}

// Random weight bytes of `format`: no FP8 NaN codes; bf16 values of a normal distribution.
std::vector<uint8_t> RandomWeights(cuda::QuantizedWeight format, int64_t n, int64_t k, std::mt19937& rng) {
  std::vector<uint8_t> w(static_cast<size_t>(n * RowBytes(format, k)));
  if (format == cuda::QuantizedWeight::kBf16) {
    std::normal_distribution<float> normal(0.0f, 0.05f);
    for (size_t i = 0; i < w.size(); i += 2) {
      const uint16_t b = F32ToBf16(normal(rng));
      std::memcpy(&w[i], &b, 2);
    }
    return w;
  }
  for (uint8_t& b : w) {
    b = static_cast<uint8_t>(rng());
    if (format == cuda::QuantizedWeight::kFp8Block128 && (b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
  }
  return w;
}

struct Case {
  cuda::QuantizedWeight format;
  int m;
  int64_t n, k;
};

TEST_F(CudaQuantizedGemvTest, MatchesTheCpusDequantization) {
  const std::vector<Case> cases = {
      {cuda::QuantizedWeight::kFp8Block128, 1, 4096, 4096}, {cuda::QuantizedWeight::kFp8Block128, 4, 300, 7168},
      {cuda::QuantizedWeight::kFp8Block128, 8, 17, 512},    {cuda::QuantizedWeight::kFp8Block128, 3, 1000, 2064},
      {cuda::QuantizedWeight::kFp4Group32, 1, 4096, 4096},  {cuda::QuantizedWeight::kFp4Group32, 6, 300, 2048},
      {cuda::QuantizedWeight::kFp4Group32, 8, 5, 2080},     {cuda::QuantizedWeight::kFp4Group32, 2, 1000, 96},
      {cuda::QuantizedWeight::kBf16, 1, 4096, 4096},        {cuda::QuantizedWeight::kBf16, 5, 129, 1032},
      {cuda::QuantizedWeight::kBf16, 8, 3, 8},              {cuda::QuantizedWeight::kBf16, 2, 24, 16384},
      {cuda::QuantizedWeight::kFp4Tiled, 1, 4096, 4096},    {cuda::QuantizedWeight::kFp4Tiled, 6, 300, 2048},
      {cuda::QuantizedWeight::kFp4Tiled, 8, 5, 2112},       {cuda::QuantizedWeight::kFp4Tiled, 2, 1000, 128},
      {cuda::QuantizedWeight::kFp4Tiled, 3, 33, 7168},
  };
  for (const Case& c : cases) {
    const bool fp8 = c.format == cuda::QuantizedWeight::kFp8Block128, bf16 = c.format == cuda::QuantizedWeight::kBf16;
    SCOPED_TRACE(::testing::Message() << Name(c.format) << " m " << c.m << " n " << c.n << " k " << c.k);
    std::mt19937 rng(static_cast<uint32_t>(c.n * 31 + c.k + c.m));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t row_bytes = RowBytes(c.format, c.k);
    const std::vector<uint8_t> w = RandomWeights(c.format, c.n, c.k, rng);
    std::vector<float> scales(1, 0.0f);  // bf16: none read
    std::uniform_int_distribution<int> exponent(-8, 4);
    if (fp8) {
      scales.resize(static_cast<size_t>(((c.n + 127) / 128) * ((c.k + 127) / 128)));
      for (float& s : scales) s = std::ldexp(1.0f + 0.25f * static_cast<float>(rng() % 4), exponent(rng));
    } else if (!bf16) {
      scales.resize(static_cast<size_t>(c.n * (c.k / 32)));
      for (float& s : scales) s = std::ldexp(1.0f, exponent(rng));  // ue8m0: powers of two
    }
    // k 7168: activations far outside f16's range (the tensor-core form scales them).
    const float magnitude = c.k == 7168 ? 3e5f : 1.0f;
    std::vector<float> x(static_cast<size_t>(c.m * c.k));
    for (float& v : x) v = magnitude * normal(rng);

    // The CPU's weights.
    std::vector<float> dense(static_cast<size_t>(c.n * c.k));
    if (fp8) {
      const cpu::WeightMatrix wm{.dtype = DType::kF8E4M3, .rows = c.n, .cols = c.k,
                                 .data = reinterpret_cast<const std::byte*>(w.data()), .block_scales = scales.data()};
      cpu::DequantizeRows(wm, 0, c.n, dense.data());
    } else if (bf16) {
      for (size_t i = 0; i < dense.size(); ++i) {
        uint16_t b = 0;
        std::memcpy(&b, &w[2 * i], 2);
        dense[i] = Bf16ToF32(b);
      }
    } else {
      for (int64_t i = 0; i < c.n; ++i) {
        for (int64_t col = 0; col < c.k; ++col) {
          const uint8_t byte = w[static_cast<size_t>(i * row_bytes + col / 2)];
          const uint8_t code = col % 2 == 0 ? (byte & 0x0f) : (byte >> 4);
          dense[static_cast<size_t>(i * c.k + col)] = v4::Fp4E2m1ToF32(code) * scales[static_cast<size_t>(i * (c.k / 32) + col / 32)];
        }
      }
    }
    const Stored stored = ForGpu(c.format, w, scales, c.n, c.k);
    Dev<uint8_t> dw(stored.w);
    Dev<float> ds(stored.scales), dx(x), dy(static_cast<size_t>(c.m * c.n));
    // FP8 twice: on tensor cores (k % 64 == 0) and the scalar kernel.
    for (const bool scalar : fp8 ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
      SCOPED_TRACE(scalar ? "scalar" : "default");
      ASSERT_EQ(cuda::QuantizedGemv({.format = c.format, .w = dw.get(), .scales = bf16 ? nullptr : ds.get(),
                                     .x = dx.get(), .ldx = c.k, .y = dy.get(), .ldy = c.n, .m = c.m, .n = c.n,
                                     .k = c.k, .scalar = scalar},
                                    nullptr),
                cudaSuccess);
      const std::vector<float> got = dy.Download();
      int bad = 0;
      for (int r = 0; r < c.m; ++r) {
        for (int64_t i = 0; i < c.n; ++i) {
          double want = 0.0, magnitude = 0.0;
          for (int64_t col = 0; col < c.k; ++col) {
            const double t = static_cast<double>(x[static_cast<size_t>(r * c.k + col)]) *
                             dense[static_cast<size_t>(i * c.k + col)];
            want += t;
            magnitude += std::fabs(t);
          }
          const float g = got[static_cast<size_t>(r * c.n + i)];
          if (!(std::fabs(g - want) <= 1e-5 * magnitude + 1e-30)) {
            if (bad++ < 5) ADD_FAILURE() << "row " << r << ", output " << i << ": " << g << " vs " << want;
          }
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

// The routed form (experts chosen by device-side ids) against the plain form run on each
// problem's expert: the same kernel arithmetic, so bitwise equal; an id outside the
// experts gives zeros.
TEST_F(CudaQuantizedGemvTest, RoutedProblemsMatchThePlainForm) {
  for (const cuda::QuantizedWeight format :
       {cuda::QuantizedWeight::kFp8Block128, cuda::QuantizedWeight::kFp4Group32, cuda::QuantizedWeight::kBf16,
        cuda::QuantizedWeight::kFp4Tiled}) {
    for (const int x_group : {1, 2}) {
      const bool fp8 = format == cuda::QuantizedWeight::kFp8Block128;
      SCOPED_TRACE(::testing::Message() << Name(format) << ", x_group " << x_group);
      const int64_t n = 700, k = 1024, experts = 5;
      const std::vector<int32_t> ids = {4, 0, 2, 2, -1, 1, 7, 3};
      const int problems = static_cast<int>(ids.size());
      std::mt19937 rng(11 + x_group);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      const int64_t nscales = fp8 ? ((n + 127) / 128) * ((k + 127) / 128) : n * (k / 32);
      std::vector<std::unique_ptr<Dev<uint8_t>>> w;
      std::vector<std::unique_ptr<Dev<float>>> sc;
      std::vector<cuda::QuantizedMatrixRef> refs;
      for (int64_t e = 0; e < experts; ++e) {
        const std::vector<uint8_t> bytes = RandomWeights(format, n, k, rng);
        std::vector<float> s(static_cast<size_t>(nscales));
        for (float& v : s) v = std::ldexp(1.0f, static_cast<int>(rng() % 6) - 4);
        const Stored stored = ForGpu(format, bytes, s, n, k);
        w.push_back(std::make_unique<Dev<uint8_t>>(stored.w));
        sc.push_back(std::make_unique<Dev<float>>(stored.scales));
        refs.push_back({.w = w.back()->get(), .scales = sc.back()->get()});
      }
      const int x_rows = (problems + x_group - 1) / x_group;
      std::vector<float> x(static_cast<size_t>(x_rows * k));
      for (float& v : x) v = normal(rng);
      Dev<cuda::QuantizedMatrixRef> drefs(refs);
      Dev<int32_t> dids(ids);
      Dev<float> dx(x), dy(static_cast<size_t>(problems * n)), done(static_cast<size_t>(n));
      ASSERT_EQ(cuda::QuantizedGemv({.format = format, .x = dx.get(), .ldx = k, .y = dy.get(), .ldy = n, .m = 1,
                                     .n = n, .k = k, .experts = drefs.get(), .num_experts = static_cast<int>(experts),
                                     .ids = dids.get(), .problems = problems, .x_group = x_group},
                                    nullptr),
                cudaSuccess);
      const std::vector<float> got = dy.Download();
      for (int q = 0; q < problems; ++q) {
        std::vector<float> want(static_cast<size_t>(n), 0.0f);
        if (ids[q] >= 0 && ids[q] < experts) {
          ASSERT_EQ(cuda::QuantizedGemv({.format = format, .w = refs[ids[q]].w, .scales = refs[ids[q]].scales,
                                         .x = dx.get() + (q / x_group) * k, .ldx = k, .y = done.get(), .ldy = n,
                                         .m = 1, .n = n, .k = k},
                                        nullptr),
                    cudaSuccess);
          want = done.Download();
        }
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(got[static_cast<size_t>(q * n + i)], want[static_cast<size_t>(i)]) << "problem " << q << ", row " << i;
        }
      }
    }
  }
}

// The routed FP4 form on expert tiles (fp4_expert_gemv.h: row pairs of 16, 8 and 4 lanes,
// one to five passes, x rows shared by x_group problems, an id outside the experts)
// against the CPU's dequantization and a double-precision sum, and accumulate adding the
// same products into y's old values.
TEST_F(CudaQuantizedGemvTest, RoutedFp4ExpertTilesMatchFloat64) {
  struct Shape {
    int64_t n, k;
    int x_group;
  };
  // (4096 columns: two passes of 16 lanes; 2048: one; 1024: 8 lanes; 96: 4; 9216: five
  // passes, the last half full; 9216 with a row per problem: x too large to stage, the
  // per-problem kernel; n 48 with 4096 columns: not whole 32-row tiles, the per-problem kernel)
  for (const Shape& sh : std::vector<Shape>{{256, 4096, 6}, {128, 2048, 1}, {256, 1024, 2}, {64, 9216, 12},
                                            {64, 9216, 1}, {128, 96, 3}, {48, 4096, 6}}) {
    SCOPED_TRACE(::testing::Message() << "n " << sh.n << " k " << sh.k << " x_group " << sh.x_group);
    const int64_t n = sh.n, k = sh.k, experts = 4;
    const std::vector<int32_t> ids = {3, 0, 2, 2, -1, 1, 9, 3, 0, 1, 2, 3};
    const int problems = static_cast<int>(ids.size());
    std::mt19937 rng(static_cast<uint32_t>(n + k));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> exponent(-8, 4);
    std::vector<std::vector<uint8_t>> w;
    std::vector<std::vector<float>> scales;
    std::vector<std::unique_ptr<Dev<uint8_t>>> dw;
    std::vector<std::unique_ptr<Dev<float>>> ds;
    std::vector<cuda::QuantizedMatrixRef> refs;
    for (int64_t e = 0; e < experts; ++e) {
      w.push_back(RandomWeights(cuda::QuantizedWeight::kFp4Group32, n, k, rng));
      scales.emplace_back(static_cast<size_t>(n * (k / 32)));
      for (float& v : scales.back()) v = std::ldexp(1.0f, exponent(rng));
      dw.push_back(std::make_unique<Dev<uint8_t>>(w.back()));
      ds.push_back(std::make_unique<Dev<float>>(scales.back()));
      refs.push_back({.w = dw.back()->get(), .scales = ds.back()->get()});
    }
    const int x_rows = (problems + sh.x_group - 1) / sh.x_group;
    std::vector<float> x(static_cast<size_t>(x_rows * k)), old(static_cast<size_t>(problems * n));
    for (float& v : x) v = normal(rng);
    for (float& v : old) v = normal(rng);
    Dev<cuda::QuantizedMatrixRef> drefs(refs);
    Dev<int32_t> dids(ids);
    Dev<float> dx(x), dy(std::vector<float>(old.size(), 7.0f)), dacc(old);
    cuda::QuantizedGemvParams p{.format = cuda::QuantizedWeight::kFp4Group32, .x = dx.get(), .ldx = k, .y = dy.get(),
                                .ldy = n, .m = 1, .n = n, .k = k, .experts = drefs.get(),
                                .num_experts = static_cast<int>(experts), .ids = dids.get(), .problems = problems,
                                .x_group = sh.x_group};
    ASSERT_EQ(cuda::QuantizedGemv(p, nullptr), cudaSuccess);
    p.y = dacc.get();
    p.accumulate = true;
    ASSERT_EQ(cuda::QuantizedGemv(p, nullptr), cudaSuccess);
    const std::vector<float> got = dy.Download(), acc = dacc.Download();
    int bad = 0;
    for (int q = 0; q < problems; ++q) {
      const bool valid = ids[q] >= 0 && ids[q] < experts;
      for (int64_t i = 0; i < n; ++i) {
        double want = 0.0, magnitude = 0.0;
        for (int64_t col = 0; valid && col < k; ++col) {
          const uint8_t byte = w[ids[q]][static_cast<size_t>(i * (k / 2) + col / 2)];
          const uint8_t code = col % 2 == 0 ? (byte & 0x0f) : (byte >> 4);
          const double t = static_cast<double>(x[static_cast<size_t>((q / sh.x_group) * k + col)]) *
                           v4::Fp4E2m1ToF32(code) * scales[ids[q]][static_cast<size_t>(i * (k / 32) + col / 32)];
          want += t;
          magnitude += std::fabs(t);
        }
        const size_t at = static_cast<size_t>(q * n + i);
        if (!(std::fabs(got[at] - want) <= 1e-5 * magnitude + 1e-30) || acc[at] != old[at] + got[at]) {
          if (bad++ < 5) {
            ADD_FAILURE() << "problem " << q << ", row " << i << ": " << got[at] << " vs " << want << "; accumulated "
                          << acc[at] << " vs " << old[at] << " + " << got[at];
          }
        }
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

// The tiled FP4 layout widens to the plain layout's values exactly (the prefill path of
// the V4 model widens tiled experts).
TEST_F(CudaQuantizedGemvTest, TiledFp4WidensToThePlainValues) {
  for (const auto& [n, k] : std::vector<std::pair<int64_t, int64_t>>{{37, 128}, {256, 2048}, {16, 64}}) {
    SCOPED_TRACE(::testing::Message() << "n " << n << " k " << k);
    std::mt19937 rng(static_cast<uint32_t>(n + k));
    const std::vector<uint8_t> w = RandomWeights(cuda::QuantizedWeight::kFp4Group32, n, k, rng);
    std::vector<float> scales(static_cast<size_t>(n * (k / 32)));
    for (float& s : scales) s = std::ldexp(1.0f, static_cast<int>(rng() % 9) - 4);
    const Stored tiled = ForGpu(cuda::QuantizedWeight::kFp4Tiled, w, scales, n, k);
    Dev<uint8_t> dw(w), dt(tiled.w);
    Dev<float> ds(scales), dts(tiled.scales), plain(static_cast<size_t>(n * k)), got(static_cast<size_t>(n * k));
    ASSERT_EQ(cuda::DequantizeFp4ToF32({.src = dw.get(), .scales = ds.get(), .dst = plain.get(), .rows = n, .cols = k},
                                       nullptr),
              cudaSuccess);
    ASSERT_EQ(cuda::DequantizeFp4TiledToF32(
                  {.src = dt.get(), .scales = dts.get(), .dst = got.get(), .rows = n, .cols = k}, nullptr),
              cudaSuccess);
    EXPECT_EQ(got.Download(), plain.Download());
  }
}

// accumulate adds the products into y: exactly the stored form's result plus y's old
// values (one float32 addition each), on the tensor-core and the scalar FP8 kernels and
// the routed form.
TEST_F(CudaQuantizedGemvTest, AccumulateAddsIntoTheOutput) {
  for (const auto& [format, scalar] : std::vector<std::pair<cuda::QuantizedWeight, bool>>{
           {cuda::QuantizedWeight::kFp8Block128, false}, {cuda::QuantizedWeight::kFp8Block128, true},
           {cuda::QuantizedWeight::kFp4Group32, false}, {cuda::QuantizedWeight::kBf16, false}}) {
    for (const bool routed : {false, true}) {
      SCOPED_TRACE(::testing::Message() << Name(format) << (scalar ? " scalar" : "") << (routed ? " routed" : ""));
      const bool fp8 = format == cuda::QuantizedWeight::kFp8Block128;
      const int m = routed ? 1 : 3;
      const int64_t n = 2048 + 48, k = 1024;
      std::mt19937 rng(5);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      const std::vector<uint8_t> w = RandomWeights(format, n, k, rng);
      std::vector<float> scales(static_cast<size_t>(fp8 ? ((n + 127) / 128) * ((k + 127) / 128) : n * (k / 32)));
      for (float& v : scales) v = std::ldexp(1.0f, static_cast<int>(rng() % 6) - 4);
      const int problems = routed ? 3 : 1;
      std::vector<float> x(static_cast<size_t>(std::max(m, problems) * k)), old(static_cast<size_t>(std::max(m, problems) * n));
      for (float& v : x) v = normal(rng);
      for (float& v : old) v = normal(rng);
      Dev<uint8_t> dw(w);
      Dev<float> ds(scales), dx(x), plain(std::vector<float>(old.size(), 0.0f)), acc(old);
      const cuda::QuantizedMatrixRef ref{.w = dw.get(), .scales = ds.get()};
      Dev<cuda::QuantizedMatrixRef> drefs(std::vector<cuda::QuantizedMatrixRef>{ref});
      Dev<int32_t> dids(std::vector<int32_t>(static_cast<size_t>(problems), 0));
      cuda::QuantizedGemvParams p{.format = format, .w = dw.get(), .scales = format == cuda::QuantizedWeight::kBf16 ? nullptr : ds.get(),
                                  .x = dx.get(), .ldx = k, .y = plain.get(), .ldy = n, .m = m, .n = n, .k = k,
                                  .scalar = scalar};
      if (routed) {
        p.experts = drefs.get();
        p.num_experts = 1;
        p.ids = dids.get();
        p.problems = problems;
      }
      ASSERT_EQ(cuda::QuantizedGemv(p, nullptr), cudaSuccess);
      p.y = acc.get();
      p.accumulate = true;
      ASSERT_EQ(cuda::QuantizedGemv(p, nullptr), cudaSuccess);
      const std::vector<float> want = plain.Download(), got = acc.Download();
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], old[i] + want[i]) << "element " << i;
    }
  }
}

TEST_F(CudaQuantizedGemvTest, RefusesBadShapes) {
  Dev<uint8_t> w(std::vector<uint8_t>(4096, 0));
  Dev<float> s(std::vector<float>(64, 1.0f)), x(std::vector<float>(1024, 1.0f)), y(std::vector<float>(1024, 0.0f));
  const cuda::QuantizedGemvParams ok{.format = cuda::QuantizedWeight::kFp8Block128, .w = w.get(), .scales = s.get(),
                                     .x = x.get(), .ldx = 64, .y = y.get(), .ldy = 64, .m = 1, .n = 64, .k = 64};
  EXPECT_EQ(cuda::QuantizedGemv(ok, nullptr), cudaSuccess);
  for (auto change : std::vector<void (*)(cuda::QuantizedGemvParams&)>{
           [](cuda::QuantizedGemvParams& p) { p.m = 9; }, [](cuda::QuantizedGemvParams& p) { p.k = 40; },
           [](cuda::QuantizedGemvParams& p) { p.format = cuda::QuantizedWeight::kFp4Group32; p.k = 48; },
           [](cuda::QuantizedGemvParams& p) { p.ldy = 10; }, [](cuda::QuantizedGemvParams& p) { p.w = nullptr; },
           [](cuda::QuantizedGemvParams& p) { p.m = 8; p.k = 8192; p.ldx = 8192; },
           [](cuda::QuantizedGemvParams& p) { p.format = cuda::QuantizedWeight::kBf16; p.k = 60; },
           [](cuda::QuantizedGemvParams& p) { p.format = cuda::QuantizedWeight::kFp4Tiled; p.k = 32; p.ldx = 64; },
           [](cuda::QuantizedGemvParams& p) { p.format = static_cast<cuda::QuantizedWeight>(7); }}) {
    cuda::QuantizedGemvParams p = ok;
    change(p);
    EXPECT_EQ(cuda::QuantizedGemv(p, nullptr), cudaErrorInvalidValue);
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace tandem
