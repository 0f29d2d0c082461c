// A worker's membership in the cluster: registers with the router (retrying until the
// router answers), heartbeats with load reports, registers again when the router forgets
// it (a router restart), and deregisters on shutdown. Runs its own thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "services/security/channel_factory.h"
#include "tandem/v1/internal.grpc.pb.h"

namespace tandem {

class RouterRegistration {
 public:
  // `load` is called from the registration thread for every heartbeat; `kv_events` (may
  // be empty) too, with full=true wanted when registering. `router_address` is the
  // router's internal address (--internal-listen there); `channel_factory` opens the
  // channel with this process's internal credentials (empty: plaintext).
  RouterRegistration(std::string router_address, v1::RegisterRequest self, std::function<v1::LoadReport()> load,
                     std::function<v1::KvCacheEvents(bool full)> kv_events = nullptr,
                     const security::ChannelFactory& channel_factory = nullptr);
  ~RouterRegistration();  // stops the thread and deregisters

  // Registers (retrying every 200 ms up to `timeout`), then starts heartbeating.
  // Errors: DEADLINE_EXCEEDED (router unreachable), FAILED_PRECONDITION (the router
  // refused this replica, e.g. another model).
  absl::Status Start(std::chrono::milliseconds timeout);
  // From now on heartbeats say "draining": the router sends no new work.
  void SetDraining();
  // Called on the registration thread with the kvstore instances the router lists in
  // each successful register or heartbeat answer (the full list each time). Set before
  // Start.
  void SetKvStoreListener(std::function<void(const std::vector<v1::KvStoreEndpoint>&)> listener) {
    kvstore_listener_ = std::move(listener);
  }
  std::string replica_id() const;
  std::chrono::milliseconds heartbeat_interval() const;

 private:
  absl::Status RegisterOnce();
  void Loop();

  std::string router_address_;
  v1::RegisterRequest self_;
  std::function<v1::LoadReport()> load_;
  std::function<v1::KvCacheEvents(bool)> kv_events_;
  std::function<void(const std::vector<v1::KvStoreEndpoint>&)> kvstore_listener_;
  std::unique_ptr<v1::Cluster::Stub> stub_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::string replica_id_;
  std::chrono::milliseconds interval_{1000};
  bool stop_ = false;
  std::atomic<bool> draining_{false};
  std::thread thread_;
};

}  // namespace tandem
