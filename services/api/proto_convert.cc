#include "services/api/proto_convert.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/util/status_macros.h"

namespace tandem {
namespace {

absl::Status Prefixed(const std::string& prefix, const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

template <typename T>
absl::StatusOr<T> Prefixed(const std::string& prefix, absl::StatusOr<T> v) {
  if (v.ok()) return v;
  return Prefixed(prefix, v.status());
}

}  // namespace

absl::StatusOr<SamplingParams> FromProto(const v1::SamplingParams& p, int64_t vocab_size) {
  SamplingParams s;
  if (p.has_temperature()) s.temperature = p.temperature();
  if (p.has_top_p()) s.top_p = p.top_p();
  if (p.has_top_k()) s.top_k = p.top_k();
  if (p.has_min_p()) s.min_p = p.min_p();
  if (p.has_repetition_penalty()) s.repetition_penalty = p.repetition_penalty();
  if (p.has_presence_penalty()) s.presence_penalty = p.presence_penalty();
  if (p.has_frequency_penalty()) s.frequency_penalty = p.frequency_penalty();
  if (p.has_seed()) s.seed = p.seed();
  s.logprobs = p.logprobs();
  // Sorted by token id: the order a map arrives in is unspecified, and the sampler's
  // float additions must not depend on it.
  for (const auto& [id, bias] : p.logit_bias()) s.logit_bias.emplace_back(id, bias);
  std::sort(s.logit_bias.begin(), s.logit_bias.end());
  RETURN_IF_ERROR(Prefixed("sampling.", Validate(s, vocab_size)));
  return s;
}

absl::StatusOr<OutputConstraint> FromProto(const v1::Constraint& c) {
  OutputConstraint o;
  using K = OutputConstraint::Kind;
  switch (c.kind_case()) {
    case v1::Constraint::KIND_NOT_SET:
      if (c.compact_json() || c.strict()) {
        return absl::InvalidArgumentError("constraint: compact_json or strict set without a constraint kind");
      }
      return o;
    case v1::Constraint::kJsonSchema: o.kind = K::kJsonSchema; o.text = c.json_schema(); break;
    case v1::Constraint::kRegex: o.kind = K::kRegex; o.text = c.regex(); break;
    case v1::Constraint::kEbnf:
      o.kind = K::kEbnf;
      o.text = c.ebnf().grammar();
      if (!c.ebnf().root().empty()) o.root = c.ebnf().root();
      for (const v1::JsonSchemaRule& r : c.ebnf().json_rules()) {
        o.json_rules.push_back({.name = r.name(), .schema = r.json_schema(), .strict = r.strict()});
      }
      break;
    case v1::Constraint::kJsonObject: o.kind = K::kJsonObject; break;
  }
  const bool json = o.kind == K::kJsonSchema || o.kind == K::kJsonObject || !o.json_rules.empty();
  if (!json && c.compact_json()) {
    return absl::InvalidArgumentError(absl::StrCat("constraint.compact_json: only for JSON kinds, not ", KindName(o.kind)));
  }
  if (o.kind != K::kJsonSchema && c.strict()) {
    return absl::InvalidArgumentError(absl::StrCat("constraint.strict: only for json_schema, not ", KindName(o.kind)));
  }
  o.json.whitespace = c.compact_json() ? grammar::JsonSchemaOptions::Whitespace::kCompact
                                       : grammar::JsonSchemaOptions::Whitespace::kPython;
  o.json.strict = c.strict();
  if (o.kind == K::kEbnf && o.text.empty()) return absl::InvalidArgumentError("constraint.ebnf.grammar: must not be empty");
  RETURN_IF_ERROR(Validate(o));
  return o;
}

void ToProto(const OutputConstraint& c, v1::Constraint* p) {
  p->Clear();
  switch (c.kind) {
    case OutputConstraint::Kind::kNone: return;
    case OutputConstraint::Kind::kJsonSchema: p->set_json_schema(c.text); break;
    case OutputConstraint::Kind::kRegex: p->set_regex(c.text); break;
    case OutputConstraint::Kind::kEbnf:
      p->mutable_ebnf()->set_grammar(c.text);
      p->mutable_ebnf()->set_root(c.root);
      for (const grammar::JsonSchemaRule& r : c.json_rules) {
        v1::JsonSchemaRule* out = p->mutable_ebnf()->add_json_rules();
        out->set_name(r.name);
        out->set_json_schema(r.schema);
        out->set_strict(r.strict);
      }
      break;
    case OutputConstraint::Kind::kJsonObject: p->mutable_json_object(); break;
  }
  p->set_compact_json(c.json.whitespace == grammar::JsonSchemaOptions::Whitespace::kCompact);
  p->set_strict(c.kind == OutputConstraint::Kind::kJsonSchema && c.json.strict);
}

absl::StatusOr<StopParams> FromProto(const v1::StopConditions& p, int64_t vocab_size) {
  StopParams s;
  if (p.has_max_tokens()) s.max_tokens = p.max_tokens();
  s.min_tokens = p.min_tokens();
  s.stop.assign(p.stop().begin(), p.stop().end());
  s.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  s.ignore_eos = p.ignore_eos();
  s.include_stop_str_in_output = p.include_stop_str_in_output();
  s.skip_special_tokens = !p.include_special_tokens();
  RETURN_IF_ERROR(Prefixed("stop.", Validate(s, vocab_size)));
  return s;
}

void ToProto(const SamplingParams& s, v1::SamplingParams* p) {
  p->set_temperature(s.temperature);
  p->set_top_p(s.top_p);
  p->set_top_k(s.top_k);
  p->set_min_p(s.min_p);
  p->set_repetition_penalty(s.repetition_penalty);
  p->set_presence_penalty(s.presence_penalty);
  p->set_frequency_penalty(s.frequency_penalty);
  if (s.seed) p->set_seed(*s.seed);
  p->set_logprobs(s.logprobs);
  for (const auto& [id, bias] : s.logit_bias) (*p->mutable_logit_bias())[id] = bias;
}

void ToProto(const StopParams& s, v1::StopConditions* p) {
  p->set_max_tokens(s.max_tokens);
  p->set_min_tokens(s.min_tokens);
  for (const auto& x : s.stop) p->add_stop(x);
  for (int32_t id : s.stop_token_ids) p->add_stop_token_ids(id);
  p->set_ignore_eos(s.ignore_eos);
  p->set_include_stop_str_in_output(s.include_stop_str_in_output);
  p->set_include_special_tokens(!s.skip_special_tokens);
}

namespace {

using OrderedJson = nlohmann::ordered_json;

// Nesting of tools and template kwargs, bounded: the template walks them recursively
// (tojson, loops), so a hostile value must not run the stack out.
constexpr int kMaxJsonDepth = 64;

bool DepthAtMost(const OrderedJson& v, int depth) {
  if (!v.is_structured()) return true;
  if (depth == 0) return false;
  for (const OrderedJson& child : v) {
    if (!DepthAtMost(child, depth - 1)) return false;
  }
  return true;
}

absl::StatusOr<OrderedJson> ParseJsonField(const std::string& text, const char* field, bool want_array) {
  OrderedJson v = OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded()) return absl::InvalidArgumentError(absl::StrCat("chat.", field, ": not valid JSON"));
  if (want_array ? !v.is_array() : !v.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("chat.", field, ": must be a JSON ", want_array ? "array" : "object"));
  }
  if (!DepthAtMost(v, kMaxJsonDepth)) {
    return absl::InvalidArgumentError(absl::StrCat("chat.", field, ": nested deeper than ", kMaxJsonDepth, " levels"));
  }
  return v;
}

// A message as the template sees it: OpenAI's message object, keys in the order OpenAI's
// documents give them (tojson shows the order).
OrderedJson TemplateMessage(const v1::ChatMessage& m) {
  OrderedJson out = {{"role", m.role()}};
  if (!m.has_content() && !m.tool_calls().empty()) {
    out["content"] = nullptr;
  } else {
    out["content"] = m.content();
  }
  if (!m.name().empty()) out["name"] = m.name();
  if (!m.tool_calls().empty()) {
    OrderedJson calls = OrderedJson::array();
    for (const v1::ToolCall& c : m.tool_calls()) {
      calls.push_back({{"id", c.id()},
                       {"type", "function"},
                       {"function", {{"name", c.name()}, {"arguments", c.arguments()}}}});
    }
    out["tool_calls"] = std::move(calls);
  }
  if (m.role() == "tool") out["tool_call_id"] = m.tool_call_id();
  return out;
}

}  // namespace

absl::StatusOr<ChatPrompt> FormatChat(const v1::ChatMessages& chat, const ModelChatTemplates* templates) {
  if (chat.messages().empty()) return absl::InvalidArgumentError("chat.messages: empty");
  bool uses_tools = !chat.tools_json().empty();
  for (int i = 0; i < chat.messages_size(); ++i) {
    const v1::ChatMessage& m = chat.messages(i);
    const std::string where = absl::StrCat("chat.messages[", i, "]");
    const std::string& role = m.role();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".role: '", role, "' (expected system, user, assistant or tool)"));
    }
    if (!m.tool_calls().empty() && role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat(where, ".tool_calls: only an assistant message calls tools"));
    }
    for (int j = 0; j < m.tool_calls_size(); ++j) {
      if (m.tool_calls(j).name().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".tool_calls[", j, "].name: empty"));
      }
    }
    if (role == "tool") {
      if (m.tool_call_id().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(where, ".tool_call_id: required for a tool message"));
      }
    } else if (!m.tool_call_id().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".tool_call_id: only a tool message answers a call"));
    }
    uses_tools = uses_tools || role == "tool" || !m.tool_calls().empty();
  }
  if (templates != nullptr) {
    ChatRequest request;
    for (const v1::ChatMessage& m : chat.messages()) request.messages.push_back(TemplateMessage(m));
    if (!chat.tools_json().empty()) {
      ASSIGN_OR_RETURN(request.tools, ParseJsonField(chat.tools_json(), "tools_json", /*want_array=*/true));
      for (size_t i = 0; i < request.tools.size(); ++i) {
        if (!request.tools[i].is_object()) {
          return absl::InvalidArgumentError(absl::StrCat("chat.tools_json[", i, "]: must be an object"));
        }
      }
    }
    if (!chat.template_kwargs_json().empty()) {
      ASSIGN_OR_RETURN(request.kwargs,
                       ParseJsonField(chat.template_kwargs_json(), "template_kwargs_json", /*want_array=*/false));
    }
    request.add_generation_prompt = true;
    absl::StatusOr<std::string> text = templates->Apply(request);
    // The model's template refusing the chat (raise_exception, a limit, a reserved
    // kwarg) is the request's fault: INVALID_ARGUMENT, whatever the status said.
    if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("chat: ", text.status().message()));
    return ChatPrompt{*std::move(text), /*add_special_tokens=*/false};
  }
  if (uses_tools) {
    return absl::InvalidArgumentError(
        "chat: tools, tool calls and tool results need the model's chat template (tokenizer_config.json's "
        "chat_template), and this model has none");
  }
  // No template: the DeepSeek-V3 format, kept for models that ship none. It takes no
  // variables, so template_kwargs_json has nothing to change here.
  std::string system, turns;
  for (const v1::ChatMessage& m : chat.messages()) {
    if (m.role() == "system") {
      system += m.content();
    } else if (m.role() == "user") {
      turns += "<｜User｜>" + m.content();
    } else {
      turns += "<｜Assistant｜>" + m.content() + "<｜end▁of▁sentence｜>";
    }
  }
  return ChatPrompt{system + turns + "<｜Assistant｜>", /*add_special_tokens=*/true};
}

absl::StatusOr<std::unique_ptr<ModelChatTemplates>> LoadChatTemplates(const std::string& model_dir) {
  absl::StatusOr<ModelChatTemplates> t = ModelChatTemplates::Load(model_dir);
  if (absl::IsNotFound(t.status())) return std::unique_ptr<ModelChatTemplates>();
  if (!t.ok()) return t.status();
  return std::make_unique<ModelChatTemplates>(*std::move(t));
}

int64_t PromptBytes(const v1::GenerateRequest& r) {
  switch (r.prompt_case()) {
    case v1::GenerateRequest::kText:
      return static_cast<int64_t>(r.text().size());
    case v1::GenerateRequest::kChat:
      return ChatBytes(r.chat());
    default:
      return 0;
  }
}

int64_t ChatBytes(const v1::ChatMessages& chat) {
  int64_t bytes = 0;
  for (const v1::ChatMessage& m : chat.messages()) {
    bytes += static_cast<int64_t>(m.role().size() + m.content().size() + m.tool_call_id().size() + m.name().size());
    for (const v1::ToolCall& c : m.tool_calls()) {
      bytes += static_cast<int64_t>(c.id().size() + c.name().size() + c.arguments().size());
    }
  }
  bytes += static_cast<int64_t>(chat.tools_json().size() + chat.template_kwargs_json().size());
  return bytes;
}

absl::Status CheckPromptBytes(int64_t bytes, int64_t max_prompt_bytes) {
  if (bytes <= max_prompt_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("prompt: ", bytes, " bytes exceed the limit of ", max_prompt_bytes,
                                                 " bytes (--max-prompt-bytes)"));
}

absl::StatusOr<std::vector<int32_t>> PromptTokens(const v1::GenerateRequest& r, const Tokenizer& tokenizer,
                                                  int64_t vocab_size, int64_t max_prompt_bytes,
                                                  const ModelChatTemplates* chat_templates) {
  RETURN_IF_ERROR(CheckPromptBytes(PromptBytes(r), max_prompt_bytes));
  std::vector<int32_t> ids;
  switch (r.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (r.text().empty()) return absl::InvalidArgumentError("text: empty prompt");
      ASSIGN_OR_RETURN(ids, Prefixed("text: ", tokenizer.TryEncode(r.text(), /*add_special_tokens=*/true)));
      break;
    }
    case v1::GenerateRequest::kTokenIds:
      ids.assign(r.token_ids().ids().begin(), r.token_ids().ids().end());
      if (ids.empty()) return absl::InvalidArgumentError("token_ids.ids: empty prompt");
      for (int i = 0; i < static_cast<int>(ids.size()); ++i) {
        if (ids[i] < 0 || ids[i] >= vocab_size) {
          return absl::InvalidArgumentError(absl::StrCat("token_ids.ids[", i, "]: ", ids[i],
                                                         " is outside the vocabulary [0, ", vocab_size, ")"));
        }
      }
      break;
    case v1::GenerateRequest::kChat: {
      ASSIGN_OR_RETURN(ChatPrompt chat, FormatChat(r.chat(), chat_templates));
      ASSIGN_OR_RETURN(ids, Prefixed("chat: ", tokenizer.TryEncode(chat.text, chat.add_special_tokens)));
      break;
    }
    case v1::GenerateRequest::PROMPT_NOT_SET:
      return absl::InvalidArgumentError("prompt: set one of text, token_ids or chat");
  }
  if (ids.empty()) return absl::InvalidArgumentError("prompt: no tokens");
  return ids;
}

absl::Status CheckLength(int64_t prompt_tokens, const StopParams& stop, int64_t context) {
  if (prompt_tokens >= context) {
    return absl::InvalidArgumentError(absl::StrCat("prompt: ", prompt_tokens, " tokens; the model's context is ",
                                                   context, " tokens"));
  }
  if (prompt_tokens + stop.max_tokens > context) {
    return absl::InvalidArgumentError(absl::StrCat("stop.max_tokens: ", stop.max_tokens, " more tokens after a ",
                                                   prompt_tokens, "-token prompt exceed the model's context of ",
                                                   context, " tokens"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RequestIdOrNew(const std::string& requested) {
  if (!requested.empty()) {
    if (requested.size() > 128) return absl::InvalidArgumentError("request_id: longer than 128 bytes");
    for (char c : requested) {
      if (c < 0x21 || c > 0x7e) return absl::InvalidArgumentError("request_id: only printable ASCII without spaces");
    }
    return requested;
  }
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}() ^ static_cast<uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count());
  return absl::StrFormat("req-%08x-%d", static_cast<uint32_t>(salt), counter.fetch_add(1));
}

v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return v1::FINISH_REASON_STOP;
    case FinishReason::kLength: return v1::FINISH_REASON_LENGTH;
    case FinishReason::kNone: return v1::FINISH_REASON_UNSPECIFIED;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void ToProto(const RequestOutput& o, v1::GenerateResponse* out) {
  for (int32_t t : o.token_ids) out->add_token_ids(t);
  out->mutable_text()->append(o.text);
  for (const TokenLogprobs& l : o.logprobs) {
    v1::TokenLogprob* p = out->add_logprobs();
    p->set_token_id(l.token);
    p->set_logprob(l.logprob);
    for (const auto& [id, lp] : l.top) {
      v1::TopLogprob* t = p->add_top();
      t->set_token_id(id);
      t->set_logprob(lp);
    }
  }
  if (o.finished) {
    out->set_finish_reason(ToProto(o.finish_reason));
    if (o.matched_stop) out->set_matched_stop(*o.matched_stop);
    v1::Usage* u = out->mutable_usage();
    u->set_prompt_tokens(o.metrics.prompt_tokens);
    u->set_completion_tokens(o.metrics.completion_tokens);
    u->set_cached_prompt_tokens(o.metrics.cached_prompt_tokens);
    u->set_draft_tokens(o.metrics.draft_tokens);
    u->set_accepted_draft_tokens(o.metrics.accepted_draft_tokens);
    v1::Timing* t = out->mutable_timing();
    t->set_queue_ms(o.metrics.queue_s * 1e3);
    t->set_prefill_ms(o.metrics.prefill_s * 1e3);
    t->set_ttft_ms(o.metrics.ttft_s * 1e3);
    t->set_e2e_ms(o.metrics.e2e_s * 1e3);
  }
}

}  // namespace tandem
