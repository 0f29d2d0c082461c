#include "services/openai/openai_server.h"

#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/api/proto_convert.h"
#include "spdlog/spdlog.h"

namespace tandem::openai {
namespace {


void Answer(http::Exchange& exchange, int status, const Json& body, http::Headers headers = {}) {
  exchange.Respond(status, "application/json", body.dump(-1, ' ', false, Json::error_handler_t::replace),
                   std::move(headers));
}

void AnswerError(http::Exchange& exchange, const ApiError& e) {
  http::Headers headers;
  if (e.retry_after) {
    headers.emplace_back("Retry-After", std::to_string(std::max<int64_t>(1, (e.retry_after->count() + 999) / 1000)));
  }
  if (e.http_status == 401) headers.emplace_back("WWW-Authenticate", "Bearer");
  exchange.Respond(e.http_status, "application/json", e.ToJson(), std::move(headers));
}

std::optional<Json> ParseBody(const http::Request& request, http::Exchange& exchange) {
  Json body = Json::parse(request.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    AnswerError(exchange, InvalidRequest("", "the request body is not valid JSON"));
    return std::nullopt;
  }
  if (!body.is_object()) {
    AnswerError(exchange, InvalidRequest("", "the request body must be a JSON object"));
    return std::nullopt;
  }
  return body;
}

// A request id: the client's x-request-id when valid, else a new one.
std::string RequestId(const http::Request& request) {
  absl::StatusOr<std::string> id = RequestIdOrNew(std::string(request.Header("x-request-id")));
  if (id.ok()) return *id;
  return *RequestIdOrNew("");
}

}  // namespace

absl::StatusOr<std::unique_ptr<OpenAiServer>> OpenAiServer::Start(const std::string& host_port,
                                                                   const OpenAiServerOptions& options,
                                                                   CompletionContext context, const ModelInfo* config,
                                                                   security::ApiKeyAuthenticator* keys) {
  std::unique_ptr<OpenAiServer> server(new OpenAiServer(options, std::move(context), config, keys));
  OpenAiServer* raw = server.get();
  absl::StatusOr<std::unique_ptr<http::Server>> http = http::Server::Start(
      host_port, options.http,
      [raw](http::Request&& request, std::shared_ptr<http::Exchange> exchange) {
        raw->Handle(std::move(request), std::move(exchange));
      },
      [](const std::string& error) { spdlog::warn("{}", error); });
  if (!http.ok()) return http.status();
  server->server_ = std::move(*http);
  return server;
}

OpenAiServer::~OpenAiServer() { Stop(); }

void OpenAiServer::Stop() {
  if (server_) server_->Stop();
}

void OpenAiServer::Handle(http::Request&& request, std::shared_ptr<http::Exchange> exchange) {
  const std::string_view path = request.Path();
  const bool get = request.method == "GET" || request.method == "HEAD";
  const bool post = request.method == "POST";
  // Open: health for load balancers, as vLLM's /health.
  if (path == "/health") {
    if (!get) return AnswerError(*exchange, ApiError{.http_status = 405, .type = "invalid_request_error",
                                                     .message = "use GET"});
    return exchange->Respond(200, "", "");
  }
  enum class Route { kModels, kCompletions, kChat, kTokenize, kDetokenize };
  std::optional<Route> route;
  bool method_ok = false;
  if (path == "/v1/models") route = Route::kModels, method_ok = get;
  if (path == "/v1/completions") route = Route::kCompletions, method_ok = post;
  if (path == "/v1/chat/completions") route = Route::kChat, method_ok = post;
  if (path == "/tokenize") route = Route::kTokenize, method_ok = post;
  if (path == "/detokenize") route = Route::kDetokenize, method_ok = post;
  if (!route) {
    return AnswerError(*exchange, ApiError{.http_status = 404, .type = "not_found_error",
                                           .message = absl::StrCat("no endpoint ", std::string(path))});
  }
  if (!method_ok) {
    return AnswerError(*exchange, ApiError{.http_status = 405, .type = "invalid_request_error",
                                           .message = absl::StrCat(std::string(path), ": method ", request.method, " not allowed")});
  }
  if (keys_ != nullptr) {
    // Generation takes from the key's rate; reading the model list or tokenizing only
    // needs a valid key.
    const bool serves_work = route == Route::kCompletions || route == Route::kChat;
    security::ApiKeyDecision d = serves_work ? keys_->Authorize(request.Header("authorization"))
                                             : keys_->Authenticate(request.Header("authorization"));
    if (!d.status.ok()) return AnswerError(*exchange, FromStatus(d.status, d.retry_after));
  }
  if (route == Route::kModels) {
    Json model = {{"id", context_.served_model}, {"object", "model"}, {"created", context_.unix_seconds()},
                  {"owned_by", "tandem"}, {"root", context_.served_model}, {"parent", nullptr},
                  {"max_model_len", context_.context_tokens}};
    return Answer(*exchange, 200, {{"object", "list"}, {"data", Json::array({model})}});
  }
  const std::string content_type = absl::AsciiStrToLower(std::string(request.Header("content-type")));
  if (!content_type.empty() && !absl::StrContains(content_type, "application/json")) {
    return AnswerError(*exchange, ApiError{.http_status = 415, .type = "invalid_request_error",
                                           .message = "Content-Type must be application/json"});
  }
  std::optional<Json> body = ParseBody(request, *exchange);
  if (!body) return;
  if (route == Route::kTokenize && body->contains("messages")) {
    // vLLM's chat form: the messages (and tools) rendered as a chat completion renders them.
    if (body->contains("add_generation_prompt") && (*body)["add_generation_prompt"] != true) {
      return AnswerError(*exchange, InvalidRequest("add_generation_prompt", "add_generation_prompt: only true is supported"));
    }
    v1::GenerateRequest r;
    ChatOptions ignored;
    if (std::optional<ApiError> e = ParseChat(*body, &r, &ignored)) return AnswerError(*exchange, *e);
    absl::StatusOr<std::vector<int32_t>> ids = PromptTokens(r, *context_.tokenizer, context_.vocab_size,
                                                            context_.max_prompt_bytes, context_.core->chat_templates);
    if (!ids.ok()) return AnswerError(*exchange, FromStatus(ids.status()));
    return Answer(*exchange, 200, {{"tokens", *ids}, {"count", ids->size()}, {"max_model_len", context_.context_tokens}});
  }
  if (route == Route::kTokenize) {
    const Json* prompt = body->contains("prompt") ? &(*body)["prompt"] : nullptr;
    if (prompt == nullptr || !prompt->is_string()) {
      return AnswerError(*exchange, InvalidRequest("prompt", "prompt: must be a string"));
    }
    bool add_special = true;
    if (body->contains("add_special_tokens")) {
      if (!(*body)["add_special_tokens"].is_boolean()) {
        return AnswerError(*exchange, InvalidRequest("add_special_tokens", "add_special_tokens: must be a boolean"));
      }
      add_special = (*body)["add_special_tokens"].get<bool>();
    }
    const std::string text = prompt->get<std::string>();
    if (absl::Status s = CheckPromptBytes(static_cast<int64_t>(text.size()), context_.max_prompt_bytes); !s.ok()) {
      return AnswerError(*exchange, InvalidRequest("prompt", std::string(s.message())));
    }
    absl::StatusOr<std::vector<int32_t>> ids = context_.tokenizer->TryEncode(text, add_special);
    if (!ids.ok()) return AnswerError(*exchange, InvalidRequest("prompt", std::string(ids.status().message())));
    return Answer(*exchange, 200, {{"tokens", *ids}, {"count", ids->size()}, {"max_model_len", context_.context_tokens}});
  }
  if (route == Route::kDetokenize) {
    const Json* tokens = body->contains("tokens") ? &(*body)["tokens"] : nullptr;
    if (tokens == nullptr || !tokens->is_array()) {
      return AnswerError(*exchange, InvalidRequest("tokens", "tokens: must be a list of token ids"));
    }
    std::vector<int32_t> ids;
    for (const Json& id : *tokens) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= context_.vocab_size) {
        return AnswerError(*exchange, InvalidRequest("tokens", absl::StrCat("tokens: each must be an id in [0, ",
                                                                            context_.vocab_size, ")")));
      }
      ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    return Answer(*exchange, 200, {{"prompt", context_.tokenizer->Decode(ids, false)}});
  }
  std::variant<ParsedRequest, ApiError> parsed =
      ParseRequest(route == Route::kChat ? Endpoint::kChat : Endpoint::kCompletions, *body, options_.limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return AnswerError(*exchange, *e);
  StartCompletion(context_, std::move(std::get<ParsedRequest>(parsed)), RequestId(request), std::move(exchange));
}

}  // namespace tandem::openai
