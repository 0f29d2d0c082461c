#include "services/common/grpc_keepalive.h"
#include "services/bin/router_main.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "engine/architectures/architectures.h"
#include "engine/model/model_resolver.h"
#include "engine/runtime/engine.h"
#include "engine/runtime/kv_layout.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "prometheus/registry.h"
#include "services/api/proto_convert.h"
#include "services/common/admin_server.h"
#include "services/common/collectables.h"
#include "services/common/host_port.h"
#include "services/common/logging.h"
#include "services/common/ready_file.h"
#include "services/common/service_flags.h"
#include "services/common/shutdown_signal.h"
#include "services/router/cluster_service.h"
#include "services/router/dashboard_api.h"
#include "services/router/metrics_history.h"
#include "services/router/replica_registry.h"
#include "services/router/router_generation_service.h"
#include "services/router/router_metrics.h"
#include "services/security/api_key_authenticator.h"
#include "services/security/http_api_key_check.h"
#include "services/security/internal_credentials.h"
#include "services/openai/openai_server.h"
#include "services/security/listen_policy.h"
#include "services/security/public_credentials.h"
#include "spdlog/spdlog.h"

namespace tandem {
namespace {

int Fail(const std::string& what, const absl::Status& s) {
  spdlog::error("{}: {}", what, std::string(s.message()));
  return 1;
}

}  // namespace

int RunRouter(int argc, char** argv) {
  service::InstallShutdownSignalHandling();
  service::CommonFlags common;
  int64_t heartbeat_ms = 1000;
  int missed_heartbeats = 3;
  int64_t max_queue_wait_ms = 30000;
  int64_t max_prompt_bytes = kDefaultMaxPromptBytes;
  Admission::Limits admission_limits;
  int64_t retry_after_ms = admission_limits.retry_after.count();
  int64_t drain_timeout_ms = 30000;
  std::string prefill_policy = "cache-aware", decode_policy = "kv-aware";
  double cache_aware_load_weight = 4.0;
  bool disable_metrics = false;
  std::string dashboard_dir;
  std::string layout_fingerprint;
  int32_t speculative_tokens = 0;
  std::string internal_listen = "127.0.0.1:50061";
  security::InternalAuthFlags internal_auth;
  security::PublicSecurityFlags public_security;
  CLI::App app{
      "tandem-router: Tandem's public gRPC endpoint (tandem.v1.Generation). Picks a decode replica (KV lease) "
      "and a prefill replica per request, streams the tokens back, and keeps the cluster membership "
      "(tandem.v1.Cluster) that workers register with. Three kinds of port: --listen (public: Generation), "
      "--internal-listen (internal: Cluster; mutual TLS or a cluster token), --admin-listen (HTTP: metrics, "
      "health, dashboard); see docs/security.md."};
  service::AddCommonFlags(app, &common, {.listen = "127.0.0.1:50051", .with_router = false});
  app.add_option("--internal-listen", internal_listen,
                 "Internal gRPC address (tandem.v1.Cluster: workers and kvstores register here; their --router). "
                 "Without --tls-* or --cluster-token-file it may be a loopback address only (port 0: any free port)")
      ->type_name("HOST:PORT")
      ->capture_default_str();
  security::AddInternalAuthFlags(app, &internal_auth);
  security::AddPublicSecurityFlags(app, &public_security);
  app.add_option("--heartbeat-ms", heartbeat_ms, "Heartbeat interval the workers are told to use")
      ->check(CLI::Range(int64_t{50}, int64_t{60000}))
      ->capture_default_str();
  app.add_option("--missed-heartbeats", missed_heartbeats, "Heartbeats a replica may miss before it is dropped")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--max-prompt-bytes", max_prompt_bytes,
                 "Prompts (text or chat messages) longer than this are refused before tokenization")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--max-queue-wait-ms", max_queue_wait_ms,
                 "How long a request without a deadline may wait for KV room on a decode replica")
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}))
      ->capture_default_str();
  app.add_option("--max-prefill-queue", admission_limits.max_prefill_queue,
                 "Requests the router holds before their first token (waiting for or in prefill); more get "
                 "RESOURCE_EXHAUSTED with a retry hint")
      ->check(CLI::Range(int64_t{1}, int64_t{10000000}))
      ->capture_default_str();
  app.add_option("--max-decode-queue", admission_limits.max_decode_queue,
                 "Requests the router holds waiting for KV cache room on a decode replica; more get "
                 "RESOURCE_EXHAUSTED with a retry hint")
      ->check(CLI::Range(int64_t{1}, int64_t{10000000}))
      ->capture_default_str();
  app.add_option("--retry-after-ms", retry_after_ms,
                 "The retry hint of a refused request (grpc-retry-pushback-ms trailer and message)")
      ->check(CLI::Range(int64_t{0}, int64_t{3600000}))
      ->capture_default_str();
  app.add_option("--prefill-policy", prefill_policy,
                 "How prefill (and --role both) replicas are chosen: round-robin, least-outstanding, power-of-two, "
                 "cache-aware")
      ->check(CLI::IsMember({"round-robin", "least-outstanding", "power-of-two", "cache-aware"}))
      ->capture_default_str();
  app.add_option("--decode-policy", decode_policy,
                 "How decode replicas are chosen: round-robin, least-outstanding, power-of-two, kv-aware")
      ->check(CLI::IsMember({"round-robin", "least-outstanding", "power-of-two", "kv-aware"}))
      ->capture_default_str();
  app.add_option("--cache-aware-load-weight", cache_aware_load_weight,
                 "cache-aware: how many cached prefix blocks one request in flight is worth")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--drain-timeout-ms", drain_timeout_ms,
                 "On SIGTERM: stop accepting requests, let in-flight ones finish up to this long")
      ->capture_default_str();
  app.add_flag("--disable-metrics", disable_metrics, "Do not record request metrics (for overhead measurements)");
  app.add_option("--layout-fingerprint", layout_fingerprint,
                 "The KV layout fingerprint replicas must have to be admitted (16 hex digits, as the replicas show in "
                 "/stats). Default: computed from --model's config.json and a digest of its weight files, which the "
                 "router then reads once at startup");
  app.add_option("--speculative-tokens", speculative_tokens,
                 "The workers' --speculative-tokens: only whether it is above 0 matters here. Speculative decoding "
                 "keeps the MTP layer's KV too, another KV layout and fingerprint, which the router must admit "
                 "(ignored with --layout-fingerprint)")
      ->check(CLI::Range(0, static_cast<int>(kMaxSpeculativeTokens)))
      ->capture_default_str();
  std::string http_listen;
  int max_n = 64;
  int http_max_connections = 4096;
  app.add_option("--http-listen", http_listen,
                 "HOST:PORT of the OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models, "
                 "/tokenize, /detokenize, /health; port 0 picks a free one). Off unless given. HTTPS with "
                 "--public-tls-cert/--public-tls-key (the same certificate as the gRPC port), else plain HTTP. Uses "
                 "--api-keys-file's keys as gRPC does");
  app.add_option("--max-n", max_n, "Most choices (n) one HTTP completion request may ask for")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  std::string reasoning_parser;
  std::string tool_call_parser;
  app.add_option("--reasoning-parser", reasoning_parser,
                 "Split chat output into reasoning (<think>...</think>, sent as reasoning_content and reasoning) "
                 "and content: deepseek_r1 (output starts inside reasoning) or deepseek_v3 (V3.1: only with "
                 "chat_template_kwargs.thinking). Default: off, all text is content");
  app.add_option("--tool-call-parser", tool_call_parser,
                 "Parse the model's tool calls into tool_calls when a chat request offers tools: deepseek_v3 "
                 "(V3, R1) or deepseek_v31 (V3.1). Default: off");
  app.add_option("--http-max-connections", http_max_connections,
                 "Most HTTP connections open at once; more are answered 503 and closed")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--dashboard-dir", dashboard_dir,
                 "The /dashboard page's files (default: share/tandem/dashboard next to the binary's directory)");
  service::BindEnvironment(app);
  if (int rc = service::ParseOrExit(app, argc, argv); rc != 0) return rc;
  if (absl::Status s = service::InitLogging(common.log_level, common.log_format, "tandem-router"); !s.ok()) {
    std::fprintf(stderr, "tandem-router: %s\n", std::string(s.message()).c_str());
    return 2;
  }

  absl::StatusOr<security::InternalCredentials> internal_creds = security::InternalCredentials::Load(internal_auth);
  if (!internal_creds.ok()) return Fail("flags", internal_creds.status());
  if (absl::Status s = security::CheckInternalListen(internal_listen, internal_creds->authenticated(),
                                                     "--internal-listen");
      !s.ok()) {
    return Fail("flags", s);
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> public_creds =
      security::PublicServerCredentials(public_security);
  if (!public_creds.ok()) return Fail("flags", public_creds.status());
  std::unique_ptr<security::ApiKeyAuthenticator> api_keys;
  if (!public_security.api_keys_file.empty()) {
    absl::StatusOr<std::vector<security::ApiKey>> keys = security::LoadApiKeysFile(public_security.api_keys_file);
    if (!keys.ok()) return Fail("flags", keys.status());
    api_keys = std::make_unique<security::ApiKeyAuthenticator>(std::move(*keys));
  }

  // The router tokenizes and checks requests itself, and admits only replicas whose KV
  // layout (model with its weights, build) matches: it needs the model's config and
  // tokenizer, and the weight files or --layout-fingerprint (kv_layout.h).
  absl::StatusOr<std::string> model_dir = ResolveModelDir(common.model);
  if (!model_dir.ok()) return Fail("model", model_dir.status());
  absl::StatusOr<ModelInfo> config = LoadModelInfo(*model_dir);
  if (!config.ok()) return Fail("model config", config.status());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromDir(*model_dir);
  if (!tokenizer.ok()) return Fail("tokenizer", tokenizer.status());
  absl::StatusOr<std::unique_ptr<ModelChatTemplates>> chat_templates = LoadChatTemplates(*model_dir);
  if (!chat_templates.ok()) return Fail("chat template", chat_templates.status());
  if (*chat_templates == nullptr) {
    spdlog::info("the model has no chat template: chat prompts get the DeepSeek-V3 format");
  }
  absl::StatusOr<uint64_t> admitted = AdmittedLayoutFingerprint(*model_dir, layout_fingerprint, "--layout-fingerprint",
                                                                {.mtp = speculative_tokens > 0});
  if (!admitted.ok()) return Fail("KV layout", admitted.status());
  const uint64_t fingerprint = *admitted;
  spdlog::info("admitting replicas of KV layout fingerprint {}{}", FingerprintHex(fingerprint),
               layout_fingerprint.empty() && speculative_tokens > 0 ? " (with the MTP layer's KV: speculative decoding)"
                                                                    : "");

  auto metrics = std::make_shared<prometheus::Registry>();
  std::unique_ptr<RouterMetrics> router_metrics;
  if (!disable_metrics) router_metrics = std::make_unique<RouterMetrics>(*metrics, common.model);
  ReplicaRegistry registry({.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms),
                            .missed_heartbeats_to_drop = missed_heartbeats,
                            .layout_fingerprint = fingerprint,
                            .model = common.model,
                            .channel_factory = internal_creds->ChannelFactory()});
  admission_limits.retry_after = std::chrono::milliseconds(retry_after_ms);
  Admission admission(admission_limits);
  RouterContext rc{.registry = &registry, .tokenizer = tokenizer->get(), .chat_templates = chat_templates->get(),
                   .config = &*config,
                   .model_name = common.model, .layout_fingerprint = fingerprint,
                   .max_queue_wait = std::chrono::milliseconds(max_queue_wait_ms),
                   .prefill_policy = *ParseRoutingPolicy(prefill_policy),
                   .decode_policy = *ParseRoutingPolicy(decode_policy),
                   .weights = {.cache_aware_load_weight = cache_aware_load_weight},
                   .metrics = router_metrics.get(),
                   .admission = &admission,
                   .max_prompt_bytes = max_prompt_bytes};
  RouterGenerationService generation(rc, api_keys.get());
  ClusterServiceImpl cluster(&registry);

  // Two gRPC servers: the public one serves Generation only (Cluster there answers
  // UNIMPLEMENTED), the internal one the membership service, with the cluster's
  // credentials.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  service::AcceptClientKeepalive(builder);
  int port = 0;
  builder.AddListeningPort(common.listen, *public_creds, &port);
  // Room for a request carrying a prompt of --max-prompt-bytes (gRPC's default is 4 MiB).
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::max<int64_t>(4 << 20, max_prompt_bytes + (1 << 20))));
  builder.RegisterService(&generation);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) return Fail("gRPC", absl::UnavailableError("cannot listen on " + common.listen));
  grpc::ServerBuilder internal_builder;
  service::AcceptClientKeepalive(internal_builder);
  int internal_port = 0;
  internal_builder.AddListeningPort(internal_listen, internal_creds->ServerCredentials(), &internal_port);
  internal_builder.RegisterService(&cluster);
  std::unique_ptr<grpc::Server> internal_server = internal_builder.BuildAndStart();
  if (!internal_server || internal_port == 0) {
    return Fail("gRPC", absl::UnavailableError("cannot listen on " + internal_listen + " (--internal-listen)"));
  }
  auto advertised = [](const std::string& listen_address, int bound_port) {
    absl::StatusOr<service::HostPort> listen = service::ParseHostPort(listen_address);
    std::string host = listen.ok() ? listen->host : "127.0.0.1";
    if (host == "0.0.0.0" || host == "::") host = "127.0.0.1";
    return service::FormatHostPort(host, static_cast<uint16_t>(bound_port));
  };
  const std::string grpc_address = advertised(common.listen, port);
  const std::string internal_address = advertised(internal_listen, internal_port);

  // The router's recent metrics for the dashboard (declared before the admin server whose
  // handler reads it, so that it outlives it).
  std::unique_ptr<MetricsHistory> history;
  if (!disable_metrics) {
    history = std::make_unique<MetricsHistory>(metrics, RegistryLoads(&registry), MetricsHistory::Options{});
    history->Start();
  }
  service::AdminServer admin(CombineCollectables(
      {metrics, ReplicaGaugeCollector(&registry, common.model), AdmissionGaugeCollector(&admission, common.model)}));
  if (absl::Status s = admin.Start(common.admin_listen); !s.ok()) return Fail("admin server", s);
  // Pages that show replicas need the API key when keys are configured.
  admin.AddHandler("/replicas", security::RequireApiKey(api_keys.get(), [&registry](const service::HttpRequest&) {
    v1::ListReplicasResponse list;
    registry.List(&list);
    nlohmann::json j = nlohmann::json::array();
    for (const v1::ReplicaInfo& r : list.replicas()) {
      j.push_back({{"id", r.replica_id()}, {"role", v1::Role_Name(r.role())}, {"grpc", r.grpc_address()},
                   {"admin", r.admin_address()}, {"state", r.state()}, {"outstanding", r.outstanding()},
                   {"running", r.load().running()}, {"waiting", r.load().waiting()}, {"kv_usage", r.load().kv_usage()}});
      // What DP-aware routing looks at (docs/parallel.md): each data-parallel rank's room.
      if (r.load().rank_kv_blocks_free_size() > 0) {
        j.back()["rank_kv_blocks_free"] =
            std::vector<int64_t>(r.load().rank_kv_blocks_free().begin(), r.load().rank_kv_blocks_free().end());
      }
    }
    return service::HttpResponse::Json(j.dump());
  }));
  // The built-in dashboard: /dashboard/ and the history it charts (/api/summary).
  if (dashboard_dir.empty()) dashboard_dir = DefaultDashboardDir();
  if (absl::Status s = InstallDashboard(admin, history.get(), dashboard_dir,
                                      [keys = api_keys.get()](service::AdminServer::Handler h) {
                                        return security::RequireApiKey(keys, std::move(h));
                                      });
      !s.ok()) {
    spdlog::warn("dashboard: {}", std::string(s.message()));
  }

  // Drop replicas that stopped heartbeating.
  std::atomic<bool> stop{false};
  std::thread reaper([&] {
    while (!service::WaitForShutdownSignalFor(std::chrono::milliseconds(heartbeat_ms)).has_value() && !stop) {
      for (const std::string& id : registry.DropSilent()) spdlog::warn("replica {} missed its heartbeats: dropped", id);
    }
  });

  // The OpenAI-compatible HTTP API, over the same request core as gRPC's Generate.
  static const output_parsing::OutputParserRegistry parsers = output_parsing::OutputParserRegistry::WithBuiltins();
  if (!reasoning_parser.empty()) {
    if (absl::Status s = parsers.CheckReasoningParser(reasoning_parser); !s.ok()) return Fail("--reasoning-parser", s);
  }
  if (!tool_call_parser.empty()) {
    if (absl::Status s = parsers.CheckToolCallParser(tool_call_parser); !s.ok()) return Fail("--tool-call-parser", s);
  }
  std::unique_ptr<openai::OpenAiServer> http_api;
  if (!http_listen.empty()) {
    // One descriptor per client connection: take the hard limit, so that a default soft
    // limit of 1024 does not cap --http-max-connections.
    rlimit files{};
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
      files.rlim_cur = files.rlim_max;
      setrlimit(RLIMIT_NOFILE, &files);
    }
    openai::OpenAiServerOptions http_options;
    http_options.http.max_connections = http_max_connections;
    http_options.http.max_body_bytes = static_cast<size_t>(std::max<int64_t>(max_prompt_bytes, 1 << 20)) * 2 + (64 << 10);
    http_options.limits.max_n = max_n;
    // The public certificate serves both public ports: HTTPS here, TLS on --listen.
    http_options.http.tls_cert_file = public_security.tls_cert;
    http_options.http.tls_key_file = public_security.tls_key;
    openai::CompletionContext completion{
        .core = &generation.core().context(),
        .on_core_started =
            [metrics = generation.core().metrics()] {
              if (metrics != nullptr) metrics->RequestStarted();
            },
        .tokenizer = tokenizer->get(),
        .served_model = common.model,
        .context_tokens = config->max_position_embeddings,
        .vocab_size = config->vocab_size,
        .max_prompt_bytes = max_prompt_bytes,
        .unix_seconds = [] {
          return static_cast<int64_t>(
              std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                  .count());
        },
        .parsers = &parsers,
        .reasoning_parser = reasoning_parser,
        .tool_call_parser = tool_call_parser};
    absl::StatusOr<std::unique_ptr<openai::OpenAiServer>> started =
        openai::OpenAiServer::Start(http_listen, http_options, std::move(completion), &*config, api_keys.get());
    if (!started.ok()) return Fail("HTTP API (--http-listen)", started.status());
    http_api = std::move(*started);
  }

  admin.SetReady(true);
  nlohmann::json ready = {{"role", "router"},
                          {"pid", getpid()},
                          {"grpc", grpc_address},
                          {"internal", internal_address},
                          {"internal_auth", internal_creds->Describe()},
                          {"public_tls", !public_security.tls_cert.empty()},
                          {"api_keys", api_keys != nullptr},
                          {"admin", admin.bound_address()},
                          {"model", *model_dir}};
  const char* http_scheme = public_security.tls_cert.empty() ? "http" : "https";
  if (http_api) {
    ready["http"] = http_api->bound_address();
    ready["http_url"] = absl::StrCat(http_scheme, "://", http_api->bound_address(), "/v1");
  }
  if (!common.ready_file.empty()) {
    if (absl::Status s = service::WriteReadyFile(common.ready_file, ready); !s.ok()) return Fail("ready file", s);
  }
  spdlog::info("ready: gRPC {} ({}{}) internal {} ({}) admin {} model {} ({}); prefill policy {}, decode policy {}",
               grpc_address, public_security.tls_cert.empty() ? "plaintext" : "TLS",
               api_keys ? ", API keys" : ", no API keys", internal_address, internal_creds->Describe(),
               admin.bound_address(), *model_dir, config->summary, prefill_policy, decode_policy);
  if (http_api) spdlog::info("OpenAI-compatible HTTP API on {}://{}/v1", http_scheme, http_api->bound_address());
  const int sig = service::WaitForShutdownSignal();
  spdlog::info("shutting down ({})", sig == 0 ? "requested" : strsignal(sig));
  stop = true;
  admin.SetReady(false);
  // New calls are refused from now; in-flight streams finish (bounded).
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(drain_timeout_ms));
  internal_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (http_api) http_api->Stop();
  reaper.join();
  admin.Stop();
  return 0;
}

}  // namespace tandem
