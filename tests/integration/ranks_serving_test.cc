// Replicas over ranks in the served system (docs/parallel.md): the real tandem-router and
// workers started with --data-parallel / --expert-parallel / --tensor-parallel (the CPU
// rank group: processes forked by the worker, one shared KV pool) give the tokens of a
// one-rank engine, aggregated and disaggregated, with KV crossing between replicas of
// different layouts into the rank that holds each sequence; a rank killed under load
// fails its replica's requests with an error naming it, and the replica stops.
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <fstream>
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
