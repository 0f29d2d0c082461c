// OutputParserRegistry: reasoning and tool-call parsers by name (the names vLLM's
// --reasoning-parser and --tool-call-parser take), each name mapped to a factory. The two
// kinds have separate names ("deepseek_v3" is both a reasoning and a tool parser, as in
// vLLM). The server builds one registry at startup and checks its configured names
// there; it is immutable afterwards, so threads may share it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/output_parsing/reasoning_parser.h"
#include "engine/output_parsing/tool_call_parser.h"

namespace tandem::output_parsing {

using ReasoningParserFactory = std::function<std::unique_ptr<ReasoningParser>(const ReasoningOptions&)>;
using ToolCallParserFactory = std::function<std::unique_ptr<ToolCallParser>()>;

class OutputParserRegistry {
 public:
  // An empty registry.
  OutputParserRegistry() = default;

  // The built-in parsers: reasoning "deepseek_r1", "deepseek_v3"; tools "deepseek_v3"
  // (V3/R1 format), "deepseek_v31" (V3.1+ format).
  static OutputParserRegistry WithBuiltins();

  // AlreadyExists when the name is taken; InvalidArgument for an empty name.
  absl::Status RegisterReasoningParser(std::string name, ReasoningParserFactory factory);
  absl::Status RegisterToolCallParser(std::string name, ToolCallParserFactory factory);

  // NotFound naming the known parsers when `name` is not registered.
  absl::StatusOr<std::unique_ptr<ReasoningParser>> MakeReasoningParser(std::string_view name,
                                                                       const ReasoningOptions& options) const;
  absl::StatusOr<std::unique_ptr<ToolCallParser>> MakeToolCallParser(std::string_view name) const;

  // OK or the same NotFound, for checking configured names at startup.
  absl::Status CheckReasoningParser(std::string_view name) const;
  absl::Status CheckToolCallParser(std::string_view name) const;

  // Sorted.
  std::vector<std::string> ReasoningParserNames() const;
  std::vector<std::string> ToolCallParserNames() const;

 private:
  std::map<std::string, ReasoningParserFactory, std::less<>> reasoning_;
  std::map<std::string, ToolCallParserFactory, std::less<>> tools_;
};

}  // namespace tandem::output_parsing
