// DeepSeek-V4's elementwise GPU ops against the CPU engine's (v4_math.h): the clamped
// SwiGLU and the compressor's window pooling, over V4-Flash's widths and odd ones; the
// query heads' norm with its rope in one launch against the two launches. The
// GPU's expf is within 2 ulp of the host's exp, so values agree to a few ulp, not
// bitwise. Skips, saying why, where no GPU is usable.
#include <cmath>
#include <random>
#include <vector>

#include "engine/model/deepseek_v4/v4_math.h"
#include "gtest/gtest.h"
#include "kernels/cuda/clamped_swiglu.h"
#include "kernels/cuda/pool_window.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/unit_rms_norm.h"
#include "tests/unit/kernels/cuda_test_support.h"

namespace tandem {
namespace {

using testing::Dev;
using testing::NormalValues;

class CudaV4OpsTest : public testing::GpuTest {};

TEST_F(CudaV4OpsTest, ClampedSwiGluMatchesTheCpu) {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 2048}, {37, 7}, {5, 1}, {300, 512}}) {
    const int64_t stride = 2 * cols + 3, out_stride = cols + 1;
    // Scale 8 with limit 10: some gates and ups beyond the clamp, both signs.
    const std::vector<float> x = NormalValues(static_cast<size_t>(rows * stride), 8.0f, static_cast<uint32_t>(rows + cols));
    std::vector<float> want(static_cast<size_t>(rows * out_stride), 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      v4::ClampedSwiGlu(&x[r * stride], &x[r * stride + cols], 10.0f, cols, &want[r * out_stride]);
    }
    Dev<float> dx(x), dout(want.size());
    ASSERT_EQ(cudaMemset(dout.get(), 0, want.size() * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cuda::ClampedSwiGlu({.x = dx.get(), .x_stride = stride, .rows = rows, .cols = cols, .limit = 10.0f,
                                   .out = dout.get(), .out_stride = out_stride},
                                  nullptr),
              cudaSuccess);
    const std::vector<float> got = dout.Download();
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 4e-7f * std::max(1.0f, std::fabs(want[i]))) << rows << "x" << cols << " @" << i;
    }
  }
  Dev<float> d(8);
  EXPECT_EQ(cuda::ClampedSwiGlu({.x = d.get(), .x_stride = 4, .rows = 1, .cols = 2, .limit = 0.0f, .out = d.get(),
                                 .out_stride = 2},
                                nullptr),
            cudaErrorInvalidValue)
      << "a limit of 0";
}

TEST_F(CudaV4OpsTest, PoolWindowMatchesTheCpu) {
  struct Shape {
    int64_t windows;
    int slots;
    int64_t width;
  };
  for (const Shape s : {Shape{3, 8, 512}, Shape{2, 128, 512}, Shape{40, 4, 7}, Shape{1, 1, 130}}) {
    const int64_t stride = s.width + 2, out_stride = s.width + 5;
    const size_t n = static_cast<size_t>(s.windows * s.slots * stride);
    const std::vector<float> kv = NormalValues(n, 1.0f, 1), gate = NormalValues(n, 4.0f, 2);
    std::vector<float> want(static_cast<size_t>(s.windows * out_stride), 0.0f);
    for (int64_t w = 0; w < s.windows; ++w) {
      std::vector<const float*> k, g;
      for (int j = 0; j < s.slots; ++j) {
        k.push_back(&kv[static_cast<size_t>((w * s.slots + j) * stride)]);
        g.push_back(&gate[static_cast<size_t>((w * s.slots + j) * stride)]);
      }
      v4::PoolWindow(k.data(), g.data(), s.slots, s.width, &want[w * out_stride]);
    }
    Dev<float> dkv(kv), dgate(gate), dout(want.size());
    ASSERT_EQ(cudaMemset(dout.get(), 0, want.size() * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cuda::PoolWindow({.kv = dkv.get(), .gate = dgate.get(), .stride = stride, .windows = s.windows,
                                .slots = s.slots, .width = s.width, .out = dout.get(), .out_stride = out_stride},
                               nullptr),
              cudaSuccess);
    const std::vector<float> got = dout.Download();
    for (size_t i = 0; i < got.size(); ++i) {
      // A weighted sum of `slots` values of size ~1 with weights off by a few ulp each.
      ASSERT_NEAR(got[i], want[i], 1e-6f * s.slots) << s.slots << " slots @" << i;
    }
  }
  Dev<float> d(8);
  EXPECT_EQ(cuda::PoolWindow({.kv = d.get(), .gate = d.get(), .stride = 4, .windows = 1, .slots = 0, .width = 4,
                              .out = d.get(), .out_stride = 4},
                             nullptr),
            cudaErrorInvalidValue);
}

TEST_F(CudaV4OpsTest, UnitRmsNormWithRopeEqualsNormThenRope) {
  // A block per head; the heads of a token share its position. Bit for bit: the same
  // arithmetic in one launch.
  for (const bool interleaved : {true, false}) {
    const int64_t tokens = 3, heads = 5, width = 200, stride = 208, rope = 64;
    const std::vector<float> x = NormalValues(static_cast<size_t>(tokens * heads * stride), 3.0f, 11);
    std::vector<float> inv_freq(static_cast<size_t>(rope / 2));
    for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / rope);
    Dev<float> dx(x), dfreq(inv_freq), fused(x.size()), twice(x.size());
    Dev<int32_t> dpos(std::vector<int32_t>{0, 7, 123456});
    const cuda::UnitRmsNormParams norm{.x = dx.get(), .x_stride = stride, .out = twice.get(), .out_stride = stride,
                                       .rows = tokens * heads, .width = width, .eps = 1e-6f};
    ASSERT_EQ(cuda::UnitRmsNorm(norm, nullptr), cudaSuccess);
    ASSERT_EQ(cuda::Rope({.x = twice.get() + width - rope, .rows = tokens, .num_heads = static_cast<int>(heads),
                          .row_stride = heads * stride, .head_stride = stride, .rope_dim = static_cast<int>(rope),
                          .positions = dpos.get(), .inv_freq = dfreq.get(), .attention_factor = 1.25f,
                          .interleaved = interleaved},
                         nullptr),
              cudaSuccess);
    cuda::UnitRmsNormParams both = norm;
    both.out = fused.get();
    both.rope_dim = static_cast<int>(rope);
    both.positions = dpos.get();
    both.rows_per_position = heads;
    both.inv_freq = dfreq.get();
    both.attention_factor = 1.25f;
    both.interleaved = interleaved;
    ASSERT_EQ(cuda::UnitRmsNorm(both, nullptr), cudaSuccess);
    const std::vector<float> got = fused.Download(), want = twice.Download();
    for (int64_t r = 0; r < tokens * heads; ++r) {
      for (int64_t i = 0; i < width; ++i) {
        ASSERT_EQ(got[static_cast<size_t>(r * stride + i)], want[static_cast<size_t>(r * stride + i)])
            << "row " << r << " @" << i << (interleaved ? " interleaved" : "");
      }
    }
    both.rope_dim = 3;
    EXPECT_EQ(cuda::UnitRmsNorm(both, nullptr), cudaErrorInvalidValue) << "an odd rope";
    both.rope_dim = static_cast<int>(rope);
    both.positions = nullptr;
    EXPECT_EQ(cuda::UnitRmsNorm(both, nullptr), cudaErrorInvalidValue) << "no positions";
  }
}

}  // namespace
}  // namespace tandem
