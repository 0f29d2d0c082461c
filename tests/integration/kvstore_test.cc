// The kvstore tier in the served system: real tandem-router / tandem-prefill /
// tandem-decode / tandem-kvstore processes on loopback (ephemeral ports, ready files),
// block bytes over UCX. Prefill replicas run without their own prefix cache
// (--no-prefix-cache), so every cached prompt token is one the kvstore served.
//  - identity: outputs equal the engine's alone (greedy and seeded) with the tier cold,
//    warm, and after the kvstore is killed and restarts from its SSD tier;
//  - a slow (stopped) or dead kvstore: requests fall back to recompute, same outputs;
//  - two instances share the key space;
//  - capacity pressure: a DRAM tier of 10% of the working set stays within its limit,
//    the SSD tier takes the overflow and hits continue from it;
//  - faults: kill -9 of the kvstore under load (no request fails or changes, the restarted
//    instance rejoins and hits resume); garbage on its gRPC and UCX ports and malformed
//    RPCs (rejected, it keeps serving); truncated, corrupted and foreign block files in its
//    SSD directory at startup (dropped, never served).
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_format.h"
#include "engine/runtime/block_hash.h"
#include "gtest/gtest.h"
#include "tandem/v1/kvstore.grpc.pb.h"
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
  LocalClusterOptions o;
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
  return testing::StartCluster(std::move(o));
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

// The router's membership list.
std::vector<v1::ReplicaInfo> Replicas(const LocalCluster& c, v1::Role role) {
  auto stub = testing::ClusterStub(c);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListReplicasResponse list;
  EXPECT_TRUE(stub->ListReplicas(&ctx, v1::ListReplicasRequest(), &list).ok());
  std::vector<v1::ReplicaInfo> out;
  for (const v1::ReplicaInfo& r : list.replicas()) {
    if (r.role() == role) out.push_back(r);
  }
  return out;
}

// Waits until the launcher has restarted `name` (a pid other than `old_pid`, ready).
ProcessInfo WaitRestarted(const LocalCluster& c, const std::string& name, pid_t old_pid) {
  ProcessInfo p;
  for (int i = 0; i < 600; ++i) {
    p = Process(c, name);
    if (p.restarts >= 1 && p.pid != old_pid && p.pid > 0 && p.ready.value("pid", 0) == p.pid) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GE(p.restarts, 1) << name << " was not restarted";
  return p;
}

// TCP ports `pid` listens on (from /proc: its socket inodes, matched in its net/tcp tables).
std::set<uint16_t> ListeningPorts(pid_t pid) {
  namespace fs = std::filesystem;
  const std::string proc = "/proc/" + std::to_string(pid);
  std::set<std::string> inodes;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(proc + "/fd", ec)) {
    const std::string target = fs::read_symlink(e.path(), ec).string();
    if (target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::set<uint16_t> ports;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in(proc + table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state != "0A" || !inodes.count(inode)) continue;  // 0A: LISTEN
      ports.insert(static_cast<uint16_t>(std::stoul(local.substr(local.find(':') + 1), nullptr, 16)));
    }
  }
  return ports;
}

uint16_t PortOf(const std::string& host_port) {
  return static_cast<uint16_t>(std::stoi(host_port.substr(host_port.rfind(':') + 1)));
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string b(n, '\0');
  for (char& c : b) c = static_cast<char>(rng() & 0xff);
  return b;
}

// Connects to 127.0.0.1:port, sends `bytes`, half-closes, and reads until the peer closes
// or 3 s pass. Returns whether the connection was accepted.
bool SendGarbage(uint16_t port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{.tv_sec = 3, .tv_usec = 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return false;
  }
  for (size_t off = 0; off < bytes.size();) {
    const ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;  // the peer closed on us: fine
    off += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  char buf[4096];
  while (::recv(fd, buf, sizeof buf, 0) > 0) {
  }
  ::close(fd);
  return true;
}

// The SSD tier's file of a block (services/kvstore/disk_tier.h).
std::string BlockFile(const std::string& disk_dir, uint64_t fingerprint, uint64_t hash) {
  const std::string h = absl::StrFormat("%016x", hash);
  return absl::StrCat(disk_dir, "/", absl::StrFormat("%016x", fingerprint), "/", h.substr(0, 2), "/", h, ".kvb");
}

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
    auto cs = testing::ClusterStub(*cluster);
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

// kill -9 of the kvstore while requests stream through the cluster: none fails or changes
// (greedy outputs equal the engine's alone, i.e. the kvstore-off result); the launcher
// restarts it, the router lists it again, and hits resume on the new instance.
TEST_F(KvStoreServingTest, KillNineUnderLoadFailsNoRequestAndTheRestartedInstanceRejoins) {
  auto cluster = StartKvCluster({.kvstores = 1});
  ASSERT_NE(cluster, nullptr);
  auto stub = GenerationStub(cluster->router_address());
  // Conversations of 5-6 full blocks, their references computed up front.
  std::vector<v1::GenerateRequest> requests;
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < 6; ++i) {
    requests.push_back(TokenRequest(Tokens(330 + 20 * i, 500 + i), 8, std::nullopt));
    expected.push_back(testing::ReferenceTokens(*engine_, requests.back()));
  }
  const std::vector<v1::ReplicaInfo> before = Replicas(*cluster, v1::ROLE_KVSTORE);
  ASSERT_EQ(before.size(), 1u);

  struct Outcome {
    size_t index;
    grpc::Status status;
    std::vector<int32_t> tokens;
    int32_t cached;
  };
  std::mutex mu;
  std::vector<Outcome> outcomes;
  std::atomic<bool> stop{false};
  std::vector<std::thread> clients;
  for (int t = 0; t < 3; ++t) {
    clients.emplace_back([&, t] {
      for (size_t k = static_cast<size_t>(t); !stop.load(); ++k) {
        const size_t i = k % requests.size();
        StreamResult r = Generate(*stub, requests[i], 60);
        std::lock_guard<std::mutex> lock(mu);
        outcomes.push_back({i, r.status, r.tokens, r.final.usage().cached_prompt_tokens()});
      }
    });
  }
  auto hits = [&] {
    std::lock_guard<std::mutex> lock(mu);
    int n = 0;
    for (const Outcome& o : outcomes) n += o.cached > 0 ? 1 : 0;
    return n;
  };
  // Load with hits, then the kill.
  for (int i = 0; i < 300 && hits() < 6; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_GE(hits(), 6) << "no kvstore hits before the kill";
  const pid_t old_pid = Process(*cluster, "kvstore-0").pid;
  size_t killed_at;
  {
    std::lock_guard<std::mutex> lock(mu);
    killed_at = outcomes.size();
  }
  ASSERT_TRUE(cluster->Kill("kvstore-0", SIGKILL).ok());
  const ProcessInfo restarted = WaitRestarted(*cluster, "kvstore-0", old_pid);
  // The router drops the dead instance and lists the new one (registered with its pid).
  bool listed = false;
  for (int i = 0; i < 200 && !listed; ++i) {
    const std::vector<v1::ReplicaInfo> now = Replicas(*cluster, v1::ROLE_KVSTORE);
    listed = now.size() == 1 && now[0].pid() == restarted.pid && now[0].state() == "ready";
    if (!listed) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(listed) << "the router does not list the restarted kvstore (pid " << restarted.pid << ") alone";
  // Hits resume: the load re-offloads the conversations into the empty instance.
  for (int i = 0; i < 300 && Stat(*cluster, "kvstore-0", "hit_tokens") <= 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GT(Stat(*cluster, "kvstore-0", "hit_tokens"), 0) << "no hits from the restarted instance";
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop = true;
  for (std::thread& t : clients) t.join();

  int after_kill = 0, hits_after = 0;
  for (size_t k = 0; k < outcomes.size(); ++k) {
    const Outcome& o = outcomes[k];
    EXPECT_TRUE(o.status.ok()) << "request " << k << ": " << o.status.error_message();
    EXPECT_EQ(o.tokens, expected[o.index]) << "request " << k << " (prompt " << o.index << ", " << o.cached
                                           << " tokens cached)";
    if (k >= killed_at) {
      ++after_kill;
      hits_after += o.cached > 0 ? 1 : 0;
    }
  }
  EXPECT_GT(after_kill, 3) << "the load did not go on across the kill";
  EXPECT_GT(hits_after, 0);
  std::printf("%zu requests, %d after the kill (%d of them with kvstore hits)\n", outcomes.size(), after_kill,
              hits_after);
}

// Random bytes on every TCP port the kvstore listens on (gRPC, and UCX's tcp transport),
// an HTTP/2 preface followed by garbage, undecodable messages for each RPC and
// well-formed RPCs with nonsense fields: each is rejected, and the instance keeps serving
// the same blocks, unrestarted.
TEST_F(KvStoreServingTest, GarbageOnItsPortsAndMalformedRpcsAreRejectedAndItKeepsServing) {
  auto cluster = StartKvCluster({.kvstores = 1});
  ASSERT_NE(cluster, nullptr);
  auto stub = GenerationStub(cluster->router_address());
  const std::vector<int32_t> prompt = Tokens(400, 9);
  Check(*stub, TokenRequest(prompt, 8, std::nullopt), "cold");
  WaitCommitted(*cluster, 1, static_cast<int64_t>(prompt.size() / 64));
  EXPECT_EQ(Check(*stub, TokenRequest(prompt, 8, std::nullopt), "warm").final.usage().cached_prompt_tokens(),
            Importable(prompt));

  const ProcessInfo kv = Process(*cluster, "kvstore-0");
  const std::string grpc_address = kv.ready.value("grpc", "");
  const uint16_t grpc_port = PortOf(grpc_address), admin_port = PortOf(kv.ready.value("admin", ""));
  const std::set<uint16_t> ports = ListeningPorts(kv.pid);
  ASSERT_TRUE(ports.count(grpc_port)) << "the gRPC port is not among the listening ones";
  std::set<uint16_t> ucx_ports;
  for (uint16_t p : ports) {
    if (p != grpc_port && p != admin_port) ucx_ports.insert(p);
  }
  ASSERT_FALSE(ucx_ports.empty()) << "no UCX tcp port found (the test runs with UCX_TLS=tcp)";
  uint32_t seed = 1;
  for (uint16_t port : ports) {
    if (port == admin_port) continue;
    for (size_t n : {size_t{1}, size_t{16}, size_t{4096}, size_t{1} << 20}) {
      EXPECT_TRUE(SendGarbage(port, RandomBytes(n, seed++))) << "port " << port << " refused a connection";
    }
    EXPECT_TRUE(SendGarbage(port, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + RandomBytes(65536, seed++)));
  }

  // Undecodable request messages, one per RPC: random bytes after a first field of wire
  // type 7 (there is none), so that no message decodes from them. Each is INVALID_ARGUMENT
  // naming the message type (gRPC's generated handlers would answer UNIMPLEMENTED, as if
  // the method did not exist).
  auto channel = testing::InternalChannel(*cluster, grpc_address);
  grpc::GenericStub generic(channel);
  for (const char* method : {"Lookup", "Reserve", "Commit", "Get", "Stats"}) {
    const std::string bytes = "\x0f" + RandomBytes(256, seed++);
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    std::promise<grpc::Status> done;
    generic.UnaryCall(&ctx, std::string("/tandem.v1.KvStore/") + method, grpc::StubOptions(), &request, &response,
                      [&done](grpc::Status s) { done.set_value(s); });
    const grpc::Status st = done.get_future().get();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method << ": " << st.error_message();
    EXPECT_NE(st.error_message().find(std::string("tandem.v1.Kv") + method + "Request"), std::string::npos)
        << method << ": " << st.error_message();
  }
  // Well-formed RPCs with nonsense in them.
  auto kvs = v1::KvStore::NewStub(channel);
  const uint64_t fingerprint = engine_->layout_fingerprint();
  const int64_t block_bytes = kv.ready.value("block_bytes", int64_t{0});
  auto format = [&](uint64_t fp, int64_t bytes) {
    v1::KvBlockFormat f;
    f.set_layout_fingerprint(fp);
    f.set_block_bytes(bytes);
    f.set_block_tokens(64);
    return f;
  };
  auto expect_rejected = [](const grpc::Status& st, const std::string& what) {
    EXPECT_TRUE(st.error_code() == grpc::StatusCode::INVALID_ARGUMENT ||
                st.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
                st.error_code() == grpc::StatusCode::NOT_FOUND)
        << what << ": " << st.error_code() << " " << st.error_message();
  };
  const std::vector<uint64_t> hashes = HashFullBlocks(prompt, 64, fingerprint);
  {
    grpc::ClientContext ctx;
    v1::KvLookupRequest r;
    *r.mutable_format() = format(fingerprint ^ 1, block_bytes);
    for (uint64_t h : hashes) r.add_block_hashes(h);
    v1::KvLookupResponse resp;
    expect_rejected(kvs->Lookup(&ctx, r, &resp), "lookup of another layout");
  }
  {
    grpc::ClientContext ctx;
    v1::KvGetRequest r;
    *r.mutable_format() = format(fingerprint, block_bytes);
    r.add_block_hashes(hashes[0]);
    r.add_offsets(0);
    r.set_destination(RandomBytes(300, seed++));
    v1::KvGetResponse resp;
    expect_rejected(kvs->Get(&ctx, r, &resp), "get into a garbage destination");
  }
  {
    grpc::ClientContext ctx;
    v1::KvGetRequest r;
    *r.mutable_format() = format(fingerprint, block_bytes);
    r.add_block_hashes(hashes[0]);
    v1::KvGetResponse resp;
    expect_rejected(kvs->Get(&ctx, r, &resp), "get without offsets");
  }
  {
    grpc::ClientContext ctx;
    v1::KvCommitRequest r;
    r.set_reservation_id("no-such-reservation-" + std::to_string(seed++));
    r.add_block_hashes(hashes[0]);
    r.add_checksums(12345);
    v1::KvCommitResponse resp;
    expect_rejected(kvs->Commit(&ctx, r, &resp), "commit of an unknown reservation");
  }

  // Still the same process, still serving the same blocks.
  const ProcessInfo after = Process(*cluster, "kvstore-0");
  EXPECT_EQ(after.pid, kv.pid);
  EXPECT_EQ(after.restarts, 0);
  EXPECT_EQ(::kill(kv.pid, 0), 0) << "the kvstore died";
  EXPECT_EQ(Check(*stub, TokenRequest(prompt, 8, std::nullopt), "after the garbage").final.usage().cached_prompt_tokens(),
            Importable(prompt));
  const nlohmann::json stats = Stats(*cluster, "kvstore-0");
  EXPECT_EQ(stats.value("committed_blocks", 0), static_cast<int64_t>(prompt.size() / 64)) << stats.dump();
  EXPECT_EQ(stats.value("rejected_blocks", -1), 0);
  // The rejected RPCs are counted on its /metrics.
  const std::string metrics = HttpGet(kv.ready.value("admin", ""), "/metrics");
  EXPECT_NE(metrics.find("tandem_kvstore_rpcs_total{"), std::string::npos);
  EXPECT_NE(metrics.find("code=\"FAILED_PRECONDITION\""), std::string::npos) << metrics;
}

// Block files damaged while the kvstore was down: a truncated one, one with a flipped
// payload byte, and a foreign file under a block's name. At startup each is dropped
// (deleted, counted), the intact blocks load, and prompts get exactly the blocks before
// the first damaged one: never a damaged byte (outputs stay identical).
TEST_F(KvStoreServingTest, TruncatedOrCorruptBlockFilesAreDroppedAtStartupAndNeverServed) {
  namespace fs = std::filesystem;
  auto cluster = StartKvCluster({.kvstores = 1, .disk = true});
  ASSERT_NE(cluster, nullptr);
  auto stub = GenerationStub(cluster->router_address());
  const std::vector<int32_t> a = Tokens(400, 31), b = Tokens(400, 32);  // 6 full blocks each
  Check(*stub, TokenRequest(a, 8, std::nullopt), "cold a");
  Check(*stub, TokenRequest(b, 8, std::nullopt), "cold b");
  WaitCommitted(*cluster, 1, 12, /*on_disk=*/true);

  const uint64_t fingerprint = engine_->layout_fingerprint();
  const std::vector<uint64_t> ha = HashFullBlocks(a, 64, fingerprint), hb = HashFullBlocks(b, 64, fingerprint);
  const ProcessInfo kv = Process(*cluster, "kvstore-0");
  const std::string dir = kv.ready.value("disk_dir", "");
  ASSERT_FALSE(dir.empty());
  const std::string truncated = BlockFile(dir, fingerprint, ha[2]), flipped = BlockFile(dir, fingerprint, hb[0]);
  ASSERT_TRUE(fs::exists(truncated) && fs::exists(flipped));
  // Stopped, so that nothing is written meanwhile; then killed, and restarted on the files.
  ASSERT_TRUE(cluster->Kill("kvstore-0", SIGSTOP).ok());
  fs::resize_file(truncated, fs::file_size(truncated) / 2);
  {
    std::fstream f(flipped, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(64 + 1000);
    const char c = static_cast<char>(f.get());
    f.seekp(64 + 1000);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  const std::string foreign = BlockFile(dir, fingerprint, 0x0123456789abcdefull);
  fs::create_directories(fs::path(foreign).parent_path());
  std::ofstream(foreign, std::ios::binary) << RandomBytes(61440 + 64, 77);
  ASSERT_TRUE(cluster->Kill("kvstore-0", SIGKILL).ok());
  WaitRestarted(*cluster, "kvstore-0", kv.pid);

  const nlohmann::json s = Stats(*cluster, "kvstore-0");
  EXPECT_EQ(s.value("disk_corrupt_dropped", -1), 3) << s.dump();
  EXPECT_EQ(s.value("disk_loaded_blocks", -1), 10) << s.dump();
  EXPECT_FALSE(fs::exists(truncated));
  EXPECT_FALSE(fs::exists(flipped));
  EXPECT_FALSE(fs::exists(foreign));
  // The prefill replica learns the new address from its next heartbeat answers.
  int32_t cached_a = 0;
  for (int i = 0; i < 50 && cached_a == 0; ++i) {
    cached_a = Check(*stub, TokenRequest(a, 8, std::nullopt), "a after restart").final.usage().cached_prompt_tokens();
    if (cached_a == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(cached_a, 2 * 64) << "a: blocks 0-1 intact, block 2 dropped";
  EXPECT_EQ(Check(*stub, TokenRequest(b, 8, std::nullopt), "b after restart").final.usage().cached_prompt_tokens(), 0)
      << "b: block 0 dropped";
  EXPECT_EQ(Stats(*cluster, "prefill-0")["kvstore"].value("checksum_mismatches", -1), 0);
  // The recomputed blocks (a's block 2, b's block 0) are offloaded again, and the prompts
  // are whole once more.
  for (int i = 0; i < 500 && Stat(*cluster, "kvstore-0", "disk_blocks") < 12; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(Stat(*cluster, "kvstore-0", "disk_blocks"), 12);
  EXPECT_EQ(Stat(*cluster, "kvstore-0", "committed_blocks"), 2);
  EXPECT_EQ(Check(*stub, TokenRequest(a, 8, 3), "a again").final.usage().cached_prompt_tokens(), Importable(a));
  EXPECT_EQ(Check(*stub, TokenRequest(b, 8, 3), "b again").final.usage().cached_prompt_tokens(), Importable(b));
}

}  // namespace
}  // namespace tandem
