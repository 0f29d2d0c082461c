// tandem.v1.Prefill on a local engine: prefill-only requests whose KV goes, layer by
// layer as it is computed, into the decode replica's blocks named in the request.
#pragma once

#include "engine/runtime/engine.h"
#include "services/worker/kv_transport.h"
#include "tandem/v1/internal.grpc.pb.h"

namespace tandem {

class PrefillServiceImpl final : public v1::Prefill::CallbackService {
 public:
  // `engine` and `transport` must outlive the service.
  PrefillServiceImpl(Engine* engine, KvTransport* transport) : engine_(engine), transport_(transport) {}

  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* ctx, const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;

 private:
  Engine* engine_;
  KvTransport* transport_;
};

// Checks that a destination can hold `num_tokens` positions of this engine's KV layout.
// Errors: FAILED_PRECONDITION (fingerprint or geometry mismatch), INVALID_ARGUMENT.
absl::Status CheckDestination(const v1::KvDestination& d, const Engine& engine, int64_t num_tokens);

}  // namespace tandem
