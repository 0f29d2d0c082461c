// The prober's WriterStateClient over gRPC (kv_writer_prober.h): Prefill.WriterState on
// channels from a bounded cache, with the cluster's credentials, each call under its own
// deadline; "nothing listens" from a TCP connect (services/common/tcp_probe.h).
#pragma once

#include <chrono>
#include <string>

#include "services/decode/kv_writer_prober.h"
#include "services/worker/channel_cache.h"

namespace tandem {

class GrpcWriterStateClient final : public WriterStateClient {
 public:
  // `channels` must outlive the client.
  GrpcWriterStateClient(ChannelCache* channels, std::chrono::milliseconds call_timeout,
                        std::chrono::milliseconds connect_timeout)
      : channels_(channels), call_timeout_(call_timeout), connect_timeout_(connect_timeout) {}

  void Ask(const std::string& address, const v1::WriterStateRequest& request,
           std::function<void(absl::StatusOr<v1::WriterStateResponse>)> done) override;
  bool NothingListens(const std::string& address) override;

 private:
  ChannelCache* channels_;
  const std::chrono::milliseconds call_timeout_;
  const std::chrono::milliseconds connect_timeout_;
};

}  // namespace tandem
