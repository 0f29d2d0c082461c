#include "services/openai/tool_choice_constraint.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "engine/output_parsing/deepseek_tool_call_parser.h"

namespace tandem::openai {
namespace {

namespace op = output_parsing;

// abseil here has its own string_view; StrCat takes that one.
absl::string_view A(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// An EBNF literal of `text` (valid UTF-8).
std::string Literal(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    const auto b = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (b < 0x20 || b == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02X", b);
      out += hex;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// The EBNF token terminal of a marker: its content as written (every marker here is
// "<...>" without whitespace or quotes).
std::string Token(std::string_view marker) { return std::string(marker); }

// A name the formats can carry: both parsers end a name at whitespace or '<'.
bool CarriableName(std::string_view name) {
  for (char c : name) {
    const auto b = static_cast<unsigned char>(c);
    if (b <= 0x20 || b == 0x7F || c == '<') return false;
  }
  return !name.empty();
}

std::string RuleOf(const CallableTool& t) { return absl::StrCat("tools-", t.index, "-parameters"); }

// One call of the format, as EBNF: an alternative per tool.
std::string DeepSeekCall(const RequiredToolCalls& calls, op::DeepSeekToolFormat format) {
  std::string alts;
  for (const CallableTool& t : calls.tools) {
    if (!alts.empty()) alts += " | ";
    if (format == op::DeepSeekToolFormat::kV3) {
      absl::StrAppend(&alts, Literal(absl::StrCat(t.name, "\n```json\n")), " ", RuleOf(t));
    } else {
      absl::StrAppend(&alts, Literal(t.name), " ", Token(op::kDeepSeekToolSep), " ", RuleOf(t));
    }
  }
  if (format == op::DeepSeekToolFormat::kV3) {
    return absl::StrCat(Token(op::kDeepSeekToolCallBegin), " \"function\" ", Token(op::kDeepSeekToolSep), " (", alts,
                        ") ", Literal("\n```"), " ", Token(op::kDeepSeekToolCallEnd));
  }
  return absl::StrCat(Token(op::kDeepSeekToolCallBegin), " (", alts, ") ", Token(op::kDeepSeekToolCallEnd));
}

// Text that does not contain "</think>" (where the reasoning parser ends reasoning), as
// rules: a state machine over how much of "</think>" the text ends with. `lt` is a run of
// '<' with what follows it up to the character that breaks the match (never '<', which
// starts the next run); `tail` is text that ends partway through the marker.
constexpr std::string_view kNoThinkCloseRules =
    "reasoning ::= ([^<] | lt)* tail?\n"
    "lt ::= \"<\"+ (brk | part lt)\n"
    "tail ::= \"<\"+ (part tail?)?\n"
    "part ::= \"/\" | \"/t\" | \"/th\" | \"/thi\" | \"/thin\" | \"/think\"\n"
    "brk ::= [^</] | \"/\" [^<t] | \"/t\" [^<h] | \"/th\" [^<i] | \"/thi\" [^<n] | \"/thin\" [^<k] | "
    "\"/think\" [^<>]\n";

std::string DeepSeekGrammar(const RequiredToolCalls& calls, op::DeepSeekToolFormat format,
                            const ReasoningFirst& reasoning) {
  // Calls as the model's chat template writes them: V3 puts a newline between calls,
  // V3.1 nothing.
  const std::string more = calls.single ? ""
                           : format == op::DeepSeekToolFormat::kV3 ? " (\"\\n\" call)*"
                                                                    : " call*";
  const std::string calls_rule = absl::StrCat(Token(op::kDeepSeekToolCallsBegin), " call", more, " ",
                                              Token(op::kDeepSeekToolCallsEnd));
  const std::string call_rule = absl::StrCat("call ::= ", DeepSeekCall(calls, format), "\n");
  if (!reasoning.on) return absl::StrCat("root ::= ", calls_rule, "\n", call_rule);
  // Free reasoning up to its end, written as the tag's token (where the vocabulary has
  // one) or its text, then at most the two newlines R1 writes there (they reach the
  // content), and the calls.
  const char* end = reasoning.end_is_a_token ? "(</think> | \"</think>\")" : "\"</think>\"";
  return absl::StrCat("root ::= reasoning ", end, " \"\\n\"? \"\\n\"? ", calls_rule, "\n", call_rule,
                      A(kNoThinkCloseRules));
}

// `parameters` as a schema of objects; nullopt when it allows no object.
std::optional<Json> ObjectSchema(const Json* parameters) {
  if (parameters == nullptr) return Json{{"type", "object"}};
  Json s = *parameters;
  const Json* type = Field(s, "type");
  if (type == nullptr) {
    // Combinators and references decide the type themselves; adding one beside them is
    // a combination the JSON schema front end does not build.
    for (const char* k : {"anyOf", "oneOf", "allOf", "$ref", "enum", "const"}) {
      if (s.contains(k)) return s;
    }
    s["type"] = "object";
    return s;
  }
  if (type->is_string() && *type == "object") return s;
  if (type->is_array()) {
    for (const Json& t : *type) {
      if (t.is_string() && t == "object") {
        s["type"] = "object";
        return s;
      }
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ReadCallableTools(const Json& tools, std::string_view named, RequiredToolCalls* out) {
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& function = tools[i]["function"];
    CallableTool t;
    t.index = static_cast<int>(i);
    t.name = function["name"].get<std::string>();
    if (!named.empty() && t.name != named) continue;
    const std::string at = absl::StrCat("tools[", i, "].function");
    if (!CarriableName(t.name)) {
      return InvalidRequest(at + ".name", absl::StrCat(at, ".name: '", t.name,
                                                       "' cannot be called under tool_choice \"required\" or by name: "
                                                       "the tool-call format ends a name at whitespace or '<'"));
    }
    std::optional<Json> schema = ObjectSchema(Field(function, "parameters"));
    if (!schema) {
      return InvalidRequest(at + ".parameters", absl::StrCat(at, ".parameters: must describe a JSON object "
                                                                 "(a tool call's arguments are one)"));
    }
    t.parameters = schema->dump();
    std::optional<ApiError> error;
    if (auto strict = Bool(function, "strict", &error)) t.strict = *strict;
    if (error) return TypeError(at + ".strict", "a boolean");
    out->tools.push_back(std::move(t));
  }
  return std::nullopt;
}

std::optional<ApiError> ToolCallConstraint(const RequiredToolCalls& calls, std::string_view tool_call_parser,
                                           v1::Constraint* out, const ReasoningFirst& reasoning) {
  std::optional<op::DeepSeekToolFormat> format;
  if (tool_call_parser == "deepseek_v3") format = op::DeepSeekToolFormat::kV3;
  if (tool_call_parser == "deepseek_v31") format = op::DeepSeekToolFormat::kV31;
  if (!format) {
    const std::string why =
        tool_call_parser.empty()
            ? std::string("this server parses no tool calls (tandem-router --tool-call-parser)")
            : absl::StrCat("the tool-call parser '", A(tool_call_parser), "' has no format to constrain the output to");
    return InvalidRequest("tool_choice",
                          absl::StrCat("tool_choice: \"required\" and a named function need the model's tool-call "
                                       "format, but ", why, "; use \"auto\""));
  }
  out->Clear();
  v1::EbnfGrammar* g = out->mutable_ebnf();
  g->set_grammar(DeepSeekGrammar(calls, *format, reasoning));
  for (const CallableTool& t : calls.tools) {
    v1::JsonSchemaRule* r = g->add_json_rules();
    r->set_name(RuleOf(t));
    r->set_json_schema(t.parameters);
    r->set_strict(t.strict);
  }
  return std::nullopt;
}

}  // namespace tandem::openai
