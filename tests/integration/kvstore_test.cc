// The kvstore tier in the served system: real tandem-router / tandem-prefill /
// tandem-decode / tandem-kvstore processes on loopback (ephemeral ports, ready files),
// block bytes over UCX. Prefill replicas run without their own prefix cache
// (--no-prefix-cache), so every cached prompt token is one the kvstore served.
//  - identity: outputs equal the engine's alone (greedy and seeded) with the tier cold,
//    warm, and after the kvstore is killed and restarts from its SSD tier;
//  - a slow (stopped) or dead kvstore: requests fall back to recompute, same outputs;
//  - two instances share the key space;
//  - capacity pressure: a DRAM tier of 10% of the working set stays within its limit,
//    the SSD tier takes the overflow and hits continue from it.
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <thread>

#include "gtest/gtest.h"
#include "tests/integration/cluster_fixture.h"

namespace tandem {
namespace {

using testing::Generate;
using testing::GenerationStub;
using testing::HttpGet;
using testing::StreamResult;

struct ClusterSpec {
  int kvstores = 1;
  bool disk = false;
  std::vector<std::string> kvstore_args;
  std::vector<std::string> prefill_args = {"--no-prefix-cache"};
};

std::unique_ptr<LocalCluster> StartKvCluster(const ClusterSpec& spec) {
  const char* bin = std::getenv("TANDEM_BINARY_DIR");
  LocalClusterOptions o;
  o.bin_dir = std::string(bin != nullptr ? bin : ".") + "/bin";
  std::string tmpl = (std::filesystem::temp_directory_path() / "tandem-kvstore-cluster-XXXXXX").string();
  o.run_dir = ::mkdtemp(tmpl.data());
  o.num_prefill = 1;
  o.num_decode = 1;
  o.num_kvstore = spec.kvstores;
  if (spec.disk) o.kvstore_disk_root = o.run_dir + "/ssd";
  o.kvstore_args = spec.kvstore_args;
  if (o.kvstore_args.empty()) o.kvstore_args.push_back("--capacity=64M");
  o.worker_args = {"--threads=1"};
  o.prefill_args = spec.prefill_args;
  o.router_args = {"--heartbeat-ms=200"};
  o.log = [](const std::string& line) { std::fprintf(stderr, "[cluster] %s\n", line.c_str()); };
  absl::StatusOr<std::unique_ptr<LocalCluster>> c = LocalCluster::Start(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

ProcessInfo Process(const LocalCluster& c, const std::string& name) {
  for (const ProcessInfo& p : c.processes()) {
    if (p.name == name) return p;
  }
  ADD_FAILURE() << "no process " << name;
  return {};
}

nlohmann::json Stats(const LocalCluster& c, const std::string& name) {
  const std::string body = HttpGet(Process(c, name).ready.value("admin", ""), "/stats");
  nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  return j.is_discarded() ? nlohmann::json::object() : j;
}

int64_t Stat(const LocalCluster& c, const std::string& name, const std::string& key) {
  return Stats(c, name).value(key, int64_t{-1});
}

// Waits until the kvstores together hold `blocks` committed blocks (and, with `on_disk`,
// as many written to the SSD tier): offloads run in the background after each response.
void WaitCommitted(const LocalCluster& c, int kvstores, int64_t blocks, bool on_disk = false) {
  int64_t committed = 0, disk = 0;
  for (int i = 0; i < 1000; ++i) {
    committed = disk = 0;
    for (int k = 0; k < kvstores; ++k) {
      const nlohmann::json s = Stats(c, "kvstore-" + std::to_string(k));
      committed += s.value("committed_blocks", int64_t{0});
      disk += s.value("disk_blocks", int64_t{0});
    }
    if (committed >= blocks && (!on_disk || disk >= blocks)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "kvstores hold " << committed << " blocks (" << disk << " on disk), expected " << blocks;
}

std::vector<int32_t> Tokens(int n, int salt) {
  std::mt19937 rng(static_cast<uint32_t>(salt));
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = 1000 + static_cast<int32_t>(rng() % 20000);
  return t;
}

v1::GenerateRequest TokenRequest(const std::vector<int32_t>& prompt, int max_tokens, std::optional<uint64_t> seed) {
  v1::GenerateRequest r;
  for (int32_t t : prompt) r.mutable_token_ids()->add_ids(t);
  r.mutable_sampling()->set_temperature(seed ? 0.8f : 0.0f);
  if (seed) r.mutable_sampling()->set_seed(*seed);
  r.mutable_stop()->set_max_tokens(max_tokens);
  r.mutable_stop()->set_ignore_eos(true);
  return r;
}

// Prompt tokens the prefill replica can take from the tier: its full blocks before the
// last token.
int32_t Importable(const std::vector<int32_t>& prompt) { return static_cast<int32_t>((prompt.size() - 1) / 64 * 64); }

class KvStoreServingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    EngineOptions o;
    o.num_threads = 1;
    auto e = Engine::Create(testing::TinyModelDir(), o);
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = e->release();
  }
  static void TearDownTestSuite() { delete engine_; }

  // Generates and checks the output against the engine alone; returns the result.
  static StreamResult Check(v1::Generation::Stub& stub, const v1::GenerateRequest& r, const std::string& what) {
    const std::vector<int32_t> expected = testing::ReferenceTokens(*engine_, r);
    StreamResult got = Generate(stub, r);
    EXPECT_TRUE(got.status.ok()) << what << ": " << got.status.error_message();
    EXPECT_EQ(got.tokens, expected) << what;
    return got;
  }

  static Engine* engine_;
};
Engine* KvStoreServingTest::engine_ = nullptr;

TEST_F(KvStoreServingTest, IdenticalOutputsColdWarmAndAfterARestartFromSsd) {
  auto cluster = StartKvCluster({.kvstores = 1, .disk = true});
  ASSERT_NE(cluster, nullptr);
  auto stub = GenerationStub(cluster->router_address());
  // A conversation: each turn resends the history and adds to it.
  std::vector<std::vector<int32_t>> turns = {Tokens(300, 1)};
  for (int t = 1; t < 3; ++t) {
    std::vector<int32_t> next = turns.back();
    const std::vector<int32_t> more = Tokens(90 + 40 * t, 10 + t);
    next.insert(next.end(), more.begin(), more.end());
    turns.push_back(next);
  }
  const std::vector<std::optional<uint64_t>> seeds = {std::nullopt, 77};
  // Cold: the first turn finds nothing; each later turn finds the previous turns' blocks.
  int64_t blocks = 0;
  for (size_t t = 0; t < turns.size(); ++t) {
    for (const auto& seed : seeds) {
      StreamResult r = Check(*stub, TokenRequest(turns[t], 12, seed), "cold turn " + std::to_string(t));
      if (t == 0 && !seed) {
        EXPECT_EQ(r.final.usage().cached_prompt_tokens(), 0);
      }
      if (t > 0) {
        EXPECT_GE(r.final.usage().cached_prompt_tokens(), static_cast<int32_t>(turns[t - 1].size() / 64 * 64));
      }
      blocks = static_cast<int64_t>(turns[t].size() / 64);
      WaitCommitted(*cluster, 1, blocks, /*on_disk=*/true);
    }
  }
  // Warm: every importable block comes from the kvstore.
  for (size_t t = 0; t < turns.size(); ++t) {
    for (const auto& seed : seeds) {
      StreamResult r = Check(*stub, TokenRequest(turns[t], 12, seed), "warm turn " + std::to_string(t));
      EXPECT_EQ(r.final.usage().cached_prompt_tokens(), Importable(turns[t]));
    }
  }
  const nlohmann::json before = Stats(*cluster, "kvstore-0");
  EXPECT_GT(before.value("hit_tokens", 0), 0);
  EXPECT_EQ(before.value("rejected_blocks", -1), 0);
  EXPECT_EQ(Stats(*cluster, "prefill-0")["kvstore"].value("checksum_mismatches", -1), 0);

  // Kill the kvstore; the launcher restarts it on the same SSD directory.
  const pid_t old_pid = Process(*cluster, "kvstore-0").pid;
  ASSERT_TRUE(cluster->Kill("kvstore-0", SIGKILL).ok());
  // While it is down (or coming back) requests still succeed, with the same outputs.
  Check(*stub, TokenRequest(turns[1], 12, std::nullopt), "kvstore down");
  for (int i = 0; i < 600; ++i) {
    const ProcessInfo p = Process(*cluster, "kvstore-0");
    if (p.restarts >= 1 && p.pid != old_pid && p.ready.value("pid", 0) == p.pid) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(Process(*cluster, "kvstore-0").restarts, 1);
  const nlohmann::json restarted = Stats(*cluster, "kvstore-0");
  EXPECT_EQ(restarted.value("disk_loaded_blocks", 0), blocks) << restarted.dump();
  EXPECT_EQ(restarted.value("disk_corrupt_dropped", -1), 0);
  // The prefill replica learns the new address from the router's next heartbeat answers.
  int32_t cached = 0;
  for (int i = 0; i < 50 && cached == 0; ++i) {
    cached = Check(*stub, TokenRequest(turns[2], 12, 77), "after restart").final.usage().cached_prompt_tokens();
    if (cached == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(cached, Importable(turns[2]));
  for (size_t t = 0; t < turns.size(); ++t) {
    for (const auto& seed : seeds) {
      StreamResult r = Check(*stub, TokenRequest(turns[t], 12, seed), "after restart, turn " + std::to_string(t));
      EXPECT_EQ(r.final.usage().cached_prompt_tokens(), Importable(turns[t]));
    }
  }
  EXPECT_GT(Stat(*cluster, "kvstore-0", "disk_reads"), 0) << "hits served from the SSD tier";
}

TEST_F(KvStoreServingTest, SlowOrDeadKvStoreFallsBackToRecompute) {
  auto cluster = StartKvCluster({.kvstores = 1, .prefill_args = {"--no-prefix-cache", "--kvstore-timeout-ms=300"}});
  ASSERT_NE(cluster, nullptr);
  auto stub = GenerationStub(cluster->router_address());
  const std::vector<int32_t> prompt = Tokens(400, 3);
  Check(*stub, TokenRequest(prompt, 8, 5), "cold");
  WaitCommitted(*cluster, 1, static_cast<int64_t>(prompt.size() / 64));
  EXPECT_EQ(Check(*stub, TokenRequest(prompt, 8, 5), "warm").final.usage().cached_prompt_tokens(),
            Importable(prompt));

  // A kvstore that does not answer (stopped): the fetch times out, the prompt is computed.
  ASSERT_TRUE(cluster->Kill("kvstore-0", SIGSTOP).ok());
  const auto start = std::chrono::steady_clock::now();
  StreamResult slow = Check(*stub, TokenRequest(prompt, 8, 5), "stopped kvstore");
  EXPECT_EQ(slow.final.usage().cached_prompt_tokens(), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  EXPECT_GE(Stats(*cluster, "prefill-0")["kvstore"].value("fetch_errors", 0), 1);
  ASSERT_TRUE(cluster->Kill("kvstore-0", SIGCONT).ok());
  int32_t cached = 0;
  for (int i = 0; i < 20 && cached == 0; ++i) {
    cached = Check(*stub, TokenRequest(prompt, 8, 5), "resumed kvstore").final.usage().cached_prompt_tokens();
  }
  EXPECT_EQ(cached, Importable(prompt));

  // A dead kvstore (killed, not yet restarted or restarted empty): still the same outputs.
  ASSERT_TRUE(cluster->Kill("kvstore-0", SIGKILL).ok());
  for (int i = 0; i < 3; ++i) Check(*stub, TokenRequest(prompt, 8, std::nullopt), "dead kvstore");
}

TEST_F(KvStoreServingTest, TwoInstancesShareTheKeySpace) {
  auto cluster = StartKvCluster({.kvstores = 2});
  ASSERT_NE(cluster, nullptr);
  auto stub = GenerationStub(cluster->router_address());
  std::vector<std::vector<int32_t>> prompts;
  int64_t blocks = 0;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(Tokens(520 + 10 * i, 100 + i));
    Check(*stub, TokenRequest(prompts.back(), 4, i), "cold " + std::to_string(i));
    blocks += static_cast<int64_t>(prompts.back().size() / 64);
  }
  WaitCommitted(*cluster, 2, blocks);
  const int64_t a = Stat(*cluster, "kvstore-0", "committed_blocks");
  const int64_t b = Stat(*cluster, "kvstore-1", "committed_blocks");
  EXPECT_GT(a, blocks / 5);
  EXPECT_GT(b, blocks / 5);
  EXPECT_EQ(a + b, blocks);
  for (size_t i = 0; i < prompts.size(); ++i) {
    StreamResult r = Check(*stub, TokenRequest(prompts[i], 4, static_cast<uint64_t>(i)), "warm " + std::to_string(i));
    EXPECT_EQ(r.final.usage().cached_prompt_tokens(), Importable(prompts[i]));
  }
  // The router lists both instances.
  v1::ListReplicasResponse list;
  {
    auto cs = v1::Cluster::NewStub(grpc::CreateChannel(cluster->router_address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ASSERT_TRUE(cs->ListReplicas(&ctx, v1::ListReplicasRequest(), &list).ok());
  }
  int kvstores = 0;
  for (const v1::ReplicaInfo& r : list.replicas()) kvstores += r.role() == v1::ROLE_KVSTORE ? 1 : 0;
  EXPECT_EQ(kvstores, 2);
}

TEST_F(KvStoreServingTest, CapacityPressureSpillsToSsdAndHitsContinueFromIt) {
  // 16 prompts of 4 full blocks each: a working set of 64 blocks of 61,440 bytes (the
  // tiny model's 3 layers x 64 tokens x 80 floats). DRAM: 7 blocks, ~10% of it.
  constexpr int kPrompts = 16;
  auto cluster = StartKvCluster({.kvstores = 1, .disk = true, .kvstore_args = {"--capacity=430080"}});
  ASSERT_NE(cluster, nullptr);
  auto stub = GenerationStub(cluster->router_address());
  ASSERT_EQ(Stat(*cluster, "kvstore-0", "dram_capacity_bytes"), 7 * 61440);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < kPrompts; ++i) {
    prompts.push_back(Tokens(280, 200 + i));
    Check(*stub, TokenRequest(prompts.back(), 4, std::nullopt), "cold " + std::to_string(i));
    WaitCommitted(*cluster, 1, 4 * (i + 1), /*on_disk=*/true);
    EXPECT_LE(Stat(*cluster, "kvstore-0", "dram_bytes_used"), 7 * 61440);
  }
  nlohmann::json s = Stats(*cluster, "kvstore-0");
  EXPECT_EQ(s.value("disk_blocks", 0), 4 * kPrompts);
  EXPECT_GE(s.value("dram_evictions", 0), 4 * kPrompts - 7);
  EXPECT_LE(s.value("dram_bytes_used", 0), s.value("dram_capacity_bytes", 0));
  for (int i = 0; i < kPrompts; ++i) {
    StreamResult r = Check(*stub, TokenRequest(prompts[static_cast<size_t>(i)], 4, std::nullopt), "warm " + std::to_string(i));
    EXPECT_EQ(r.final.usage().cached_prompt_tokens(), 256) << i;
    EXPECT_LE(Stat(*cluster, "kvstore-0", "dram_bytes_used"), 7 * 61440);
  }
  s = Stats(*cluster, "kvstore-0");
  EXPECT_GE(s.value("disk_reads", 0), 4 * kPrompts - 7) << s.dump();
  EXPECT_EQ(s.value("disk_corrupt_dropped", -1), 0);
}

}  // namespace
}  // namespace tandem
