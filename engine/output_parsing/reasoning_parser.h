// ReasoningParser: splits a completion's generated text, fed in the deltas the streaming
// detokenizer emits, into reasoning and content. One parser per sequence (choice), used
// from one thread. Model-neutral; implementations are created by name from the
// OutputParserRegistry (parser_registry.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace tandem::output_parsing {

struct ReasoningOptions {
  // The request enabled thinking (chat_template_kwargs "thinking" or "enable_thinking").
  bool thinking = false;
  // Whether the rendered prompt leaves a reasoning block open, so that the output starts
  // inside reasoning without writing the opening tag (R1's template ends the prompt with
  // "<think>\n"; V3.1's with "<think>" in thinking mode, "</think>" otherwise). Unset:
  // the parser's default for its model. See PromptEndsInsideThink.
  std::optional<bool> prompt_ends_in_reasoning;
};

// Text for each channel from one Feed or Finish, in output order (reasoning first: once
// reasoning has ended it does not start again).
struct ReasoningSplit {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  virtual ~ReasoningParser() = default;

  // Appends to `out` what `text` (the next delta) settles. Text that may be the start of
  // a tag is held back until the next Feed or Finish settles it.
  virtual void Feed(std::string_view text, ReasoningSplit* out) = 0;

  // The output has ended: appends everything held back (a tag that never completed is
  // text of the channel it appeared in). Feed must not be called afterwards.
  virtual void Finish(ReasoningSplit* out) = 0;
};

}  // namespace tandem::output_parsing
