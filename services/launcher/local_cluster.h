// A whole Tandem cluster on one machine (`tandem serve-local`, and integration tests):
// starts the router, then the workers pointed at it, each with a ready file; waits until
// all are ready; restarts a process that dies (with backoff, logging why); stops every
// child cleanly (SIGTERM, then SIGKILL after a grace period). Internal traffic between the
// processes is mutual TLS by default, with a throwaway CA (throwaway_pki.h) that lives
// as long as the cluster.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "services/launcher/throwaway_pki.h"
#include "services/security/internal_credentials.h"

namespace tandem {

struct LocalClusterOptions {
  std::string bin_dir;         // where tandem-router, tandem-prefill, tandem-decode live
  std::string run_dir;         // ready files and logs go here (created)
  std::string model = "tiny";
  std::string router_listen = "127.0.0.1:0";
  std::string router_internal_listen = "127.0.0.1:0";
  // How the processes authenticate each other: mutual TLS with a throwaway CA (the
  // default), a random cluster token (tcp-only setups), or nothing (loopback only).
  enum class InternalAuth { kMutualTls, kToken, kNone };
  InternalAuth internal_auth = InternalAuth::kMutualTls;
  // Serve the router's public port over TLS too, with the throwaway node certificate
  // (clients verify it against ca_cert()).
  bool public_tls = false;
  int num_prefill = 1;
  int num_decode = 1;
  int num_both = 0;            // aggregated workers (--role both)
  std::vector<std::string> router_args;  // extra flags for the router
  std::vector<std::string> worker_args;  // extra flags for every worker
  std::vector<std::string> prefill_args;  // extra flags for prefill replicas only
  // Non-empty: replica i of the role gets --device=LIST[i % size] (after worker_args, which
  // must then not carry --device); decode_devices also places aggregated workers.
  std::vector<std::string> prefill_devices;
  std::vector<std::string> decode_devices;
  // kvstore instances (tandem-kvstore, named kvstore-0..N-1: their places on the
  // consistent-hash ring, kept across restarts), started and ready before the workers.
  int num_kvstore = 0;
  std::vector<std::string> kvstore_args;  // extra flags for every kvstore
  std::string kvstore_disk_root;          // non-empty: kvstore-i gets --disk-dir ROOT/kvstore-i
  std::vector<std::string> env;          // extra NAME=value for every child
  bool restart = true;
  std::chrono::milliseconds ready_timeout{120000};
  std::function<void(const std::string&)> log;  // progress and restarts; may be empty
};

struct ProcessInfo {
  std::string name;  // "router", "prefill-0", ...
  std::string role;
  pid_t pid = 0;
  nlohmann::json ready;  // the process's ready file
  int restarts = 0;
};

class LocalCluster {
 public:
  // Starts everything and waits until every process is ready. Errors: a binary missing,
  // a process exiting before it is ready (with the tail of its log), DEADLINE_EXCEEDED.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(LocalClusterOptions options);
  ~LocalCluster();  // Stop()

  std::string router_address() const;           // public: Generation
  std::string router_internal_address() const;  // internal: Cluster (the workers' --router)
  std::string router_http_address() const;      // the OpenAI-compatible API ("" when off)
  // The throwaway CA, certificates and token (null with InternalAuth::kNone and no
  // public TLS).
  const ThrowawayPki* pki() const { return pki_.get(); }
  // The flags every child gets for its internal traffic (--tls-* or --cluster-token-file).
  std::vector<std::string> InternalAuthArgs() const;
  // Credentials of a tool talking to the internal services (tests, tandem status): the
  // client certificate or the token.
  security::InternalCredentials ClientCredentials() const;
  std::vector<ProcessInfo> processes() const;
  nlohmann::json ReadyJson() const;
  // Kills one process with `signal` (tests of fault handling); it is restarted if
  // restarts are on.
  absl::Status Kill(const std::string& name, int signal);
  // Starts one more worker ("prefill", "decode" or "both") pointed at the router and waits
  // until it is ready (scaling out). Returns its name.
  absl::StatusOr<std::string> AddWorker(const std::string& role, std::vector<std::string> extra_args = {});
  // Stops one process for good (no restart): `signal` (SIGTERM drains), then waits up to
  // `grace` for it to exit (then SIGKILL). Returns its wait status.
  absl::StatusOr<int> StopProcess(const std::string& name, int signal, std::chrono::milliseconds grace);
  // Stops all children: SIGTERM, wait up to `grace`, then SIGKILL.
  void Stop(std::chrono::milliseconds grace = std::chrono::milliseconds(10000));

 private:
  struct Child {
    ProcessInfo info;
    std::vector<std::string> argv;
    std::string ready_file;
    std::string log_file;
    std::chrono::steady_clock::time_point started;
    std::chrono::milliseconds backoff{500};
    bool retired = false;  // stopped for good: not restarted
  };
  Child MakeChild(const std::string& name, const std::string& role, std::vector<std::string> argv) const;
  std::vector<std::string> WorkerArgv(const std::string& role, int index) const;
  explicit LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {}
  absl::Status Spawn(Child& c);
  absl::Status WaitReady(Child& c, std::chrono::steady_clock::time_point deadline);
  void Supervise();
  void Log(const std::string& line) const;

  LocalClusterOptions options_;
  std::unique_ptr<ThrowawayPki> pki_;
  mutable std::mutex mu_;
  std::deque<Child> children_;  // deque: references stay valid as workers are added
  bool stopping_ = false;
  std::thread supervisor_;
  std::map<std::string, int> next_index_;  // per role, for names of added workers
};

// The directory of the running executable (to find the sibling binaries).
std::string SelfBinaryDir();

}  // namespace tandem
