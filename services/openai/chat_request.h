// The chat half of a /v1/chat/completions body: messages (system, developer, user,
// assistant with tool_calls, tool results), tools, tool_choice and chat_template_kwargs,
// into the canonical request's chat prompt (tandem.v1.ChatMessages), which the request
// core renders with the model's chat template. Also read by POST /tokenize.
#pragma once

#include <optional>

#include "services/openai/json_fields.h"
#include "services/openai/openai_errors.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::openai {

struct ChatOptions {
  // chat_template_kwargs.thinking (or enable_thinking): the prompt opens a reasoning
  // block, so the output starts inside it.
  bool thinking = false;
  // Tools were offered and tool_choice is not "none": the output is parsed for calls.
  bool parse_tool_calls = false;
};

// Sets `r`'s chat prompt. tool_choice "none" keeps the tools in the prompt (as vLLM
// does) but leaves the output unparsed; "required" and a named function need
// constrained decoding and are refused (400) until Tandem has it. Errors: a 400 naming
// the field ("messages[2].tool_calls[0].function.name", "tools[1].function", ...).
std::optional<ApiError> ParseChat(const Json& body, v1::GenerateRequest* r, ChatOptions* out);

}  // namespace tandem::openai
