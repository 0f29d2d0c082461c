// The kvstore tier end to end inside one process: KvStore gRPC services on loopback over
// BlockStores whose DRAM tiers are transfer-layer regions (the in-process transfer
// engine standing in for UCX), and the sharded client the prefill replicas use: offload
// then fetch across shards with byte-exact data, deduplication, a partial prefix, staging
// exhaustion, and instances that are down or of another layout (fetch answers "not
// available" promptly, never an error); the metrics of both sides (kvstore_metrics.h).
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <map>
#include <random>
#include <thread>

#include "engine/runtime/block_hash.h"
#include "gtest/gtest.h"
#include "services/common/transfer/in_process_transfer_engine.h"
#include "services/kvstore/block_store.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "services/kvstore/kvstore_client.h"
#include "services/kvstore/kvstore_metrics.h"
#include "services/kvstore/kvstore_service.h"
#include "xxhash.h"

namespace tandem::kvstore {
namespace {

constexpr uint64_t kFp = 0x1234;
constexpr int64_t kBlockFloats = 2 * 64 * 8;  // 2 layers, 64 tokens, entry_dim 8
constexpr int64_t kBlock = kBlockFloats * 4;

struct Instance {
  std::string name;
  transfer::InProcessTransferEngine transfer;
  std::unique_ptr<transfer::MemoryRegion> region;
  std::unique_ptr<BlockStore> store;
  prometheus::Registry registry;
  KvStoreRpcMetrics rpc_metrics{registry, "m"};
  std::unique_ptr<KvStoreServiceImpl> service;
  std::unique_ptr<grpc::Server> server;
  std::string address;

  struct Limits {
    int max_hashes_per_call = kMaxHashesPerCall;
    int max_queued_gets = kMaxQueuedGets;
  };
  Instance(std::string n, int64_t slots, uint64_t fingerprint = kFp) : Instance(std::move(n), slots, fingerprint, {}) {}
  Instance(std::string n, int64_t slots, uint64_t fingerprint, Limits limits) : name(std::move(n)) {
    region = *transfer.AllocateMemory(static_cast<size_t>(slots * kBlock));
    store = std::make_unique<BlockStore>(region->base(), region->length(), BlockStoreOptions{.block_bytes = kBlock},
                                         nullptr);
    service = std::make_unique<KvStoreServiceImpl>(store.get(), &transfer, region->descriptor().Serialize(),
                                                   KvStoreServiceOptions{.instance_name = name,
                                                                         .layout_fingerprint = fingerprint,
                                                                         .metrics = &rpc_metrics,
                                                                         .max_hashes_per_call = limits.max_hashes_per_call,
                                                                         .max_queued_gets = limits.max_queued_gets});
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service.get());
    server = b.BuildAndStart();
    address = "127.0.0.1:" + std::to_string(port);
  }
  void Stop() {
    if (!server) return;
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    service->Drain(absl::Seconds(5));
    server.reset();
  }
  ~Instance() { Stop(); }
};

std::vector<uint64_t> Hashes(int n, uint64_t salt) {
  std::vector<uint64_t> h;
  for (int i = 0; i < n; ++i) h.push_back(XXH3_64bits_withSeed(&i, sizeof i, salt));
  return h;
}

std::vector<float> Data(int blocks, int salt) {
  std::vector<float> d(static_cast<size_t>(blocks * kBlockFloats));
  std::mt19937 rng(salt);
  for (float& f : d) f = static_cast<float>(rng() % 100000) / 7.0f;
  return d;
}

std::unique_ptr<KvStoreClient> MakeClient(transfer::TransferEngine* t, std::vector<Instance*> instances,
                                          size_t staging_blocks = 64, uint64_t fingerprint = kFp,
                                          absl::Duration fetch_timeout = absl::Seconds(5),
                                          int max_hashes_per_call = kMaxHashesPerCall) {
  auto c = KvStoreClient::Create(t, {.layout_fingerprint = fingerprint, .block_bytes = kBlock,
                                     .staging_bytes = staging_blocks * kBlock,
                                     .fetch_timeout = fetch_timeout,
                                     .max_hashes_per_call = max_hashes_per_call});
  EXPECT_TRUE(c.ok()) << c.status();
  std::vector<KvStoreClient::Instance> list;
  for (Instance* i : instances) list.push_back({i->name, i->address});
  (*c)->SetInstances(list);
  return std::move(*c);
}

PrefixStore::FetchResult FetchSync(KvStoreClient& c, PrefixStore::FetchRequest r) {
  std::promise<PrefixStore::FetchResult> p;
  auto f = p.get_future();
  c.Fetch(std::move(r), [&p](PrefixStore::FetchResult res) { p.set_value(std::move(res)); });
  return f.get();
}

void WaitOffloaded(KvStoreClient& c, int64_t blocks, int64_t dedup = 0) {
  for (int i = 0; i < 1000; ++i) {
    const KvStoreClientStats s = c.stats();
    if (s.offload_blocks >= blocks && s.offload_dedup_blocks >= dedup) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ADD_FAILURE() << "offload did not complete: " << c.stats().offload_blocks << " blocks";
}

void ExpectBlocks(const PrefixKv& kv, const std::vector<float>& data) {
  for (size_t i = 0; i < kv.blocks.size(); ++i) {
    const int64_t b = kv.first_block + static_cast<int64_t>(i);
    EXPECT_EQ(std::memcmp(kv.blocks[i], data.data() + b * kBlockFloats, kBlock), 0) << "block " << b;
  }
}

TEST(KvStoreClientTest, OffloadThenFetchAcrossShards) {
  Instance a("kvstore-0", 64), b("kvstore-1", 64), c("kvstore-2", 64);
  transfer::InProcessTransferEngine local;
  auto client = MakeClient(&local, {&a, &b, &c});
  const std::vector<uint64_t> hashes = Hashes(24, 1);
  const std::vector<float> data = Data(24, 1);

  PrefixStore::FetchResult empty = FetchSync(*client, {.hashes = hashes, .first_block = 0, .end_block = 24});
  EXPECT_TRUE(empty.available);
  EXPECT_EQ(empty.stored_prefix, 0);
  EXPECT_EQ(empty.prefix, nullptr);

  client->Offload({.hashes = hashes, .data = data});
  WaitOffloaded(*client, 24);
  int64_t total = 0;
  for (Instance* i : {&a, &b, &c}) {
    const int64_t n = i->store->stats().committed_blocks;
    EXPECT_GT(n, 0) << i->name << " owns part of the key space";
    total += n;
  }
  EXPECT_EQ(total, 24);

  PrefixStore::FetchResult all = FetchSync(*client, {.hashes = hashes, .first_block = 0, .end_block = 23});
  ASSERT_TRUE(all.available);
  EXPECT_EQ(all.stored_prefix, 24);
  ASSERT_NE(all.prefix, nullptr);
  EXPECT_EQ(all.prefix->first_block, 0);
  EXPECT_EQ(all.prefix->blocks.size(), 23u);
  EXPECT_EQ(all.prefix->hashes, std::vector<uint64_t>(hashes.begin(), hashes.begin() + 23));
  ExpectBlocks(*all.prefix, data);

  PrefixStore::FetchResult middle = FetchSync(*client, {.hashes = hashes, .first_block = 5, .end_block = 12});
  ASSERT_NE(middle.prefix, nullptr);
  EXPECT_EQ(middle.prefix->first_block, 5);
  EXPECT_EQ(middle.prefix->blocks.size(), 7u);
  ExpectBlocks(*middle.prefix, data);

  // The same blocks again: every one deduplicated, nothing rewritten.
  client->Offload({.hashes = hashes, .data = data});
  WaitOffloaded(*client, 24, 24);
  EXPECT_EQ(client->stats().offload_blocks, 24);
  EXPECT_EQ(a.store->stats().committed_blocks + b.store->stats().committed_blocks + c.store->stats().committed_blocks, 24);
  EXPECT_EQ(client->stats().fetched_blocks, 30);
  EXPECT_EQ(client->stats().checksum_mismatches, 0);
}

TEST(KvStoreClientTest, PrefixEndsAtTheFirstMissingBlockOnAnyShard) {
  Instance a("kvstore-0", 64), b("kvstore-1", 64);
  transfer::InProcessTransferEngine local;
  auto client = MakeClient(&local, {&a, &b});
  const std::vector<uint64_t> hashes = Hashes(16, 2);
  const std::vector<float> data = Data(16, 2);
  // Blocks 0-9 and 12-15 stored, 10 and 11 not.
  client->Offload({.hashes = std::vector<uint64_t>(hashes.begin(), hashes.begin() + 10),
                   .data = std::vector<float>(data.begin(), data.begin() + 10 * kBlockFloats)});
  client->Offload({.hashes = std::vector<uint64_t>(hashes.begin() + 12, hashes.end()),
                   .data = std::vector<float>(data.begin() + 12 * kBlockFloats, data.end())});
  WaitOffloaded(*client, 14);
  PrefixStore::FetchResult r = FetchSync(*client, {.hashes = hashes, .first_block = 3, .end_block = 16});
  EXPECT_EQ(r.stored_prefix, 10);
  ASSERT_NE(r.prefix, nullptr);
  EXPECT_EQ(r.prefix->first_block, 3);
  EXPECT_EQ(r.prefix->blocks.size(), 7u);
  ExpectBlocks(*r.prefix, data);
}

TEST(KvStoreClientTest, StagingExhaustionShortensTheFetchAndSlotsComeBack) {
  Instance a("kvstore-0", 64);
  transfer::InProcessTransferEngine local;
  auto client = MakeClient(&local, {&a}, /*staging_blocks=*/6);
  const std::vector<uint64_t> hashes = Hashes(10, 3);
  const std::vector<float> data = Data(10, 3);
  client->Offload({.hashes = hashes, .data = data});
  WaitOffloaded(*client, 10);
  PrefixStore::FetchResult first = FetchSync(*client, {.hashes = hashes, .first_block = 0, .end_block = 10});
  ASSERT_NE(first.prefix, nullptr);
  EXPECT_EQ(first.prefix->blocks.size(), 6u);
  EXPECT_EQ(client->stats().staging_exhausted, 1);
  ExpectBlocks(*first.prefix, data);
  PrefixStore::FetchResult second = FetchSync(*client, {.hashes = hashes, .first_block = 0, .end_block = 10});
  EXPECT_EQ(second.prefix, nullptr) << "every staging slot is held by the first fetch";
  first.prefix.reset();  // the engine copied it in: the slots return
  PrefixStore::FetchResult third = FetchSync(*client, {.hashes = hashes, .first_block = 4, .end_block = 10});
  ASSERT_NE(third.prefix, nullptr);
  EXPECT_EQ(third.prefix->blocks.size(), 6u);
  ExpectBlocks(*third.prefix, data);
}

TEST(KvStoreClientTest, DownOrForeignInstancesMakeTheTierUnavailableNotAnError) {
  Instance a("kvstore-0", 64), b("kvstore-1", 64);
  transfer::InProcessTransferEngine local;
  // A fetch deadline longer than any test: the fetch below can only end because the
  // client saw the instance down, not by waiting out its deadline.
  auto client = MakeClient(&local, {&a, &b}, 64, kFp, /*fetch_timeout=*/absl::Hours(1));
  const std::vector<uint64_t> hashes = Hashes(12, 4);
  client->Offload({.hashes = hashes, .data = Data(12, 4)});
  WaitOffloaded(*client, 12);
  b.Stop();
  PrefixStore::FetchResult r = FetchSync(*client, {.hashes = hashes, .first_block = 0, .end_block = 12});
  EXPECT_FALSE(r.available);
  EXPECT_EQ(r.prefix, nullptr);
  EXPECT_GE(client->stats().fetch_errors, 1);
  client->Offload({.hashes = Hashes(4, 5), .data = Data(4, 5)});  // does not hang or crash

  // An instance serving another model's layout refuses: no data of the wrong layout.
  Instance foreign("kvstore-0", 64, /*fingerprint=*/999);
  auto other = MakeClient(&local, {&foreign});
  EXPECT_FALSE(FetchSync(*other, {.hashes = hashes, .first_block = 0, .end_block = 12}).available);

  // No instance at all: nothing to ask.
  auto none = MakeClient(&local, {});
  EXPECT_FALSE(none->available());
  EXPECT_FALSE(FetchSync(*none, {.hashes = hashes, .first_block = 0, .end_block = 12}).available);
}

}  // namespace
}  // namespace tandem::kvstore

namespace tandem::kvstore {
namespace {

// The value of the sample of `name` whose labels include `labels` (NaN when absent);
// histograms: their sample count.
double Sample(const std::vector<prometheus::MetricFamily>& families, const std::string& name,
              const std::map<std::string, std::string>& labels = {}) {
  for (const prometheus::MetricFamily& f : families) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      size_t matched = 0;
      for (const prometheus::ClientMetric::Label& l : m.label) {
        auto it = labels.find(l.name);
        matched += it != labels.end() && it->second == l.value ? 1 : 0;
      }
      if (matched != labels.size()) continue;
      switch (f.type) {
        case prometheus::MetricType::Counter: return m.counter.value;
        case prometheus::MetricType::Gauge: return m.gauge.value;
        case prometheus::MetricType::Histogram: return static_cast<double>(m.histogram.sample_count);
        default: return std::nan("");
      }
    }
  }
  return std::nan("");
}

TEST(KvStoreMetricsTest, BothSidesCountQueriesHitTokensBytesEvictionsAndRpcs) {
  Instance a("kvstore-0", 8);
  transfer::InProcessTransferEngine local;
  auto client = MakeClient(&local, {&a});
  auto server_side = KvStoreStatsCollector([&a] { return a.store->stats(); }, "m", 64);
  auto client_side = KvStoreClientCollector(client.get(), "m", "prefill", 64);

  const std::vector<uint64_t> first = Hashes(6, 7), second = Hashes(6, 8);
  client->Offload({.hashes = first, .data = Data(6, 7)});
  WaitOffloaded(*client, 6);
  PrefixStore::FetchResult r = FetchSync(*client, {.hashes = first, .first_block = 0, .end_block = 6});
  ASSERT_NE(r.prefix, nullptr);
  EXPECT_EQ(r.prefix->blocks.size(), 6u);
  r = {};
  // The instance unpins the blocks it served once its Get completes, which may be just
  // after the client has them: wait until all 8 slots are usable again.
  for (int i = 0; i < 1000 && a.store->num_available() < 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(a.store->num_available(), 8);
  // Six more blocks into 8 slots: the least recently used go.
  client->Offload({.hashes = second, .data = Data(6, 8)});
  WaitOffloaded(*client, 12);
  // A lookup of another layout, refused.
  {
    auto stub = v1::KvStore::NewStub(grpc::CreateChannel(a.address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::KvLookupRequest req;
    req.mutable_format()->set_layout_fingerprint(kFp + 1);
    req.mutable_format()->set_block_bytes(kBlock);
    v1::KvLookupResponse resp;
    EXPECT_EQ(stub->Lookup(&ctx, req, &resp).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  }

  const KvStoreStats st = a.store->stats();
  const std::vector<prometheus::MetricFamily> s = server_side->Collect();
  const std::map<std::string, std::string> kv = {{"model", "m"}, {"role", "kvstore"}};
  EXPECT_EQ(Sample(s, "tandem_kvstore_lookups_total", kv), static_cast<double>(st.lookups));
  EXPECT_GE(st.lookups, 1);
  EXPECT_EQ(Sample(s, "tandem_kvstore_lookup_tokens_total"), 6 * 64);
  EXPECT_EQ(Sample(s, "tandem_kvstore_lookup_hit_tokens_total"), 6 * 64);
  EXPECT_EQ(Sample(s, "tandem_kvstore_hit_tokens_total"), 6 * 64);
  EXPECT_EQ(Sample(s, "tandem_kvstore_bytes_total", {{"op", "get"}}), 6 * kBlock);
  EXPECT_EQ(Sample(s, "tandem_kvstore_bytes_total", {{"op", "put"}}), 12 * kBlock);
  EXPECT_EQ(Sample(s, "tandem_kvstore_put_blocks_total", {{"outcome", "committed"}}), 12);
  EXPECT_GT(st.dram_evictions, 0);
  EXPECT_EQ(Sample(s, "tandem_kvstore_evictions_total", {{"tier", "dram"}}), static_cast<double>(st.dram_evictions));
  EXPECT_EQ(Sample(s, "tandem_kvstore_capacity_bytes", {{"tier", "dram"}}), 8 * kBlock);
  EXPECT_LE(Sample(s, "tandem_kvstore_used_bytes", {{"tier", "dram"}}), 8 * kBlock);
  // The RPC decorator: every call timed and counted by outcome.
  const std::vector<prometheus::MetricFamily> rpcs = a.registry.Collect();
  EXPECT_EQ(Sample(rpcs, "tandem_kvstore_rpcs_total", {{"rpc", "Lookup"}, {"code", "OK"}}), 1);
  EXPECT_EQ(Sample(rpcs, "tandem_kvstore_rpcs_total", {{"rpc", "Lookup"}, {"code", "FAILED_PRECONDITION"}}), 1);
  EXPECT_EQ(Sample(rpcs, "tandem_kvstore_rpcs_total", {{"rpc", "Get"}, {"code", "OK"}}), 1);
  EXPECT_EQ(Sample(rpcs, "tandem_kvstore_rpcs_total", {{"rpc", "Reserve"}, {"code", "OK"}}), 2);
  EXPECT_EQ(Sample(rpcs, "tandem_kvstore_rpcs_total", {{"rpc", "Commit"}, {"code", "OK"}}), 2);
  EXPECT_EQ(Sample(rpcs, "tandem_kvstore_rpc_duration_seconds", {{"rpc", "Get"}}), 1);
  EXPECT_EQ(Sample(rpcs, "tandem_kvstore_rpc_duration_seconds", {{"rpc", "Lookup"}}), 2);

  const std::vector<prometheus::MetricFamily> c = client_side->Collect();
  const std::map<std::string, std::string> pf = {{"model", "m"}, {"role", "prefill"}};
  EXPECT_EQ(Sample(c, "tandem_kvstore_client_instances", pf), 1);
  EXPECT_EQ(Sample(c, "tandem_kvstore_client_queries_total"), 1);
  EXPECT_EQ(Sample(c, "tandem_kvstore_client_queried_tokens_total"), 6 * 64);
  EXPECT_EQ(Sample(c, "tandem_kvstore_client_hit_tokens_total"), 6 * 64);
  EXPECT_EQ(Sample(c, "tandem_kvstore_client_bytes_total", {{"op", "fetch"}}), 6 * kBlock);
  EXPECT_EQ(Sample(c, "tandem_kvstore_client_bytes_total", {{"op", "offload"}}), 12 * kBlock);
  EXPECT_EQ(Sample(c, "tandem_kvstore_client_offloads_total", {{"outcome", "sent"}}), 2);
  EXPECT_EQ(Sample(c, "tandem_kvstore_client_offload_blocks_total", {{"outcome", "written"}}), 12);
  EXPECT_EQ(Sample(c, "tandem_kvstore_client_errors_total", {{"op", "fetch"}}), 0);
}

// A unary call of `method` with `bytes` as the request message, as a client that does not
// use the generated stubs may send it.
grpc::Status RawCall(const std::string& address, const std::string& method, const std::string& bytes,
                     std::string* message_out = nullptr) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  std::promise<grpc::Status> done;
  generic.UnaryCall(&ctx, "/tandem.v1.KvStore/" + method, grpc::StubOptions(), &request, &response,
                    [&done](grpc::Status st) { done.set_value(std::move(st)); });
  grpc::Status st = done.get_future().get();
  if (message_out != nullptr) *message_out = st.error_message();
  return st;
}

TEST(KvStoreServiceTest, UndecodableRequestsAreInvalidArgumentNamingTheMessage) {
  Instance a("kvstore-0", 8);
  // Bytes no protobuf message decodes from: a field of wire type 7 (there is none), and a
  // length-delimited field claiming more bytes than follow.
  const std::string invalid_wire_type = std::string("\x0f\x01\x02\x03", 4);
  const std::string truncated = std::string("\x12\xff\xff\x03\x01\x02\x03", 7);
  const std::map<std::string, std::string> types = {{"Lookup", "tandem.v1.KvLookupRequest"},
                                                    {"Reserve", "tandem.v1.KvReserveRequest"},
                                                    {"Commit", "tandem.v1.KvCommitRequest"},
                                                    {"Get", "tandem.v1.KvGetRequest"},
                                                    {"Stats", "tandem.v1.KvStatsRequest"}};
  for (const auto& [method, type] : types) {
    for (const std::string& bytes : {invalid_wire_type, truncated}) {
      std::string message;
      const grpc::Status st = RawCall(a.address, method, bytes, &message);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method << ": " << message;
      EXPECT_NE(message.find(type), std::string::npos) << method << ": " << message;
    }
  }
  // An empty message is a valid (empty) request: Stats answers it.
  EXPECT_TRUE(RawCall(a.address, "Stats", "").ok());
  EXPECT_EQ(Sample(a.registry.Collect(), "tandem_kvstore_rpcs_total", {{"rpc", "Get"}, {"code", "INVALID_ARGUMENT"}}), 2);
}

TEST(KvStoreServiceTest, CallsWithMoreHashesThanTheCapAreRefusedAndTheClientSplitsUnderIt) {
  constexpr int kCap = 8;
  Instance a("kvstore-0", 64, kFp, {.max_hashes_per_call = kCap});
  auto stub = v1::KvStore::NewStub(grpc::CreateChannel(a.address, grpc::InsecureChannelCredentials()));
  v1::KvBlockFormat format;
  format.set_layout_fingerprint(kFp);
  format.set_block_bytes(kBlock);
  format.set_block_tokens(64);
  const std::vector<uint64_t> over = Hashes(kCap + 1, 11);
  auto expect_refused = [](const grpc::Status& st, const char* what) {
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << what << ": " << st.error_message();
    EXPECT_NE(st.error_message().find("block_hashes: 9 hashes; at most 8 per call"), std::string::npos)
        << what << ": " << st.error_message();
  };
  {
    grpc::ClientContext ctx;
    v1::KvLookupRequest r;
    *r.mutable_format() = format;
    for (uint64_t h : over) r.add_block_hashes(h);
    v1::KvLookupResponse resp;
    expect_refused(stub->Lookup(&ctx, r, &resp), "Lookup");
  }
  {
    grpc::ClientContext ctx;
    v1::KvReserveRequest r;
    *r.mutable_format() = format;
    for (uint64_t h : over) r.add_block_hashes(h);
    v1::KvReserveResponse resp;
    expect_refused(stub->Reserve(&ctx, r, &resp), "Reserve");
  }
  {
    grpc::ClientContext ctx;
    v1::KvCommitRequest r;
    r.set_reservation_id("r-1");
    for (uint64_t h : over) {
      r.add_block_hashes(h);
      r.add_checksums(0);
    }
    v1::KvCommitResponse resp;
    expect_refused(stub->Commit(&ctx, r, &resp), "Commit");
  }
  {
    grpc::ClientContext ctx;
    v1::KvGetRequest r;
    *r.mutable_format() = format;
    for (size_t i = 0; i < over.size(); ++i) {
      r.add_block_hashes(over[i]);
      r.add_offsets(i * kBlock);
    }
    v1::KvGetResponse resp;
    expect_refused(stub->Get(&ctx, r, &resp), "Get");
  }
  EXPECT_EQ(a.store->stats().lookups, 0) << "a refused call reached the store";
  EXPECT_EQ(a.store->stats().reserved_blocks, 0);

  // The client, told the same cap, sends a 40-block prompt in calls of at most 8 hashes:
  // every block offloaded and fetched back, none of its calls refused.
  transfer::InProcessTransferEngine local;
  auto client = MakeClient(&local, {&a}, 64, kFp, absl::Seconds(5), kCap);
  const std::vector<uint64_t> hashes = Hashes(40, 12);
  const std::vector<float> data = Data(40, 12);
  client->Offload({.hashes = hashes, .data = data});
  WaitOffloaded(*client, 40);
  PrefixStore::FetchResult r = FetchSync(*client, {.hashes = hashes, .first_block = 0, .end_block = 40});
  ASSERT_TRUE(r.available);
  EXPECT_EQ(r.stored_prefix, 40);
  ASSERT_NE(r.prefix, nullptr);
  EXPECT_EQ(r.prefix->blocks.size(), 40u);
  ExpectBlocks(*r.prefix, data);
  EXPECT_EQ(client->stats().fetch_errors, 0);
  EXPECT_EQ(client->stats().offload_errors, 0);
  const std::vector<prometheus::MetricFamily> rpcs = a.registry.Collect();
  for (const char* rpc : {"Lookup", "Reserve", "Commit", "Get"}) {
    EXPECT_EQ(Sample(rpcs, "tandem_kvstore_rpcs_total", {{"rpc", rpc}, {"code", "OK"}}), 5) << rpc << ": 40 / 8 calls";
  }
}

TEST(KvStoreServiceTest, GetsBeyondTheQueueAreRefusedAndTheFetchFallsBackWithItsSlots) {
  // No room in the I/O queue at all: every Get is refused as busy.
  Instance a("kvstore-0", 64, kFp, {.max_queued_gets = 0});
  transfer::InProcessTransferEngine local;
  auto client = MakeClient(&local, {&a}, /*staging_blocks=*/10);
  const std::vector<uint64_t> hashes = Hashes(10, 13);
  client->Offload({.hashes = hashes, .data = Data(10, 13)});
  WaitOffloaded(*client, 10);
  for (int attempt = 0; attempt < 3; ++attempt) {
    PrefixStore::FetchResult r = FetchSync(*client, {.hashes = hashes, .first_block = 0, .end_block = 10});
    EXPECT_TRUE(r.available) << "the lookup answered: the tier is there, only busy";
    EXPECT_EQ(r.stored_prefix, 10);
    EXPECT_EQ(r.prefix, nullptr) << "nothing delivered: the prefill computes the prefix";
  }
  EXPECT_EQ(client->stats().fetch_errors, 3);
  EXPECT_EQ(client->stats().staging_exhausted, 0) << "a refused get wrote nothing: its slots came back at once";
  EXPECT_EQ(Sample(a.registry.Collect(), "tandem_kvstore_rpcs_total", {{"rpc", "Get"}, {"code", "RESOURCE_EXHAUSTED"}}),
            3);
}

// A layout with per-sequence state (DeepSeek-V4): the state where a prefix ends is stored
// as block-sized chunks named by StateChunkHash; a fetch brings the blocks up to the
// furthest end whose state is stored, and that state byte for byte, or, when a chunk is
// missing, nothing (blocks without their state cannot be used).
TEST(KvStoreClientTest, AStateIsStoredInChunksAndFetchedWholeWithTheBlocksBeforeIt) {
  Instance a("kvstore-0", 64), b("kvstore-1", 64);
  transfer::InProcessTransferEngine local;
  constexpr int64_t kState = kBlock * 5 / 2;  // three chunks, the last one half used
  auto c = KvStoreClient::Create(&local, {.layout_fingerprint = kFp, .block_bytes = kBlock, .state_bytes = kState,
                                          .staging_bytes = 64 * kBlock});
  ASSERT_TRUE(c.ok()) << c.status();
  KvStoreClient& client = **c;
  client.SetInstances({{a.name, a.address}, {b.name, b.address}});
  const std::vector<uint64_t> chain = Hashes(6, 20);
  const std::vector<float> blocks = Data(6, 20);
  // The offload of blocks [first, end) and the state after block end - 1 (`salt`'s bytes).
  auto offload = [&](int first, int end, int salt, int chunks) {
    std::vector<float> state = Data(3, salt);
    state.resize(static_cast<size_t>(kState / 4));
    PrefixStore::OffloadRequest r;
    r.hashes.assign(chain.begin() + first, chain.begin() + end);
    r.data.assign(blocks.begin() + first * kBlockFloats, blocks.begin() + end * kBlockFloats);
    for (int i = 0; i < chunks; ++i) r.hashes.push_back(StateChunkHash(chain[static_cast<size_t>(end) - 1], i));
    std::vector<float> padded = state;
    padded.resize(static_cast<size_t>(3 * kBlockFloats), 0.0f);
    r.data.insert(r.data.end(), padded.begin(), padded.begin() + chunks * kBlockFloats);
    client.Offload(std::move(r));
    return state;
  };
  auto expect_state = [](const PrefixKv& kv, const std::vector<float>& want) {
    std::vector<std::byte> got;
    for (const std::span<const std::byte>& piece : kv.state) got.insert(got.end(), piece.begin(), piece.end());
    ASSERT_EQ(got.size(), static_cast<size_t>(kState));
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0);
  };

  const std::vector<float> at4 = offload(0, 4, 21, 3);
  WaitOffloaded(client, 7);
  const std::vector<float> at2 = offload(2, 2, 22, 3);  // only the state after block 1
  WaitOffloaded(client, 10);

  PrefixStore::FetchResult r = FetchSync(client, {.hashes = chain, .first_block = 0, .end_block = 6});
  ASSERT_TRUE(r.available);
  EXPECT_EQ(r.stored_prefix, 4);
  ASSERT_NE(r.prefix, nullptr);
  EXPECT_EQ(r.stored_state_end, 4);
  EXPECT_EQ(r.prefix->first_block, 0);
  EXPECT_EQ(r.prefix->end_block(), 4) << "the furthest stored state";
  EXPECT_EQ(r.prefix->state_hash, chain[3]);
  ExpectBlocks(*r.prefix, blocks);
  expect_state(*r.prefix, at4);

  r = FetchSync(client, {.hashes = chain, .first_block = 0, .end_block = 3});  // the engine can use 3 blocks
  ASSERT_NE(r.prefix, nullptr);
  EXPECT_EQ(r.prefix->end_block(), 2);
  EXPECT_EQ(r.prefix->state_hash, chain[1]);
  ExpectBlocks(*r.prefix, blocks);
  expect_state(*r.prefix, at2);

  // With a local snapshot after block 3 nothing is fetched, but the answer says the
  // tier holds that state (the prefill then offloads nothing).
  r = FetchSync(client, {.hashes = chain, .first_block = 4, .end_block = 4, .min_state_end = 4});
  EXPECT_EQ(r.prefix, nullptr);
  EXPECT_EQ(r.stored_state_end, 4);

  // Four blocks cached locally without a state: only the state comes.
  r = FetchSync(client, {.hashes = chain, .first_block = 4, .end_block = 5});
  ASSERT_NE(r.prefix, nullptr);
  EXPECT_EQ(r.prefix->first_block, 4);
  EXPECT_TRUE(r.prefix->blocks.empty());
  expect_state(*r.prefix, at4);

  // A state missing its last chunk is not fetched, and nor are the blocks before it.
  offload(1, 1, 23, 2);
  WaitOffloaded(client, 12);
  r = FetchSync(client, {.hashes = chain, .first_block = 0, .end_block = 1});
  EXPECT_TRUE(r.available);
  EXPECT_EQ(r.prefix, nullptr);
  r.prefix.reset();
  EXPECT_EQ(client.stats().checksum_mismatches, 0);
  EXPECT_EQ(client.stats().offload_errors, 0);
}

}  // namespace
}  // namespace tandem::kvstore
