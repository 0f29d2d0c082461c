#include "services/openai/openai_request.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/openai/chat_request.h"
#include "services/openai/json_fields.h"
#include "services/openai/response_format.h"

namespace tandem::openai {
namespace {

std::optional<double> Number(const Json& body, const char* name, std::optional<ApiError>* error) {
  const Json* v = Field(body, name);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) {
    *error = TypeError(name, "a number");
    return std::nullopt;
  }
  return v->get<double>();
}

std::optional<int64_t> Integer(const Json& body, const char* name, std::optional<ApiError>* error) {
  const Json* v = Field(body, name);
  if (v == nullptr) return std::nullopt;
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_unsigned()) {
    if (v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      *error = InvalidRequest(name, absl::StrCat(name, ": out of range"));
      return std::nullopt;
    }
    return static_cast<int64_t>(v->get<uint64_t>());
  }
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e15) return static_cast<int64_t>(d);
  }
  *error = TypeError(name, "an integer");
  return std::nullopt;
}

// Values outside int32 (and so outside every valid range here) are clamped so that the
// engine's range check names them rather than a conversion wrapping them into range.
int32_t Clamp32(int64_t v) {
  return static_cast<int32_t>(std::clamp<int64_t>(v, std::numeric_limits<int32_t>::min(),
                                                  std::numeric_limits<int32_t>::max()));
}

std::optional<ApiError> Sampling(const Json& body, Endpoint endpoint, v1::SamplingParams* s, v1::StopConditions* stop,
                                 ParsedRequest* out) {
  std::optional<ApiError> error;
  if (auto v = Number(body, "temperature", &error)) s->set_temperature(static_cast<float>(*v));
  if (error) return error;
  if (auto v = Number(body, "top_p", &error)) s->set_top_p(static_cast<float>(*v));
  if (error) return error;
  if (auto v = Integer(body, "top_k", &error)) s->set_top_k(Clamp32(*v));
  if (error) return error;
  if (auto v = Number(body, "min_p", &error)) s->set_min_p(static_cast<float>(*v));
  if (error) return error;
  if (auto v = Number(body, "repetition_penalty", &error)) s->set_repetition_penalty(static_cast<float>(*v));
  if (error) return error;
  if (auto v = Number(body, "presence_penalty", &error)) s->set_presence_penalty(static_cast<float>(*v));
  if (error) return error;
  if (auto v = Number(body, "frequency_penalty", &error)) s->set_frequency_penalty(static_cast<float>(*v));
  if (error) return error;
  if (auto v = Integer(body, "seed", &error)) s->set_seed(static_cast<uint64_t>(*v));
  if (error) return error;
  if (const Json* bias = Field(body, "logit_bias")) {
    if (!bias->is_object()) return TypeError("logit_bias", "an object of token ids to numbers");
    for (const auto& [key, value] : bias->items()) {
      int64_t id = 0;
      if (!absl::SimpleAtoi(key, &id) || id < 0 || id > std::numeric_limits<int32_t>::max()) {
        return InvalidRequest("logit_bias", absl::StrCat("logit_bias: key '", key, "' is not a token id"));
      }
      if (!value.is_number()) return TypeError("logit_bias", "an object of token ids to numbers");
      (*s->mutable_logit_bias())[static_cast<int32_t>(id)] = static_cast<float>(value.get<double>());
    }
  }

  // Logprobs: chat has a bool and top_logprobs, completions an integer.
  if (endpoint == Endpoint::kChat) {
    if (auto v = Bool(body, "logprobs", &error)) out->logprobs = *v;
    if (error) return error;
    if (auto v = Integer(body, "top_logprobs", &error)) {
      if (*v < 0 || *v > 20) return InvalidRequest("top_logprobs", "top_logprobs: must be in [0, 20]");
      if (!out->logprobs && *v > 0) {
        return InvalidRequest("top_logprobs", "top_logprobs: needs logprobs set to true");
      }
      out->top_logprobs = static_cast<int>(*v);
    }
    if (error) return error;
  } else {
    if (auto v = Integer(body, "logprobs", &error)) {
      if (*v < 0 || *v > 20) return InvalidRequest("logprobs", "logprobs: must be in [0, 20]");
      out->logprobs = true;
      out->top_logprobs = static_cast<int>(*v);
    }
    if (error) return error;
  }
  // The engine returns the chosen token's logprob with its alternatives; at least one.
  if (out->logprobs) s->set_logprobs(std::max(1, out->top_logprobs));

  std::optional<int64_t> max_tokens = Integer(body, "max_tokens", &error);
  if (error) return error;
  if (endpoint == Endpoint::kChat) {
    if (auto v = Integer(body, "max_completion_tokens", &error)) max_tokens = v;
    if (error) return error;
  }
  if (max_tokens) {
    if (*max_tokens < 1) {
      return InvalidRequest(endpoint == Endpoint::kChat && Field(body, "max_completion_tokens") ? "max_completion_tokens"
                                                                                               : "max_tokens",
                            absl::StrCat("max_tokens: must be at least 1, got ", *max_tokens));
    }
    out->max_tokens = Clamp32(*max_tokens);
  }
  if (auto v = Integer(body, "min_tokens", &error)) stop->set_min_tokens(Clamp32(*v));
  if (error) return error;
  if (const Json* v = Field(body, "stop")) {
    if (v->is_string()) {
      stop->add_stop(v->get<std::string>());
    } else if (v->is_array()) {
      for (const Json& item : *v) {
        if (!item.is_string()) return TypeError("stop", "a string or a list of strings");
        stop->add_stop(item.get<std::string>());
      }
    } else {
      return TypeError("stop", "a string or a list of strings");
    }
  }
  if (const Json* v = Field(body, "stop_token_ids")) {
    if (!v->is_array()) return TypeError("stop_token_ids", "a list of token ids");
    for (const Json& item : *v) {
      if (!item.is_number_integer()) return TypeError("stop_token_ids", "a list of token ids");
      stop->add_stop_token_ids(Clamp32(item.get<int64_t>()));
    }
  }
  if (auto v = Bool(body, "ignore_eos", &error)) stop->set_ignore_eos(*v);
  if (error) return error;
  if (auto v = Bool(body, "include_stop_str_in_output", &error)) stop->set_include_stop_str_in_output(*v);
  if (error) return error;
  if (auto v = Bool(body, "skip_special_tokens", &error)) stop->set_include_special_tokens(!*v);
  if (error) return error;
  return std::nullopt;
}

// A completions prompt: a string, a list of strings, a list of token ids, or a list of
// lists of token ids.
std::optional<ApiError> Prompts(const Json& body, const ParseLimits& limits, std::vector<v1::GenerateRequest>* out) {
  const Json* p = Field(body, "prompt");
  if (p == nullptr) return InvalidRequest("prompt", "prompt: required");
  auto ids_of = [](const Json& list, v1::GenerateRequest* r) -> bool {
    for (const Json& id : list) {
      if (!id.is_number_integer()) return false;
      r->mutable_token_ids()->add_ids(Clamp32(id.get<int64_t>()));
    }
    return true;
  };
  const char* kTypes = "a string, a list of strings, a list of token ids or a list of lists of token ids";
  if (p->is_string()) {
    out->emplace_back().set_text(p->get<std::string>());
    return std::nullopt;
  }
  if (!p->is_array() || p->empty()) return TypeError("prompt", kTypes);
  if ((*p)[0].is_number()) {
    if (!ids_of(*p, &out->emplace_back())) return TypeError("prompt", kTypes);
    return std::nullopt;
  }
  if (static_cast<int>(p->size()) > limits.max_prompts) {
    return InvalidRequest("prompt", absl::StrCat("prompt: at most ", limits.max_prompts, " prompts per request"));
  }
  for (const Json& item : *p) {
    if (item.is_string()) {
      out->emplace_back().set_text(item.get<std::string>());
    } else if (item.is_array() && !item.empty()) {
      if (!ids_of(item, &out->emplace_back())) return TypeError("prompt", kTypes);
    } else {
      return TypeError("prompt", kTypes);
    }
  }
  return std::nullopt;
}

}  // namespace

std::variant<ParsedRequest, ApiError> ParseRequest(Endpoint endpoint, const Json& body, const ParseLimits& limits) {
  if (!body.is_object()) return InvalidRequest("", "the request body must be a JSON object");
  ParsedRequest out;
  out.endpoint = endpoint;
  if (const Json* model = Field(body, "model")) {
    if (!model->is_string()) return TypeError("model", "a string");
    out.model = model->get<std::string>();
  }
  std::optional<ApiError> error;
  if (auto v = Integer(body, "n", &error)) {
    if (*v < 1 || *v > limits.max_n) {
      return InvalidRequest("n", absl::StrCat("n: must be in [1, ", limits.max_n, "] (--max-n), got ", *v));
    }
    out.n = static_cast<int>(*v);
  }
  if (error) return *error;
  if (auto v = Integer(body, "best_of", &error); v && *v != out.n) {
    return InvalidRequest("best_of", "best_of: not supported (only best_of = n)");
  }
  if (error) return *error;
  if (auto v = Bool(body, "stream", &error)) out.stream = *v;
  if (error) return *error;
  if (const Json* options = Field(body, "stream_options")) {
    if (!options->is_object()) return TypeError("stream_options", "an object");
    if (auto v = Bool(*options, "include_usage", &error)) out.include_usage = *v;
    if (error) return TypeError("stream_options.include_usage", "a boolean");
  }
  if (endpoint == Endpoint::kCompletions) {
    if (auto v = Bool(body, "echo", &error); v && *v) return InvalidRequest("echo", "echo: not supported yet");
    if (error) return *error;
    if (const Json* suffix = Field(body, "suffix"); suffix != nullptr && !(suffix->is_string() && suffix->get<std::string>().empty())) {
      return InvalidRequest("suffix", "suffix: not supported");
    }
    if (auto e = Prompts(body, limits, &out.prompts)) return *e;
  } else {
    if (auto v = Bool(body, "include_reasoning", &error)) out.include_reasoning = *v;
    if (error) return *error;
    if (auto e = ParseChat(body, &out.prompts.emplace_back(), &out.chat)) return *e;
  }
  v1::GenerateRequest shared;
  if (auto e = Sampling(body, endpoint, shared.mutable_sampling(), shared.mutable_stop(), &out)) return *e;
  if (auto e = ParseResponseFormat(body, shared.mutable_constraint())) return *e;
  if (out.chat.required_calls && shared.constraint().kind_case() != v1::Constraint::KIND_NOT_SET) {
    // Both would constrain the same output; picking one silently would hide the client's
    // mistake.
    return InvalidRequest("tool_choice", "tool_choice: \"required\" or a named function constrains the output to "
                                         "tool calls, which a response_format or structured output constraint "
                                         "cannot also constrain; send one of them");
  }
  for (v1::GenerateRequest& r : out.prompts) {
    r.set_model(out.model);
    *r.mutable_sampling() = shared.sampling();
    *r.mutable_stop() = shared.stop();
    if (shared.has_constraint()) *r.mutable_constraint() = shared.constraint();
  }
  return out;
}

}  // namespace tandem::openai
