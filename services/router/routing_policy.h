// How the router chooses a replica of a role (docs/design.md §6), per role by flag:
//   round-robin        in turn;
//   least-outstanding  fewest requests in flight from this router (+ reported waiting);
//   power-of-two       the less loaded of two picked at random;
//   cache-aware        (prefill) the longest cached prefix of the prompt, in blocks, from
//                      the replica's KV events, minus load_weight x its load;
//   kv-aware           (decode) the most free KV blocks once this router's in-flight
//                      requests are counted, then the smallest running batch.
// A data-parallel replica (one that reports each rank's free KV blocks) counts as its
// ranks: kv-aware looks at the free blocks of the one rank the request would land on, and
// the load-based policies at its load per rank (docs/parallel.md, "DP-aware routing").
// A one-rank replica is scored as before.
#pragma once

#include <cstdint>
#include <span>
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

// kv-aware's measure: the free KV blocks left on the pool a request of `need` blocks would
// land in, once this router's `in_flight` requests there are counted (about `need` blocks
// each, as the policy assumes). One pool (`rank_free` empty): `free - need x in_flight`,
// the policy as it was. Data-parallel ranks (`rank_free`, one entry per rank): each request
// in flight goes to the rank with the most free blocks, as the replica's scheduler places
// reservations (equal pools: the least in use; ties to the lower rank), then the most any
// rank has left. Not the sum: a sequence's KV must fit one rank's pool.
double KvRoomOnOneRank(int64_t free, std::span<const int64_t> rank_free, int32_t in_flight, double need);

// The ranks a replica's requests are spread over, for load per rank: the data-parallel
// ranks it reports (`rank_free`'s size), or 1.
inline int32_t LoadRanks(std::span<const int64_t> rank_free) {
  return rank_free.size() > 1 ? static_cast<int32_t>(rank_free.size()) : 1;
}

}  // namespace tandem
