// Errors of the OpenAI-compatible API in OpenAI's nested form:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": <http status>}}
// and the mapping from the request core's statuses (whose INVALID_ARGUMENT messages name
// the engine's or the proto's field: "temperature must be in ...", "stop.max_tokens: ...")
// to HTTP statuses and OpenAI's field names.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace tandem::openai {

struct ApiError {
  int http_status = 500;
  std::string type;  // invalid_request_error, authentication_error, ...
  std::string message;
  std::optional<std::string> param;  // the request field at fault
  std::optional<std::chrono::milliseconds> retry_after;  // 429: sent as Retry-After

  std::string ToJson() const;
};

// 400 with `param` named.
ApiError InvalidRequest(std::string param, std::string message);

// A status from the request core, the tokenizer or the API key check. INVALID_ARGUMENT
// 400 (param from the message's leading field name, as OpenAI names it), UNAUTHENTICATED
// 401, PERMISSION_DENIED 403, NOT_FOUND 404, RESOURCE_EXHAUSTED 429, UNAVAILABLE and
// ABORTED (a KV transfer that failed after retries) 503,
// DEADLINE_EXCEEDED 504, CANCELLED 499, anything else 500.
ApiError FromStatus(const absl::Status& status, std::optional<std::chrono::milliseconds> retry_after = std::nullopt);

// OpenAI's name for the field a core message starts with ("sampling.top_p" -> "top_p",
// "stop.max_tokens" -> "max_tokens", "token_ids.ids" -> "prompt", "chat.messages[1]" ->
// "messages"), or nullopt when the message names none.
std::optional<std::string> ParamOf(std::string_view message);

}  // namespace tandem::openai
