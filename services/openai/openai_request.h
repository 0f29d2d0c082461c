// The body of POST /v1/completions and /v1/chat/completions, as OpenAI and vLLM define
// it, turned into the router's canonical request (tandem.v1.GenerateRequest, one per
// prompt) plus what only this front end does (n choices, streaming options, the
// logprobs format). Wrong types and values are a 400 naming the field; unknown fields
// are ignored, as OpenAI's and vLLM's servers do.
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "services/openai/chat_request.h"
#include "services/openai/openai_errors.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::openai {

enum class Endpoint { kCompletions, kChat };

struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // as the client named it (echoed in responses); may be empty
  // One per prompt (a completions request may carry several); each is answered by `n`
  // choices. Their prompts are still text or chat: the front end tokenizes them.
  std::vector<v1::GenerateRequest> prompts;
  // max_tokens / max_completion_tokens as given; unset: the rest of the context.
  std::optional<int> max_tokens;
  int n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Chat: logprobs (bool) with top_logprobs; completions: logprobs N (the chosen token
  // and N alternatives).
  bool logprobs = false;
  int top_logprobs = 0;
  // Chat: whether reasoning goes out (include_reasoning), and what the chat fields
  // decided (chat_request.h).
  bool include_reasoning = true;
  ChatOptions chat;
};

struct ParseLimits {
  int max_n = 64;
  int max_prompts = 64;  // completions' prompt arrays
};

// The request, or the 400 to answer.
std::variant<ParsedRequest, ApiError> ParseRequest(Endpoint endpoint, const Json& body,
                                                    const ParseLimits& limits);

}  // namespace tandem::openai
