#include "services/openai/response_format.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::openai {
namespace {

// A schema given as an object or as its JSON text (vLLM accepts both); the text kept as
// sent when it is one, so that the workers' compile cache sees the same key.
std::optional<ApiError> SchemaText(const Json& v, const std::string& name, std::string* out) {
  if (v.is_object() || v.is_boolean()) {
    *out = v.dump();
    return std::nullopt;
  }
  if (v.is_string()) {
    *out = v.get<std::string>();
    return std::nullopt;
  }
  return TypeError(name, "a JSON schema (an object, or its text)");
}

std::optional<ApiError> Strings(const Json& v, const std::string& name, std::vector<std::string>* out) {
  if (!v.is_array() || v.empty()) return TypeError(name, "a non-empty list of strings");
  for (const Json& s : v) {
    if (!s.is_string()) return TypeError(name, "a non-empty list of strings");
    out->push_back(s.get<std::string>());
  }
  return std::nullopt;
}

std::optional<ApiError> OpenAiFormat(const Json& f, v1::Constraint* c) {
  if (!f.is_object()) return TypeError("response_format", "an object");
  const Json* type = Field(f, "type");
  if (type == nullptr || !type->is_string()) return TypeError("response_format.type", "a string");
  const std::string t = type->get<std::string>();
  if (t == "text") return std::nullopt;
  if (t == "json_object") {
    c->mutable_json_object();
    return std::nullopt;
  }
  if (t != "json_schema") {
    return InvalidRequest("response_format.type",
                          absl::StrCat("response_format.type: '", t, "' is not one of text, json_object, json_schema"));
  }
  const Json* js = Field(f, "json_schema");
  if (js == nullptr || !js->is_object()) return TypeError("response_format.json_schema", "an object");
  const Json* schema = Field(*js, "schema");
  // OpenAI's own API requires a schema; without one any JSON value would do, which is
  // rarely what was meant.
  if (schema == nullptr) return InvalidRequest("response_format.json_schema.schema", "response_format.json_schema.schema: required");
  std::string text;
  if (auto e = SchemaText(*schema, "response_format.json_schema.schema", &text)) return e;
  c->set_json_schema(text);
  std::optional<ApiError> error;
  if (auto strict = Bool(*js, "strict", &error)) c->set_strict(*strict);
  if (error) return TypeError("response_format.json_schema.strict", "a boolean");
  return std::nullopt;
}

std::optional<ApiError> VllmStructured(const Json& s, const std::string& prefix, int* kinds, v1::Constraint* c) {
  if (!s.is_object()) return TypeError(prefix, "an object");
  for (const auto& [key, value] : s.items()) {
    if (value.is_null()) continue;
    const std::string name = absl::StrCat(prefix, ".", key);
    if (key == "json") {
      std::string text;
      if (auto e = SchemaText(value, name, &text)) return e;
      c->set_json_schema(text);
    } else if (key == "regex") {
      if (!value.is_string()) return TypeError(name, "a string");
      c->set_regex(value.get<std::string>());
    } else if (key == "choice") {
      std::vector<std::string> choices;
      if (auto e = Strings(value, name, &choices)) return e;
      c->set_regex(ChoiceRegex(choices));
    } else if (key == "grammar") {
      if (!value.is_string()) return TypeError(name, "a string (an EBNF grammar from rule 'root')");
      c->mutable_ebnf()->set_grammar(value.get<std::string>());
    } else if (key == "json_object") {
      if (!value.is_boolean()) return TypeError(name, "a boolean");
      if (!value.get<bool>()) continue;
      c->mutable_json_object();
    } else if (key == "disable_any_whitespace" || key == "disable_fallback" || key == "disable_additional_properties" ||
               key == "whitespace_pattern") {
      return InvalidRequest(name, absl::StrCat(name, ": not supported (JSON is written as json.dumps writes it)"));
    } else {
      return InvalidRequest(name, absl::StrCat(name, ": unknown field (json, regex, choice, grammar, json_object)"));
    }
    ++*kinds;
  }
  return std::nullopt;
}

}  // namespace

std::string ChoiceRegex(const std::vector<std::string>& choices) {
  std::vector<std::string> escaped;
  for (const std::string& c : choices) {
    std::string e;
    for (char ch : c) {
      if (std::string_view("\\.^$*+?{}[]|()").find(ch) != std::string_view::npos) e += '\\';
      e += ch;
    }
    escaped.push_back("(?:" + e + ")");
  }
  return absl::StrJoin(escaped, "|");
}

std::optional<ApiError> ParseResponseFormat(const Json& body, v1::Constraint* out) {
  int kinds = 0;
  std::vector<std::string> given;
  v1::Constraint c;
  if (const Json* f = Field(body, "response_format")) {
    if (auto e = OpenAiFormat(*f, &c)) return e;
    if (c.kind_case() != v1::Constraint::KIND_NOT_SET) ++kinds;
    given.push_back("response_format");
  }
  if (const Json* s = Field(body, "structured_outputs")) {
    if (auto e = VllmStructured(*s, "structured_outputs", &kinds, &c)) return e;
    given.push_back("structured_outputs");
  }
  // vLLM's fields before structured_outputs, and SGLang's flat ones.
  Json legacy = Json::object();
  for (const char* key : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"}) {
    if (const Json* v = Field(body, key)) legacy[std::string(key).substr(7)] = *v;
  }
  if (const Json* v = Field(body, "regex")) legacy["regex"] = *v;
  if (const Json* v = Field(body, "ebnf")) legacy["grammar"] = *v;
  if (const Json* v = Field(body, "json_schema")) {
    if (!v->is_string()) return TypeError("json_schema", "a string (a JSON schema's text)");
    legacy["json"] = *v;
  }
  if (!legacy.empty()) {
    if (auto e = VllmStructured(legacy, "structured output field", &kinds, &c)) return e;
    given.push_back("the guided_* / regex / ebnf / json_schema fields");
  }
  if (kinds > 1) {
    return InvalidRequest("response_format",
                          absl::StrCat("at most one structured output constraint per request (given: ",
                                       absl::StrJoin(given, ", "), ")"));
  }
  *out = std::move(c);
  return std::nullopt;
}

}  // namespace tandem::openai
