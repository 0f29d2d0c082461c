// A model's chat templates as transformers finds them: `chat_template` in
// tokenizer_config.json (one template as a string, or a list of {name, template}), or a
// chat_template.jinja file beside it (which takes priority, as in transformers), and the
// special tokens the template sees (strings or AddedToken objects {"content": ...}).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/chat_template/chat_template.h"

namespace tandem {

class ModelChatTemplates {
 public:
  // From the files' contents; chat_template_jinja is null when the file is absent.
  // Errors: NOT_FOUND when neither holds a template; INVALID_ARGUMENT for malformed JSON,
  // a chat_template of another shape, or a template that does not parse.
  static absl::StatusOr<ModelChatTemplates> FromFiles(std::string_view tokenizer_config_json,
                                                      const std::optional<std::string>& chat_template_jinja);
  // Reads model_dir/tokenizer_config.json and model_dir/chat_template.jinja. Errors as
  // FromFiles; NOT_FOUND also when tokenizer_config.json is missing.
  static absl::StatusOr<ModelChatTemplates> Load(const std::string& model_dir);

  // transformers' choice: the template called `name` when given; otherwise "tool_use"
  // when the request has tools (non-null) and the model has one, else "default" (what a
  // single template is called). Errors: NOT_FOUND.
  absl::StatusOr<const ChatTemplate*> Select(const std::optional<std::string>& name, bool has_tools) const;
  // Selects and renders `request` as apply_chat_template(tokenize=False) would.
  absl::StatusOr<std::string> Apply(const ChatRequest& request, const std::optional<std::string>& name = std::nullopt,
                                    const ChatTemplateLimits& limits = ChatTemplateLimits()) const;

  const SpecialTokens& special_tokens() const { return special_tokens_; }
  const std::vector<std::pair<std::string, ChatTemplate>>& templates() const { return templates_; }

 private:
  std::vector<std::pair<std::string, ChatTemplate>> templates_;
  SpecialTokens special_tokens_;
};

}  // namespace tandem
