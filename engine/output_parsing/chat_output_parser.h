// ChatOutputParser: turns one chat completion choice's generated text into OpenAI deltas.
// Feed it the text deltas the streaming detokenizer emits (decoded with special and
// added tokens kept, so that "<think>" and DeepSeek's tool markers are present as text);
// each Feed returns what that text settles: reasoning, content, tool-call pieces (a
// call's id and name once, then argument fragments). Reasoning is split off first; tool
// calls are parsed from the content alone, never from reasoning.
//
// The non-streamed response is, by definition, the whole text fed in one piece and the
// deltas merged (ParseWholeOutput), so streamed and non-streamed results agree.
//
// One parser per choice, used from one thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/output_parsing/output_delta.h"
#include "engine/output_parsing/parser_registry.h"
#include "engine/output_parsing/reasoning_parser.h"
#include "engine/output_parsing/tool_call_id.h"
#include "engine/output_parsing/tool_call_parser.h"

namespace tandem::output_parsing {

struct ChatOutputOptions {
  // A registered reasoning parser, or empty: no reasoning, all text is content.
  std::string reasoning_parser;
  ReasoningOptions reasoning;
  // A registered tool-call parser, or empty: tool calls are not parsed (no tools in the
  // request, or tool_choice "none"; see ToolChoice::parse_tool_calls).
  std::string tool_call_parser;
};

struct ChatOutputFinish {
  OutputDelta delta;         // what was held back
  ToolCallOutcome tool_calls;  // empty and OK when tool calls are not parsed
};

class ChatOutputParser {
 public:
  // Either parser may be null (see ChatOutputOptions). `ids` gives each call its id.
  ChatOutputParser(std::unique_ptr<ReasoningParser> reasoning, std::unique_ptr<ToolCallParser> tools,
                   ToolCallIdSource ids = RandomToolCallId);

  // NotFound for a name `registry` does not know (the message lists those it knows).
  static absl::StatusOr<ChatOutputParser> Create(const OutputParserRegistry& registry,
                                                 const ChatOutputOptions& options,
                                                 ToolCallIdSource ids = RandomToolCallId);

  ChatOutputParser(ChatOutputParser&&) = default;
  ChatOutputParser& operator=(ChatOutputParser&&) = default;

  // The next text delta (valid UTF-8, as the detokenizer emits) in, what it settles out.
  OutputDelta Feed(std::string_view text);

  // The output has ended (any finish reason): flushes what was held back and reports on
  // the tool calls. Feed must not be called afterwards; a second Finish returns nothing
  // new.
  ChatOutputFinish Finish();

 private:
  // Passes content through the tool-call parser (if any) into `out`.
  void RouteContent(std::string_view content, OutputDelta* out);
  void AddCalls(ToolParseOutput& parsed, OutputDelta* out);

  std::unique_ptr<ReasoningParser> reasoning_;
  std::unique_ptr<ToolCallParser> tools_;
  ToolCallIdSource ids_;
  bool finished_ = false;
};

// The non-streamed result: `text` fed to the fresh `parser` in one piece, then Finish,
// all merged (MergeDelta, MergeFinish).
ParsedChatOutput ParseWholeOutput(ChatOutputParser& parser, std::string_view text);

// The same with a parser made from `registry` and `options`.
absl::StatusOr<ParsedChatOutput> ParseChatOutput(const OutputParserRegistry& registry,
                                                 const ChatOutputOptions& options, std::string_view text,
                                                 ToolCallIdSource ids = RandomToolCallId);

}  // namespace tandem::output_parsing
