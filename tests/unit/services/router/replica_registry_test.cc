// The router's replica registry: what each routing policy picks (round-robin turns,
// exclusions, draining replicas, load, cached prefixes, free KV; data-parallel replicas'
// free KV per rank and load per rank), the prefix scoring
// running outside the registry's mutex (a pick held up scoring one replica leaves
// heartbeats, registrations and listings free), and picks racing heartbeats that change
// the cached blocks (the tsan build runs this test too), and who is dropped for silence
// on an injected clock (a starved router drops nobody).
#include "services/router/replica_registry.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

namespace tandem {
namespace {

std::vector<uint64_t> Hashes(int n) {
  std::vector<uint64_t> h;
  for (int i = 0; i < n; ++i) h.push_back(0x1000 + static_cast<uint64_t>(i));
  return h;
}

v1::LoadReport Load(int32_t waiting, int64_t kv_free = 0, int32_t running = 0, std::vector<int64_t> rank_free = {}) {
  v1::LoadReport l;
  l.set_waiting(waiting);
  l.set_kv_blocks_free(kv_free);
  l.set_running(running);
  for (int64_t f : rank_free) l.add_rank_kv_blocks_free(f);
  return l;
}

class ReplicaRegistryTest : public ::testing::Test {
 protected:
  // Registers a replica of `role` at a made-up address, with `cached` leading blocks of
  // Hashes() in its prefix cache. Returns its id.
  std::string Add(v1::Role role, int cached, v1::LoadReport load = {}) {
    v1::RegisterRequest r;
    r.set_role(role);
    r.set_grpc_address("127.0.0.1:" + std::to_string(40000 + next_port_++));
    *r.mutable_load() = load;
    for (uint64_t h : Hashes(cached)) r.mutable_kv_events()->add_stored(h);
    r.mutable_kv_events()->set_full(true);
    absl::StatusOr<std::string> id = registry_.Register(r);
    EXPECT_TRUE(id.ok()) << id.status();
    return *id;
  }
  ReplicaPtr Find(const std::string& id) {
    for (v1::Role role : {v1::ROLE_PREFILL, v1::ROLE_DECODE, v1::ROLE_BOTH}) {
      for (const ReplicaPtr& r : registry_.Candidates(role)) {
        if (r->id == id) return r;
      }
    }
    return nullptr;
  }
  void Beat(const std::string& id, const v1::LoadReport& load) {
    v1::HeartbeatRequest hb;
    hb.set_replica_id(id);
    *hb.mutable_load() = load;
    ASSERT_TRUE(registry_.Heartbeat(hb));
  }
  std::string Pick(v1::Role role, RoutingPolicy policy, int prompt_blocks = 8, std::vector<std::string> exclude = {}) {
    const std::vector<uint64_t> h = Hashes(prompt_blocks);
    ReplicaPtr r = registry_.Pick(role, policy, h, exclude, weights_);
    return r ? r->id : "";
  }

  ReplicaRegistry registry_{{}};
  RoutingWeights weights_;
  int next_port_ = 0;
};

TEST_F(ReplicaRegistryTest, RoundRobinTakesTurnsSkippingExcludedAndDraining) {
  const std::string a = Add(v1::ROLE_PREFILL, 0), b = Add(v1::ROLE_PREFILL, 0), c = Add(v1::ROLE_PREFILL, 0);
  Add(v1::ROLE_DECODE, 0);
  std::vector<std::string> picks;
  for (int i = 0; i < 6; ++i) picks.push_back(Pick(v1::ROLE_PREFILL, RoutingPolicy::kRoundRobin));
  EXPECT_EQ(picks, (std::vector<std::string>{a, b, c, a, b, c}));
  EXPECT_EQ(Pick(v1::ROLE_PREFILL, RoutingPolicy::kRoundRobin, 8, {a, c}), b);
  EXPECT_EQ(Pick(v1::ROLE_PREFILL, RoutingPolicy::kRoundRobin, 8, {a, b, c}), "");
  v1::HeartbeatRequest hb;
  hb.set_replica_id(b);
  hb.set_draining(true);
  ASSERT_TRUE(registry_.Heartbeat(hb));
  for (int i = 0; i < 4; ++i) EXPECT_NE(Pick(v1::ROLE_PREFILL, RoutingPolicy::kRoundRobin), b);
  EXPECT_EQ(Pick(v1::ROLE_BOTH, RoutingPolicy::kRoundRobin), "");
}

TEST_F(ReplicaRegistryTest, LoadAndKvPoliciesPickTheLeastLoadedAndTheMostFree) {
  const std::string busy = Add(v1::ROLE_DECODE, 0, Load(5, 100, 1));
  const std::string idle = Add(v1::ROLE_DECODE, 0, Load(1, 40, 9));
  const std::string roomy = Add(v1::ROLE_DECODE, 0, Load(3, 100, 0));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Pick(v1::ROLE_DECODE, RoutingPolicy::kLeastOutstanding), idle);
  // busy and roomy both have 100 free blocks: the smaller running batch wins.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Pick(v1::ROLE_DECODE, RoutingPolicy::kKvAware), roomy);
  // A request of this router in flight on roomy costs it a request's blocks (8 + 1).
  ReplicaLease lease(Find(roomy));
  EXPECT_EQ(Pick(v1::ROLE_DECODE, RoutingPolicy::kKvAware), busy);
  EXPECT_EQ(Pick(v1::ROLE_DECODE, RoutingPolicy::kLeastOutstanding), idle);
  // Power of two picks the less loaded of two: never the most loaded of three.
  for (int i = 0; i < 20; ++i) EXPECT_NE(Pick(v1::ROLE_DECODE, RoutingPolicy::kPowerOfTwo), busy);
}

TEST_F(ReplicaRegistryTest, CacheAwarePicksTheLongestCachedPrefixLessItsLoad) {
  const std::string cold = Add(v1::ROLE_PREFILL, 2);
  const std::string warm = Add(v1::ROLE_PREFILL, 6);
  const std::string warmer = Add(v1::ROLE_PREFILL, 12, Load(2));
  // 12 - 4 x 2 = 4 < 6: the load outweighs the longer prefix.
  EXPECT_EQ(Pick(v1::ROLE_PREFILL, RoutingPolicy::kCacheAware, 16), warm);
  weights_.cache_aware_load_weight = 1.0;  // 12 - 2 = 10 > 6
  EXPECT_EQ(Pick(v1::ROLE_PREFILL, RoutingPolicy::kCacheAware, 16), warmer);
  EXPECT_EQ(Pick(v1::ROLE_PREFILL, RoutingPolicy::kCacheAware, 16, {warmer}), warm);
  // Only the leading run counts: a prompt sharing no first block scores 0 everywhere,
  // and the load decides.
  const std::vector<uint64_t> other = {0x99, 0x1000, 0x1001};
  EXPECT_NE(registry_.Pick(v1::ROLE_PREFILL, RoutingPolicy::kCacheAware, other, {}, weights_)->id, warmer);
  // KV events move the preference: warm evicts its blocks.
  v1::HeartbeatRequest hb;
  hb.set_replica_id(warm);
  for (uint64_t h : Hashes(6)) hb.mutable_kv_events()->add_removed(h);
  ASSERT_TRUE(registry_.Heartbeat(hb));
  EXPECT_EQ(registry_.PrefixOverlap(*Find(warm), Hashes(16)), 0);
  EXPECT_EQ(Pick(v1::ROLE_PREFILL, RoutingPolicy::kCacheAware, 16, {warmer}), cold);
  v1::ListReplicasResponse list;
  registry_.List(&list);
  for (const v1::ReplicaInfo& r : list.replicas()) {
    EXPECT_EQ(r.cached_blocks(), r.replica_id() == warmer ? 12 : r.replica_id() == cold ? 2 : 0) << r.replica_id();
  }
}

// The pick's prefix scoring waits on one replica's cache lock (held here as a long KV
// event update would hold it) while the registry's mutex is free: heartbeats of other
// replicas, registrations, listings and picks of another role go on. (A pick that scored
// under the registry's mutex would block all of them until the scoring ended.)
TEST_F(ReplicaRegistryTest, ScoringRunsOutsideTheRegistryMutex) {
  const std::string a = Add(v1::ROLE_PREFILL, 4);
  const std::string b = Add(v1::ROLE_PREFILL, 8);
  Add(v1::ROLE_DECODE, 0, Load(0, 50));
  ReplicaPtr held = Find(a);
  std::unique_lock<std::shared_mutex> cache(held->cache_mu);
  std::atomic<bool> started{false};
  auto pick = std::async(std::launch::async, [&] {
    started = true;
    return Pick(v1::ROLE_PREFILL, RoutingPolicy::kCacheAware, 8);
  });
  while (!started) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let it reach the held replica
  v1::HeartbeatRequest hb;
  hb.set_replica_id(b);
  hb.mutable_kv_events()->add_stored(0x1008);
  EXPECT_TRUE(registry_.Heartbeat(hb));
  const std::string c = Add(v1::ROLE_PREFILL, 0);
  v1::ListReplicasResponse list;
  registry_.List(&list);
  EXPECT_EQ(list.replicas_size(), 4);
  EXPECT_NE(Pick(v1::ROLE_DECODE, RoutingPolicy::kKvAware), "");
  EXPECT_EQ(registry_.KvStores().size(), 0u);
  cache.unlock();
  EXPECT_EQ(pick.get(), b);
}

// A data-parallel replica reporting each rank's free blocks [6, 6] (12 in all) and a
// one-rank replica with 10: a request of 8 blocks fits only the latter, though the DP
// replica has more free in total; one of 5 fits both, and goes where the pool it lands in
// has the most room (10 > 6) until the one-rank replica has less room than a DP rank.
TEST_F(ReplicaRegistryTest, KvAwareCountsTheFreeBlocksOfOneRankNotTheReplicasSum) {
  const std::string dp = Add(v1::ROLE_DECODE, 0, Load(0, 12, 0, {6, 6}));
  const std::string one = Add(v1::ROLE_DECODE, 0, Load(0, 10, 0));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Pick(v1::ROLE_DECODE, RoutingPolicy::kKvAware, /*prompt_blocks=*/7), one);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Pick(v1::ROLE_DECODE, RoutingPolicy::kKvAware, 4), one);
  Beat(one, Load(0, 5, 0));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Pick(v1::ROLE_DECODE, RoutingPolicy::kKvAware, 4), dp);
  // One rank of the DP replica full, the other roomy: its room is that rank's.
  Beat(dp, Load(0, 9, 0, {0, 9}));
  EXPECT_EQ(Pick(v1::ROLE_DECODE, RoutingPolicy::kKvAware, 7), dp);
  // 8 free in all, but 4 on each rank: a request of 5 blocks goes to the one-rank
  // replica's 5 (the replica's sum would have sent it where no rank can hold it).
  Beat(dp, Load(0, 8, 0, {4, 4}));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Pick(v1::ROLE_DECODE, RoutingPolicy::kKvAware, 4), one);
  // The listing carries the ranks' figures.
  v1::ListReplicasResponse list;
  registry_.List(&list);
  for (const v1::ReplicaInfo& r : list.replicas()) {
    EXPECT_EQ(r.load().rank_kv_blocks_free_size(), r.replica_id() == dp ? 2 : 0) << r.replica_id();
  }
}

// The router's requests in flight on a DP replica are counted on the ranks its scheduler
// would place them on (the most free first), not all taken from the roomiest rank: with
// [20, 20] and one request of 9 blocks in flight, a rank still has 20 (> a one-rank
// replica's 15); with two, 11 (< 15).
TEST_F(ReplicaRegistryTest, KvAwareSpreadsRequestsInFlightOverTheRanks) {
  EXPECT_EQ(KvRoomOnOneRank(40, std::vector<int64_t>{20, 20}, 0, 9), 20);
  EXPECT_EQ(KvRoomOnOneRank(40, std::vector<int64_t>{20, 20}, 1, 9), 20);
  EXPECT_EQ(KvRoomOnOneRank(40, std::vector<int64_t>{20, 20}, 2, 9), 11);
  EXPECT_EQ(KvRoomOnOneRank(40, std::vector<int64_t>{20, 20}, 5, 9), 2);  // three on rank 0, two on 1
  EXPECT_EQ(KvRoomOnOneRank(30, std::vector<int64_t>{5, 25}, 2, 9), 7);  // both on rank 1
  // One rank: the free blocks less every request in flight, as before.
  EXPECT_EQ(KvRoomOnOneRank(40, {}, 2, 9), 22);
  const std::string dp = Add(v1::ROLE_DECODE, 0, Load(0, 40, 0, {20, 20}));
  const std::string one = Add(v1::ROLE_DECODE, 0, Load(0, 15, 0));
  EXPECT_EQ(Pick(v1::ROLE_DECODE, RoutingPolicy::kKvAware), dp);  // 20 > 15
  ReplicaLease first(Find(dp));
  // [11, 20]: still 20 (taking the request from the roomiest rank's figure would say 11).
  EXPECT_EQ(Pick(v1::ROLE_DECODE, RoutingPolicy::kKvAware), dp);
  ReplicaLease second(Find(dp));
  EXPECT_EQ(Pick(v1::ROLE_DECODE, RoutingPolicy::kKvAware), one);  // 11 < 15
}

// Least-outstanding, power-of-two and cache-aware compare load per rank: a DP2 replica
// with 3 requests (1.5 a rank) is less loaded than a one-rank replica with 2.
TEST_F(ReplicaRegistryTest, LoadPoliciesCompareLoadPerRank) {
  const std::string dp = Add(v1::ROLE_PREFILL, 6, Load(3, 0, 0, {10, 10}));
  const std::string one = Add(v1::ROLE_PREFILL, 6, Load(2, 10, 0));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Pick(v1::ROLE_PREFILL, RoutingPolicy::kLeastOutstanding), dp);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Pick(v1::ROLE_PREFILL, RoutingPolicy::kPowerOfTwo), dp);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Pick(v1::ROLE_PREFILL, RoutingPolicy::kCacheAware), dp);  // 6 - 6 > 6 - 8
  Beat(dp, Load(5, 0, 0, {10, 10}));  // 2.5 a rank
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Pick(v1::ROLE_PREFILL, RoutingPolicy::kLeastOutstanding), one);
  // Without the ranks' figures (a one-rank report) the same counts compare whole.
  Beat(dp, Load(3, 0, 0));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Pick(v1::ROLE_PREFILL, RoutingPolicy::kLeastOutstanding), one);
}

// Picks racing heartbeats that store and evict blocks, registrations and deregistrations:
// every pick returns a live candidate (and the tsan build finds no race).
TEST_F(ReplicaRegistryTest, PicksRaceHeartbeatsAndMembershipChanges) {
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) ids.push_back(Add(v1::ROLE_PREFILL, i * 4, Load(i)));
  std::atomic<bool> stop{false};
  std::thread heartbeats([&] {
    for (int round = 0; !stop; ++round) {
      for (const std::string& id : ids) {
        v1::HeartbeatRequest hb;
        hb.set_replica_id(id);
        *hb.mutable_load() = Load(round % 5, 100 - round % 7, round % 3);
        for (uint64_t h : Hashes(round % 16)) {
          if (round % 2 == 0) hb.mutable_kv_events()->add_stored(h);
          else hb.mutable_kv_events()->add_removed(h);
        }
        registry_.Heartbeat(hb);
      }
    }
  });
  std::thread churn([&] {
    for (int i = 0; !stop; ++i) {
      const std::string extra = Add(v1::ROLE_PREFILL, i % 8);
      registry_.Deregister(extra);
    }
  });
  int picked = 0;
  for (int i = 0; i < 2000; ++i) {
    for (RoutingPolicy p : {RoutingPolicy::kCacheAware, RoutingPolicy::kPowerOfTwo, RoutingPolicy::kLeastOutstanding}) {
      const std::string id = Pick(v1::ROLE_PREFILL, p, 16);
      picked += id.empty() ? 0 : 1;
    }
  }
  stop = true;
  heartbeats.join();
  churn.join();
  EXPECT_EQ(picked, 6000);
}

// Drops by silence, on an injected clock: 1 s beats, 3 may be missed.
class ReplicaDropTest : public ::testing::Test {
 protected:
  using Clock = std::chrono::steady_clock;
  std::string Add(const std::string& address) {
    v1::RegisterRequest r;
    r.set_role(v1::ROLE_DECODE);
    r.set_grpc_address(address);
    absl::StatusOr<std::string> id = registry_.Register(r);
    EXPECT_TRUE(id.ok()) << id.status();
    return *id;
  }
  void Beat(const std::string& id) {
    v1::HeartbeatRequest hb;
    hb.set_replica_id(id);
    EXPECT_TRUE(registry_.Heartbeat(hb));
  }
  // Advances the clock by `ms`, running the reaper once per second of it as the router's
  // reaper thread does, beating `alive` before each run. Returns every id dropped.
  std::vector<std::string> Run(int ms, const std::vector<std::string>& alive) {
    std::vector<std::string> dropped;
    for (int t = 0; t < ms; t += 1000) {
      now_ += std::chrono::milliseconds(1000);
      for (const std::string& id : alive) Beat(id);
      for (std::string& id : registry_.DropSilent()) dropped.push_back(std::move(id));
    }
    return dropped;
  }

  Clock::time_point now_ = Clock::time_point{} + std::chrono::hours(1);
  ReplicaRegistry registry_{{.heartbeat_interval = std::chrono::milliseconds(1000),
                             .missed_heartbeats_to_drop = 3,
                             .clock = [this] { return now_; }}};
};

TEST_F(ReplicaDropTest, ASilentReplicaIsDroppedAfterItsMissedBeatsAndALiveOneIsKept) {
  const std::string live = Add("127.0.0.1:1");
  const std::string silent = Add("127.0.0.1:2");
  registry_.DropSilent();
  EXPECT_TRUE(Run(3000, {live}).empty());  // silent for exactly the limit: kept
  EXPECT_EQ(Run(1000, {live}), std::vector<std::string>{silent});
  EXPECT_TRUE(Run(10000, {live}).empty());
  EXPECT_EQ(registry_.Candidates(v1::ROLE_DECODE).size(), 1u);
}

TEST_F(ReplicaDropTest, AStarvedReaperDropsNobodyUntilAWholeWindowHasPassed) {
  const std::string a = Add("127.0.0.1:1");
  const std::string b = Add("127.0.0.1:2");
  registry_.DropSilent();
  // The router gets no CPU for 5 s: its reaper's next run sees both replicas silent for
  // longer than the limit, but their beats may be queued unread.
  now_ += std::chrono::milliseconds(5000);
  EXPECT_TRUE(registry_.DropSilent().empty());
  // The queued beats are read; both stay.
  Beat(a);
  Beat(b);
  EXPECT_TRUE(Run(3000, {a, b}).empty());
  // A replica that really is gone is still dropped, once the grace has passed.
  now_ += std::chrono::milliseconds(5000);
  EXPECT_TRUE(registry_.DropSilent().empty());
  Beat(a);
  EXPECT_TRUE(Run(2000, {a}).empty());  // within the grace (3 s) after the stall
  EXPECT_EQ(Run(2000, {a}), std::vector<std::string>{b});
}

}  // namespace
}  // namespace tandem
