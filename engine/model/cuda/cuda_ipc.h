// CUDA IPC for the device-to-device KV transfer (docs/design.md §5): a process exports a device
// allocation (its KV pool) as a descriptor; another process on the same machine maps it on
// its own GPU (the same GPU, or a peer GPU it can reach over NVLink/PCIe P2P) and writes
// into it with kernels. Descriptors carry the machine's boot id and the GPU's UUID so the
// importer can tell, before trying, whether the mapping can work at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tandem::cuda_model {

struct IpcPoolDescriptor {
  std::string host_id;      // HostId() of the exporting machine
  std::string device_uuid;  // 16 bytes: cudaDeviceProp::uuid of the GPU holding the memory
  std::string handle;       // 64 bytes: cudaIpcMemHandle_t
  uint64_t bytes = 0;       // length of the allocation
  int32_t pid = 0;          // the exporting process (logs; a handle cannot be opened by it)
};

// This machine's identity for IPC purposes: /proc/sys/kernel/random/boot_id (one value per
// running kernel, shared by containers and network namespaces on the host); "" if unreadable.
std::string HostId();

// The descriptor of `bytes` at `base` (the start of a cudaMalloc allocation) on `device`.
absl::StatusOr<IpcPoolDescriptor> ExportIpcPool(void* base, size_t bytes, int device);

// A peer's allocation mapped into this process; unmapped on destruction. Writes through
// base() from kernels on `device()` reach the peer's memory.
class IpcMapping {
 public:
  ~IpcMapping();
  IpcMapping(const IpcMapping&) = delete;
  IpcMapping& operator=(const IpcMapping&) = delete;
  void* base() const { return base_; }
  // The mapped allocation's length as the driver reports it (cuMemGetAddressRange), not
  // as the descriptor claimed: the bound every write through base() must stay within.
  uint64_t bytes() const { return bytes_; }
  int device() const { return device_; }            // the local device the mapping is used from
  bool same_device() const { return same_device_; }  // the memory lives on device() itself

 private:
  friend absl::StatusOr<std::unique_ptr<IpcMapping>> OpenIpcPool(const IpcPoolDescriptor&, int);
  IpcMapping() = default;
  void* base_ = nullptr;
  uint64_t bytes_ = 0;
  int device_ = 0;
  bool same_device_ = false;
};

// Maps `d` for use from local device `device`. FAILED_PRECONDITION (saying why) when the
// descriptor is from another machine, its GPU is not visible here, the two GPUs have no
// peer access, or the driver refuses the handle (e.g. opened by the process that exported
// it); INVALID_ARGUMENT for a malformed descriptor, or one claiming more bytes than the
// mapped allocation holds.
absl::StatusOr<std::unique_ptr<IpcMapping>> OpenIpcPool(const IpcPoolDescriptor& d, int device);

}  // namespace tandem::cuda_model
