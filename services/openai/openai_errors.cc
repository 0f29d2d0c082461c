#include "services/openai/openai_errors.h"

#include <cctype>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tandem::openai {

std::string ApiError::ToJson() const {
  nlohmann::json error = {{"message", message}, {"type", type}, {"code", http_status}};
  error["param"] = param ? nlohmann::json(*param) : nlohmann::json(nullptr);
  return nlohmann::json{{"error", error}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ApiError InvalidRequest(std::string param, std::string message) {
  return ApiError{.http_status = 400, .type = "invalid_request_error", .message = std::move(message),
                  .param = std::move(param)};
}

std::optional<std::string> ParamOf(std::string_view message) {
  size_t end = 0;
  while (end < message.size() &&
         (std::isalnum(static_cast<unsigned char>(message[end])) || message[end] == '_' || message[end] == '.')) {
    ++end;
  }
  std::string_view field = message.substr(0, end);
  if (field.empty() || end == message.size()) return std::nullopt;
  const char next = message[end];
  if (next != ':' && next != ' ' && next != '[') return std::nullopt;
  // The proto's paths and the engine's names, as OpenAI and vLLM name the fields.
  if (field.substr(0, 9) == "sampling.") field.remove_prefix(9);
  if (field.substr(0, 5) == "stop." && field != "stop.stop") field.remove_prefix(5);
  if (field == "stop.stop") return "stop";
  if (field == "token_ids.ids" || field == "token_ids" || field == "text" || field == "ids") return "prompt";
  if (field == "chat.messages" || field == "chat") return "messages";
  if (field == "chat.tools_json") return "tools";
  if (field == "chat.template_kwargs_json") return "chat_template_kwargs";
  if (field == "logprobs") return "logprobs";
  static constexpr std::string_view kKnown[] = {
      "temperature", "top_p",     "top_k",          "min_p",          "repetition_penalty",
      "presence_penalty", "frequency_penalty", "seed", "max_tokens", "min_tokens",
      "stop",        "stop_token_ids", "ignore_eos", "model",          "prompt",
      "messages",    "request_id", "n",             "logit_bias"};
  for (std::string_view known : kKnown) {
    if (field == known) return std::string(field);
  }
  return std::nullopt;
}

ApiError FromStatus(const absl::Status& status, std::optional<std::chrono::milliseconds> retry_after) {
  ApiError e;
  e.message = std::string(status.message());
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      e.http_status = 400;
      e.type = "invalid_request_error";
      e.param = ParamOf(e.message);
      if (e.param == "model" && absl::StrContains(e.message, "is not served here")) {
        e.http_status = 404;
        e.type = "not_found_error";
      }
      break;
    case absl::StatusCode::kUnauthenticated:
      e.http_status = 401;
      e.type = "authentication_error";
      break;
    case absl::StatusCode::kPermissionDenied:
      e.http_status = 403;
      e.type = "permission_error";
      break;
    case absl::StatusCode::kNotFound:
      e.http_status = 404;
      e.type = "not_found_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.retry_after = retry_after.value_or(std::chrono::milliseconds(1000));
      break;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:  // a KV transfer that failed after retries: transient
      e.http_status = 503;
      e.type = "service_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      e.type = "timeout_error";
      break;
    case absl::StatusCode::kCancelled:
      e.http_status = 499;
      e.type = "cancelled";
      break;
    default:
      e.http_status = 500;
      e.type = "internal_error";
      break;
  }
  return e;
}

}  // namespace tandem::openai
