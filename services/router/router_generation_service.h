// tandem.v1.Generation on the router: Generate through the cluster (routed_generate.h);
// Tokenize, Detokenize and ListModels answered locally from the model's tokenizer.
#pragma once

#include "services/router/routed_generate.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem {

class RouterGenerationService final : public v1::Generation::CallbackService {
 public:
  explicit RouterGenerationService(RouterContext context) : context_(std::move(context)) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                           const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* ctx, const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* ctx, const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;

 private:
  RouterContext context_;
};

}  // namespace tandem
