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

// Multiprocessors of the calling thread's current device, for sizing launch grids; cached
// per device (no driver call on the launch path after the first); 132 (an H200) when the
// driver cannot say.
int CurrentDeviceMultiprocessors();

}  // namespace tandem::cuda
