#include "engine/output_parsing/tool_choice.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::output_parsing {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

absl::StatusOr<std::vector<std::string>> ReadToolNames(const nlohmann::json& tools) {
  std::vector<std::string> names;
  if (tools.is_null()) return names;
  if (!tools.is_array()) return Invalid("tools", "must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string field = absl::StrCat("tools[", i, "]");
    const nlohmann::json& tool = tools[i];
    if (!tool.is_object()) return Invalid(field, "must be an object");
    const auto type = tool.find("type");
    if (type != tool.end() && *type != "function") return Invalid(field + ".type", "must be \"function\"");
    const auto function = tool.find("function");
    if (function == tool.end() || !function->is_object()) return Invalid(field + ".function", "must be an object");
    const auto name = function->find("name");
    if (name == function->end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
      return Invalid(field + ".function.name", "must be a non-empty string");
    }
    names.push_back(name->get<std::string>());
  }
  return names;
}

std::string Describe(const ParsedChatOutput& output) {
  std::string what;
  const std::vector<ParsedToolCall> complete = output.CompleteToolCalls();
  if (complete.empty()) {
    what = "no complete tool call";
  } else {
    what = "calls to";
    for (const ParsedToolCall& call : complete) absl::StrAppend(&what, " ", call.name);
  }
  if (!output.tool_call_status.ok()) absl::StrAppend(&what, " (", output.tool_call_status.message(), ")");
  return what;
}

}  // namespace

absl::StatusOr<ToolChoice> ResolveToolChoice(const nlohmann::json& tools, const nlohmann::json& tool_choice) {
  absl::StatusOr<std::vector<std::string>> names = ReadToolNames(tools);
  if (!names.ok()) return names.status();
  ToolChoice choice;
  choice.tool_names = *std::move(names);
  const bool have_tools = !choice.tool_names.empty();

  if (tool_choice.is_null()) {
    choice.mode = have_tools ? ToolChoiceMode::kAuto : ToolChoiceMode::kNone;
    return choice;
  }
  if (tool_choice.is_string()) {
    const std::string& mode = tool_choice.get_ref<const std::string&>();
    if (mode == "none") {
      choice.mode = ToolChoiceMode::kNone;
    } else if (mode == "auto") {
      choice.mode = have_tools ? ToolChoiceMode::kAuto : ToolChoiceMode::kNone;
    } else if (mode == "required") {
      if (!have_tools) return Invalid("tool_choice", "\"required\" needs tools");
      choice.mode = ToolChoiceMode::kRequired;
    } else {
      return Invalid("tool_choice", "must be \"none\", \"auto\", \"required\" or a function");
    }
    return choice;
  }
  if (!tool_choice.is_object()) {
    return Invalid("tool_choice", "must be \"none\", \"auto\", \"required\" or a function");
  }
  const auto type = tool_choice.find("type");
  if (type == tool_choice.end() || *type != "function") {
    return Invalid("tool_choice.type", "must be \"function\"");
  }
  const auto function = tool_choice.find("function");
  if (function == tool_choice.end() || !function->is_object()) {
    return Invalid("tool_choice.function", "must be an object");
  }
  const auto name = function->find("name");
  if (name == function->end() || !name->is_string() || name->get_ref<const std::string&>().empty()) {
    return Invalid("tool_choice.function.name", "must be a non-empty string");
  }
  choice.function_name = name->get<std::string>();
  if (!have_tools) return Invalid("tool_choice", "a named function needs tools");
  if (std::find(choice.tool_names.begin(), choice.tool_names.end(), choice.function_name) ==
      choice.tool_names.end()) {
    return Invalid("tool_choice.function.name", absl::StrCat("no tool is named \"", choice.function_name, "\""));
  }
  choice.mode = ToolChoiceMode::kNamed;
  return choice;
}

absl::Status CheckToolChoiceSatisfied(const ToolChoice& choice, const ParsedChatOutput& output) {
  const std::vector<ParsedToolCall> complete = output.CompleteToolCalls();
  switch (choice.mode) {
    case ToolChoiceMode::kNone:
    case ToolChoiceMode::kAuto:
      return absl::OkStatus();
    case ToolChoiceMode::kRequired:
      if (!complete.empty()) return absl::OkStatus();
      return absl::FailedPreconditionError(
          absl::StrCat("tool_choice is \"required\" but the model produced ", Describe(output)));
    case ToolChoiceMode::kNamed: {
      const bool all_named = std::all_of(complete.begin(), complete.end(), [&](const ParsedToolCall& call) {
        return call.name == choice.function_name;
      });
      if (!complete.empty() && all_named) return absl::OkStatus();
      return absl::FailedPreconditionError(absl::StrCat("tool_choice names \"", choice.function_name,
                                                        "\" but the model produced ", Describe(output)));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::output_parsing
