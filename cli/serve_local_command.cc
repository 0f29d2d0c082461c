#include "cli/serve_local_command.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>

#include "absl/strings/str_join.h"
#include "cli/client_security.h"
#include "cli/remote_client.h"
#include "cli/validators.h"
#include "engine/runtime/engine.h"
#include "engine/model/model_backend.h"
#include "services/common/ready_file.h"
#include "services/common/service_flags.h"
#include "services/common/shutdown_signal.h"
#include "services/launcher/local_cluster.h"

namespace tandem::cli {
namespace {

struct ServeLocalArgs {
  int prefill = 1;
  int decode = 1;
  int kvstore = 1;
  std::string kvstore_capacity = "1G";
  std::string kvstore_disk_dir;
  std::vector<std::string> kvstore_args;
  int aggregated = 0;
  std::string model = "tiny";
  std::string device = "cpu";
  std::vector<std::string> prefill_devices;
  std::vector<std::string> decode_devices;
  std::string listen = "127.0.0.1:50051";
  std::string internal_listen = "127.0.0.1:0";  // printed, and in the ready file
  std::string http_listen = "127.0.0.1:0";      // the OpenAI-compatible API; "off": none
  std::string internal_auth = "mtls";
  bool public_tls = false;
  std::string api_keys_file;
  std::string ready_file;
  std::string run_dir;
  int threads = 0;
  int64_t kv_cache_mb = 512;
  bool batch_invariant = false;
  bool fp8_decode = false;
  bool fp8_prefill = false;
  int speculative_tokens = 0;
  double speculative_min_confidence = 0.0;
  bool no_speculative_adaptive = false;
  std::vector<std::string> router_args;
  std::vector<std::string> worker_args;
};

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b,
                                const std::vector<std::string>& c) {
  a.insert(a.end(), b.begin(), b.end());
  a.insert(a.end(), c.begin(), c.end());
  return a;
}

// Which device each worker gets: the explicit lists, else --device; with a bare
// `--device cuda` on a machine of several GPUs, prefill replicas take the first half of the
// GPUs and decode replicas the second (aggregated workers all of them, in turn), so the two
// phases never share a GPU's compute and KV moves GPU to GPU.
void PlaceWorkers(const ServeLocalArgs& a, LocalClusterOptions* o) {
  o->prefill_devices = a.prefill_devices.empty() ? std::vector<std::string>{a.device} : a.prefill_devices;
  o->decode_devices = a.decode_devices.empty() ? std::vector<std::string>{a.device} : a.decode_devices;
  const int gpus = a.device == "cuda" ? CudaDeviceCount() : 0;
  if (gpus < 2) return;
  auto range = [](int begin, int end) {
    std::vector<std::string> v;
    for (int i = begin; i < end; ++i) v.push_back("cuda:" + std::to_string(i));
    return v;
  };
  if (a.aggregated > 0) {
    if (a.decode_devices.empty()) o->decode_devices = range(0, gpus);
    return;
  }
  if (a.prefill_devices.empty()) o->prefill_devices = range(0, gpus / 2);
  if (a.decode_devices.empty()) o->decode_devices = range(gpus / 2, gpus);
}

int Run(const ServeLocalArgs& a) {
  for (const std::string& dev : Concat({a.device}, a.prefill_devices, a.decode_devices)) {
    if (absl::StatusOr<DeviceSpec> d = ParseDevice(dev); !d.ok()) {
      std::fprintf(stderr, "tandem serve-local: %s\n", std::string(d.status().message()).c_str());
      return 2;
    }
  }
  if (a.aggregated == 0 && (a.prefill < 1 || a.decode < 1)) {
    std::fprintf(stderr, "tandem serve-local: need --prefill >= 1 and --decode >= 1 (or --aggregated N)\n");
    return 2;
  }
  service::InstallShutdownSignalHandling();
  LocalClusterOptions o;
  o.bin_dir = SelfBinaryDir();
  o.run_dir = a.run_dir.empty() ? "/tmp/tandem-serve-local-" + std::to_string(getpid()) : a.run_dir;
  o.model = a.model;
  o.router_listen = a.listen;
  o.router_internal_listen = a.internal_listen;
  o.internal_auth = a.internal_auth == "token"  ? LocalClusterOptions::InternalAuth::kToken
                    : a.internal_auth == "none" ? LocalClusterOptions::InternalAuth::kNone
                                                : LocalClusterOptions::InternalAuth::kMutualTls;
  o.public_tls = a.public_tls;
  o.num_prefill = a.aggregated > 0 ? 0 : a.prefill;
  o.num_decode = a.aggregated > 0 ? 0 : a.decode;
  o.num_both = a.aggregated;
  o.router_args = a.router_args;
  if (!a.http_listen.empty() && a.http_listen != "off") o.router_args.push_back("--http-listen=" + a.http_listen);
  if (!a.api_keys_file.empty()) o.router_args.push_back("--api-keys-file=" + a.api_keys_file);
  o.worker_args = a.worker_args;
  // The prefix tier: prefill replicas find the kvstores through the router.
  o.num_kvstore = a.aggregated > 0 ? 0 : a.kvstore;
  o.kvstore_disk_root = a.kvstore_disk_dir;
  o.kvstore_args = a.kvstore_args;
  if (std::none_of(o.kvstore_args.begin(), o.kvstore_args.end(),
                   [](const std::string& x) { return x.rfind("--capacity", 0) == 0; })) {
    o.kvstore_args.push_back("--capacity=" + a.kvstore_capacity);
  }
  o.worker_args.push_back("--threads=" + std::to_string(a.threads));
  PlaceWorkers(a, &o);
  o.worker_args.push_back("--kv-cache-mb=" + std::to_string(a.kv_cache_mb));
  if (a.batch_invariant) o.worker_args.push_back("--batch-invariant");
  if (a.fp8_decode) o.worker_args.push_back("--fp8-decode");
  if (a.fp8_prefill) o.worker_args.push_back("--fp8-prefill");
  if (a.speculative_tokens > 0) {
    // Every worker drafts; the router and the kvstores admit and store the KV layout with
    // the MTP layer's KV (another fingerprint).
    const std::string n = "--speculative-tokens=" + std::to_string(a.speculative_tokens);
    o.worker_args.push_back(n);
    o.worker_args.push_back("--speculative-min-confidence=" + std::to_string(a.speculative_min_confidence));
    if (a.no_speculative_adaptive) o.worker_args.push_back("--no-speculative-adaptive");
    o.router_args.push_back(n);
    o.kvstore_args.push_back(n);
  }
  o.log = [](const std::string& line) { std::fprintf(stderr, "serve-local: %s\n", line.c_str()); };
  if (a.device != "cpu" || !a.prefill_devices.empty() || !a.decode_devices.empty()) {
    std::fprintf(stderr, "serve-local: prefill replicas on %s, %s on %s\n",
                 absl::StrJoin(o.prefill_devices, ",").c_str(), a.aggregated > 0 ? "aggregated workers" : "decode replicas",
                 absl::StrJoin(o.decode_devices, ",").c_str());
  }
  std::fprintf(stderr, "serve-local: starting %s in %s ...\n",
               a.aggregated > 0 ? (std::to_string(a.aggregated) + " aggregated workers").c_str()
                                : (std::to_string(a.prefill) + " prefill + " + std::to_string(a.decode) +
                                   " decode replicas").c_str(),
               o.run_dir.c_str());
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(o);
  if (!cluster.ok()) {
    std::fprintf(stderr, "tandem serve-local: %s\n", std::string(cluster.status().message()).c_str());
    return 1;
  }
  const nlohmann::json ready = (*cluster)->ReadyJson();
  for (const ProcessInfo& p : (*cluster)->processes()) {
    std::printf("%-10s pid %-7d grpc %-22s admin %s\n", p.name.c_str(), p.pid, p.ready.value("grpc", "").c_str(),
                p.ready.value("admin", "").c_str());
  }
  // Where clients find the cluster and its credentials (also in the ready file's "security").
  const nlohmann::json& sec = ready["security"];
  const std::string ca = sec.value("ca", "");
  std::printf("public   %s (%s%s)\n", (*cluster)->router_address().c_str(), a.public_tls ? "TLS" : "plaintext",
              a.api_keys_file.empty() ? ", no API keys" : ", API keys");
  if (const std::string http = (*cluster)->router_http_address(); !http.empty()) {
    std::printf("http     %s://%s/v1 (OpenAI-compatible; %s%s)\n", a.public_tls ? "https" : "http", http.c_str(),
                a.public_tls ? "HTTPS, clients trust the CA below" : "plaintext",
                a.api_keys_file.empty() ? ", no API keys" : ", API keys");
  }
  std::printf("internal %s (%s)%s%s\n", (*cluster)->router_internal_address().c_str(),
              sec.value("internal_auth", "").c_str(), ca.empty() ? "" : "; CA ", ca.c_str());
  std::string status_flags;
  if (sec.contains("client_cert")) {
    status_flags = " --tls-ca " + ca + " --tls-cert " + sec.value("client_cert", "") + " --tls-key " +
                   sec.value("client_key", "");
  } else if (sec.contains("token_file")) {
    status_flags = " --cluster-token-file " + sec.value("token_file", "");
  }
  std::printf("status:  tandem status --addr %s%s%s%s\n", (*cluster)->router_internal_address().c_str(),
              status_flags.c_str(), a.ready_file.empty() ? "" : "   (or: tandem status --ready-file ",
              a.ready_file.empty() ? "" : (a.ready_file + ")").c_str());
  std::printf("ready: tandem generate --addr %s%s%s \"Hello\"   (Ctrl-C stops the cluster)\n",
              (*cluster)->router_address().c_str(), a.public_tls ? " --tls-ca " : "", a.public_tls ? ca.c_str() : "");
  std::fflush(stdout);
  if (!a.ready_file.empty()) {
    if (absl::Status s = service::WriteReadyFile(a.ready_file, ready); !s.ok()) {
      std::fprintf(stderr, "tandem serve-local: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  service::WaitForShutdownSignal();
  std::fprintf(stderr, "serve-local: stopping ...\n");
  (*cluster)->Stop();
  return 0;
}

}  // namespace

void RegisterServeLocal(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ServeLocalArgs>();
  CLI::App* cmd = app.add_subcommand(
      "serve-local",
      "Start a whole Tandem cluster on this machine (router, prefill and decode replicas, kvstores) and keep it "
      "running: print its endpoints, restart a replica that dies, stop everything on Ctrl-C or SIGTERM.");
  cmd->add_option("--prefill", a->prefill, "Prefill replicas")->check(CLI::Range(0, 64))->capture_default_str();
  cmd->add_option("--decode", a->decode, "Decode replicas")->check(CLI::Range(0, 64))->capture_default_str();
  cmd->add_option("--kvstore", a->kvstore,
                  "kvstore instances: the prefix KV tier prefill replicas fetch from and offload to (0 = none)")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->add_option("--aggregated", a->aggregated,
                  "Run N aggregated workers (--role both, no KV transfer) instead of prefill/decode replicas")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  cmd->add_option("--model", a->model, "Checkpoint directory or built-in model (tiny, tiny-v2)")->capture_default_str();
  cmd->add_option("--device", a->device,
                  "Where the workers' models run: cpu, cuda or cuda:N. A bare cuda on a machine with several GPUs puts "
                  "prefill replicas on the first half of them and decode replicas on the second (KV then moves GPU to "
                  "GPU); aggregated workers take the GPUs in turn")
      ->capture_default_str();
  cmd->add_option("--prefill-devices", a->prefill_devices,
                  "Devices for prefill replicas, comma-separated (replica i gets entry i mod N), e.g. cuda:0 or "
                  "cuda:0,cuda:1; default: from --device")
      ->delimiter(',');
  cmd->add_option("--decode-devices", a->decode_devices,
                  "Devices for decode replicas (and aggregated workers), comma-separated, e.g. cuda:1; default: from "
                  "--device")
      ->delimiter(',');
  cmd->add_option("--listen", a->listen, "The router's public gRPC address (port 0 = any free port)")
      ->capture_default_str();
  cmd->add_option("--http-listen", a->http_listen,
                  "The router's OpenAI-compatible HTTP API address (port 0 = any free port; \"off\" = none)")
      ->capture_default_str();
  cmd->add_option("--internal-listen", a->internal_listen,
                  "The router's internal gRPC address, where the replicas register (default: a free loopback "
                  "port, printed and in the ready file)")
      ->capture_default_str();
  cmd->add_option("--internal-auth", a->internal_auth,
                  "How the cluster's processes authenticate each other: mtls (a throwaway CA and certificates made "
                  "with openssl in a private directory removed on exit), token (a random cluster token there), none "
                  "(plaintext; loopback only)")
      ->check(CLI::IsMember({"mtls", "token", "none"}))
      ->capture_default_str();
  cmd->add_flag("--public-tls", a->public_tls,
                "Serve the public ports over TLS too (gRPC, and the HTTP API as HTTPS), with a certificate of the "
                "throwaway CA (clients: --tls-ca CA; Node: NODE_EXTRA_CA_CERTS=CA)");
  cmd->add_option("--api-keys-file", a->api_keys_file,
                  "Require API keys on the public API (the router's --api-keys-file; see tandem-router --help)");
  cmd->add_option("--ready-file", a->ready_file,
                  "Write JSON with every process's role, pid, gRPC and admin addresses once all are ready, the "
                  "router's internal address and, under \"security\", where the CA and client credentials are");
  cmd->add_option("--run-dir", a->run_dir, "Where logs and ready files go (default /tmp/tandem-serve-local-PID)");
  cmd->add_option("--threads", a->threads, "CPU threads per worker (0 = all)")->capture_default_str();
  cmd->add_option("--kv-cache-mb", a->kv_cache_mb, "KV cache per worker, MiB")->capture_default_str();
  cmd->add_flag("--batch-invariant", a->batch_invariant,
                "Every worker computes batch-invariantly (worker --batch-invariant): a seeded request's tokens do "
                "not depend on the load, the replica or the kvstore");
  cmd->add_flag("--fp8-decode", a->fp8_decode,
                "GPU workers of an FP8 DeepSeek-V2/V3 checkpoint decode on its stored FP8 weights (worker "
                "--fp8-decode: faster decode steps, 1.5x the bf16 weight memory)");
  cmd->add_flag("--fp8-prefill", a->fp8_prefill,
                "GPU workers of an FP8 DeepSeek checkpoint multiply prefill passes of 128+ tokens on the FP8 tensor "
                "cores (worker --fp8-prefill)");
  cmd->add_option("--speculative-tokens", a->speculative_tokens,
                  "Speculative decoding with the model's MTP layer: every worker drafts up to N tokens per sequence "
                  "and step (worker --speculative-tokens; the router and the kvstores are told, for the KV layout "
                  "it implies). 0: off")
      ->check(CLI::Range(0, static_cast<int>(kMaxSpeculativeTokens)))
      ->capture_default_str();
  cmd->add_option("--speculative-min-confidence", a->speculative_min_confidence,
                  "With --speculative-tokens: a sequence stops drafting at a draft the MTP layer gives a probability "
                  "below this (worker --speculative-min-confidence)")
      ->check(FiniteRange(0.0, 1.0))
      ->capture_default_str();
  cmd->add_flag("--no-speculative-adaptive", a->no_speculative_adaptive,
                "With --speculative-tokens: every worker drafts at every step (worker --no-speculative-adaptive; "
                "default: only where drafting measured faster)");
  cmd->add_option("--router-arg", a->router_args, "Extra flag for the router (repeatable), e.g. --router-arg=--heartbeat-ms=500");
  cmd->add_option("--worker-arg", a->worker_args, "Extra flag for every worker (repeatable)");
  cmd->add_option("--kvstore-capacity", a->kvstore_capacity, "DRAM tier of each kvstore (bytes, or 512M, 4G)")
      ->capture_default_str();
  cmd->add_option("--kvstore-disk-dir", a->kvstore_disk_dir,
                  "SSD tier: kvstore i keeps its blocks under DIR/kvstore-i, across restarts (empty: DRAM only)");
  cmd->add_option("--kvstore-arg", a->kvstore_args,
                  "Extra flag for every kvstore (repeatable), e.g. --kvstore-arg=--disk-capacity=8G");
  service::BindEnvironment(*cmd);
  cmd->callback([a, exit_code] { *exit_code = Run(*a); });
}

void RegisterStatus(CLI::App& app, int* exit_code) {
  auto addr = std::make_shared<std::string>("127.0.0.1:50061");
  auto json = std::make_shared<bool>(false);
  auto security = std::make_shared<ClientSecurityArgs>();
  CLI::App* cmd = app.add_subcommand(
      "status",
      "Print the cluster: each replica's role, address, load and KV usage. Asks the router's internal port "
      "(tandem.v1.Cluster), so it needs the cluster's credentials: a client certificate (--tls-ca, --tls-cert, "
      "--tls-key) or the cluster token; serve-local prints the command with its own.");
  cmd->add_option("--addr", *addr, "The router's internal address HOST:PORT (its --internal-listen)")
      ->envname("TANDEM_INTERNAL_ADDR")
      ->capture_default_str();
  cmd->add_flag("--json", *json, "Print JSON");
  AddClientSecurityFlags(cmd, security.get(), /*internal=*/true);
  auto ready_file = std::make_shared<std::string>();
  cmd->add_option("--ready-file", *ready_file,
                  "Take the internal address and the credentials from serve-local's ready file (its --ready-file)");
  cmd->callback([addr, json, security, ready_file, exit_code] {
    if (!ready_file->empty()) {
      std::ifstream in(*ready_file);
      const nlohmann::json r = nlohmann::json::parse(in, nullptr, false);
      if (r.is_discarded() || !r.is_object() || !r.contains("internal")) {
        std::fprintf(stderr, "tandem status: --ready-file %s: not a serve-local ready file\n", ready_file->c_str());
        *exit_code = 2;
        return;
      }
      *addr = r.value("internal", *addr);
      const nlohmann::json sec = r.value("security", nlohmann::json::object());
      if (sec.contains("client_cert")) {
        security->tls_ca = sec.value("ca", "");
        security->tls_cert = sec.value("client_cert", "");
        security->tls_key = sec.value("client_key", "");
      } else if (sec.contains("token_file")) {
        security->cluster_token_file = sec.value("token_file", "");
      }
    }
    *exit_code = RunStatus(*addr, *json, *security);
  });
}

}  // namespace tandem::cli
