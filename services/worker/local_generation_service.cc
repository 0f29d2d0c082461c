#include "services/worker/local_generation_service.h"

#include "absl/strings/str_cat.h"
#include "services/api/grpc_status.h"
#include "services/api/proto_convert.h"
#include "services/worker/engine_stream_reactor.h"

namespace tandem {

absl::Status CheckModelName(const std::string& requested, const std::string& served) {
  if (requested.empty() || requested == served) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("model: '", requested, "' is not served here (serving '", served, "')"));
}

absl::Status TokenizeInto(const v1::TokenizeRequest& r, const Tokenizer& tokenizer, const std::string& model_name,
                          v1::TokenizeResponse* out) {
  if (absl::Status s = CheckModelName(r.model(), model_name); !s.ok()) return s;
  const bool special = !r.has_add_special_tokens() || r.add_special_tokens();
  std::string text;
  if (r.input_case() == v1::TokenizeRequest::kChat) {
    absl::StatusOr<std::string> chat = FormatChat(r.chat(), tokenizer);
    if (!chat.ok()) return chat.status();
    text = *chat;
  } else {
    text = r.text();
  }
  for (int32_t id : tokenizer.Encode(text, special)) out->add_ids(id);
  return absl::OkStatus();
}

absl::Status DetokenizeInto(const v1::DetokenizeRequest& r, const Tokenizer& tokenizer, int64_t vocab_size,
                            const std::string& model_name, v1::DetokenizeResponse* out) {
  if (absl::Status s = CheckModelName(r.model(), model_name); !s.ok()) return s;
  std::vector<int32_t> ids(r.ids().begin(), r.ids().end());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("ids[", i, "]: ", ids[i], " is outside the vocabulary"));
    }
  }
  out->set_text(tokenizer.Decode(ids, r.skip_special_tokens()));
  return absl::OkStatus();
}

void ListModelsInto(const ModelConfig& config, const std::string& model_name, v1::ListModelsResponse* out) {
  v1::ModelInfo* m = out->add_models();
  m->set_id(model_name);
  m->set_model_type(config.model_type);
  m->set_max_context(config.max_position_embeddings);
  m->set_vocab_size(config.vocab_size);
}

LocalGenerationService::LocalGenerationService(Engine* engine, std::string model_name)
    : engine_(engine), model_name_(std::move(model_name)) {}

grpc::ServerWriteReactor<v1::GenerateResponse>* LocalGenerationService::Generate(grpc::CallbackServerContext* ctx,
                                                                                const v1::GenerateRequest* r) {
  const int64_t vocab = engine_->config().vocab_size;
  if (absl::Status s = CheckModelName(r->model(), model_name_); !s.ok()) {
    return EngineStreamReactor::Failed(ToGrpcStatus(s));
  }
  absl::StatusOr<std::string> id = RequestIdOrNew(r->request_id());
  absl::StatusOr<std::vector<int32_t>> prompt = PromptTokens(*r, engine_->tokenizer(), vocab);
  absl::StatusOr<SamplingParams> sampling = FromProto(r->sampling(), vocab);
  absl::StatusOr<StopParams> stop = FromProto(r->stop(), vocab);
  for (const absl::Status* s : {&id.status(), &prompt.status(), &sampling.status(), &stop.status()}) {
    if (!s->ok()) return EngineStreamReactor::Failed(ToGrpcStatus(*s));
  }
  ctx->AddInitialMetadata("x-request-id", *id);
  EngineRequest req{.id = *id, .prompt = std::move(*prompt), .sampling = *sampling, .stop = std::move(*stop)};
  absl::StatusOr<std::shared_ptr<OutputStream>> stream = engine_->Submit(std::move(req));
  if (!stream.ok()) return EngineStreamReactor::Failed(ToGrpcStatus(stream.status()));
  return EngineStreamReactor::Start(engine_, *id, std::move(*stream));
}

grpc::ServerUnaryReactor* LocalGenerationService::Tokenize(grpc::CallbackServerContext* ctx,
                                                           const v1::TokenizeRequest* r, v1::TokenizeResponse* out) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(TokenizeInto(*r, engine_->tokenizer(), model_name_, out)));
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
