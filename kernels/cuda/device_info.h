// What CUDA devices this process can use. Works (and reports why not) on machines
// without a GPU or driver.
#pragma once

#include <string>
#include <vector>

namespace tandem::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  size_t total_memory = 0;
  int multiprocessors = 0;
};

// Fills `devices`; returns an empty string on success, else why no device is usable
// (e.g. "no CUDA driver", "no CUDA device").
std::string QueryDevices(std::vector<DeviceInfo>* devices);

}  // namespace tandem::cuda
