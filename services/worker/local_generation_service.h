// tandem.v1.Generation served by a local engine: what an aggregated (`--role both`)
// worker exposes, and the direct path the router's overhead benchmark compares against.
#pragma once

#include <string>

#include "engine/runtime/engine.h"
#include "services/api/generation_helpers.h"
#include "services/api/proto_convert.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem {

class LocalGenerationService final : public v1::Generation::CallbackService {
 public:
  // `engine` (and `chat_templates`, the model's, null when it has none) must outlive the
  // service. `model_name` is what ListModels reports. Prompts (and Tokenize inputs) of
  // more than `max_prompt_bytes` are refused untokenized.
  LocalGenerationService(Engine* engine, const ModelChatTemplates* chat_templates, std::string model_name,
                         int64_t max_prompt_bytes = kDefaultMaxPromptBytes);

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                           const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* ctx, const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* ctx, const v1::ListModelsRequest* request,
                                       v1::ListModelsResponse* response) override;

 private:
  Engine* engine_;
  const ModelChatTemplates* chat_templates_;
  std::string model_name_;
  int64_t max_prompt_bytes_;
};

}  // namespace tandem
