#include "services/worker/transfer_kv_transport.h"

#include <mutex>

namespace tandem {
namespace {

// Completion state shared by a session's batches (their callbacks may outlive the session).
struct SessionState {
  std::mutex mu;
  int outstanding = 0;
  absl::Status first_error;
  std::function<void(absl::Status)> done;  // set by Flush

  void BatchDone(absl::Status s) {
    std::function<void(absl::Status)> call;
    absl::Status result;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!s.ok() && first_error.ok()) first_error = s;
      if (--outstanding == 0 && done) {
        call.swap(done);
        result = first_error;
      }
    }
    if (call) call(result);
  }
};

class TransferKvSession : public KvWriteSession {
 public:
  TransferKvSession(transfer::TransferEngine* engine, transfer::RemoteMemoryDescriptor dest, absl::Duration timeout,
                    std::chrono::steady_clock::time_point write_deadline)
      : engine_(engine), dest_(std::move(dest)), timeout_(timeout), write_deadline_(write_deadline),
        state_(std::make_shared<SessionState>()) {
    batch_ = NewBatch();
  }

  absl::Status Put(const void* local, size_t length, uint64_t pool_offset) override {
    return batch_->Put(local, length, pool_offset);
  }

  void Commit() override {
    if (batch_->num_puts() == 0) return;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      ++state_->outstanding;
    }
    std::shared_ptr<SessionState> state = state_;
    batch_->Flush(timeout_, [state](absl::Status s) { state->BatchDone(std::move(s)); });
    batches_.push_back(std::move(batch_));
    batch_ = NewBatch();
  }

  void Flush(std::function<void(absl::Status)> done) override {
    Commit();
    absl::Status result;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (state_->outstanding > 0) {
        state_->done = std::move(done);
        return;
      }
      result = state_->first_error;
    }
    done(result);
  }

 private:
  std::unique_ptr<transfer::TransferBatch> NewBatch() {
    std::unique_ptr<transfer::TransferBatch> b = engine_->NewBatch(dest_);
    b->set_write_deadline(write_deadline_);
    return b;
  }

  transfer::TransferEngine* engine_;
  transfer::RemoteMemoryDescriptor dest_;
  absl::Duration timeout_;
  std::chrono::steady_clock::time_point write_deadline_;
  std::shared_ptr<SessionState> state_;
  std::unique_ptr<transfer::TransferBatch> batch_;
  std::vector<std::unique_ptr<transfer::TransferBatch>> batches_;  // flushed, completing
};

}  // namespace

absl::StatusOr<KvTransport::Pool> TransferKvTransport::AllocatePool(size_t bytes) {
  absl::StatusOr<std::unique_ptr<transfer::MemoryRegion>> region = engine_->AllocateMemory(bytes);
  if (!region.ok()) return region.status();
  pool_ = std::move(*region);
  return Pool{.base = pool_->base(), .bytes = pool_->length(), .descriptor = pool_->descriptor().Serialize()};
}

absl::StatusOr<KvTransport::Pool> TransferKvTransport::RegisterPool(void* base, size_t bytes) {
  absl::StatusOr<std::unique_ptr<transfer::MemoryRegion>> region = engine_->RegisterMemory(base, bytes);
  if (!region.ok()) return region.status();
  pool_ = std::move(*region);
  return Pool{.base = pool_->base(), .bytes = pool_->length(), .descriptor = pool_->descriptor().Serialize()};
}

absl::StatusOr<std::unique_ptr<KvWriteSession>> TransferKvTransport::OpenSession(
    const std::string& pool_descriptor, std::chrono::steady_clock::time_point write_deadline) {
  absl::StatusOr<transfer::RemoteMemoryDescriptor> dest = transfer::RemoteMemoryDescriptor::Parse(pool_descriptor);
  if (!dest.ok()) return dest.status();
  return std::unique_ptr<KvWriteSession>(
      new TransferKvSession(engine_, std::move(*dest), batch_timeout_, write_deadline));
}

}  // namespace tandem
