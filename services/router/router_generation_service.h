// tandem.v1.Generation on the router: Generate through the cluster (grpc_generate_reactor.h
// over services/api/request_core.h);
// Tokenize, Detokenize and ListModels answered locally from the model's tokenizer.
#pragma once

#include "services/router/grpc_generate_reactor.h"
#include "services/security/api_key_authenticator.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem {

class RouterGenerationService final : public v1::Generation::CallbackService {
 public:
  // `api_keys` (may be null: the API is open) is checked at the entry of every method,
  // before any work: a refused call ends UNAUTHENTICATED or RESOURCE_EXHAUSTED.
  explicit RouterGenerationService(RouterContext context, security::ApiKeyAuthenticator* api_keys = nullptr)
      : context_(std::move(context)), core_(context_), api_keys_(api_keys) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                           const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* ctx, const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  // The request core Generate uses, shared with the HTTP front end.
  const RouterCore& core() const { return core_; }

  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* ctx, const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;

 private:
  RouterContext context_;
  RouterCore core_;  // after context_
  security::ApiKeyAuthenticator* api_keys_;
};

}  // namespace tandem
