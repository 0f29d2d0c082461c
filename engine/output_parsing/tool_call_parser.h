// ToolCallParser: finds a model's tool calls in the content channel of its output (never
// in reasoning), fed incrementally. One parser per sequence, used from one thread.
// Model-neutral; implementations are created by name from the OutputParserRegistry.
//
// What every implementation promises:
//   - A call's name comes out once, in the call's first piece, when the name is complete;
//     then its arguments in fragments as they are generated. The fragments concatenated
//     are exactly the call's arguments text (the JSON object, without surrounding
//     whitespace or fences); an empty "{}" is never made up.
//   - All calls that a delta completes come out of that Feed, however many.
//   - Text before (and after) the calls is content. Text that may begin a marker is held
//     back until settled; at Finish a marker that never completed is content.
//   - A malformed call, or the output ending inside one: the outcome's status says so,
//     and the raw text from the start of the bad call (from the section's opening marker
//     when it is the first call) to the end of the output is emitted as content. Pieces
//     of the bad call streamed before the problem showed are not retracted; the outcome
//     marks the call incomplete. Parsing stops there: later text is all content.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/output_parsing/output_delta.h"

namespace tandem::output_parsing {

// What one Feed or Finish settles. `calls` carry no id (ChatOutputParser assigns ids).
struct ToolParseOutput {
  std::string content;
  std::vector<ToolCallDelta> calls;  // at most one piece per call index, in index order
};

class ToolCallParser {
 public:
  virtual ~ToolCallParser() = default;

  // Appends to `out` what the content text `text` settles.
  virtual void Feed(std::string_view text, ToolParseOutput* out) = 0;

  // The output has ended: appends what was held back and returns what became of the
  // calls. Feed must not be called afterwards.
  virtual ToolCallOutcome Finish(ToolParseOutput* out) = 0;
};

}  // namespace tandem::output_parsing
