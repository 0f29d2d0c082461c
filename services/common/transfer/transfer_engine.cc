#include "services/common/transfer/transfer_engine.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/common/check.h"
#include "services/common/transfer/event.h"

namespace tandem::transfer {

TransferBatch::TransferBatch(TransferEngine* engine, RemoteMemoryDescriptor destination)
    : engine_(engine), destination_(std::move(destination)) {}

TransferBatch::~TransferBatch() = default;

absl::Status TransferBatch::Put(const void* local, size_t length, uint64_t remote_offset) {
  if (flushed_) return absl::FailedPreconditionError("Put on a batch that was already flushed");
  if (length == 0) return absl::OkStatus();
  if (local == nullptr) return absl::InvalidArgumentError("Put of a null local buffer");
  if (remote_offset > destination_.length || length > destination_.length - remote_offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        "put of ", length, " bytes at remote offset ", remote_offset,
        " is outside the destination region of ", destination_.length, " bytes"));
  }
  bytes_ += length;
  if (!puts_.empty()) {
    // Contiguous on both sides (consecutive blocks of a request): one larger put.
    PutOp& last = puts_.back();
    if (static_cast<const char*>(last.local) + last.length == local &&
        last.remote_offset + last.length == remote_offset) {
      last.length += length;
      return absl::OkStatus();
    }
  }
  puts_.push_back(PutOp{local, remote_offset, length});
  return absl::OkStatus();
}

void TransferBatch::Flush(absl::Duration timeout, TransferCallback done) {
  TANDEM_CHECK(done != nullptr) << "Flush needs a completion callback";
  TransferEngine::Submission s;
  s.deadline = absl::Now() + timeout;
  s.write_deadline = write_deadline_;
  s.done = std::move(done);
  if (flushed_) {
    s.error = absl::FailedPreconditionError("batch flushed twice");
  } else if (destination_.transport != engine_->transport()) {
    s.error = absl::InvalidArgumentError(
        absl::StrCat("destination belongs to transport '", destination_.transport,
                     "', this engine is '", std::string(engine_->transport()), "'"));
  } else {
    s.destination = destination_;
    s.puts = std::move(puts_);
    s.bytes = bytes_;
  }
  flushed_ = true;
  puts_.clear();
  engine_->Submit(std::move(s));
}

absl::Status TransferBatch::Wait(absl::Duration timeout) {
  TANDEM_CHECK(!engine_->OnCompletionThread())
      << "TransferBatch::Wait on the engine's completion thread would deadlock";
  internal::Event finished;
  absl::Status result;
  Flush(timeout, [&](absl::Status status) {
    result = std::move(status);
    finished.Notify();
  });
  finished.Wait();
  return result;
}

std::unique_ptr<TransferBatch> TransferEngine::NewBatch(RemoteMemoryDescriptor destination) {
  return std::unique_ptr<TransferBatch>(new TransferBatch(this, std::move(destination)));
}

absl::Status TransferEngine::PutAllowed(const Submission& s) {
  if (s.write_deadline == std::chrono::steady_clock::time_point::max() ||
      std::chrono::steady_clock::now() < s.write_deadline) {
    return absl::OkStatus();
  }
  return absl::DeadlineExceededError("the write deadline of the destination's lease passed: no more puts");
}

TransferStats TransferEngine::stats() const {
  TransferStats s;
  s.bytes_put = bytes_put_.load(std::memory_order_relaxed);
  s.puts = puts_.load(std::memory_order_relaxed);
  s.batches_ok = batches_ok_.load(std::memory_order_relaxed);
  s.batches_failed = batches_failed_.load(std::memory_order_relaxed);
  s.endpoints_created = endpoints_created_.load(std::memory_order_relaxed);
  s.endpoint_failures = endpoint_failures_.load(std::memory_order_relaxed);
  return s;
}

void TransferEngine::CountBatch(const Submission& s, const absl::Status& status) {
  if (status.ok()) {
    bytes_put_.fetch_add(s.bytes, std::memory_order_relaxed);
    puts_.fetch_add(s.puts.size(), std::memory_order_relaxed);
    batches_ok_.fetch_add(1, std::memory_order_relaxed);
  } else {
    batches_failed_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace tandem::transfer
