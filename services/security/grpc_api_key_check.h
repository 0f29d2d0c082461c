// The API key check at the entry of a public gRPC handler: reads the call's
// `authorization` metadata and, on refusal, sets what the client needs to see (the
// grpc-retry-pushback-ms trailer of a key over its rate, as admission control does).
#pragma once

#include <grpcpp/grpcpp.h>

#include "services/security/api_key_authenticator.h"

namespace tandem::security {

// OK when `keys` is null (no --api-keys-file: the API is open) or the call carries a
// known key within its rate; otherwise the status to finish the call with
// (UNAUTHENTICATED, or RESOURCE_EXHAUSTED with the trailer added to `ctx`).
grpc::Status CheckApiKey(ApiKeyAuthenticator* keys, grpc::CallbackServerContext* ctx);

// A server-streaming reactor that only finishes with `status` (a refused call).
template <typename Response>
class RefusedWriteReactor final : public grpc::ServerWriteReactor<Response> {
 public:
  explicit RefusedWriteReactor(grpc::Status status) { this->Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace tandem::security
