#include "engine/output_parsing/parser_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/output_parsing/deepseek_tool_call_parser.h"
#include "engine/output_parsing/think_reasoning_parser.h"

namespace tandem::output_parsing {
namespace {

template <typename Map>
std::vector<std::string> NamesOf(const Map& map) {
  std::vector<std::string> names;
  for (const auto& [name, factory] : map) names.push_back(name);
  return names;  // std::map keeps them sorted
}

template <typename Map>
absl::Status Register(Map& map, std::string name, typename Map::mapped_type factory, absl::string_view kind) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(kind, " parser name: empty"));
  if (map.count(name) != 0) {
    return absl::AlreadyExistsError(absl::StrCat(kind, " parser \"", name, "\" is already registered"));
  }
  map.emplace(std::move(name), std::move(factory));
  return absl::OkStatus();
}

template <typename Map>
absl::Status Unknown(const Map& map, std::string_view name_view, absl::string_view kind) {
  const absl::string_view name(name_view.data(), name_view.size());
  const std::vector<std::string> names = NamesOf(map);
  return absl::NotFoundError(absl::StrCat("unknown ", kind, " parser \"", name, "\" (known: ",
                                          names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
}

}  // namespace

OutputParserRegistry OutputParserRegistry::WithBuiltins() {
  OutputParserRegistry registry;
  // Registering fixed, distinct names into an empty registry cannot fail.
  registry.reasoning_.emplace("deepseek_r1", MakeDeepSeekR1ReasoningParser);
  registry.reasoning_.emplace("deepseek_v3", MakeDeepSeekV3ReasoningParser);
  registry.tools_.emplace("deepseek_v3",
                          [] { return std::make_unique<DeepSeekToolCallParser>(DeepSeekToolFormat::kV3); });
  registry.tools_.emplace("deepseek_v31",
                          [] { return std::make_unique<DeepSeekToolCallParser>(DeepSeekToolFormat::kV31); });
  return registry;
}

absl::Status OutputParserRegistry::RegisterReasoningParser(std::string name, ReasoningParserFactory factory) {
  return Register(reasoning_, std::move(name), std::move(factory), "reasoning");
}

absl::Status OutputParserRegistry::RegisterToolCallParser(std::string name, ToolCallParserFactory factory) {
  return Register(tools_, std::move(name), std::move(factory), "tool-call");
}

absl::StatusOr<std::unique_ptr<ReasoningParser>> OutputParserRegistry::MakeReasoningParser(
    std::string_view name, const ReasoningOptions& options) const {
  const auto it = reasoning_.find(name);
  if (it == reasoning_.end()) return Unknown(reasoning_, name, "reasoning");
  return it->second(options);
}

absl::StatusOr<std::unique_ptr<ToolCallParser>> OutputParserRegistry::MakeToolCallParser(
    std::string_view name) const {
  const auto it = tools_.find(name);
  if (it == tools_.end()) return Unknown(tools_, name, "tool-call");
  return it->second();
}

absl::Status OutputParserRegistry::CheckReasoningParser(std::string_view name) const {
  return reasoning_.find(name) != reasoning_.end() ? absl::OkStatus() : Unknown(reasoning_, name, "reasoning");
}

absl::Status OutputParserRegistry::CheckToolCallParser(std::string_view name) const {
  return tools_.find(name) != tools_.end() ? absl::OkStatus() : Unknown(tools_, name, "tool-call");
}

std::vector<std::string> OutputParserRegistry::ReasoningParserNames() const { return NamesOf(reasoning_); }
std::vector<std::string> OutputParserRegistry::ToolCallParserNames() const { return NamesOf(tools_); }

}  // namespace tandem::output_parsing
