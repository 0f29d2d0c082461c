// Channels to the internal services of peers named in messages (a decode replica's
// address in a KV destination, a writer's address on a lease), opened with the cluster's
// credentials and kept by address. Bounded: past `capacity` the least recently used is
// dropped (calls in flight on it keep it alive). Thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "services/security/channel_factory.h"

namespace tandem {

class ChannelCache {
 public:
  // `args` go to every channel (e.g. a short reconnect backoff).
  ChannelCache(security::ChannelFactory factory, size_t capacity, grpc::ChannelArguments args = {})
      : factory_(std::move(factory)), capacity_(capacity), args_(std::move(args)) {}

  std::shared_ptr<grpc::Channel> Get(const std::string& address);
  size_t size() const;

 private:
  struct Entry {
    std::shared_ptr<grpc::Channel> channel;
    std::list<std::string>::iterator use;
  };
  const security::ChannelFactory factory_;
  const size_t capacity_;
  const grpc::ChannelArguments args_;
  mutable std::mutex mu_;
  std::map<std::string, Entry> channels_;
  std::list<std::string> uses_;  // most recent first
};

}  // namespace tandem
