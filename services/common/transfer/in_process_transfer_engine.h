// InProcessTransferEngine: the TransferEngine contract within one process, by memcpy, for
// tests of the code above the transfer layer (prefill/decode logic without UCX).
//
// Each engine has an address ("inproc:N") registered in a process-wide table; a descriptor
// names the engine and the region. Batches complete on the engine's own completion thread,
// like the UCX engine's, so callers see the same threading. Puts into an engine that was
// destroyed fail with UNAVAILABLE, into a region that was deregistered with
// FAILED_PRECONDITION; InjectFailure makes batches fail on demand.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "services/common/transfer/transfer_engine.h"

namespace tandem::transfer {

namespace internal {
struct InProcessNode;  // one engine's regions, in the process-wide table
}  // namespace internal

class InProcessTransferEngine final : public TransferEngine {
 public:
  InProcessTransferEngine();
  // Completes the batches still queued (their puts still land), then unregisters.
  ~InProcessTransferEngine() override;

  std::string_view transport() const override { return "inproc"; }
  std::string address() const override;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterMemory(void* base,
                                                               size_t length) override;
  absl::StatusOr<std::unique_ptr<MemoryRegion>> AllocateMemory(size_t length) override;

  // While `status` is not OK, every batch this engine flushes completes with it and writes
  // nothing. OkStatus() turns it off. Thread-safe.
  void InjectFailure(absl::Status status);

 protected:
  void Submit(Submission submission) override;
  bool OnCompletionThread() const override;

 private:
  using Node = internal::InProcessNode;
  class Region;
  class Completer;
  void Execute(Submission& s);
  absl::StatusOr<std::unique_ptr<MemoryRegion>> Map(void* base, size_t length, bool owned);

  std::shared_ptr<Node> node_;
  std::unique_ptr<Completer> completer_;
};

}  // namespace tandem::transfer
