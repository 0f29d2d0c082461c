#include "services/router/router_generation_service.h"

#include "services/api/generation_helpers.h"
#include "services/api/grpc_status.h"

namespace tandem {

grpc::ServerWriteReactor<v1::GenerateResponse>* RouterGenerationService::Generate(grpc::CallbackServerContext* ctx,
                                                                                 const v1::GenerateRequest* r) {
  return RoutedGenerate::Start(context_, ctx, r);
}

grpc::ServerUnaryReactor* RouterGenerationService::Tokenize(grpc::CallbackServerContext* ctx,
                                                            const v1::TokenizeRequest* r, v1::TokenizeResponse* out) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(
      ToGrpcStatus(TokenizeInto(*r, *context_.tokenizer, context_.model_name, context_.max_prompt_bytes, out)));
  return reactor;
}

grpc::ServerUnaryReactor* RouterGenerationService::Detokenize(grpc::CallbackServerContext* ctx,
                                                              const v1::DetokenizeRequest* r,
                                                              v1::DetokenizeResponse* out) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(
      ToGrpcStatus(DetokenizeInto(*r, *context_.tokenizer, context_.config->vocab_size, context_.model_name, out)));
  return reactor;
}

grpc::ServerUnaryReactor* RouterGenerationService::ListModels(grpc::CallbackServerContext* ctx,
                                                              const v1::ListModelsRequest*,
                                                              v1::ListModelsResponse* out) {
  ListModelsInto(*context_.config, context_.model_name, out);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem
