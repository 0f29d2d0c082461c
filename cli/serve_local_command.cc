#include "cli/serve_local_command.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "cli/remote_client.h"
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
  std::string listen = "127.0.0.1:50051";
  std::string ready_file;
  std::string run_dir;
  int threads = 0;
  int64_t kv_cache_mb = 512;
  std::vector<std::string> router_args;
  std::vector<std::string> worker_args;
};

int Run(const ServeLocalArgs& a) {
  if (absl::StatusOr<DeviceSpec> d = ParseDevice(a.device); !d.ok()) {
    std::fprintf(stderr, "tandem serve-local: %s\n", std::string(d.status().message()).c_str());
    return 2;
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
  o.num_prefill = a.aggregated > 0 ? 0 : a.prefill;
  o.num_decode = a.aggregated > 0 ? 0 : a.decode;
  o.num_both = a.aggregated;
  o.router_args = a.router_args;
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
  o.worker_args.push_back("--device=" + a.device);
  o.worker_args.push_back("--kv-cache-mb=" + std::to_string(a.kv_cache_mb));
  o.log = [](const std::string& line) { std::fprintf(stderr, "serve-local: %s\n", line.c_str()); };
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
  std::printf("ready: tandem generate --addr %s \"Hello\"   (Ctrl-C stops the cluster)\n",
              (*cluster)->router_address().c_str());
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
  cmd->add_option("--device", a->device, "Where every worker's model runs: cpu, cuda or cuda:N")->capture_default_str();
  cmd->add_option("--listen", a->listen, "The router's public gRPC address (port 0 = any free port)")
      ->capture_default_str();
  cmd->add_option("--ready-file", a->ready_file,
                  "Write JSON with every process's role, pid, gRPC and admin addresses once all are ready");
  cmd->add_option("--run-dir", a->run_dir, "Where logs and ready files go (default /tmp/tandem-serve-local-PID)");
  cmd->add_option("--threads", a->threads, "CPU threads per worker (0 = all)")->capture_default_str();
  cmd->add_option("--kv-cache-mb", a->kv_cache_mb, "KV cache per worker, MiB")->capture_default_str();
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
  auto addr = std::make_shared<std::string>("127.0.0.1:50051");
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("status", "Print the cluster: each replica's role, address, load and KV usage.");
  cmd->add_option("--addr", *addr, "Router address HOST:PORT")->envname("TANDEM_ADDR")->capture_default_str();
  cmd->add_flag("--json", *json, "Print JSON");
  cmd->callback([addr, json, exit_code] { *exit_code = RunStatus(*addr, *json); });
}

}  // namespace tandem::cli
