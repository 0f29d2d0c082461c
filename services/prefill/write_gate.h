// Whether a request's KV may be written into its destination yet: closed until the decode
// replica has recorded this replica as a writer of the lease (Decode.BeginWrites), then
// open, or shut for good when it refused or could not be reached. The sinks write nothing
// while it is closed: the transfer sink keeps its puts back (the layers keep computing and
// staging meanwhile), the device sink waits before its first copy. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/status.h"

namespace tandem {

class WriteGate {
 public:
  // Once: OK (writes may start) or why they must not (ABORTED). Later calls are ignored.
  void Resolve(absl::Status s);
  // Nullopt while closed and unresolved.
  std::optional<absl::Status> state() const;
  // Calls `f` once resolved: inline when it already is, else on the resolving thread.
  void OnResolved(std::function<void(const absl::Status&)> f);
  // Blocks until resolved or `deadline` (DEADLINE_EXCEEDED then).
  absl::Status Wait(std::chrono::steady_clock::time_point deadline);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<absl::Status> state_;
  std::vector<std::function<void(const absl::Status&)>> waiting_;
};

}  // namespace tandem
