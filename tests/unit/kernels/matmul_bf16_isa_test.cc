// The bf16 matmul's instruction-set variants (kernels/cpu/matmul_bf16.h) against a scalar
// statement of their summation order, bit for bit, over odd and even shapes; and the
// properties the engine's batch invariance rests on: a row's bits do not depend on m or
// on the thread count.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/dtype.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_bf16.h"

namespace tandem::cpu {
namespace {

struct Bf16Matrix {
  std::vector<uint16_t> bits;
  WeightMatrix w;
};

Bf16Matrix RandomMatrix(int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Bf16Matrix m;
  m.bits.resize(static_cast<size_t>(rows * cols));
  for (uint16_t& b : m.bits) b = F32ToBf16(dist(rng));
  m.w = {.dtype = DType::kBF16, .rows = rows, .cols = cols, .data = reinterpret_cast<const std::byte*>(m.bits.data())};
  return m;
}

// The order kernels/cpu/matmul_bf16.h promises, written independently of the kernels.
float ReferenceDot(const float* x, const uint16_t* w, int64_t k) {
  const int64_t k8 = k - k % 8;
  float p[8] = {};
  for (int64_t i = 0; i < k8; ++i) p[i % 8] = std::fma(x[i], Bf16ToF32(w[i]), p[i % 8]);
  float r[4];
  for (int j = 0; j < 4; ++j) r[j] = p[j] + p[j + 4];
  float s = (r[0] + r[1]) + (r[2] + r[3]);
  for (int64_t i = k8; i < k; ++i) s = std::fma(x[i], Bf16ToF32(w[i]), s);
  return s;
}

uint32_t Bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

std::vector<CpuIsa> SupportedIsas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kGeneric, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (CpuIsaSupported(isa)) out.push_back(isa);
  }
  return out;
}

struct BatchShape {
  int64_t m, rows, cols;
};

// y = x W^T (or y += with y preset) through Matmul with `isa` on `threads` threads.
std::vector<float> RunMatmul(const Bf16Matrix& w, const std::vector<float>& x, int64_t m, int64_t x_stride,
                             int64_t y_stride, bool accumulate, CpuIsa isa, int threads) {
  std::vector<float> y(static_cast<size_t>(m * y_stride));
  for (size_t i = 0; i < y.size(); ++i) y[i] = 0.25f * static_cast<float>(i % 7);
  ThreadPool pool(threads);
  Matmul({.x = x.data(), .m = m, .x_stride = x_stride, .w = &w.w, .y = y.data(), .y_stride = y_stride,
          .accumulate = accumulate},
         pool, isa);
  return y;
}

TEST(MatmulBf16IsaTest, EveryVariantMatchesTheScalarOrderBitwise) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const std::vector<int64_t> ks = {1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 100, 257, 1031};
  const std::vector<int64_t> ns = {1, 3, 7, 8, 9, 15, 16, 17, 33, 67};
  const std::vector<int64_t> ms = {1, 2, 3, 4, 5, 6, 7, 8, 9, 64};
  for (int64_t k : ks) {
    for (int64_t n : ns) {
      const Bf16Matrix w = RandomMatrix(n, k, rng);
      for (int64_t m : ms) {
        if (m == 64 && n > 17) continue;  // keeps the grid's time down; m = 64 still meets every k
        const int64_t x_stride = k + 3, y_stride = n + 2;
        std::vector<float> x(static_cast<size_t>(m * x_stride));
        for (float& v : x) v = dist(rng);
        for (bool accumulate : {false, true}) {
          for (CpuIsa isa : SupportedIsas()) {
            const std::vector<float> y = RunMatmul(w, x, m, x_stride, y_stride, accumulate, isa, 1 + (n + m) % 3);
            for (int64_t t = 0; t < m; ++t) {
              for (int64_t r = 0; r < y_stride; ++r) {
                const size_t at = static_cast<size_t>(t * y_stride + r);
                const float preset = 0.25f * static_cast<float>(at % 7);
                float want = preset;  // padding past n is untouched
                if (r < n) {
                  const float dot = ReferenceDot(&x[t * x_stride], &w.bits[r * k], k);
                  want = accumulate ? preset + dot : dot;
                }
                ASSERT_EQ(Bits(y[at]), Bits(want))
                    << CpuIsaName(isa) << " k=" << k << " n=" << n << " m=" << m << " t=" << t << " r=" << r
                    << " accumulate=" << accumulate << ": " << y[at] << " vs " << want;
              }
            }
          }
        }
      }
    }
  }
}

// A row's output is the same bits alone (m = 1) or among 63 others, on any thread count.
TEST(MatmulBf16IsaTest, RowsAreIndependentOfBatchAndThreads) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const BatchShape& c : {BatchShape{64, 203, 1031}, BatchShape{64, 1024, 512}, BatchShape{9, 77, 2048}}) {
    const Bf16Matrix w = RandomMatrix(c.rows, c.cols, rng);
    std::vector<float> x(static_cast<size_t>(c.m * c.cols));
    for (float& v : x) v = dist(rng);
    for (CpuIsa isa : SupportedIsas()) {
      const std::vector<float> batch = RunMatmul(w, x, c.m, c.cols, c.rows, false, isa, 2);
      for (int threads : {1, 3, 4}) {
        EXPECT_EQ(RunMatmul(w, x, c.m, c.cols, c.rows, false, isa, threads), batch)
            << CpuIsaName(isa) << " threads=" << threads;
      }
      for (int64_t t : {int64_t{0}, c.m / 2, c.m - 1}) {
        const std::vector<float> xt(x.begin() + t * c.cols, x.begin() + (t + 1) * c.cols);
        const std::vector<float> alone = RunMatmul(w, xt, 1, c.cols, c.rows, false, isa, 2);
        for (int64_t r = 0; r < c.rows; ++r) {
          ASSERT_EQ(Bits(alone[r]), Bits(batch[t * c.rows + r])) << CpuIsaName(isa) << " t=" << t << " r=" << r;
        }
      }
    }
  }
}

TEST(MatmulBf16IsaTest, ActiveIsaIsSupported) {
  EXPECT_TRUE(CpuIsaSupported(ActiveCpuIsa()));
  EXPECT_TRUE(CpuIsaSupported(DetectedCpuIsa()));
  EXPECT_TRUE(CpuIsaSupported(CpuIsa::kGeneric));
  std::printf("detected %s, active %s\n", std::string(CpuIsaName(DetectedCpuIsa())).c_str(),
              std::string(CpuIsaName(ActiveCpuIsa())).c_str());
}

}  // namespace
}  // namespace tandem::cpu
