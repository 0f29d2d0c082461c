// KvTransport over the transfer layer (services/common/transfer): UCX between processes,
// the in-process engine in tests. Each Commit hands the puts queued so far to the
// transport as one batch; Flush waits for every batch of the session.
#pragma once

#include <memory>

#include "services/common/transfer/transfer_engine.h"
#include "services/worker/kv_transport.h"

namespace tandem {

class TransferKvTransport : public KvTransport {
 public:
  // `engine` must outlive this object. `batch_timeout`: how long one batch may take.
  TransferKvTransport(transfer::TransferEngine* engine, absl::Duration batch_timeout = absl::Seconds(30))
      : engine_(engine), batch_timeout_(batch_timeout) {}

  absl::StatusOr<Pool> AllocatePool(size_t bytes) override;
  absl::StatusOr<Pool> RegisterPool(void* base, size_t bytes) override;
  absl::StatusOr<std::unique_ptr<KvWriteSession>> OpenSession(
      const std::string& pool_descriptor, std::chrono::steady_clock::time_point write_deadline) override;
  std::string name() const override { return std::string(engine_->transport()); }

 private:
  transfer::TransferEngine* engine_;
  absl::Duration batch_timeout_;
  std::unique_ptr<transfer::MemoryRegion> pool_;
};

}  // namespace tandem
