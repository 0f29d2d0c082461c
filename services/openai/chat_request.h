// The chat half of a /v1/chat/completions body: messages (system, developer, user,
// assistant with tool_calls, tool results), tools, tool_choice and chat_template_kwargs,
// into the canonical request's chat prompt (tandem.v1.ChatMessages), which the request
// core renders with the model's chat template. Also read by POST /tokenize.
#pragma once

#include <optional>

#include "services/openai/json_fields.h"
#include "services/openai/openai_errors.h"
#include "services/openai/tool_choice_constraint.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::openai {

struct ChatOptions {
  // chat_template_kwargs.thinking (or enable_thinking): the prompt opens a reasoning
  // block, so the output starts inside it.
  bool thinking = false;
  // Tools were offered and tool_choice is not "none": the output is parsed for calls.
  bool parse_tool_calls = false;
  // tool_choice "required" or a named function: the calls the output is constrained to,
  // once the tool-call format is known (tool_choice_constraint.h). A named function is
  // one call; "required" one or more, unless parallel_tool_calls is false.
  std::optional<RequiredToolCalls> required_calls;
};

// Sets `r`'s chat prompt. tool_choice "none" keeps the tools in the prompt (as vLLM
// does) but leaves the output unparsed. Errors: a 400 naming the field
// ("messages[2].tool_calls[0].function.name", "tools[1].function", "tool_choice.function.name"
// for a function no tool has, ...).
std::optional<ApiError> ParseChat(const Json& body, v1::GenerateRequest* r, ChatOptions* out);

}  // namespace tandem::openai
