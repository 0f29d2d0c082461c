#include "engine/model/deepseek_v4/v4_model_info.h"

namespace tandem::v4 {

ModelInfo V4ModelInfo(const DeepseekV4Config& c) {
  return {.model_type = "deepseek_v4",
          .vocab_size = c.vocab_size,
          .hidden_size = c.hidden_size,
          .num_hidden_layers = c.num_hidden_layers,
          .max_position_embeddings = c.max_position_embeddings,
          .tie_word_embeddings = c.tie_word_embeddings,
          .bos_token_id = c.bos_token_id,
          .eos_token_ids = c.eos_token_ids,
          .summary = c.Summary(),
          .hidden_streams = c.hc_mult};
}

}  // namespace tandem::v4
