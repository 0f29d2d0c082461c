// How a client of the internal services opens a channel: the credentials (mutual TLS, a
// cluster token, or none) are the factory's business, so that the code holding channels
// (the router's replica registry, worker registration, the kvstore client) need not know
// them. InternalCredentials::ChannelFactory() makes the one every binary uses.
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

namespace tandem::security {

using ChannelFactory =
    std::function<std::shared_ptr<grpc::Channel>(const std::string& address, const grpc::ChannelArguments& args)>;

// The factory of an unauthenticated cluster (loopback only, see listen_policy.h), and what
// an empty ChannelFactory stands for.
inline std::shared_ptr<grpc::Channel> InsecureChannel(const std::string& address, const grpc::ChannelArguments& args) {
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

inline std::shared_ptr<grpc::Channel> OpenChannel(const ChannelFactory& factory, const std::string& address,
                                                  const grpc::ChannelArguments& args = {}) {
  return factory ? factory(address, args) : InsecureChannel(address, args);
}

}  // namespace tandem::security
