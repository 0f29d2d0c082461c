// Peer KV pools mapped into this process, by IPC handle (cuda_ipc.h): opening a handle
// costs milliseconds and the driver maps one allocation once per process, so mappings are
// kept; those of processes that are gone are closed when a new pool is mapped (a
// restarted decode replica's would otherwise stay allocated on its GPU), and beyond
// `capacity` the oldest go (writers still holding one keep it mapped until they end).
// Not thread-safe: its owner's lock guards it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/cuda/cuda_ipc.h"

namespace tandem::cuda_model {

class IpcMappingCache {
 public:
  explicit IpcMappingCache(size_t capacity = 16) : capacity_(capacity) {}
  // The mapping of `d` for use from local `device`: a cached one, or OpenIpcPool's.
  absl::StatusOr<std::shared_ptr<IpcMapping>> Map(const IpcPoolDescriptor& d, int device);

 private:
  struct Mapped {
    std::shared_ptr<IpcMapping> mapping;
    int32_t pid = 0;  // the process that exported it
  };
  size_t capacity_;
  std::map<std::string, Mapped> mappings_;  // by IPC handle
  std::deque<std::string> order_;           // oldest first
};

}  // namespace tandem::cuda_model
