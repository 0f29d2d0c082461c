#include "kernels/cuda/device_info.h"

#include <atomic>

#include <cuda_runtime.h>

namespace tandem::cuda {

std::string QueryDevices(std::vector<DeviceInfo>* devices) {
  devices->clear();
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
  if (count == 0) return "no CUDA device";
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    devices->push_back({i, prop.name, prop.major, prop.minor, prop.totalGlobalMem, prop.multiProcessorCount});
  }
  return devices->empty() ? "no CUDA device could be queried" : "";
}

int CurrentDeviceMultiprocessors() {
  constexpr int kDevices = 64;
  static std::atomic<int> cache[kDevices] = {};
  int dev = 0, v = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 132;
  }
  if (dev >= 0 && dev < kDevices) {
    if (const int c = cache[dev].load(std::memory_order_relaxed); c > 0) return c;
  }
  if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0) {
    (void)cudaGetLastError();
    return 132;
  }
  if (dev >= 0 && dev < kDevices) cache[dev].store(v, std::memory_order_relaxed);
  return v;
}

}  // namespace tandem::cuda
