#include "kernels/cuda/device_info.h"

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

}  // namespace tandem::cuda
