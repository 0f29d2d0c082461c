// InvariantGemm (kernels/cuda/invariant_gemm.h) against a host fused multiply-add chain over
// k in order: bitwise equal, not within a tolerance — the kernel's one promise is that
// order, whatever m and the strides. Skips, saying why, where no GPU is usable.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/dtype.h"
#include "kernels/cuda/invariant_gemm.h"
#include "tests/unit/kernels/cuda_test_support.h"

namespace tandem {
namespace {

using testing::Dev;

struct Shape {
  int m, n, k, batch;
  bool b_k_fast;  // B stored [n][k] (ldb_k 1) or [k][n] (ldb_n 1)
  bool bf16_out;
  bool accumulate;
};

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

class InvariantGemmTest : public testing::GpuTest, public ::testing::WithParamInterface<Shape> {};

TEST_P(InvariantGemmTest, EqualsTheHostChainBitwise) {
  const Shape s = GetParam();
  const int64_t lda = s.k + 3, a_batch = static_cast<int64_t>(s.m) * lda;
  const std::vector<float> a = Random(static_cast<size_t>(s.batch * a_batch), 1);
  // B in bf16 (as the model's weights), its values exactly representable as floats.
  const int64_t ldb_n = s.b_k_fast ? s.k : 1, ldb_k = s.b_k_fast ? 1 : s.n;
  const int64_t b_batch = static_cast<int64_t>(s.n) * s.k + 8;
  const std::vector<float> b_f32 = Random(static_cast<size_t>(s.batch * b_batch), 3);
  std::vector<uint16_t> b(b_f32.size());
  for (size_t i = 0; i < b.size(); ++i) b[i] = F32ToBf16(b_f32[i]);
  const int64_t ldc = s.n + 5, c_batch = static_cast<int64_t>(s.m) * ldc;
  const std::vector<float> c0 = Random(static_cast<size_t>(s.batch * c_batch), 2);

  Dev<float> da(a), dc(c0);
  Dev<uint16_t> db(b), dc_bf16(static_cast<size_t>(s.batch * c_batch));
  ASSERT_EQ(cuda::InvariantGemm({.a = da.get(), .lda = lda, .a_batch = a_batch, .b = db.get(), .b_bf16 = true,
                                 .ldb_n = ldb_n, .ldb_k = ldb_k, .b_batch = b_batch,
                                 .c = s.bf16_out ? static_cast<void*>(dc_bf16.get()) : dc.get(),
                                 .c_bf16 = s.bf16_out, .accumulate = s.accumulate, .ldc = ldc, .c_batch = c_batch,
                                 .m = s.m, .n = s.n, .k = s.k, .batch = s.batch},
                                nullptr),
            cudaSuccess);
  const std::vector<float> c = dc.Download();
  const std::vector<uint16_t> c_bf16 = dc_bf16.Download();
  int mismatches = 0;
  for (int bb = 0; bb < s.batch; ++bb) {
    for (int i = 0; i < s.m; ++i) {
      for (int j = 0; j < s.n; ++j) {
        float acc = 0.0f;
        for (int kk = 0; kk < s.k; ++kk) {
          acc = std::fmaf(a[bb * a_batch + i * lda + kk], Bf16ToF32(b[bb * b_batch + j * ldb_n + kk * ldb_k]), acc);
        }
        const int64_t at = bb * c_batch + static_cast<int64_t>(i) * ldc + j;
        if (s.bf16_out) {
          mismatches += c_bf16[at] != F32ToBf16(acc);
        } else {
          const float want = s.accumulate ? c0[at] + acc : acc;
          mismatches += std::memcmp(&c[at], &want, 4) != 0;
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
  // Elements outside the m x n block are left as they were (padding columns of ldc).
  if (!s.bf16_out) EXPECT_EQ(std::memcmp(&c[s.n], &c0[s.n], 4), 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, InvariantGemmTest,
                         ::testing::Values(Shape{1, 64, 128, 1, true, false, false},     // one row
                                           Shape{130, 70, 37, 1, true, false, false},    // ragged tiles, k % 16
                                           Shape{5, 512, 128, 3, false, true, false},    // W_UK: [k][n], bf16 out
                                           Shape{67, 128, 512, 4, true, false, false},   // W_UV
                                           Shape{9, 64, 2048, 1, true, false, true}));   // accumulate

}  // namespace
}  // namespace tandem
