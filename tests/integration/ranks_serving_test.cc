// Replicas over ranks in the served system (docs/parallel.md): the real tandem-router and
// workers started with --data-parallel / --expert-parallel / --tensor-parallel (the CPU
// rank group: processes forked by the worker, one shared KV pool) give the tokens of a
// one-rank engine, aggregated and disaggregated, with KV crossing between replicas of
// different layouts into the rank that holds each sequence; a rank killed under load
// fails its replica's requests with an error naming it, and the replica stops; the router
// picks a data-parallel decode replica by the room on one rank (DP-aware routing).
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"
#include "tests/integration/cluster_probes.h"

namespace tandem {
namespace {

using testing::Generate;
using testing::GenerationStub;
using testing::StartCluster;
using testing::StreamResult;
using testing::TextRequest;

// Gone, or a zombie (the cluster reaps children only when it restarts them).
bool Exited(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(f, stat)) return true;
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

class RanksServingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EngineOptions o;
    o.num_threads = 1;
    auto e = Engine::Create(testing::TinyModelDir(), o);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = e->release();
    for (const v1::GenerateRequest& r : Requests()) expected_.push_back(testing::ReferenceTokens(*engine_, r));
  }
  static void TearDownTestSuite() { delete engine_; }

  // Greedy and seeded requests, prompts of one to several KV blocks (64 tokens each).
  static std::vector<v1::GenerateRequest> Requests() {
    std::vector<v1::GenerateRequest> out;
    out.push_back(TextRequest("Hello", 12, std::nullopt, 0.0f));
    out.push_back(TextRequest("The quick brown fox jumps over the lazy dog.", 16, 11, 0.8f));
    std::string long_prompt;
    for (int i = 0; i < 90; ++i) long_prompt += "expert " + std::to_string(i * 7 % 13) + " latent ";
    out.push_back(TextRequest(long_prompt, 10, std::nullopt, 0.0f));
    out.push_back(TextRequest(std::string(200, 'x') + " then more", 14, 7, 1.0f));
    out.push_back(TextRequest("data parallel attention over ranks", 20, std::nullopt, 0.0f));
    out.push_back(TextRequest("prefill and decode with different layouts", 8, 3, 0.7f));
    return out;
  }

  // Every request three times at once through `cluster`'s router: each gives the one-rank
  // engine's tokens.
  static void ExpectOneRanksTokens(const LocalCluster& cluster, const std::string& what) {
    const std::vector<v1::GenerateRequest> reqs = Requests();
    auto stub = GenerationStub(cluster.router_address());
    const std::vector<StreamResult> got = testing::GenerateConcurrently(*stub, reqs, /*copies=*/3, 180);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].status.ok()) << what << ": request " << i << ": " << got[i].status.error_message();
      EXPECT_EQ(got[i].tokens, expected_[i % reqs.size()]) << what << ": request " << i;
    }
  }

  static Engine* engine_;
  static std::vector<std::vector<int32_t>> expected_;
};
Engine* RanksServingTest::engine_ = nullptr;
std::vector<std::vector<int32_t>> RanksServingTest::expected_;

TEST_F(RanksServingTest, AggregatedReplicasOnRanksGiveOneRanksTokens) {
  const std::vector<std::vector<std::string>> layouts = {
      {"--data-parallel=2"}, {"--data-parallel=2", "--expert-parallel=2"}, {"--expert-parallel=2", "--tensor-parallel=2"}};
  for (std::vector<std::string> args : layouts) {
    std::string what;
    for (const std::string& a : args) what += a + " ";
    auto cluster = StartCluster(0, 0, 1, args);
    ASSERT_NE(cluster, nullptr) << what;
    // The replica registered once: one worker process, its ranks its children.
    const std::vector<ProcessInfo> procs = cluster->processes();
    ASSERT_EQ(procs.size(), 2u) << what;  // the router and the worker
    const nlohmann::json& ready = procs[1].ready;
    ASSERT_TRUE(ready.contains("rank_pids")) << ready.dump();
    EXPECT_EQ(ready["rank_pids"].size(), 1u) << what;
    ExpectOneRanksTokens(*cluster, what);
  }
}

// Prefill and decode replicas of different layouts: the prefill replica's KV (computed on
// whichever rank its scheduler placed the prompt, read from that rank's blocks) goes
// straight into the blocks of the decode rank the reservation was placed on. Every layout
// here has the same KV layout fingerprint (none splits a KV entry), so each pair
// interoperates.
TEST_F(RanksServingTest, KvGoesBetweenLayoutsIntoTheHoldingRank) {
  struct Layouts {
    std::vector<std::string> prefill, decode;
  };
  const std::vector<Layouts> cases = {{{}, {"--data-parallel=2"}},
                                      {{"--data-parallel=2"}, {}},
                                      {{"--data-parallel=2", "--expert-parallel=2"}, {"--data-parallel=2"}}};
  for (const Layouts& l : cases) {
    std::string what = "prefill";
    for (const std::string& a : l.prefill) what += " " + a;
    what += " -> decode";
    for (const std::string& a : l.decode) what += " " + a;
    LocalClusterOptions o;
    o.num_prefill = 1;
    o.num_decode = 0;
    o.prefill_args = l.prefill;
    auto cluster = StartCluster(o);
    ASSERT_NE(cluster, nullptr) << what;
    absl::StatusOr<std::string> decode = cluster->AddWorker("decode", l.decode);
    ASSERT_TRUE(decode.ok()) << what << ": " << decode.status();
    ExpectOneRanksTokens(*cluster, what);
    // The data-parallel side placed sequences on both of its ranks.
    for (const std::string& name : {std::string("prefill-0"), *decode}) {
      const std::optional<ProcessInfo> p = testing::ProcessNamed(*cluster, name);
      ASSERT_TRUE(p.has_value());
      const nlohmann::json stats =
          nlohmann::json::parse(testing::HttpGet(p->ready.value("admin", ""), "/stats"), nullptr, false);
      if (!stats.contains("dp_ranks")) continue;
      ASSERT_EQ(stats["dp_ranks"].size(), 2u) << what << ": " << name;
      for (const nlohmann::json& r : stats["dp_ranks"]) {
        EXPECT_GT(r["placed"].get<int64_t>(), 0) << what << ": " << name << ": " << stats["dp_ranks"].dump();
      }
      std::printf("%s: %s: %s\n", what.c_str(), name.c_str(), stats["dp_ranks"].dump().c_str());
    }
  }
}

// The router's view of one replica (by its worker's name), from Cluster.ListReplicas.
std::optional<v1::ReplicaInfo> RouterView(const LocalCluster& cluster, const std::string& name) {
  const std::optional<ProcessInfo> p = testing::ProcessNamed(cluster, name);
  if (!p) return std::nullopt;
  auto stub = testing::ClusterStub(cluster);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ListReplicasResponse list;
  if (!stub->ListReplicas(&ctx, v1::ListReplicasRequest(), &list).ok()) return std::nullopt;
  for (const v1::ReplicaInfo& r : list.replicas()) {
    if (r.replica_id() == p->ready.value("replica_id", "")) return r;
  }
  return std::nullopt;
}

// Requests the router sent `name` (-1: not listed).
int64_t Routed(const LocalCluster& cluster, const std::string& name) {
  const std::optional<v1::ReplicaInfo> r = RouterView(cluster, name);
  return r ? r->requests_routed() : -1;
}

// Holds `blocks` KV blocks of decode replica `name` under a lease nobody writes (it lasts
// --kv-lease-ms), as a request's reservation would.
absl::Status HoldBlocks(const LocalCluster& cluster, const std::string& name, const std::string& lease_id,
                        int blocks, uint64_t fingerprint) {
  const std::optional<v1::ReplicaInfo> r = RouterView(cluster, name);
  if (!r) return absl::NotFoundError(name);
  auto stub = v1::Decode::NewStub(testing::InternalChannel(cluster, r->grpc_address()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ReserveRequest req;
  req.set_request_id(lease_id);
  req.set_num_tokens(blocks * 64 - 1);  // and the first decode position: `blocks` blocks
  req.set_layout_fingerprint(fingerprint);
  v1::ReserveResponse resp;
  const grpc::Status s = stub->Reserve(&ctx, req, &resp);
  if (!s.ok()) return absl::InternalError(s.error_message());
  if (resp.destination().block_ids_size() != blocks) return absl::InternalError(resp.DebugString());
  return absl::OkStatus();
}

// Waits until the router's view of `name` satisfies `ok` (the next heartbeats).
bool WaitForView(const LocalCluster& cluster, const std::string& name,
                 const std::function<bool(const v1::ReplicaInfo&)>& ok, v1::ReplicaInfo* last) {
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < limit) {
    if (std::optional<v1::ReplicaInfo> r = RouterView(cluster, name)) {
      *last = *r;
      if (ok(*r)) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

v1::GenerateRequest TokenRequest(int num_tokens, int max_tokens) {
  v1::GenerateRequest r = TextRequest("", max_tokens, std::nullopt, 0.0f);
  for (int i = 0; i < num_tokens; ++i) r.mutable_token_ids()->add_ids(100 + i * 37 % 5000);
  return r;
}

// DP-aware routing (docs/parallel.md): two decode replicas, A over two data-parallel ranks
// with 3 blocks free on each (6 in all), B of one rank with 5 free. A request needing 4
// blocks fits no rank of A: the router sends it to B without asking A (by A's sum, 6 > 5, it
// would have asked A first and been refused). With B down to 2 free, a request of 3 blocks
// goes to A, whose one rank holds it. Both give the one-rank engine's tokens.
TEST_F(RanksServingTest, TheRouterPicksADecodeReplicaByTheRoomOnOneRank) {
  LocalClusterOptions o;
  o.num_prefill = 1;
  o.num_decode = 0;
  o.router_args = {"--heartbeat-ms=200"};
  auto cluster = StartCluster(o);
  ASSERT_NE(cluster, nullptr);
  const std::vector<std::string> small_pool = {"--kv-cache-mb=1", "--kv-lease-ms=120000"};
  std::vector<std::string> dp_args = small_pool;
  dp_args.push_back("--data-parallel=2");
  absl::StatusOr<std::string> a = cluster->AddWorker("decode", dp_args);
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::string> b = cluster->AddWorker("decode", small_pool);
  ASSERT_TRUE(b.ok()) << b.status();
  auto rank_free = [](const v1::ReplicaInfo& r) {
    return std::vector<int64_t>(r.load().rank_kv_blocks_free().begin(), r.load().rank_kv_blocks_free().end());
  };
  auto ranks_free = [&](std::vector<int64_t> want) {
    return [&rank_free, want](const v1::ReplicaInfo& r) { return rank_free(r) == want; };
  };
  auto has_ranks = [](const v1::ReplicaInfo& r) { return r.load().rank_kv_blocks_free_size() == 2; };
  auto has_pool = [](const v1::ReplicaInfo& r) { return r.load().kv_blocks_total() > 0; };
  v1::ReplicaInfo view_a, view_b;
  ASSERT_TRUE(WaitForView(*cluster, *a, has_ranks, &view_a)) << view_a.DebugString();
  ASSERT_TRUE(WaitForView(*cluster, *b, has_pool, &view_b)) << view_b.DebugString();
  const int per_rank = static_cast<int>(view_a.load().rank_kv_blocks_free(0));
  const int b_total = static_cast<int>(view_b.load().kv_blocks_free());
  ASSERT_GE(per_rank, 6);
  ASSERT_GE(b_total, 8);
  const uint64_t fp = engine_->layout_fingerprint();
  // Two leases on A: the first on rank 0, the second on the less loaded rank 1.
  for (const char* lease : {"fill-a-0", "fill-a-1"}) {
    const absl::Status held = HoldBlocks(*cluster, *a, lease, per_rank - 3, fp);
    ASSERT_TRUE(held.ok()) << held;
  }
  const absl::Status held = HoldBlocks(*cluster, *b, "fill-b-0", b_total - 5, fp);
  ASSERT_TRUE(held.ok()) << held;
  auto free_at_most = [](int64_t n) { return [n](const v1::ReplicaInfo& r) { return r.load().kv_blocks_free() <= n; }; };
  ASSERT_TRUE(WaitForView(*cluster, *a, ranks_free({3, 3}), &view_a)) << view_a.DebugString();
  ASSERT_TRUE(WaitForView(*cluster, *b, free_at_most(5), &view_b)) << view_b.DebugString();
  EXPECT_EQ(view_b.load().kv_blocks_free(), 5);
  // The router's /replicas page shows what it routes by.
  const std::optional<ProcessInfo> router = testing::ProcessNamed(*cluster, "router");
  ASSERT_TRUE(router.has_value());
  const nlohmann::json replicas =
      nlohmann::json::parse(testing::HttpGet(router->ready.value("admin", ""), "/replicas"), nullptr, false);
  int with_ranks = 0;
  for (const nlohmann::json& r : replicas) {
    if (r.contains("rank_kv_blocks_free")) {
      ++with_ranks;
      EXPECT_EQ(r["rank_kv_blocks_free"], nlohmann::json::array({3, 3})) << replicas.dump();
    }
  }
  EXPECT_EQ(with_ranks, 1) << replicas.dump();
  EXPECT_EQ(view_a.load().kv_blocks_free(), 6);

  auto stub = GenerationStub(cluster->router_address());
  // 202 tokens: 3 full blocks and a partial one, KV for 203 positions: 4 blocks.
  const v1::GenerateRequest four_blocks = TokenRequest(202, 8);
  const StreamResult first = Generate(*stub, four_blocks, 60);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.tokens, testing::ReferenceTokens(*engine_, four_blocks));
  EXPECT_EQ(Routed(*cluster, *a), 0) << "A was asked though no rank of it has 4 blocks free";
  EXPECT_EQ(Routed(*cluster, *b), 1);

  // B down to 2 free (less whatever its prefix cache still holds): a request of 3 blocks
  // (138 tokens, 139 positions) now fits only a rank of A.
  const absl::Status held_more = HoldBlocks(*cluster, *b, "fill-b-1", 3, fp);
  ASSERT_TRUE(held_more.ok()) << held_more;
  ASSERT_TRUE(WaitForView(*cluster, *b, free_at_most(2), &view_b)) << view_b.DebugString();
  const v1::GenerateRequest three_blocks = TokenRequest(138, 8);
  const StreamResult second = Generate(*stub, three_blocks, 60);
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_EQ(second.tokens, testing::ReferenceTokens(*engine_, three_blocks));
  EXPECT_EQ(Routed(*cluster, *a), 1);
  EXPECT_EQ(Routed(*cluster, *b), 1);
  const std::optional<ProcessInfo> pa = testing::ProcessNamed(*cluster, *a);
  ASSERT_TRUE(pa.has_value());
  const nlohmann::json stats =
      nlohmann::json::parse(testing::HttpGet(pa->ready.value("admin", ""), "/stats"), nullptr, false);
  std::printf("A (DP2) after the two requests: %s\n", stats.value("dp_ranks", nlohmann::json()).dump().c_str());
}

TEST_F(RanksServingTest, AKilledRankFailsTheRequestsWithAnErrorAndStopsTheReplica) {
  LocalClusterOptions o;
  o.num_prefill = o.num_decode = 0;
  o.num_both = 1;
  o.worker_args = {"--data-parallel=2"};
  o.restart = false;
  auto cluster = StartCluster(o);
  ASSERT_NE(cluster, nullptr);
  const ProcessInfo worker = cluster->processes()[1];
  const pid_t rank1 = worker.ready["rank_pids"][0].get<pid_t>();
  auto stub = GenerationStub(cluster->router_address());
  // Long streams on both ranks, so that the kill lands mid-step or between steps.
  std::vector<StreamResult> got(4);
  std::vector<std::thread> streams;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 4; ++i) {
    v1::GenerateRequest r = TextRequest("a long answer " + std::to_string(i), 3000, std::nullopt, 0.0f);
    r.mutable_stop()->set_ignore_eos(true);
    streams.emplace_back([&, r, i] { got[i] = Generate(*stub, r, 60); });
  }
  ASSERT_TRUE(testing::WaitUntilBusy(*cluster, worker.name));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(::kill(rank1, SIGKILL), 0);
  const auto killed = std::chrono::steady_clock::now();
  for (auto& t : streams) t.join();
  const double after_kill = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  std::printf("streams ended %.3f s after the kill (%.1f s after they started)\n", after_kill,
              std::chrono::duration<double>(killed - t0).count());
  for (int i = 0; i < 4; ++i) {
    EXPECT_FALSE(got[i].status.ok()) << i << ": completed " << got[i].tokens.size() << " tokens";
    EXPECT_NE(got[i].status.error_message().find("rank"), std::string::npos)
        << i << ": " << got[i].status.error_message();
    std::printf("stream %d: %zu tokens, then %d: %s\n", i, got[i].tokens.size(),
                static_cast<int>(got[i].status.error_code()), got[i].status.error_message().c_str());
  }
  EXPECT_LT(after_kill, 10.0);
  // The replica stops (with an error) rather than stay registered unable to run a step.
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < limit && !Exited(worker.pid)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(Exited(worker.pid)) << "the worker still runs";
}

}  // namespace
}  // namespace tandem
