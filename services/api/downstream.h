// What the request core (request_core.h) needs from the world, as interfaces so that the
// core runs the same over gRPC (services/router/grpc_downstream.h) and over hand-written
// fakes in its tests: the cluster's replicas (pick one of a role, then reserve, prefill,
// decode, release on it), and a clock with timers.
//
// Every asynchronous call completes exactly once, on any thread, through its callback,
// cancelled or not; a call's handle may be cancelled at any time (also after completion).
// The core posts each completion to its serial executor, so callbacks may run inline.
// Requests and responses are the internal tandem.v1 protos: the core builds them itself,
// and another message type would only be converted back into them.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tandem/v1/generation.pb.h"
#include "tandem/v1/internal.pb.h"

namespace tandem {

using CoreClock = std::chrono::steady_clock;

// A call or timer in flight. Cancel asks it to end soon; its callback still runs once.
class PendingCall {
 public:
  virtual ~PendingCall() = default;
  virtual void Cancel() = 0;
};

// A server stream of GenerateResponse (Decode, or an aggregated worker's Generate).
// Reading is pulled: one Read at a time, answered by on_message, or by on_done once the
// stream has ended (on_done runs exactly once, after every on_message).
class DownstreamStream : public PendingCall {
 public:
  virtual void Read() = 0;
};

struct StreamHandlers {
  std::function<void(v1::GenerateResponse)> on_message;
  std::function<void(absl::Status)> on_done;
};

struct CallOptions {
  std::string request_id;                        // for the replica's log (x-request-id)
  std::optional<CoreClock::time_point> deadline;  // the client's, when it set one
};

// One replica the request uses; holding the handle counts as a request in flight on it
// (load-aware routing sees it).
class ReplicaHandle {
 public:
  virtual ~ReplicaHandle() = default;
  virtual const std::string& id() const = 0;
  // Dropped for missing heartbeats: a call that then ends CANCELLED was cut off, and the
  // replica may still be working on it.
  virtual bool IsLost() const = 0;
  // Requests of this router waiting for KV room in the replica's queue (Reserve with a
  // wait_ms, not yet answered): when there are some, it is full, and a new reservation
  // would queue behind them.
  virtual int WaitingHere() const = 0;
  virtual void AddWaiting(int delta) = 0;

  virtual std::unique_ptr<PendingCall> Reserve(const CallOptions& o, const v1::ReserveRequest& r,
                                               std::function<void(absl::StatusOr<v1::ReserveResponse>)> done) = 0;
  // Frees a reservation; fire and forget (the replica also expires it). `ended_writer`:
  // ReleaseRequest.ended_writer_incarnation (0: none).
  virtual void Release(const CallOptions& o, const std::string& lease_id, uint64_t ended_writer) = 0;
  virtual std::unique_ptr<PendingCall> Prefill(const CallOptions& o, const v1::PrefillRequest& r,
                                               std::function<void(absl::StatusOr<v1::PrefillResponse>)> done) = 0;
  // The stream starts at once; the caller Reads.
  virtual std::unique_ptr<DownstreamStream> Decode(const CallOptions& o, const v1::DecodeRequest& r,
                                                   StreamHandlers h) = 0;
  virtual std::unique_ptr<DownstreamStream> Generate(const CallOptions& o, const v1::GenerateRequest& r,
                                                     StreamHandlers h) = 0;
};

// The cluster as the core sees it: which roles have ready replicas, and a choice among
// them by the router's routing policy for that role.
class ClusterView {
 public:
  virtual ~ClusterView() = default;
  // Ready replicas able to serve `role` (ROLE_BOTH workers serve every role).
  virtual int Count(v1::Role role) = 0;
  // Null when every candidate is in `exclude` (or none is ready).
  virtual std::shared_ptr<ReplicaHandle> Pick(v1::Role role, std::span<const uint64_t> block_hashes,
                                              const std::vector<std::string>& exclude) = 0;
};

class RequestClock {
 public:
  virtual ~RequestClock() = default;
  virtual CoreClock::time_point Now() = 0;
  // Calls fire(true) at `when`, or fire(false) once cancelled: exactly once either way.
  virtual std::unique_ptr<PendingCall> At(CoreClock::time_point when, std::function<void(bool fired)> fire) = 0;
};

// The router's bounded queues (services/router/admission.h) as the core uses them.
class AdmissionQueues {
 public:
  enum class Queue { kPrefill, kDecode };
  virtual ~AdmissionQueues() = default;
  // Takes a place in `q`; false when the queue is full (nothing taken).
  virtual bool TryEnter(Queue q) = 0;
  virtual void Leave(Queue q) = 0;
  // The status a refused request ends with, and the pause to suggest.
  virtual absl::Status Refusal(Queue q) const = 0;
  virtual std::chrono::milliseconds retry_after() const = 0;
};

}  // namespace tandem
