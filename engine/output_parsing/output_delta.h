// What parsing a chat completion's generated text yields: per text delta an OutputDelta
// (the shape of an OpenAI chat.completion.chunk's delta), and for the whole output a
// ParsedChatOutput (the shape of a non-streamed message), which is the merge of the
// deltas. Merging is defined here once, so a streamed response and a non-streamed one
// built from the same deltas agree.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tandem::output_parsing {

// One piece of one tool call. A call's first piece carries its id and name (both set
// then and never again); every piece may carry an arguments fragment. The fragments of
// a call, concatenated, are its arguments string.
struct ToolCallDelta {
  int index = 0;          // the call's position in the message's tool_calls, from 0
  std::string id;         // "call_..."; first piece only
  std::string name;       // the function's name; first piece only
  std::string arguments;  // the next fragment of the arguments; may be empty

  bool operator==(const ToolCallDelta&) const = default;
};

struct OutputDelta {
  std::string reasoning;  // text inside <think>...</think> (reasoning / reasoning_content)
  std::string content;    // visible text
  std::vector<ToolCallDelta> tool_calls;  // at most one piece per call, in index order

  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
  bool operator==(const OutputDelta&) const = default;
};

// What became of the tool calls when the output ended (ChatOutputParser::Finish).
struct ToolCallOutcome {
  // complete[i]: call i reached its end marker with arguments that are one JSON object.
  // Its size is the number of calls that got a first piece.
  std::vector<bool> complete;
  // OK, or the first malformed call (InvalidArgument) or the output ending inside a call
  // (OutOfRange). Either way the raw text of the bad call and of everything after it was
  // also emitted as content, so no generated text is lost.
  absl::Status status;

  int num_complete() const;
  bool operator==(const ToolCallOutcome&) const = default;
};

struct ParsedToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // JSON text of an object when `complete`
  bool complete = false;  // see ToolCallOutcome::complete

  bool operator==(const ParsedToolCall&) const = default;
};

struct ParsedChatOutput {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;  // every call that got a first piece
  absl::Status tool_call_status;           // ToolCallOutcome::status

  // Calls with `complete` set: what a non-streamed message's tool_calls should hold.
  std::vector<ParsedToolCall> CompleteToolCalls() const;
  // finish_reason "tool_calls" applies (when the engine stopped the sequence, not length):
  // at least one call is complete.
  bool HasCompleteToolCall() const;

  bool operator==(const ParsedChatOutput&) const = default;
};

// Appends `delta` to `out`: text concatenated, a call's first piece (by index, which must
// be the next one) adds the call, later pieces extend its arguments.
void MergeDelta(const OutputDelta& delta, ParsedChatOutput* out);

// Records the end of the output: merges `final_delta`, then the outcome's completeness
// flags and status.
void MergeFinish(const OutputDelta& final_delta, const ToolCallOutcome& outcome,
                 ParsedChatOutput* out);

}  // namespace tandem::output_parsing
