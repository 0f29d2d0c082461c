#include "engine/chat_template/model_chat_templates.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/util/status_macros.h"

namespace tandem {
namespace {

using Json = nlohmann::ordered_json;

absl::StatusOr<std::optional<std::string>> ReadOptionalFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::optional<std::string>();
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return std::optional<std::string>(contents.str());
}

// A special token: a string, an AddedToken object {"content": ...}, or null.
absl::StatusOr<std::optional<std::string>> TokenContent(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::optional<std::string>();
  if (it->is_string()) return std::optional<std::string>(it->get<std::string>());
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return std::optional<std::string>(content->get<std::string>());
  }
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer_config.json: ", key, ": expected a string or an object with \"content\""));
}

absl::StatusOr<ChatTemplate> ParseNamed(std::string_view name, std::string_view source) {
  absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
  if (!t.ok()) {
    return absl::Status(t.status().code(),
                        absl::StrCat("chat template '", std::string(name), "': ", t.status().message()));
  }
  return t;
}

}  // namespace

absl::StatusOr<ModelChatTemplates> ModelChatTemplates::FromFiles(
    std::string_view tokenizer_config_json, const std::optional<std::string>& chat_template_jinja) {
  const Json config = Json::parse(tokenizer_config_json.begin(), tokenizer_config_json.end(), nullptr,
                                  /*allow_exceptions=*/false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError("tokenizer_config.json: malformed JSON or not an object");
  }
  ModelChatTemplates out;
  const std::pair<const char*, std::optional<std::string>*> tokens[] = {
      {"bos_token", &out.special_tokens_.bos_token},  {"eos_token", &out.special_tokens_.eos_token},
      {"unk_token", &out.special_tokens_.unk_token},  {"sep_token", &out.special_tokens_.sep_token},
      {"pad_token", &out.special_tokens_.pad_token},  {"cls_token", &out.special_tokens_.cls_token},
      {"mask_token", &out.special_tokens_.mask_token}};
  for (const auto& [key, slot] : tokens) {
    ASSIGN_OR_RETURN(*slot, TokenContent(config, key));
  }
  if (chat_template_jinja) {
    ASSIGN_OR_RETURN(ChatTemplate t, ParseNamed("default", *chat_template_jinja));
    out.templates_.emplace_back("default", std::move(t));
    return out;
  }
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return absl::NotFoundError("tokenizer_config.json has no chat_template (and there is no chat_template.jinja)");
  }
  if (it->is_string()) {
    ASSIGN_OR_RETURN(ChatTemplate t, ParseNamed("default", it->get<std::string>()));
    out.templates_.emplace_back("default", std::move(t));
    return out;
  }
  if (!it->is_array()) {
    return absl::InvalidArgumentError(
        "tokenizer_config.json: chat_template: expected a string or a list of {\"name\", \"template\"}");
  }
  for (const Json& entry : *it) {
    auto name = entry.find("name");
    auto source = entry.find("template");
    if (!entry.is_object() || name == entry.end() || !name->is_string() || source == entry.end() ||
        !source->is_string()) {
      return absl::InvalidArgumentError(
          "tokenizer_config.json: chat_template: every entry needs a string \"name\" and \"template\"");
    }
    ASSIGN_OR_RETURN(ChatTemplate t, ParseNamed(name->get<std::string>(), source->get<std::string>()));
    out.templates_.emplace_back(name->get<std::string>(), std::move(t));
  }
  if (out.templates_.empty()) return absl::NotFoundError("tokenizer_config.json: chat_template is an empty list");
  return out;
}

absl::StatusOr<ModelChatTemplates> ModelChatTemplates::Load(const std::string& model_dir) {
  ASSIGN_OR_RETURN(std::optional<std::string> config, ReadOptionalFile(model_dir + "/tokenizer_config.json"));
  if (!config) return absl::NotFoundError(absl::StrCat("no tokenizer_config.json in ", model_dir));
  ASSIGN_OR_RETURN(std::optional<std::string> jinja, ReadOptionalFile(model_dir + "/chat_template.jinja"));
  return FromFiles(*config, jinja);
}

absl::StatusOr<const ChatTemplate*> ModelChatTemplates::Select(const std::optional<std::string>& name,
                                                               bool has_tools) const {
  auto find = [&](std::string_view n) -> const ChatTemplate* {
    for (const auto& [k, t] : templates_) {
      if (k == n) return &t;
    }
    return nullptr;
  };
  if (name) {
    if (const ChatTemplate* t = find(*name)) return t;
    return absl::NotFoundError(absl::StrCat("the model has no chat template named '", *name, "'"));
  }
  if (has_tools) {
    if (const ChatTemplate* t = find("tool_use")) return t;
  }
  if (const ChatTemplate* t = find("default")) return t;
  return absl::NotFoundError("the model has several chat templates and none is called 'default'");
}

absl::StatusOr<std::string> ModelChatTemplates::Apply(const ChatRequest& request,
                                                      const std::optional<std::string>& name,
                                                      const ChatTemplateLimits& limits) const {
  ASSIGN_OR_RETURN(const ChatTemplate* t, Select(name, !request.tools.is_null()));
  ASSIGN_OR_RETURN(nlohmann::ordered_json context, MakeChatContext(request, special_tokens_));
  return t->Render(context, limits);
}

}  // namespace tandem
