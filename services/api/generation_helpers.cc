#include "services/api/generation_helpers.h"

#include "absl/strings/str_cat.h"
#include "services/api/proto_convert.h"

namespace tandem {

absl::Status CheckModelName(const std::string& requested, const std::string& served) {
  if (requested.empty() || requested == served) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("model: '", requested, "' is not served here (serving '", served, "')"));
}

absl::Status TokenizeInto(const v1::TokenizeRequest& r, const Tokenizer& tokenizer,
                          const ModelChatTemplates* chat_templates, const std::string& model_name,
                          int64_t max_prompt_bytes, v1::TokenizeResponse* out) {
  if (absl::Status s = CheckModelName(r.model(), model_name); !s.ok()) return s;
  const bool special = !r.has_add_special_tokens() || r.add_special_tokens();
  const bool chat = r.input_case() == v1::TokenizeRequest::kChat;
  const int64_t bytes = chat ? ChatBytes(r.chat()) : static_cast<int64_t>(r.text().size());
  if (absl::Status s = CheckPromptBytes(bytes, max_prompt_bytes); !s.ok()) return s;
  std::string text;
  bool add_special = special;
  if (chat) {
    absl::StatusOr<ChatPrompt> formatted = FormatChat(r.chat(), chat_templates);
    if (!formatted.ok()) return formatted.status();
    text = std::move(formatted->text);
    add_special = special && formatted->add_special_tokens;
  } else {
    text = r.text();
  }
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.TryEncode(text, add_special);
  if (!ids.ok()) {
    return absl::Status(ids.status().code(), absl::StrCat(chat ? "chat: " : "text: ", ids.status().message()));
  }
  for (int32_t id : *ids) out->add_ids(id);
  return absl::OkStatus();
}

absl::Status DetokenizeInto(const v1::DetokenizeRequest& r, const Tokenizer& tokenizer, int64_t vocab_size,
                            const std::string& model_name, v1::DetokenizeResponse* out) {
  if (absl::Status s = CheckModelName(r.model(), model_name); !s.ok()) return s;
  std::vector<int32_t> ids(r.ids().begin(), r.ids().end());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("ids[", i, "]: ", ids[i], " is outside the vocabulary"));
    }
  }
  out->set_text(tokenizer.Decode(ids, r.skip_special_tokens()));
  return absl::OkStatus();
}

void ListModelsInto(const ModelInfo& config, const std::string& model_name, v1::ListModelsResponse* out) {
  v1::ModelInfo* m = out->add_models();
  m->set_id(model_name);
  m->set_model_type(config.model_type);
  m->set_max_context(config.max_position_embeddings);
  m->set_vocab_size(config.vocab_size);
}

}  // namespace tandem
