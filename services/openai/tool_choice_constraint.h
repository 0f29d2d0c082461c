// tool_choice "required" and a named function, enforced: the output is constrained to
// tool calls in the model's own format (the one --tool-call-parser reads), each naming a
// callable tool and carrying arguments valid by that tool's `parameters` schema, so
// that the parser turns it into `tool_calls` (finish_reason "tool_calls").
//
// The constraint is an EBNF grammar whose markers are token terminals (the formats'
// markers are added tokens: ebnf_parser.h) and whose arguments are JSON schema rules
// (EbnfGrammar.json_rules), compiled by the workers like any other constraint. For
// DeepSeek-V3 ("deepseek_v3"), with parallel calls allowed:
//
//   root ::= <｜tool▁calls▁begin｜> call ("\n" call)* <｜tool▁calls▁end｜>
//   call ::= <｜tool▁call▁begin｜> "function" <｜tool▁sep｜>
//            ("get_weather\n```json\n" tools-0-parameters | ...) "\n```" <｜tool▁call▁end｜>
//
// and for V3.1 ("deepseek_v31") the same without the type, fence and newlines, the name
// before <｜tool▁sep｜>. A call's arguments are never empty text: a tool without
// parameters takes any JSON object. The model writes no text besides the calls, and
// the reasoning before them for a model that reasons first.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "services/openai/json_fields.h"
#include "services/openai/openai_errors.h"
#include "tandem/v1/generation.pb.h"

namespace tandem::openai {

struct CallableTool {
  int index = 0;  // in the request's tools
  std::string name;
  // The JSON schema text of the arguments: `parameters` narrowed to objects (the format
  // carries an object), {"type": "object"} when absent.
  std::string parameters;
  bool strict = false;  // function.strict
};

// What a request's tool_choice requires of the output.
struct RequiredToolCalls {
  std::vector<CallableTool> tools;  // every tool for "required", the named one otherwise
  bool single = false;              // exactly one call: a named function, or parallel_tool_calls false
};

// The tools a call may name, read from the request's validated `tools` (chat_request.cc
// checks their shape). `named` empty: every tool. Errors: 400 for a `parameters` schema
// that does not describe objects, or a name the formats cannot carry (whitespace,
// control characters or '<', which end a name there).
std::optional<ApiError> ReadCallableTools(const Json& tools, std::string_view named, RequiredToolCalls* out);

// A model whose output starts inside reasoning (R1, V3.1 thinking).
struct ReasoningFirst {
  bool on = false;
  bool end_is_a_token = false;  // the vocabulary has "</think>" as an added or special token
};

// The constraint for `calls` in the format of `tool_call_parser` (a registered name, or
// empty when the router parses no tool calls). With `reasoning.on` the calls come after
// free reasoning text and its end, "</think>" (its token or its text; the reasoning text
// never contains it, so that the reasoning parser ends reasoning exactly there) and up
// to two newlines. Errors: 400 when that parser has no format to constrain to (or
// none is configured).
std::optional<ApiError> ToolCallConstraint(const RequiredToolCalls& calls, std::string_view tool_call_parser,
                                           v1::Constraint* out, const ReasoningFirst& reasoning = {});

}  // namespace tandem::openai
