// tandem.v1.Prefill on a local engine: prefill-only requests whose KV goes, layer by
// layer as it is computed, into the decode replica's blocks named in the request: device
// to device when the destination offers its GPU pool and this replica can map it
// (DeviceKvSink), else through the transfer layer (TransferKvSink).
//
// It writes into a lease only once the decode replica has recorded it as a writer
// (Decode.BeginWrites, sent when the call arrives, so that its answer overlaps the kvstore
// fetch and the first layers), and on every way out of a call tells it that its writes
// ended (Decode.EndWrites) once they all completed remotely, before the call answers
// (kv_writer_session.h). Prefill.WriterState answers whether this process still holds
// writes for a lease.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "engine/runtime/engine.h"
#include "services/kvstore/prefix_store.h"
#include "services/worker/kv_transfer_mode.h"
#include "services/prefill/kv_destination.h"
#include "services/prefill/kv_write_notices.h"
#include "services/prefill/kv_writer_registry.h"
#include "services/worker/kv_transport.h"
#include "tandem/v1/internal.grpc.pb.h"

namespace tandem {

class PrefillServiceImpl final : public v1::Prefill::CallbackService {
 public:
  // `engine` and `transport` must outlive the service; `notices` reach decode replicas
  // (GrpcKvWriteNotices, or a fake).
  // `on_transfer(seconds, bytes, ok, path)` is told about each request's KV transfer
  // (metrics; path "transfer" or "cuda_ipc").
  using OnTransfer = std::function<void(double, int64_t, bool, const std::string&)>;
  PrefillServiceImpl(Engine* engine, KvTransport* transport, std::shared_ptr<KvWriteNotices> notices,
                     OnTransfer on_transfer = nullptr, KvTransferMode mode = KvTransferMode::kAuto);

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* ctx, const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;
  grpc::ServerUnaryReactor* WriterState(grpc::CallbackServerContext* ctx, const v1::WriterStateRequest* request,
                                        v1::WriterStateResponse* response) override;

  // This replica's internal address as peers reach it (the writer address decode replicas
  // ask): set once the server listens, before it is registered.
  void SetAddress(std::string address);
  // Random, fixed for the process: how a decode replica tells this process from a later
  // one on the same address.
  uint64_t incarnation() const { return incarnation_; }
  // Shutdown, before the server stops listening (a closed port tells decode replicas this
  // process is gone): new Prefill calls are refused (UNAVAILABLE), then WaitForWritesToEnd
  // waits until no call holds writes (false: `deadline` passed first).
  void StopAccepting() { accepting_ = false; }
  bool WaitForWritesToEnd(std::chrono::steady_clock::time_point deadline) { return writers_.WaitEmpty(deadline); }
  const KvWriterRegistry& writers() const { return writers_; }

  // The kvstore tier (prefix_tier.h): fetch cached prefixes before computing, offload new
  // blocks after. Null (the default): none. Set before serving; must outlive the service.
  void SetPrefixStore(PrefixStore* store) { prefix_store_ = store; }

 private:
  Engine* engine_;
  KvTransport* transport_;
  std::shared_ptr<KvWriteNotices> notices_;
  OnTransfer on_transfer_;
  KvTransferMode mode_;
  PrefixStore* prefix_store_ = nullptr;
  const uint64_t incarnation_;
  KvWriterRegistry writers_;
  std::atomic<bool> accepting_{true};
  std::mutex mu_;
  std::string address_;  // guarded by mu_
};

// Checks that a destination can hold `num_tokens` positions of this engine's KV layout
// (kv_destination.h), its memory descriptor included. Errors: FAILED_PRECONDITION
// (fingerprint or geometry mismatch), INVALID_ARGUMENT (naming the field).
absl::Status CheckDestination(const v1::KvDestination& d, const Engine& engine, int64_t num_tokens);
KvPoolGeometry KvGeometryOf(const v1::KvDestination& d);
// Layouts that are not one latent stream: the destination's KvPool geometry.
KvPool::Geometry StreamGeometryOf(const v1::KvDestination& d);

}  // namespace tandem
