// Reads tokenizer.json (and tokenizer_config.json) into the parts of a tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/tokenizer/added_vocabulary.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/post_processor.h"
#include "engine/tokenizer/pre_tokenizer.h"

namespace tandem::tokenizer_internal {

struct TokenizerParts {
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<PreTokenizer> pre_tokenizer;  // null: the whole text is one piece
  AddedVocabulary added;
  SpecialTokenTemplate special_template;  // what add_special_tokens=true adds
  std::optional<int32_t> bos_id;
  std::optional<int32_t> eos_id;
};

// Errors: INVALID_ARGUMENT for malformed JSON, a missing or mistyped field, or a
// component this implementation does not support; the message names the file and field.
absl::StatusOr<TokenizerParts> ParseTokenizerFiles(std::string_view tokenizer_json,
                                                   std::string_view config_json);

}  // namespace tandem::tokenizer_internal
