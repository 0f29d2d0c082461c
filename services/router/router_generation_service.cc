#include "services/router/router_generation_service.h"

#include "services/api/generation_helpers.h"
#include "services/api/grpc_status.h"
#include "services/security/grpc_api_key_check.h"

namespace tandem {

grpc::ServerWriteReactor<v1::GenerateResponse>* RouterGenerationService::Generate(grpc::CallbackServerContext* ctx,
                                                                                 const v1::GenerateRequest* r) {
  if (grpc::Status s = security::CheckApiKey(api_keys_, ctx); !s.ok()) {
    return new security::RefusedWriteReactor<v1::GenerateResponse>(std::move(s));
  }
  return GrpcGenerateReactor::Start(core_, ctx, r);
}

grpc::ServerUnaryReactor* RouterGenerationService::Tokenize(grpc::CallbackServerContext* ctx,
                                                            const v1::TokenizeRequest* r, v1::TokenizeResponse* out) {
  if (grpc::Status s = security::CheckApiKey(api_keys_, ctx); !s.ok()) {
    auto* refused = ctx->DefaultReactor();
    refused->Finish(std::move(s));
    return refused;
  }
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(
      ToGrpcStatus(TokenizeInto(*r, *context_.tokenizer, context_.chat_templates, context_.model_name,
                                context_.max_prompt_bytes, out)));
  return reactor;
}

grpc::ServerUnaryReactor* RouterGenerationService::Detokenize(grpc::CallbackServerContext* ctx,
                                                              const v1::DetokenizeRequest* r,
                                                              v1::DetokenizeResponse* out) {
  if (grpc::Status s = security::CheckApiKey(api_keys_, ctx); !s.ok()) {
    auto* refused = ctx->DefaultReactor();
    refused->Finish(std::move(s));
    return refused;
  }
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(
      ToGrpcStatus(DetokenizeInto(*r, *context_.tokenizer, context_.config->vocab_size, context_.model_name, out)));
  return reactor;
}

grpc::ServerUnaryReactor* RouterGenerationService::ListModels(grpc::CallbackServerContext* ctx,
                                                              const v1::ListModelsRequest*,
                                                              v1::ListModelsResponse* out) {
  if (grpc::Status s = security::CheckApiKey(api_keys_, ctx); !s.ok()) {
    auto* refused = ctx->DefaultReactor();
    refused->Finish(std::move(s));
    return refused;
  }
  ListModelsInto(*context_.config, context_.model_name, out);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem
