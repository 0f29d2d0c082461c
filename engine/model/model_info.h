// What the engine knows of any model, whatever its architecture: vocabulary, context,
// special tokens and a line for logs. Each architecture's own config adds the rest
// (DeepSeek-V2/V3: ModelConfig, model_config.h; V4: v4::DeepseekV4Config).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem {

struct ModelInfo {
  std::string model_type;  // config.json's
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
  std::string summary;  // one line for logs, written by the architecture's parser
  // Residual streams per position (DeepSeek-V4's hc_mult; 1 for a plain residual).
  int64_t hidden_streams = 1;

  // Floats of one hidden state the MTP layer reads (speculative decoding): what a prefill
  // replica hands a decode replica with the first token.
  int64_t mtp_hidden_size() const { return hidden_streams * hidden_size; }
};

}  // namespace tandem
