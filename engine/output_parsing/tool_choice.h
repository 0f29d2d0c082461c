// The request's `tools` and `tool_choice` (OpenAI chat completions), for the HTTP layer:
// whether to parse tool calls at all, and after the output ended whether `required` or a
// named function was honoured. Only checked after the fact here; steering the model into
// a call (constrained decoding) is a separate piece.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/output_parsing/output_delta.h"
#include "nlohmann/json.hpp"

namespace tandem::output_parsing {

enum class ToolChoiceMode {
  kNone,      // never call a tool: tool calls are not parsed, markers stay content
  kAuto,      // the model decides
  kRequired,  // at least one call
  kNamed,     // at least one call, every call to `function_name`
};

struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::kNone;
  std::string function_name;        // kNamed only
  std::vector<std::string> tool_names;  // the request's functions, in order

  // Whether ChatOutputOptions::tool_call_parser should be set for this request.
  bool parse_tool_calls() const { return mode != ToolChoiceMode::kNone; }
};

// Reads the request's `tools` and `tool_choice`; pass a null json for one that is absent
// (or null). As OpenAI: absent tool_choice is "auto" when tools are given, else "none".
// InvalidArgument, the message starting with the offending field ("tools[1].function.name:
// ..."), for: tools not an array of {"type": "function", "function": {"name": non-empty
// string, ...}} (type may be omitted); tool_choice not "none" | "auto" | "required" |
// {"type": "function", "function": {"name": ...}}; "required" or a name without tools; a
// name that is not among the tools. "auto" without tools means "none".
absl::StatusOr<ToolChoice> ResolveToolChoice(const nlohmann::json& tools, const nlohmann::json& tool_choice);

// After the output ended: OK for none and auto; for required, FailedPrecondition unless
// at least one call is complete; for a name, unless at least one is and every complete
// call is to that function. The message says what the model produced instead (and the
// tool-call status when a call was malformed or cut off).
absl::Status CheckToolChoiceSatisfied(const ToolChoice& choice, const ParsedChatOutput& output);

}  // namespace tandem::output_parsing
