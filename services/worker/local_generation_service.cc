#include "services/worker/local_generation_service.h"

#include "absl/strings/str_cat.h"
#include "services/api/grpc_status.h"
#include "services/api/proto_convert.h"
#include "services/worker/engine_stream_reactor.h"

namespace tandem {

LocalGenerationService::LocalGenerationService(Engine* engine, const ModelChatTemplates* chat_templates,
                                               std::string model_name, int64_t max_prompt_bytes)
    : engine_(engine),
      chat_templates_(chat_templates),
      model_name_(std::move(model_name)),
      max_prompt_bytes_(max_prompt_bytes) {}

grpc::ServerWriteReactor<v1::GenerateResponse>* LocalGenerationService::Generate(grpc::CallbackServerContext* ctx,
                                                                                const v1::GenerateRequest* r) {
  const int64_t vocab = engine_->config().vocab_size;
  if (absl::Status s = CheckModelName(r->model(), model_name_); !s.ok()) {
    return EngineStreamReactor::Failed(ToGrpcStatus(s));
  }
  absl::StatusOr<std::string> id = RequestIdOrNew(r->request_id());
  absl::StatusOr<std::vector<int32_t>> prompt =
      PromptTokens(*r, engine_->tokenizer(), vocab, max_prompt_bytes_, chat_templates_);
  absl::StatusOr<SamplingParams> sampling = FromProto(r->sampling(), vocab);
  absl::StatusOr<StopParams> stop = FromProto(r->stop(), vocab);
  absl::StatusOr<OutputConstraint> constraint = FromProto(r->constraint());
  for (const absl::Status* s :
       {&id.status(), &prompt.status(), &sampling.status(), &stop.status(), &constraint.status()}) {
    if (!s->ok()) return EngineStreamReactor::Failed(ToGrpcStatus(*s));
  }
  if (absl::Status s = CheckLength(prompt->size(), *stop, engine_->config().max_position_embeddings); !s.ok()) {
    return EngineStreamReactor::Failed(ToGrpcStatus(s));
  }
  ctx->AddInitialMetadata("x-request-id", *id);
  EngineRequest req{.id = *id, .prompt = std::move(*prompt), .sampling = *sampling, .stop = std::move(*stop)};
  req.constraint = std::move(*constraint);
  absl::StatusOr<std::shared_ptr<OutputStream>> stream = engine_->Submit(std::move(req));
  if (!stream.ok()) return EngineStreamReactor::Failed(ToGrpcStatus(stream.status()));
  return EngineStreamReactor::Start(engine_, *id, std::move(*stream));
}

grpc::ServerUnaryReactor* LocalGenerationService::Tokenize(grpc::CallbackServerContext* ctx,
                                                           const v1::TokenizeRequest* r, v1::TokenizeResponse* out) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(
      ToGrpcStatus(TokenizeInto(*r, engine_->tokenizer(), chat_templates_, model_name_, max_prompt_bytes_, out)));
  return reactor;
}

grpc::ServerUnaryReactor* LocalGenerationService::Detokenize(grpc::CallbackServerContext* ctx,
                                                             const v1::DetokenizeRequest* r,
                                                             v1::DetokenizeResponse* out) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(DetokenizeInto(*r, engine_->tokenizer(), engine_->config().vocab_size, model_name_, out)));
  return reactor;
}

grpc::ServerUnaryReactor* LocalGenerationService::ListModels(grpc::CallbackServerContext* ctx,
                                                             const v1::ListModelsRequest*, v1::ListModelsResponse* out) {
  ListModelsInto(engine_->config(), model_name_, out);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem
