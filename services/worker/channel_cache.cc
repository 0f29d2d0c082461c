#include "services/worker/channel_cache.h"

namespace tandem {

std::shared_ptr<grpc::Channel> ChannelCache::Get(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = channels_.find(address); it != channels_.end()) {
    uses_.splice(uses_.begin(), uses_, it->second.use);
    return it->second.channel;
  }
  while (!uses_.empty() && channels_.size() >= capacity_) {
    channels_.erase(uses_.back());
    uses_.pop_back();
  }
  uses_.push_front(address);
  std::shared_ptr<grpc::Channel> c = security::OpenChannel(factory_, address, args_);
  channels_[address] = {c, uses_.begin()};
  return c;
}

size_t ChannelCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return channels_.size();
}

}  // namespace tandem
