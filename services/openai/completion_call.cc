#include "services/openai/completion_call.h"

#include <mutex>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/api/proto_convert.h"
#include "engine/output_parsing/chat_output_parser.h"
#include "engine/output_parsing/think_reasoning_parser.h"
#include "kernels/common/check.h"
#include "services/api/request_core.h"

namespace tandem::openai {
namespace {


std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

const char* FinishReasonName(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_STOP: return "stop";
    case v1::FINISH_REASON_LENGTH: return "length";
    default: return nullptr;
  }
}

Json BytesOf(const std::string& s) {
  Json out = Json::array();
  for (unsigned char c : s) out.push_back(static_cast<int>(c));
  return out;
}

class Call : public std::enable_shared_from_this<Call> {
 public:
  Call(const CompletionContext& ctx, ParsedRequest request, std::string id, std::shared_ptr<http::Exchange> exchange)
      : ctx_(ctx), request_(std::move(request)), id_(std::move(id)), exchange_(std::move(exchange)),
        created_(ctx.unix_seconds ? ctx.unix_seconds() : 0) {}

  void Start();

 private:
  // The sink of one choice; the core calls it on its executor.
  class ChoiceSink : public ResponseSink {
   public:
    ChoiceSink(Call* call, int index) : call_(call), index_(index) {}
    void Begin(const std::string&) override {}
    bool Write(v1::GenerateResponse message, bool final) override { return call_->OnWrite(index_, std::move(message), final); }
    void Fail(const absl::Status& status, std::optional<std::chrono::milliseconds> retry_after) override {
      call_->OnFail(index_, status, retry_after);
    }

   private:
    Call* const call_;
    const int index_;
  };

  struct Choice {
    int prompt = 0;  // which prompt it answers
    std::unique_ptr<ChoiceSink> sink;
    std::shared_ptr<RequestCore> core;
    std::string text;
    Json logprobs;  // accumulated (non-streaming)
    int text_offset = 0;
    const char* finish_reason = nullptr;
    v1::Usage usage;
    bool sent_role = false;
    bool done = false;
    bool told_full = false;
    // Chat with a reasoning or tool-call parser: the text goes through it.
    std::optional<output_parsing::ChatOutputParser> parser;
    std::string reasoning;
    std::vector<Json> tool_calls;  // non-streamed: {id, type, function: {name, arguments}}
    bool called_tool = false;
    std::vector<bool> complete_calls;  // per call index, known at the end
  };

  bool Chat() const { return request_.endpoint == Endpoint::kChat; }
  std::string ObjectName(bool chunk) const {
    if (Chat()) return chunk ? "chat.completion.chunk" : "chat.completion";
    return "text_completion";
  }
  std::string ResponseId() const { return absl::StrCat(Chat() ? "chatcmpl-" : "cmpl-", id_); }
  const std::string& ModelName() const { return request_.model.empty() ? ctx_.served_model : request_.model; }

  Json LogprobsOf(Choice& c, const v1::GenerateResponse& m);
  Json UsageJson() const;
  bool OnWrite(int index, v1::GenerateResponse message, bool final);
  void OnFail(int index, const absl::Status& status, std::optional<std::chrono::milliseconds> retry_after);
  void OnGone();
  void OnWritable();
  std::shared_ptr<Call> FinishLocked();
  bool SendLocked(const Json& event);
  void RespondError(const ApiError& e);

  const CompletionContext ctx_;
  const ParsedRequest request_;
  const std::string id_;
  const std::shared_ptr<http::Exchange> exchange_;
  const int64_t created_;

  std::mutex mu_;
  std::vector<Choice> choices_;
  std::vector<int> prompt_tokens_;  // per prompt
  int remaining_ = 0;
  bool streaming_ = false;  // StartStream sent
  bool failed_ = false;
  bool ended_ = false;
  std::shared_ptr<Call> self_;  // alive until every choice ended
};

void Call::RespondError(const ApiError& e) {
  http::Headers headers;
  if (e.retry_after) headers.emplace_back("Retry-After", std::to_string(std::max<int64_t>(1, (e.retry_after->count() + 999) / 1000)));
  headers.emplace_back("x-request-id", id_);
  exchange_->Respond(e.http_status, "application/json", e.ToJson(), std::move(headers));
}

std::optional<ApiError> ToolChoiceConstraint(const CompletionContext& ctx, const ParsedRequest& request,
                                             v1::Constraint* out) {
  const RequiredToolCalls& calls = *request.chat.required_calls;
  ReasoningFirst reasoning;
  if (ctx.parsers != nullptr && !ctx.reasoning_parser.empty()) {
    // Whether the output starts inside reasoning, as the reasoning parser reads it: then
    // the calls are constrained to come after the reasoning ends.
    output_parsing::ChatOutputOptions probe;
    probe.reasoning_parser = ctx.reasoning_parser;
    probe.reasoning.thinking = request.chat.thinking;
    absl::StatusOr<output_parsing::ParsedChatOutput> parsed = output_parsing::ParseChatOutput(*ctx.parsers, probe, "x");
    reasoning.on = parsed.ok() && !parsed->reasoning.empty();
  }
  if (reasoning.on && ctx.tokenizer != nullptr) {
    const std::optional<int32_t> tag = ctx.tokenizer->TokenToId(output_parsing::kThinkClose);
    reasoning.end_is_a_token = tag && (ctx.tokenizer->IsAdded(*tag) || ctx.tokenizer->IsSpecial(*tag));
  }
  return ToolCallConstraint(calls, ctx.tool_call_parser, out, reasoning);
}

void Call::Start() {
  // Tokenize each prompt as Generate does, then send token ids: the default max_tokens
  // (the rest of the context, as vLLM) needs the prompt's length.
  std::vector<v1::GenerateRequest> prompts = request_.prompts;
  if (Chat() && request_.chat.required_calls) {
    v1::Constraint calls;
    if (auto e = ToolChoiceConstraint(ctx_, request_, &calls)) return RespondError(*e);
    for (v1::GenerateRequest& r : prompts) *r.mutable_constraint() = calls;
  }
  for (v1::GenerateRequest& r : prompts) {
    if (!r.model().empty() && r.model() != ctx_.served_model) {
      return RespondError(ApiError{.http_status = 404, .type = "not_found_error",
                                   .message = absl::StrCat("model '", r.model(), "' is not served here (serving '",
                                                           ctx_.served_model, "')"),
                                   .param = "model"});
    }
    // Chat messages in the model's chat template, as the request core's own Generate.
    const ModelChatTemplates* templates = ctx_.core != nullptr ? ctx_.core->chat_templates : nullptr;
    absl::StatusOr<std::vector<int32_t>> ids =
        PromptTokens(r, *ctx_.tokenizer, ctx_.vocab_size, ctx_.max_prompt_bytes, templates);
    if (!ids.ok()) return RespondError(FromStatus(ids.status()));
    prompt_tokens_.push_back(static_cast<int>(ids->size()));
    r.mutable_token_ids()->mutable_ids()->Assign(ids->begin(), ids->end());
    const int64_t room = ctx_.context_tokens - static_cast<int64_t>(ids->size());
    if (request_.max_tokens) {
      r.mutable_stop()->set_max_tokens(*request_.max_tokens);
    } else if (room >= 1) {
      r.mutable_stop()->set_max_tokens(static_cast<int32_t>(room));
    } else {
      return RespondError(InvalidRequest(Chat() ? "messages" : "prompt",
                                         absl::StrCat("the prompt is ", ids->size(), " tokens: no room left in the ",
                                                      ctx_.context_tokens, "-token context")));
    }
  }

  const RequestCoreContext& core_ctx = *ctx_.core;
  const int total = static_cast<int>(prompts.size()) * request_.n;
  std::vector<v1::GenerateRequest> requests;
  {
    std::lock_guard<std::mutex> lock(mu_);
    self_ = shared_from_this();
    choices_.resize(total);
    remaining_ = total;
    for (int i = 0; i < total; ++i) {
      Choice& c = choices_[i];
      c.prompt = i / request_.n;
      c.sink = std::make_unique<ChoiceSink>(this, i);
      c.logprobs = Chat() ? Json{{"content", Json::array()}}
                          : Json{{"tokens", Json::array()}, {"token_logprobs", Json::array()},
                                 {"top_logprobs", Json::array()}, {"text_offset", Json::array()}};
      c.core = RequestCore::Create(core_ctx, std::nullopt, c.sink.get());
      if (Chat() && ctx_.parsers != nullptr && (!ctx_.reasoning_parser.empty() || !ctx_.tool_call_parser.empty())) {
        output_parsing::ChatOutputOptions options;
        options.reasoning_parser = ctx_.reasoning_parser;
        options.reasoning.thinking = request_.chat.thinking;
        if (request_.chat.parse_tool_calls) options.tool_call_parser = ctx_.tool_call_parser;
        absl::StatusOr<output_parsing::ChatOutputParser> parser =
            output_parsing::ChatOutputParser::Create(*ctx_.parsers, options);
        TANDEM_CHECK(parser.ok()) << parser.status();  // names were checked at startup
        c.parser.emplace(std::move(*parser));
      }
      v1::GenerateRequest r = prompts[c.prompt];
      const int choice_of_prompt = i % request_.n;
      r.set_request_id(total == 1 ? id_ : absl::StrCat(id_, "-", i));
      if (r.sampling().has_seed() && choice_of_prompt > 0) {
        r.mutable_sampling()->set_seed(r.sampling().seed() + static_cast<uint64_t>(choice_of_prompt));
      }
      requests.push_back(std::move(r));
    }
  }
  std::weak_ptr<Call> weak = weak_from_this();
  exchange_->SetHandlers([weak] { if (auto call = weak.lock()) call->OnGone(); },
                         [weak] { if (auto call = weak.lock()) call->OnWritable(); });
  // Started without mu_ held: a core may call its sink before Start returns (an invalid
  // request fails at once). After a failure the remaining choices are not started.
  for (int i = 0; i < total; ++i) {
    std::shared_ptr<RequestCore> core;
    std::shared_ptr<Call> keep;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (failed_) {
        choices_[i].done = true;
        if (--remaining_ == 0) keep = std::move(self_);
        continue;
      }
      core = choices_[i].core;
    }
    if (ctx_.on_core_started) ctx_.on_core_started();
    core->Start(requests[i]);
  }
}

Json Call::LogprobsOf(Choice& c, const v1::GenerateResponse& m) {
  const Tokenizer& tok = *ctx_.tokenizer;
  auto token_text = [&](int32_t id) { return tok.Decode(std::span<const int32_t>(&id, 1), false); };
  if (Chat()) {
    Json content = Json::array();
    for (const v1::TokenLogprob& lp : m.logprobs()) {
      const std::string text = token_text(lp.token_id());
      Json top = Json::array();
      for (int k = 0; k < lp.top_size() && k < request_.top_logprobs; ++k) {
        const std::string t = token_text(lp.top(k).token_id());
        top.push_back({{"token", t}, {"logprob", lp.top(k).logprob()}, {"bytes", BytesOf(tok.TokenBytes(lp.top(k).token_id()))}});
      }
      content.push_back({{"token", text}, {"logprob", lp.logprob()}, {"bytes", BytesOf(tok.TokenBytes(lp.token_id()))},
                         {"top_logprobs", top}});
    }
    return Json{{"content", content}};
  }
  Json out = {{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()},
              {"text_offset", Json::array()}};
  for (const v1::TokenLogprob& lp : m.logprobs()) {
    const std::string text = token_text(lp.token_id());
    out["tokens"].push_back(text);
    out["token_logprobs"].push_back(lp.logprob());
    Json top = Json::object();
    for (int k = 0; k < lp.top_size() && k < request_.top_logprobs; ++k) {
      top[token_text(lp.top(k).token_id())] = lp.top(k).logprob();
    }
    out["top_logprobs"].push_back(top);
    out["text_offset"].push_back(c.text_offset);
    c.text_offset += static_cast<int>(text.size());
  }
  return out;
}

Json Call::UsageJson() const {
  int prompt = 0, completion = 0, cached = 0;
  std::vector<bool> counted(prompt_tokens_.size(), false);
  for (const Choice& c : choices_) {
    completion += c.usage.completion_tokens();
    if (!counted[c.prompt]) {
      counted[c.prompt] = true;
      prompt += c.usage.prompt_tokens() > 0 ? c.usage.prompt_tokens() : prompt_tokens_[c.prompt];
      cached += c.usage.cached_prompt_tokens();
    }
  }
  return {{"prompt_tokens", prompt}, {"completion_tokens", completion}, {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

bool Call::SendLocked(const Json& event) {
  if (!streaming_) {
    streaming_ = true;
    exchange_->StartStream(200, "text/event-stream",
                           {{"Cache-Control", "no-cache"}, {"x-request-id", id_}, {"X-Accel-Buffering", "no"}});
  }
  return exchange_->Send(absl::StrCat("data: ", Dump(event), "\n\n"));
}

bool Call::OnWrite(int index, v1::GenerateResponse m, bool final) {
  std::shared_ptr<Call> keep;  // released after mu_ is
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_ || ended_) return false;
  Choice& c = choices_[index];
  const bool has_logprobs = request_.logprobs && m.logprobs_size() > 0;
  Json logprobs = has_logprobs ? LogprobsOf(c, m) : Json(nullptr);
  if (final) {
    c.finish_reason = FinishReasonName(m.finish_reason());
    c.usage = m.usage();
  }
  // Chat through a parser: the text splits into reasoning, content and tool calls.
  output_parsing::OutputDelta parsed;
  if (c.parser) {
    parsed = c.parser->Feed(m.text());
    if (final) {
      output_parsing::ChatOutputFinish end = c.parser->Finish();
      parsed.reasoning += end.delta.reasoning;
      parsed.content += end.delta.content;
      for (auto& t : end.delta.tool_calls) parsed.tool_calls.push_back(std::move(t));
      c.complete_calls = end.tool_calls.complete;
      for (bool complete : end.tool_calls.complete) c.called_tool = c.called_tool || complete;
      if (c.called_tool && c.finish_reason != nullptr && std::string(c.finish_reason) == "stop") {
        c.finish_reason = "tool_calls";
      }
    }
    if (!request_.include_reasoning) parsed.reasoning.clear();
  } else {
    parsed.content = m.text();
  }
  bool more = true;
  if (request_.stream) {
    const bool first = Chat() && !c.sent_role;
    const bool has_delta = !parsed.content.empty() || !parsed.reasoning.empty() || !parsed.tool_calls.empty();
    if ((Chat() ? has_delta : !m.text().empty()) || has_logprobs || first || final) {
      Json choice = {{"index", index}};
      if (Chat()) {
        Json delta = Json::object();
        if (first) {
          delta["role"] = "assistant";
          delta["content"] = "";
          c.sent_role = true;
        }
        if (!parsed.content.empty()) delta["content"] = parsed.content;
        if (!parsed.reasoning.empty()) {
          // Both names: vLLM renamed the field, SGLang kept the old one, clients read either.
          delta["reasoning_content"] = parsed.reasoning;
          delta["reasoning"] = parsed.reasoning;
        }
        if (!parsed.tool_calls.empty()) {
          Json calls = Json::array();
          for (const auto& t : parsed.tool_calls) {
            Json call = {{"index", t.index}, {"function", {{"arguments", t.arguments}}}};
            if (!t.id.empty()) {
              call["id"] = t.id;
              call["type"] = "function";
            }
            if (!t.name.empty()) call["function"]["name"] = t.name;
            calls.push_back(std::move(call));
          }
          delta["tool_calls"] = std::move(calls);
        }
        choice["delta"] = delta;
      } else {
        choice["text"] = m.text();
      }
      choice["logprobs"] = logprobs;
      choice["finish_reason"] = final && c.finish_reason ? Json(c.finish_reason) : Json(nullptr);
      Json event = {{"id", ResponseId()}, {"object", ObjectName(true)}, {"created", created_}, {"model", ModelName()},
                    {"choices", Json::array({choice})}};
      if (request_.include_usage) event["usage"] = nullptr;
      more = SendLocked(event);
      if (!more) c.told_full = true;
    }
  } else {
    c.text += parsed.content;
    c.reasoning += parsed.reasoning;
    for (const auto& t : parsed.tool_calls) {
      if (!t.id.empty()) {
        c.tool_calls.push_back({{"id", t.id}, {"type", "function"}, {"function", {{"name", t.name}, {"arguments", ""}}}});
      }
      if (!c.tool_calls.empty()) {
        Json& call = c.tool_calls[std::min<size_t>(static_cast<size_t>(t.index), c.tool_calls.size() - 1)];
        call["function"]["arguments"] = call["function"]["arguments"].get<std::string>() + t.arguments;
      }
    }
    if (has_logprobs) {
      if (Chat()) {
        for (auto& entry : logprobs["content"]) c.logprobs["content"].push_back(std::move(entry));
      } else {
        for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
          for (auto& entry : logprobs[key]) c.logprobs[key].push_back(std::move(entry));
        }
      }
    }
  }
  if (final) {
    c.done = true;
    if (--remaining_ == 0) keep = FinishLocked();
  }
  return more;
}

std::shared_ptr<Call> Call::FinishLocked() {
  ended_ = true;
  if (request_.stream) {
    if (request_.include_usage) {
      SendLocked({{"id", ResponseId()}, {"object", ObjectName(true)}, {"created", created_}, {"model", ModelName()},
                  {"choices", Json::array()}, {"usage", UsageJson()}});
    }
    if (!streaming_) SendLocked(Json::object());  // cannot happen: every choice sends a final event
    exchange_->Send("data: [DONE]\n\n");
    exchange_->EndStream();
  } else {
    Json choices = Json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      const Choice& c = choices_[i];
      Json choice = {{"index", i}};
      if (Chat()) {
        Json message = {{"role", "assistant"}, {"content", c.text}};
        if (!c.reasoning.empty()) {
          message["reasoning_content"] = c.reasoning;
          message["reasoning"] = c.reasoning;
        }
        // Only calls that completed (a malformed or cut-off one is in the content as text).
        Json calls = Json::array();
        for (size_t k = 0; k < c.tool_calls.size(); ++k) {
          if (k < c.complete_calls.size() && c.complete_calls[k]) calls.push_back(c.tool_calls[k]);
        }
        if (!calls.empty()) {
          message["tool_calls"] = std::move(calls);
          if (c.text.empty()) message["content"] = nullptr;
        }
        choice["message"] = std::move(message);
      } else {
        choice["text"] = c.text;
      }
      choice["logprobs"] = request_.logprobs ? c.logprobs : Json(nullptr);
      choice["finish_reason"] = c.finish_reason ? Json(c.finish_reason) : Json(nullptr);
      choices.push_back(std::move(choice));
    }
    Json body = {{"id", ResponseId()}, {"object", ObjectName(false)}, {"created", created_}, {"model", ModelName()},
                 {"choices", choices}, {"usage", UsageJson()}};
    exchange_->Respond(200, "application/json", Dump(body), {{"x-request-id", id_}});
  }
  // The cores make no further call once they finished; the last reference may go now
  // (the caller drops it after unlocking).
  return std::move(self_);
}

void Call::OnFail(int index, const absl::Status& status, std::optional<std::chrono::milliseconds> retry_after) {
  std::vector<std::shared_ptr<RequestCore>> others;
  std::shared_ptr<Call> keep;  // released after mu_ is
  {
    std::lock_guard<std::mutex> lock(mu_);
    Choice& c = choices_[index];
    if (c.done) return;
    c.done = true;
    --remaining_;
    if (!failed_ && !ended_) {
      failed_ = true;
      const ApiError e = FromStatus(status, retry_after);
      if (streaming_) {
        // Mid-stream: the error as an event, then the end, as vLLM does.
        exchange_->Send(absl::StrCat("data: ", e.ToJson(), "\n\n"));
        exchange_->Send("data: [DONE]\n\n");
        exchange_->EndStream();
      } else {
        RespondError(e);
      }
      for (Choice& other : choices_) {
        if (!other.done && other.core) others.push_back(other.core);
      }
    }
    if (remaining_ == 0) {
      ended_ = true;
      keep = std::move(self_);
    }
  }
  for (auto& core : others) core->OnClientGone(absl::CancelledError("another choice of the request failed"));
}

void Call::OnGone() {
  std::vector<std::shared_ptr<RequestCore>> cores;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Choice& c : choices_) {
      if (!c.done && c.core) cores.push_back(c.core);
    }
  }
  for (auto& core : cores) core->OnClientGone(absl::CancelledError("the HTTP client went away"));
}

void Call::OnWritable() {
  std::vector<std::shared_ptr<RequestCore>> cores;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Choice& c : choices_) {
      if (c.told_full && !c.done && c.core) {
        c.told_full = false;
        cores.push_back(c.core);
      }
    }
  }
  for (auto& core : cores) core->OnSinkReady();
}

}  // namespace

void StartCompletion(const CompletionContext& context, ParsedRequest request, const std::string& id,
                     std::shared_ptr<http::Exchange> exchange) {
  auto call = std::make_shared<Call>(context, std::move(request), id, std::move(exchange));
  call->Start();
}

}  // namespace tandem::openai
