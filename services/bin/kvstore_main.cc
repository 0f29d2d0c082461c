#include "services/common/grpc_keepalive.h"
#include "services/bin/kvstore_main.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "engine/model/model_resolver.h"
#include "engine/util/mapped_file.h"
#include "engine/runtime/engine.h"
#include "engine/runtime/kv_layout.h"
#include "nlohmann/json.hpp"
#include "prometheus/registry.h"
#include "services/common/admin_server.h"
#include "services/common/collectables.h"
#include "services/common/host_port.h"
#include "services/common/logging.h"
#include "services/common/ready_file.h"
#include "services/common/service_flags.h"
#include "services/common/shutdown_signal.h"
#include "services/common/transfer/ucx_transfer_engine.h"
#include "services/kvstore/block_store.h"
#include "services/kvstore/byte_size.h"
#include "services/kvstore/disk_tier.h"
#include "services/kvstore/kvstore_metrics.h"
#include "services/kvstore/kvstore_service.h"
#include "services/security/internal_credentials.h"
#include "services/security/listen_policy.h"
#include "services/cluster/router_registration.h"
#include "spdlog/spdlog.h"

namespace tandem {
namespace {

int Fail(const std::string& what, const absl::Status& s) {
  spdlog::error("{}: {}", what, std::string(s.message()));
  return 1;
}

}  // namespace

int RunKvStore(int argc, char** argv) {
  service::InstallShutdownSignalHandling();
  service::CommonFlags common;
  std::string instance_name, advertise, capacity = "1G", disk_dir, disk_capacity = "16G";
  std::string layout_fingerprint;
  int32_t speculative_tokens = 0;
  int64_t lease_ms = 30000;
  security::InternalAuthFlags internal_auth;
  CLI::App app{
      "tandem-kvstore: the prefix KV block store (docs/design.md §1, §4). Keeps KV blocks of prompt prefixes, keyed by "
      "the block hash chain and the KV layout fingerprint, in a DRAM tier with LRU eviction and an optional SSD "
      "tier that holds what DRAM evicts and survives restarts. Control plane tandem.v1.KvStore (gRPC); block bytes "
      "over UCX. Registers with the router (--router) so prefill replicas find it; several instances shard the "
      "key space by consistent hashing of --instance-name. --listen is an internal port: the cluster's credentials "
      "(--tls-* or --cluster-token-file) are required there, and without them it may listen on loopback only."};
  service::AddCommonFlags(app, &common, {.listen = "127.0.0.1:0"});
  security::AddInternalAuthFlags(app, &internal_auth);
  app.add_option("--instance-name", instance_name,
                 "Stable name of this instance on the consistent-hash ring (keep it across restarts; default: the "
                 "advertised gRPC address)");
  app.add_option("--advertise", advertise,
                 "HOST others should use to reach this instance (default: the --listen host, or 127.0.0.1)");
  app.add_option("--capacity", capacity, "DRAM tier size (bytes, or with K/M/G/T: 512M, 4G)")->capture_default_str();
  app.add_option("--layout-fingerprint", layout_fingerprint,
                 "The KV layout fingerprint of the blocks this instance stores (16 hex digits, as the replicas show "
                 "in /stats). Default: computed from --model's config.json and a digest of its weight files");
  app.add_option("--speculative-tokens", speculative_tokens,
                 "The workers' --speculative-tokens: only whether it is above 0 matters here. Speculative decoding "
                 "keeps the MTP layer's KV too: larger blocks of another layout and fingerprint (the fingerprint is "
                 "--layout-fingerprint's when given)")
      ->check(CLI::Range(0, static_cast<int>(kMaxSpeculativeTokens)))
      ->capture_default_str();
  app.add_option("--disk-dir", disk_dir, "SSD tier directory (empty: no SSD tier)");
  app.add_option("--disk-capacity", disk_capacity, "SSD tier size (bytes, or with K/M/G/T)")->capture_default_str();
  app.add_option("--lease-ms", lease_ms, "How long a writer's reserved slots wait for their commit")
      ->check(CLI::Range(int64_t{100}, int64_t{3600000}))
      ->capture_default_str();
  service::BindEnvironment(app);
  if (int rc = service::ParseOrExit(app, argc, argv); rc != 0) return rc;
  if (absl::Status s = service::InitLogging(common.log_level, common.log_format, "tandem-kvstore"); !s.ok()) {
    std::fprintf(stderr, "tandem-kvstore: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  absl::StatusOr<security::InternalCredentials> creds = security::InternalCredentials::Load(internal_auth);
  if (!creds.ok()) return Fail("flags", creds.status());
  if (absl::Status s = security::CheckInternalListen(common.listen, creds->authenticated(), "--listen"); !s.ok()) {
    return Fail("flags", s);
  }
  absl::StatusOr<int64_t> dram_bytes = kvstore::ParseByteSize(capacity, "--capacity");
  if (!dram_bytes.ok()) return Fail("flags", dram_bytes.status());
  absl::StatusOr<int64_t> disk_bytes = kvstore::ParseByteSize(disk_capacity, "--disk-capacity");
  if (!disk_bytes.ok()) return Fail("flags", disk_bytes.status());

  // The KV layout this instance serves: its fingerprint and the size of one block.
  absl::StatusOr<std::string> model_dir = ResolveModelDir(common.model);
  if (!model_dir.ok()) return Fail("model", model_dir.status());
  absl::StatusOr<std::string> config_text = ReadFileToString(*model_dir + "/config.json");
  if (!config_text.ok()) return Fail("model config", config_text.status());
  // Block sizes only; the identity is the fingerprint.
  const KvStreamOptions streams{.mtp = speculative_tokens > 0};
  absl::StatusOr<KvLayout> geometry = KvLayoutFor(*config_text, 0, streams);
  if (!geometry.ok()) return Fail("model config", geometry.status());
  const KvLayout* layout = &*geometry;
  absl::StatusOr<uint64_t> admitted =
      AdmittedLayoutFingerprint(*model_dir, layout_fingerprint, "--layout-fingerprint", streams);
  if (!admitted.ok()) return Fail("KV layout", admitted.status());
  const uint64_t fingerprint = *admitted;
  const int64_t block_bytes = BlockBytes(*layout);
  const int64_t slots = *dram_bytes / block_bytes;
  if (slots < 1) {
    return Fail("flags", absl::InvalidArgumentError(absl::StrCat("--capacity: ", *dram_bytes,
                                                                 " bytes hold no block of ", block_bytes, " bytes")));
  }

  absl::StatusOr<std::unique_ptr<transfer::UcxTransferEngine>> ucx = transfer::UcxTransferEngine::Create();
  if (!ucx.ok()) return Fail("UCX", ucx.status());
  // The DRAM tier lives in transfer-layer memory: writers put blocks straight into it.
  absl::StatusOr<std::unique_ptr<transfer::MemoryRegion>> region =
      (*ucx)->AllocateMemory(static_cast<size_t>(slots * block_bytes));
  if (!region.ok()) return Fail("allocating the DRAM tier", region.status());
  std::unique_ptr<kvstore::DiskTier> disk;
  if (!disk_dir.empty()) {
    absl::StatusOr<std::unique_ptr<kvstore::DiskTier>> d = kvstore::DiskTier::Open(disk_dir, *disk_bytes);
    if (!d.ok()) return Fail("SSD tier", d.status());
    disk = std::move(*d);
    const kvstore::DiskTierStats ds = disk->stats();
    spdlog::info("SSD tier {}: {} blocks loaded intact ({} bytes), {} corrupt files dropped", disk_dir, ds.loaded,
                 ds.bytes_used, ds.corrupt_dropped);
  }
  kvstore::BlockStore store((*region)->base(), (*region)->length(),
                            {.block_bytes = block_bytes, .block_tokens = layout->block_size,
                             .lease_seconds = lease_ms / 1000.0},
                            disk.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  service::AcceptClientKeepalive(builder);
  int port = 0;
  builder.AddListeningPort(common.listen, creds->ServerCredentials(), &port);
  absl::StatusOr<service::HostPort> listen = service::ParseHostPort(common.listen);
  // Metrics from an injected registry: the RPC decorator's latencies and outcomes, and the
  // store's counters read when scraped.
  auto registry = std::make_shared<prometheus::Registry>();
  kvstore::KvStoreRpcMetrics rpc_metrics(*registry, common.model);
  // The service needs its name before the server starts; the address is known after.
  kvstore::KvStoreServiceOptions so{
      .instance_name = instance_name, .layout_fingerprint = fingerprint, .lease_ms = lease_ms, .metrics = &rpc_metrics};
  auto service = std::make_unique<kvstore::KvStoreServiceImpl>(&store, ucx->get(),
                                                                (*region)->descriptor().Serialize(), so);
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) return Fail("gRPC", absl::UnavailableError("cannot listen on " + common.listen));
  std::string host = advertise.empty() ? (listen.ok() ? listen->host : "127.0.0.1") : advertise;
  if (host == "0.0.0.0" || host == "::" || host.empty()) host = "127.0.0.1";
  const std::string grpc_address = service::FormatHostPort(host, static_cast<uint16_t>(port));
  if (instance_name.empty()) instance_name = grpc_address;
  service->SetInstanceName(instance_name);

  service::AdminServer admin(CombineCollectables(
      {registry, kvstore::KvStoreStatsCollector([&store] { return store.stats(); }, common.model,
                                                layout->block_size)}));
  if (absl::Status s = admin.Start(common.admin_listen); !s.ok()) return Fail("admin server", s);
  admin.AddHandler("/stats", [&store, instance_name](const service::HttpRequest&) {
    return service::HttpResponse::Json(kvstore::StatsJson(store.stats(), instance_name).dump());
  });

  auto load = [&store]() {
    v1::LoadReport r;
    const kvstore::KvStoreStats s = store.stats();
    r.set_kv_blocks_total(store.num_slots());
    r.set_kv_blocks_free(store.num_available());
    r.set_kv_usage(s.dram_capacity_bytes > 0 ? static_cast<double>(s.dram_bytes_used) / s.dram_capacity_bytes : 0.0);
    return r;
  };
  std::unique_ptr<RouterRegistration> registration;
  if (!common.router.empty()) {
    v1::RegisterRequest self;
    self.set_role(v1::ROLE_KVSTORE);
    self.set_grpc_address(grpc_address);
    self.set_admin_address(admin.bound_address());
    self.set_model(common.model);
    self.set_layout_fingerprint(fingerprint);
    self.set_pid(getpid());
    self.set_instance_name(instance_name);
    registration = std::make_unique<RouterRegistration>(common.router, self, load, nullptr, creds->ChannelFactory());
    if (absl::Status s = registration->Start(std::chrono::seconds(30)); !s.ok()) return Fail("registration", s);
  }
  admin.SetReady(true);
  nlohmann::json ready = {{"role", "kvstore"},
                          {"pid", getpid()},
                          {"grpc", grpc_address},
                          {"admin", admin.bound_address()},
                          {"model", *model_dir},
                          {"instance_name", instance_name},
                          {"block_bytes", block_bytes},
                          {"dram_capacity_bytes", slots * block_bytes},
                          {"disk_dir", disk_dir},
                          {"transport", std::string((*ucx)->transport())}};
  if (registration) ready["replica_id"] = registration->replica_id();
  if (!common.ready_file.empty()) {
    if (absl::Status s = service::WriteReadyFile(common.ready_file, ready); !s.ok()) return Fail("ready file", s);
  }
  spdlog::info("ready: gRPC {} admin {} instance {}; DRAM tier {} blocks of {} bytes{}", grpc_address,
               admin.bound_address(), instance_name, slots, block_bytes,
               disk ? absl::StrCat("; SSD tier ", disk_dir) : std::string());

  int sig = 0;
  for (;;) {
    if (std::optional<int> s = service::WaitForShutdownSignalFor(std::chrono::seconds(1)); s.has_value()) {
      sig = *s;
      break;
    }
    store.ExpireReservations();
  }
  spdlog::info("shutting down ({})", sig == 0 ? "requested" : strsignal(sig));
  admin.SetReady(false);
  if (registration) registration->SetDraining();
  registration.reset();  // deregisters
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  service->Drain(absl::Seconds(10));
  server.reset();
  service.reset();
  admin.Stop();
  return 0;
}

}  // namespace tandem
