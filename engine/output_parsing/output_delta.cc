#include "engine/output_parsing/output_delta.h"

#include <cstdio>
#include <cstdlib>

namespace tandem::output_parsing {
namespace {

// A delta that does not follow the order a parser produces is a bug in the caller.
[[noreturn]] void Broken(const char* why) {
  std::fprintf(stderr, "output_parsing: %s\n", why);
  std::fflush(stderr);
  std::abort();
}

}  // namespace

int ToolCallOutcome::num_complete() const {
  int n = 0;
  for (bool c : complete) n += c ? 1 : 0;
  return n;
}

std::vector<ParsedToolCall> ParsedChatOutput::CompleteToolCalls() const {
  std::vector<ParsedToolCall> out;
  for (const ParsedToolCall& call : tool_calls) {
    if (call.complete) out.push_back(call);
  }
  return out;
}

bool ParsedChatOutput::HasCompleteToolCall() const {
  for (const ParsedToolCall& call : tool_calls) {
    if (call.complete) return true;
  }
  return false;
}

void MergeDelta(const OutputDelta& delta, ParsedChatOutput* out) {
  out->reasoning += delta.reasoning;
  out->content += delta.content;
  for (const ToolCallDelta& piece : delta.tool_calls) {
    const int known = static_cast<int>(out->tool_calls.size());
    if (piece.index == known) {
      if (piece.name.empty()) Broken("a tool call's first piece has no name");
      out->tool_calls.push_back(ParsedToolCall{piece.id, piece.name, piece.arguments, false});
    } else if (piece.index >= 0 && piece.index < known) {
      if (!piece.name.empty() || !piece.id.empty()) Broken("a tool call's name or id came twice");
      out->tool_calls[piece.index].arguments += piece.arguments;
    } else {
      Broken("a tool call piece skips an index");
    }
  }
}

void MergeFinish(const OutputDelta& final_delta, const ToolCallOutcome& outcome,
                 ParsedChatOutput* out) {
  MergeDelta(final_delta, out);
  if (outcome.complete.size() != out->tool_calls.size()) {
    Broken("the outcome's calls do not match the calls merged");
  }
  for (size_t i = 0; i < outcome.complete.size(); ++i) out->tool_calls[i].complete = outcome.complete[i];
  out->tool_call_status = outcome.status;
}

}  // namespace tandem::output_parsing
