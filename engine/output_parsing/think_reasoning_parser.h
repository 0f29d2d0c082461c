// Reasoning parsers for models that write reasoning between "<think>" and "</think>"
// (DeepSeek-R1, DeepSeek-V3.1 in thinking mode), and the identity parser (everything is
// content) that a model without reasoning, or with thinking off, uses.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "engine/output_parsing/reasoning_parser.h"

namespace tandem::output_parsing {

inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";

// Splits at the tags. The output may open reasoning with "<think>" as its very first
// bytes (the tag is dropped); otherwise it starts in reasoning when
// `starts_in_reasoning` and in content if not. Reasoning ends at the first "</think>"
// (dropped); everything after it is content, tags included. A "<think>" anywhere but at
// the start is ordinary text.
class ThinkReasoningParser : public ReasoningParser {
 public:
  explicit ThinkReasoningParser(bool starts_in_reasoning);

  void Feed(std::string_view text, ReasoningSplit* out) override;
  void Finish(ReasoningSplit* out) override;

 private:
  enum class State { kStart, kReasoning, kContent };

  // Settles as much of held_ as it can.
  void Drain(ReasoningSplit* out);

  const bool starts_in_reasoning_;
  State state_ = State::kStart;
  std::string held_;  // text not yet settled: a possible tag prefix
  bool finished_ = false;
};

class IdentityReasoningParser : public ReasoningParser {
 public:
  void Feed(std::string_view text, ReasoningSplit* out) override;
  void Finish(ReasoningSplit* out) override {}
};

// The parser vLLM calls "deepseek_r1": R1 always reasons first, so the output starts in
// reasoning unless options.prompt_ends_in_reasoning is known to be false (a template
// that closed the block in the prompt), in which case only a leading "<think>" opens it.
std::unique_ptr<ReasoningParser> MakeDeepSeekR1ReasoningParser(const ReasoningOptions& options);

// The parser vLLM calls "deepseek_v3" (DeepSeek-V3.1+ hybrid thinking): identity unless
// options.thinking or options.prompt_ends_in_reasoning; then "<think>" tags as R1, the
// output starting in reasoning when the prompt left the block open (by default: when
// thinking is on, as V3.1's template opens it then).
std::unique_ptr<ReasoningParser> MakeDeepSeekV3ReasoningParser(const ReasoningOptions& options);

// Whether `rendered_prompt` (the chat template's output, special tokens as text) leaves a
// "<think>" block open: its last "<think>" comes after its last "</think>". The HTTP layer
// sets ReasoningOptions::prompt_ends_in_reasoning from this.
bool PromptEndsInsideThink(std::string_view rendered_prompt);

}  // namespace tandem::output_parsing
