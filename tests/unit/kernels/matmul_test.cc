#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tandem::cpu {
namespace {

struct Stored {
  std::vector<std::byte> bytes;
  std::vector<float> scales;
  std::vector<float> dequantized;  // what the kernel should compute with
  WeightMatrix w;
};

Stored MakeWeights(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Stored s;
  s.w.dtype = dtype;
  s.w.rows = rows;
  s.w.cols = cols;
  s.bytes.resize(static_cast<size_t>(rows * cols * DTypeSize(dtype)));
  s.dequantized.resize(static_cast<size_t>(rows * cols));
  const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
  if (dtype == DType::kF8E4M3) {
    s.scales.resize(static_cast<size_t>(sr * sc));
    for (float& v : s.scales) v = 0.01f * (1.0f + std::fabs(dist(rng)));
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const float v = dist(rng);
      switch (dtype) {
        case DType::kF32:
          std::memcpy(&s.bytes[4 * i], &v, 4);
          s.dequantized[i] = v;
          break;
        case DType::kBF16: {
          const uint16_t b = F32ToBf16(v);
          std::memcpy(&s.bytes[2 * i], &b, 2);
          s.dequantized[i] = Bf16ToF32(b);
          break;
        }
        case DType::kF16: {
          const uint16_t b = F32ToF16(v);
          std::memcpy(&s.bytes[2 * i], &b, 2);
          s.dequantized[i] = F16ToF32(b);
          break;
        }
        case DType::kF8E4M3: {
          const uint8_t b = F32ToF8E4M3(v * 50.0f);
          s.bytes[i] = static_cast<std::byte>(b);
          s.dequantized[i] = F8E4M3ToF32(b) * s.scales[(r / 128) * sc + c / 128];
          break;
        }
        default:  // scale, packed and index types are not weight matrices
          ADD_FAILURE() << "no matrix of " << DTypeName(dtype);
          return s;
      }
    }
  }
  s.w.data = s.bytes.data();
  s.w.block_scales = s.scales.empty() ? nullptr : s.scales.data();
  return s;
}

struct Case {
  DType dtype;
  int64_t m, rows, cols;
  int threads;
};

class MatmulTest : public ::testing::TestWithParam<Case> {};

TEST_P(MatmulTest, MatchesDoubleReference) {
  const Case c = GetParam();
  std::mt19937 rng(static_cast<unsigned>(c.rows * 131 + c.cols * 7 + c.m));
  Stored s = MakeWeights(c.dtype, c.rows, c.cols, rng);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t x_stride = c.cols + 3, y_stride = c.rows + 5;
  std::vector<float> x(static_cast<size_t>(c.m * x_stride));
  for (float& v : x) v = dist(rng);
  std::vector<float> y(static_cast<size_t>(c.m * y_stride), 0.5f);
  ThreadPool pool(c.threads);
  for (bool accumulate : {false, true}) {
    std::vector<float> before = y;
    Matmul({.x = x.data(), .m = c.m, .x_stride = x_stride, .w = &s.w, .y = y.data(), .y_stride = y_stride,
            .accumulate = accumulate},
           pool);
    for (int64_t t = 0; t < c.m; ++t) {
      for (int64_t n = 0; n < c.rows; ++n) {
        double ref = accumulate ? before[t * y_stride + n] : 0.0;
        double mag = std::fabs(ref);
        for (int64_t k = 0; k < c.cols; ++k) {
          ref += static_cast<double>(x[t * x_stride + k]) * s.dequantized[n * c.cols + k];
          mag += std::fabs(static_cast<double>(x[t * x_stride + k]) * s.dequantized[n * c.cols + k]);
        }
        ASSERT_NEAR(y[t * y_stride + n], ref, 1e-5 * mag + 1e-6) << "t=" << t << " n=" << n;
      }
      // Padding between rows is untouched.
      for (int64_t n = c.rows; n < y_stride; ++n) ASSERT_EQ(y[t * y_stride + n], before[t * y_stride + n]);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MatmulTest,
    ::testing::Values(Case{DType::kBF16, 1, 64, 128, 1}, Case{DType::kBF16, 3, 67, 131, 2},
                      Case{DType::kBF16, 17, 256, 300, 3}, Case{DType::kF32, 1, 5, 9, 1},
                      Case{DType::kF32, 9, 130, 257, 4}, Case{DType::kF16, 2, 33, 70, 2},
                      Case{DType::kF8E4M3, 1, 300, 260, 2}, Case{DType::kF8E4M3, 5, 129, 513, 3},
                      Case{DType::kBF16, 1, 1, 1, 2}, Case{DType::kBF16, 4, 3, 7, 4}));

// Matmuls batched into one fork-join give each the bits it has alone, whatever their
// dtypes, shapes and m (0 included).
TEST(MatmulBatchTest, SameBitsAsOneAtATime) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  struct Job {
    DType dtype;
    int64_t m, rows, cols;
  };
  const std::vector<Job> specs = {{DType::kBF16, 1, 512, 1024}, {DType::kBF16, 3, 67, 131}, {DType::kF32, 2, 9, 33},
                                  {DType::kBF16, 0, 40, 64},     {DType::kF8E4M3, 1, 130, 260}, {DType::kBF16, 1, 5, 8}};
  std::vector<Stored> weights;
  std::vector<std::vector<float>> xs, batched, alone;
  for (const Job& j : specs) {
    weights.push_back(MakeWeights(j.dtype, j.rows, j.cols, rng));
    xs.emplace_back(static_cast<size_t>(std::max<int64_t>(j.m, 1) * j.cols));
    for (float& v : xs.back()) v = dist(rng);
    batched.emplace_back(static_cast<size_t>(std::max<int64_t>(j.m, 1) * j.rows), 0.5f);
  }
  alone = batched;
  std::vector<MatmulParams> jobs;
  for (size_t i = 0; i < specs.size(); ++i) {
    jobs.push_back({.x = xs[i].data(), .m = specs[i].m, .x_stride = specs[i].cols, .w = &weights[i].w,
                    .y = batched[i].data(), .y_stride = specs[i].rows, .accumulate = i % 2 == 1});
  }
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    std::vector<std::vector<float>> b = batched, a = alone;
    for (size_t i = 0; i < jobs.size(); ++i) jobs[i].y = b[i].data();
    MatmulBatch(jobs, pool);
    for (size_t i = 0; i < jobs.size(); ++i) {
      MatmulParams one = jobs[i];
      one.y = a[i].data();
      Matmul(one, pool);
      EXPECT_EQ(b[i], a[i]) << "job " << i << " threads " << threads;
    }
  }
}

// round_fp8_input: an FP8 matrix's product reads x as the GPU's FP8 GEMM does, i.e. the
// product of x rounded by hand (per row and 128 columns: e4m3 of x / (amax / 448), times
// that scale), bitwise, alone and in a batch; other matrices ignore it.
TEST(MatmulRoundFp8InputTest, EqualsTheProductOfTheRoundedInput) {
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int64_t m = 3, rows = 130, cols = 300, stride = 305;
  std::vector<float> x(static_cast<size_t>(m * stride));
  for (float& v : x) v = dist(rng) * 3.0f;
  x[7] = 0.0f;
  std::vector<float> rounded(static_cast<size_t>(m * cols));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t b = 0; b < cols; b += 128) {
      const int64_t end = std::min(cols, b + 128);
      float amax = 0.0f;
      for (int64_t c = b; c < end; ++c) amax = std::max(amax, std::fabs(x[r * stride + c]));
      const float scale = std::max(amax, 1e-4f) / 448.0f;
      for (int64_t c = b; c < end; ++c) {
        rounded[r * cols + c] = F8E4M3ToF32(F32ToF8E4M3(x[r * stride + c] / scale)) * scale;
      }
    }
  }
  ThreadPool pool(2);
  for (DType dtype : {DType::kF8E4M3, DType::kBF16}) {
    const Stored w = MakeWeights(dtype, rows, cols, rng);
    std::vector<float> got(static_cast<size_t>(m * rows)), batched(got.size()), want(got.size()), plain(got.size());
    Matmul({.x = x.data(), .m = m, .x_stride = stride, .w = &w.w, .y = got.data(), .y_stride = rows,
            .round_fp8_input = true},
           pool);
    const MatmulParams job{.x = x.data(), .m = m, .x_stride = stride, .w = &w.w, .y = batched.data(),
                           .y_stride = rows, .round_fp8_input = true};
    MatmulBatch({&job, 1}, pool);
    Matmul({.x = x.data(), .m = m, .x_stride = stride, .w = &w.w, .y = plain.data(), .y_stride = rows}, pool);
    Matmul({.x = rounded.data(), .m = m, .x_stride = cols, .w = &w.w, .y = want.data(), .y_stride = rows}, pool);
    EXPECT_EQ(got, batched) << DTypeName(dtype);
    if (dtype == DType::kF8E4M3) {
      EXPECT_EQ(got, want);
      EXPECT_NE(got, plain) << "the rounding should change the products";
    } else {
      EXPECT_EQ(got, plain) << "only FP8 matrices read rounded inputs";
    }
  }
  // In a batch, jobs of one input share its rounding: a bf16 job first (no rounding), then
  // two FP8 jobs of the same x, each equal to its product alone.
  const Stored a = MakeWeights(DType::kF8E4M3, rows, cols, rng), b = MakeWeights(DType::kF8E4M3, 70, cols, rng),
               h = MakeWeights(DType::kBF16, 40, cols, rng);
  std::vector<float> ya(static_cast<size_t>(m * rows)), yb(static_cast<size_t>(m * 70)), yh(static_cast<size_t>(m * 40));
  const MatmulParams batch[] = {
      {.x = x.data(), .m = m, .x_stride = stride, .w = &h.w, .y = yh.data(), .y_stride = 40, .round_fp8_input = true},
      {.x = x.data(), .m = m, .x_stride = stride, .w = &a.w, .y = ya.data(), .y_stride = rows, .round_fp8_input = true},
      {.x = x.data(), .m = m, .x_stride = stride, .w = &b.w, .y = yb.data(), .y_stride = 70, .round_fp8_input = true}};
  MatmulBatch(batch, pool);
  for (const MatmulParams& job : batch) {
    std::vector<float> alone(static_cast<size_t>(m * job.w->rows));
    MatmulParams one = job;
    one.y = alone.data();
    Matmul(one, pool);
    EXPECT_EQ(std::vector<float>(job.y, job.y + alone.size()), alone) << job.w->rows;
  }
}

TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  ThreadPool pool(4);
  for (int64_t n : {0, 1, 5, 64, 1001}) {
    for (int64_t grain : {1, 7, 100}) {
      std::vector<int> hits(static_cast<size_t>(n), 0);
      pool.ParallelFor(n, grain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << n << " " << grain << " " << i;
    }
  }
}

}  // namespace
}  // namespace tandem::cpu
