#include "engine/runtime/kv_leases.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tandem {

absl::StatusOr<std::vector<int32_t>> KvLeases::Reserve(const std::string& id, int32_t num_blocks, int32_t num_tokens,
                                                       double now) {
  if (Contains(id)) return absl::InvalidArgumentError(absl::StrCat("request id '", id, "' is already in use"));
  absl::StatusOr<std::vector<int32_t>> got = blocks_->Allocate(num_blocks);
  if (!got.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("ReserveKv: ", num_blocks, " KV blocks needed, ", blocks_->num_free(), " free",
                     quarantined_blocks_ > 0 ? absl::StrCat(" (", quarantined_blocks_, " quarantined)") : ""));
  }
  live_[id] = {.r = {.blocks = *got, .num_tokens = num_tokens}, .until = now + lease_seconds_};
  return *got;
}

std::optional<KvLeases::Reservation> KvLeases::Take(const std::string& id) {
  auto it = live_.find(id);
  if (it == live_.end()) return std::nullopt;
  Reservation r = std::move(it->second.r);
  live_.erase(it);
  return r;
}

bool KvLeases::Release(const std::string& id) {
  if (auto it = live_.find(id); it != live_.end()) {
    blocks_->Release(it->second.r.blocks);
    live_.erase(it);
    return true;
  }
  if (auto it = quarantined_.find(id); it != quarantined_.end()) {
    blocks_->Release(it->second.r.blocks);
    quarantined_blocks_ -= static_cast<int64_t>(it->second.r.blocks.size());
    quarantined_.erase(it);
    counts_.quarantine_released++;
    return true;
  }
  return false;
}

void KvLeases::Tick(double now) {
  for (auto it = quarantined_.begin(); it != quarantined_.end();) {
    if (it->second.until <= now) {
      blocks_->Release(it->second.r.blocks);
      quarantined_blocks_ -= static_cast<int64_t>(it->second.r.blocks.size());
      counts_.quarantine_timeouts++;
      it = quarantined_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = live_.begin(); it != live_.end();) {
    if (it->second.until > now) {
      ++it;
      continue;
    }
    // A writer may still be putting into these blocks: they stay allocated (see the header).
    auto node = live_.extract(it++);
    node.mapped().until = now + quarantine_seconds_;
    quarantined_blocks_ += static_cast<int64_t>(node.mapped().r.blocks.size());
    counts_.expired++;
    quarantined_.insert(std::move(node));
  }
}

double KvLeases::NextDeadline() const {
  double next = std::numeric_limits<double>::infinity();
  for (const auto& [id, h] : live_) next = std::min(next, h.until);
  for (const auto& [id, h] : quarantined_) next = std::min(next, h.until);
  return next;
}

void KvLeases::ReleaseAll() {
  for (auto& [id, h] : live_) blocks_->Release(h.r.blocks);
  for (auto& [id, h] : quarantined_) blocks_->Release(h.r.blocks);
  live_.clear();
  quarantined_.clear();
  quarantined_blocks_ = 0;
}

KvLeaseStats KvLeases::stats() const {
  KvLeaseStats s = counts_;
  s.quarantined_blocks = quarantined_blocks_;
  s.quarantined_leases = static_cast<int64_t>(quarantined_.size());
  return s;
}

}  // namespace tandem
