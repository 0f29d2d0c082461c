// How a prefill replica tells a decode replica about its writes into a lease:
// Decode.BeginWrites before the first (it writes only once that is answered OK) and
// Decode.EndWrites after the last. Over gRPC (GrpcKvWriteNotices, channels by address with
// the cluster's credentials) or a fake in tests.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "services/worker/channel_cache.h"
#include "tandem/v1/internal.pb.h"

namespace tandem {

class KvWriteNotices {
 public:
  virtual ~KvWriteNotices() = default;
  // `done` runs once, on any thread, and must not block: OK when the decode replica
  // recorded the writer; FAILED_PRECONDITION when it refused (the lease is not live);
  // anything else when the outcome is unknown (it may have recorded it).
  virtual void BeginWrites(const std::string& decode_address, const v1::BeginWritesRequest& request,
                           std::chrono::steady_clock::time_point deadline, std::function<void(absl::Status)> done) = 0;
  // Fire and forget: a lost notice is made up for by the decode replica asking this one
  // (Prefill.WriterState).
  virtual void EndWrites(const std::string& decode_address, const v1::EndWritesRequest& request) = 0;
};

class GrpcKvWriteNotices final : public KvWriteNotices {
 public:
  // At most `max_channels` decode replicas' channels are kept.
  GrpcKvWriteNotices(security::ChannelFactory factory, size_t max_channels) : channels_(std::move(factory), max_channels) {}

  void BeginWrites(const std::string& decode_address, const v1::BeginWritesRequest& request,
                   std::chrono::steady_clock::time_point deadline, std::function<void(absl::Status)> done) override;
  void EndWrites(const std::string& decode_address, const v1::EndWritesRequest& request) override;

 private:
  ChannelCache channels_;
};

}  // namespace tandem
