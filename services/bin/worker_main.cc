#include "services/common/grpc_keepalive.h"
#include "services/bin/worker_main.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model/model_resolver.h"
#include "engine/model/rank_group_backend.h"
#include "engine/parallel/rank_processes.h"
#include "engine/runtime/engine.h"
#include "engine/runtime/kv_layout.h"
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
#include "services/common/transfer/ucx_support.h"
#include "services/common/transfer/ucx_transfer_engine.h"
#include "services/kvstore/kvstore_client.h"
#include "services/kvstore/kvstore_metrics.h"
#include "services/decode/decode_service.h"
#include "services/prefill/prefill_service.h"
#include "services/worker/local_generation_service.h"
#include "services/cluster/router_registration.h"
#include "services/worker/transfer_kv_transport.h"
#include "services/bin/worker_metrics.h"
#include "services/security/internal_credentials.h"
#include "services/security/listen_policy.h"
#include "spdlog/spdlog.h"

namespace tandem {
namespace {

struct WorkerFlags {
  service::CommonFlags common;
  std::string role;
  std::string advertise;
  int threads = 0;
  std::string device = "cpu";
  double gpu_memory_utilization = 0.9;
  int64_t kv_cache_mb = 512;
  int32_t max_batch_tokens = 0;  // 0: the engine's DefaultMaxBatchTokens(device)
  int32_t max_running = 64;
  int32_t max_waiting = 1024;
  int64_t kv_lease_ms = 30000;
  int64_t kv_quarantine_warn_ms = 0;
  int64_t grammar_compile_timeout_ms = 5000;
  int grammar_mask_threads = 0;
  std::string kv_transfer = "auto";
  bool no_prefix_cache = false;
  int32_t prefix_state_snapshots = -1;  // -1: max_running
  bool no_device_sampling = false;
  bool no_pipeline_steps = false;
  bool batch_invariant = false;
  bool fp8_decode = false;
  bool fp8_prefill = false;
  int32_t speculative_tokens = 0;
  float speculative_min_confidence = 0.0f;
  bool no_speculative_adaptive = false;
  std::vector<std::string> kvstores;  // static kvstore instances (else: the router's list)
  bool no_kvstore = false;
  int64_t kvstore_timeout_ms = 1000;
  int64_t kvstore_staging_mb = 256;
  int64_t drain_timeout_ms = 30000;
  int64_t max_prompt_bytes = kDefaultMaxPromptBytes;
  int data_parallel = 1, expert_parallel = 1, tensor_parallel = 1;  // the replica's ranks
  security::InternalAuthFlags internal_auth;
};

const char* RoleName(v1::Role r) {
  switch (r) {
    case v1::ROLE_PREFILL: return "prefill";
    case v1::ROLE_DECODE: return "decode";
    case v1::ROLE_BOTH: return "both";
    default: return "?";
  }
}

int Fail(const std::string& what, const absl::Status& s) {
  spdlog::error("{}: {}", what, std::string(s.message()));
  return 1;
}

}  // namespace

int RunWorker(int argc, char** argv, v1::Role default_role, const char* binary_name) {
  // (Signal handling starts a thread: it comes after the ranks are forked, below.)
  WorkerFlags f;
  f.role = RoleName(default_role);
  CLI::App app{std::string(binary_name) +
               ": a Tandem worker. It runs the engine in prefill mode (computes prompts' KV and writes it into "
               "decode replicas over UCX), decode mode (continuous batching over imported KV), or both "
               "(aggregated: serves tandem.v1.Generation itself). Its --listen port serves internal services only "
               "(Prefill, Decode, or the aggregated Generation the router calls), with the cluster's credentials "
               "(--tls-* or --cluster-token-file; without them loopback only); --router is the router's "
               "--internal-listen address."};
  service::AddCommonFlags(app, &f.common, {.listen = "127.0.0.1:0"});
  security::AddInternalAuthFlags(app, &f.internal_auth);
  app.add_option("--role", f.role, "prefill, decode or both")
      ->check(CLI::IsMember({"prefill", "decode", "both"}))
      ->capture_default_str();
  app.add_option("--advertise", f.advertise,
                 "HOST the router should use to reach this worker (default: the --listen host, or 127.0.0.1 "
                 "when it listens on all interfaces)");
  app.add_option("--threads", f.threads, "CPU threads for the model (0 = all)")->capture_default_str();
  app.add_option("--device", f.device,
                 "Where the model runs: cpu, cuda or cuda:N (with cuda the GPU's KV pool is sized by "
                 "--gpu-memory-utilization; --role decode receives KV into a host pool of --kv-cache-mb, which "
                 "also caps the GPU pool's blocks)")
      ->capture_default_str();
  app.add_option("--gpu-memory-utilization", f.gpu_memory_utilization,
                 "cuda: fraction of the GPU's total memory this worker may use for its weights, activations and KV "
                 "cache (replicas sharing a GPU each take their own fraction)")
      ->check(CLI::Range(0.05, 0.99))
      ->capture_default_str();
  app.add_option("--kv-cache-mb", f.kv_cache_mb, "KV cache size in MiB")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  app.add_option("--max-batch-tokens", f.max_batch_tokens,
                 "Tokens per engine step (decodes + prefill chunks); 0: 8192 on a GPU (--device cuda), 2048 on the "
                 "CPU. Larger steps cut a long prompt's time to first token, smaller ones the inter-token latency "
                 "of the decodes that share a step with a prefill chunk")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--max-running", f.max_running, "Sequences decoding together")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--max-waiting", f.max_waiting, "Requests waiting for a slot before RESOURCE_EXHAUSTED")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--kv-lease-ms", f.kv_lease_ms, "How long a decode reservation waits for its KV")
      ->check(CLI::Range(int64_t{100}, int64_t{3600000}))
      ->capture_default_str();
  app.add_option("--kv-quarantine-warn-ms", f.kv_quarantine_warn_ms,
                 "Decode: a reservation whose prefill replica may still be writing into it stays out of use until "
                 "that replica is known to have stopped, however long it takes; past this age it is logged and "
                 "counted in tandem_kv_quarantine_stuck (0: twice --kv-lease-ms)")
      ->check(CLI::Range(int64_t{0}, int64_t{86400000}))
      ->capture_default_str();
  app.add_option("--grammar-compile-timeout-ms", f.grammar_compile_timeout_ms,
                 "Structured output: a request's constraint (JSON schema, regex, grammar) that takes longer to "
                 "compile is refused with INVALID_ARGUMENT; compiles run on their own thread, never the engine's")
      ->check(CLI::Range(int64_t{1}, int64_t{600000}))
      ->capture_default_str();
  app.add_option("--grammar-mask-threads", f.grammar_mask_threads,
                 "Structured output on the GPU: threads that fill the constrained requests' token masks while the "
                 "GPU runs the step (0: a quarter of the hardware threads, 1 to 8)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  app.add_option("--kv-transfer", f.kv_transfer,
                 "How KV goes from prefill to decode replicas: auto (GPU to GPU over CUDA IPC when both models are "
                 "on GPUs of this machine that can reach each other, else UCX through the host pools), transfer "
                 "(always UCX), cuda-ipc (always GPU to GPU; requests that cannot go that way fail). Decode "
                 "replicas offer their GPU pool unless it is transfer")
      ->check(CLI::IsMember({"auto", "transfer", "ucx", "cuda-ipc"}))
      ->capture_default_str();
  app.add_flag("--no-prefix-cache", f.no_prefix_cache, "Disable reuse of cached prompt prefixes");
  app.add_option("--prefix-state-snapshots", f.prefix_state_snapshots,
                 "Models with per-sequence KV state (DeepSeek-V4: the sliding window and compressor states): "
                 "snapshots of it kept where cached prompt prefixes end, without which such a prefix cannot be "
                 "reused; each takes the model's per-sequence state bytes out of --kv-cache-mb. -1: --max-running; "
                 "0: no prefix cache for such models")
      ->check(CLI::Range(-1, 1 << 20))
      ->capture_default_str();
  app.add_flag("--no-device-sampling", f.no_device_sampling,
               "cuda: copy every step's logits to the host and sample on the CPU (default: tokens are chosen on "
               "the GPU, identically, unless a request asks for logprobs or min_tokens)");
  app.add_flag("--no-pipeline-steps", f.no_pipeline_steps,
               "cuda: run every step to completion before scheduling the next (default: while a step whose tokens "
               "are chosen on the GPU computes, the next one is scheduled, and launched before this one's outputs "
               "are emitted)");
  app.add_flag("--batch-invariant", f.batch_invariant,
               "Compute each request's logits bitwise independently of what it is batched with and of how its "
               "prompt is chunked, so a seeded request gives the same tokens under any load, across prefill/decode "
               "replicas, migration and the kvstore (every worker of a cluster needs it). The CPU backend always "
               "computes this way at no cost; on the GPU it takes one slower kernel path for every step "
               "(docs/batch-invariance.md)");
  app.add_flag("--fp8-decode", f.fp8_decode,
               "cuda, DeepSeek-V2/V3 checkpoints stored in FP8 (block-scaled E4M3, DeepSeek-V3's layout): decode "
               "steps of up to 4 sequences multiply the stored FP8 weights, a byte a weight read instead of the bf16 "
               "copy's two (docs/performance.md); the bf16 copies stay for prefill, so the weights take 1.5x the "
               "bf16 memory. Not with --batch-invariant (ignored there). No effect on other checkpoints or the CPU "
               "(which always multiplies FP8 weights widened exactly)");
  app.add_flag("--fp8-prefill", f.fp8_prefill,
               "cuda (Hopper), DeepSeek checkpoints stored in FP8: passes of at least 128 tokens multiply the FP8 "
               "matrices on the FP8 tensor cores, each product's activations quantized per token and 128 columns "
               "as DeepSeek's inference code does (logits then differ from the bf16/float32 path by that rounding; "
               "docs/performance.md). V2/V3 keep the bf16 copies as --fp8-decode does. Ignored with "
               "--batch-invariant, on other GPUs, other checkpoints and the CPU");
  app.add_option("--speculative-tokens", f.speculative_tokens,
                 "Speculative decoding with the checkpoint's MTP layer (docs/speculative-decoding.md): up to N draft "
                 "tokens per sequence and step, verified by the next step (greedy outputs unchanged, sampled ones "
                 "distributed as without). 0: off. The KV then holds the MTP layer's too, which changes the KV "
                 "layout fingerprint: every prefill and decode replica of a cluster, the router and the kvstores "
                 "need the same setting (0 or not). CPU backend, DeepSeek-V2/V3 checkpoints with an MTP layer")
      ->check(CLI::Range(0, static_cast<int>(kMaxSpeculativeTokens)))
      ->capture_default_str();
  app.add_option("--speculative-min-confidence", f.speculative_min_confidence,
                 "With --speculative-tokens: a sequence stops drafting at a draft the MTP layer gives a probability "
                 "below this (0: always draft N)")
      ->check(CLI::Range(0.0f, 1.0f))
      ->capture_default_str();
  app.add_flag("--no-speculative-adaptive", f.no_speculative_adaptive,
               "With --speculative-tokens: draft at every step (default: only at the batch sizes where steps with "
               "drafts measured more tokens per second than steps without, trying the other way now and then; "
               "either way a request's tokens are the same, only its draft counts differ)");
  app.add_option("--kvstore", f.kvstores,
                 "Prefill: kvstore instances to use, NAME=HOST:PORT or HOST:PORT, comma-separated (default: the "
                 "instances registered with the router)")
      ->delimiter(',');
  app.add_flag("--no-kvstore", f.no_kvstore, "Prefill: do not use the kvstore tier");
  app.add_option("--kvstore-timeout-ms", f.kvstore_timeout_ms,
                 "Prefill: how long a request may wait for the kvstore tier (lookup and fetch) before computing")
      ->check(CLI::Range(int64_t{1}, int64_t{600000}))
      ->capture_default_str();
  app.add_option("--kvstore-staging-mb", f.kvstore_staging_mb,
                 "Prefill: memory the kvstore tier writes fetched blocks into (MiB)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--max-prompt-bytes", f.max_prompt_bytes,
                 "--role both: prompts (text or chat messages) longer than this are refused before tokenization")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--drain-timeout-ms", f.drain_timeout_ms, "On SIGTERM, how long in-flight requests may finish")
      ->capture_default_str();
  app.add_option("--data-parallel", f.data_parallel,
                 "cpu: this replica runs on N ranks (processes of this machine, forked at startup; rank 0, this "
                 "process, registers and schedules), each holding the KV of its own sequences in its range of "
                 "the KV pool (--kv-cache-mb each), rank 0 placing each sequence on the least loaded. With "
                 "--expert-parallel the same N; not with --tensor-parallel. Outputs are bitwise one rank's "
                 "(docs/parallel.md)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--expert-parallel", f.expert_parallel,
                 "cpu: N ranks, each holding 1/N of every MoE layer's routed experts; tokens go to their experts' "
                 "ranks and back")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--tensor-parallel", f.tensor_parallel,
                 "cpu: N ranks, each holding 1/N of the LM head's vocabulary rows and of the dense MLPs' rows; "
                 "with --expert-parallel the same N")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  service::BindEnvironment(app);
  if (int rc = service::ParseOrExit(app, argc, argv); rc != 0) return rc;
  const v1::Role role = f.role == "prefill" ? v1::ROLE_PREFILL : f.role == "decode" ? v1::ROLE_DECODE : v1::ROLE_BOTH;
  if (absl::Status s = service::InitLogging(f.common.log_level, f.common.log_format, binary_name); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", binary_name, std::string(s.message()).c_str());
    return 2;
  }

  // The replica's ranks (docs/parallel.md) are forked before anything starts a thread;
  // rank 0's backend, this process's, goes to the engine.
  absl::StatusOr<std::string> model_dir = ResolveModelDir(f.common.model);
  if (!model_dir.ok()) return Fail("model", model_dir.status());
  const RankGroupOptions rank_options{.data_parallel = f.data_parallel,
                                      .expert_parallel = f.expert_parallel,
                                      .tensor_parallel = f.tensor_parallel,
                                      .name = absl::StrCat("worker-", getpid()),
                                      .kv_cache_bytes = f.kv_cache_mb << 20};
  const BackendOptions backend_options{.device = f.device, .num_threads = f.threads,
                                       .mtp = f.speculative_tokens > 0};
  absl::StatusOr<int> world = RankGroupWorld(rank_options, backend_options);
  if (!world.ok()) return Fail("flags", world.status());
  std::unique_ptr<ModelBackend> rank_group;
  if (*world > 1) {
    absl::StatusOr<std::unique_ptr<ModelBackend>> g = StartCpuRankGroup(*model_dir, backend_options, rank_options);
    if (!g.ok()) return Fail("ranks", g.status());
    rank_group = std::move(*g);
  }
  const std::vector<pid_t> rank_pids = rank_group ? RankGroupPids(*rank_group) : std::vector<pid_t>{};
  service::InstallShutdownSignalHandling();

  absl::StatusOr<security::InternalCredentials> creds = security::InternalCredentials::Load(f.internal_auth);
  if (!creds.ok()) return Fail("flags", creds.status());
  if (absl::Status s = security::CheckInternalListen(f.common.listen, creds->authenticated(), "--listen"); !s.ok()) {
    return Fail("flags", s);
  }
  // Chat prompts are formatted where they are tokenized: here only for --role both.
  std::unique_ptr<ModelChatTemplates> chat_templates;
  if (role == v1::ROLE_BOTH) {
    absl::StatusOr<std::unique_ptr<ModelChatTemplates>> t = LoadChatTemplates(*model_dir);
    if (!t.ok()) return Fail("chat template", t.status());
    chat_templates = std::move(*t);
    if (chat_templates == nullptr) {
      spdlog::info("the model has no chat template: chat prompts get the DeepSeek-V3 format");
    }
  }

  // KV transfer between prefill and decode replicas; an aggregated worker needs none. A
  // decode replica's KV cache lives in memory the transport allocates, so that prefill
  // replicas can write into it directly (shared memory on one host).
  std::unique_ptr<transfer::UcxTransferEngine> ucx;
  std::unique_ptr<TransferKvTransport> transport;
  KvTransport::Pool pool;
  if (role != v1::ROLE_BOTH) {
    absl::StatusOr<std::unique_ptr<transfer::UcxTransferEngine>> u = transfer::UcxTransferEngine::Create();
    if (!u.ok()) return Fail("UCX", u.status());
    ucx = std::move(*u);
    transport = std::make_unique<TransferKvTransport>(ucx.get());
    if (role == v1::ROLE_DECODE && rank_group) {
      const char* tls = std::getenv("UCX_TLS");
      if (!transfer::internal::TlsIncludesTcp(tls == nullptr ? "" : tls)) {
        return Fail("flags", absl::FailedPreconditionError(absl::StrCat(
                                 "a decode replica on ranks receives KV into the memory its ranks share, which UCX "
                                 "writes over tcp only, and UCX_TLS=", tls,
                                 " leaves tcp out: use UCX_TLS=sm,tcp (or tcp)")));
      }
    }
    if (role == v1::ROLE_DECODE) {
      // A rank group's pool is the memory its ranks share (mapped before they were forked),
      // registered as it is; else the transport allocates one (shared memory where it can).
      const std::span<std::byte> shared = rank_group ? rank_group->shared_host_pool() : std::span<std::byte>();
      absl::StatusOr<KvTransport::Pool> p = shared.empty()
                                                ? transport->AllocatePool(static_cast<size_t>(f.kv_cache_mb) << 20)
                                                : transport->RegisterPool(shared.data(), shared.size());
      if (!p.ok()) return Fail("allocating the KV pool", p.status());
      pool = *p;
    }
  }
  auto metrics_registry = std::make_shared<prometheus::Registry>();
  WorkerMetrics metrics(*metrics_registry, f.common.model, RoleName(role));
  EngineOptions eo;
  eo.on_request_finished = [&metrics](const RequestMetrics& m, const absl::Status& s) { metrics.RequestFinished(m, s); };
  eo.device = f.device;
  eo.gpu_memory_utilization = f.gpu_memory_utilization;
  eo.num_threads = f.threads;
  eo.kv_cache_bytes = f.kv_cache_mb << 20;
  eo.max_batch_tokens = f.max_batch_tokens;  // 0: the engine's DefaultMaxBatchTokens(device)
  eo.max_running = f.max_running;
  eo.max_waiting = f.max_waiting;
  eo.enable_prefix_cache = !f.no_prefix_cache;
  eo.prefix_state_snapshots = f.prefix_state_snapshots;
  // A decode replica's prompts arrive computed: no later prompt looks its answers up.
  eo.decode_state_snapshots = role != v1::ROLE_DECODE;
  eo.sample_on_device = !f.no_device_sampling;
  eo.pipeline_steps = !f.no_pipeline_steps;
  eo.batch_invariant = f.batch_invariant;
  eo.fp8_decode = f.fp8_decode;
  eo.fp8_prefill = f.fp8_prefill;
  eo.speculative_tokens = f.speculative_tokens;
  eo.speculative_min_confidence = f.speculative_min_confidence;
  eo.speculative_adaptive = !f.no_speculative_adaptive;
  eo.kv_lease_seconds = f.kv_lease_ms / 1000.0;
  const int64_t quarantine_warn_ms = f.kv_quarantine_warn_ms > 0 ? f.kv_quarantine_warn_ms : 2 * f.kv_lease_ms;
  eo.kv_quarantine_stuck_seconds = quarantine_warn_ms / 1000.0;
  eo.grammar_compile_timeout_s = f.grammar_compile_timeout_ms / 1000.0;
  eo.grammar_mask_threads = f.grammar_mask_threads;
  eo.kv_memory = static_cast<float*>(pool.base);
  eo.kv_memory_bytes = pool.bytes;
  if (rank_group) {
    eo.backend_factory = [&rank_group](const std::string&) -> absl::StatusOr<std::unique_ptr<ModelBackend>> {
      if (rank_group == nullptr) return absl::FailedPreconditionError("the rank group's backend was taken already");
      return std::move(rank_group);
    };
  }
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*model_dir, eo);
  if (!engine.ok()) return Fail("engine", engine.status());
  // A layout other than one latent stream (DeepSeek-V4) moves whole sequences over the
  // transfer layer; no CUDA IPC for it yet.
  const bool stream_layout = (*engine)->kv_entry_dim() == 0;
  spdlog::info("{} worker{}: model {} ({}), KV layout fingerprint {} ({}){}{}", RoleName(role),
               *world > 1 ? absl::StrCat(" on ", *world, " ranks (", (*engine)->backend().device_name(), ", pids ",
                                         absl::StrJoin(rank_pids, " "), ")")
                          : "",
               *model_dir, (*engine)->config().summary, FingerprintHex((*engine)->layout_fingerprint()),
               DescribeKvStreams((*engine)->kv_layout().streams), f.batch_invariant ? ", batch-invariant" : "",
               f.speculative_tokens > 0
                   ? absl::StrCat(", speculative decoding: up to ", f.speculative_tokens, " MTP drafts, min confidence ",
                                  f.speculative_min_confidence, f.no_speculative_adaptive ? ", every step" : ", adaptive")
                   : "");
  // Prefill replicas use the kvstore tier (services/kvstore): cached prefixes are fetched,
  // new blocks offloaded. Instances come from --kvstore or from the router.
  std::unique_ptr<kvstore::KvStoreClient> kvstore_client;
  // A layout with per-sequence state (DeepSeek-V4) stores, beside its blocks, the state
  // where a prompt's blocks end (in block-sized chunks): without prefix-state snapshots
  // the engine has none to offload or to take.
  const bool no_snapshots = stream_layout && f.prefix_state_snapshots == 0;
  if (role == v1::ROLE_PREFILL && !f.no_kvstore && no_snapshots) {
    spdlog::warn("--prefix-state-snapshots 0: this {} prefill replica neither stores prefixes in the kvstore tier "
                 "nor takes them from it",
                 (*engine)->config().model_type);
  }
  if (role == v1::ROLE_PREFILL && !f.no_kvstore && !no_snapshots) {
    const Engine::KvMemory m = (*engine)->kv_memory();
    const std::vector<KvStream>& streams = (*engine)->kv_layout().streams;
    kvstore::KvStoreClientOptions ko{
        .layout_fingerprint = (*engine)->layout_fingerprint(),
        .block_bytes = PagedBytesPerBlock(streams, static_cast<int32_t>(m.block_size)),
        .block_tokens = static_cast<int32_t>(m.block_size),
        .state_bytes = SequenceStateBytes(streams),
        .staging_bytes = static_cast<size_t>(f.kvstore_staging_mb) << 20,
        .fetch_timeout = absl::Milliseconds(f.kvstore_timeout_ms),
        .channel_factory = creds->ChannelFactory()};
    absl::StatusOr<std::unique_ptr<kvstore::KvStoreClient>> c = kvstore::KvStoreClient::Create(ucx.get(), ko);
    if (!c.ok()) return Fail("kvstore client", c.status());
    kvstore_client = std::move(*c);
    if (!f.kvstores.empty()) {
      std::vector<kvstore::KvStoreClient::Instance> list;
      for (const std::string& k : f.kvstores) {
        const size_t eq = k.find('=');
        list.push_back(eq == std::string::npos ? kvstore::KvStoreClient::Instance{k, k}
                                               : kvstore::KvStoreClient::Instance{k.substr(0, eq), k.substr(eq + 1)});
      }
      kvstore_client->SetInstances(std::move(list));
    }
  }
  std::unique_ptr<grpc::Service> service;
  std::unique_ptr<LocalGenerationService> generation;
  std::unique_ptr<PrefillServiceImpl> prefill;
  std::unique_ptr<DecodeServiceImpl> decode;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  service::AcceptClientKeepalive(builder);
  // No SO_REUSEPORT: while this process lives no other can listen on its port, which is
  // what lets a decode replica read "another process answers here" or "nothing listens
  // here" as this prefill replica's writers being gone (docs/architecture.md, "KV leases").
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(f.common.listen, creds->ServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(64 << 20);
  const std::string model_name = f.common.model;
  const KvTransferMode kv_mode = *ParseKvTransferMode(f.kv_transfer);
  std::optional<v1::DeviceKvPool> device_pool;
  if (role == v1::ROLE_DECODE && kv_mode != KvTransferMode::kTransfer) {
    absl::StatusOr<DeviceKvPool> p = (*engine)->backend().ShareKvPool();
    if (p.ok()) {
      device_pool.emplace();
      device_pool->set_host_id(p->host_id);
      device_pool->set_device_uuid(p->device_uuid);
      device_pool->set_ipc_handle(p->ipc_handle);
      device_pool->set_bytes(p->bytes);
      device_pool->set_num_blocks(p->num_blocks);
      device_pool->set_bytes_per_value(p->bytes_per_value);
      device_pool->set_pid(p->pid);
      spdlog::info("offering the GPU KV pool ({} blocks) to prefill replicas of this machine (CUDA IPC)",
                   p->num_blocks);
    } else if (kv_mode == KvTransferMode::kCudaIpc) {
      return Fail("--kv-transfer cuda-ipc", p.status());
    } else if (p.status().code() != absl::StatusCode::kUnimplemented) {
      spdlog::warn("cannot offer the GPU KV pool ({}): KV arrives over UCX", std::string(p.status().message()));
    }
  }
  switch (role) {
    case v1::ROLE_PREFILL:
      prefill = std::make_unique<PrefillServiceImpl>(
          engine->get(), transport.get(), std::make_shared<GrpcKvWriteNotices>(creds->ChannelFactory(), 256),
          [&metrics](double seconds, int64_t bytes, bool ok, const std::string& path) {
            metrics.KvTransfer(seconds, bytes, ok, path);
          },
          kv_mode);
      prefill->SetPrefixStore(kvstore_client.get());
      builder.RegisterService(prefill.get());
      break;
    case v1::ROLE_DECODE:
      decode = std::make_unique<DecodeServiceImpl>(
          engine->get(), pool.descriptor,
          DecodeServiceImpl::Options{.lease_ms = f.kv_lease_ms,
                                     .device_pool = device_pool,
                                     .channel_factory = creds->ChannelFactory(),
                                     .prober = {.stuck_after = std::chrono::milliseconds(quarantine_warn_ms)},
                                     .needs_mtp_hidden = f.speculative_tokens > 0});
      builder.RegisterService(decode.get());
      break;
    default:
      generation = std::make_unique<LocalGenerationService>(engine->get(), chat_templates.get(), model_name,
                                                            f.max_prompt_bytes);
      builder.RegisterService(generation.get());
      break;
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return Fail("gRPC", absl::UnavailableError("cannot listen on " + f.common.listen));
  }
  absl::StatusOr<service::HostPort> listen = service::ParseHostPort(f.common.listen);
  std::string host = f.advertise.empty() ? (listen.ok() ? listen->host : "127.0.0.1") : f.advertise;
  if (host == "0.0.0.0" || host == "::" || host.empty()) host = "127.0.0.1";
  const std::string grpc_address = service::FormatHostPort(host, static_cast<uint16_t>(port));
  if (prefill) prefill->SetAddress(grpc_address);
  if (decode) decode->SetAddress(grpc_address);

  std::vector<std::shared_ptr<prometheus::Collectable>> collectables = {
      metrics_registry, EngineCollector(engine->get(), ucx.get(), f.common.model, RoleName(role))};
  if (kvstore_client) {
    collectables.push_back(kvstore::KvStoreClientCollector(kvstore_client.get(), f.common.model, RoleName(role),
                                                           static_cast<int32_t>((*engine)->kv_memory().block_size)));
  }
  service::AdminServer admin(CombineCollectables(std::move(collectables)));
  if (absl::Status s = admin.Start(f.common.admin_listen); !s.ok()) return Fail("admin server", s);
  Engine* e = engine->get();
  // The replica's ranks (docs/parallel.md). Not in the layout fingerprint: no layout that
  // exists changes a KV entry (each rank's blocks hold whole entries, bitwise one rank's),
  // so replicas of different layouts exchange KV.
  const nlohmann::json parallel = {{"ranks", *world},
                                   {"data_parallel", f.data_parallel},
                                   {"expert_parallel", f.expert_parallel},
                                   {"tensor_parallel", f.tensor_parallel}};
  admin.AddHandler("/stats", [e, kv = kvstore_client.get(), dec = decode.get(),
                              parallel](const service::HttpRequest&) {
    const EngineStats s = e->Stats();
    nlohmann::json j = {{"waiting", s.num_waiting},         {"running", s.num_running},
                        {"kv_blocks_total", s.kv_blocks_total}, {"kv_blocks_in_use", s.kv_blocks_in_use},
                        {"kv_usage", s.kv_usage},             {"generated_tokens", s.generated_tokens},
                        {"prompt_tokens_computed", s.prompt_tokens_computed},
                        {"prompt_tokens_cached", s.prompt_tokens_cached}, {"preemptions", s.preemptions},
                        {"requests_finished", s.requests_finished}, {"kv_leases_expired", s.kv_leases_expired},
                        {"kv_blocks_quarantined", s.kv_blocks_quarantined},
                        {"kv_leases_quarantined", s.kv_leases_quarantined},
                        {"kv_quarantine_stuck", s.kv_quarantine_stuck},
                        {"kv_quarantine_ends",
                         {{"writer_ended", s.kv_quarantine_ends_writer_ended},
                          {"writer_gone", s.kv_quarantine_ends_writer_gone},
                          {"decoded", s.kv_quarantine_ends_decoded},
                          {"no_writer", s.kv_quarantine_ends_no_writer}}},
                        {"prompt_tokens_imported", s.prompt_tokens_imported},
                        {"kv_host_staged_bytes", s.kv_host_staged_bytes},
                        {"device_sampled_tokens", s.device_sampled_tokens},
                        {"spec_draft_tokens", s.spec_draft_tokens},
                        {"spec_accepted_tokens", std::accumulate(s.spec_accepted_by_position.begin(),
                                                                 s.spec_accepted_by_position.end(), int64_t{0})},
                        {"layout_fingerprint", FingerprintHex(e->layout_fingerprint())}};
    j["parallel"] = parallel;
    if (!s.dp_ranks.empty()) {
      // Each data-parallel rank's share (a request's KV must fit one rank's free blocks).
      nlohmann::json ranks = nlohmann::json::array();
      for (const EngineStats::RankLoad& r : s.dp_ranks) {
        ranks.push_back({{"kv_blocks_total", r.kv_blocks_total}, {"kv_blocks_in_use", r.kv_blocks_in_use},
                         {"running", r.running}, {"placed", r.placed}});
      }
      j["dp_ranks"] = ranks;
    }
    if (dec != nullptr) {
      nlohmann::json writers = nlohmann::json::object();
      for (const auto& [address, n] : dec->QuarantineWriters()) writers[address] = n;
      j["kv_quarantine_writers"] = writers;
    }
    if (kv != nullptr) {
      const kvstore::KvStoreClientStats k = kv->stats();
      j["kvstore"] = {{"instances", kv->instances().size()},     {"fetches", k.fetches},
                      {"fetch_errors", k.fetch_errors},         {"lookup_blocks", k.lookup_blocks},
                      {"lookup_hit_blocks", k.lookup_hit_blocks}, {"fetched_blocks", k.fetched_blocks},
                      {"fetched_bytes", k.fetched_bytes},       {"checksum_mismatches", k.checksum_mismatches},
                      {"staging_exhausted", k.staging_exhausted}, {"offloads", k.offloads},
                      {"offload_dropped", k.offload_dropped},   {"offload_blocks", k.offload_blocks},
                      {"offload_bytes", k.offload_bytes},       {"offload_dedup_blocks", k.offload_dedup_blocks},
                      {"offload_errors", k.offload_errors}};
    }
    return service::HttpResponse::Json(j.dump());
  });

  auto load = [e]() {
    const EngineStats s = e->Stats();
    v1::LoadReport r;
    r.set_waiting(static_cast<int32_t>(s.num_waiting));
    r.set_running(static_cast<int32_t>(s.num_running));
    r.set_kv_blocks_total(s.kv_blocks_total);
    r.set_kv_blocks_free(s.kv_blocks_total - s.kv_blocks_in_use);
    r.set_kv_usage(s.kv_usage);
    r.set_requests_finished(s.requests_finished);
    // Under DP a request must fit one rank's pool: the router needs each rank's room.
    for (const EngineStats::RankLoad& rank : s.dp_ranks) {
      r.add_rank_kv_blocks_free(rank.kv_blocks_total - rank.kv_blocks_in_use);
    }
    return r;
  };
  std::unique_ptr<RouterRegistration> registration;
  if (!f.common.router.empty()) {
    v1::RegisterRequest self;
    self.set_role(role);
    self.set_grpc_address(grpc_address);
    self.set_admin_address(admin.bound_address());
    self.set_model(model_name);
    self.set_layout_fingerprint(e->layout_fingerprint());
    self.set_pid(getpid());
    // Prefill replicas report their prefix cache for cache-aware routing.
    std::function<v1::KvCacheEvents(bool)> events;
    if (role != v1::ROLE_DECODE) {
      events = [e](bool full) {
        Engine::KvEvents ev = e->TakeKvEvents(/*want_full=*/full);
        v1::KvCacheEvents out;
        out.set_full(ev.full);
        for (uint64_t h : ev.stored) out.add_stored(h);
        for (uint64_t h : ev.removed) out.add_removed(h);
        return out;
      };
    }
    registration = std::make_unique<RouterRegistration>(f.common.router, self, load, events, creds->ChannelFactory());
    if (kvstore_client && f.kvstores.empty()) {
      registration->SetKvStoreListener([kv = kvstore_client.get()](const std::vector<v1::KvStoreEndpoint>& list) {
        std::vector<kvstore::KvStoreClient::Instance> instances;
        for (const v1::KvStoreEndpoint& k : list) instances.push_back({k.instance_name(), k.grpc_address()});
        kv->SetInstances(std::move(instances));
      });
    }
    if (absl::Status s = registration->Start(std::chrono::seconds(30)); !s.ok()) return Fail("registration", s);
  }
  admin.SetReady(true);
  nlohmann::json ready = {{"role", RoleName(role)}, {"pid", getpid()},       {"grpc", grpc_address},
                          {"admin", admin.bound_address()}, {"model", *model_dir},
                          {"transport", transport ? transport->name() : "none"}};
  if (!rank_pids.empty()) ready["rank_pids"] = rank_pids;  // ranks 1..W-1
  if (registration) ready["replica_id"] = registration->replica_id();
  if (!f.common.ready_file.empty()) {
    if (absl::Status s = service::WriteReadyFile(f.common.ready_file, ready); !s.ok()) return Fail("ready file", s);
  }
  spdlog::info("ready: gRPC {} ({}) admin {}{}", grpc_address, creds->Describe(), admin.bound_address(),
               registration ? " registered as " + registration->replica_id() : "");

  // A rank that dies leaves the replica unable to run a step: every request from then on
  // fails (the step's collectives report it), so the replica stops instead of staying
  // registered.
  std::atomic<bool> rank_died = false;
  std::unique_ptr<parallel::RankWatch> rank_watch;
  if (!rank_pids.empty()) {
    rank_watch = std::make_unique<parallel::RankWatch>(rank_pids, /*first_rank=*/1, [&rank_died](const std::string& what) {
      spdlog::error("{}: this replica cannot run steps any more; shutting down", what);
      rank_died = true;
      service::RequestShutdown();
    });
  }
  const int sig = service::WaitForShutdownSignal();
  spdlog::info("shutting down ({})", sig == 0 ? "requested" : strsignal(sig));
  admin.SetReady(false);
  const auto drain_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(f.drain_timeout_ms);
  if (registration) {
    // Heartbeats now say "draining"; until the router has heard one it may still send
    // work, which is served like the rest.
    registration->SetDraining();
    std::this_thread::sleep_for(std::min(2 * registration->heartbeat_interval() + std::chrono::milliseconds(100),
                                         std::chrono::milliseconds(f.drain_timeout_ms)));
  }
  // Let in-flight requests finish (bounded), then stop.
  while (std::chrono::steady_clock::now() < drain_until) {
    const EngineStats s = e->Stats();
    if (s.num_running + s.num_waiting == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  registration.reset();  // deregisters
  if (prefill) {
    // The listening port closes only once no call here may still write into a decode
    // replica's blocks: until then a closed port would read as this process being gone.
    prefill->StopAccepting();
    const auto writes_until = std::max(drain_until, std::chrono::steady_clock::now() + std::chrono::seconds(10));
    if (!prefill->WaitForWritesToEnd(writes_until)) {
      spdlog::error("{} calls still hold KV writes into decode replicas: exiting without closing the port first",
                    prefill->writers().size());
      std::_Exit(1);  // the port closes with the process, after its last thread
    }
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  admin.Stop();
  return rank_died ? 1 : 0;
}

}  // namespace tandem
