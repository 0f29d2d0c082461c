// Pieces every tandem.v1.Generation implementation shares (the router and the workers):
// the model-name check, Tokenize, Detokenize and ListModels against a tokenizer and config.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "engine/chat_template/model_chat_templates.h"
#include "engine/model/model_info.h"
#include "engine/tokenizer/tokenizer.h"
#include "tandem/v1/generation.pb.h"

namespace tandem {

// Shared by every Generation implementation: model-name check, tokenize/detokenize and
// the model list, against a tokenizer and config.
absl::Status CheckModelName(const std::string& requested, const std::string& served);
// A text or chat of more than `max_prompt_bytes` is refused before any tokenization work
// (INVALID_ARGUMENT naming "prompt" and the limit), as Generate's prompts are. A chat is
// formatted as Generate formats it (FormatChat, with `chat_templates`, null for a model
// without a template).
absl::Status TokenizeInto(const v1::TokenizeRequest& r, const Tokenizer& tokenizer,
                          const ModelChatTemplates* chat_templates, const std::string& model_name,
                          int64_t max_prompt_bytes, v1::TokenizeResponse* out);
absl::Status DetokenizeInto(const v1::DetokenizeRequest& r, const Tokenizer& tokenizer, int64_t vocab_size,
                            const std::string& model_name, v1::DetokenizeResponse* out);
void ListModelsInto(const ModelInfo& config, const std::string& model_name, v1::ListModelsResponse* out);

}  // namespace tandem
