// Tool-call parsers for DeepSeek's formats (the markers are the text of added tokens,
// kept when the output is decoded):
//
//   V3 / R1 ("deepseek_v3"), as DeepSeek-V3's chat template writes assistant calls:
//     <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
//     \n<｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//   V3.1+ ("deepseek_v31"), as DeepSeek-V3.1's template writes them (no type, no fence,
//   nothing between calls):
//     <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//
// ARGS must be one JSON object; its end is found by scanning it as JSON (so "```" or
// "<" inside its strings are text), and whitespace around it is not part of it. Both
// parsers accept whitespace between markers, a missing fence after V3 arguments, a call
// that opens without the section marker (the section then needs no closing marker), and
// text after the section (content; a later section is parsed again).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/output_parsing/json_prefix_scanner.h"
#include "engine/output_parsing/tool_call_parser.h"

namespace tandem::output_parsing {

inline constexpr std::string_view kDeepSeekToolCallsBegin = "<｜tool▁calls▁begin｜>";
inline constexpr std::string_view kDeepSeekToolCallsEnd = "<｜tool▁calls▁end｜>";
inline constexpr std::string_view kDeepSeekToolCallBegin = "<｜tool▁call▁begin｜>";
inline constexpr std::string_view kDeepSeekToolCallEnd = "<｜tool▁call▁end｜>";
inline constexpr std::string_view kDeepSeekToolSep = "<｜tool▁sep｜>";

enum class DeepSeekToolFormat {
  kV3,   // V3, V3-0324, R1, R1-0528
  kV31,  // V3.1, V3.1-Terminus
};

class DeepSeekToolCallParser : public ToolCallParser {
 public:
  explicit DeepSeekToolCallParser(DeepSeekToolFormat format) : format_(format) {}

  void Feed(std::string_view text, ToolParseOutput* out) override;
  ToolCallOutcome Finish(ToolParseOutput* out) override;

 private:
  enum class State {
    kText,            // content, looking for a section or a call
    kSection,         // between calls: a call, the section's end, or whitespace
    kCallType,        // V3: "function" up to <｜tool▁sep｜>
    kCallName,        // the name, up to "\n" (V3) or <｜tool▁sep｜> (V3.1)
    kFence,           // V3: "```json" before the arguments
    kArguments,       // the JSON object
    kAfterArguments,  // whitespace, V3's closing "```", then <｜tool▁call▁end｜>
    kPassthrough,     // after a malformed call: everything is content
  };

  // Each step consumes what it can of the unconsumed text and returns false when it
  // needs more text to go on.
  bool Step(ToolParseOutput* out);
  bool StepText(ToolParseOutput* out);
  bool StepSection(ToolParseOutput* out);
  bool StepCallType(ToolParseOutput* out);
  bool StepCallName(ToolParseOutput* out);
  bool StepFence(ToolParseOutput* out);
  bool StepArguments(ToolParseOutput* out);
  bool StepAfterArguments(ToolParseOutput* out);

  std::string_view Rest() const { return std::string_view(buf_).substr(pos_); }
  // Moves `n` unconsumed bytes into raw_ (text of the section since the last complete
  // call, emitted as content if the section turns out malformed).
  void Consume(size_t n);
  // Consumes leading whitespace; returns false when nothing else is left.
  bool SkipWhitespace();
  void StartCall();
  void EmitArguments(std::string_view fragment, ToolParseOutput* out);
  // Ends tool parsing: records the problem, emits raw_ and the rest as content.
  void Fail(absl::StatusCode code, std::string_view why, ToolParseOutput* out);

  const DeepSeekToolFormat format_;
  State state_ = State::kText;
  std::string buf_;  // fed text; buf_[pos_...] is not consumed yet
  size_t pos_ = 0;
  std::string raw_;
  bool section_has_complete_call_ = false;
  int current_ = -1;  // index of the call being parsed (its first piece may not be out yet)
  std::vector<bool> complete_;  // per call that got a first piece
  JsonPrefixScanner json_;
  bool fence_closed_ = false;  // V3: the "```" after the arguments has been read
  absl::Status status_;
  bool finished_ = false;
};

}  // namespace tandem::output_parsing
