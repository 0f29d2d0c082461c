#include "services/router/routing_policy.h"

#include <algorithm>
#include <vector>

namespace tandem {

double KvRoomOnOneRank(int64_t free, std::span<const int64_t> rank_free, int32_t in_flight, double need) {
  if (rank_free.size() <= 1) {
    // (The one-rank formula exactly, so that one-rank replicas compare as they always did.)
    return static_cast<double>(rank_free.empty() ? free : rank_free[0]) - need * in_flight;
  }
  std::vector<double> room(rank_free.begin(), rank_free.end());
  // Greedy, one request at a time: in flight counts are small (the router's queues bound
  // them) and ranks few, and the greedy order is the scheduler's.
  for (int32_t i = 0; i < in_flight; ++i) *std::max_element(room.begin(), room.end()) -= need;
  return *std::max_element(room.begin(), room.end());
}

absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(const std::string& name) {
  if (name == "round-robin") return RoutingPolicy::kRoundRobin;
  if (name == "least-outstanding") return RoutingPolicy::kLeastOutstanding;
  if (name == "power-of-two") return RoutingPolicy::kPowerOfTwo;
  if (name == "cache-aware") return RoutingPolicy::kCacheAware;
  if (name == "kv-aware") return RoutingPolicy::kKvAware;
  return absl::InvalidArgumentError("routing policy '" + name +
                                    "' (round-robin, least-outstanding, power-of-two, cache-aware, kv-aware)");
}

std::string RoutingPolicyName(RoutingPolicy p) {
  switch (p) {
    case RoutingPolicy::kRoundRobin: return "round-robin";
    case RoutingPolicy::kLeastOutstanding: return "least-outstanding";
    case RoutingPolicy::kPowerOfTwo: return "power-of-two";
    case RoutingPolicy::kCacheAware: return "cache-aware";
    case RoutingPolicy::kKvAware: return "kv-aware";
  }
  return "?";
}

}  // namespace tandem
