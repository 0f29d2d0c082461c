// What the prefill service needs of a request's KV sink, whichever way the KV travels: the
// transfer layer into the decode replica's host pool (TransferKvSink) or device to device
// into its GPU pool (DeviceKvSink).
#pragma once

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "engine/runtime/kv_sink.h"
#include "tandem/v1/internal.pb.h"

namespace tandem {

class OutgoingKvSink : public KvSink {
 public:
  // Completes every write; `done` gets the first error if any. Call once, after the
  // engine's final output for the request.
  virtual void Flush(std::function<void(absl::Status)> done) = 0;
  // What was written and its checksum, as the decode replica will check them (after Flush).
  virtual int64_t bytes() const = 0;
  virtual uint64_t checksum() const = 0;
  // Seconds from the first write to Flush completing (0 before).
  virtual double transfer_seconds() const = 0;
  virtual v1::KvPath path() const = 0;
};

}  // namespace tandem
