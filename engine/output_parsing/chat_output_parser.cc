#include "engine/output_parsing/chat_output_parser.h"

#include <cstdio>
#include <cstdlib>
#include <utility>


namespace tandem::output_parsing {

ChatOutputParser::ChatOutputParser(std::unique_ptr<ReasoningParser> reasoning,
                                   std::unique_ptr<ToolCallParser> tools, ToolCallIdSource ids)
    : reasoning_(std::move(reasoning)), tools_(std::move(tools)), ids_(std::move(ids)) {}

absl::StatusOr<ChatOutputParser> ChatOutputParser::Create(const OutputParserRegistry& registry,
                                                          const ChatOutputOptions& options,
                                                          ToolCallIdSource ids) {
  std::unique_ptr<ReasoningParser> reasoning;
  if (!options.reasoning_parser.empty()) {
    auto made = registry.MakeReasoningParser(options.reasoning_parser, options.reasoning);
    if (!made.ok()) return made.status();
    reasoning = *std::move(made);
  }
  std::unique_ptr<ToolCallParser> tools;
  if (!options.tool_call_parser.empty()) {
    auto made = registry.MakeToolCallParser(options.tool_call_parser);
    if (!made.ok()) return made.status();
    tools = *std::move(made);
  }
  return ChatOutputParser(std::move(reasoning), std::move(tools), std::move(ids));
}

void ChatOutputParser::AddCalls(ToolParseOutput& parsed, OutputDelta* out) {
  for (ToolCallDelta& piece : parsed.calls) {
    if (!piece.name.empty()) piece.id = ids_();
    out->tool_calls.push_back(std::move(piece));
  }
}

void ChatOutputParser::RouteContent(std::string_view content, OutputDelta* out) {
  if (!tools_) {
    out->content.append(content);
    return;
  }
  if (content.empty()) return;
  ToolParseOutput parsed;
  tools_->Feed(content, &parsed);
  out->content.append(parsed.content);
  AddCalls(parsed, out);
}

OutputDelta ChatOutputParser::Feed(std::string_view text) {
  if (finished_) {
    std::fprintf(stderr, "output_parsing: ChatOutputParser::Feed after Finish\n");
    std::fflush(stderr);
    std::abort();
  }
  OutputDelta out;
  if (!reasoning_) {
    RouteContent(text, &out);
    return out;
  }
  ReasoningSplit split;
  reasoning_->Feed(text, &split);
  out.reasoning = std::move(split.reasoning);
  RouteContent(split.content, &out);
  return out;
}

ChatOutputFinish ChatOutputParser::Finish() {
  ChatOutputFinish result;
  if (finished_) return result;
  finished_ = true;
  if (reasoning_) {
    ReasoningSplit split;
    reasoning_->Finish(&split);
    result.delta.reasoning = std::move(split.reasoning);
    RouteContent(split.content, &result.delta);
  }
  if (tools_) {
    ToolParseOutput parsed;
    result.tool_calls = tools_->Finish(&parsed);
    result.delta.content.append(parsed.content);
    AddCalls(parsed, &result.delta);
  }
  return result;
}

ParsedChatOutput ParseWholeOutput(ChatOutputParser& parser, std::string_view text) {
  ParsedChatOutput out;
  MergeDelta(parser.Feed(text), &out);
  const ChatOutputFinish finish = parser.Finish();
  MergeFinish(finish.delta, finish.tool_calls, &out);
  return out;
}

absl::StatusOr<ParsedChatOutput> ParseChatOutput(const OutputParserRegistry& registry,
                                                 const ChatOutputOptions& options, std::string_view text,
                                                 ToolCallIdSource ids) {
  absl::StatusOr<ChatOutputParser> parser = ChatOutputParser::Create(registry, options, std::move(ids));
  if (!parser.ok()) return parser.status();
  return ParseWholeOutput(*parser, text);
}

}  // namespace tandem::output_parsing
