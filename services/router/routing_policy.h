// How the router chooses a replica of a role (docs/design.md §6), per role by flag:
//   round-robin        in turn;
//   least-outstanding  fewest requests in flight from this router (+ reported waiting);
//   power-of-two       the less loaded of two picked at random;
//   cache-aware        (prefill) the longest cached prefix of the prompt, in blocks, from
//                      the replica's KV events, minus load_weight x its load;
//   kv-aware           (decode) the most free KV blocks once this router's in-flight
//                      requests are counted, then the smallest running batch.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace tandem {

enum class RoutingPolicy { kRoundRobin, kLeastOutstanding, kPowerOfTwo, kCacheAware, kKvAware };

// Errors: INVALID_ARGUMENT listing the names.
absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(const std::string& name);
std::string RoutingPolicyName(RoutingPolicy p);

struct RoutingWeights {
  // cache-aware: a request in flight costs as much as this many cached prefix blocks.
  double cache_aware_load_weight = 4.0;
};

}  // namespace tandem
