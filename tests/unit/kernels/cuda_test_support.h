// Shared by the CUDA tests: a fixture that skips (saying why) where no GPU is usable, so the
// tests build and run everywhere, and a self-freeing device array.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device_info.h"

namespace tandem::testing {

class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<cuda::DeviceInfo> devices;
    const std::string why = cuda::QueryDevices(&devices);
    if (!why.empty()) GTEST_SKIP() << "no usable GPU: " << why;
  }
};

// A device array that frees itself; poisoned (0xff bytes: NaN floats) when created so that
// unwritten outputs show.
template <typename T>
class Dev {
 public:
  explicit Dev(size_t n) : n_(n) {
    EXPECT_EQ(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p_, 0xff, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) { Upload(v); }
  ~Dev() { cudaFree(p_); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  T* get() const { return p_; }
  size_t size() const { return n_; }
  void Upload(const std::vector<T>& v) {
    ASSERT_LE(v.size(), n_);
    ASSERT_EQ(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> Download() const {
    std::vector<T> v(n_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};

// n values from a normal distribution of standard deviation `scale`, from `seed`.
inline std::vector<float> NormalValues(size_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A CUDA event that destroys itself.
class DevEvent {
 public:
  DevEvent() { EXPECT_EQ(cudaEventCreate(&e_), cudaSuccess); }
  ~DevEvent() { cudaEventDestroy(e_); }
  DevEvent(const DevEvent&) = delete;
  DevEvent& operator=(const DevEvent&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// A stream that synchronizes with the legacy default stream (the tests' copies), destroyed
// with the object.
class DevStream {
 public:
  DevStream() { EXPECT_EQ(cudaStreamCreate(&s_), cudaSuccess); }
  ~DevStream() { cudaStreamDestroy(s_); }
  DevStream(const DevStream&) = delete;
  DevStream& operator=(const DevStream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace tandem::testing
