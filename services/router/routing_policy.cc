#include "services/router/routing_policy.h"

namespace tandem {

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
