#include "engine/model/cuda/ipc_mapping_cache.h"

#include <signal.h>

#include <algorithm>
#include <cerrno>

namespace tandem::cuda_model {

absl::StatusOr<std::shared_ptr<IpcMapping>> IpcMappingCache::Map(const IpcPoolDescriptor& d, int device) {
  auto it = mappings_.find(d.handle);
  if (it != mappings_.end()) return it->second.mapping;
  // A process in another PID namespace may look gone: its pool is then just mapped again
  // on next use.
  for (auto m = mappings_.begin(); m != mappings_.end();) {
    if (m->second.mapping.use_count() == 1 && ::kill(m->second.pid, 0) != 0 && errno == ESRCH) {
      std::erase(order_, m->first);
      m = mappings_.erase(m);
    } else {
      ++m;
    }
  }
  absl::StatusOr<std::unique_ptr<IpcMapping>> opened = OpenIpcPool(d, device);
  if (!opened.ok()) return opened.status();
  std::shared_ptr<IpcMapping> shared(std::move(*opened));
  mappings_[d.handle] = {shared, d.pid};
  order_.push_back(d.handle);
  if (order_.size() > capacity_) {
    mappings_.erase(order_.front());
    order_.pop_front();
  }
  return shared;
}

}  // namespace tandem::cuda_model
