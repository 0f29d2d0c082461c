// tandem.v1.Prefill on a local engine: prefill-only requests whose KV goes, layer by
// layer as it is computed, into the decode replica's blocks named in the request: device
// to device when the destination offers its GPU pool and this replica can map it
// (DeviceKvSink), else through the transfer layer (TransferKvSink).
#pragma once

#include <functional>

#include "engine/runtime/engine.h"
#include "services/kvstore/prefix_store.h"
#include "services/worker/kv_transfer_mode.h"
#include "services/prefill/kv_destination.h"
#include "services/worker/kv_transport.h"
#include "tandem/v1/internal.grpc.pb.h"

namespace tandem {

class PrefillServiceImpl final : public v1::Prefill::CallbackService {
 public:
  // `engine` and `transport` must outlive the service.
  // `on_transfer(seconds, bytes, ok, path)` is told about each request's KV transfer
  // (metrics; path "transfer" or "cuda_ipc").
  using OnTransfer = std::function<void(double, int64_t, bool, const std::string&)>;
  PrefillServiceImpl(Engine* engine, KvTransport* transport, OnTransfer on_transfer = nullptr,
                     KvTransferMode mode = KvTransferMode::kAuto)
      : engine_(engine), transport_(transport), on_transfer_(std::move(on_transfer)), mode_(mode) {}

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* ctx, const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;

  // The kvstore tier (prefix_tier.h): fetch cached prefixes before computing, offload new
  // blocks after. Null (the default): none. Set before serving; must outlive the service.
  void SetPrefixStore(PrefixStore* store) { prefix_store_ = store; }

 private:
  Engine* engine_;
  KvTransport* transport_;
  OnTransfer on_transfer_;
  KvTransferMode mode_;
  PrefixStore* prefix_store_ = nullptr;
};

// Checks that a destination can hold `num_tokens` positions of this engine's KV layout
// (kv_destination.h), its memory descriptor included. Errors: FAILED_PRECONDITION
// (fingerprint or geometry mismatch), INVALID_ARGUMENT (naming the field).
absl::Status CheckDestination(const v1::KvDestination& d, const Engine& engine, int64_t num_tokens);
KvPoolGeometry KvGeometryOf(const v1::KvDestination& d);

}  // namespace tandem
