// Looks for proof that the writers of quarantined leases stopped (engine/runtime/kv_leases.h)
// when their own EndWrites did not come: it asks each writer's process
// (Prefill.WriterState at the address its BeginWrites gave) about the leases it holds open,
// with backoff, and reports:
//   - kEnded: the process that answers is the writer (same incarnation) and holds no
//     writes for the lease (its EndWrites was lost, or is still on its way);
//   - kGone: another incarnation answers at that address (the writer's process no longer
//     holds the port: it exited, since the internal port is bound without SO_REUSEPORT),
//     or the call fails and nothing accepts connections there any more (nothing listens:
//     the process is gone).
// Anything else proves nothing and the lease stays quarantined: a process stopped
// (SIGSTOP) or starved keeps its listening socket, so connecting succeeds and the call
// times out; an unreachable host is not a dead one.
//
// It is told of quarantines by the engine (KvQuarantineListener, on the engine thread:
// only queued here) and works on its own thread; calls are asynchronous, and their
// completions only queue their answers. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runtime/kv_leases.h"
#include "tandem/v1/internal.pb.h"

namespace tandem {

// How the prober reaches writers: gRPC (grpc_writer_state_client.h), or a fake in tests.
class WriterStateClient {
 public:
  virtual ~WriterStateClient() = default;
  // Prefill.WriterState at `address`; `done` runs once, on any thread, and must not block.
  virtual void Ask(const std::string& address, const v1::WriterStateRequest& request,
                   std::function<void(absl::StatusOr<v1::WriterStateResponse>)> done) = 0;
  // Whether nothing accepts connections at `address` (every connection refused). May block
  // briefly (bounded); called on the prober's thread only.
  virtual bool NothingListens(const std::string& address) = 0;
};

struct KvWriterProberOptions {
  std::chrono::milliseconds first_ask{50};     // after a lease goes into quarantine
  std::chrono::milliseconds max_backoff{2000};  // between two asks of one address
  // A quarantine older than this is logged (once): its writer is neither done nor gone.
  std::chrono::milliseconds stuck_after{60000};
};

class KvWriterProber final : public KvQuarantineListener {
 public:
  // Called (on the prober's thread) for each writer known to have stopped.
  using OnProof = std::function<void(const std::string& lease_id, uint64_t token, uint64_t incarnation, KvWriterProof)>;
  // `client` must outlive the prober.
  KvWriterProber(WriterStateClient* client, OnProof on_proof, KvWriterProberOptions options = {});
  // Stops the thread, after the asks in flight have completed.
  ~KvWriterProber() override;

  void OnQuarantined(const std::string& lease_id, uint64_t token, const std::vector<KvWriter>& open) override;
  void OnQuarantineEnded(const std::string& lease_id, uint64_t token) override;

  // Writers of quarantined leases not proven stopped yet (lease, writer pairs).
  size_t pending() const;
  // The same by writer address: which prefill replicas hold this replica's KV out of use.
  std::map<std::string, size_t> PendingByAddress() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct LeaseKey {
    std::string id;
    uint64_t token = 0;
    auto operator<=>(const LeaseKey&) const = default;
  };
  // One writer address and the leases it is asked about.
  struct Target {
    std::map<LeaseKey, std::set<uint64_t>> leases;  // incarnations not proven stopped
    Clock::time_point next;
    std::chrono::milliseconds backoff{0};
    bool asking = false;
  };
  struct Answer {
    std::string address;
    std::map<LeaseKey, std::set<uint64_t>> asked;
    absl::StatusOr<v1::WriterStateResponse> response;
  };
  struct Proof {
    LeaseKey lease;
    uint64_t incarnation;
    KvWriterProof proof;
  };
  struct Quarantine {
    Clock::time_point since;
    bool logged = false;
  };

  void Loop();
  // Findings of one answer (mu_ held; may release it to ask whether anything listens).
  void Settle(Answer a, std::unique_lock<std::mutex>& lock, std::vector<Proof>* proofs);
  void Ask(const std::string& address, Target& t);
  void LogStuck(Clock::time_point now, Clock::time_point* wake);

  WriterStateClient* client_;
  OnProof on_proof_;
  const KvWriterProberOptions options_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Target> targets_;
  std::map<LeaseKey, Quarantine> quarantines_;
  std::deque<Answer> answers_;
  int asks_in_flight_ = 0;
  bool news_ = false;  // a quarantine came since the loop last looked
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest exists
};

}  // namespace tandem
