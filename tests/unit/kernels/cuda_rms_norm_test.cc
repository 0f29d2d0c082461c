// GPU RMSNorm against the CPU reference. Skips, saying why, where no GPU is usable.
#include <cmath>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "gtest/gtest.h"
#include "kernels/cpu/norm_rope_act.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/rms_norm.h"

namespace tandem {
namespace {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<cuda::DeviceInfo> devices;
    const std::string why = cuda::QueryDevices(&devices);
    if (!why.empty()) GTEST_SKIP() << "no usable GPU: " << why;
    std::printf("GPU: %s (sm_%d%d, %d SMs)\n", devices[0].name.c_str(), devices[0].compute_major,
                devices[0].compute_minor, devices[0].multiprocessors);
  }
};

TEST_F(CudaTest, RmsNormMatchesCpu) {
  for (auto [rows, dim] : {std::pair{1, 7}, {3, 128}, {17, 576}, {64, 7168}}) {
    std::mt19937 rng(rows * 31 + dim);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> x(static_cast<size_t>(rows * dim)), w(static_cast<size_t>(dim));
    for (float& v : x) v = dist(rng);
    for (float& v : w) v = 1.0f + 0.1f * dist(rng);
    std::vector<float> expected(x.size()), got(x.size());
    cpu::RmsNorm(x.data(), rows, dim, dim, w.data(), 1e-6f, expected.data(), dim);

    float *dx, *dw, *dout;
    ASSERT_EQ(cudaMalloc(&dx, x.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dw, w.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dout, x.size() * 4), cudaSuccess);
    cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dw, w.data(), w.size() * 4, cudaMemcpyHostToDevice);
    ASSERT_EQ(cuda::RmsNorm({.x = dx, .weight = dw, .out = dout, .rows = rows, .dim = dim, .x_stride = dim,
                             .out_stride = dim, .eps = 1e-6f},
                            nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dout);
    for (size_t i = 0; i < got.size(); ++i) {
      // fp32 sums in a different order: a few ulps of the row's scale.
      ASSERT_NEAR(got[i], expected[i], 1e-5f * (1.0f + std::fabs(expected[i]))) << rows << "x" << dim << " @" << i;
    }
  }
}

TEST_F(CudaTest, RmsNormRejectsBadParams) {
  EXPECT_EQ(cuda::RmsNorm({.rows = 1, .dim = 4}, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tandem
