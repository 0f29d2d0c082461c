// One POST /v1/completions or /v1/chat/completions: its prompts tokenized as the gRPC API
// tokenizes them (services/api/proto_convert.h), one request core per choice (prompts x
// n) over the same router core as gRPC, and their messages turned into OpenAI's answer:
// server-sent events as they come (`stream`), or one JSON body at the end.
//
// Choice i of a prompt with a seed samples with seed + i, so n = 1 gives what the gRPC
// API gives for the same request. A choice that fails fails the whole call (the others
// are cancelled): before the first event the answer is the error's HTTP status, after it
// an error event, then `data: [DONE]`. A client that goes away cancels every choice,
// which frees their KV.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "engine/output_parsing/parser_registry.h"
#include "engine/tokenizer/tokenizer.h"
#include "services/http/http_server.h"
#include "services/openai/openai_request.h"
#include "services/api/request_core.h"

namespace tandem::openai {

struct CompletionContext {
  // The request core's context gRPC's Generate uses (RouterCore::context()).
  const RequestCoreContext* core = nullptr;
  // Once per request core started (the router's in-flight gauge; its end is counted by
  // the core's on_finished). May be empty.
  std::function<void()> on_core_started;
  const Tokenizer* tokenizer = nullptr;
  std::string served_model;
  int64_t context_tokens = 0;  // the model's context length
  int64_t vocab_size = 0;
  int64_t max_prompt_bytes = 0;
  std::function<int64_t()> unix_seconds;  // `created`
  // Chat output parsing (--reasoning-parser, --tool-call-parser): empty names are off.
  const output_parsing::OutputParserRegistry* parsers = nullptr;
  std::string reasoning_parser;
  std::string tool_call_parser;
};

// Answers `request` on `exchange`; returns at once (the work runs on the cores'
// executors). `id` is the response's id suffix and the cores' request id prefix. The
// request is answered as given: no check against ParseLimits here (ParseRequest's job).
void StartCompletion(const CompletionContext& context, ParsedRequest request, const std::string& id,
                     std::shared_ptr<http::Exchange> exchange);

}  // namespace tandem::openai
