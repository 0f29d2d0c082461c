// tandem.v1.Generation served by a local engine: what an aggregated (`--role both`)
// worker exposes, and the direct path the router's overhead benchmark compares against.
#pragma once

#include <string>

#include "engine/runtime/engine.h"
#include "tandem/v1/generation.grpc.pb.h"

namespace tandem {

class LocalGenerationService final : public v1::Generation::CallbackService {
 public:
  // `engine` must outlive the service. `model_name` is what ListModels reports.
  LocalGenerationService(Engine* engine, std::string model_name);

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
  std::string model_name_;
};

// Shared by every Generation implementation: model-name check, tokenize/detokenize and
// the model list, against a tokenizer and config.
absl::Status CheckModelName(const std::string& requested, const std::string& served);
absl::Status TokenizeInto(const v1::TokenizeRequest& r, const Tokenizer& tokenizer, const std::string& model_name,
                          v1::TokenizeResponse* out);
absl::Status DetokenizeInto(const v1::DetokenizeRequest& r, const Tokenizer& tokenizer, int64_t vocab_size,
                            const std::string& model_name, v1::DetokenizeResponse* out);
void ListModelsInto(const ModelConfig& config, const std::string& model_name, v1::ListModelsResponse* out);

}  // namespace tandem
